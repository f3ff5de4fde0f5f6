"""Limits: op timeouts (a watchdog thread fails a kernel that outlives its deadline) and
backpressure (a dispatcher over ``max_pending`` helps run queued work) (:mod:`dataflow._scheduler`,
"Timeouts" and "Backpressure").
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .._errors import OpTimeoutError
from .._pool import GRAPH_LOCK
from .._task import RUNNING, Task
from .._timeout import TimedKernel, Watchdog
from ._awaiting import Awaiting

__all__ = ["Limits"]

# Set on a thread while it helps run tasks for backpressure (helping never nests).
_helping = threading.local()


class Limits(Awaiting):
    """The timeout and backpressure layer of :class:`~dataflow._scheduler.Scheduler`."""

    # -- timeouts ------------------------------------------------------------------------------

    def watchdog_arm(self, task: Task, seconds: float) -> list[Any]:
        """Start ``task``'s deadline (called by its TimedKernel on the thread running it)."""
        wd = self._watchdog
        if wd is None:
            with GRAPH_LOCK:
                wd = self._watchdog
                if wd is None:
                    name = f"dataflow-watchdog-{id(self) & 0xFFFF:x}"
                    wd = self._watchdog = Watchdog(self._timed_out, name)
        return wd.arm(task, seconds)

    def _timed_out(self, task: Task, seconds: float, thread: threading.Thread) -> None:
        """``task``'s kernel outlived its timeout: fail it and its dependents (watchdog thread)."""
        with GRAPH_LOCK:
            if task.state != RUNNING:
                return  # it finished in the meantime
            err = OpTimeoutError(
                f"{task.name} timed out: its kernel ran longer than the {seconds:g} s timeout "
                f"of op {task.op!r}. A running kernel cannot be interrupted: its thread is "
                "left to finish in the background (the pool starts a replacement) and its "
                "result will be discarded. Raise the timeout (dataflow.op(..., timeout=) or "
                "Runtime(op_timeout=)) if the op is just slow, or find out why it hangs.",
                task=task.name,
                op=task.op,
            )
            self.failures.append(err)
            self._fail_locked(task, err)
            if self.pool is not None:
                self.pool.abandon_locked(thread)
                # The stuck kernel may hold the GIL lane: hand it on from here.
                self._lane_after_locked(task, None)

    # -- backpressure --------------------------------------------------------------------------

    def _throttle(self) -> None:
        """Over ``max_pending``: help run queued tasks until 10% under it (see
        ``dataflow._scheduler``, "Backpressure")."""
        if getattr(_helping, "active", False):
            return  # a task this thread runs as a helper dispatches: let it through
        _helping.active = True
        on_loop = threading.get_ident() == self.host.thread_id
        pool = self.pool
        assert pool is not None
        if not on_loop:
            with GRAPH_LOCK:
                self._blocked += 1
        try:
            while True:
                # Ctrl-C cancels the task that is dispatching (asyncio.Runner's handler runs
                # between any two bytecodes): stop here, as it would at its next await.
                if on_loop and self.host.cancel_requested():
                    self.host.raise_cancelled()
                    return
                if on_loop and self._handback:
                    self.drain()  # small work handed back to the loop: it is the one to run it
                    continue
                with GRAPH_LOCK:
                    if self.inflight <= self._low_water or self.cancelling or self.closed:
                        return
                    task = pool.take_locked(TimedKernel)
                    # Waiting is only useful while a kernel runs that is not itself a
                    # dispatcher held back here (such as a plain fork dispatching ops).
                    stuck = task is None and self.running <= self._blocked
                if task is not None:
                    task.runtime._sched.execute(task)  # type: ignore[union-attr]
                    continue
                if stuck:
                    return
                time.sleep(0.0005)
        finally:
            _helping.active = False
            if not on_loop:
                with GRAPH_LOCK:
                    self._blocked -= 1
