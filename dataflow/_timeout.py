"""Per-op timeouts: a kernel wrapper that arms a deadline, and the watchdog thread that fires it.

An op with a timeout (``dataflow.op(..., timeout=s)`` or ``Runtime(op_timeout=s)``) is
submitted with its kernel wrapped in a :class:`TimedKernel`. When the kernel starts, on a pool
thread, the wrapper arms a deadline with the runtime's :class:`Watchdog`; when it returns, it
disarms it. If the deadline passes first, the watchdog fails the task (and so its dependents)
with :class:`~dataflow.OpTimeoutError` and tells the pool to replace the stuck thread.

A Python thread cannot be interrupted, so the kernel keeps running; whatever it returns or
raises later is discarded, and its thread exits once it does. Nothing of this costs anything
for ops without a timeout: the watchdog thread is only started by the first timed kernel.

Why a thread and not ``loop.call_later``: the event loop may be busy (an inline kernel, or a
dispatcher held back by backpressure), and a deadline must fire regardless.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._errors import DataflowTypeError, DataflowValueError
from ._pool import GRAPH_LOCK
from ._task import _NUMBERS, RUNNING

if TYPE_CHECKING:
    from ._task import Task

__all__ = ["LateResult", "TimedKernel", "Watchdog", "check_timeout"]

_seq = itertools.count().__next__


def check_timeout(seconds: object, what: str) -> float | None:
    """``seconds`` as a float, or None; anything but a positive finite number is refused."""
    if seconds is None:
        return None
    if type(seconds) is bool or not isinstance(seconds, _NUMBERS):  # (numpy's numbers too)
        raise DataflowTypeError(
            f"{what} must be a number of seconds or None, got {type(seconds).__name__}: {seconds!r}"
        )
    if not (seconds > 0 and math.isfinite(seconds)):
        raise DataflowValueError(
            f"{what} must be a positive, finite number of seconds (or None for no timeout), "
            f"got {seconds!r}"
        )
    return float(seconds)


class LateResult(Exception):
    """Raised by a TimedKernel whose task timed out while it ran: the outcome is discarded."""


class TimedKernel:
    """A kernel that runs under a deadline (see the module docstring)."""

    __slots__ = ("fn", "seconds", "task")

    def __init__(self, fn: Callable[..., Any], task: Task, seconds: float) -> None:
        self.fn = fn
        self.task = task
        self.seconds = seconds

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        task = self.task
        rt = task.runtime
        assert rt is not None
        entry = rt._sched.watchdog_arm(task, self.seconds)
        try:
            value = self.fn(*args, **kwargs)
        finally:
            Watchdog.disarm(entry)
        with GRAPH_LOCK:
            late = task.state != RUNNING
        if late:  # timed out while it ran: do not publish (nor trace) a finished kernel
            raise LateResult
        return value


# A deadline: [when, seq, task (None once disarmed), seconds, thread].
Entry = list[Any]


class Watchdog:
    """One daemon thread per runtime that fails tasks whose kernel outlives its deadline.

    ``expire(task, seconds, thread)`` is called on the watchdog thread for each deadline that
    passes while its kernel still runs; it must check, under the runtime's lock, that the task
    is still running.
    """

    def __init__(self, expire: Callable[[Task, float, threading.Thread], None], name: str) -> None:
        self._expire = expire
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[Entry] = []
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<Watchdog armed={sum(e[2] is not None for e in self._heap)}>"

    def arm(self, task: Task, seconds: float) -> Entry:
        """Start the clock for ``task``'s kernel, running on the calling thread."""
        entry: Entry = [
            time.monotonic() + seconds,
            _seq(),
            task,
            seconds,
            threading.current_thread(),
        ]
        with self._cond:
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:
                self._cond.notify()
        return entry

    @staticmethod
    def disarm(entry: Entry) -> None:
        """The kernel returned: drop its deadline (lazily; the heap is compacted when half dead)."""
        entry[2] = None

    def _run(self) -> None:
        cond = self._cond
        heap = self._heap
        while True:
            with cond:
                while True:
                    if self._closing:
                        return
                    while heap and heap[0][2] is None:
                        heapq.heappop(heap)
                    if len(heap) > 1024:
                        self._compact()
                    if not heap:
                        cond.wait()
                        continue
                    delay = heap[0][0] - time.monotonic()
                    if delay <= 0:
                        entry = heapq.heappop(heap)
                        break
                    cond.wait(min(delay, 1.0))  # wake now and then to compact
            task = entry[2]
            if task is not None:
                try:
                    self._expire(task, entry[3], entry[4])
                except Exception:  # never let the watchdog die: later deadlines still count
                    _log_failure(task)

    def _compact(self) -> None:
        """Drop disarmed entries once they are most of the heap. Holds the condition's lock."""
        live = [e for e in self._heap if e[2] is not None]
        if len(live) * 2 < len(self._heap):
            heapq.heapify(live)
            self._heap[:] = live

    def close(self) -> None:
        """Stop the watchdog thread and join it."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()


def _log_failure(task: Task) -> None:
    try:
        from ._log import logger

        logger.exception("dataflow: the timeout watchdog failed", task=repr(task))
    except Exception:
        pass
