"""A recorded run as plain data, and its saved form: the Chrome Trace Event format.

:class:`Trace` is what the profiler builds from the event stream and what ``dataflow trace``
loads back from a file, so the summary, the op table and the rendered timeline are computed
the same way from a live profile and from a saved trace. Times are integer nanoseconds from
the trace's origin (the moment profiling started).

The file is the JSON object form of the Chrome Trace Event format (loads in ui.perfetto.dev
and chrome://tracing):

* an ``X`` slice per task run, on its thread's track (``pid`` = process id, ``tid`` = the
  thread's native id; ``ts``/``dur`` in microseconds), with ``args``: op, task, id, output
  shape and dtype, flops, bytes, inputs, and ``queued_us`` (ready-but-not-started time);
* ``M`` metadata: ``process_name``, ``thread_name`` (``loop`` for a thread that runs an event
  loop, ``interop-N`` for pool workers) and ``thread_sort_index``;
* a flow (``s`` then ``f`` with ``bp: "e"``, same ``id``) from each task to each dependent;
* forked coroutines and waits as async slices (``b``/``e`` with an ``id``) on the loop track;
* counters (``C``): tasks running and tasks ready (``running``/``ready``, arg ``tasks``), and
  the bytes of task outputs alive (``memory``, arg ``bytes alive``: see :func:`alive_bytes`);
* ``otherData.dataflow``: the wall time and the tasks that never ran, so a loaded trace gives
  the same summary as the live profile.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._errors import DataflowError

__all__ = [
    "Span",
    "TaskSpan",
    "Trace",
    "describe_spec",
    "is_loop_lane",
    "lanes",
    "load",
    "thread_label",
    "to_chrome",
]

FORMAT_VERSION = 1


@dataclass(slots=True)
class TaskSpan:
    """One task's kernel run (times in ns from the trace's origin)."""

    name: str
    op: str
    thread: int
    start: int
    end: int
    ready: int
    inputs: tuple[str, ...] = ()
    args: dict[str, Any] = field(default_factory=dict)
    failed: bool = False

    @property
    def id(self) -> int:
        """The task id (the number after ``#`` in its name)."""
        tail = self.name.rpartition("#")[2]
        return int(tail) if tail.isdigit() else -1

    @property
    def duration(self) -> int:
        """Kernel time in ns."""
        return self.end - self.start


@dataclass(slots=True)
class Span:
    """A forked coroutine's lifetime or a coroutine's wait on a future (on the loop thread)."""

    kind: str  # "fork" or "wait"
    name: str
    thread: int
    start: int
    end: int
    parent: str | None = None


@dataclass(slots=True)
class Trace:
    """A recorded run: task spans (sorted by start), thread names, fork/wait spans."""

    tasks: list[TaskSpan]
    threads: dict[int, str]
    spans: list[Span] = field(default_factory=list)
    wall: int = 0
    pid: int = 0
    unrun_failed: int = 0
    unrun_cancelled: int = 0

    def __repr__(self) -> str:
        return (
            f"<Trace tasks={len(self.tasks)} threads={len(self.threads)} "
            f"wall={self.wall / 1e9:.6f}s>"
        )


def lanes(trace: Trace) -> dict[int, str]:
    """The timeline lane of each thread that ran tasks: ``{native id: lane name}``.

    A lane is a thread *name*: each ``dataflow.run`` starts its pool's workers again, so a
    script that runs ten times has ten threads named ``interop-0``, one after the other. Those
    that share a name and never overlap in time share its lane; one that overlaps them (two
    pools at once) gets a lane of its own, ``interop-0 (2)``. So the lanes are the threads that
    really ran side by side, and the summary and the picture count the same ones.
    """
    extent: dict[int, list[int]] = {}
    for t in trace.tasks:
        span = extent.setdefault(t.thread, [t.start, t.end])
        span[0] = min(span[0], t.start)
        span[1] = max(span[1], t.end)
    by_name: dict[str, list[int]] = {}
    for tid in sorted(extent, key=lambda tid: extent[tid][0]):
        by_name.setdefault(trace.threads.get(tid, str(tid)), []).append(tid)
    out: dict[int, str] = {}
    for name, tids in by_name.items():
        ends: list[int] = []  # per lane of this name, when its last thread's last task ended
        for tid in tids:
            start, end = extent[tid]
            k = next((k for k, e in enumerate(ends) if e <= start), len(ends))
            if k == len(ends):
                ends.append(end)
            else:
                ends[k] = end
            out[tid] = name if k == 0 else f"{name} ({k + 1})"
    return out


def is_loop_lane(name: str) -> bool:
    """Whether a lane is an event loop's thread (``loop``, ``loop (MainThread)``)."""
    return name == "loop" or name.startswith("loop ")


def thread_label() -> str:
    """The track name of the calling thread: ``loop`` when it runs an event loop, else its name."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return threading.current_thread().name
    return "loop"


def describe_spec(spec: Any) -> dict[str, Any]:
    """JSON-ready output description of an op's spec: shape and dtype when it has them."""
    if spec is None:
        return {}
    if type(spec) is tuple:  # an op with several outputs (a TensorSpec is a NamedTuple)
        parts = [describe_spec(s) for s in spec]
        return {
            "shapes": [p.get("shape") for p in parts],
            "dtypes": [p.get("dtype") for p in parts],
        }
    shape = getattr(spec, "shape", None)
    dtype = getattr(spec, "dtype", None)
    if shape is None and dtype is None:
        return {"spec": repr(spec)}
    out: dict[str, Any] = {}
    if shape is not None:
        out["shape"] = [int(d) for d in shape]
    if dtype is not None:
        out["dtype"] = str(dtype)
    return out


# -- writing ----------------------------------------------------------------------------------


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def _inside(span: TaskSpan, at_end: bool) -> int:
    """A time strictly inside the slice (when it is 2 ns or longer) to bind a flow to it."""
    if span.duration < 2:
        return span.start
    return span.end - 1 if at_end else span.start + 1


def to_chrome(trace: Trace, process_name: str = "dataflow") -> dict[str, Any]:
    """The trace as a Chrome Trace Event JSON object (``{"traceEvents": [...], ...}``)."""
    pid = trace.pid or os.getpid()
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": process_name}}
    ]
    for index, (tid, label) in enumerate(sorted(trace.threads.items(), key=_thread_order)):
        events.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}}
        )
        events.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": index},
            }
        )
    by_name = {t.name: t for t in trace.tasks}
    flow_id = 0
    loop_tid = next((tid for tid, n in trace.threads.items() if n == "loop"), 0)
    for t in trace.tasks:
        args: dict[str, Any] = {"task": t.name, "id": t.id, "op": t.op, **t.args}
        args["inputs"] = list(t.inputs)
        args["queued_us"] = _us(t.start - t.ready)
        if t.failed:
            args["status"] = "failed"
        events.append(
            {
                "name": t.op,
                "cat": "task",
                "ph": "X",
                "pid": pid,
                "tid": t.thread,
                "ts": _us(t.start),
                "dur": _us(t.duration),
                "args": args,
            }
        )
        for src_name in t.inputs:
            src = by_name.get(src_name)
            if src is None:  # ran before profiling started
                continue
            flow_id += 1
            common = {"name": "dependency", "cat": "dependency", "id": flow_id, "pid": pid}
            events.append(
                {**common, "ph": "s", "tid": src.thread, "ts": _us(_inside(src, at_end=True))}
            )
            events.append(
                {**common, "ph": "f", "bp": "e", "tid": t.thread, "ts": _us(_inside(t, False))}
            )
    for async_id, s in enumerate(trace.spans, start=1):
        name = s.name if s.kind == "fork" else f"wait {s.name}"
        common = {"name": name, "cat": s.kind, "id": async_id, "pid": pid, "tid": s.thread}
        begin: dict[str, Any] = {**common, "ph": "b", "ts": _us(s.start)}
        if s.parent is not None:
            begin["args"] = {"parent": s.parent}
        events.append(begin)
        events.append({**common, "ph": "e", "ts": _us(s.end)})
    events.extend(_counters(trace, pid, loop_tid))
    for ts, alive in alive_bytes(trace):
        events.append(
            {
                "name": "memory",
                "ph": "C",
                "pid": pid,
                "tid": loop_tid,
                "ts": _us(ts),
                "args": {"bytes alive": alive},
            }
        )
    # Small keys first: Perfetto's streaming reader wants displayTimeUnit before the events.
    return {
        "displayTimeUnit": "ms",
        "otherData": {
            "dataflow": {
                "version": FORMAT_VERSION,
                "wall_us": _us(trace.wall),
                "unrun_failed": trace.unrun_failed,
                "unrun_cancelled": trace.unrun_cancelled,
            }
        },
        "traceEvents": events,
    }


