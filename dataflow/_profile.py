"""The profiler: records the event stream of a run and explains where the time went.

``with dataflow.profile() as prof:`` (or ``async with``) attaches a :class:`Profiler` to the
event stream (see ``_instrument``) for the duration of the block. Recording is kept cheap, as
measured by ``benchmarks/bench_trace_overhead.py``: each hook extends one flat list by a record
(kind, timestamp, task id; for a kernel start also its thread, op, spec, flops, bytes and its
inputs' ids). The list keeps no tuple per event and no Cost (the garbage collector would scan
each one), no task (values stay free to be released), and task ids rather than names (a name
is formatted on each access; names are rebuilt as ``op#id`` when the trace is built). The
thread's native id is cached per thread: reading it is a system call. The rest waits for a
result to be asked for:

* :meth:`Profiler.export_chrome_trace` writes the timeline for ui.perfetto.dev or
  chrome://tracing (format in ``_trace``);
* :meth:`Profiler.table` is a per-op table of kernel time;
* :meth:`Profiler.summary` is a :class:`Summary`: wall time, busy time per thread, achieved
  parallelism, the critical path, and the time lost to scheduling.

``summarize`` and ``op_table`` work on a :class:`~dataflow._trace.Trace`, so ``dataflow trace
summary out.json`` gives the same figures from a saved file.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from ._errors import DataflowError
from ._instrument import add_instrument, remove_instrument
from ._trace import (
    Span,
    TaskSpan,
    Trace,
    describe_spec,
    is_loop_lane,
    lanes,
    save,
    thread_label,
)

if TYPE_CHECKING:
    from types import TracebackType

    from ._task import Task

__all__ = [
    "Event",
    "Profiler",
    "Summary",
    "active_span",
    "critical_path",
    "format_seconds",
    "op_stats",
    "op_table",
    "profile",
    "summarize",
    "threads_text",
]

# Record kinds (the first item of each record), named after the hooks, and record lengths:
#   READY, FINISHED, FAILED, CANCELLED: kind, ts, task id
#   STARTED: kind, ts, task id, thread, op, spec, flops, bytes, input ids (or None)
#   FORK_END, WAIT_END: kind, ts, name
#   FORK: kind, ts, name, thread, parent          WAIT: kind, ts, name, thread
_READY, _STARTED, _FINISHED, _FAILED, _CANCELLED, _FORK, _FORK_END, _WAIT, _WAIT_END = range(9)
_LENGTHS = (3, 9, 3, 3, 3, 5, 3, 4, 3)
_KINDS = (
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


class Event(NamedTuple):
    """One recorded event, as :attr:`Profiler.events` lists them."""

    kind: str  # the hook's name: "task_started", "fork", ...
    ts: int  # time.perf_counter_ns() when it happened
    task: int | str  # the task's id; for forks and waits, the coroutine's or future's name
    thread: int | None  # native id of the thread it happened on, where recorded
    op: str | None  # the task's op, for task_started


class Profiler:
    """Records the runtime's events between :meth:`start` and :meth:`stop`.

    Use :func:`dataflow.profile`::

        with dataflow.profile() as prof:
            dataflow.run(main)
        prof.export_chrome_trace("parallel.json")
        print(prof.summary())

    It records every runtime of the process while active (instruments are process-wide).
    """

    # Deliberately not a subclass of Instrument: the runtime only calls hooks an instrument
    # defines, and this one does not need task_created (a kernel start carries everything).

    def __init__(self) -> None:
        # Records laid end to end (see _LENGTHS). One list.extend per event: atomic under the
        # GIL, so records from different threads never interleave.
        self._raw: list[Any] = []
        self._add = self._raw.extend
        self._local = threading.local()  # .tid: the thread's native id, once looked up
        self._threads: dict[int, str] = {}
        self._t0 = 0
        self._t1 = 0
        self._trace: Trace | None = None

    def __repr__(self) -> str:
        state = "new" if not self._t0 else "stopped" if self._t1 else "recording"
        return f"<Profiler {state} events={len(_records(list(self._raw)))}>"

    # -- lifetime ---------------------------------------------------------------------------

    def start(self) -> None:
        """Attach to the event stream."""
        if self._t0:
            raise DataflowError(
                "a Profiler records once; use a new one (dataflow.profile()) for another run"
            )
        self._t0 = time.perf_counter_ns()
        add_instrument(self)

    def stop(self) -> None:
        """Detach from the event stream (idempotent)."""
        if self._t0 and not self._t1:
            remove_instrument(self)
            self._t1 = time.perf_counter_ns()

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

    # -- hooks (called on the thread where the event happens; keep them short) -------------------

    def task_ready(self, ts: int, task: Task) -> None:
        self._add((_READY, ts, task.id))

    def task_started(self, ts: int, task: Task) -> None:
        try:
            tid = self._local.tid
        except AttributeError:
            tid = self._register_thread()
        inputs = task.inputs
        ids = [t.id for t in inputs] if inputs else None
        # The cost's two floats, not the Cost: a tuple kept alive per task costs GC time.
        cost = task.cost
        if cost is None:
            self._add((_STARTED, ts, task.id, tid, task.op, task.spec, None, None, ids))
        else:
            self._add((_STARTED, ts, task.id, tid, task.op, task.spec, cost[0], cost[1], ids))

    def task_finished(self, ts: int, task: Task) -> None:
        self._add((_FINISHED, ts, task.id))

    def task_failed(self, ts: int, task: Task) -> None:
        self._add((_FAILED, ts, task.id))

    def task_cancelled(self, ts: int, task: Task) -> None:
        self._add((_CANCELLED, ts, task.id))

    def fork(self, ts: int, name: str, parent: str | None) -> None:
        try:
            tid = self._local.tid
        except AttributeError:
            tid = self._register_thread()
        self._add((_FORK, ts, name, tid, parent))

    def fork_finished(self, ts: int, name: str) -> None:
        self._add((_FORK_END, ts, name))

    def wait_started(self, ts: int, name: str) -> None:
        try:
            tid = self._local.tid
        except AttributeError:
            tid = self._register_thread()
        self._add((_WAIT, ts, name, tid))

    def wait_finished(self, ts: int, name: str) -> None:
        self._add((_WAIT_END, ts, name))

    def _register_thread(self) -> int:
        tid = threading.get_native_id()
        label = thread_label()
        if label == "loop" and "loop" in self._threads.values():  # a second event loop
            label = f"loop ({threading.current_thread().name})"
        self._threads[tid] = label
        self._local.tid = tid
        return tid

    # -- results ------------------------------------------------------------------------------

    @property
    def events(self) -> list[Event]:
        """The recorded events in the order they were recorded."""
        out = []
        for rec in _records(list(self._raw)):
            kind = rec[0]
            thread = rec[3] if kind in (_STARTED, _FORK, _WAIT) else None
            op = rec[4] if kind == _STARTED else None
            out.append(Event(_KINDS[kind], rec[1], rec[2], thread, op))
        return out

    def trace(self) -> Trace:
        """The recorded run as a :class:`~dataflow._trace.Trace` (built once stopped)."""
        if self._trace is not None:
            return self._trace
        if not self._t0:
            raise DataflowError("this Profiler has not recorded anything: start it first")
        trace = _build(_records(list(self._raw)), dict(self._threads), self._t0, self._t1)
        if self._t1:
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


def profile() -> Profiler:
    """A profiler to use as a (sync or async) context manager around the code to record.

    Example:
        >>> with dataflow.profile() as prof:
        ...     dataflow.run(main, x)
        >>> prof.export_chrome_trace("parallel.json")
        >>> print(prof.table())
    """
    return Profiler()


def _records(raw: list[Any]) -> list[tuple[Any, ...]]:
    """Cut the flat record list into one tuple per record."""
    out = []
    i, n = 0, len(raw)
    while i < n:
        size = _LENGTHS[raw[i]]
        out.append(tuple(raw[i : i + size]))
        i += size
    return out


def _build(raw: list[tuple[Any, ...]], threads: dict[int, str], t0: int, t1: int) -> Trace:
    """Turn recorded tuples into task spans; corrects for events reported slightly late."""
    stop = (t1 or time.perf_counter_ns()) - t0
    ready: dict[int, int] = {}
    for rec in raw:
        if rec[0] == _READY:
            ready.setdefault(rec[2], rec[1] - t0)
    tasks: dict[int, TaskSpan] = {}
    input_ids: dict[int, list[int]] = {}
    forks: dict[str, tuple[int, int, str | None]] = {}
    waits: dict[str, list[tuple[int, int]]] = {}
    spans: list[Span] = []
    unrun_failed = unrun_cancelled = 0
    for rec in raw:
        kind, ts = rec[0], rec[1] - t0
        if kind == _STARTED:
            _, _, task_id, tid, op, spec, flops, nbytes, inputs = rec
            args = describe_spec(spec)
            if flops is not None:
                args["flops"] = flops
                args["bytes"] = nbytes
            # Task names are "op#id" (see Task.__init__).
            tasks[task_id] = TaskSpan(
                f"{op}#{task_id}", op, tid, ts, -1, ready.get(task_id, ts), (), args
            )
            if inputs:
                input_ids[task_id] = inputs
        elif kind in (_FINISHED, _FAILED):
            span = tasks.get(rec[2])
            if span is not None and span.end < 0:
                span.end = ts
                span.failed = kind == _FAILED
            elif span is None and kind == _FAILED:
                unrun_failed += 1  # an input failed: it never ran
        elif kind == _CANCELLED:
            unrun_cancelled += 1
        elif kind == _FORK:
            forks[rec[2]] = (ts, rec[3], rec[4])
        elif kind == _FORK_END:
            began = forks.pop(rec[2], None)
            if began is not None:
                spans.append(Span("fork", rec[2], began[1], began[0], ts, began[2]))
        elif kind == _WAIT:
            waits.setdefault(rec[2], []).append((ts, rec[3]))
        elif kind == _WAIT_END:
            pending = waits.get(rec[2])
            if pending:
                began_at, tid = pending.pop(0)
                spans.append(Span("wait", rec[2], tid, began_at, ts))
    for name, (ts, tid, parent) in forks.items():  # still running when profiling stopped
        spans.append(Span("fork", name, tid, ts, stop, parent))
    for name, pending in waits.items():
        spans.extend(Span("wait", name, tid, ts, stop) for ts, tid in pending)
    for task_id, ids in input_ids.items():  # inputs that ran before profiling have no op
        tasks[task_id].inputs = tuple(tasks[i].name if i in tasks else f"?#{i}" for i in ids)
    for span in tasks.values():
        if span.end < 0:  # still running when profiling stopped
            span.end = stop
            span.args["unfinished"] = True
    # A kernel's end and a task's readiness are reported just after the runtime publishes
    # them, so a dependent can be seen starting a few ns before its input's end, or before it
    # was reported ready. Clamp those, so every dependency edge points forward in time.
    for task_id, span in tasks.items():
        span.ready = min(span.ready, span.start)
        for src_id in input_ids.get(task_id, ()):
            src = tasks.get(src_id)
            if src is not None and src.end > span.start:
                src.end = max(src.start, span.start)
    ordered = sorted(tasks.values(), key=lambda t: (t.start, t.id))
    return Trace(
        tasks=ordered,
        threads=threads,
        spans=sorted(spans, key=lambda s: s.start),
        wall=max([stop] + [t.end for t in ordered]),
        pid=os.getpid(),
        unrun_failed=unrun_failed,
        unrun_cancelled=unrun_cancelled,
    )


# -- analysis -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """Where the time of a profiled run went. ``str(summary)`` is a readable report.

    Attributes:
        wall_s: the time the graph ran: from the first task's readiness to the last task's end
            (setup before the first op, such as imports and loading data, is left out).
        profiled_s: the whole profiled interval.
        busy_s: kernel time per lane (nested kernels counted once), by lane name: a lane is a
            thread name, shared by same-named threads that never ran at the same time (each
            ``dataflow.run`` starts its pool's ``interop-N`` workers again; see
            :func:`~dataflow._trace.lanes`).
        threads: how many lanes ran kernels (the event loop's included).
        pool_threads: of those, the lanes that are not an event loop's: the inter-op pool's
            threads (or a Dask cluster's).
        parallelism: total busy time / wall time: how many threads were busy on average.
        tasks: kernels that ran; ``failed`` of them raised.
        unrun: tasks that never ran (an input failed, or they were cancelled).
        critical_path_s: the longest chain of dependent kernels, by kernel time: no schedule
            can finish the run faster, with any number of threads.
        critical_path: the names of the tasks on it, first to last.
        lower_bound_s: ``max(critical_path_s, pool busy / pool_threads, busiest loop)``: the
            kernels that ran on the pool, spread evenly over its threads, and those that ran
            inline on an event loop, one after the other there.
        ready_wait_s: total time tasks spent ready but not yet started (queued for a thread).
        dispatch_s: of that, the time after the thread that ran it was free: the cost of the
            hand-off itself (waking a worker, popping the queue).
        overhead_share: ``dispatch_s / (total busy + dispatch_s)``.
    """

    wall_s: float
    profiled_s: float
    busy_s: dict[str, float]
    threads: int
    parallelism: float
    tasks: int
    failed: int
    unrun: int
    critical_path_s: float
    critical_path: tuple[str, ...]
    lower_bound_s: float
    ready_wait_s: float
    dispatch_s: float
    overhead_share: float
    pool_threads: int = 0

    @property
    def total_busy_s(self) -> float:
        """Kernel time summed over threads."""
        return sum(self.busy_s.values())

    def __str__(self) -> str:
        fs = format_seconds
        wall = self.wall_s or 1e-12
        failed = f", {self.failed} failed" if self.failed else ""
        unrun = f", {self.unrun} never ran" if self.unrun else ""
        lines = [
            f"wall time       {fs(self.wall_s)}  ({self.tasks} tasks{failed}{unrun}; "
            f"{fs(self.profiled_s)} profiled)",
            f"busy            {fs(self.total_busy_s)}  on {threads_text(self)}: "
            f"parallelism {self.parallelism:.2f}",
        ]
        width = max([len(n) for n in self.busy_s] + [8])
        for name, busy in sorted(self.busy_s.items(), key=lambda kv: _thread_key(kv[0])):
            lines.append(f"  {name:<{width}}  {fs(busy):>9}  {100 * busy / wall:5.1f}% of wall")
        path = self.critical_path
        shown = " -> ".join(path if len(path) <= 8 else (*path[:4], "...", *path[-3:]))
        lines.append(
            f"critical path   {fs(self.critical_path_s)}  "
            f"({100 * self.critical_path_s / wall:.0f}% of wall, {len(path)} tasks)"
        )
        if path:
            lines.append(f"  {shown}")
        ratio = self.wall_s / self.lower_bound_s if self.lower_bound_s else 0.0
        lines.append(
            f"lower bound     {fs(self.lower_bound_s)}  = max(critical path, pool busy / "
            f"pool threads, loop busy); wall is {ratio:.2f}x that"
        )
        mean_wait = self.ready_wait_s / self.tasks if self.tasks else 0.0
        lines.append(
            f"scheduling      ready but not started {fs(self.ready_wait_s)} in all "
            f"(mean {fs(mean_wait)}); dispatch {fs(self.dispatch_s)} "
            f"({100 * self.overhead_share:.1f}% of thread time)"
        )
        return "\n".join(lines)


def _thread_key(name: str) -> tuple[int, str]:
    return (0 if is_loop_lane(name) else 1, name)


def threads_text(summary: Summary) -> str:
    """``2 pool threads and the loop``, ``1 pool thread``, ``the loop``, ..."""
    loops = summary.threads - summary.pool_threads
    parts = []
    if summary.pool_threads:
        parts.append(f"{summary.pool_threads} pool thread" + "s" * (summary.pool_threads > 1))
    if loops:
        parts.append("the loop" if loops == 1 else f"{loops} loops")
    return " and ".join(parts) or "no thread"


def format_seconds(s: float) -> str:
    """``1.23 s``, ``45.6 ms``, ``789 us``: three significant digits or so."""
    a = abs(s)
    if a >= 1:
        return f"{s:.2f} s"
    if a >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    if a >= 1e-6:
        return f"{s * 1e6:.1f} us"
    return f"{s * 1e9:.0f} ns" if a else "0 s"


def _union(intervals: list[tuple[int, int]]) -> int:
    """Total length covered by the intervals."""
    total = 0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


def critical_path(tasks: list[TaskSpan]) -> tuple[int, list[str]]:
    """The longest chain of dependent tasks by kernel time: (length in ns, names in order).

    ``tasks`` must be sorted by start: a task starts after its inputs ended, so that order is
    a topological order of the dependency graph.
    """
    best: dict[str, tuple[int, str | None]] = {}
    for t in tasks:
        base, prev = 0, None
        for name in t.inputs:
            found = best.get(name)
            if found is not None and found[0] > base:
                base, prev = found[0], name
        best[t.name] = (base + t.duration, prev)
    if not best:
        return 0, []
    last = max(best, key=lambda n: best[n][0])
    length = best[last][0]
    path: list[str] = []
    cursor: str | None = last
    while cursor is not None:
        path.append(cursor)
        cursor = best[cursor][1]
    path.reverse()
    return length, path


def active_span(trace: Trace) -> tuple[int, int]:
    """(first task's readiness, last task's end) in ns: when the graph was running."""
    if not trace.tasks:
        return 0, 0
    return min(t.ready for t in trace.tasks), max(t.end for t in trace.tasks)


def summarize(trace: Trace) -> Summary:
    """Compute the :class:`Summary` of a trace."""
    lane_of = lanes(trace)
    by_lane: dict[str, list[tuple[int, int]]] = {}
    by_thread: dict[int, list[TaskSpan]] = {}
    for t in trace.tasks:
        by_lane.setdefault(lane_of[t.thread], []).append((t.start, t.end))
        by_thread.setdefault(t.thread, []).append(t)
    busy = {lane: _union(iv) / 1e9 for lane, iv in by_lane.items()}
    total_busy = sum(busy.values())
    pool = {lane: b for lane, b in busy.items() if not is_loop_lane(lane)}
    loop_busy = max((b for lane, b in busy.items() if is_loop_lane(lane)), default=0.0)
    first, last = active_span(trace)
    wall = (last - first) / 1e9
    ready_wait = dispatch = 0
    for spans in by_thread.values():
        free_at: int | None = None  # when this thread finished its previous top-level kernel
        for t in spans:  # sorted by start
            ready_wait += max(0, t.start - t.ready)
            since = t.ready if free_at is None else max(t.ready, free_at)
            dispatch += max(0, t.start - since)
            free_at = t.end if free_at is None else max(free_at, t.end)
    cp_ns, cp_names = critical_path(trace.tasks)
    cp = cp_ns / 1e9
    spread = sum(pool.values()) / len(pool) if pool else 0.0
    dispatch_s = dispatch / 1e9
    return Summary(
        wall_s=wall,
        profiled_s=trace.wall / 1e9,
        busy_s=busy,
        threads=len(busy),
        parallelism=total_busy / wall if wall else 0.0,
        tasks=len(trace.tasks),
        failed=sum(1 for t in trace.tasks if t.failed),
        unrun=trace.unrun_failed + trace.unrun_cancelled,
        critical_path_s=cp,
        critical_path=tuple(cp_names),
        lower_bound_s=max(cp, spread, loop_busy),
        ready_wait_s=ready_wait / 1e9,
        dispatch_s=dispatch_s,
        overhead_share=dispatch_s / (total_busy + dispatch_s) if dispatch_s else 0.0,
        pool_threads=len(pool),
    )


def op_stats(trace: Trace) -> list[tuple[str, int, int, int]]:
    """Per op: (op, count, total ns, max ns), largest total first."""
    stats: dict[str, list[int]] = {}
    for t in trace.tasks:
        s = stats.setdefault(t.op, [0, 0, 0])
        d = t.duration
        s[0] += 1
        s[1] += d
        s[2] = max(s[2], d)
    rows = [(op, s[0], s[1], s[2]) for op, s in stats.items()]
    rows.sort(key=lambda r: (-r[2], r[0]))
    return rows


def op_table(trace: Trace) -> str:
    """The per-op table of :meth:`Profiler.table`."""
    rows = op_stats(trace)
    total = sum(r[2] for r in rows) or 1
    width = max([len(r[0]) for r in rows] + [5])
    fs = format_seconds
    head = f"{'op':<{width}}  {'count':>7}  {'total':>9}  {'mean':>9}  {'max':>9}  {'share':>6}"
    lines = [head, "-" * len(head)]
    for op, count, tot, mx in rows:
        lines.append(
            f"{op:<{width}}  {count:>7}  {fs(tot / 1e9):>9}  {fs(tot / count / 1e9):>9}  "
            f"{fs(mx / 1e9):>9}  {100 * tot / total:5.1f}%"
        )
    n = sum(r[1] for r in rows)
    lines.append("-" * len(head))
    lines.append(f"{'total':<{width}}  {n:>7}  {fs(sum(r[2] for r in rows) / 1e9):>9}")
    return "\n".join(lines)
