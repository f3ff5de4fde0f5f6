"""Structured logging of a run, and a progress line: two more consumers of the event stream.

dataflow logs through ``structlog.get_logger("dataflow")`` and never calls
``structlog.configure()``: the application decides where log lines go and how they look (our
CLI configures it for ``dataflow run``; see ``docs/timelines.md``).

* **Task names in user log lines.** A forked task binds its name under :data:`TASK_KEY`
  (``dataflow_task``) with ``structlog.contextvars``, so every line logged inside it carries
  the name when the application's processors include ``merge_contextvars``. Each forked task
  runs in its own copy of the caller's context, so the binding never leaks to the caller. Op
  kernels are not wrapped: the per-op path stays lean.
* :class:`TaskLogger` logs every kernel's start and end at debug level (``--log-tasks``).
* :class:`Progress` keeps a ``tasks done / created`` line up to date on a terminal
  (``--progress``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from structlog.contextvars import bind_contextvars

from ._errors import DataflowTypeError
from ._trace import describe_spec, thread_label

if TYPE_CHECKING:
    from ._task import Task

__all__ = ["TASK_KEY", "Progress", "TaskLogger", "name_plain_fork"]

TASK_KEY = "dataflow_task"
"""The structlog context key under which a forked task's name is bound."""


def name_plain_fork(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a forked plain function so the log lines it emits carry its task's name.

    The wrapper runs as the task's kernel, so the task running it is the thread's current
    one (``_scheduler.running_task``); its name is bound under :data:`TASK_KEY`.
    """

    def forked_plain_function(*args: Any, **kwargs: Any) -> Any:
        task = getattr(_running(), "task", None)  # _scheduler.running_task(), inlined
        if task is not None:
            bind_contextvars(**{TASK_KEY: task.name})
        return fn(*args, **kwargs)

    return forked_plain_function


def _running() -> Any:
    """The scheduler's thread-local record of the task a thread runs, imported on first use
    (``_scheduler`` imports this module): an ``import`` statement per forked call cost more
    than the rest of its wrapper."""
    global _running_local
    if _running_local is None:
        from ._scheduler._execution import _running as local

        _running_local = local
    return _running_local


_running_local: Any = None


class TaskLogger:
    """An instrument that logs each kernel's start and end through the ``dataflow`` logger.

    Lines are at debug level, with ``task``, ``op``, ``thread``, the output ``shape`` and
    ``dtype`` (``shapes``/``dtypes`` for ops with several outputs) and, at the end,
    ``duration_ms``. A failure is ``task failed`` with ``task``, ``op``, ``thread``, ``error``,
    ``ran`` and ``duration_ms`` (``None`` when its kernel never started).
    ``dataflow run --log-tasks`` attaches one; in code::

        dataflow.add_instrument(dataflow.TaskLogger())

    Args:
        logger: a structlog logger to use instead of ``structlog.get_logger("dataflow")``.
    """

    def __init__(self, logger: Any = None) -> None:
        if logger is None:
            from ._log import logger as default

            logger = default
        elif isinstance(logger, logging.Logger):
            # (Its methods take no keyword fields: the first task would raise, and the
            # instrument be switched off.)
            raise DataflowTypeError(
                f"TaskLogger(logger): {logger!r} is a standard library logger, whose methods "
                "take no keyword fields; pass a structlog logger, e.g. "
                f"structlog.wrap_logger(logging.getLogger({logger.name!r}), "
                "wrapper_class=structlog.stdlib.BoundLogger), or None for dataflow's own"
            )
        self._log = logger
        self._starts: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"<TaskLogger running={len(self._starts)}>"

    def _on(self) -> bool:
        """Whether the logger emits debug lines now (building a dropped event costs more
        than the task it describes; structlog's filtering loggers say so cheaply)."""
        check = getattr(self._log, "is_enabled_for", None)
        return True if check is None else bool(check(logging.DEBUG))

    def task_started(self, ts: int, task: Task) -> None:
        """Log a kernel's start (``task started``)."""
        if not self._on():
            return
        self._starts[task.id] = ts
        self._log.debug(
            "task started",
            task=task.name,
            op=task.op,
            thread=thread_label(),
            **describe_spec(task.spec),
        )

    def task_finished(self, ts: int, task: Task) -> None:
        """Log a kernel's end (``task finished``, with ``duration_ms``)."""
        start = self._starts.pop(task.id, None)
        if not self._on():
            return
        self._log.debug(
            "task finished",
            task=task.name,
            op=task.op,
            thread=thread_label(),
            duration_ms=None if start is None else round((ts - start) / 1e6, 3),
            **describe_spec(task.spec),
        )

    def task_failed(self, ts: int, task: Task) -> None:
        """Log a task's failure (``task failed``, with ``error`` and ``ran``: if it started)."""
        start = self._starts.pop(task.id, None)
        if not self._on():
            return
        self._log.debug(
            "task failed",
            task=task.name,
            op=task.op,
            thread=thread_label(),
            ran=start is not None,
            duration_ms=None if start is None else round((ts - start) / 1e6, 3),
            error=str(task.error),
        )


class Progress:
    """An instrument that shows ``dataflow: <done>/<created> tasks done`` on a terminal.

    The line is redrawn at most every ``interval`` seconds (by whichever thread reports a
    finished task) and once more, with a newline, by :meth:`close`.

    Args:
        stream: where to draw (normally ``sys.stderr``; should be a terminal).
        interval: the least time between two redraws, in seconds.
    """

    def __init__(self, stream: TextIO, interval: float = 0.1) -> None:
        self._stream = stream
        self._interval = int(interval * 1e9)
        self._lock = threading.Lock()
        self._next = 0
        self.created = 0
        self.done = 0
        self.failed = 0

    def __repr__(self) -> str:
        return f"<Progress done={self.done} created={self.created} failed={self.failed}>"

    def task_created(self, ts: int, task: Task) -> None:
        with self._lock:
            self.created += 1

    def task_finished(self, ts: int, task: Task) -> None:
        self._finished(ts, 0)

    def task_failed(self, ts: int, task: Task) -> None:
        self._finished(ts, 1)

    def task_cancelled(self, ts: int, task: Task) -> None:
        self._finished(ts, 1)

    def _finished(self, ts: int, failed: int) -> None:
        with self._lock:
            self.done += 1
            self.failed += failed
            if ts >= self._next:
                self._next = ts + self._interval
                self._draw("")

    def _draw(self, end: str) -> None:
        failed = f", {self.failed} failed or cancelled" if self.failed else ""
        # \r returns to the line's start; ESC [K clears what a longer previous line left.
        self._stream.write(f"\r\x1b[Kdataflow: {self.done}/{self.created} tasks done{failed}{end}")
        self._stream.flush()

    def close(self) -> None:
        """Draw the final counts and end the line."""
        with self._lock:
            self._draw("\n")