def _thread_order(item: tuple[int, str]) -> tuple[int, str]:
    name = item[1]
    return (0 if name == "loop" else 1 if name.startswith("loop") else 2, name)


def output_bytes(args: dict[str, Any]) -> int:
    """The bytes of a task's output(s), from its recorded shape(s) and dtype(s) (0 unknown)."""
    shapes = args.get("shapes") or ([args["shape"]] if "shape" in args else [])
    dtypes = args.get("dtypes") or ([args["dtype"]] if "dtype" in args else [])
    total = 0
    for shape, dtype in zip(shapes, dtypes, strict=False):
        if shape is None or dtype is None:
            continue
        try:
            itemsize = np.dtype(dtype).itemsize
        except TypeError:
            continue
        total += math.prod(int(d) for d in shape) * itemsize
    return total


def alive_bytes(trace: Trace) -> list[tuple[int, int]]:
    """``(time, bytes)`` at each change of the bytes of task outputs alive.

    An output counts from the end of the task that made it to the end of the last traced
    task that reads it (to the end of the trace when none does: the program may hold it).
    What the trace cannot see: a value the program keeps after its last reader, inputs and
    weights made before the trace, and views (an output that shares memory with its input
    counts in full). So it is the working set of the graph's intermediates, the part the
    scheduler's order decides: running every input projection first shows up here.
    """
    last_read: dict[str, int] = {}
    for t in trace.tasks:
        for name in t.inputs:
            if t.end > last_read.get(name, -1):
                last_read[name] = t.end
    end_of_trace = max([trace.wall] + [t.end for t in trace.tasks])
    changes: dict[int, int] = {}
    for t in trace.tasks:
        if t.failed:
            continue
        n = output_bytes(t.args)
        if not n:
            continue
        until = max(last_read.get(t.name, end_of_trace), t.end)
        changes[t.end] = changes.get(t.end, 0) + n
        changes[until] = changes.get(until, 0) - n
    out: list[tuple[int, int]] = []
    alive = 0
    for ts in sorted(changes):
        alive += changes[ts]
        out.append((ts, alive))
    return out


