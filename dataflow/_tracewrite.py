"""The saved form of a :class:`~dataflow._trace.Trace`: the Chrome Trace Event format, written.

The file is the JSON object form of the Chrome Trace Event format (loads in ui.perfetto.dev
and chrome://tracing):

* an ``X`` slice per task run, on its thread's track (``pid`` = process id, ``tid`` = the
  thread's native id; ``ts``/``dur`` in microseconds), with ``args``: op, task, id, output
  shape and dtype, flops, bytes (a cost rule's ``inf`` as the string ``"inf"``: JSON has no
  infinity), inputs, and ``queued_us`` (ready-but-not-started time);
* ``M`` metadata: ``process_name``, ``thread_name`` (``loop`` for a thread that runs an event
  loop, ``interop-N`` for pool workers) and ``thread_sort_index``;
* a flow (``s`` then ``f`` with ``bp: "e"``, same ``id``) from each task to each dependent;
* forked coroutines and waits as async slices (``b``/``e`` with an ``id``) on the loop track;
* counters (``C``): tasks running and tasks ready (``running``/``ready``, arg ``tasks``), and
  the bytes of task outputs alive (``memory``, arg ``bytes alive``: see
  :func:`~dataflow._trace.alive_bytes`);
* ``otherData.dataflow``: the wall time and the tasks that never ran, so a loaded trace gives
  the same summary as the live profile.

Design note: :func:`to_chrome` turns a trace into the JSON object and :func:`save` writes it;
``_traceread`` reads the same format back (and any Chrome trace with ``X`` slices). Writing
starts from a trace this process built, so it checks nothing; reading starts from a file and
checks everything. The data itself, and the analyses the writer shares with the summary
(:func:`~dataflow._trace.alive_bytes`), are ``_trace``'s.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from ._trace import TaskSpan, Trace, alive_bytes

__all__ = ["FORMAT_VERSION", "save", "to_chrome"]

FORMAT_VERSION = 1


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
        for key in ("flops", "bytes"):
            value = args.get(key)
            if type(value) is float and not math.isfinite(value):
                # (a cost rule may say inf, which JSON cannot: ``Infinity`` made the file one
                # that Perfetto and strict parsers refuse)
                args[key] = str(value)
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
