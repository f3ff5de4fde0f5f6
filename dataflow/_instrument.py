"""Observing runs: instruments (hooks) and span recorders, per runtime or process-wide.

Two kinds of observers, attached to a *scope*, a runtime (``rt.add_instrument(x)``) or the
whole process (``dataflow.add_instrument(x)``, seen by every runtime):

* an **instrument** is any object with some of the hook methods of :class:`Instrument`
  (modelled on trio's): the runtime calls each hook it defines, with a monotonic timestamp in
  nanoseconds, on the thread where the event happens;
* a **recorder** (``dataflow.Recorder``, and the profiler built on it) gets one compact span
  record per task when the task ends, written by the scheduler itself: no hook call per
  event, which is what keeps a profile cheap enough to leave on (``_record``).

When nothing observes a runtime, its hot path pays one truthiness test of :data:`ACTIVE` (the
process scope) and one of its own scope. An observer whose hook raises, whatever it raises
(``KeyboardInterrupt`` included), is switched off in the scope it was attached to and
reported once (a ``RuntimeWarning``, or a log line when warnings are errors); the run goes on.
No observer can stop a worker thread or leave a task unfinished. An observer attached to the
process and to a runtime too sees each of that runtime's events once, and one that raises
there is switched off in both (the runtime's scheduler dedups them: ``_scheduler._base``).

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
from typing import TYPE_CHECKING, Any

from ._errors import DataflowTypeError, describe

if TYPE_CHECKING:
    from ._task import Task

__all__ = [
    "ACTIVE",
    "GENERATION",
    "HOOKED",
    "PROCESS",
    "Instrument",
    "Scope",
    "add_instrument",
    "emit",
    "remove_instrument",
    "sync_process",
]

_HOOKS = (
    "task_created",
    "task_ready",
    "task_started",
    "task_finished",
    "task_failed",
    "task_cancelled",
    "fork",
    "fork_finished",
    "wait_started",
    "wait_finished",
)


class Instrument:
    """Base class with every hook as a no-op; subclass and override what you need."""

    def task_created(self, ts: int, task: Task) -> None:
        """An op or forked function entered the graph."""

    def task_ready(self, ts: int, task: Task) -> None:
        """A task's inputs are all done: it is queued."""

    def task_started(self, ts: int, task: Task) -> None:
        """A task's kernel starts on the current thread."""

    def task_finished(self, ts: int, task: Task) -> None:
        """A task's kernel returned."""

    def task_failed(self, ts: int, task: Task) -> None:
        """A task failed: its kernel raised, or an input failed."""

    def task_cancelled(self, ts: int, task: Task) -> None:
        """A task was cancelled before it ran."""

    def fork(self, ts: int, name: str, parent: str | None) -> None:
        """An ``async def`` task was forked."""

    def fork_finished(self, ts: int, name: str) -> None:
        """A forked ``async def`` task ended."""

    def wait_started(self, ts: int, name: str) -> None:
        """A coroutine suspended waiting for a future."""

    def wait_finished(self, ts: int, name: str) -> None:
        """A waiting coroutine resumed."""


def _is_recorder(obj: Any) -> bool:
    from ._record import Recorder

    return isinstance(obj, Recorder)


