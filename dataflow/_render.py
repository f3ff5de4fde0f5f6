"""Draw a trace as a per-thread Gantt chart: hand-written SVG, no plotting dependency.

One lane per thread that ran tasks (the loop first, then the workers; threads that share a
name and never ran at the same time share a lane, as in the summary: see
:func:`~dataflow._trace.lanes`), one bar per task run, coloured by op (the ops with the most
kernel time get the most distinct colours), a time axis with round ticks, and a legend with
each op's count and total time. Lane names are shortened to fit (a Dask worker thread's
``dask tcp://10.0.0.5:40123 0-Dask-Default-Threads-81-0`` becomes ``dask :40123``); the full
name shows on hover.

Arrows show the **critical path** by default: its bars are outlined and joined by arrows, the
chain of dependent kernels no schedule can beat. Every dependency as an arrow (``arrows="all"``,
left out with a note above :data:`MAX_ARROWS`) covers the picture on any real run; Perfetto is
the tool to follow them. Every bar has a ``<title>``, which browsers show on hover: task, op,
duration, thread, shape, dtype, flops, inputs and time spent queued.

:func:`render_html` embeds the SVG in a page with the summary and the op table.
"""

from __future__ import annotations

import colorsys
import html
import itertools
import math
import re
from typing import Any

from ._errors import DataflowValueError
from ._summary import active_span, format_seconds, op_stats, op_table, summarize, threads_text
from ._trace import TaskSpan, Trace, is_loop_lane, lanes

__all__ = ["ARROWS", "MAX_ARROWS", "MAX_LABEL", "render_html", "render_svg"]

MAX_ARROWS = 3000
#: Which dependency arrows render_svg draws.
ARROWS = ("critical", "all", "none")
#: The longest lane name drawn in full (longer ones are shortened; hover shows them whole).
MAX_LABEL = 22

# Tableau 10: distinct, readable on white, and friendly to the common colour-vision deficits.
_PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)

_FONT = "font-family='Helvetica, Arial, sans-serif'"
_LANE_H = 34
_BAR_H = 22
_TOP = 64  # title, subtitle and the time axis above the first lane


