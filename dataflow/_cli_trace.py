"""``dataflow trace summary`` and ``dataflow trace render``: report on a saved trace file.

Design note: these commands only read a file (``_traceread.load``) and hand the
:class:`~dataflow._trace.Trace` to the profiler's summary and op table (``_summary``) or to
the renderer (``_render``). They share nothing with running a script, so they live apart
from ``_cli``, which adds :func:`trace_group` to the ``dataflow`` command as it adds
``graph`` (``dataflow.graph._commands``). A file that cannot be read is one
``dataflow trace COMMAND: error: Type: message`` line and exit 1.
"""

from __future__ import annotations

import os
import sys

import click

from ._render import render_html, render_svg
from ._summary import op_table, summarize
from ._trace import Trace
from ._traceread import load

__all__ = ["trace_group"]

# -- dataflow trace ----------------------------------------------------------------------------


@click.group("trace")
def trace_group() -> None:
    """Read a trace saved by `dataflow run --trace` (or Profiler.export_chrome_trace)."""


def _load_trace(path: str, command: str) -> Trace:
    try:
        return load(path)
    except (OSError, ValueError, TypeError, KeyError, RecursionError, OverflowError) as exc:
        click.echo(
            printable(f"dataflow trace {command}: error: {type(exc).__name__}: {exc}"), err=True
        )
        sys.exit(1)


@trace_group.command("summary")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
def trace_summary(path: str) -> None:
    """Print wall/busy time, parallelism, critical path and the per-op table of PATH."""
    trace = _printable_names(_load_trace(path, "summary"))
    click.echo(printable(str(summarize(trace))))
    click.echo("")
    click.echo(printable(op_table(trace)))


def _escape(name: str) -> str:
    return (
        name
        if name.isprintable()
        else "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)
    )


def _printable_names(trace: Trace) -> Trace:
    """``trace`` with its task, op and thread names escaped (:func:`printable`) before they
    are laid out: a newline in a name, which ``printable`` keeps as a line of the report,
    printed lines of its own (a crafted file could add figures to the summary)."""
    for t in trace.tasks:
        t.name, t.op = _escape(t.name), _escape(t.op)
        t.inputs = tuple(map(_escape, t.inputs))
    trace.threads = {tid: _escape(name) for tid, name in trace.threads.items()}
    return trace


def printable(text: str) -> str:
    """``text`` with each character that does not print as itself (a terminal escape, a
    carriage return) written as its escape, lines kept: a trace file names its ops and threads,
    and a crafted one must not drive the terminal that prints its summary."""
    if text.replace("\n", "").isprintable():
        return text
    return "\n".join(
        "".join(c if c.isprintable() else repr(c)[1:-1] for c in line) for line in text.split("\n")
    )


@trace_group.command("render")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    help="The picture: .svg, or .html (the SVG in a page, with the summary).  "
    "[default: PATH with .svg]",
)
@click.option("--width", type=click.IntRange(min=400), default=1200, show_default=True)
@click.option(
    "--arrows",
    type=click.Choice(["critical", "all", "none"]),
    default="critical",
    show_default=True,
    help="Which dependencies to draw: the critical path's, every one, or none.",
)
def trace_render(path: str, output: str | None, width: int, arrows: str) -> None:
    """Draw PATH as a per-thread timeline: a bar per task, the critical path outlined."""
    if output is not None and not output.strip():  # `-o "$UNSET"`: not the default
        raise click.BadParameter("the path is empty", param_hint="-o")
    out = output or os.path.splitext(path)[0] + ".svg"
    ext = os.path.splitext(out)[1].lower()
    if ext not in (".svg", ".html", ".htm"):
        raise click.UsageError(f"-o {out}: the output must end in .svg or .html")
    if os.path.exists(out) and os.path.samefile(out, path):  # (a trace saved as .svg or .html)
        raise click.UsageError(
            f"-o {out}: that is the trace being read: the picture would overwrite it; give "
            "another output path"
        )
    trace = _load_trace(path, "render")
    if ext == ".svg":
        text = render_svg(trace, width=width, arrows=arrows)
    else:
        title = f"dataflow timeline: {os.path.basename(path)}"
        text = render_html(trace, title=title, width=width, arrows=arrows)
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        click.echo(f"dataflow trace render: error: {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)
    click.echo(f"wrote {out} ({len(trace.tasks)} tasks)")
