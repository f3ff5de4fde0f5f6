"""The user-facing API: fork, wait and run.

``fork`` mirrors ``torch.jit.fork``: it starts ``fn(*args, **kwargs)`` and returns a
:class:`~dataflow.Future` at once. An ``async def`` function (or a callable object whose
``__call__`` is one, such as an ``ops.nn.Module``) runs as a task on the event loop; a plain
function runs on an inter-op pool thread, after any pending values among its arguments are
ready, and receives their arrays.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar, overload

import structlog

from ._errors import CancelledTaskError, DataflowError, NotReadyError, TaskError, task_failed
from ._instrument import ACTIVE, emit
from ._logging import name_plain_fork
from ._runtime import DEFAULT_MAX_PENDING, Runtime, get_runtime, resolve_loop_factory
from ._task import Future, Pending, _next_id

__all__ = ["fork", "materialize", "run", "wait"]

T = TypeVar("T")

# The forked task running in the current context (None at the top level of a run).
_parent: contextvars.ContextVar[TaskFuture[Any] | None] = contextvars.ContextVar(
    "dataflow_parent_fork", default=None
)


class TaskFuture(Future[T]):
    """The future of a forked ``async def`` function: a handle on its ``asyncio.Task``."""

    __slots__ = ("_children", "_task", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._task: asyncio.Task[T] | None = None
        self._children: list[Future[Any]] = []

    def done(self) -> bool:
        return self._task is not None and self._task.done()

    def result(self) -> T:
        task = self._task
        if task is None or not task.done():
            raise NotReadyError(f"forked task {self.name} is still running: await it first")
        if task.cancelled():
            raise CancelledTaskError(f"forked task {self.name} was cancelled")
        exc = task.exception()
        if exc is not None:
            if isinstance(exc, TaskError):
                exc.observed = True
            raise exc
        return task.result()

    def exception(self) -> BaseException | None:
        try:
            self.result()
        except NotReadyError:
            raise
        except BaseException as exc:
            return exc
        return None

    def cancel(self) -> bool:
        return self._task is not None and self._task.cancel()

    def __await__(self) -> Generator[Any, None, T]:
        task = self._task
        assert task is not None
        if not task.done():
            try:
                # Awaiting the task itself: cancelling the waiter cancels the child too,
                # as a parent's cancellation should.
                yield from task.__await__()
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
                # The child was cancelled (not us): report it as an error, not as our cancel.
            except Exception:
                pass  # re-raised by result(), which also marks it observed
        return self.result()

    def __repr__(self) -> str:
        task = self._task
        if task is None or not task.done():
            state = "running"
        elif task.cancelled():
            state = "cancelled"
        elif task.exception() is not None:
            state = f"failed {type(task.exception()).__name__}"
        else:
            state = "done"
        return f"<Future {self.name} {state}>"


def _is_async_callable(fn: Any) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - want the type's, not the instance's
    return call is not None and not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


def _fn_name(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


async def _run_forked(
    fut: TaskFuture[T], fn: Callable[..., Awaitable[T]], args: Any, kwargs: Any
) -> T:
    _parent.set(fut)
    # Log lines inside the task carry its name; this context is the task's own copy.
    structlog.contextvars.bind_contextvars(dataflow_task=fut.name)
    try:
        return await fn(*args, **kwargs)
    except Exception as exc:
        raise task_failed(fut.name, _fn_name(fn), exc, what="forked task ") from exc
    finally:
        if ACTIVE:
            emit("fork_finished", fut.name)


def _on_parent_done(task: asyncio.Task[Any], children: list[Future[Any]]) -> None:
    if task.cancelled():
        for child in children:
            child.cancel()


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
    if inspect.iscoroutine(fn):
        name = fn.cr_code.co_name
        fn.close()  # silence "coroutine was never awaited"
        raise TypeError(
            f"fork() got a coroutine object ({name}(...)), not a function. Pass the function "
            f"and its arguments separately: you did something like fork({name}(x)), "
            f"you want fork({name}, x)."
        )
    if inspect.isawaitable(fn):
        raise TypeError(
            f"fork() got an awaitable ({type(fn).__name__}), not a function: await it "
            "directly, or fork the function that produces it: fork(fn, *args)"
        )
    if not callable(fn):
        raise TypeError(
            f"fork() needs a callable as its first argument, got {type(fn).__name__}: {fn!r}. "
            "Pass the function to run and its arguments: fork(fn, *args)"
        )
    rt = get_runtime("dataflow.fork()")
    parent = _parent.get()
    if _is_async_callable(fn):
        fut: Future[Any] = _fork_async(rt, fn, args, kwargs, parent)
    else:
        ctx = contextvars.copy_context()
        call, set_name = name_plain_fork(fn)  # binds the task's name for log lines
        task = rt.submit(call, args, kwargs or None, _fn_name(fn), inline=False, ctx=ctx)
        set_name(task.name)
        fut = Pending(task)
    if parent is not None:
        parent._children.append(fut)
    return fut


def _fork_async(
    rt: Runtime, fn: Callable[..., Any], args: Any, kwargs: Any, parent: TaskFuture[Any] | None
) -> TaskFuture[Any]:
    loop = rt.loop
    assert loop is not None
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not loop:
        raise DataflowError(
            f"fork({_fn_name(fn)}): an async function can only be forked from a coroutine on "
            "the runtime's event loop (not from a worker thread or another loop); fork a plain "
            "function there instead"
        )
    fut: TaskFuture[Any] = TaskFuture(f"{_fn_name(fn)}#{_next_id()}")
    task = loop.create_task(_run_forked(fut, fn, args, kwargs), name=fut.name)
    fut._task = task
    rt.track_fork(task)
    children = fut._children
    task.add_done_callback(lambda t: _on_parent_done(t, children))
    if ACTIVE:
        emit("fork", fut.name, parent.name if parent is not None else None)
    return fut


async def wait(fut: Future[T]) -> T:
    """Wait for a future (or pending value) without blocking a thread; return its value.

    Like ``torch.jit.wait``. Equivalent to ``await fut``. A failed task's error is raised here,
    with the task named and the original exception chained.

    Raises:
        TypeError: ``fut`` is not a dataflow future.
    """
    if not isinstance(fut, Future):
        raise TypeError(_wait_misuse(fut))
    if fut.done() or not ACTIVE:
        return await fut
    name = getattr(fut, "name", None) or repr(fut)
    emit("wait_started", name)
    try:
        return await fut
    finally:
        emit("wait_finished", name)


def _wait_misuse(obj: Any) -> str:
    """The message for ``wait(obj)`` on something that is not a dataflow future."""
    if inspect.iscoroutine(obj):
        name = obj.cr_code.co_name
        obj.close()  # silence "coroutine was never awaited"
        return (
            f"wait() got a coroutine object ({name}(...)): await {name}(...) directly, or fork "
            f"it to run in parallel and wait later: wait(fork({name}, ...))"
        )
    if isinstance(obj, (list, tuple, set)):
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


async def materialize(value: Any) -> Any:
    """Await every pending value inside ``value`` (nested tuples, lists and dicts)."""
    if isinstance(value, Future):
        return await materialize(await value)
    t = type(value)
    if t is list:
        return [await materialize(v) for v in value]
    if isinstance(value, tuple):
        items = [await materialize(v) for v in value]
        return t(*items) if hasattr(value, "_fields") else t(items)
    if t is dict:
        return {k: await materialize(v) for k, v in value.items()}
    return value


def run(
    main: Callable[..., Awaitable[T]],
    /,
    *args: Any,
    interop_threads: int | None = None,
    intraop_threads: int | None = None,
    loop: str = "auto",
    backend: str | None = None,
    address: str | None = None,
    max_pending: int | None = DEFAULT_MAX_PENDING,
    op_timeout: float | None = None,
) -> T:
    """Run ``main(*args)`` in a new runtime on a new event loop and return its value.

    Like ``asyncio.run``; uses uvloop where installed (``loop="asyncio"`` to opt out). Pending
    values in the result (also inside tuples, lists and dicts) are awaited, so the caller gets
    arrays. Forked tasks nobody waited for still run to the end before ``run`` returns.

    Args:
        main: an ``async def`` function (not a coroutine object).
        interop_threads: inter-op pool size (default :func:`get_num_interop_threads`).
        intraop_threads: BLAS threads per op while running (default: unchanged).
        loop: "auto", "asyncio" or "uvloop".
        backend: "local" or "dask" (see :class:`Runtime`; default: "dask" when ``address``
            is given or ``$DATAFLOW_DASK_ADDRESS`` is set, else "local").
        address: the Dask scheduler's address, e.g. ``"tcp://host:8786"`` (docs/dask.md).
        max_pending, op_timeout: backpressure limit and default op timeout (see
            :class:`Runtime` and docs/hardening.md).

    Raises:
        TypeError: ``main`` is a coroutine object or not callable.
        DataflowError: called from a running event loop (use :class:`Runtime` there).
    """
    if inspect.iscoroutine(main):
        name = main.cr_code.co_name
        main.close()
        raise TypeError(
            f"dataflow.run() got a coroutine object; you did something like "
            f"dataflow.run({name}(...)), you want dataflow.run({name}, ...)"
        )
    if not callable(main):
        raise TypeError(
            f"dataflow.run() needs an async function, got {type(main).__name__}: pass the "
            "function and its arguments, dataflow.run(main, *args)"
        )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise DataflowError(
            "dataflow.run() cannot be called from a running event loop (it would block it). "
            "Inside async code use `async with dataflow.Runtime(): ...` and await your function."
        )
    factory = resolve_loop_factory(loop)
    # Passed only when set, so a backend without them (Dask) is not handed unknown options.
    limits: dict[str, Any] = {}
    if max_pending != DEFAULT_MAX_PENDING:
        limits["max_pending"] = max_pending
    if op_timeout is not None:
        limits["op_timeout"] = op_timeout
    runtime = Runtime(
        interop_threads=interop_threads,
        intraop_threads=intraop_threads,
        backend=backend,
        address=address,
        **limits,
    )

    async def _main() -> T:
        async with runtime:
            coro = main(*args)
            if not inspect.isawaitable(coro):
                raise TypeError(
                    f"dataflow.run(): {_fn_name(main)} returned {type(coro).__name__}, not a "
                    "coroutine: declare it `async def` (a plain function can be forked, or "
                    "called directly)"
                )
            result = await coro
            return await materialize(result)  # type: ignore[no-any-return]

    runner = asyncio.Runner(loop_factory=factory)
    stuck = False
    try:
        return runner.run(_main())
    except KeyboardInterrupt:
        # A second Ctrl-C, while the first one's clean-up waits for a kernel that does not
        # return: leave now (docs/hardening.md); the stuck loop is left unclosed.
        stuck = any(not t.done() for t in asyncio.all_tasks(runner.get_loop()))
        raise
    finally:
        if not stuck:
            runner.close()
