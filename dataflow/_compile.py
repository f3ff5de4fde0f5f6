"""Compiled forwards: trace a model once per input signature, then launch the whole plan.

``dataflow.compile(model)`` wraps an ``async def`` function or an ``ops.nn.Module``::

    forward = dataflow.compile(model)            # or @dataflow.compile on a function
    y = await forward(x)                         # arrays, like ``await model(x)``

The first call with a new *signature* (each array argument's shape and dtype, and the value
of every other argument) traces the program (``dataflow.trace``: its ops are recorded, not
run), optimises the graph and prepares it for launching (``dataflow.graph._launch``). Later
calls with that signature launch the prepared plan: the calling coroutine does O(1) work (two
tasks created, one queued) and the lean plan executor runs the nodes on the pool
(``dataflow.graph._lean``: chains of small ops back to back on one thread, big GIL-free ones
side by side). So a request costs the event loop tens of microseconds, however many ops it
has.

:class:`Compiled` is built in layers, one module each, as the Dask backend's are:

* :mod:`dataflow._plans` (:class:`~dataflow._plans.Plans`): signatures, tracing a new one
  (twice, refusing a program whose control flow depends on the values: "What tracing cannot
  see"), and forgetting plans whose module parameters were replaced ("Parameters").
* :mod:`dataflow._batching` (:class:`~dataflow._batching.Batching`): cross-request batching
  (``batch_axis=``), calls gathered and launched as one.
* here: :func:`compile` (its arguments checked), the state of a compiled forward (set by
  :class:`Compiled`'s constructor), a call (``__call__``: its signature's plan, then launched
  or batched), launching a plan (``_launch``: run whole on the calling thread when it is short
  and unobserved, ``graph._here.run_here``, else ``graph._launch.launch``), and
  :meth:`Compiled.warm_up`, which traces before traffic what calls will need.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, Generic, Protocol, TypeVar, overload

import numpy as np

from ._batching import Batch, Batching
from ._errors import DataflowTypeError, DataflowValueError
from ._instrument import ACTIVE
from ._lookup import get_runtime
from ._plans import Tracing, with_arrays
from ._task import Future, Pending
from .graph._capture import Tracer
from .graph._here import run_here
from .graph._launch import launch

__all__ = ["Compiled", "compile"]

R = TypeVar("R")
T = TypeVar("T")
_ndarray = np.ndarray


class _Decorator(Protocol):
    """What ``dataflow.compile(batch_axis=...)`` returns: ``compile`` with its options set."""

    @overload
    def __call__(self, fn: Callable[..., Awaitable[Future[T]]], /) -> Compiled[T]: ...
    @overload
    def __call__(self, fn: Callable[..., Awaitable[T]], /) -> Compiled[T]: ...


# A compiled call gives arrays (``await forward(x)``), as ``dataflow.run`` does: a function
# that returns a pending value (``async def f(x) -> ops.Tensor``) compiles to a forward that
# gives its value's type (``Compiled[np.ndarray]``). Inside containers (a tuple of Tensors)
# a type checker sees the function's own types; the values are arrays all the same.
@overload
def compile(
    fn: Callable[..., Awaitable[Future[T]]],
    *,
    check: bool = ...,
    optimize: bool = ...,
    batch_axis: int | None = ...,
    max_batch: int = ...,
    max_wait: float = ...,
) -> Compiled[T]: ...
@overload
def compile(
    fn: Callable[..., Awaitable[T]],
    *,
    check: bool = ...,
    optimize: bool = ...,
    batch_axis: int | None = ...,
    max_batch: int = ...,
    max_wait: float = ...,
) -> Compiled[T]: ...
@overload
def compile(
    fn: None = None,
    *,
    check: bool = ...,
    optimize: bool = ...,
    batch_axis: int | None = ...,
    max_batch: int = ...,
    max_wait: float = ...,
) -> _Decorator: ...
def compile(
    fn: Callable[..., Awaitable[Any]] | None = None,
    *,
    check: bool = True,
    optimize: bool = True,
    batch_axis: int | None = None,
    max_batch: int = 32,
    max_wait: float = 0.002,
) -> Compiled[Any] | _Decorator:
    """Compile a model function or module once per input signature (module docstring).

    Use as ``dataflow.compile(model)`` or as a decorator (``@dataflow.compile`` or
    ``@dataflow.compile(batch_axis=0)``).

    Args:
        fn: an ``async def`` function or an ``ops.nn.Module`` (a callable whose call is async).
        check: trace each new signature twice and refuse value-dependent control flow.
        optimize: run the graph passes (constant folding, CSE, DCE, elementwise fusion).
        batch_axis: batch concurrent calls along this axis of every array input and output
            (None: no batching).
        max_batch: the most calls in one batch.
        max_wait: the longest a call waits for others to join its batch, in seconds.

    Example:
        >>> forward = dataflow.compile(ensemble, batch_axis=1)
        >>> async def handle(request):
        ...     y = await forward(x)        # many requests: one launch per batch
    """
    for what, value in (("check", check), ("optimize", optimize)):
        if type(value) is not bool:
            raise DataflowTypeError(f"compile({what}=) must be True or False, got {value!r}")
    if batch_axis is not None and (type(batch_axis) is not int):
        raise DataflowTypeError(f"compile(batch_axis=) must be an int or None, got {batch_axis!r}")
    if type(max_batch) is not int:
        raise DataflowTypeError(f"compile(max_batch=) must be a positive int, got {max_batch!r}")
    if max_batch < 1:
        raise DataflowValueError(f"compile(max_batch=) must be a positive int, got {max_batch!r}")
    if isinstance(max_wait, bool) or not isinstance(max_wait, int | float):
        raise DataflowTypeError(f"compile(max_wait=) must be a number of seconds, got {max_wait!r}")
    if not max_wait >= 0:
        raise DataflowValueError(f"compile(max_wait=) must be >= 0 seconds, got {max_wait!r}")

    def make(f: Callable[..., Awaitable[Any]]) -> Compiled[Any]:
        if not callable(f):
            raise DataflowTypeError(
                f"compile() needs an async function or a module, got {type(f).__name__}: {f!r}"
            )
        return Compiled(
            f,
            check=check,
            optimize=optimize,
            batch_axis=batch_axis,
            max_batch=max_batch,
            max_wait=float(max_wait),
        )

    return make if fn is None else make(fn)


class Compiled(Batching, Generic[R]):
    """A compiled forward: call it like the function; ``await`` gives the outputs' arrays.

    Attributes:
        programs: the prepared plans, by signature (read it to see what was compiled); at
            most ``dataflow._plans.MAX_PLANS`` (256), the oldest forgotten first.
        evicted: how many plans were forgotten that way (a warning says so the first time).
        launches: how many plans were launched (a batch counts once).
        calls: how many calls were made.
    """

    def __init__(
        self,
        fn: Callable[..., Awaitable[R]],
        *,
        check: bool,
        optimize: bool,
        batch_axis: int | None,
        max_batch: int,
        max_wait: float,
    ) -> None:
        self.fn = fn
        self.check = check
        self.optimize = optimize
        self.batch_axis = batch_axis
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.programs: dict[Hashable, Any] = {}
        self._compiling: dict[Hashable, Tracing] = {}
        self._batches: dict[Hashable, Batch] = {}
        self._running: dict[Hashable, int] = {}
        self._read: dict[Hashable, dict[str, Any]] = {}
        self._versioned = hasattr(fn, "parameter_version") and hasattr(fn, "named_parameters")
        self._version = getattr(fn, "parameter_version", None) if self._versioned else None
        self.launches = 0
        self.calls = 0
        self.evicted = 0
        functools.update_wrapper(self, fn, updated=())

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        return f"<dataflow.compile {name} signatures={len(self.programs)} calls={self.calls}>"

    # -- calls -----------------------------------------------------------------------------

    async def __call__(self, *args: Any, **kwargs: Any) -> R:
        if kwargs:
            raise DataflowTypeError(
                f"{self!r}: a compiled forward takes its arguments by position (its signature "
                f"is their shapes, dtypes and values in order), got keyword(s) "
                f"{', '.join(kwargs)}: pass them positionally, or compile a function that "
                "takes them in a fixed order"
            )
        self.calls += 1
        if self._versioned:
            version = self.fn.parameter_version  # type: ignore[attr-defined]
            if version != self._version:
                self._stale(version)
        arrays, statics, key = self._split(args)
        if any(type(a) is not _ndarray for a in arrays):
            if isinstance(get_runtime("a compiled forward").backend, Tracer):
                return await self._traced(args)  # type: ignore[no-any-return]
            # A Tensor input is awaited first: the plan's kernels take its value.
            arrays = [(await a) if isinstance(a, Pending) else a for a in arrays]
        if self.batch_axis is not None and arrays:
            return await self._batched(arrays, statics, key)  # type: ignore[no-any-return]
        k = tuple(key)
        prog = self.programs.get(k)
        if prog is None:
            prog = await self._program(k, arrays, statics)
        return await self._launch(prog, arrays)  # type: ignore[no-any-return]

    async def _warm(self, key: Hashable, arrays: list[Any], statics: list[Any]) -> None:
        """``warm_up``'s one signature: traced if new, and then run once, so that its
        kernels' first-call costs are paid before traffic too (a recurrent kernel measures
        its forms for a new batch size: 0.2-0.6 s on the first requests of a batch size
        otherwise; numba loaded; first page faults). Not counted as a launch."""
        if key in self.programs:
            return
        prog = await self._program(key, arrays, statics)
        await self._launch(prog, arrays)
        self.launches -= 1

    async def _traced(self, args: tuple[Any, ...]) -> Any:
        """A call inside a program being traced (``dataflow.trace``, or another compiled
        forward's first call), its inputs the trace's pending values: the function's own ops
        are recorded into that trace, its outputs pending. (Launching the plan awaited the
        inputs: compiling the outer program refused it, a trace kept the example's outputs
        as constants.)"""
        result = self.fn(*args)
        if inspect.isawaitable(result) and not isinstance(result, Future):
            result = await result  # (a plain function's pending outputs are not awaited)
        return result

    async def _launch(self, prog: Any, arrays: Sequence[Any]) -> Any:
        rt = get_runtime("a compiled forward")
        self.launches += 1
        # The waiter is attached as the plan is queued (under the lock launch holds anyway),
        # so awaiting the outputs costs no second trip through the scheduler.
        host = rt.host
        assert host is not None
        sched = rt._sched
        if (
            self.batch_axis is None
            and prog.ordered
            and not (ACTIVE or sched.watching)
            and sched.pool is not None
            and sched._inline_ok
            and rt.op_timeout is None  # (timed ops run on the pool: ``launch``)
            and prog.runs_here(sched.inline_threshold)
        ):
            # A short plan of small kernels, unobserved: run it whole here, now, without
            # the launch's tasks and waiter (``graph._here.run_here``; the inputs are arrays:
            # ``__call__`` awaited any Tensor).
            return run_here(prog, rt, arrays)
        waiter = host.waiter()
        # A batch must run elsewhere: the next batch gathers the calls made meanwhile.
        gather = launch(rt, prog, arrays, None, waiter, self.batch_axis is None)
        try:
            await waiter
        except BaseException as exc:
            # A cancellation, perhaps caught above (a timeout scope) or not reported as one
            # (trio): the plan's unstarted nodes are dropped with its gather task, as an
            # interrupted `await handle` drops what its request dispatched (Pending.__await__).
            rt.await_interrupted(exc, gather)  # (its work: from the gather task on)
            raise
        return Pending(gather).result()

    async def warm_up(self, *args: Any) -> int:
        """Compile, before traffic, every signature that calls like ``args`` will use, and
        run each one it compiles once (its kernels' first-call costs: ``_warm``).

        Without batching that is the signature of ``args``. With ``batch_axis``, a batch of
        n such calls runs at a padded size (a power of two times their rows), and each new
        size is traced the first time it occurs, on the event loop, in the middle of serving
        (tens of ms for a real model): so every padded size up to ``max_batch`` calls is
        traced here. Call it at startup, inside the runtime (``examples/serve.py`` does).

        Returns:
            How many signatures were traced now (those already compiled are not counted).
        """
        if self._versioned:  # (parameters replaced since the last call: as a call does)
            version = self.fn.parameter_version  # type: ignore[attr-defined]
            if version != self._version:
                self._stale(version)
        arrays, statics, key = self._split(args)
        if any(type(a) is not _ndarray for a in arrays):
            # A Tensor example is awaited first, as a call's is (``__call__``).
            arrays = [(await a) if isinstance(a, Pending) else a for a in arrays]
        before = len(self.programs)
        if self.batch_axis is None or not arrays:
            await self._warm(tuple(key), arrays, statics)
            return len(self.programs) - before
        axis = self.batch_axis
        one = self._rows(arrays)
        if not one:  # calls without rows batch at none (or at the rows of others)
            await self._warm(tuple(key), arrays, statics)
            return len(self.programs) - before
        size = 1
        while True:
            total = 1 << (size * one - 1).bit_length()
            inputs = [np.repeat(a, total // one, axis=axis) for a in arrays]
            if total % one:  # rows that do not divide a power of two: pad like a batch does
                inputs = [np.concatenate([x, np.take(x, [0] * (total % one), axis=axis)],
                                         axis=axis) for x in inputs]  # fmt: skip
            _, _, k = self._split(tuple(with_arrays(statics, inputs)))
            await self._warm(tuple(k), inputs, statics)
            if size >= self.max_batch:
                break
            size = min(self.max_batch, 2 * size)
        return len(self.programs) - before
