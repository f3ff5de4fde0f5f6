"""The worker side of the Dask backend: what runs inside a Dask worker process.

Everything here is pickled by reference and runs on the workers, so the workers need
dataflow (and the ops' modules) installed, like the client. A shipped op call is a
:class:`Call` (the kernel, or its registry name, and its arguments with :class:`Ref`
placeholders for the values Dask passes in); :func:`run_op` fills the placeholders, runs the
kernel, checks its value against the op's declared spec, and reports the kernel's span when
the client asked for timings. A kernel's exception travels back as :class:`KernelFailed`,
naming the task and the worker, with the original exception (or a printable stand-in) inside.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import pickle
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from .._errors import OpNotFoundError, OpTimeoutError, describe
from .._registry import lookup_op
from .._signature import Signature
from .._walk import replace

__all__ = ["Call", "KernelFailed", "Ref", "fill", "run_op"]


class Ref:
    """Placeholder for the ``slot``-th dependency (an input's value, or a scattered array)."""

    __slots__ = ("index", "slot")

    def __init__(self, slot: int, index: int | None) -> None:
        self.slot = slot
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return (Ref, (self.slot, self.index))


class Call:
    """One op call as shipped: the kernel, its arguments with placeholders, and its name.

    Opaque to Dask on purpose: Dask only looks for dependencies in the ``deps`` list next to
    it, never inside the user's arguments (where a tuple or a string could be mistaken for
    a task or a key).
    """

    __slots__ = (
        "args",
        "check",
        "fn",
        "kwargs",
        "name",
        "op",
        "refs",
        "spec",
        "task_id",
        "timeout",
        "topic",
    )

    def __init__(
        self,
        fn: Callable[..., Any] | str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        name: str,
        op: str,
        task_id: int,
        topic: str | None,
        refs: bool,
        spec: Any = None,
        check: Any = None,
        timeout: float | None = None,
    ) -> None:
        self.timeout = timeout  # the op's timeout (seconds), as on the local backend
        self.spec = spec
        self.check = check  # None when fn is a registry name (the worker's op has it)
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.name = name
        self.op = op
        self.task_id = task_id
        self.topic = topic
        self.refs = refs

    def __reduce__(self) -> tuple[Any, ...]:
        fields = (
            self.fn,
            self.args,
            self.kwargs,
            self.name,
            self.op,
            self.task_id,
            self.topic,
            self.refs,
            self.spec,
            self.check,
        )
        # (The timeout only where there is one: a call without travels as before it existed.)
        return (Call, fields if self.timeout is None else (*fields, self.timeout))


class KernelFailed(Exception):
    """A kernel raised on a worker (internal: becomes a TaskError on the client).

    Dask hands the same exception to every task downstream of the failed one, so ``task``
    names the origin, and the client gives all of them the origin's one TaskError.
    """

    def __init__(
        self,
        task: str,
        op: str,
        worker: str,
        exc: BaseException,
        loading: bool = False,
        shipped: Any = None,
    ) -> None:
        super().__init__(task, op, worker, exc)
        self.task = task
        self.op = op
        self.worker = worker
        self.exc = exc
        self.loading = loading  # the worker could not load the op (its module, say)
        # What pickles as ``exc`` (``_portable``): ``exc`` itself, or a ``_Rebuild`` of it.
        self._shipped = exc if shipped is None else shipped

    def __reduce__(self) -> tuple[Any, ...]:
        return (KernelFailed, (self.task, self.op, self.worker, self._shipped, self.loading))

    def __str__(self) -> str:
        # describe(): the kernel's exception may have a __str__ that raises itself.
        return f"{self.task} failed on {self.worker}: {describe(self.exc)}"


# Arrays that arrive over the network (scattered, moved between workers, or inside a task)
# are often not aligned in memory, and numpy's matmul then skips BLAS for a loop 5-10x
# slower. Kernels get an aligned copy instead, made once per array and per worker process:
# this cache maps id(array) -> (weakref to it, its copy), and drops an entry with its array.
_realigned: dict[int, tuple[weakref.ref[Any], np.ndarray[Any, Any]]] = {}


def _aligned(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    key = id(a)
    hit = _realigned.get(key)
    if hit is not None and hit[0]() is a:
        return hit[1]
    copy = np.array(a)

    def forget(_: Any, key: int = key) -> None:
        entry = _realigned.get(key)
        if entry is not None and entry[0]() is None:
            del _realigned[key]

    _realigned[key] = (weakref.ref(a, forget), copy)
    return copy


def fill(value: Any, deps: list[Any]) -> Any:
    """``value`` with each :class:`Ref` replaced by its dependency (containers walked)."""

    def leaf(v: Any) -> Any:
        t = type(v)
        if t is Ref:
            dep = deps[v.slot]
            if v.index is not None:
                dep = dep[v.index]
            if type(dep) is np.ndarray and not dep.flags.aligned:
                return _aligned(dep)
            return dep
        if t is np.ndarray and not v.flags.aligned:  # came inside the task: copy it
            return np.array(v)
        return v

    return replace(value, leaf)


def _rebuild(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """An exception of ``cls`` with ``args`` and the attributes ``state``, made without
    calling its ``__init__`` (unpickling a :class:`_Rebuild`)."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    if state:
        exc.__setstate__(state)
    return exc


class _Rebuild:
    """Pickles as an exception of ``cls`` rebuilt on the client from its ``args`` and the
    attributes in ``state``, without calling its class.

    Pickle rebuilds an exception by calling its class with its ``args``, which an exception
    with a constructor of its own refuses (``def __init__(self, code, detail)`` passing a
    message up: ``args`` is the message alone) or, worse, accepts and garbles (``def
    __init__(self, name)`` passing up ``f"no such thing: {name}"`` came back as ``"no such
    thing: no such thing: x"``).
    """

    __slots__ = ("args", "cls", "state")

    def __init__(self, cls: type[BaseException], args: Any, state: dict[str, Any]) -> None:
        self.cls = cls
        self.args = args
        self.state = state

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.cls, self.args, self.state))


def _round_trip(value: Any) -> Any:
    """``value`` sent back as Dask sends a task's error: with Dask's pickle, which falls back
    to cloudpickle (for what the client's ``__main__`` defined, which reached the worker by
    value; the standard pickle cannot find it by name there). Raises when it cannot."""
    codec: Any = pickle
    with contextlib.suppress(ImportError):  # (else run outside Dask, as some tests do)
        from distributed.protocol import pickle as codec
    return codec.loads(codec.dumps(value))


def _pickles(value: Any) -> bool:
    try:
        _round_trip(value)
    except Exception:
        return False
    return True


def _same(exc: BaseException, back: Any) -> bool:
    """Whether ``back`` (``exc`` sent back) is the same exception: its class and ``args``."""
    if type(back).__qualname__ != type(exc).__qualname__:
        return False
    if isinstance(exc, BaseExceptionGroup):
        return (
            back.message == exc.message
            and len(back.exceptions) == len(exc.exceptions)
            and all(_same(e, b) for e, b in zip(exc.exceptions, back.exceptions, strict=True))
        )
    try:
        return bool(back.args == exc.args)
    except Exception:  # (arguments that do not compare, arrays say: their class is enough)
        return True


# The reductions of the built-in exceptions: "call the class with args, then set __dict__".
_BUILTIN_REDUCE = (BaseException.__reduce__, OSError.__reduce__)


def _shipped(exc: BaseException) -> Any:
    """What pickles as ``exc`` and arrives as the same exception; None if nothing does."""
    try:
        if _same(exc, _round_trip(exc)):
            return exc
    except Exception:
        pass
    if type(exc).__reduce__ not in _BUILTIN_REDUCE:
        return None  # its class pickles itself, and refuses
    args = exc.args
    if isinstance(exc, BaseExceptionGroup):  # its exceptions, each shipped
        parts = [_shipped(e) for e in exc.exceptions]
        if any(p is None for p in parts):
            return None
        args = (exc.message, parts)
    attrs = vars(exc)
    state = {k: v for k, v in attrs.items() if _pickles(v)}
    left = sorted(k for k in attrs if k not in state)
    if left:
        state["__notes__"] = [
            *state.get("__notes__", ()),
            f"(attributes left on the worker, they could not be pickled: {', '.join(left)})",
        ]
    carrier = _Rebuild(type(exc), args, state)
    return carrier if _pickles(carrier) else None


def _portable(exc: BaseException) -> tuple[BaseException, Any]:
    """(the exception the client gets, what pickles as it) for a kernel's exception.

    The exception itself where it arrives as itself; else, for a class that leaves pickling
    to the built-in exceptions (its constructor refuses or garbles its ``args``, as
    ``dataflow.TaskError``'s keywords do, or an attribute does not pickle), the same
    exception rebuilt without its constructor and without the attributes that do not
    pickle (a note names them); else a ``RuntimeError`` describing it (a class whose own
    ``__reduce__`` refuses).
    """
    shipped = _shipped(exc)
    if shipped is not None:
        return exc, shipped
    stand_in = RuntimeError(f"{describe(exc)} (the original could not be pickled)")
    return stand_in, stand_in


@functools.lru_cache(maxsize=1024)
def _declared(qualname: str) -> tuple[Callable[..., Any], Any]:
    """(kernel, value check) of the op registered as ``module:name``, importing its module."""
    module = qualname.split(":", 1)[0]
    importlib.import_module(module)
    op = lookup_op(qualname)
    if op is None:
        raise OpNotFoundError(f"no op {qualname!r} is declared by module {module!r} on this worker")
    return op.kernel, op.check


def run_op(call: Call, deps: list[Any]) -> Any:
    """Run one op's kernel on a worker (the function every dataflow Dask task calls)."""
    args = fill(call.args, deps)
    kwargs = fill(call.kwargs, deps) if call.kwargs else None
    start = time.time_ns() if call.topic is not None else 0
    failed: KernelFailed | None = None
    if isinstance(call.fn, str):
        try:
            fn, check = _declared(call.fn)
        except Exception as exc:  # a module the workers lack: this task's failure, too
            failed = _failure(call, exc, start, loading=True)
        if failed is not None:
            raise failed
    else:
        fn, check = call.fn, call.check
    try:
        if call.timeout is not None:
            value = _run_timed(call, fn, args, kwargs)
        else:
            value = fn(*args, **kwargs) if kwargs else fn(*args)
        if check is not None and call.spec is not None:  # what the meta rule declared
            sig = Signature(call.op, call.spec)
            sig.check = check
            sig.check_value(value)
    except BaseException as exc:
        # Every exception the kernel raises is the task's failure, as on the local backend:
        # SystemExit and KeyboardInterrupt too, which Dask would let through to shut the
        # worker process down. Nothing else can arrive here: this runs on a worker's executor
        # thread, where Dask never raises to cancel a task (it drops the result) and signals
        # never land (they go to the main thread), so whatever is raised is the kernel's own.
        failed = _failure(call, exc, start)
    if failed is not None:
        # Raised here, outside the except block, so that it has no __context__: Dask pickles
        # an error with its context (tblib), and the kernel's own exception may not pickle
        # (that is what _portable replaced), which would lose the KernelFailed altogether.
        raise failed
    if call.topic is not None:
        worker = _this_worker()
        if worker is not None:
            _log_timing(worker, call, start, failed=False)
    return value


def _run_timed(call: Call, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """The kernel's value, run under the op's timeout as on the local backend.

    A thread cannot be interrupted, so the kernel runs on a thread of its own that this one
    waits for at most ``call.timeout`` seconds; past that, the task fails with
    :class:`~dataflow.OpTimeoutError` and the worker's thread goes on to its next task, while
    the kernel's thread finishes in the background and its outcome is dropped (the local
    backend's pool starts a replacement thread instead). Only ops with a timeout pay for the
    thread.
    """
    seconds = call.timeout
    assert seconds is not None
    outcome: list[Any] = []
    done = threading.Event()
    context = contextvars.copy_context()

    def kernel() -> None:
        try:
            outcome.append((True, context.run(fn, *args, **(kwargs or {}))))
        except BaseException as exc:  # the kernel's own, raised on the worker's thread below
            outcome.append((False, exc))
        finally:
            done.set()

    thread = threading.Thread(target=kernel, name=f"dataflow-timed {call.name}", daemon=True)
    thread.start()
    if not done.wait(seconds):
        raise OpTimeoutError(
            f"{call.name} timed out: its kernel ran longer than the {seconds:g} s timeout of "
            f"op {call.op!r}. A running kernel cannot be interrupted: it is left to finish "
            "in the background on its Dask worker and its result will be discarded. Raise "
            "the timeout (dataflow.op(..., timeout=) or Runtime(op_timeout=)) if the op is "
            "just slow, or find out why it hangs.",
            task=call.name,
            op=call.op,
        )
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _failure(call: Call, exc: BaseException, start: int, loading: bool = False) -> KernelFailed:
    """The KernelFailed a kernel's exception travels back as (its span reported if timed)."""
    worker = _this_worker()
    if call.topic is not None and worker is not None:
        _log_timing(worker, call, start, failed=True)
    where = f"dask worker {worker.address}" if worker is not None else "process outside Dask"
    tb = "".join(traceback.format_tb(exc.__traceback__))
    note = f"Traceback of {call.name} on the {where} (most recent call last):\n{tb}"
    exc.add_note(note)
    given, shipped = _portable(exc)
    if given is not exc:
        given.add_note(note)
    return KernelFailed(call.name, call.op, where, given, loading, shipped)


def _this_worker() -> Any:
    """The Dask worker running this task (None when run outside one, as tests do)."""
    from distributed import get_worker

    try:
        return get_worker()
    except ValueError:
        return None


def _log_timing(worker: Any, call: Call, start: int, failed: bool) -> None:
    thread = threading.current_thread()
    msg = [call.task_id, start, time.time_ns(), failed, worker.address, thread.name]
    msg.append(threading.get_native_id())
    worker.log_event(call.topic, msg)
