"""Reading a saved trace back: the Chrome Trace Event format (``_tracewrite``) into a Trace.

:func:`load` reads a file that :func:`~dataflow._tracewrite.save` wrote (or any Chrome trace
with ``X`` slices) and :func:`from_chrome` rebuilds the :class:`~dataflow._trace.Trace` from
the parsed JSON, so ``dataflow trace summary`` and ``render`` compute from a saved file what
the profiler computes from a live run.

Design note: a trace file is input from outside (a colleague's, a server's dump), so this side
of the format is the hardened one: a file nested too deep, a time that is not a finite number,
a field of the wrong kind is a :class:`TraceFormatError` (a ``DataflowError`` and a
``ValueError``) naming the file and the event, never a crash deep in the summary. Writing
(``_tracewrite``) checks nothing: it starts from a trace this process built.
"""

from __future__ import annotations

import json
import math
import os
import stat
from typing import Any

from ._errors import DataflowError
from ._trace import Span, TaskSpan, Trace

__all__ = ["MAX_JSON_DEPTH", "MAX_TRACE_BYTES", "TraceFormatError", "from_chrome", "load"]


# -- reading ----------------------------------------------------------------------------------


class TraceFormatError(DataflowError, ValueError):
    """A file is not a Chrome trace this module can read (a ``ValueError`` too)."""


#: The largest trace file read (a million tasks take about 370 MB): a bigger file, or a
#: stream with no end (``/dev/zero``), is refused rather than read until memory runs out.
MAX_TRACE_BYTES = 1 << 30
_CHUNK = 1 << 20

#: How deep a trace's arrays and objects may nest (dataflow writes 4 levels).
MAX_JSON_DEPTH = 64
# Times beyond this many microseconds (about 31 years) are not times.
_MAX_US = 1e15


def load(path: str | os.PathLike[str]) -> Trace:
    """Read a trace written by ``_tracewrite.save`` (or any Chrome trace with ``X`` slices, or
    ``B``/``E`` pairs).

    Raises:
        TraceFormatError: the file is not JSON, nests deeper than :data:`MAX_JSON_DEPTH`, or an
            event's field is not what the format says (the message names the event).
        OSError: the file cannot be read.
    """
    source = os.fspath(path)
    try:
        data = _parse(_read_text(path, source))
    except RecursionError:  # deeper than the C parser goes: far beyond the limit
        data = None
        deep = True
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{source} is not JSON: {exc}") from exc
    else:
        deep = _too_deep(data)
    if deep:
        raise TraceFormatError(
            f"{source} nests arrays and objects more than {MAX_JSON_DEPTH} deep: not a trace"
        )
    return from_chrome(data, source=source)


def _read_text(path: str | os.PathLike[str], source: str) -> str:
    """The file's text, read with a bound: a file over :data:`MAX_TRACE_BYTES` is refused up
    front (from its size) or once that much was read (a pipe, a device: ``/dev/zero`` has no
    end, and was read until memory ran out), and one that does not start as JSON does (``{``
    or ``[``, after white space) is refused at its first bytes."""
    with open(path, "rb") as f:
        info = os.fstat(f.fileno())
        if stat.S_ISREG(info.st_mode) and info.st_size > MAX_TRACE_BYTES:
            raise TraceFormatError(_too_big(source, info.st_size))
        data = bytearray()
        started = False
        while chunk := f.read(_CHUNK):
            if not started and (head := chunk.lstrip()):
                if head[:1] not in (b"{", b"["):
                    raise TraceFormatError(
                        f"{source} is not JSON: a trace starts with {{ or [, this with {head[:8]!r}"
                    )
                started = True
            data += chunk
            if len(data) > MAX_TRACE_BYTES:
                raise TraceFormatError(_too_big(source, None))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"{source} is not UTF-8 JSON: {exc}") from exc


def _too_big(source: str, size: int | None) -> str:
    got = "more than that" if size is None else f"{size / 2**30:.1f} GiB"
    return (
        f"{source}: a trace file may be at most {MAX_TRACE_BYTES / 2**30:g} GiB, got {got}: "
        "not read"
    )


def _parse(text: str) -> Any:
    """The JSON of a trace file. The array form may lack its closing ``]`` (the format allows
    it, so that a program that dies while tracing still leaves a trace), and a comma after
    its last event."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        tail = text.rstrip()
        if not text.lstrip().startswith("[") or tail.endswith("]"):
            raise
        try:
            return json.loads(tail.removesuffix(",") + "]")
        except json.JSONDecodeError:
            pass
        raise


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


def _pair_durations(events: list[Any], read: _Fields) -> list[Any]:
    """``events`` with each ``B``/``E`` pair (a slice's begin and end, nested per thread, as
    other tools write them) made the ``X`` slice it stands for, in the begin's place; a begin
    left open (a program that died) or an end with no begin is left out, as a viewer shows no
    slice for it."""
    out = list(events)
    begun: dict[tuple[Any, int], list[int]] = {}  # per thread: the open begins' indices
    for index, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("ph") not in ("B", "E"):
            continue
        read.event, read.index = ev, index
        key = (ev.get("pid") if type(ev.get("pid")) in (int, str) else None, read.tid())
        end = read.time("ts")
        if ev["ph"] == "B":
            begun.setdefault(key, []).append(index)
            continue
        if not begun.get(key):
            continue
        end_args = read.obj("args")
        first = begun[key].pop()
        read.event, read.index = events[first], first
        start, args = read.time("ts"), read.obj("args")
        if end < start:
            read.event, read.index = ev, index
            raise read.bad("ts", ev.get("ts"), f"at or after its B event's (event {first})")
        dur = ev["ts"] - events[first]["ts"]
        out[first] = {**events[first], "ph": "X", "dur": dur, "args": {**args, **end_args}}
    return out


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
    events = _pair_durations(events, read)
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
