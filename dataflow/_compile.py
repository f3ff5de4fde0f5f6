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

**What tracing cannot see.** Like ``torch.jit.trace``, a trace records the ops one run issues,
not the Python around them: loops are unrolled for the traced shapes, and a branch on a
value is taken as it was for the example. The first compile of each signature traces twice,
the second time with other input values, and refuses (a :class:`~dataflow.DataflowError`
naming where) a program whose ops changed: its control flow depends on the values. That
check cannot see every case (a branch that two random inputs take the same way), so a
program that branches on values must not be compiled; ``check=False`` skips it.

**Parameters.** A plan reads a module's parameters where the trace found them (each array by
its name): a parameter written in place takes effect at the next call. A module whose
``load_state_dict`` replaced its parameters (new arrays, so that calls already dispatched keep
the old ones) tells the compiled forward through its ``parameter_version`` (any object with
``named_parameters()`` and that attribute may): the next call finds the plans that read a
replaced array and traces them again. A parameter replaced some other way (assigning a new
array to the attribute, or a module the compiled *function* only closes over) is not seen:
call :meth:`Compiled.clear` then.

**Cross-request batching** (opt-in, ``batch_axis=``): calls that arrive while an earlier batch
of the same compiled model is running are gathered, concatenated along ``batch_axis``, run as
one launch (every op then runs once for all of them, with larger, faster kernels: the
on-the-fly batching of DyNet, at the granularity of the whole program), and the outputs split
back along ``batch_axis``. A call never waits for others when nothing of this model runs, and
at most ``max_wait`` seconds otherwise. The batch is padded to a power of two (so at most a
few sizes are traced), the padding rows being copies of the first input's. Every array input
and output must have the batch axis, and rows must be independent (no op may mix the batch's
rows: reductions over the batch axis, batch norm ...): the results are then those of running
each call alone, within float rounding. A batch that fails (a kernel raised on some call's
rows) runs its calls again one at a time, so each caller gets its own result or its own error,
as unbatched.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

import anyio
import numpy as np

from ._batching import ARRAY_SLOT, Batch, Timer, slice_rows, with_arrays
from ._errors import DataflowError, DataflowTypeError, DataflowValueError
from ._instrument import ACTIVE
from ._lookup import get_runtime
from ._task import Pending
from .graph._here import run_here
from .graph._launch import launch

__all__ = ["Compiled", "compile"]

R = TypeVar("R")
_ndarray = np.ndarray


def compile(
    fn: Callable[..., Any] | None = None,
    *,
    check: bool = True,
    optimize: bool = True,
    batch_axis: int | None = None,
    max_batch: int = 32,
    max_wait: float = 0.002,
) -> Any:
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
    if type(max_batch) is not int or max_batch < 1:
        raise DataflowValueError(f"compile(max_batch=) must be a positive int, got {max_batch!r}")
    if isinstance(max_wait, bool) or not isinstance(max_wait, int | float) or not max_wait >= 0:
        raise DataflowValueError(f"compile(max_wait=) must be >= 0 seconds, got {max_wait!r}")

    def make(f: Callable[..., Any]) -> Compiled[Any]:
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


