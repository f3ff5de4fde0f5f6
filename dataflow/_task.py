"""Tasks and the handles user code holds on them.

A :class:`Task` is one node of the dataflow graph: an op's kernel or a forked plain function,
with the tasks it waits for and the tasks waiting for it. Its state only moves forward::

    PENDING (inputs not ready) -> READY (queued) -> RUNNING -> DONE | FAILED
    PENDING | READY -> CANCELLED

Every transition after creation happens under the pool's lock (see ``_runtime``), so a task
can be completed on any thread: a worker that finishes a kernel marks its dependents ready and
picks the next one itself, with no round trip through the event loop.

:class:`Future` is the public handle type. :class:`Pending` is the handle on a graph task
(``ops.Tensor`` derives from it); ``fork`` of an ``async def`` function returns a future over
an ``asyncio.Task`` (in ``_api``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

from ._errors import CancelledTaskError, NotReadyError, TaskError

if TYPE_CHECKING:
    import contextvars
    from collections.abc import Callable

    from ._runtime import Runtime

__all__ = ["Cost", "Future", "Pending", "Task"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

PENDING, READY, RUNNING, DONE, FAILED, CANCELLED = range(6)
STATE_NAMES = ("pending", "ready", "running", "done", "failed", "cancelled")

# itertools.count.__next__ is atomic under the GIL, so ids are unique across threads.
_next_id = itertools.count(1).__next__


class Cost(NamedTuple):
    """An op's cost estimate, from its cost rule: floating-point operations and bytes touched."""

    flops: float = 0.0
    bytes: float = 0.0


class Task:
    """One node of the dataflow graph. Read-only for instruments; owned by the runtime."""

    __slots__ = (
        "args",
        "cost",
        "ctx",
        "dependents",
        "error",
        "est",
        "fn",
        "height",
        "id",
        "inputs",
        "kwargs",
        "op",
        "priority",
        "runtime",
        "spec",
        "state",
        "value",
        "waiters",
        "waiting",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        op: str,
        runtime: Runtime | None,
        spec: Any = None,
        cost: Cost | None = None,
        ctx: contextvars.Context | None = None,
    ) -> None:
        self.id: int = _next_id()
        self.fn: Callable[..., Any] | None = fn
        self.args: tuple[Any, ...] | None = args
        self.kwargs: dict[str, Any] | None = kwargs
        self.op = op
        self.runtime = runtime
        self.spec = spec
        self.cost = cost
        self.ctx = ctx
        self.state = PENDING
        self.value: Any = None
        self.error: BaseException | None = None
        # Tasks whose value this one reads (released once it ran, so values can be freed).
        self.inputs: tuple[Task, ...] = ()
        self.dependents: list[Task] | None = None
        self.waiters: list[asyncio.Future[None]] | None = None
        self.waiting = 0
        # Among ready tasks, the largest height (estimated longest path from this task's start
        # to the end of the graph known so far) runs first, then the smallest priority (issue
        # order by default; graph runs set their own).
        self.priority: float = self.id
        self.est = 0.0
        self.height = 0.0

    @property
    def name(self) -> str:
        """``op#id``: how errors, traces and logs name the task (built only when asked)."""
        return f"{self.op}#{self.id}"

    def __repr__(self) -> str:
        return f"<Task {self.name} {STATE_NAMES[self.state]}>"

    def raise_error(self) -> None:
        """Raise the failure of a FAILED or CANCELLED task, marking it observed."""
        err = self.error
        if isinstance(err, TaskError):
            err.observed = True
        if err is None:
            err = CancelledTaskError(f"{self.name} was cancelled before it ran")
        raise err


class Future(Generic[T_co]):
    """The result of :func:`dataflow.fork` (and the base of every pending value).

    Await it (``await fut`` or ``await dataflow.wait(fut)``) for its value. ``done()``,
    ``result()``, ``exception()`` and ``cancel()`` behave like ``asyncio.Future``'s, except that
    ``result()`` on a future that is not done raises :class:`~dataflow.NotReadyError` with advice.
    """

    __slots__ = ()

    def done(self) -> bool:
        """Whether the value (or an error) is available."""
        raise NotImplementedError

    def result(self) -> T_co:
        """The value; raises the task's error, or NotReadyError when not done yet."""
        raise NotImplementedError

    def exception(self) -> BaseException | None:
        """The task's error (None if it succeeded); NotReadyError when not done yet."""
        raise NotImplementedError

    def cancel(self) -> bool:
        """Cancel the task if it has not finished; returns whether it was cancelled."""
        raise NotImplementedError

    def __await__(self) -> Generator[Any, None, T_co]:
        raise NotImplementedError


class Pending(Future[T]):
    """A handle on a graph task's value (one output of it when the op has several).

    Ops return these at once; the kernel runs when its inputs are ready. ``ops.Tensor`` derives
    from this class and adds ``shape`` and ``dtype``. Awaiting a handle never blocks a thread:
    if the value is ready it is returned without suspending, otherwise the awaiting coroutine
    is woken when the task completes.
    """

    __slots__ = ("_index", "_task")

    def __init__(self, task: Task, index: int | None = None) -> None:
        self._task = task
        self._index = index

    @property
    def task(self) -> Task:
        """The graph task that computes this value."""
        return self._task

    def done(self) -> bool:
        return self._task.state >= DONE

    def result(self) -> T:
        task = self._task
        if task.state == DONE:
            value = task.value
            return value if self._index is None else value[self._index]  # type: ignore[no-any-return]
        if task.state > DONE:
            task.raise_error()
        raise NotReadyError(
            f"{task.name} is still {STATE_NAMES[task.state]}: `await` it (or dataflow.wait) "
            "to get its value without blocking the event loop"
        )

    def exception(self) -> BaseException | None:
        task = self._task
        if task.state == DONE:
            return None
        if task.state > DONE:
            try:
                task.raise_error()
            except BaseException as exc:
                return exc
        raise NotReadyError(f"{task.name} is still {STATE_NAMES[task.state]}: await it first")

    def cancel(self) -> bool:
        rt = self._task.runtime
        return rt is not None and rt.cancel_task(self._task)

    def __await__(self) -> Generator[Any, None, T]:
        task = self._task
        if task.state < DONE:
            # Only a runtime's tasks can be unfinished (eager tasks complete at creation).
            assert task.runtime is not None
            yield from task.runtime.completion(task).__await__()
        return self.result()

    def __repr__(self) -> str:
        task = self._task
        out = "" if self._index is None else f"[{self._index}]"
        return f"<{type(self).__name__} {task.name}{out} {STATE_NAMES[task.state]}>"
