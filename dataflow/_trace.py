"""A recorded run as plain data, and what every consumer of it reads off it the same way.

:class:`Trace` is what the profiler builds from the event stream and what ``dataflow trace``
loads back from a file, so the summary, the op table and the rendered timeline are computed
the same way from a live profile and from a saved trace. Times are integer nanoseconds from
the trace's origin (the moment profiling started).

Besides the data classes, this module holds what is read off a trace wherever it came from:
the timeline lanes (:func:`lanes`), a thread's track name (:func:`thread_label`), an op's
output description (:func:`describe_spec`) and the bytes of task outputs alive over time
(:func:`alive_bytes`).

Design note: the saved form, the Chrome Trace Event format, is two modules of its own:
``_tracewrite`` (the format, and writing it) and ``_traceread`` (reading it back from a file
that cannot be trusted). The recorder, the task logger and the renderer need the data, not
the file format, and they import this module alone.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._loop import running_library

__all__ = [
    "Span",
    "TaskSpan",
    "Trace",
    "alive_bytes",
    "describe_spec",
    "is_loop_lane",
    "lanes",
    "output_bytes",
    "thread_label",
]


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
    """The track name of the calling thread: ``loop`` when it runs an event loop (asyncio's, or
    trio's), else its name."""
    return "loop" if running_library() is not None else threading.current_thread().name


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


def output_bytes(args: dict[str, Any]) -> int:
    """The bytes of a task's output(s), from its recorded shape(s) and dtype(s) (0 unknown)."""
    shapes = args.get("shapes") or ([args["shape"]] if "shape" in args else [])
    dtypes = args.get("dtypes") or ([args["dtype"]] if "dtype" in args else [])
    if not isinstance(shapes, list | tuple) or not isinstance(dtypes, list | tuple):
        return 0  # (a trace file read back: fields of another type count as unknown)
    total = 0
    for shape, dtype in zip(shapes, dtypes, strict=False):
        if not isinstance(shape, list | tuple) or not isinstance(dtype, str):
            continue
        if not all(type(d) is int and d >= 0 for d in shape):
            continue
        try:
            itemsize = np.dtype(dtype).itemsize
        except (TypeError, ValueError):
            continue
        total += math.prod(shape) * itemsize
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
