"""A compiled forward's plans: one per input signature, traced on first use, kept until stale.

The lowest layer of :class:`~dataflow.Compiled` (see :mod:`dataflow._compile` for what a
compiled forward is; :mod:`dataflow._batching` is the layer above, ``_compile`` the top).
A call's *signature* is each array argument's shape and dtype, and the value of every other
argument (:meth:`Plans._split`; an array's place among the other arguments is marked
:data:`ARRAY_SLOT`, and :func:`with_arrays` puts arrays back in those places). The first call
with a new signature traces the program (``dataflow.trace``: its ops are recorded, not run),
optimises the graph and prepares it for launching (``dataflow.graph._launch.Program``):
:meth:`Plans._program`, which makes a call of that signature arriving meanwhile wait for
that one trace rather than start its own.

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
replaced array and traces them again (:meth:`Plans._stale`). A parameter replaced some other
way (assigning a new array to the attribute, or a module the compiled *function* only closes
over) is not seen: call :meth:`Plans.clear` then.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from ._errors import DataflowError, DataflowTypeError
from ._lookup import get_runtime
from ._task import Future, Pending

__all__ = ["ARRAY_SLOT", "Plans", "Tracing", "with_arrays"]

_ndarray = np.ndarray

#: Marks an array argument's place among a call's static arguments (``Plans._split``).
ARRAY_SLOT = object()

#: The most plans a compiled forward keeps: past it, the oldest traced is forgotten (and
#: traced again if called again). Each plan holds its graph and buffers; a server fed
#: inputs of ever new shapes (or static values) would otherwise keep one per signature for
#: good. Compiled.evicted counts the plans forgotten.
MAX_PLANS = 256


def with_arrays(statics: list[Any], arrays: list[Any]) -> list[Any]:
    """The call's arguments again: ``arrays`` put back in the places ``ARRAY_SLOT`` marks."""
    it = iter(arrays)
    return [next(it) if s is ARRAY_SLOT else s for s in statics]


def _static_key(value: Any) -> Any:
    """A non-array argument's part of the signature: equal only for arguments a program
    cannot tell apart, not merely ``==`` ones (``2`` and ``2.0``, ``True`` and ``1``,
    ``0.0`` and ``-0.0``, also inside tuples), and equal for two NaNs, which are never
    ``==``: each call with a NaN would trace a plan of its own."""
    t = type(value)
    if t is float or t is complex:
        return (t, repr(value))
    if isinstance(value, tuple):  # a tuple, or a NamedTuple (its class is part of the key)
        return (t, tuple(_static_key(v) for v in value))
    if isinstance(value, frozenset):
        return (t, frozenset(_static_key(v) for v in value))
    if isinstance(value, np.generic):
        return (t, value.dtype.str, value.tobytes())
    return (t, value)


def _holds_arrays(value: tuple[Any, ...] | list[Any] | frozenset[Any]) -> bool:
    """Whether an array or a Tensor is in ``value`` (tuples and lists walked)."""
    return any(
        isinstance(v, _ndarray | Pending)
        or (isinstance(v, tuple | list | frozenset) and _holds_arrays(v))
        for v in value
    )


class Tracing:
    """A signature being traced: the calls waiting for it (each with its runtime's host
    loop), and its error once it failed."""

    __slots__ = ("error", "waiters")

    def __init__(self) -> None:
        self.waiters: list[Any] = []
        self.error: Exception | None = None