def _counters(trace: Trace, pid: int, tid: int) -> list[dict[str, Any]]:
    """``C`` events for the running and ready counts, one per time either changes."""
    changes: dict[int, list[int]] = {}
    for t in trace.tasks:
        for ts, d_run, d_ready in ((t.ready, 0, 1), (t.start, 1, -1), (t.end, -1, 0)):
            c = changes.setdefault(ts, [0, 0])
            c[0] += d_run
            c[1] += d_ready
    out: list[dict[str, Any]] = []
    running = ready = 0
    for ts in sorted(changes):
        d_run, d_ready = changes[ts]
        running += d_run
        ready += d_ready
        # Perfetto names a counter track "<name> <arg>": "running tasks", "ready tasks".
        for name, changed, value in (
            ("running", d_run or not out, running),
            ("ready", d_ready or not out, ready),
        ):
            if changed:
                out.append(
                    {
                        "name": name,
                        "ph": "C",
                        "pid": pid,
                        "tid": tid,
                        "ts": _us(ts),
                        "args": {"tasks": value},
                    }
                )
    return out


def save(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write the trace to ``path`` as Chrome Trace Event JSON."""
    # json.dumps, not json.dump: only the one-shot form uses the C encoder (20x faster).
    text = json.dumps(to_chrome(trace), separators=(",", ":"))
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# -- reading ----------------------------------------------------------------------------------


class TraceFormatError(DataflowError, ValueError):
    """A file is not a Chrome trace this module can read (a ``ValueError`` too)."""


#: How deep a trace's arrays and objects may nest (dataflow writes 4 levels).
MAX_JSON_DEPTH = 64
# Times beyond this many microseconds (about 31 years) are not times.
_MAX_US = 1e15


def load(path: str | os.PathLike[str]) -> Trace:
    """Read a trace written by :func:`save` (or any Chrome trace with ``X`` slices).

    Raises:
        TraceFormatError: the file is not JSON, nests deeper than :data:`MAX_JSON_DEPTH`, or an
            event's field is not what the format says (the message names the event).
        OSError: the file cannot be read.
    """
    source = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except RecursionError:  # deeper than the C parser goes: far beyond the limit
        data = None
        deep = True
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"{source} is not UTF-8 JSON: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{source} is not JSON: {exc}") from exc
    else:
        deep = _too_deep(data)
    if deep:
        raise TraceFormatError(
            f"{source} nests arrays and objects more than {MAX_JSON_DEPTH} deep: not a trace"
        )
    return from_chrome(data, source=source)


def _too_deep(data: Any) -> bool:
    """Whether lists and dicts nest more than MAX_JSON_DEPTH deep (iterative: any depth)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (list, dict)):
            if depth > MAX_JSON_DEPTH:
                return True
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
    return False