class Scope:
    """The observers of one scope: a runtime, or the process (:data:`PROCESS`).

    ``recorders`` get span records (``_record``); ``instruments`` get hook calls. ``hooks``
    caches, per hook name, the bound methods to call, so emitting costs no getattr.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.instruments: list[Any] = []
        self.recorders: list[Any] = []
        self._hooks: dict[str, tuple[tuple[Any, Any], ...]] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.instruments or self.recorders)

    @property
    def hooked(self) -> bool:
        """Whether an instrument (hook calls) observes this scope, not only recorders."""
        return bool(self.instruments)

    def __repr__(self) -> str:
        return (
            f"<observers of {self.name}: {len(self.instruments)} instrument(s), "
            f"{len(self.recorders)} recorder(s)>"
        )

    def add(self, observer: Any) -> None:
        """Attach an instrument or a recorder (once)."""
        check_observer(observer)
        if _is_recorder(observer):
            with self._lock:
                if observer not in self.recorders:
                    self.recorders = [*self.recorders, observer]
                GENERATION[0] += 1
            return
        with self._lock:
            if observer not in self.instruments:
                self.instruments = [*self.instruments, observer]
                self._hooks = {}
            GENERATION[0] += 1

    def remove(self, observer: Any) -> bool:
        """Detach an observer; a no-op when it is not attached. Returns whether it was."""
        with self._lock:
            found = False
            if any(r is observer for r in self.recorders):
                self.recorders = [r for r in self.recorders if r is not observer]
                found = True
            if any(i is observer for i in self.instruments):
                self.instruments = [i for i in self.instruments if i is not observer]
                self._hooks = {}
                found = True
            GENERATION[0] += 1
            return found

    def methods(self, hook: str) -> tuple[tuple[Any, Any], ...]:
        """(instrument, bound method) for each instrument that defines ``hook``."""
        found = self._hooks.get(hook)
        if found is None:
            base = getattr(Instrument, hook, None)
            pairs = []
            for inst in self.instruments:
                method = getattr(inst, hook, None)
                # Skip Instrument's own no-op hooks: a subclass pays only for what it overrides.
                if callable(method) and getattr(method, "__func__", None) is not base:
                    pairs.append((inst, method))
            found = self._hooks[hook] = tuple(pairs)
        return found

    def emit_at(self, ts: int, hook: str, *args: Any) -> None:
        """Call ``hook(ts, *args)`` on every instrument of this scope that defines it."""
        for inst, method in self.methods(hook):
            try:
                method(ts, *args)
            except BaseException as exc:  # no observer may break a run
                self.disable(inst, hook, exc)

    def disable(self, observer: Any, hook: str, exc: BaseException) -> None:
        """Switch off an observer that raised, and say so once; nothing here may raise."""
        try:
            removed = self.remove(observer)
            if self is PROCESS:
                sync_process()
            if not removed:  # another thread's call of the hook raised too, and said so
                return
            try:
                shown = repr(observer)
            except BaseException:  # its __repr__ may raise too
                shown = f"<{type(observer).__name__} object>"
            message = (
                f"dataflow: observer {shown:.100} raised in {hook}() and was removed from "
                f"{self.name}: {describe(exc)}"
            )
            try:
                warnings.warn(message, RuntimeWarning, stacklevel=3)
            except BaseException:  # warnings may be errors (-W error)
                from ._log import logger

                logger.error(message)
        except BaseException:  # the run goes on regardless
            pass


#: The process scope: observers every runtime reports to.
PROCESS = Scope("every runtime")

#: Non-empty while the process scope observes anything: hot paths test ``if ACTIVE:``.
ACTIVE: list[Scope] = []

#: Bumped whenever any scope gains or loses an observer: runtimes cache their recorders by it.
GENERATION = [0]

#: Non-empty while the process scope has an instrument (hook calls), not only recorders: a
#: task observed by recorders alone takes the lean inline path plus one span record.
HOOKED: list[Scope] = []


def sync_process() -> None:
    if PROCESS:
        if not ACTIVE:
            ACTIVE.append(PROCESS)
    else:
        ACTIVE.clear()
    if PROCESS.hooked:
        if not HOOKED:
            HOOKED.append(PROCESS)
    else:
        HOOKED.clear()


def check_observer(observer: Any) -> None:
    """Refuse what cannot observe a runtime, at the call that attaches it: a class rather
    than an instance (its hooks would miss ``self`` at the first event), or an object with
    none of the hook methods."""
    if isinstance(observer, type):
        raise DataflowTypeError(
            f"add_instrument(): got the class {observer.__qualname__}, not an instance: "
            f"pass {observer.__qualname__}() (an observer is an object with hook methods)"
        )
    if not _is_recorder(observer) and not any(callable(getattr(observer, h, None)) for h in _HOOKS):
        raise DataflowTypeError(
            f"add_instrument(): {observer!r:.80} has none of the hook methods "
            f"({', '.join(_HOOKS)}); subclass dataflow.Instrument, or pass a "
            "dataflow.Recorder"
        )


def add_instrument(observer: Any) -> None:
    """Attach an instrument or a :class:`~dataflow.Recorder` to every runtime of the process.

    To observe one runtime only, use ``runtime.add_instrument(observer)``.
    """
    PROCESS.add(observer)
    sync_process()


def remove_instrument(observer: Any) -> None:
    """Detach an instrument or recorder from the process; a no-op when it is not attached."""
    PROCESS.remove(observer)
    sync_process()


def emit(hook: str, *args: Any) -> None:
    """Call ``hook(ts, *args)`` on the process scope's instruments (and fix ACTIVE if one
    was switched off)."""
    methods = PROCESS.methods(hook)
    if not methods:
        return
    ts = time.perf_counter_ns()
    for inst, method in methods:
        try:
            method(ts, *args)
        except BaseException as exc:  # no observer may break a run
            PROCESS.disable(inst, hook, exc)