class Plans:
    """The prepared plans of a compiled forward, by signature, and how they are made and
    forgotten (:class:`~dataflow.Compiled`, whose constructor sets this state)."""

    fn: Callable[..., Any]
    check: bool
    optimize: bool
    programs: dict[Hashable, Any]
    _compiling: dict[Hashable, Tracing]
    # The module parameters each plan read, by name (``_stale``), and the module's
    # parameter_version when they were last checked (None: not a versioned module).
    _read: dict[Hashable, dict[str, Any]]
    _version: Any
    evicted: int

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

    def _evict(self) -> None:
        """More than MAX_PLANS plans: forget the oldest traced (a dict keeps that order), and
        warn once per compiled forward (its signatures keep changing: see docs/serving.md)."""
        oldest = next(iter(self.programs))
        del self.programs[oldest]
        self._read.pop(oldest, None)
        self.evicted += 1
        if self.evicted == 1:
            name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
            warnings.warn(
                f"compile({name}): more than {MAX_PLANS} signatures (input shapes, dtypes and "
                "static arguments) were compiled; the oldest plans are forgotten and traced "
                "again when called again. Bound the shapes a server accepts (pad or bucket "
                "them), or pass changing values as arrays rather than static arguments",
                RuntimeWarning,
                stacklevel=2,
            )

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
                # A tuple of Tensors is hashable (by identity): taken as a static, it was
                # traced anew at every call, each plan kept (and its Tensors) for good.
                if isinstance(a, tuple | list | frozenset) and _holds_arrays(a):
                    raise DataflowTypeError(
                        f"a compiled forward takes each array as an argument of its own, "
                        f"got a {type(a).__name__} of arrays (such as an LSTM's (h0, c0)): "
                        "compile a function that takes them one by one, e.g. `async def "
                        "fwd(x, h0, c0): return await lstm(x, (h0, c0))`"
                    )
                try:
                    hash(a)
                except TypeError:
                    raise DataflowTypeError(
                        f"a compiled forward's non-array arguments are part of its signature "
                        f"and must be hashable: got {type(a).__name__}: {a!r:.60}"
                    ) from None
                statics.append(a)
                key.append(_static_key(a))
        return arrays, statics, key

    async def _program(self, key: Hashable, arrays: list[Any], statics: list[Any]) -> Any:
        """The prepared plan of this signature, tracing it if it is new.

        The trace runs in a task of its own, owned by the runtime, which every call of the
        signature meanwhile waits for: a caller that stops waiting (a deadline, a client gone)
        does not cancel it, so a trace longer than the callers' deadline still ends, and the
        next call finds its plan (cancelled with each caller, it never compiled). If it
        failed, the waiting calls raise its error; if it was cancelled (its runtime closing),
        a waiting call traces the signature again."""
        while True:
            found = self.programs.get(key)
            if found is not None:
                return found
            rt = get_runtime("a compiled forward")
            host = rt.host
            assert host is not None
            entry = self._compiling.get(key)
            if entry is None:
                entry = self._compiling[key] = Tracing()
                host.spawn(self._trace_into(key, entry, arrays, statics), "compile: trace")
            waiter = host.waiter()
            entry.waiters.append((host, waiter))
            await waiter
            if entry.error is not None:
                raise entry.error

    async def _trace_into(
        self, key: Hashable, entry: Tracing, arrays: list[Any], statics: list[Any]
    ) -> None:
        """Trace a signature (``_program``'s task): its plan, or ``entry.error``."""
        try:
            found = self.programs[key] = await self._trace(arrays, statics)
            graph = found.graph
            self._read[key] = {name: graph.constants[name] for name in graph.parameters}
            if len(self.programs) > MAX_PLANS:
                self._evict()
        except Exception as exc:
            entry.error = exc
        finally:
            del self._compiling[key]
            # Each waiter through its own loop: a call from another runtime (another thread's
            # dataflow.run) waits on its loop, which only its host may wake (it used to hang).
            for host, waiter in entry.waiters:
                host.wake([waiter])

    async def _trace(self, arrays: list[Any], statics: list[Any]) -> Any:
        from .graph import trace_async
        from .graph._errors import COLLECTED
        from .graph._launch import Program

        fn = self.fn

        async def program(*xs: Any) -> Any:
            it = iter(xs)
            call = [next(it) if s is ARRAY_SLOT else s for s in statics]
            result = fn(*call)
            # A plain function's pending outputs are outputs, not awaited (as trace() takes
            # them: awaiting one read its value, which compiling refused; a tuple of them
            # raised TypeError); an async function's coroutine is run.
            if inspect.isawaitable(result) and not isinstance(result, Future):
                result = await result
            return result

        program.__name__ = getattr(fn, "__name__", type(fn).__name__)
        named = getattr(fn, "named_parameters", None)
        if callable(named):  # a module: the trace names its parameters (``_stale`` reads them)
            program.named_parameters = named  # type: ignore[attr-defined]
        examples = [np.asarray(a.result()) if isinstance(a, Pending) else a for a in arrays]
        # With check, what tracing cannot see refuses the program: the traces' TracerWarnings
        # are collected (in this task's context, not by catching warnings: see COLLECTED).
        problems: list[str] = []
        token = COLLECTED.set(problems) if self.check else None
        try:
            graph = await trace_async(program, *examples, check=self.check)
        finally:
            if token is not None:
                COLLECTED.reset(token)
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
