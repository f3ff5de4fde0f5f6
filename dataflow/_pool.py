"""The bounded inter-op thread pool: worker threads and their ready queue, nothing more.

A worker takes the next ready task and hands it to the scheduler of the runtime that owns it
(``task.runtime._sched.execute``), which runs the kernel, publishes the outcome and may go on
with a dependent on the same thread (see ``_scheduler``). Design, measured on 2-vCPU VMs where
waking a thread costs tens of microseconds:

* One lock, process-wide (:data:`GRAPH_LOCK`), guards every pool's queue *and* the graph state
  of every runtime, so a worker that finishes a kernel marks its dependents ready and takes the
  next task in one critical section, and a task of one runtime may depend on a task of another
  (nested runtimes, runtimes in two threads) with every transition made under the same lock.
* Idle workers park on a private lock each (a binary semaphore). A push wakes one parked
  worker only when one is parked, so a busy pool pays no wake-up at all.
* The queue is a heap keyed by ``(task.priority, task.id)``: issue order, or a graph run's
  static critical-path rank. A task taken by someone else (the awaiting thread) or cancelled
  while queued stays in the heap and is skipped when popped.
* Starting a task is the scheduler's decision (``start_locked``): a GIL-bound kernel may be
  sent to wait for the pool's *GIL lane* instead (see ``_scheduler``).

A kernel that outlives its timeout (see ``_timeout``) cannot be interrupted: its worker is
*abandoned* (no longer joined, it exits once the kernel returns) and a replacement is started,
so the pool keeps its size.

The process shares one pool by default (as torch shares its inter-op pool between inference
requests); it is created when the first runtime opens and its threads are joined when the last
one closes, so nothing outlives a ``dataflow.run``. A runtime may ask for a private pool.

A child process made by ``os.fork()`` has only the thread that forked: no worker of any pool,
and a lock a worker held at that moment would stay held. It starts as a process no runtime
ran in (:func:`_after_fork_in_child`): no shared pool, the locks free. A runtime open in the
parent at the fork is the parent's (its kernels run there); the child opens its own.
"""

from __future__ import annotations

import heapq
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING

from ._errors import DataflowError, DataflowRuntimeError
from ._task import READY, RUNNING

if TYPE_CHECKING:
    from ._task import Task

__all__ = [
    "GRAPH_LOCK",
    "RUN_HAS_NO_POOL",
    "InteropPool",
    "acquire_shared_pool",
    "current_pool",
    "on_pool_thread",
    "on_shared_pool_thread",
    "release_shared_pool",
    "shared_pool_size",
]

#: The lock of all scheduling state: every pool's queue and every runtime's graph.
GRAPH_LOCK = threading.Lock()

# Which pool the current thread works for (set once per worker thread).
_local = threading.local()