def _colour(index: int) -> str:
    if index < len(_PALETTE):
        return _PALETTE[index]
    # Beyond the palette: spread hues by the golden angle, at a medium lightness.
    r, g, b = colorsys.hls_to_rgb((index * 0.618033988749895) % 1.0, 0.55, 0.55)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def _ink(fill: str) -> str:
    """Black or white text, whichever reads better on ``fill``."""
    r, g, b = (int(fill[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return "#000" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.55 else "#fff"


def _ticks(lo: int, hi: int) -> tuple[list[int], float, str]:
    """Round tick positions (ns) within [lo, hi], and the unit to label them in."""
    span = max(hi - lo, 1)
    raw = span / 8
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    scale, unit = (1e9, "s") if hi >= 2e9 else (1e6, "ms") if hi >= 2e6 else (1e3, "us")
    first = math.ceil(lo / step)
    ticks = [round(i * step) for i in range(first, int(hi // step) + 1)]
    return ticks, scale, unit


def _natural(name: str) -> tuple[int, list[Any]]:
    parts: list[Any] = []
    for chunk in name.replace("-", " - ").split():
        parts.append((0, int(chunk), "") if chunk.isdigit() else (1, 0, chunk))
    return (0 if name == "loop" else 1 if is_loop_lane(name) else 2, parts)


def _number(value: Any) -> str:
    """A number in 3 significant digits; anything else (a foreign trace's) as it is."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.3g}"
    return f"{value!r:.40}"


def _bar_title(t: TaskSpan, lane: str) -> str:
    lines = [f"{t.name} ({t.op}): {format_seconds(t.duration / 1e9)} on {lane}"]
    lines.append(f"start {format_seconds(t.start / 1e9)}, end {format_seconds(t.end / 1e9)}")
    a = t.args
    if "shape" in a or "dtype" in a:
        lines.append(f"out {a.get('shape')} {a.get('dtype', '')}".rstrip())
    elif "shapes" in a:
        lines.append(f"outs {a.get('shapes')} {a.get('dtypes', '')}".rstrip())
    if "flops" in a:
        lines.append(f"{_number(a['flops'])} flops, {_number(a.get('bytes', 0))} bytes")
    if t.inputs:
        shown = ", ".join(t.inputs[:6]) + (", ..." if len(t.inputs) > 6 else "")
        lines.append(f"inputs: {shown}")
    if t.start > t.ready:
        lines.append(f"queued {format_seconds((t.start - t.ready) / 1e9)} before it started")
    if t.failed:
        lines.append("FAILED")
    return "\n".join(lines)


_DASK_LANE = re.compile(r"^dask (?:\w+://)?(?P<host>[^\s]*?):(?P<port>\d+) (?P<thread>.*)$")


def short_labels(names: list[str]) -> dict[str, str]:
    """Lane names as drawn: Dask worker threads by port, anything too long cut in the middle.

    ``dask tcp://127.0.0.1:42543 0-Dask-Default-Threads-30554-0`` is ``dask :42543`` when all
    workers share the host and each runs one thread (else the host stays, and a thread number
    follows: ``dask :42543 t1``); other names longer than :data:`MAX_LABEL` keep their start
    and end (``my-very-long-…-thread-3``).
    """
    dask = {n: m for n in names if (m := _DASK_LANE.match(n)) is not None}
    hosts = {m["host"] for m in dask.values()}
    per_worker: dict[str, int] = {}
    for m in dask.values():
        per_worker[m["port"]] = per_worker.get(m["port"], 0) + 1
    out: dict[str, str] = {}
    for name in names:
        m = dask.get(name)
        if m is not None:
            where = f":{m['port']}" if len(hosts) == 1 else f"{m['host']}:{m['port']}"
            short = f"dask {where}"
            if per_worker[m["port"]] > 1:
                number = re.search(r"(\d+)\D*$", m["thread"])
                short += f" t{number[1]}" if number else f" {m['thread']}"
            name_out = short
        else:
            name_out = name
        if len(name_out) > MAX_LABEL:
            keep = MAX_LABEL - 1
            name_out = name_out[: (keep + 1) // 2] + "\u2026" + name_out[-(keep // 2) :]
        out[name] = name_out
    return out


def render_svg(
    trace: Trace, *, width: int = 1200, title: str | None = None, arrows: str = "critical"
) -> str:
    """The trace as a standalone SVG document (a string).

    Args:
        trace: the recorded run (``Profiler.trace()`` or ``_traceread.load(path)``).
        width: the drawing's width in pixels; the height follows from the number of lanes.
        title: the heading; default: tasks, threads, wall time and parallelism.
        arrows: ``"critical"`` (default): the critical path's bars outlined and joined by
            arrows; ``"all"``: an arrow per dependency (left out above MAX_ARROWS);
            ``"none"``.
    """
    if arrows not in ARROWS:
        raise DataflowValueError(f"render_svg(arrows=...) must be one of {ARROWS}, got {arrows!r}")
    summary = summarize(trace)
    lane_of = lanes(trace)
    names = sorted(set(lane_of.values()), key=_natural)
    lane_y = {name: _TOP + i * _LANE_H for i, name in enumerate(names)}
    shown = short_labels(names)
    label_w = max([len(shown[n]) * 7 + 24 for n in names] + [90])
    x0, x1 = label_w, width - 24
    # Draw the span in which the graph ran (setup before the first op would be empty space),
    # labelled in time since profiling started.
    first, last = active_span(trace) if trace.tasks else (0, trace.wall)
    pad = max((last - first) // 100, 1)
    lo, hi = max(first - pad, 0), last + pad

    def x(ns: int) -> float:
        return x0 + (x1 - x0) * (ns - lo) / (hi - lo)

    def mid(t: TaskSpan) -> float:
        return lane_y[lane_of[t.thread]] + _LANE_H / 2

    stats = op_stats(trace)
    colours = {row[0]: _colour(i) for i, row in enumerate(stats)}
    critical = set(summary.critical_path) if arrows == "critical" else set()
    out: list[str] = []
    add = out.append
    lanes_bottom = _TOP + len(names) * _LANE_H

    # Lanes, with the thread's name and its busy share on the left.
    for i, name in enumerate(names):
        y = lane_y[name]
        busy = summary.busy_s.get(name, 0.0) / summary.wall_s if summary.wall_s else 0.0
        if i % 2 == 0:
            add(f"<rect x='0' y='{y}' width='{width}' height='{_LANE_H}' fill='#f4f5f7'/>")
        add(
            f"<text class='lane' x='{x0 - 10}' y='{y + 15}' text-anchor='end' font-size='12' "
            f"font-weight='bold' fill='#222'>{html.escape(shown[name])}"
            f"<title>{html.escape(name)}</title></text>"
        )
        add(
            f"<text x='{x0 - 10}' y='{y + 28}' text-anchor='end' font-size='10' "
            f"fill='#666'>{100 * busy:.0f}% busy</text>"
        )

    # Time axis: round ticks, labelled, with light grid lines through the lanes.
    ticks, scale, unit = _ticks(lo, hi)
    add(f"<line x1='{x0}' y1='{_TOP - 4}' x2='{x1}' y2='{_TOP - 4}' stroke='#333'/>")
    for tick in ticks:
        tx = x(tick)
        add(
            f"<line x1='{tx:.1f}' y1='{_TOP - 8}' x2='{tx:.1f}' y2='{lanes_bottom}' "
            "stroke='#ccc' stroke-width='0.6'/>"
        )
        add(
            f"<text x='{tx:.1f}' y='{_TOP - 12}' text-anchor='middle' font-size='11' "
            f"fill='#333'>{tick / scale:g}</text>"
        )
    add(
        f"<text x='{x0 - 10}' y='{_TOP - 12}' text-anchor='end' font-size='11' "
        f"fill='#333'>time ({unit})</text>"
    )

    # Bars, with the op's name written in when it fits; the critical path's outlined.
    for t in trace.tasks:
        bx = x(t.start)
        bw = max(x(t.end) - bx, 0.6)
        by = lane_y[lane_of[t.thread]] + (_LANE_H - _BAR_H) // 2
        fill = colours[t.op]
        if t.failed:
            stroke = " stroke='#d00' stroke-width='2' stroke-dasharray='3 2'"
        elif t.name in critical:
            stroke = " stroke='#111' stroke-width='1.5'"
        else:
            stroke = ""
        kind = "task critical" if t.name in critical else "task"
        tip = html.escape(_bar_title(t, lane_of[t.thread]))
        add(
            f"<rect class='{kind}' data-task='{html.escape(t.name)}' x='{bx:.2f}' y='{by}' "
            f"width='{bw:.2f}' height='{_BAR_H}' rx='2' fill='{fill}'{stroke}>"
            f"<title>{tip}</title></rect>"
        )
        if bw >= 7 * len(t.op) + 8:
            add(
                f"<text x='{bx + 4:.2f}' y='{by + 15}' font-size='11' fill='{_ink(fill)}' "
                f"pointer-events='none'>{html.escape(t.op)}</text>"
            )

    # Dependency arrows: from the end of a task to the start of a dependent.
    by_name = {t.name: t for t in trace.tasks}
    if arrows == "critical":
        path = [by_name[n] for n in summary.critical_path if n in by_name]
        edges = list(itertools.pairwise(path))
    elif arrows == "all":
        edges = [(by_name[i], t) for t in trace.tasks for i in t.inputs if i in by_name]
    else:
        edges = []
    drawn = edges if arrows != "all" or len(edges) <= MAX_ARROWS else []
    if drawn:
        colour = "#111" if arrows == "critical" else "#333"
        add(
            f"<g class='deps' fill='none' stroke='{colour}' stroke-opacity='0.7' "
            "stroke-width='1.1'>"
        )
        for src, dst in drawn:
            sx, sy = x(src.end), mid(src)
            dx, dy = x(dst.start), mid(dst)
            if sy == dy and dx - sx < 6:
                continue  # back to back on one lane: the order says it already
            bend = max(12.0, (dx - sx) / 2)
            add(
                f"<path class='dep' d='M{sx:.1f},{sy:.1f} C{sx + bend:.1f},{sy:.1f} "
                f"{dx - bend:.1f},{dy:.1f} {dx:.1f},{dy:.1f}' marker-end='url(#arrow)'/>"
            )
        add("</g>")

    # Legend: one swatch per op, in order of total time.
    y = lanes_bottom + 22
    lx: float = x0
    total = sum(r[2] for r in stats) or 1
    for op, count, tot, _ in stats:
        runs = f"{count} task" + ("s" if count > 1 else "")
        text = f"{op}: {runs}, {format_seconds(tot / 1e9)} ({100 * tot / total:.0f}%)"
        w = 22 + 6.5 * len(text) + 18
        if lx + w > width - 10 and lx > x0:
            lx, y = x0, y + 20
        add(f"<rect x='{lx:.1f}' y='{y - 10}' width='14' height='12' rx='2' fill='{colours[op]}'/>")
        add(
            f"<text x='{lx + 20:.1f}' y='{y}' font-size='11' fill='#222'>{html.escape(text)}</text>"
        )
        lx += w
    note = ""
    if arrows == "critical" and summary.critical_path:
        note = (
            f"outlined and joined by arrows: the critical path, {len(summary.critical_path)} "
            f"tasks, {format_seconds(summary.critical_path_s)} (no schedule finishes sooner)"
        )
    elif arrows == "all" and edges and not drawn:
        note = (
            f"{len(edges)} dependency arrows left out (too many to read); open the trace in "
            "ui.perfetto.dev to follow them"
        )
    if note:
        y += 20
        add(f"<text x='{x0}' y='{y}' font-size='11' fill='#666'>{html.escape(note)}</text>")
    height = y + 16

    heading = title or (
        f"{summary.tasks} tasks on {threads_text(summary)}: "
        f"{format_seconds(summary.wall_s)} wall, parallelism {summary.parallelism:.2f}, "
        f"critical path {format_seconds(summary.critical_path_s)}"
    )
    head = [
        "<svg xmlns='http://www.w3.org/2000/svg' "
        f"width='{width}' height='{height}' viewBox='0 0 {width} {height}' {_FONT}>",
        "<defs><marker id='arrow' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='6' "
        "markerHeight='6' orient='auto-start-reverse'>"
        "<path d='M0,0 L10,5 L0,10 z' fill='#111' fill-opacity='0.8'/></marker></defs>",
        "<style>rect.task:hover{stroke:#000;stroke-width:1.5}</style>",
        f"<rect width='{width}' height='{height}' fill='#fff'/>",
        f"<text x='12' y='22' font-size='15' font-weight='bold' fill='#111'>dataflow timeline"
        f"</text><text x='12' y='40' font-size='12' fill='#444'>{html.escape(heading)}</text>",
    ]
    return "\n".join([*head, *out, "</svg>"]) + "\n"


def render_html(
    trace: Trace, *, title: str = "dataflow timeline", width: int = 1200, arrows: str = "critical"
) -> str:
    """A standalone HTML page: the SVG timeline (hover a bar for details), summary, op table."""
    svg = render_svg(trace, width=width, arrows=arrows)
    summary = html.escape(str(summarize(trace)))
    table = html.escape(op_table(trace))
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:Helvetica,Arial,sans-serif;margin:16px;color:#222}"
        "pre{background:#f4f5f7;padding:10px;overflow-x:auto}</style></head><body>\n"
        f"<h1>{html.escape(title)}</h1>\n<p>Hover a bar for the task's details.</p>\n"
        f"{svg}<h2>Summary</h2>\n<pre>{summary}</pre>\n<h2>Ops</h2>\n<pre>{table}</pre>\n"
        "</body></html>\n"
    )
