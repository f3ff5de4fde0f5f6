"""Kernel spans from Dask workers, replayed to the instruments on the client.

When an instrument is attached at dispatch, the worker records each kernel's start and end
and publishes them (``Worker.log_event``); the client emits ``task_started`` and
``task_finished``/``task_failed`` with those timestamps from a relay thread named after the
worker thread, so a profiler draws one track per worker thread. The clock is the worker's
``time.time_ns()`` mapped onto the client's ``perf_counter_ns``: exact on one machine, off by
the clock skew between machines otherwise.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from .._task import Task

__all__ = ["Relay"]


class Relay:
    """Emits worker-side kernel spans to the instruments, one relay thread per worker thread.

    Instruments attribute an event to the thread that emits it (``threading.get_native_id``),
    so each remote thread gets a local stand-in named after it; see the module docstring.
    """

    def __init__(self) -> None:
        self._threads: dict[tuple[str, int], tuple[threading.Thread, queue.SimpleQueue[Any]]] = {}

    def put(
        self,
        where: tuple[str, int],
        name: str,
        sched: Any,
        task: Task,
        start: int,
        end: int,
        failed: bool,
    ) -> None:
        """Report a worker's kernel span from the stand-in thread of ``where``."""
        entry = self._threads.get(where)
        if entry is None:
            q: queue.SimpleQueue[Any] = queue.SimpleQueue()
            t = threading.Thread(target=self._run, args=(q,), name=name, daemon=True)
            t.start()
            entry = self._threads[where] = (t, q)
        entry[1].put((sched, task, start, end, failed))

    @staticmethod
    def _run(q: queue.SimpleQueue[Any]) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            sched, task, start, end, failed = item
            try:
                sched.emit_at(start, "task_started", task)
                sched.record(task, start, end, failed)  # on this thread: its lane
                sched.emit_at(end, "task_failed" if failed else "task_finished", task)
            finally:
                task.inputs = ()  # the observers have read them: release the input values

    def close(self) -> None:
        for _, q in self._threads.values():
            q.put(None)
        for t, _ in self._threads.values():
            t.join()
        self._threads.clear()
