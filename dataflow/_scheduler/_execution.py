"""Running tasks: kernels on this thread (timed, sampled, GIL-measured), publishing their
values, and placing what they made ready: on this thread next, or queued for the pool
(:mod:`dataflow._scheduler`, "Small work runs where it is needed" and "The GIL lane").
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _graphstate as gs
from .._args import resolve, resolve_kwargs
from .._errors import (
    CancelledTaskError,
    task_failed,
)
from .._instrument import ACTIVE
from .._pool import GRAPH_LOCK, InteropPool, current_pool
from .._protect import thaw
from .._signature import Signature
from .._task import (
    READY,
    RUNNING,
    Task,
)
from .._threads import _cores
from .._timeout import TimedKernel
from ._base import stops_here
from ._placement import (
    FIRST_RUNS,
    HANDBACK_SECONDS,
    MEASURE_POOL_ABOVE,
    MIN_MEASURED,
    PARALLEL_CORES,
    PARALLEL_OTHERS,
    PROBE,
    SAMPLE,
    WARM_UP,
    dispatcher_overlap,
    note_overlap,
    note_seconds,
    runs_inline,
)

if TYPE_CHECKING:
    pass
from ._requests import Requests

__all__ = ["Execution", "running_task"]

_thread_time = time.thread_time
_process_time = time.process_time
_now_ns = time.perf_counter_ns
HANDBACK_NS = int(HANDBACK_SECONDS * 1e9)
# The cores this process may run on (the CPU affinity), for the GIL measurement.
_CORES = _cores()


def _no_switches() -> int:  # pragma: no cover - where the OS keeps no per-thread count
    return -1


try:
    from resource import RUSAGE_THREAD, getrusage  # Linux

    def _switches() -> int:
        """The calling thread's voluntary context switches so far (it blocked: a wait for
        the GIL, a lock, I/O), or -1 where the OS does not count them per thread."""
        return getrusage(RUSAGE_THREAD).ru_nvcsw

except ImportError:  # pragma: no cover - not on Linux
    _switches = _no_switches


# The task whose kernel the thread is running (off the dispatching thread's inline path).
_running = threading.local()


def running_task() -> Task | None:
    """The task whose kernel the calling thread is running on the pool (or None).

    Inline kernels (run at dispatch) are not recorded: that is the hot path.
    """
    return getattr(_running, "task", None)


class Execution(Requests):
    """The execution layer of :class:`~dataflow._scheduler.Scheduler`."""

    def _call(self, task: Task, pool_run: bool = False) -> Any:
        """Run ``task``'s kernel on this thread and return its value (sampling its time).

        ``pool_run``: it runs on a pool thread, so a sampled run also measures whether the
        kernel holds the GIL (``dataflow._scheduler``, "the GIL lane").
        """
        fn = task.fn
        assert fn is not None
        if task.inputs:
            args = resolve(task.args)  # type: ignore[arg-type]
            kwargs = resolve_kwargs(task.kwargs) if task.kwargs else None
        else:
            args = task.args  # type: ignore[assignment]
            kwargs = task.kwargs
        if self.simulate is not None:
            return self.simulate(task)
        sig = task.sig
        n = sig.calls = sig.calls + 1
        if (
            pool_run
            and sig.seconds >= MEASURE_POOL_ABOVE
            and sig.measure
            and not sig.runner
            and self.pool is not None
        ):
            value = self._measured(sig, fn, args, kwargs)
        elif n > FIRST_RUNS and n % SAMPLE:
            value = fn(*args, **kwargs) if kwargs else fn(*args)
        else:
            value = self._timed(sig, fn, args, kwargs)
        if sig.check is not None:
            sig.check_value(value)
        return value

    @staticmethod
    def _timed(
        sig: Signature, fn: Callable[..., Any], args: Any, kwargs: dict[str, Any] | None
    ) -> Any:
        """``fn(*args, **kwargs)``, its time folded into ``sig.seconds`` (running average)."""
        t0 = time.perf_counter()
        value = fn(*args, **kwargs) if kwargs else fn(*args)
        note_seconds(sig, time.perf_counter() - t0)
        return value

    def _measured(
        self, sig: Signature, fn: Callable[..., Any], args: Any, kwargs: dict[str, Any] | None
    ) -> Any:
        """``_timed`` on a pool thread, also measuring how much other pool work overlapped
        the run (the pool's busy integral): see :func:`note_overlap`."""
        pool = self.pool
        assert pool is not None
        # The thread's CPU time too (a system call, ~0.4 us), for kernels long enough that it
        # says something (``note_overlap``), and the process's (a system call over its
        # threads, ~1 us) where three or more kernels can run side by side on as many cores,
        # or where a lone worker's only company is the dispatching thread; with three or
        # more, also whether the thread blocked in the run (its voluntary context switches,
        # ~0.4 us: a wait for the GIL blocks, a thread starved of cores does not).
        cpu = sig.seconds >= MIN_MEASURED
        lone = cpu and pool.num_threads == 1
        many = cpu and _CORES >= PARALLEL_CORES and pool.num_threads > PARALLEL_OTHERS
        with GRAPH_LOCK:
            i0 = pool.measure_begin_locked()
        loop0 = self.loop_kernels
        v0 = _switches() if many else 0
        c0 = _thread_time() if cpu else 0.0
        p0 = _process_time() if many or lone else 0.0
        t0 = time.perf_counter()
        value = fn(*args, **kwargs) if kwargs else fn(*args)
        t1 = time.perf_counter()
        p1 = _process_time() if many or lone else 0.0
        c1 = _thread_time() if cpu else 0.0
        v1 = _switches() if many else 0
        with GRAPH_LOCK:
            i1 = pool.measure_end_locked()
        loop1 = self.loop_kernels
        wall = t1 - t0
        note_seconds(sig, wall)
        if sig.runs > WARM_UP:  # the first runs pay first-call costs
            others = (i1 - i0) / wall - 1.0
            if lone:
                # No other kernel beside a lone worker, but the dispatching thread runs
                # Python too: the share of the run it was on a CPU while this thread was not
                # is how much of the run it overlapped (``dispatcher_overlap``).
                others = max(others, dispatcher_overlap(wall, c1 - c0, p1 - p0))
            note_overlap(
                sig,
                wall,
                others,
                c1 - c0 if cpu else None,
                p1 - p0 if many else None,
                _CORES,
                None if v0 < 0 else v1 > v0,
                # Not if the loop ran a kernel of its own beside this one: the cores were
                # shared by one more thread than the pool's.
                share=loop0 == loop1 and not loop0 & 1,
            )
        return value

    def execute_now(self, task: Task) -> None:
        """Synchronous mode: run a READY task here and now."""
        with GRAPH_LOCK:
            self.begin_locked(task)
        self.execute(task, go_on=False)

    def start_locked(self, task: Task, pool: InteropPool) -> bool:
        """A worker of ``pool`` (or a helper) takes a READY task: RUNNING, or to the GIL lane.

        A serial (GIL-bound) task starts only if the pool's lane is free, and then holds it;
        otherwise it waits in the lane's queue (False). Every 256th run of a serial signature
        is a probe that skips the lane and measures again (``dataflow._scheduler``). Holds the lock.
        """
        sig = task.sig
        if sig.serial and (sig.calls + 1) % PROBE:
            if pool.lane_task is None:
                pool.lane_task = task
            else:
                heapq.heappush(pool.lane_queue, (task.priority, task.id, task))
                return False
        self.begin_locked(task)
        return True

    def _lane_after_locked(self, task: Task, here: InteropPool | None) -> Task | None:
        """``task`` ended: if it held its pool's GIL lane, pass the lane on. Holds the lock.

        On a thread of that pool the next waiting task is returned to run here, next; from
        any other thread the waiting tasks go back to the pool's queue.
        """
        pool = self.pool
        if pool is None or pool.lane_task is not task:
            return None
        queue = pool.lane_queue
        while queue:
            nxt = heapq.heappop(queue)[2]
            if nxt.state != READY:
                continue
            if here is not pool:
                pool.lane_task = None
                pool.push_locked(nxt)
                while queue:
                    pool.push_locked(heapq.heappop(queue)[2])
                return None
            pool.lane_task = nxt
            nxt.runtime._sched.begin_locked(nxt)  # type: ignore[union-attr]
            return nxt
        pool.lane_task = None
        return None

    def execute(
        self,
        task: Task,
        go_on: bool = True,
        small_here: bool = False,
        worker_of: InteropPool | None = None,
    ) -> None:
        """Run a RUNNING task's kernel here, publish it, and go on with what it made ready.

        ``go_on``: after the task, run the small dependents it made ready and the first big
        one on this thread (queue the rest); otherwise queue them all (the event loop's thread
        helping an awaiting coroutine must return to it). ``small_here``: on a thread outside
        the pool (the loop's, running what workers handed back), run the tiny dependents
        (under the inline threshold) here and queue the others. ``worker_of``: the pool
        this thread works for, given by a worker (else looked up: None off the pools).
        """
        local: deque[Task] | None = None
        here = worker_of if worker_of is not None else current_pool()
        go_on = (go_on and here is not None) or small_here
        while True:
            sched = task.runtime._sched  # type: ignore[union-attr]
            try:
                mine = sched._execute_one(task, go_on, here)
            except BaseException:  # the process is being stopped here (``stops_here``)
                if local:
                    self._skip_taken(local)
                raise
            if mine is not None:
                if local is None:
                    local = deque(mine)
                else:
                    local.extend(mine)
            if not local:
                return
            task = local.popleft()

    def _execute_one(self, task: Task, go_on: bool, here: InteropPool | None) -> list[Task] | None:
        """Run one RUNNING task; returns the tasks this thread runs next (or None)."""
        if self.cancelling:
            thaw(task)
            cancelled = CancelledTaskError(f"{task.name} was not run: its runtime was closing")
            with GRAPH_LOCK:
                # Taken to run (RUNNING) but never run: counted unrun, not as a span.
                self._fail_locked(task, cancelled, ran=False)
                nxt = self._lane_after_locked(task, here)
            return None if nxt is None else [nxt]
        if here is not None:
            task.sig.awaited = 0  # a worker runs it: not (only) awaited at once
        watched = (ACTIVE or self.watching) and not task.sig.runner
        if watched:
            self.emit("task_started", task)
            start = time.perf_counter_ns()
        _running.task = task
        try:
            value = self._call(task, here is not None)
        except BaseException as exc:
            _running.task = None
            thaw(task)
            if watched:
                self.record(task, start, time.perf_counter_ns(), True)
            err = task_failed(task.name, task.op, exc)
            with GRAPH_LOCK:
                if task.state == RUNNING:  # else it timed out while it ran: dropped
                    self.failures.append(err)
                    self._fail_locked(task, err)
                nxt = self._lane_after_locked(task, here)
            if here is None and stops_here(exc, err):
                raise
            return None if nxt is None else [nxt]
        _running.task = None
        if task.frozen is not None:
            thaw(task)
        if watched:
            # Before the dependents are made ready, so events stay in causal order. The value
            # is readable by the instrument (its state is not DONE yet: nobody else reads it).
            end = time.perf_counter_ns()
            self.record(task, start, end, False)
            task.value = value
            self.emit("task_finished", task)
        mine = None
        pool = self.pool
        with GRAPH_LOCK:
            # (``_lane_after_locked``'s own test first: most tasks never held the lane)
            nxt = (
                None
                if pool is None or pool.lane_task is not task
                else self._lane_after_locked(task, here)
            )
            if task.state != RUNNING:  # timed out while it ran: the result is dropped
                return None if nxt is None else [nxt]
            waiters = task.waiters
            task.waiters = None
            ready = gs.finish(task, value)
            self.inflight -= 1
            self._end_locked(task)
            self.tasks_run += 1
            if waiters is not None:
                self.host.wake(waiters)
            if self.inflight == 0 and self._drained is not None:
                self.host.wake([self._drained])
                self._drained = None
            if nxt is not None:
                mine = [nxt]
            if ready is not None:
                more = self._place_ready_locked(ready, go_on, here)
                if more is not None:
                    if mine is None:
                        mine = more
                    else:
                        mine.extend(more)
        if watched and ready is not None:
            for d in ready:
                d.ready = end
                self.emit("task_ready", d)
        return mine

    def _skip_taken(self, tasks: deque[Task]) -> None:
        """The thread stops (``stops_here``) with ``tasks`` taken to run next (RUNNING):
        they fail unrun, as when the runtime closes, so nothing waits for them for ever."""
        for task in tasks:
            thaw(task)
            skipped = CancelledTaskError(f"{task.name} was not run: its thread was interrupted")
            with GRAPH_LOCK:
                task.runtime._sched._fail_locked(task, skipped, ran=False)  # type: ignore[union-attr]
                self._lane_after_locked(task, None)

    def finish_outside_locked(self, task: Task, value: Any) -> list[Task] | None:
        """``task``, counted in flight and not started, got its value elsewhere (a plan's
        runner built it): DONE, its waiters woken, its dependents placed. Holds the lock.

        Returns the dependents to run on this thread (the synchronous mode only).
        """
        waiters = task.waiters
        task.waiters = None
        owner = task.owner
        if owner is not None:  # (as begin_locked: the request no longer holds it)
            task.owner = None
            owner.live.pop(task.id, None)
        ready = gs.finish(task, value)
        self.inflight -= 1
        if waiters is not None:
            self.host.wake(waiters)
        if self.inflight == 0 and self._drained is not None:
            self.host.wake([self._drained])
            self._drained = None
        if ready is None:
            return None
        return self._place_ready_locked(ready, False, None)

    @staticmethod
    def _place_ready_locked(
        ready: list[Task], go_on: bool, here: InteropPool | None
    ) -> list[Task] | None:
        """Decide where newly ready tasks run: on this thread next, or queued (see
        ``dataflow._scheduler``).

        ``here`` is the pool the current thread works for: a big task goes on here only if
        it belongs to that pool (so a private pool's size still bounds its runtime), and a
        GIL-bound one only through that pool's lane.
        """
        mine: list[Task] = []
        big_taken = False
        now = 0
        for d in ready:
            sched = d.runtime._sched  # type: ignore[union-attr]
            pool = sched.pool
            if pool is None:  # synchronous mode: run it now, here
                sched.begin_locked(d)
                mine.append(d)
                continue
            if go_on and type(d.fn) is not TimedKernel:
                inline = d.sig.inline
                if inline is None:
                    tiny = d.sig.seconds < sched.inline_threshold
                    small = tiny or runs_inline(d.sig, sched.inline_threshold)
                else:
                    tiny = small = inline
                small = small and sched._inline_ok
                if here is None:
                    # The loop running what workers handed back (``drain``) goes on with tiny
                    # work only: a GIL-bound kernel of up to a switch interval would hold the
                    # loop (a server's requests) that long.
                    small = small and tiny
                elif tiny and small:
                    # The loop is dispatching work that waits (a chain of small ops behind
                    # this one, likely): it runs this itself (HANDBACK_SECONDS).
                    if not now:
                        now = _now_ns()
                    if now - sched._loop_pending_ns < HANDBACK_NS and sched.hand_back_locked(d):
                        continue
                if small or (not big_taken and pool is here):
                    if small and tiny:
                        sched.begin_locked(d)
                    else:  # big, or GIL-bound: through the GIL lane
                        big_taken = big_taken or not small
                        if not sched.start_locked(d, pool):
                            continue  # it waits for the GIL lane
                    mine.append(d)
                    continue
            if here is None and sched.helping:  # a worker woken for it would find it taken
                pool.push_quietly_locked(d)
                pool.wake_locked(spare=1)
                sched.help_queued = True
            else:
                pool.push_locked(d)
        return mine or None
