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

from .._instrument import _disable, _methods
from .._task import Task

__all__ = ["Relay", "emit_at"]


class Relay:
    """Emits worker-side kernel spans to the instruments, one relay thread per worker thread.

    Instruments attribute an event to the thread that emits it (``threading.get_native_id``),
    so each remote thread gets a local stand-in named after it; see the module docstring.
    """

    def __init__(self) -> None:
        self._threads: dict[tuple[str, int], tuple[threading.Thread, queue.SimpleQueue[Any]]] = {}

    def put(self, where: tuple[str, int], name: str, events: list[tuple[str, int, Task]]) -> None:
        entry = self._threads.get(where)
        if entry is None:
            q: queue.SimpleQueue[Any] = queue.SimpleQueue()
            t = threading.Thread(target=self._run, args=(q,), name=name, daemon=True)
            t.start()
            entry = self._threads[where] = (t, q)
        entry[1].put(events)

    @staticmethod
    def _run(q: queue.SimpleQueue[Any]) -> None:
        while True:
            events = q.get()
            if events is None:
                return
            for hook, ts, task in events:
                emit_at(ts, hook, task)
            events[0][2].inputs = ()  # the profiler has read them: release the input values

    def close(self) -> None:
        for _, q in self._threads.values():
            q.put(None)
        for t, _ in self._threads.values():
            t.join()
        self._threads.clear()


def emit_at(ts: int, hook: str, *args: Any) -> None:
    """``emit`` with a given timestamp (an event that happened elsewhere, reported late)."""
    for inst, method in _methods(hook):
        try:
            method(ts, *args)
        except Exception as exc:
            _disable(inst, hook, exc)
