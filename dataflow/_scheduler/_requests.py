"""Requests: the work a coroutine on the loop dispatched belongs to it (its age orders the
ready queue), and is dropped when it is cancelled unless someone else still wants it
(:mod:`dataflow._scheduler`, "Ready order, and requests" and "Work belongs to whoever still
wants it").
"""

from __future__ import annotations

import functools
import sys
import threading
import traceback
import types
import weakref
from typing import TYPE_CHECKING, Any

from .._errors import (
    CancelledTaskError,
)
from .._pool import GRAPH_LOCK
from .._task import (
    DONE,
    READY,
    RUNNING,
    Task,
    _next_id,
)

if TYPE_CHECKING:
    pass
from ._base import SchedulerBase

__all__ = ["AGING_TASKS", "Requests", "handles_held"]

#: How far, in tasks dispatched since, a request's age orders the ready queue: a task takes
#: the later of its request's start and its own id less this. So the oldest request's work
#: goes first (a burst of new requests cannot starve it), but a request that streams work
#: for good (a long job, another runtime's whole `dataflow.run` on the shared pool) no longer
#: starves a newer one either: once it has dispatched this many tasks more, the newer
#: request's work goes before what it dispatches next.
AGING_TASKS = 4096


def _done(waiter: Any) -> bool:
    done = getattr(waiter, "done", None)
    return bool(done()) if done is not None else False


class _Owner:
    """What one request (a task on the event loop) dispatched and has not started yet, in
    dispatch order: the tasks a cancellation may drop.

    A task is added when it is dispatched (``add``, under the lock) and leaves when it
    starts (``SchedulerBase.begin_locked``) or gets its value without starting
    (``Execution.finish_outside_locked``), so a task that ran, and its value, is freed as
    usual while the request goes on. Tasks that failed unstarted (shells without arguments)
    are forgotten at the next pruning. A dict by task id rather than weak references: a weak
    reference per dispatched task was one more object for the garbage collector to track
    (its passes over pending tasks were a quarter of an offloaded op's dispatch), and a
    pending task is held by the graph until it starts anyway.
    """

    __slots__ = ("base", "dropped", "exc", "interrupted", "limit", "live")

    def __init__(self, base: float) -> None:
        self.base = base
        self.live: dict[int, Task] = {}
        self.limit = 1024
        self.dropped = False
        # The windows of task ids a cancellation that reached one of its awaits may drop
        # (see Requests.await_interrupted): from the first unfinished task the await waited
        # for, to the last the request had dispatched then. Work outside them (a fork fired
        # and forgotten before the scope, or after it) is the request's own as usual. And
        # that cancellation, until the drop it posted runs (Requests.drop_unwanted).
        self.interrupted: list[tuple[int, int]] = []
        self.exc: BaseException | None = None

    def add(self, task: Task) -> None:
        """``task`` was dispatched for this request. Holds the lock."""
        task.owner = self
        live = self.live
        live[task.id] = task
        if len(live) > self.limit:  # forget the ones that failed unstarted now and then
            # (a task sent to a cluster is RUNNING until it ends there: kept)
            self.live = live = {i: t for i, t in live.items() if t.state < DONE}
            self.limit = max(1024, 2 * len(live))

    def tasks(self) -> list[Task]:
        """The tasks not started yet, in dispatch order (a few that failed may remain)."""
        return list(self.live.values())


def _references(task: Any) -> Any:
    """The reference counts of ``task.handles`` (one handle, or each of a list of them), as
    ``sys.getrefcount`` sees them from here: the task's own reference included."""
    handles = task.handles
    if type(handles) is list:
        return [sys.getrefcount(h) for h in handles]
    return sys.getrefcount(handles)


class _Holder:
    __slots__ = ("handles",)
    handles: Any


def _alone() -> tuple[int, int]:
    """What :func:`_references` reads for handles only their task holds (one, and one of a
    list): measured once here, through the same code, so the counts stay right whatever the
    interpreter's own references to an argument are."""
    holder = _Holder()
    holder.handles = _Holder()
    one = _references(holder)
    holder.handles = [_Holder()]
    in_list = _references(holder)[0]
    return one, in_list


