"""The scheduler's state and its lowest layer: observation, and starting, ending and failing
tasks under the graph lock (see :mod:`dataflow._scheduler` for the policy and the layers).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _blas
from .. import _graphstate as gs
from .._errors import (
    CancelledTaskError,
    TaskError,
)
from .._instrument import ACTIVE, GENERATION, HOOKED, PROCESS, Scope, sync_process
from .._pool import GRAPH_LOCK, InteropPool, current_pool
from .._protect import thaw
from .._record import Recorder
from .._task import (
    CANCELLED,
    PENDING,
    READY,
    RUNNING,
    Task,
)
from .._timeout import Watchdog
from ._placement import AWAIT_HERE_SECONDS

if TYPE_CHECKING:
    from .._loop import HostLoop
    from .._runtime import Runtime
    from ._requests import _Owner

__all__ = ["Failures", "SchedulerBase", "stops_here"]


def stops_here(exc: BaseException, err: TaskError) -> bool:
    """Whether ``exc``, which a kernel raised (its task failed with ``err``), stops the process
    here: a KeyboardInterrupt or SystemExit off the pools, on the thread that dispatched or
    awaits (the event loop's). Ctrl-C lands on the main thread, in whatever kernel it runs, so
    it propagates, as from a forked coroutine or outside a runtime, once the task has failed;
    ``err`` then counts as observed. On a pool thread the task keeps it (docs/hardening.md).
    """
    if isinstance(exc, KeyboardInterrupt | SystemExit) and current_pool() is None:
        err.observed = True
        return True
    return False


def _drop_locals(err: BaseException) -> None:
    """Let go of what the frames of a kept failure's cause hold (a kernel's arguments), keeping
    the traceback itself (files, lines and code: all a report prints). Only the frames the
    exception left are cleared, never its first, the frame that caught it (which may still
    run); clearing a frame that runs is refused, and ignored."""
    tb = err.__cause__.__traceback__ if err.__cause__ is not None else None
    if tb is not None:
        traceback.clear_frames(tb.tb_next)


class Failures(list[BaseException]):
    """A runtime's task failures, reported when it closes unless observed (raised to user
    code). Observed ones are let go as more arrive: a long-lived runtime (a server) whose
    requests fail and handle their errors kept every error, with its traceback and the
    arrays its frames hold, for its whole life (1 MiB more per failed request of 1 MiB).
    Unobserved ones are kept for the exit's report, but not what their frames held (but the
    first's, the error the report chains): a runtime whose fire-and-forget ops failed kept
    each one's input arrays to the end.

    ``append`` takes no lock (callers append with and without the graph lock); a thread
    compacts under a lock of its own, deleting the old entries and putting back the
    unobserved ones in two list operations, each atomic, so an append meanwhile is kept. The
    frames are let go of under the same lock, every :data:`DROP_EVERY` failures, so at most
    that many recent failures hold their frames' arrays.
    """

    #: Failures appended between two passes that let go of what their frames hold.
    DROP_EVERY = 64

    def __init__(self) -> None:
        super().__init__()
        self._compact_at = 64
        self._dropped = 1  # entries before this index hold no frames' locals (but the first)
        self._compacting = threading.Lock()

    def append(self, err: BaseException) -> None:
        super().append(err)
        n = len(self)
        if (
            n >= self._compact_at or n - self._dropped >= self.DROP_EVERY
        ) and self._compacting.acquire(blocking=False):
            try:
                n = len(self)
                if n >= self._compact_at:
                    kept = [e for e in self[:n] if not getattr(e, "observed", True)]
                    del self[:n]
                    self[0:0] = kept
                    n = len(kept)
                    self._compact_at = max(64, 2 * n)
                    self._dropped = min(self._dropped, 1)
                for e in self[max(self._dropped, 1) : n]:
                    if not getattr(e, "observed", True):
                        _drop_locals(e)
                self._dropped = n
            finally:
                self._compacting.release()


class SchedulerBase:
    """A runtime's scheduling state, its observers, and the transitions every layer makes:
    a task starts running, ends, or fails with its dependents (see :class:`Scheduler`).

    Counters (read by ``repr``, tests and benchmarks): ``inflight`` tasks submitted and not
    finished, ``running`` kernels running on the pool now and ``peak_running`` at most,
    ``tasks_run`` kernels run off the dispatching thread, ``inline_run`` kernels run inline,
    ``dropped`` tasks dropped unrun because their request was cancelled.
    """

    def __init__(
        self,
        runtime: Runtime,
        pool: InteropPool | None,
        host: HostLoop,
        *,
        inline_threshold: float,
        max_pending: int | None,
        simulate: Callable[[Task], Any] | None,
    ) -> None:
        self.rt = runtime
        self.pool = pool
        self.host = host
        self._current_task = host.current_task_getter()
        self.inline_threshold = inline_threshold
        # Kernels expected under this run where they are awaited (``_placement``,
        # AWAIT_HERE_SECONDS); none with an inline threshold of 0 (everything to the pool).
        self.await_here = AWAIT_HERE_SECONDS if inline_threshold > 0 else 0.0
        self.simulate = simulate
        limit = (1 << 62) if max_pending is None else max_pending
        self._limit = limit
        self._low_water = limit - limit // 10
        self._blocked = 0  # threads other than the loop's held back in _throttle
        self.failures = Failures()
        self.inflight = 0
        self.running = 0
        self.peak_running = 0
        # Starts and ends of the measurable kernels (MIN_MEASURED or more, as estimated) that
        # the loop ran itself, awaiting (``Awaiting._run_taken``): odd while one runs. A pool
        # run that overlapped one does not fold its CPU share (``Execution._measured``).
        self.loop_kernels = 0
        self.tasks_run = 0
        self.inline_run = 0
        self.dropped = 0
        self.cancelling = False
        self.closed = False
        self.draining = False  # the runtime's block ended: the loop adds no work (Runtime._join)
        # Inline at dispatch is allowed (not while cancelling, nor with simulated kernels).
        self._inline_ok = simulate is None
        self._drained: Any = None
        # A worker wake-up is posted to the loop for tasks queued quietly (``submit``), since
        # the first of them was (perf_counter_ns).
        self._wake_posted = False
        self._quiet_since = 0
        # The loop runs the ancestors of a task it awaits (``Awaiting._help``): what they make
        # ready is queued quietly but for one task (the loop's next), and whether any was.
        self.helping = False
        self.help_queued = False
        # When the loop last dispatched a task that waits for inputs (perf_counter_ns), and
        # the small ready tasks workers handed back to it meanwhile (``_placement``,
        # HANDBACK_SECONDS: the loop runs them, in ``submit`` or a posted drain).
        self._loop_pending_ns = 0
        self._handback: list[Task] = []
        self._drain_posted = False
        self._watchdog: Watchdog | None = None
        # Requests (tasks on the loop) that dispatched deferred work, by their loop task.
        self._owners: dict[Any, _Owner] = {}
        # A backend that runs tasks elsewhere (Dask) drops a sent task of a cancelled request
        # (``Requests.drop_locked_tasks``): ``drop_sent(task, error)`` under the lock, True
        # if it was dropped. None: every RUNNING task has started here.
        self.drop_sent: Callable[[Task, BaseException], bool] | None = None
        # This runtime's own observers (the process's are in ACTIVE); ``watching`` mirrors
        # whether it has any, for the hot path's one test.
        self.scope = Scope(f"runtime {id(runtime) & 0xFFFF:x}")
        self.watching = False
        self.hooked = False  # an instrument (not only recorders) observes this runtime
        # The recorders observing it, as (scope, record method) pairs, cached by GENERATION.
        self._sinks: tuple[tuple[Scope, Any], ...] = ()
        self._appends: tuple[Callable[[Any], None], ...] = ()
        self._windowed: tuple[Any, ...] = ()
        self._overriding: tuple[tuple[Scope, Any], ...] = ()
        self._sinks_gen = -1
        # The instruments' hook methods, per hook, each instrument once (``_methods``).
        self._methods_cache: dict[str, tuple[tuple[Scope, Any, Any], ...]] = {}
        self._methods_gen = -1
        # The generation the inline path's own span record is good for (-1: the general
        # case, ``_record_inline``), and the one recorder it goes to when there is one.
        self._fast_gen = -1
        self._append1: Callable[[Any], None] | None = None
        self._sinks_lock = threading.Lock()
        self._recorded = 0

    # -- observation (only when something observes: `if ACTIVE or self.watching`) ----------

    def observe(self, observer: Any, attach: bool) -> None:
        """Attach (or detach) an instrument or recorder to this runtime only."""
        if attach:
            self.scope.add(observer)
        else:
            self.scope.remove(observer)
        self.watching = bool(self.scope)
        self.hooked = self.scope.hooked

    def _scopes(self) -> list[Scope]:
        if self.watching:
            if not self.scope:  # its last observer was switched off
                self.watching = self.hooked = False
                return list(ACTIVE)
            return [*ACTIVE, self.scope]
        return list(ACTIVE)

    def sinks(self) -> tuple[tuple[Scope, Any], ...]:
        """(scope, recorder) of each recorder observing this runtime (cached by GENERATION,
        with the recorders' append methods for the inline path, ``_inline_recorded``)."""
        if GENERATION[0] != self._sinks_gen:
            # One thread at a time: two rebuilding at once (the loop and a worker, as observers
            # come and go) could leave one's fields beside the other's generation, and records
            # going to a detached recorder until the next change.
            with self._sinks_lock:
                gen = GENERATION[0]
                if gen != self._sinks_gen:
                    self._fast_gen = -1  # (the inline path's fields change: not meanwhile)
                    self._rebuild_sinks(gen)
        return self._sinks

    def _rebuild_sinks(self, gen: int) -> None:
        """``sinks``' cache for generation ``gen`` (under ``_sinks_lock``)."""
        # A recorder attached to the process and to this runtime too gets each record once.
        seen: set[int] = set()
        found = []
        for sc in self._scopes():
            for rec in sc.recorders:
                if id(rec) not in seen:
                    seen.add(id(rec))
                    found.append((sc, rec))
        pairs = tuple(found)
        for _, rec in pairs:
            rec.thread()  # names the calling thread (the loop's, usually) in its trace
        self._sinks = pairs
        # A recorder that overrides ``task`` gets the call (``_inline_recorded``).
        self._appends = tuple(rec._sink for _, rec in pairs if type(rec).task is Recorder.task)
        self._overriding = tuple(
            (sc, rec) for sc, rec in pairs if type(rec).task is not Recorder.task
        )
        self._windowed = tuple(rec for _, rec in pairs if rec.max_seconds is not None)
        self._append1 = self._appends[0] if len(self._appends) == 1 else None
        self._sinks_gen = gen
        # A windowed recorder or one that overrides Recorder.task: the general case (set last).
        self._fast_gen = -1 if self._overriding or self._windowed else gen

    def _methods(self, hook: str) -> tuple[tuple[Scope, Any, Any], ...]:
        """(scope, instrument, bound method) of each instrument observing this runtime that
        defines ``hook``, each instrument once: one attached to the process and to this runtime
        too sees each event once, as one attached twice to one scope does (cached by
        GENERATION)."""
        if GENERATION[0] != self._methods_gen:
            self._methods_cache = {}
            self._methods_gen = GENERATION[0]
        found = self._methods_cache.get(hook)
        if found is None:
            seen: set[int] = set()
            triples = []
            for scope in self._scopes():
                for inst, method in scope.methods(hook):
                    if id(inst) not in seen:
                        seen.add(id(inst))
                        triples.append((scope, inst, method))
            found = self._methods_cache[hook] = tuple(triples)
        return found

    def _switch_off(self, scope: Scope, observer: Any, hook: str, exc: BaseException) -> None:
        """An observer raised: switch it off in ``scope`` (reported once, ``Scope.disable``) and
        in this runtime's other scope too, quietly (else it raised, and was reported, again at
        the next event it saw there)."""
        scope.disable(observer, hook, exc)
        for other in (PROCESS, self.scope):
            if other is not scope and other.remove(observer) and other is PROCESS:
                sync_process()

    def emit(self, hook: str, *args: Any) -> None:
        """Call ``hook`` on the instruments observing this runtime."""
        if not (HOOKED or self.hooked):
            return
        self.emit_at(time.perf_counter_ns(), hook, *args)

    def emit_at(self, ts: int, hook: str, *args: Any) -> None:
        """``emit`` with a given timestamp (an event that happened elsewhere: Dask)."""
        for scope, inst, method in self._methods(hook):
            try:
                method(ts, *args)
            except BaseException as exc:  # no observer may break a run
                self._switch_off(scope, inst, hook, exc)

    def record(self, task: Task, start: int, end: int, failed: bool) -> None:
        """One span record of a task that ran, for the recorders observing this runtime."""
        for scope, rec in self.sinks():
            try:
                rec.task(task, task.ready, start, end, failed)
            except BaseException as exc:  # no observer may break a run
                self._switch_off(scope, rec, "task", exc)

    def record_unrun(self, cancelled: bool) -> None:
        """A task failed (an input failed) or was cancelled without running."""
        for scope, rec in self.sinks():
            try:
                rec.unrun(cancelled)
            except BaseException as exc:  # no observer may break a run
                self._switch_off(scope, rec, "unrun", exc)

    def record_span(self, kind: str, name: str, start: int, end: int, parent: str | None) -> None:
        """A fork's or a wait's span ended (on the loop thread)."""
        for scope, rec in self.sinks():
            try:
                rec.span(kind, name, start, end, parent)
            except BaseException as exc:  # no observer may break a run
                self._switch_off(scope, rec, "span", exc)

    # -- transitions -------------------------------------------------------------------------

    def begin_locked(self, task: Task) -> None:
        """``task`` starts running on some thread (state and counts). Holds the lock."""
        task.state = RUNNING
        owner = task.owner
        if owner is not None:  # the request that dispatched it no longer holds it
            task.owner = None
            owner.live.pop(task.id, None)
        self.running += 1
        if self.running > self.peak_running:
            self.peak_running = self.running
        pool = self.pool
        if pool is not None:
            if pool.measuring:  # a measured run wants the busy integral (see InteropPool)
                pool.tick_locked()
            pool.busy += 1
            gov = _blas.GOVERNOR  # adaptive intra-op threads: long and BLAS kernels count
            if gov is not None:
                sig = task.sig
                if sig.intraop or sig.seconds >= _blas.LONG_SECONDS:
                    gov.start_locked(task.id)

    def _end_locked(self, task: Task) -> None:
        """``task``, which was running, ended (its state already set). Holds the lock."""
        self.running -= 1
        pool = self.pool
        if pool is not None:
            if pool.measuring:
                pool.tick_locked()
            pool.busy -= 1
            gov = _blas.GOVERNOR
            if gov is not None and gov.counted:
                gov.end_locked(task.id)

    def _fail_locked(
        self,
        task: Task,
        err: BaseException | None,
        counted: bool = True,
        ran: bool | None = None,
    ) -> None:
        """Fail ``task`` and, transitively, every task waiting on it. Holds the lock.

        A dependent may belong to another runtime (nested runtimes, or runtimes in two
        threads): each task is accounted to, and its waiters woken through, its own runtime.
        ``counted``: ``task`` was counted in flight (an inline task is not). ``ran``: its
        kernel ran, so its span record (written where it ran) accounts for it; by default,
        whether it was RUNNING. A task taken to run (RUNNING) whose kernel is then skipped
        (its runtime closing) passes False: the recorders count it among those that never
        ran, as they do the queued and waiting tasks that fail with it.
        """
        was_running = task.state == RUNNING
        if ran is None:
            ran = was_running
        owners: list[SchedulerBase] = []
        for t in gs.fail(task, err):
            if t.frozen is not None and not (t is task and was_running):
                thaw(t)  # it never runs (a running kernel thaws its own when it returns)
            sched = t.runtime._sched  # type: ignore[union-attr]
            if counted or t is not task:
                sched.inflight -= 1
                if t is task and was_running:
                    sched._end_locked(task)
                if sched not in owners:
                    owners.append(sched)
            waiters = t.waiters
            if waiters is not None:
                t.waiters = None
                sched.host.wake(waiters)
            if ACTIVE or sched.watching:
                cancelled = t.state == CANCELLED
                if not (t is task and ran):  # (a kernel that ran records its span)
                    sched.record_unrun(cancelled)
                sched.emit("task_cancelled" if cancelled else "task_failed", t)
        for sched in owners:
            if sched.inflight == 0 and sched._drained is not None:
                sched.host.wake([sched._drained])
                sched._drained = None

    def cancel(self, task: Task) -> bool:
        """Cancel a task that has not started; its dependents fail with CancelledTaskError."""
        with GRAPH_LOCK:
            if task.state not in (PENDING, READY):
                return False
            self._fail_locked(task, CancelledTaskError(f"{task.name} was cancelled before it ran"))
        return True
