"""Draw a trace as a per-thread Gantt chart: hand-written SVG, no plotting dependency.

One lane per thread (the loop first, then the workers), one bar per task run, coloured by op
(the ops with the most kernel time get the most distinct colours), a time axis with round
ticks, a legend with each op's count and total time, and an arrow from each task to each of
its dependents (left out, with a note, above :data:`MAX_ARROWS` edges, where they would only
be noise). Every bar has a ``<title>``, which browsers show on hover: task, op, duration,
thread, shape, dtype, flops, inputs and time spent queued.

:func:`render_html` embeds the SVG in a page with the summary and the op table.
"""

from __future__ import annotations

import colorsys
import html
import math
from typing import Any

from ._profile import active_span, format_seconds, op_stats, op_table, summarize
from ._trace import TaskSpan, Trace

__all__ = ["MAX_ARROWS", "render_html", "render_svg"]

MAX_ARROWS = 3000

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
    return (0 if name == "loop" else 1 if name.startswith("loop") else 2, parts)


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


def render_svg(
    trace: Trace, *, width: int = 1200, title: str | None = None, arrows: bool | None = None
) -> str:
    """The trace as a standalone SVG document (a string).

    Args:
        trace: the recorded run (``Profiler.trace()`` or ``_trace.load(path)``).
        width: the drawing's width in pixels; the height follows from the number of threads.
        title: the heading; default: tasks, threads, wall time and parallelism.
        arrows: draw dependency arrows; default: when there are at most MAX_ARROWS edges.
    """
    summary = summarize(trace)
    lanes = sorted({t.thread for t in trace.tasks}, key=lambda tid: _natural(_label(trace, tid)))
    lane_y = {tid: _TOP + i * _LANE_H for i, tid in enumerate(lanes)}
    label_w = max([len(_label(trace, tid)) * 7 + 24 for tid in lanes] + [90])
    x0, x1 = label_w, width - 24
    # Draw the span in which the graph ran (setup before the first op would be empty space),
    # labelled in time since profiling started.
    first, last = active_span(trace) if trace.tasks else (0, trace.wall)
    pad = max((last - first) // 100, 1)
    lo, hi = max(first - pad, 0), last + pad

    def x(ns: int) -> float:
        return x0 + (x1 - x0) * (ns - lo) / (hi - lo)

    stats = op_stats(trace)
    colours = {row[0]: _colour(i) for i, row in enumerate(stats)}
    out: list[str] = []
    add = out.append
    lanes_bottom = _TOP + len(lanes) * _LANE_H

    # Lanes, with the thread's name and its busy share on the left.
    for i, tid in enumerate(lanes):
        y = lane_y[tid]
        name = _label(trace, tid)
        busy = summary.busy_s.get(name, 0.0) / summary.wall_s if summary.wall_s else 0.0
        if i % 2 == 0:
            add(f"<rect x='0' y='{y}' width='{width}' height='{_LANE_H}' fill='#f4f5f7'/>")
        add(
            f"<text x='{x0 - 10}' y='{y + 15}' text-anchor='end' font-size='12' "
            f"font-weight='bold' fill='#222'>{html.escape(name)}</text>"
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

    # Bars, with the op's name written in when it fits.
    for t in trace.tasks:
        bx = x(t.start)
        bw = max(x(t.end) - bx, 0.6)
        by = lane_y[t.thread] + (_LANE_H - _BAR_H) // 2
        fill = colours[t.op]
        stroke = " stroke='#d00' stroke-width='2' stroke-dasharray='3 2'" if t.failed else ""
        tip = html.escape(_bar_title(t, _label(trace, t.thread)))
        add(
            f"<rect class='task' data-task='{html.escape(t.name)}' x='{bx:.2f}' y='{by}' "
            f"width='{bw:.2f}' height='{_BAR_H}' rx='2' fill='{fill}'{stroke}>"
            f"<title>{tip}</title></rect>"
        )
        if bw >= 7 * len(t.op) + 8:
            add(
                f"<text x='{bx + 4:.2f}' y='{by + 15}' font-size='11' fill='{_ink(fill)}' "
                f"pointer-events='none'>{html.escape(t.op)}</text>"
            )

    # Dependency arrows: from the end of a task to the start of each dependent.
    by_name = {t.name: t for t in trace.tasks}
    edges = [(by_name[i], t) for t in trace.tasks for i in t.inputs if i in by_name]
    draw_arrows = len(edges) <= MAX_ARROWS if arrows is None else arrows
    if draw_arrows:
        add("<g class='deps' fill='none' stroke='#333' stroke-opacity='0.55' stroke-width='0.9'>")
        for src, dst in edges:
            sx, sy = x(src.end), lane_y[src.thread] + _LANE_H / 2
            dx, dy = x(dst.start), lane_y[dst.thread] + _LANE_H / 2
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
    if not draw_arrows and edges:
        y += 20
        add(
            f"<text x='{x0}' y='{y}' font-size='11' fill='#666'>{len(edges)} dependency arrows "
            "left out (too many to read); open the trace in ui.perfetto.dev to follow them</text>"
        )
    height = y + 16

    heading = title or (
        f"{summary.tasks} tasks on {summary.threads} thread(s): "
        f"{format_seconds(summary.wall_s)} wall, parallelism {summary.parallelism:.2f}, "
        f"critical path {format_seconds(summary.critical_path_s)}"
    )
    head = [
        "<svg xmlns='http://www.w3.org/2000/svg' "
        f"width='{width}' height='{height}' viewBox='0 0 {width} {height}' {_FONT}>",
        "<defs><marker id='arrow' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='6' "
        "markerHeight='6' orient='auto-start-reverse'>"
        "<path d='M0,0 L10,5 L0,10 z' fill='#333' fill-opacity='0.7'/></marker></defs>",
        "<style>rect.task:hover{stroke:#000;stroke-width:1.5}</style>",
        f"<rect width='{width}' height='{height}' fill='#fff'/>",
        f"<text x='12' y='22' font-size='15' font-weight='bold' fill='#111'>dataflow timeline"
        f"</text><text x='12' y='40' font-size='12' fill='#444'>{html.escape(heading)}</text>",
    ]
    return "\n".join([*head, *out, "</svg>"]) + "\n"


def _label(trace: Trace, tid: int) -> str:
    return trace.threads.get(tid, str(tid))


def render_html(trace: Trace, *, title: str = "dataflow timeline", width: int = 1200) -> str:
    """A standalone HTML page: the SVG timeline (hover a bar for details), summary, op table."""
    svg = render_svg(trace, width=width)
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
