"""fork and wait: run a function in parallel with the caller, and wait for its future.

``fork`` mirrors ``torch.jit.fork``: it starts ``fn(*args, **kwargs)`` and returns a
:class:`~dataflow.Future` at once. An ``async def`` function (or a callable object whose
``__call__`` is one, such as an ``ops.nn.Module``) runs as a task on the event loop, owned by
the runtime (see ``_loop``); a plain function runs on an inter-op pool thread, after any
pending values among its arguments are ready, and receives their arrays.

:func:`wait` waits for such a future (or any pending value) without blocking a thread, like
``torch.jit.wait``; :class:`TaskFuture` is the future of a forked coroutine, settled on the
loop thread by the coroutine's wrapper.

Design note: this is the per-task path of forked work, kept apart from what starts a run
(``_api``: :func:`~dataflow._api.run`, :func:`~dataflow._api.materialize` and the model-code
rule). It builds on that module: a forked task's future, when awaited, reads the model-code
flag and, outside model code, materializes its value. The names it needs (``_model``,
``materialize``, ``_fn_name``) are imported into this module, so the hot path looks them up
as plain module globals, with no layer between; ``_api`` never imports this module, so
there is no cycle.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
import time
import types
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar, overload

import structlog

from . import _loop
from ._api import _fn_name, _model, materialize
from ._errors import (
    CancelledTaskError,
    DataflowError,
    DataflowTypeError,
    NotReadyError,
    TaskError,
    task_failed,
)
from ._instrument import ACTIVE
from ._logging import name_plain_fork
from ._lookup import current_runtime, get_runtime
from ._runtime import Runtime
from ._scheduler import scan
from ._signature import Signature
from ._task import DONE, Future, Pending, Task, _next_id

__all__ = ["TaskFuture", "fork", "wait"]

T = TypeVar("T")

# The forked task running in the current context (None at the top level of a run).
_parent: contextvars.ContextVar[TaskFuture[Any] | None] = contextvars.ContextVar(
    "dataflow_parent_fork", default=None
)
# The forking task's name, as the forked coroutine's span records it.
_parent_name: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "dataflow_parent_name", default=None
)

_RUNNING, _DONE, _FAILED, _CANCELLED = range(4)


def _is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` is the event loop's cancellation (asyncio's or trio's), or an exception
    group of nothing else (a nursery cancelled with the fork: trio groups its children's
    exceptions, by default from trio 0.25 on)."""
    if isinstance(exc, asyncio.CancelledError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_cancellation(inner) for inner in exc.exceptions)
    return type(exc).__name__ == "Cancelled" and type(exc).__module__.startswith("trio")