class InteropPool:
    """A fixed number of worker threads running ready tasks, lowest priority first."""

    def __init__(self, num_threads: int, *, name: str = "interop") -> None:
        if num_threads < 1:
            raise DataflowError(f"an inter-op pool needs at least 1 thread, got {num_threads}")
        self.lock = GRAPH_LOCK
        self.num_threads = num_threads
        self._heap: list[tuple[float, int, Task]] = []
        self._idle: list[threading.Lock] = []
        self._closing = False
        self._name = name
        self._threads: list[threading.Thread] = []
        # Workers stuck in a timed-out kernel: not joined; each exits when its kernel returns.
        self._abandoned: set[threading.Thread] = set()
        # The GIL lane (see _scheduler): the GIL-bound task running (or about to run) now,
        # and the ready GIL-bound tasks waiting for it to end.
        self.lane_task: Task | None = None
        self.lane_queue: list[tuple[float, int, Task]] = []
        # Kernels running now on behalf of this pool, and the integral of that count over
        # time while a measured run is in progress (``measuring``; kept up at every start
        # and end then, and only then: a clock read per task is a share of a tiny task's
        # cost): the average number of kernels overlapping a measured run is (integral at
        # its end - at its start) / its duration.
        self.busy = 0
        self.measuring = 0
        self.busy_integral = 0.0
        self._busy_since = time.perf_counter()
        try:
            for i in range(num_threads):
                self._start_worker(i)
        except BaseException as exc:
            # The threads started so far stop (they were left parked for good), and a
            # thread the system refused is named as such, not as a bare RuntimeError.
            self.close()
            if isinstance(exc, RuntimeError) and not isinstance(exc, DataflowError):
                raise DataflowRuntimeError(
                    f"cannot start inter-op thread {len(self._threads) + 1} of {num_threads} "
                    f"({type(exc).__name__}: {exc}): if the process is at its thread limit, "
                    "use fewer interop_threads"
                ) from exc
            raise

    def _start_worker(self, index: int) -> None:
        wake = threading.Lock()
        wake.acquire()
        t = threading.Thread(
            target=self._work, args=(wake,), name=f"{self._name}-{index}", daemon=True
        )
        t.start()  # (listed once started: close joins the listed threads)
        self._threads.append(t)

    def __repr__(self) -> str:
        return (
            f"<InteropPool threads={self.num_threads} queued={len(self._heap)} "
            f"idle={len(self._idle)}>"
        )

    @property
    def queued(self) -> int:
        """Entries in the ready queue (stale ones included until they are popped)."""
        return len(self._heap)

    @property
    def idle(self) -> int:
        """Workers parked, waiting for work."""
        return len(self._idle)

    @property
    def threads(self) -> list[threading.Thread]:
        """The worker threads (for parallel_info and tests)."""
        return list(self._threads)

    def tick_locked(self) -> None:
        """Bring the busy integral up to now (before ``busy`` changes). Holds the lock."""
        now = time.perf_counter()
        self.busy_integral += self.busy * (now - self._busy_since)
        self._busy_since = now

    def measure_begin_locked(self) -> float:
        """A measured run starts: keep the busy integral from now on, and return it. Holds
        the lock."""
        if not self.measuring:
            self._busy_since = time.perf_counter()
        self.measuring += 1
        return self.busy_integral_now()

    def measure_end_locked(self) -> float:
        """A measured run ended: the busy integral now. Holds the lock."""
        value = self.busy_integral_now()
        self.measuring -= 1
        return value

    def busy_integral_now(self) -> float:
        """The busy integral up to now (meaningful while a measured run is in progress)."""
        return self.busy_integral + self.busy * (time.perf_counter() - self._busy_since)

    def push_locked(self, task: Task) -> None:
        """Queue a READY task, waking a parked worker if there is one. Holds the lock."""
        heapq.heappush(self._heap, (task.priority, task.id, task))
        if self._idle:
            self._idle.pop().release()

    def push_quietly_locked(self, task: Task) -> None:
        """Queue a READY task without waking a worker: the caller wakes them later with
        :meth:`wake_locked`, unless it runs the task itself first. Holds the lock.

        For small tasks dispatched by a thread that may await them at once and that runs
        Python meanwhile (the event loop): a worker woken for one costs that thread a wake-up
        of its own when the kernel ends, and takes the GIL from it while it dispatches (see
        ``_scheduler``, "Small work runs where it is needed").
        """
        heap = self._heap
        while heap and heap[0][2].state != READY:  # taken by an awaiting thread meanwhile
            heapq.heappop(heap)
        heapq.heappush(heap, (task.priority, task.id, task))

    def wake_locked(self, spare: int = 0) -> None:
        """Wake a parked worker for each ready task queued but ``spare`` (left to the caller),
        as many as are parked (after :meth:`push_quietly_locked`). Holds the lock."""
        heap = self._heap
        while heap and heap[0][2].state != READY:
            heapq.heappop(heap)
        idle = self._idle
        for _ in range(min(len(heap) - spare, len(idle))):
            idle.pop().release()

    def _work(self, wake: threading.Lock) -> None:
        # This loop is the whole worker: take the best ready task, let its scheduler run it.
        _local.pool = self
        me = threading.current_thread()
        abandoned = self._abandoned
        lock = self.lock
        heap = self._heap
        while True:
            lock.acquire()
            while not heap:
                if self._closing:
                    lock.release()
                    return
                self._idle.append(wake)
                lock.release()
                wake.acquire()
                lock.acquire()
            task = heapq.heappop(heap)[2]
            if task.state != READY:  # taken by another thread, or cancelled, while queued
                lock.release()
                continue
            sched = task.runtime._sched  # type: ignore[union-attr]
            if not sched.start_locked(task, self):  # it waits for the GIL lane instead
                lock.release()
                continue
            lock.release()
            # Hold no reference to the task while it runs: a task's value must be freed with
            # its last reader, and ``execute`` goes on here with what it makes ready (a
            # chain's first output, kept by this frame, stayed alive to the chain's end: a
            # third (4M,) float32 array at the peak of ``tanh(x * y + 1)``, and each op 8%
            # slower than numpy's, from the page faults of the extra memory). The list gives
            # the call its argument and keeps none. (A weak one, for the internal error below.)
            held = [task]
            ref = weakref.ref(task)
            task = None  # type: ignore[assignment]
            try:
                sched.execute(held.pop(), worker_of=self)
            except BaseException as exc:  # the scheduler's own bug: never die with a task
                stuck = ref()
                if stuck is not None:
                    _fail_stuck(stuck, exc)
                del stuck
            sched = None
            if abandoned and me in abandoned:  # replaced while stuck in a timed-out kernel
                with lock:
                    abandoned.discard(me)
                return

    def take_locked(self, timed: type | None = None) -> Task | None:
        """Pop the next ready task for a helping thread, marked RUNNING; None if there is none.

        A task whose kernel is of type ``timed`` (a timed kernel), or a plan's runner (it runs
        a whole plan), is left for the workers: the helper may be the event loop's thread,
        which must not get stuck in a kernel.
        """
        heap = self._heap
        while heap:
            task = heap[0][2]
            if task.state != READY:
                heapq.heappop(heap)
                continue
            if (timed is not None and type(task.fn) is timed) or task.sig.runner:
                return None
            heapq.heappop(heap)
            if task.runtime._sched.start_locked(task, self):  # type: ignore[union-attr]
                return task
        return None

    def abandon_locked(self, thread: threading.Thread) -> None:
        """``thread`` is stuck in a kernel past its timeout: stop counting on it, replace it."""
        if thread not in self._threads:
            return  # not one of our workers (a helping dispatcher), or already abandoned
        self._threads.remove(thread)
        self._abandoned.add(thread)
        if not self._closing:
            self._start_worker(self.num_threads + len(self._abandoned) - 1)

    def close(self) -> None:
        """Let the workers finish what is queued, then join them."""
        with self.lock:
            self._closing = True
            while self._idle:
                self._idle.pop().release()
        current = threading.current_thread()
        for t in list(self._threads):
            if t is not current:
                t.join()


