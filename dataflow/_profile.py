"""The profiler: records the event stream of a run and explains where the time went.

``with dataflow.profile() as prof:`` (or ``async with``) attaches a :class:`Profiler` to every
runtime (or to one: ``profile(rt)``) for the duration of the block. A profiler is a
:class:`~dataflow.Recorder` (``_record``): the scheduler writes one compact record per task
when it ends, so recording costs two clock reads and a list append per task (measured by
``benchmarks/bench_trace_overhead.py``). Records keep task ids, not tasks (values stay free to
be released). The rest waits for a result to be asked for:

* :meth:`Profiler.export_chrome_trace` writes the timeline for ui.perfetto.dev or
  chrome://tracing (format in ``_tracewrite``);
* :meth:`Profiler.table` is a per-op table of kernel time;
* :meth:`Profiler.summary` is a :class:`Summary`: wall time, busy time per thread, achieved
  parallelism, the critical path, and the time lost to scheduling.

``summarize`` and ``op_table`` (``_summary``) work on a :class:`~dataflow._trace.Trace`, so
``dataflow trace summary out.json`` gives the same figures from a saved file.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, NamedTuple

from ._errors import DataflowError, DataflowTypeError
from ._instrument import add_instrument, remove_instrument
from ._record import END, FAILED, ID, READY, SIG, START, THREAD, Recorder, signature_of
from ._runtime import Runtime
from ._summary import Summary, op_table, summarize
from ._trace import (
    Trace,
)
from ._tracewrite import save

if TYPE_CHECKING:
    from types import TracebackType


__all__ = ["Event", "Profiler", "profile"]


class Event(NamedTuple):
    """One recorded event, as :attr:`Profiler.events` lists them."""

    kind: str  # the hook's name: "task_started", "fork", ...
    ts: int  # time.perf_counter_ns() when it happened
    task: int | str  # the task's id; for forks and waits, the coroutine's or future's name
    thread: int | None  # native id of the thread it happened on, where recorded
    op: str | None  # the task's op, for task_started


class Profiler(Recorder):
    """Records the runtime's tasks between :meth:`start` and :meth:`stop` (a recorder).

    Use :func:`dataflow.profile`::

        with dataflow.profile() as prof:
            dataflow.run(main)
        prof.export_chrome_trace("parallel.json")
        print(prof.summary())

    It records every runtime of the process, or only ``runtime`` when given.
    """

    def __init__(
        self,
        runtime: Runtime | None = None,
        *,
        max_spans: int | None = None,
        max_seconds: float | None = None,
    ) -> None:
        if runtime is not None and not isinstance(runtime, Runtime):
            # (Refused here, at the call: ``start`` would fail at the ``with``, as a bare
            # AttributeError.)
            raise DataflowTypeError(
                f"profile(runtime=): a dataflow.Runtime to record, or None for every runtime "
                f"of the process, got {type(runtime).__name__}: {runtime!r:.80}"
            )
        super().__init__(max_spans=max_spans, max_seconds=max_seconds)
        self._runtime = runtime
        self._started = False
        self._trace: Trace | None = None

    def __repr__(self) -> str:
        state = "new" if not self._started else "stopped" if self.t1 else "recording"
        return f"<Profiler {state} tasks={len(self.tasks)}>"

    # -- lifetime ---------------------------------------------------------------------------

    def start(self) -> None:
        """Attach to the runtime (or to every runtime of the process)."""
        if self._started:
            raise DataflowError(
                "a Profiler records once; use a new one (dataflow.profile()) for another run"
            )
        self._started = True
        self.t0 = time.perf_counter_ns()
        if self._runtime is not None:
            self._runtime.add_instrument(self)
        else:
            add_instrument(self)

    def stop(self) -> None:
        """Detach (idempotent)."""
        if self._started and not self.t1:
            if self._runtime is not None:
                self._runtime.remove_instrument(self)
            else:
                remove_instrument(self)
            self.t1 = time.perf_counter_ns()

    def __enter__(self) -> Profiler:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Profiler:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType
    ) -> None:
        self.stop()

    # -- results ------------------------------------------------------------------------------

    @property
    def events(self) -> list[Event]:
        """The recorded events, by time: each task's ready, start and end, and the forks and
        waits (rebuilt from the span records)."""
        out: list[Event] = []
        for rec in list(self.tasks):
            task_id, thread = rec[ID], rec[THREAD]
            sig = signature_of(rec[SIG])
            op = sig if type(sig) is str else sig.name
            out.append(Event("task_ready", rec[READY], task_id, None, None))
            out.append(Event("task_started", rec[START], task_id, thread, op))
            done = "task_failed" if rec[FAILED] else "task_finished"
            out.append(Event(done, rec[END], task_id, None, None))
        for kind, name, thread, start, end, _ in list(self.spans):
            begin, finish = ("fork", "fork_finished") if kind == "fork" else (
                "wait_started", "wait_finished")  # fmt: skip
            out.append(Event(begin, start, name, thread, None))
            out.append(Event(finish, end, name, None, None))
        out.sort(key=lambda e: e.ts)
        return out

    def trace(self) -> Trace:
        """The recorded run as a :class:`~dataflow._trace.Trace` (built once stopped)."""
        if self._trace is not None:
            return self._trace
        if not self._started:
            raise DataflowError("this Profiler has not recorded anything: start it first")
        trace = super().trace()
        if self.t1:
            self._trace = trace
        return trace

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write the timeline as Chrome Trace Event JSON (ui.perfetto.dev, chrome://tracing)."""
        save(self.trace(), path)

    def table(self) -> str:
        """Per-op kernel time: count, total, mean, max and share, largest total first."""
        return op_table(self.trace())

    def summary(self) -> Summary:
        """Wall and busy time, parallelism, critical path and scheduling overhead."""
        return summarize(self.trace())


def profile(
    runtime: Runtime | None = None,
    *,
    max_spans: int | None = None,
    max_seconds: float | None = None,
) -> Profiler:
    """A profiler to use as a (sync or async) context manager around the code to record.

    Args:
        runtime: record only this runtime (default: every runtime of the process).
        max_spans, max_seconds: keep only the last spans, or the last seconds (see
            :class:`~dataflow.Recorder`).

    Raises:
        DataflowTypeError: ``runtime`` is not a :class:`~dataflow.Runtime` (or None).

    Example:
        >>> with dataflow.profile() as prof:
        ...     dataflow.run(main, x)
        >>> prof.export_chrome_trace("parallel.json")
        >>> print(prof.table())
    """
    return Profiler(runtime, max_spans=max_spans, max_seconds=max_seconds)


# -- analysis -------------------------------------------------------------------------------