class TaskFuture(Future[T]):
    """The future of a forked ``async def`` function, owned by its runtime."""

    __slots__ = (
        "_children",
        "_handle",
        "_host",
        "_outcome",
        "_prune_at",
        "_rt",
        "_started",
        "_state",
        "_waiters",
        "name",
    )

    def __init__(self, name: str, rt: Runtime) -> None:
        self.name = name
        self._rt = rt
        self._host: _loop.HostLoop = rt.host  # type: ignore[assignment]
        self._state = _RUNNING
        self._outcome: Any = None
        # Made on first use (most forks are awaited once, and fork nothing themselves).
        self._waiters: list[Any] | None = None
        self._children: list[Future[Any]] | None = None
        self._prune_at = 64  # the children's count at which the finished ones are let go
        self._handle: Any = None
        self._started = 0  # perf_counter_ns when forked, while something observes

    # Outcomes are set on the loop thread, by the forked coroutine's wrapper.

    def _settle(self, state: int, outcome: Any) -> None:
        if self._state != _RUNNING:
            return
        self._state = state
        self._outcome = outcome
        # Nothing to cancel any more: let go of the loop's task (its finished coroutine, its
        # context), so a future kept by the program holds its outcome and little else.
        self._handle = None
        waiters, self._waiters = self._waiters, None
        if waiters:
            self._host.wake(waiters)
        if state == _CANCELLED and self._children:  # its children are cancelled too
            for child in self._children:
                child.cancel()

    def done(self) -> bool:
        return self._state != _RUNNING

    def result(self) -> T:
        state = self._state
        if state == _DONE:
            return self._outcome  # type: ignore[no-any-return]
        if state == _RUNNING:
            raise NotReadyError(f"forked task {self.name} is still running: await it first")
        if state == _CANCELLED:
            raise CancelledTaskError(f"forked task {self.name} was cancelled")
        exc = self._outcome
        if isinstance(exc, TaskError):
            exc.observed = True
        raise exc

    def exception(self) -> BaseException | None:
        try:
            self.result()
        except NotReadyError:
            raise
        except BaseException as exc:
            return exc
        return None

    def cancel(self) -> bool:
        if self._state != _RUNNING or self._handle is None:
            return False
        host = self._host
        if threading.get_ident() != host.thread_id:
            # From another thread (a plain fork, a kernel): neither an asyncio task nor a
            # trio cancel scope may be cancelled there, so the loop does it, soon. True says
            # the cancellation was requested, as asyncio's Task.cancel() does.
            try:
                host.call_soon(self.cancel)
            except RuntimeError:  # the loop is closed: nothing is left to cancel
                return False
            return True
        return host.cancel(self._handle)

    def __await__(self) -> Generator[Any, None, T]:
        if self._state == _RUNNING:
            if threading.get_ident() != self._host.thread_id:
                raise DataflowError(
                    f"forked task {self.name} belongs to a runtime on another event loop; "
                    "await it there (futures cannot move between event loops or threads)"
                )
            waiter = self._host.waiter()
            if self._waiters is None:
                self._waiters = [waiter]
            else:
                self._waiters.append(waiter)
            yield from waiter.__await__()
        value = self.result()
        if _model.get():  # model code keeps pending outputs pending (see model_code)
            return value
        out: T = yield from materialize(value).__await__()
        return out

    def __repr__(self) -> str:
        state = ("running", "done", "failed", "cancelled")[self._state]
        if self._state == _FAILED:
            state = f"failed {type(self._outcome).__name__}"
        return f"<Future {self.name} {state}>"


_FunctionType = types.FunctionType
_CO_COROUTINE = inspect.CO_COROUTINE


def _is_async_callable(fn: Any) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - want the type's, not the instance's
    return call is not None and not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


async def _run_forked(
    fut: TaskFuture[T], fn: Callable[..., Awaitable[T]], args: Any, kwargs: Any
) -> None:
    """The forked coroutine, as its runtime runs it: the outcome goes to its future."""
    parent = _parent.get()
    _parent_name.set(parent.name if parent is not None else None)
    _parent.set(fut)
    # Log lines inside the task carry its name; this context is the task's own copy.
    structlog.contextvars.bind_contextvars(dataflow_task=fut.name)
    try:
        value = await fn(*args, **kwargs)
    except BaseException as exc:
        if _is_cancellation(exc):
            fut._settle(_CANCELLED, None)
            raise
        err = task_failed(fut.name, _fn_name(fn), exc, what="forked task ")
        fut._rt.failures.append(err)
        fut._settle(_FAILED, err)
        stop = _stopping(exc)
        if stop is not None:
            # The process is being stopped: let the loop see it, as asyncio does. It is
            # reported by stopping the program, not again as a failure nobody awaited.
            err.observed = True
            if stop is exc:
                raise
            # Out of a task group's exception group: asyncio's loop lets only the interrupt
            # itself through, and a trio system task may raise nothing else.
            raise stop from None
    else:
        fut._settle(_DONE, value)
    finally:
        sched = fut._rt._sched
        if ACTIVE or sched.watching:
            sched.emit("fork_finished", fut.name)
            forker = _parent_name.get()
            sched.record_span("fork", fut.name, fut._started, time.perf_counter_ns(), forker)


