"""What a trace says: the summary of a run (:class:`Summary`) and the per-op table.

Both read a :class:`~dataflow._trace.Trace` only, whether a :class:`~dataflow.Profiler` just
recorded it or ``dataflow trace summary out.json`` loaded it from a file, so a live profile
and a saved one give the same figures. :func:`summarize` gives wall time, busy time per
thread, achieved parallelism, the critical path and the time lost to scheduling;
:func:`op_table` the kernel time per op. The text helpers (``format_seconds``,
``threads_text``) are shared with the SVG renderer (``_render``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._trace import TaskSpan, Trace, alive_bytes, is_loop_lane, lanes

__all__ = [
    "Summary",
    "active_span",
    "critical_path",
    "format_seconds",
    "op_stats",
    "op_table",
    "summarize",
    "threads_text",
]


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
        peak_alive_bytes: the most bytes of task outputs alive at once, each counted from the
            end of its task to the end of its last reader (see
            :func:`~dataflow._trace.alive_bytes`; also a ``memory`` counter in the trace).
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
    peak_alive_bytes: int = 0

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
        if self.peak_alive_bytes:
            lines.append(
                f"memory          peak {self.peak_alive_bytes / 2**20:.1f} MiB of task outputs "
                "alive (each from its task's end to its last reader's end)"
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
    seen: set[str] = set()
    cursor: str | None = last
    # (A trace dataflow writes names each task once; a file that repeats a name, merged or
    # made by hand, can link the chain back on itself: the walk stops at a name seen.)
    while cursor is not None and cursor not in seen:
        seen.add(cursor)
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
        peak_alive_bytes=max((b for _, b in alive_bytes(trace)), default=0),
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
