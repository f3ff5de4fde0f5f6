"""The bounded inter-op thread pool.

Design, measured on 2-vCPU VMs where a thread-to-thread hand-off costs tens of microseconds:

* One lock, process-wide (:data:`GRAPH_LOCK`), guards every pool's ready heap *and* the graph
  state of every runtime, so a worker that finishes a kernel can mark its dependents ready and
  pop the next task in the same critical section, without a round trip through the event loop,
  and so a task of one runtime may depend on a task of another (nested runtimes, runtimes in
  two threads) with every transition made under the same lock.
* Idle workers park on a private lock each (a binary semaphore). A push wakes one parked
  worker only when one is parked, so a busy pool pays no wake-up at all.
* The heap is keyed by ``(-task.height, task.priority, task.id)``: the task that starts the
  longest known chain of remaining work first, then issue order (or a graph run's static
  critical-path rank). A queued task whose height grows is pushed again; the old entry is
  recognised as stale when popped and skipped.

A kernel that outlives its timeout (see ``_timeout``) cannot be interrupted: its worker is
*abandoned* (no longer joined, it exits once the kernel returns) and a replacement is started,
so the pool keeps its size. Threads that dispatch over a runtime's ``max_pending`` limit help
run queued tasks (:meth:`InteropPool.take_locked`), as a worker would.

The process shares one pool by default (as torch shares its inter-op pool between inference
requests); it is created when the first runtime opens and its threads are joined when the last
one closes, so nothing outlives a ``dataflow.run``. A runtime may ask for a private pool.
"""

from __future__ import annotations

import heapq
import threading
from typing import TYPE_CHECKING

from ._errors import DataflowError

if TYPE_CHECKING:
    from ._task import Task

__all__ = [
    "InteropPool",
    "acquire_shared_pool",
    "on_shared_pool_thread",
    "release_shared_pool",
    "shared_pool_size",
]

#: The lock of all scheduling state: every pool's heap and every runtime's graph (see above).
GRAPH_LOCK = threading.Lock()

# Which pool the current thread works for (set once per worker thread, read by runtimes that
# must not open on a thread of the pool they would wait for).
_local = threading.local()


class InteropPool:
    """A fixed number of worker threads running graph tasks from a priority heap."""

    def __init__(self, num_threads: int, *, name: str = "interop") -> None:
        if num_threads < 1:
            raise ValueError(f"an inter-op pool needs at least 1 thread, got {num_threads}")
        self.lock = GRAPH_LOCK
        self.num_threads = num_threads
        self._heap: list[tuple[float, float, int, Task]] = []
        self._idle: list[threading.Lock] = []
        self._closing = False
        self._name = name
        self._threads: list[threading.Thread] = []
        # Workers stuck in a timed-out kernel: not joined; each exits when its kernel returns.
        self._abandoned: set[threading.Thread] = set()
        for i in range(num_threads):
            self._start_worker(i)

    def _start_worker(self, index: int) -> None:
        wake = threading.Lock()
        wake.acquire()
        t = threading.Thread(
            target=self._work, args=(wake,), name=f"{self._name}-{index}", daemon=True
        )
        self._threads.append(t)
        t.start()

    def __repr__(self) -> str:
        return (
            f"<InteropPool threads={self.num_threads} queued={len(self._heap)} "
            f"idle={len(self._idle)}>"
        )

    @property
    def queued(self) -> int:
        """Tasks ready and waiting for a thread."""
        return len(self._heap)

    @property
    def threads(self) -> list[threading.Thread]:
        """The worker threads (for parallel_info and tests)."""
        return list(self._threads)

    def push_locked(self, task: Task) -> None:
        """Queue a READY task. The caller holds ``self.lock``."""
        heapq.heappush(self._heap, (-task.height, task.priority, task.id, task))
        if self._idle:
            self._idle.pop().release()

    def _work(self, wake: threading.Lock) -> None:
        # This loop is the whole worker: pop the best ready task, run it, repeat. Running it
        # (Runtime.execute) re-takes the lock to publish the result and queue dependents.
        from ._task import READY, RUNNING

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
            neg_height, _, _, task = heapq.heappop(heap)
            if task.state != READY or -neg_height != task.height:
                # Cancelled while queued, or a stale entry of a task re-queued higher.
                lock.release()
                continue
            task.state = RUNNING
            rt = task.runtime
            assert rt is not None
            rt.running += 1
            if rt.running > rt.peak_running:
                rt.peak_running = rt.running
            lock.release()
            rt.execute(task)
            if abandoned and me in abandoned:  # replaced while stuck in a timed-out kernel
                with lock:
                    abandoned.discard(me)
                return

    def take_locked(self) -> Task | None:
        """Pop the next ready task for a helping (dispatching) thread, marked RUNNING.

        None when nothing is queued, or when the next task has a timeout: a helper may be the
        event loop's thread, which must not get stuck in a kernel it cannot give up on.
        """
        from ._task import READY, RUNNING
        from ._timeout import TimedKernel

        heap = self._heap
        while heap:
            neg_height, _, _, task = heap[0]
            if task.state != READY or -neg_height != task.height:
                heapq.heappop(heap)  # cancelled, or a stale entry (as in _work)
                continue
            if type(task.fn) is TimedKernel:
                return None
            heapq.heappop(heap)
            task.state = RUNNING
            rt = task.runtime
            assert rt is not None
            rt.running += 1
            if rt.running > rt.peak_running:
                rt.peak_running = rt.running
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


# The process-wide pool, created lazily by the first runtime and joined by the last one.
_shared: InteropPool | None = None
_shared_users = 0
_shared_lock = threading.Lock()


def acquire_shared_pool(num_threads: int) -> InteropPool:
    """Return the shared pool, starting it with ``num_threads`` if no runtime uses it."""
    global _shared, _shared_users
    with _shared_lock:
        if _shared is None:
            _shared = InteropPool(num_threads)
        elif _shared.num_threads != num_threads:
            raise DataflowError(
                f"the shared inter-op pool is already running with {_shared.num_threads} "
                f"thread(s) for another runtime, and this one asks for {num_threads}. "
                "Use the same count, or pass private_pool=True for a pool of its own."
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


def on_shared_pool_thread() -> bool:
    """Whether the calling thread is a worker of the running shared pool."""
    pool = getattr(_local, "pool", None)
    return pool is not None and pool is _shared


def shared_pool_size() -> int | None:
    """The shared pool's thread count while it runs, else None."""
    pool = _shared
    return None if pool is None else pool.num_threads