class Compiled(Generic[R]):
    """A compiled forward: call it like the function; ``await`` gives the outputs' arrays.

    Attributes:
        programs: the prepared plans, by signature (read it to see what was compiled).
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
        self._compiling: dict[Hashable, list[Any]] = {}
        self._batches: dict[Hashable, Batch] = {}
        self._running: dict[Hashable, int] = {}
        # The module parameters each plan read, by name (``_stale``), and the module's
        # parameter_version when they were last checked (None: not a versioned module).
        self._read: dict[Hashable, dict[str, Any]] = {}
        self._versioned = hasattr(fn, "parameter_version") and hasattr(fn, "named_parameters")
        self._version = getattr(fn, "parameter_version", None) if self._versioned else None
        self.launches = 0
        self.calls = 0
        functools.update_wrapper(self, fn, updated=())

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        return f"<dataflow.compile {name} signatures={len(self.programs)} calls={self.calls}>"

    def clear(self) -> None:
        """Forget every compiled plan: the next call of each signature traces it again (after
        replacing a parameter in a way the module does not report: see the module docstring,
        "Parameters")."""
        self.programs.clear()
        self._read.clear()

    def _stale(self, version: Any) -> None:
        """The module's parameter_version changed (``load_state_dict`` replaced parameters):
        forget the plans that read an array the module no longer holds under that name."""
        self._version = version
        current = dict(self.fn.named_parameters())  # type: ignore[attr-defined]
        for key, read in list(self._read.items()):
            if any(current.get(name) is not array for name, array in read.items()):
                self.programs.pop(key, None)
                del self._read[key]

    # -- signatures ------------------------------------------------------------------------

    @staticmethod
    def _split(args: tuple[Any, ...]) -> tuple[list[Any], list[Any], list[Any]]:
        """(array arguments, the other arguments, the signature key's parts)."""
        arrays: list[Any] = []
        statics: list[Any] = []
        key: list[Any] = []
        for a in args:
            if type(a) is _ndarray:  # the common case, its shape a tuple already
                arrays.append(a)
                statics.append(ARRAY_SLOT)
                key.append((a.shape, a.dtype))
                continue
            if isinstance(a, Pending):
                shape = getattr(a, "shape", None)
                dtype = getattr(a, "dtype", None)
                if shape is None or dtype is None:
                    raise DataflowTypeError(
                        "a compiled forward takes arrays (or Tensors) and hashable values; "
                        f"got a pending {type(a).__name__} without a shape and dtype"
                    )
                arrays.append(a)
                statics.append(ARRAY_SLOT)
                key.append((tuple(shape), np.dtype(dtype)))
            else:
                try:
                    hash(a)
                except TypeError:
                    if isinstance(a, tuple | list) and any(
                        isinstance(v, _ndarray | Pending) for v in a
                    ):
                        raise DataflowTypeError(
                            f"a compiled forward takes each array as an argument of its own, "
                            f"got a {type(a).__name__} of arrays (such as an LSTM's (h0, c0)): "
                            "compile a function that takes them one by one, e.g. `async def "
                            "fwd(x, h0, c0): return await lstm(x, (h0, c0))`"
                        ) from None
                    raise DataflowTypeError(
                        f"a compiled forward's non-array arguments are part of its signature "
                        f"and must be hashable: got {type(a).__name__}: {a!r:.60}"
                    ) from None
                statics.append(a)
                key.append((type(a), a))
        return arrays, statics, key

    async def _program(self, key: Hashable, arrays: list[Any], statics: list[Any]) -> Any:
        """The prepared plan of this signature, tracing it if it is new."""
        found = self.programs.get(key)
        if found is not None:
            return found
        rt = get_runtime("a compiled forward")
        waiting = self._compiling.get(key)
        if waiting is not None:  # another call is tracing it: wait for that one
            assert rt.host is not None
            waiter = rt.host.waiter()
            waiting.append(waiter)
            await waiter
            found = self.programs.get(key)
            if found is None:
                raise DataflowError(f"{self!r}: compiling this signature failed (see above)")
            return found
        self._compiling[key] = []
        try:
            found = self.programs[key] = await self._trace(arrays, statics)
            graph = found.graph
            self._read[key] = {name: graph.constants[name] for name in graph.parameters}
        finally:
            wake = self._compiling.pop(key)
            if wake and rt.host is not None:
                rt.host.wake(wake)
        return found

    async def _trace(self, arrays: list[Any], statics: list[Any]) -> Any:
        from .graph import TracerWarning, trace_async
        from .graph._launch import Program

        fn = self.fn

        async def program(*xs: Any) -> Any:
            it = iter(xs)
            call = [next(it) if s is ARRAY_SLOT else s for s in statics]
            return await fn(*call)

        program.__name__ = getattr(fn, "__name__", type(fn).__name__)
        named = getattr(fn, "named_parameters", None)
        if callable(named):  # a module: the trace names its parameters (``_stale`` reads them)
            program.named_parameters = named  # type: ignore[attr-defined]
        examples = [np.asarray(a.result()) if isinstance(a, Pending) else a for a in arrays]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TracerWarning)
            graph = await trace_async(program, *examples, check=self.check)
        problems = [str(w.message) for w in caught if issubclass(w.category, TracerWarning)]
        for w in caught:
            if not (self.check and issubclass(w.category, TracerWarning)):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if problems and self.check:
            raise DataflowError(
                f"compile({program.__name__}): the program cannot be compiled: "
                + "; ".join(problems)
                + ". Compiled programs must issue the same ops whatever the input values; "
                "pass check=False to compile anyway (at your own risk)"
            )
        if self.optimize:
            graph = graph.optimize()
        return Program(graph)

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
            # A Tensor input is awaited first: the plan's kernels take its value.
            arrays = [(await a) if isinstance(a, Pending) else a for a in arrays]
        if self.batch_axis is not None and arrays:
            return await self._batched(arrays, statics, key)  # type: ignore[no-any-return]
        k = tuple(key)
        prog = self.programs.get(k)
        if prog is None:
            prog = await self._program(k, arrays, statics)
        return await self._launch(prog, arrays)  # type: ignore[no-any-return]

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
            and prog.runs_here(sched.inline_threshold)
        ):
            # A short plan of small kernels, unobserved: run it whole here, now, without
            # the launch's tasks and waiter (``graph._here.run_here``; the inputs are arrays:
            # ``__call__`` awaited any Tensor).
            return run_here(prog, rt, arrays)
        waiter = host.waiter()
        # A batch must run elsewhere: the next batch gathers the calls made meanwhile.
        gather = launch(rt, prog, arrays, None, waiter, self.batch_axis is None)
        await waiter
        return Pending(gather).result()

    async def warm_up(self, *args: Any) -> int:
        """Compile, before traffic, every signature that calls like ``args`` will use.

        Without batching that is the signature of ``args``. With ``batch_axis``, a batch of
        n such calls runs at a padded size (a power of two times their rows), and each new
        size is traced the first time it occurs, on the event loop, in the middle of serving
        (tens of ms for a real model): so every padded size up to ``max_batch`` calls is
        traced here. Call it at startup, inside the runtime (``examples/serve.py`` does).

        Returns:
            How many signatures were traced now (those already compiled are not counted).
        """
        arrays, statics, key = self._split(args)
        before = len(self.programs)
        if self.batch_axis is None or not arrays:
            await self._program(tuple(key), arrays, statics)
            return len(self.programs) - before
        axis = self.batch_axis
        rows = {int(np.shape(a)[axis]) for a in arrays}
        if len(rows) != 1:
            raise DataflowValueError(
                f"{self!r}: every array input needs the same size along batch_axis {axis}, "
                f"got {sorted(rows)}"
            )
        one = rows.pop()
        size = 1
        while True:
            total = 1 << (size * one - 1).bit_length()
            inputs = [
                np.repeat(np.asarray(a.result()) if isinstance(a, Pending) else a, total // one,
                          axis=axis)
                for a in arrays
            ]  # fmt: skip
            if total % one:  # rows that do not divide a power of two: pad like a batch does
                inputs = [np.concatenate([x, np.take(x, [0] * (total % one), axis=axis)],
                                         axis=axis) for x in inputs]  # fmt: skip
            _, _, k = self._split(tuple(with_arrays(statics, inputs)))
            await self._program(tuple(k), inputs, statics)
            if size >= self.max_batch:
                break
            size = min(self.max_batch, 2 * size)
        return len(self.programs) - before

    # -- batching --------------------------------------------------------------------------

    async def _batched(self, arrays: list[Any], statics: list[Any], key: list[Any]) -> Any:
        axis = self.batch_axis
        assert axis is not None
        rows = []
        for a in arrays:
            shape = tuple(a.shape)
            if not -len(shape) <= axis < len(shape):
                raise DataflowValueError(
                    f"{self!r}: batch_axis {axis} is out of range for an input of shape {shape}"
                )
            rows.append(shape[axis])
        if len(set(rows)) != 1:
            raise DataflowValueError(
                f"{self!r}: every array input needs the same size along batch_axis {axis}, "
                f"got {rows}"
            )
        # The group of calls that may share a batch: the signature less the batch axis.
        group: list[Any] = []
        for s, part in zip(statics, key, strict=True):
            if s is ARRAY_SLOT:
                shape, dtype = part
                a = axis % len(shape)
                part = (shape[:a] + shape[a + 1 :], dtype)
            group.append(part)
        gk = tuple(group)
        rt = get_runtime("a compiled forward")
        batch = self._batches.get(gk)
        if batch is None or batch.closed or len(batch.calls) >= self.max_batch:
            batch = self._batches[gk] = Batch(gk, self._forget)
        call = batch.join(arrays, rows[0], rt)
        if not self._running.get(gk) or len(batch.calls) >= self.max_batch:
            self._flush(gk, batch, statics)  # nothing of this model runs: no reason to wait
        elif len(batch.calls) == 1:
            batch.timer = Timer(rt, self.max_wait, lambda: self._flush(gk, batch, statics))
        return await call

    def _forget(self, gk: Hashable, batch: Batch) -> None:
        """Take ``batch`` out of the open batches (it is launched, or every caller left)."""
        if self._batches.get(gk) is batch:
            del self._batches[gk]

    def _flush(self, gk: Hashable, batch: Batch, statics: list[Any]) -> None:
        if batch.closed:
            return
        batch.closed = True
        self._forget(gk, batch)
        if batch.timer is not None:
            batch.timer.cancel()
        rt = batch.rt
        assert rt is not None and rt.host is not None
        self._running[gk] = self._running.get(gk, 0) + 1
        batch.task = rt.host.spawn(self._run_batch(gk, batch, statics), f"batch {gk!r:.40}")

    async def _run_batch(self, gk: Hashable, batch: Batch, statics: list[Any]) -> None:
        axis = self.batch_axis
        assert axis is not None
        running = True
        delivered = 0
        # The calls whose callers still wait (a cancelled caller's rows are left out).
        calls = [k for k, left in enumerate(batch.left) if not left]
        try:
            if not calls:
                return
            total = sum(batch.rows[k] for k in calls)
            padded = 1 << (total - 1).bit_length()
            inputs = []
            for j in range(len(batch.calls[0])):
                parts = [np.asarray(c[j].result()) if isinstance(c[j], Pending) else c[j]
                         for c in (batch.calls[k] for k in calls)]  # fmt: skip
                if padded > total:
                    first = np.take(parts[0], [0], axis=axis)
                    parts.append(np.repeat(first, padded - total, axis=axis))
                inputs.append(np.concatenate(parts, axis=axis))
            _, _, key = self._split(tuple(with_arrays(statics, inputs)))
            prog = await self._program(tuple(key), inputs, statics)
            try:
                out = await self._launch(prog, inputs)
            except Exception:
                if len(calls) == 1:
                    raise
                # A kernel raised on some call's rows: one caller's bad input must not fail
                # the others (nor show them its error). Each call runs again alone, and gets
                # its own result or its own error, as it would unbatched.
                for i, k in enumerate(calls):
                    if not batch.left[k]:
                        value, error = await self._alone(batch.calls[k], statics)
                        batch.done[k](value, error)
                    delivered = i + 1
                return
            self._running[gk] -= 1  # the model is free: the next batch need not wait for us
            running = False
            bounds = np.cumsum([0, *(batch.rows[k] for k in calls)])
            for i, k in enumerate(calls):
                if i:
                    # One caller resumed per loop iteration: woken all at once, a batch's
                    # callers would run back to back (each answering its client) and hold
                    # the loop for all of them; this way other work runs in between.
                    await anyio.sleep(0)
                lo, hi = int(bounds[i]), int(bounds[i + 1])
                batch.done[k](slice_rows(out, axis, lo, hi), None)
                delivered = i + 1
        except BaseException as exc:
            for k in calls[delivered:]:
                batch.done[k](None, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            if running:
                self._running[gk] -= 1

    async def _alone(self, arrays: list[Any], statics: list[Any]) -> tuple[Any, Exception | None]:
        """One call of a failed batch, run by itself: (its outputs, None) or (None, its error)."""
        try:
            values = [np.asarray(a.result()) if isinstance(a, Pending) else a for a in arrays]
            _, _, key = self._split(tuple(with_arrays(statics, values)))
            prog = await self._program(tuple(key), values, statics)
            return await self._launch(prog, values), None
        except Exception as exc:
            return None, exc