_ALONE, _ALONE_IN_LIST = _alone()


def handles_held(task: Task) -> bool:
    """Whether anyone but ``task`` itself holds a handle on it (a variable, a container,
    another task's arguments, a frame).

    An unstarted deferred task keeps its handles strongly (``task.handles``, cleared when it
    ends: see ``Op.__call__``), so whether someone else still wants its value is whether a
    handle has more references than the task's own: a weak reference per op was one more
    object for the garbage collector to track. A forked function's future and a folded
    stack's handle are still held weakly (a ``weakref.ref``: alive or not).
    """
    handles = task.handles
    if type(handles) is weakref.ref:
        return handles() is not None
    del handles  # (a reference of its own would count)
    counts = _references(task)
    if type(counts) is list:
        return any(c > _ALONE_IN_LIST for c in counts)
    return bool(counts > _ALONE)


def _first_unfinished(task: Task) -> int:
    """The smallest id among ``task`` and the unfinished tasks it waits for, however
    indirectly: where the work an await waited for began. Holds the lock."""
    low = task.id
    todo = [task]
    seen = {id(task)}
    while todo:
        for t in todo.pop().inputs:
            if t.state < DONE and id(t) not in seen:
                seen.add(id(t))
                todo.append(t)
                low = min(low, t.id)
    return low


def _release_frames(tb: types.TracebackType | None, root: Any) -> None:
    """Clear the variables of the frames of ``tb``, a cancellation's traceback, in a
    request that has finished, whose coroutine's code is ``root``: every frame but the first
    (the exception left each of them), and the first too when it is the request's own
    coroutine (it left the request; otherwise the first caught it: the loop's own frame, or
    one that may live on, such as an async generator's)."""
    if tb is not None and tb.tb_frame.f_code is not root:
        tb = tb.tb_next
    traceback.clear_frames(tb)


