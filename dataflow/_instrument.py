"""The one event stream of the runtime, and the instruments that consume it.

Modelled on trio's instruments: an instrument is any object with some of the hook methods of
:class:`Instrument`; the runtime calls each hook an instrument defines, with a monotonic
timestamp in nanoseconds. When no instrument is attached the hot path pays one truthiness test
of :data:`ACTIVE`. An instrument whose hook raises is removed with a warning and the run goes on.

Events (hook names):

* ``task_created(ts, task)``: an op or forked plain function entered the graph (on the
  thread that called it); ``task.inputs`` holds the tasks it reads.
* ``task_ready(ts, task)``: all its inputs are done; it is queued for a thread.
* ``task_started(ts, task)`` / ``task_finished(ts, task)`` / ``task_failed(ts, task)``: on
  the thread that runs the kernel (a pool worker, or the caller for inline ops).
* ``task_cancelled(ts, task)``: cancelled before it ran.
* ``fork(ts, name, parent)`` / ``fork_finished(ts, name)``: an ``async def`` task was forked
  and later ended (on the loop thread).
* ``wait_started(ts, name)`` / ``wait_finished(ts, name)``: a coroutine suspended in
  :func:`dataflow.wait` on a future that was not ready, and resumed.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

from ._errors import describe

__all__ = ["ACTIVE", "Instrument", "add_instrument", "emit", "remove_instrument"]

# The attached instruments. Hot paths test `if ACTIVE:` before building any event.
ACTIVE: list[Any] = []
_lock = threading.Lock()


class Instrument:
    """Base class with every hook as a no-op; subclass and override what you need."""

    def task_created(self, ts: int, task: Any) -> None:
        """An op or forked function entered the graph."""

    def task_ready(self, ts: int, task: Any) -> None:
        """A task's inputs are all done: it is queued."""

    def task_started(self, ts: int, task: Any) -> None:
        """A task's kernel starts on the current thread."""

    def task_finished(self, ts: int, task: Any) -> None:
        """A task's kernel returned."""

    def task_failed(self, ts: int, task: Any) -> None:
        """A task failed: its kernel raised, or an input failed."""

    def task_cancelled(self, ts: int, task: Any) -> None:
        """A task was cancelled before it ran."""

    def fork(self, ts: int, name: str, parent: str | None) -> None:
        """An ``async def`` task was forked."""

    def fork_finished(self, ts: int, name: str) -> None:
        """A forked ``async def`` task ended."""

    def wait_started(self, ts: int, name: str) -> None:
        """A coroutine suspended waiting for a future."""

    def wait_finished(self, ts: int, name: str) -> None:
        """A waiting coroutine resumed."""


# hook name -> ((instrument, bound method), ...), built on first use and dropped whenever the
# set of instruments changes, so emitting an event costs no getattr and no copying.
_hooks: dict[str, tuple[tuple[Any, Any], ...]] = {}


def _methods(hook: str) -> tuple[tuple[Any, Any], ...]:
    found = _hooks.get(hook)
    if found is None:
        base = getattr(Instrument, hook, None)
        pairs = []
        for inst in tuple(ACTIVE):
            method = getattr(inst, hook, None)
            # Skip Instrument's own no-op hooks: a subclass pays only for what it overrides.
            if method is not None and getattr(type(inst), hook, None) is not base:
                pairs.append((inst, method))
        found = _hooks[hook] = tuple(pairs)
    return found


def add_instrument(instrument: Any) -> None:
    """Attach an instrument to every runtime of the process."""
    with _lock:
        if instrument not in ACTIVE:
            ACTIVE.append(instrument)
            _hooks.clear()


def remove_instrument(instrument: Any) -> None:
    """Detach an instrument; a no-op when it is not attached."""
    with _lock:
        if instrument in ACTIVE:
            ACTIVE.remove(instrument)
            _hooks.clear()


def emit(hook: str, *args: Any) -> None:
    """Call ``hook(ts, *args)`` on every instrument that defines it."""
    methods = _hooks.get(hook)
    if methods is None:
        methods = _methods(hook)
    if not methods:
        return
    ts = time.perf_counter_ns()
    for inst, method in methods:
        try:
            method(ts, *args)
        except Exception as exc:
            _disable(inst, hook, exc)


def _disable(inst: Any, hook: str, exc: Exception) -> None:
    # emit() runs inside the scheduler (on pool threads, under its lock): nothing here may
    # raise, not even the warning when warnings are errors (-W error), nor the log line.
    remove_instrument(inst)
    message = f"dataflow: instrument {inst!r} raised in {hook}() and was removed: {describe(exc)}"
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    except Exception:
        try:
            from ._log import logger

            logger.error(message)
        except Exception:
            pass
