"""Waiting: what the loop does when it awaits a task (a small queued one it runs itself, and
the queued ancestors of one that waits for inputs), the small work workers hand back to it,
and joining (:mod:`dataflow._scheduler`, "Small work runs where it is needed").
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .._errors import DataflowError
from .._pool import GRAPH_LOCK
from .._signature import Signature
from .._task import (
    DONE,
    PENDING,
    READY,
    Task,
)
from .._timeout import TimedKernel
from ._execution import Execution
from ._placement import HELP_WALK, MIN_MEASURED, leave_to_pool, runs_inline

__all__ = ["Awaiting"]


class Awaiting(Execution):
    """The waiting layer of :class:`~dataflow._scheduler.Scheduler`."""

    def hand_back_locked(self, task: Task) -> bool:
        """A worker made the small READY ``task`` ready while the loop dispatches work that
        waits (``_place_ready_locked``): leave it to the loop, which runs it at its next such
        dispatch or in a drain posted now. False (the worker goes on with it) if the loop is
        closed. Holds the lock."""
        if not self._drain_posted:
            try:
                self.host.later(self.drain)
            except RuntimeError:  # the loop is closed
                return False
            self._drain_posted = True
        self._handback.append(task)
        return True

    def drain(self) -> None:
        """Run, on the loop's thread, the small tasks workers handed back to it, and the
        tiny ones they make ready (the others are queued)."""
        while True:
            with GRAPH_LOCK:
                tasks = self._handback
                if not tasks:
                    self._drain_posted = False
                    return
                self._handback = []
            try:
                for t in tasks:
                    if self._take(t):
                        self.execute(t, go_on=False, small_here=True)
            except BaseException:  # the process is being stopped here (``stops_here``)
                with GRAPH_LOCK:  # what is left goes to the pool: nothing is lost
                    for t in (*tasks, *self._handback):
                        if t.state == READY:
                            self.pool.push_locked(t)  # type: ignore[union-attr]
                    self._handback = []
                    self._drain_posted = False
                raise

    def _post_wake(self) -> None:
        """Wake workers for the quietly queued tasks once the loop's current callback ends."""
        try:
            self.host.later(self._wake)
        except RuntimeError:  # the loop is closed: wake them now
            self._wake()

    def _wake(self) -> None:
        pool = self.pool
        with GRAPH_LOCK:
            self._wake_posted = False
            if pool is not None:
                pool.wake_locked()

    def completion(self, task: Task) -> Any:
        """An awaitable that completes when ``task`` is done (``await handle``).

        A small task that is queued and not started is run right here instead (see
        ``dataflow._scheduler``).
        """
        host = self.host
        if threading.get_ident() != host.thread_id:
            raise DataflowError(
                f"{task.name} belongs to a runtime on another event loop; await it there "
                "(pending values cannot move between event loops or threads)"
            )
        if self.pool is not None and self._inline_ok:
            if self._wake_posted and self.pool.queued > 1:
                # The loop stops dispatching to wait: the workers need not wait for its
                # callback to end. One queued task is left to the loop (it may run it).
                with GRAPH_LOCK:
                    self.pool.wake_locked(spare=1)
            # Helping (running ancestors) only while one request at most has deferred work:
            # in a server the loop helping one request delays all the others (loop lag
            # max 159 ms at 32 clients against 21 ms without it: benchmarks.serving).
            spent = self._help(task) if task.state == PENDING and len(self._owners) <= 1 else 0.0
            if (
                task.state == READY
                and type(task.fn) is not TimedKernel
                and self._runs_here(task.sig, spent)
                and self._take(task)
            ):
                task.sig.awaited += 1
                self._run_taken(task)
        return self.waiter(task)

    def _runs_here(self, sig: Signature, spent: float) -> bool:
        """Whether the loop, awaiting, runs a queued task of ``sig`` itself, having run
        ``spent`` seconds of others for this await already: small or GIL-bound-and-short
        as at dispatch, or short enough to hold the loop for (it would only wait here
        meanwhile), within AWAIT_HERE_SECONDS for the whole await; not a GIL-free one while
        the pool has other work (``_placement.leave_to_pool``)."""
        inline = sig.inline
        if inline is not None:
            return inline
        seconds = sig.seconds
        pool = self.pool
        if pool is not None and leave_to_pool(sig, pool, self.running):
            return False
        return spent + seconds < self.await_here or (
            not spent and runs_inline(sig, self.inline_threshold)
        )

    def _run_taken(self, task: Task) -> None:
        """Run ``task``, which this thread (the loop, awaiting) took, counting it in
        ``loop_kernels`` if it is long enough to be measured: the pool's runs beside it
        share the cores with it, so their CPU share says nothing of the GIL then
        (``Execution._measured``)."""
        if task.sig.seconds < MIN_MEASURED:
            self.execute(task, go_on=False)
            return
        self.loop_kernels += 1
        try:
            self.execute(task, go_on=False)
        finally:
            self.loop_kernels += 1

    def _take(self, task: Task) -> bool:
        """Start a READY task on this thread (a GIL-bound one through the GIL lane)."""
        with GRAPH_LOCK:
            if task.state != READY:
                return False
            if task.sig.serial and task.sig.inline is None:
                return self.start_locked(task, self.pool)  # type: ignore[arg-type]
            self.begin_locked(task)
            return True

    def _help(self, task: Task) -> float:
        """The loop awaits ``task``, which waits for its inputs: run the queued, not yet
        started tasks it waits for (its ancestors; the first issued first) here while they
        fit in AWAIT_HERE_SECONDS together, rather than wait for a worker to start them.

        Code that awaits each module's output as it goes (``await lstm(x)`` at the top
        level, whose directions and their concatenation are dispatched and then awaited at
        once) otherwise waited for a worker woken for small GIL-bound kernels, which then
        ran them one after the other on that worker while the loop idled: never side by
        side, so never measured GIL-bound either, and 2.3x numpy's time at (10, 1, 32).
        Only while at most one request (a task on the loop: the program, or one server
        request) has deferred work in flight (``completion``).

        Returns the seconds (as estimated) of the tasks it ran.
        """
        spent = 0.0
        self.helping = True
        try:
            while task.state == PENDING:
                found = self._ready_ancestor(task)
                # Nothing else running or queued: a chain, which the loop runs whole. It counts
                # as awaited at once (``submit`` then runs its ops inline, as they come).
                alone = self.running == 0 and self.pool.queued <= 1  # type: ignore[union-attr]
                if found is None or not self._runs_here(found.sig, spent) or not self._take(found):
                    break
                if alone:
                    found.sig.awaited += 1
                spent += found.sig.seconds
                self._run_taken(found)
        finally:
            self.helping = False
            if self.help_queued:  # a worker, once this callback ends, for what it left queued
                self.help_queued = False
                with GRAPH_LOCK:
                    post = not self._wake_posted
                    self._wake_posted = True
                    self._quiet_since = time.perf_counter_ns()
                if post:
                    self._post_wake()
        return spent

    def _ready_ancestor(self, task: Task) -> Task | None:
        """The first issued of the queued (READY) tasks of this runtime that ``task`` waits
        for, directly or through pending ones (a bounded walk: HELP_WALK pending tasks)."""
        best: Task | None = None
        stack = list(task.inputs)
        seen: set[int] = set()
        rt = self.rt
        while stack:
            t = stack.pop()
            state = t.state
            if state == READY:
                if (
                    t.runtime is rt
                    and type(t.fn) is not TimedKernel
                    and (best is None or t.priority < best.priority)
                ):
                    best = t
            elif state == PENDING and id(t) not in seen:
                if len(seen) >= HELP_WALK:
                    break
                seen.add(id(t))
                stack.extend(t.inputs)
        return best

    def waiter(self, task: Task) -> Any:
        """An awaitable that completes when ``task`` is done (nothing is run to help)."""
        host = self.host
        if task.state >= DONE:
            return host.done_waiter()
        waiter = host.waiter()
        with GRAPH_LOCK:
            if task.state >= DONE:
                return host.done_waiter()
            if task.waiters is None:
                task.waiters = [waiter]
            else:
                task.waiters.append(waiter)
        return waiter

    async def join(self) -> None:
        """Wait until every task submitted here has finished."""
        while True:
            with GRAPH_LOCK:
                if self.inflight == 0:
                    return
                waiter = self._drained = self.host.waiter()
            await waiter