def _fail_stuck(task: Task, exc: BaseException) -> None:
    """``execute`` raised (it catches kernel errors, so this is dataflow's own failure): fail
    the task it was given if it is still running, so nothing waits on it forever."""
    try:
        from ._errors import task_failed
        from ._log import logger

        with GRAPH_LOCK:
            if task.state == RUNNING:
                err = task_failed(task.name, task.op, exc, what="(internal error) ")
                sched = task.runtime._sched  # type: ignore[union-attr]
                sched.failures.append(err)
                sched._fail_locked(task, err)
        logger.error("dataflow: a worker survived an internal error", task=repr(task),
                     error=repr(exc))  # fmt: skip
    except BaseException:  # the worker goes on, whatever happens here
        pass


#: How a program that calls ``dataflow.run`` gets a pool of its own (the errors that name
#: ``private_pool=True`` say it: run has no such option).
RUN_HAS_NO_POOL = (
    "dataflow.run has no such option: asyncio.run an async function that opens "
    "`async with dataflow.Runtime(private_pool=True): ...`"
)

# The process-wide pool, created lazily by the first runtime and joined by the last one.
_shared: InteropPool | None = None
_shared_users = 0
_shared_lock = threading.Lock()


def acquire_shared_pool(num_threads: int) -> InteropPool:
    """Return the shared pool, starting it with ``num_threads`` if no runtime uses it.

    Raises:
        DataflowRuntimeError: it runs with another size. The call is valid, only not now
            (as ``set_num_interop_threads`` while it runs): a running pool is not resized.
    """
    global _shared, _shared_users
    with _shared_lock:
        if _shared is None:
            _shared = InteropPool(num_threads)
        elif _shared.num_threads != num_threads:
            raise DataflowRuntimeError(
                f"interop_threads={num_threads}: the shared inter-op pool is already running "
                f"with {_shared.num_threads} thread(s) for another runtime, and a running pool "
                "is not resized. Use the same count, or give the runtime a pool of its own: "
                f"Runtime(private_pool=True); {RUN_HAS_NO_POOL}."
            )
        _shared_users += 1
        return _shared


def release_shared_pool() -> None:
    """Drop one user of the shared pool; the last one joins its threads."""
    global _shared, _shared_users
    with _shared_lock:
        _shared_users -= 1
        if _shared_users > 0 or _shared is None:
            return
        pool, _shared = _shared, None
    pool.close()


def _after_fork_in_child() -> None:
    """In a child made by ``os.fork()``: forget the parent's pools (their threads do not
    exist here: a runtime queuing work for them hung) and free the locks (one a worker held
    at the fork would be held for good: the child's first op hung)."""
    global _shared, _shared_users
    GRAPH_LOCK._at_fork_reinit()  # type: ignore[attr-defined]
    _shared_lock._at_fork_reinit()  # type: ignore[attr-defined]
    _shared = None
    _shared_users = 0
    _local.pool = None  # the forking thread, if it was a worker, is none here


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def current_pool() -> InteropPool | None:
    """The pool the calling thread is a worker of (None off the pools)."""
    return getattr(_local, "pool", None)


def on_pool_thread() -> bool:
    """Whether the calling thread is a worker of any inter-op pool."""
    return getattr(_local, "pool", None) is not None


def on_shared_pool_thread() -> bool:
    """Whether the calling thread is a worker of the running shared pool."""
    pool = getattr(_local, "pool", None)
    return pool is not None and pool is _shared


def shared_pool_size() -> int | None:
    """The shared pool's thread count while it runs, else None."""
    pool = _shared
    return None if pool is None else pool.num_threads