class Requests(SchedulerBase):
    """The request layer of :class:`~dataflow._scheduler.Scheduler`."""

    def _owner(self) -> _Owner | None:
        """The record of the request running on the loop (made on its first deferred task)."""
        current = self._current_task()
        if current is None:
            return None
        owner = self._owners.get(current)
        if owner is None:
            owner = self._owners[current] = _Owner(float(_next_id()))
            self.host.on_task_done(current, self._owner_done)
        return owner

    def request(self) -> _Owner | None:
        """The record of the request running on the loop, when called on the loop's thread
        (None elsewhere, or between tasks)."""
        return self._owner() if threading.get_ident() == self.host.thread_id else None

    def _owner_done(self, current: Any, cancelled: bool) -> None:
        owner = self._owners.pop(current, None)
        if owner is None:
            return
        if cancelled:
            # The cancelled coroutine's frames live on in its CancelledError's traceback,
            # holding its local variables (handles it never passed on). Release them, so a
            # handle still alive is one that someone else holds.
            self.host.release_frames(current)
            self.drop(owner)
        elif owner.interrupted:  # a caught cancellation left work behind (await_interrupted)
            self.drop_unwanted(owner, owner.interrupted)

    def await_interrupted(self, exc: BaseException | None = None, task: Task | None = None) -> None:
        """A coroutine on the loop stopped awaiting a pending value: a cancellation reached
        the await, and may be caught above it, the request going on (``asyncio.timeout``,
        ``asyncio.wait_for`` from Python 3.12, which no longer runs its awaitable in a task of
        its own, anyio's and trio's cancel scopes).

        The ops it dispatched inside the cancelled scope are then wanted by nobody once the
        scope's frames unwind, but the request did not end cancelled, so :meth:`drop` never
        ran for them: they ran to the end for nothing. Once the loop's current step is over
        (the frames are gone by then), and again when the request ends, drop what the request
        dispatched that nobody holds, awaits or reads any more (:meth:`drop_locked_tasks`).
        The request is not marked dropped: it may go on and dispatch more.

        The scope's start is not known, so the drop is bounded by what the await shows: from
        the first unfinished task that ``task`` (the awaited one; without it, any) waits for,
        itself included, up to the last task the request had dispatched. Work the request
        fired and forgot before that (a fork whose future it dropped) or after the await is
        its own, as in a request that no cancellation reached: it runs, and its failure is
        reported.

        ``exc``, the cancellation, is kept until that drop: if it ended the request, the
        frames it went through are released there. Their variables would otherwise keep
        the request's handles alive wherever the cancellation itself is kept: asyncio's
        ``gather`` and anyio's task groups (on asyncio and on trio) take a cancelled
        task's CancelledError before the request's end is reported (``release_frames``
        then finds it gone), and hold it in their future or in a reference cycle, so the
        work of a request they cancelled was never dropped.
        """
        if threading.get_ident() != self.host.thread_id:
            return  # (a coroutine closed elsewhere, by the garbage collector)
        current = self.host.current_task()
        owner = self._owners.get(current) if current is not None else None
        if owner is None or owner.dropped:
            return
        with GRAPH_LOCK:  # (_next_id(): above the id of every task dispatched so far)
            window = (0 if task is None else _first_unfinished(task), _next_id())
        windows = owner.interrupted
        windows.append(window)
        if len(windows) > 16:  # a long-lived request that catches many: one wider window
            windows[:] = [(min(w[0] for w in windows), window[1])]
        owner.exc = exc
        try:
            self.host.later(functools.partial(self.drop_unwanted, owner, [window], current))
        except RuntimeError:
            # A closed loop refuses the callback: the request's end (if any) drops instead.
            # (Raising here would replace the cancellation this await is passing on.)
            owner.exc = None

    def drop_unwanted(
        self, owner: _Owner, windows: list[tuple[int, int]], task: Any = None
    ) -> None:
        """Drop the request's unstarted tasks with ids in ``windows`` that nobody wants any
        more; first, if the request (``task``) has ended, release the frames the
        cancellation that interrupted one of its awaits went through
        (``await_interrupted``)."""
        exc, owner.exc = owner.exc, None
        if exc is not None and task is not None:
            code = self.host.finished_code(task)
            if code is not None:
                _release_frames(exc.__traceback__, code)
        del exc
        with GRAPH_LOCK:
            self.drop_locked_tasks(
                [t for t in owner.tasks() if any(low <= t.id < high for low, high in windows)]
            )

    def drop(self, owner: _Owner) -> int:
        """A request was cancelled: drop what it dispatched that nobody else needs.

        Goes backwards through its tasks (dependents come after what they read), so a task
        whose only dependents were dropped is dropped too. Returns how many were dropped.
        """
        with GRAPH_LOCK:
            owner.dropped = True
            dropped = self.drop_locked_tasks(owner.tasks())
            owner.live = {}
        return dropped

    def drop_locked_tasks(
        self,
        tasks: list[Task],
        why: str = "the request that dispatched it was cancelled and nothing else was waiting "
        "for its value",
    ) -> int:
        """Drop the tasks of ``tasks`` that have not started and that nobody else needs,
        last first (see :meth:`drop`); ``why`` goes into their CancelledTaskError. A task
        sent to a cluster (RUNNING here until it ends there) goes to the backend's
        ``drop_sent``, which cancels it there. Holds the lock; returns how many were
        dropped."""
        dropped = 0
        for t in reversed(tasks):
            state = t.state
            sched = t.runtime._sched  # type: ignore[union-attr]
            if state > READY and (state != RUNNING or sched.drop_sent is None):
                continue  # started (RUNNING: maybe sent to a cluster, which may drop it)
            waiters = t.waiters
            if waiters and any(not _done(w) for w in waiters):
                continue  # a live coroutine awaits it
            if t.handles is not None and handles_held(t):
                continue  # someone holds a handle on it
            deps = t.dependents
            if deps and any(d.state < DONE for d in deps):
                continue  # someone else's unfinished task reads it
            err = CancelledTaskError(f"{t.name} was dropped unrun: {why}")
            if state <= READY:
                sched._fail_locked(t, err)
            elif not sched.drop_sent(t, err):  # type: ignore[misc]  # (RUNNING: not None)
                continue  # not a task sent to a cluster, or it ended there
            dropped += 1
        if dropped:
            self.dropped += dropped
        return dropped