def _stopping(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or SystemExit that ``exc`` is, or that an exception group holds
    (a task group in the forked coroutine: Ctrl-C landed in one of its tasks)."""
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _stopping(inner)
            if found is not None:
                return found
    return None


@overload
def fork(fn: Callable[..., Coroutine[Any, Any, T]], /, *args: Any, **kwargs: Any) -> Future[T]: ...
@overload
def fork(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]: ...
def fork(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
    """Start ``fn(*args, **kwargs)`` in parallel with the caller and return its future at once.

    Like ``torch.jit.fork``. ``fn`` may be an ``async def`` function or an object whose
    ``__call__`` is one (it runs as a task on the event loop), or a plain function (it runs on
    an inter-op pool thread once the pending values among its arguments are ready, and gets
    their arrays). Context variables set by the caller are visible inside ``fn``.

    Example:
        >>> async def main(x):
        ...     fut = dataflow.fork(model, x)   # runs while main goes on
        ...     y = other(x)
        ...     return y, await dataflow.wait(fut)

    Raises:
        TypeError: ``fn`` is not callable, or is a coroutine object (``fork(f(x))``).
        NoRuntimeError: called outside a runtime.
    """
    if type(fn) is _FunctionType:  # a def or a lambda: what the checks below come to
        is_async = bool(fn.__code__.co_flags & _CO_COROUTINE) or (
            # (inspect.markcoroutinefunction, Python 3.12+)
            getattr(fn, "_is_coroutine_marker", None) is not None
            and inspect.iscoroutinefunction(fn)
        )
    else:
        is_async = _checked_is_async(fn)
    rt = get_runtime("dataflow.fork()")
    parent = _parent.get()
    if is_async:
        fut: Future[Any] = _fork_async(rt, fn, args, kwargs, parent)
    else:
        ctx = contextvars.copy_context()
        call = name_plain_fork(fn)  # binds the task's name for log lines
        inputs, ready = scan(args, kwargs or None)
        sig = Signature(_fn_name(fn), inline=False)
        sig.measure = False
        task = rt.dispatch(sig, _in_context(ctx, call), args, kwargs or None, inputs, ready)
        fut = Pending(task)
        if task.state < DONE:
            task.handles = weakref.ref(fut)
    if parent is not None:
        children = parent._children
        if children is None:
            parent._children = [fut]
        else:
            children.append(fut)
            if len(children) >= parent._prune_at:
                # Only running children need cancelling with their parent: let go of the
                # finished ones (and their values), or a long-lived fork that forks and
                # awaits children one after another kept them all.
                children[:] = [c for c in children if not c.done()]
                parent._prune_at = max(64, 2 * len(children))
    return fut


def _checked_is_async(fn: Any) -> bool:
    """Whether ``fork`` runs ``fn`` as a task on the loop; refuses what cannot be forked."""
    if inspect.iscoroutine(fn):
        name = fn.cr_code.co_name
        fn.close()  # silence "coroutine was never awaited"
        raise DataflowTypeError(
            f"fork() got a coroutine object ({name}(...)), not a function. Pass the function "
            f"and its arguments separately: you did something like fork({name}(x)), "
            f"you want fork({name}, x)."
        )
    if inspect.isawaitable(fn):
        raise DataflowTypeError(
            f"fork() got an awaitable ({type(fn).__name__}), not a function: await it "
            "directly, or fork the function that produces it: fork(fn, *args)"
        )
    if not callable(fn):
        raise DataflowTypeError(
            f"fork() needs a callable as its first argument, got {type(fn).__name__}: {fn!r}. "
            "Pass the function to run and its arguments: fork(fn, *args)"
        )
    return _is_async_callable(fn)


def _in_context(ctx: contextvars.Context, fn: Callable[..., Any]) -> Callable[..., Any]:
    def in_context(*args: Any, **kwargs: Any) -> Any:
        return ctx.run(fn, *args, **kwargs)

    return in_context


def _fork_async(
    rt: Runtime, fn: Callable[..., Any], args: Any, kwargs: Any, parent: TaskFuture[Any] | None
) -> TaskFuture[Any]:
    host = rt.host
    assert host is not None
    if _loop.loop_key() is not host.key:
        raise DataflowError(
            f"fork({_fn_name(fn)}): an async function can only be forked from a coroutine on "
            "the runtime's event loop (not from a worker thread or another loop); fork a plain "
            "function there instead"
        )
    sched = rt._sched
    if sched.closed or sched.draining:  # as ops are refused: nobody would own the task
        raise DataflowError(
            f"fork({_fn_name(fn)}): this runtime is "
            + (
                "closed; start a new one"
                if sched.closed
                else "closing (its `async with` block ended and its forks have finished): "
                "fork from a task that outlives the block into a runtime that does, or end "
                "that task inside the block"
            )
        )
    fut: TaskFuture[Any] = TaskFuture(f"{_fn_name(fn)}#{_next_id()}", rt)
    coro = _run_forked(fut, fn, args, kwargs)
    if host.library == "asyncio":
        fut._handle = host.spawn(coro, fut.name)
        # Cancelled before it started, the coroutine never ran to settle its future.
        fut._handle.add_done_callback(functools.partial(_task_done, fut))
    else:  # (trio's bridge neither runs nor settles it then: ``unstarted`` does)
        fut._handle = host.spawn(coro, fut.name, functools.partial(fut._settle, _CANCELLED, None))
    if ACTIVE or sched.watching:
        fut._started = time.perf_counter_ns()
        sched.emit("fork", fut.name, parent.name if parent is not None else None)
    return fut


def _task_done(fut: TaskFuture[Any], task: asyncio.Task[Any]) -> None:
    if task.cancelled():  # cancelled before it started: the coroutine never settled it
        fut._settle(_CANCELLED, None)
    elif fut._state == _FAILED:
        # It raised KeyboardInterrupt or SystemExit (``_run_forked``), which the loop lets
        # through: retrieved here, so asyncio does not log it again when the task is freed.
        task.exception()


async def wait(fut: Future[T]) -> T:
    """Wait for a future (or pending value) without blocking a thread; return its value.

    Like ``torch.jit.wait``. Equivalent to ``await fut``: a forked ``async def`` task's pending
    outputs come back as arrays, except in model code (see :func:`model_code`); a forked plain
    function's value comes back as it returned it (a Tensor it made is still pending: await
    it too). A failed task's error is raised here, with the task named and the original
    exception chained.

    Raises:
        TypeError: ``fut`` is not a dataflow future.
    """
    if not isinstance(fut, Future):
        raise DataflowTypeError(_wait_misuse(fut))
    if fut.done():
        return await fut
    rt = current_runtime()
    sched = rt._sched if rt is not None else None
    if sched is None or not (ACTIVE or sched.watching):
        return await fut
    # A forked future has a name; a pending value is named by its task (``op#id``), as
    # everywhere else (its repr would freeze the state it had when the wait began).
    name = getattr(fut, "name", None)
    if not name:
        task = getattr(fut, "_t", None)
        name = task.name if isinstance(task, Task) else repr(fut)
    sched.emit("wait_started", name)
    start = time.perf_counter_ns()
    try:
        return await fut
    finally:
        sched.emit("wait_finished", name)
        sched.record_span("wait", name, start, time.perf_counter_ns(), None)


def _wait_misuse(obj: Any) -> str:
    """The message for ``wait(obj)`` on something that is not a dataflow future."""
    if inspect.iscoroutine(obj):
        name = obj.cr_code.co_name
        obj.close()  # silence "coroutine was never awaited"
        return (
            f"wait() got a coroutine object ({name}(...)): await {name}(...) directly, or fork "
            f"it to run in parallel and wait later: wait(fork({name}, ...))"
        )
    if isinstance(obj, list | tuple | set):
        return (
            f"wait() takes one future, got a {type(obj).__name__}: wait for them one at a time "
            "([await f for f in futures]), or await dataflow.materialize(futures)"
        )
    hint = (
        "an asyncio future or task: await it directly"
        if isinstance(obj, asyncio.Future)
        else "pass the future that fork() or an op returned"
    )
    return (
        f"wait() needs a dataflow Future (from fork() or an op), got "
        f"{type(obj).__name__}: {obj!r} ({hint})"
    )