class _Fields:
    """Reads one event's fields, refusing values of the wrong kind with the event named."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.event: dict[str, Any] = {}
        self.index = 0
        self.tids: dict[str, int] = {}  # a thread id given as a string: a stand-in int

    def bad(self, key: str, value: Any, expected: str) -> TraceFormatError:
        where = f"event {self.index} (ph {self.event.get('ph')!r:.20}): " if self.index >= 0 else ""
        return TraceFormatError(
            f"{self.source}: {where}{key} must be {expected}, got {value!r:.60}"
        )

    def ns(self, value: Any, key: str) -> int:
        """Microseconds (a finite number) as integer nanoseconds."""
        if type(value) not in (int, float) or not math.isfinite(value) or abs(value) > _MAX_US:
            raise self.bad(key, value, f"a finite number of microseconds (at most {_MAX_US:g})")
        ns: int = round(value * 1000.0)
        return ns

    def time(self, key: str, default: float = 0) -> int:
        return self.ns(self.event.get(key, default), key)

    def tid(self, key: str = "tid") -> int:
        value = self.event.get(key, 0)
        if type(value) is int:
            return value
        if type(value) is str:
            return self.tids.setdefault(value, -1 - len(self.tids))
        raise self.bad(key, value, "an integer or a string")

    def obj(self, key: str) -> dict[str, Any]:
        value = self.event.get(key)
        if value is None:
            return {}
        if type(value) is not dict:
            raise self.bad(key, value, "an object")
        return value

    def count(self, meta: dict[str, Any], key: str) -> int:
        value = meta.get(key, 0)
        if type(value) is not int or value < 0:
            raise TraceFormatError(
                f"{self.source}: otherData.dataflow.{key} must be a non-negative integer, "
                f"got {value!r:.60}"
            )
        return value


def from_chrome(data: Any, source: str = "trace") -> Trace:
    """Rebuild a :class:`Trace` from a Chrome Trace Event JSON object or array.

    Raises:
        TraceFormatError: no event list, or an event field of the wrong kind (named).
    """
    if isinstance(data, dict):
        events = data.get("traceEvents")
        other = data.get("otherData") or {}
    else:
        events, other = data, {}
    if not isinstance(events, list):
        raise TraceFormatError(
            f"{source} has no traceEvents list: expected a Chrome trace such as "
            "`dataflow run --trace out.json script.py` writes"
        )
    meta = other.get("dataflow") if isinstance(other, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    threads: dict[int, str] = {}
    tasks: list[TaskSpan] = []
    opened: dict[tuple[str, Any], tuple[dict[str, Any], int, int]] = {}
    spans: list[Span] = []
    pid = 0
    read = _Fields(source)
    for index, ev in enumerate(events):
        if not isinstance(ev, dict):
            continue
        read.event, read.index = ev, index
        ph = ev.get("ph")
        if ph == "M" and ev.get("name") == "thread_name":
            threads[read.tid()] = str(read.obj("args").get("name", ""))
        elif ph == "X":
            pid = pid or (ev["pid"] if type(ev.get("pid")) is int else 0)
            args = dict(read.obj("args"))
            start = read.time("ts")
            duration = read.time("dur")
            if duration < 0:
                raise read.bad("dur", ev.get("dur"), "a duration (not negative)")
            end = start + duration
            name = str(args.pop("task", f"{ev.get('name', 'task')}#{len(tasks) + 1}"))
            queued = read.ns(args.pop("queued_us", 0), "args.queued_us")
            failed = args.pop("status", None) == "failed"
            inputs = args.pop("inputs", None) or []
            if not isinstance(inputs, list):
                raise read.bad("args.inputs", inputs, "a list of task names")
            op = str(args.pop("op", ev.get("name", "task")))
            args.pop("id", None)
            tid = read.tid()
            threads.setdefault(tid, str(ev.get("tid", 0)))  # (a string id names itself)
            tasks.append(
                TaskSpan(
                    name, op, tid, start, end, start - queued, tuple(map(str, inputs)), args, failed
                )
            )
        elif ph in ("b", "e") and ev.get("cat") in ("fork", "wait"):
            key = (str(ev["cat"]), ev.get("id") if type(ev.get("id")) in (int, str) else None)
            if ph == "b":
                opened[key] = (ev, read.tid(), read.time("ts"))
                continue
            begun = opened.pop(key, None)
            if begun is None:
                continue
            begin, tid, begin_ts = begun
            kind = key[0]
            label = str(begin.get("name", ""))
            if kind == "wait" and label.startswith("wait "):
                label = label[5:]
            parent = (
                (begin.get("args") or {}).get("parent") if type(begin.get("args")) is dict else None
            )
            spans.append(
                Span(
                    kind,
                    label,
                    tid,
                    begin_ts,
                    read.time("ts"),
                    None if parent is None else str(parent),
                )
            )
    if not meta:
        # Not written by dataflow: times are absolute; start the timeline at the first event.
        origin = min([t.start for t in tasks] + [s.start for s in spans] or [0])
        for t in tasks:
            t.start, t.end, t.ready = t.start - origin, t.end - origin, t.ready - origin
        for s in spans:
            s.start, s.end = s.start - origin, s.end - origin
    tasks.sort(key=lambda t: (t.start, t.id))
    extent = max([t.end for t in tasks] + [s.end for s in spans] + [0])
    read.event, read.index = {"ph": None}, -1
    wall = read.ns(meta.get("wall_us", 0), "otherData.dataflow.wall_us") or extent
    return Trace(
        tasks=tasks,
        threads=threads,
        spans=sorted(spans, key=lambda s: s.start),
        wall=max(wall, extent),
        pid=pid,
        unrun_failed=read.count(meta, "unrun_failed"),
        unrun_cancelled=read.count(meta, "unrun_cancelled"),
    )
