"""The measuring harness: contenders interleaved round by round, statistics, table, JSON.

The machines this project is developed on are shared 2-vCPU VMs where a core can vanish for
seconds at a time. A comparison run contender by contender (all rounds of A, then all rounds
of B) lets such a hiccup land on one contender only. So every comparison here runs *round by
round*: in each round every contender is measured once, in an order rotated from round to
round, and the ratio to the baseline is the median of the per-round ratios, which cancels
slow phases that hit a whole round.
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "best_ratio",
    "module_main",
    "run_child",
    "Comparison",
    "Config",
    "Contender",
    "Row",
    "format_table",
    "interleave",
    "json_line",
    "loop_factory",
]

JSON_PREFIX = "BENCH_JSON "


@dataclass(frozen=True)
class Config:
    """What the command line asked for."""

    quick: bool = False
    rounds: int = 5
    threads: tuple[int, ...] = (1, 2, 4, 8, 16)
    verbose: bool = True
    big_rounds: int | None = None  # rounds at the seed size (50, 50, 1024); None: ``rounds``
    # 'ensemble' only: these sizes and contenders (the baseline always runs); empty: all.
    sizes: tuple[tuple[int, int, int], ...] = ()
    contenders: tuple[str, ...] = ()

    def rounds_for(self, size: tuple[int, ...]) -> int:
        """Rounds for a workload: ``big_rounds`` at the seed size when given."""
        if self.big_rounds is not None and tuple(size) == (50, 50, 1024):
            return self.big_rounds
        return self.rounds


@dataclass
class Contender:
    """One way of doing the benchmark's job.

    ``measure()`` runs the job once and returns the round's value in the comparison's unit
    (it times only the part being compared; setup such as thread limits happens outside).
    A contender with ``skip`` set is reported with that reason and never measured.
    """

    name: str
    measure: Callable[[], float]
    note: str = ""
    skip: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    """A contender's measured values (one per round) and what is derived from them."""

    name: str
    note: str
    values: list[float]
    skip: str | None = None
    ratio: float | None = None
    ratios: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    @property
    def min(self) -> float | None:
        return min(self.values) if self.values else None

    @property
    def max(self) -> float | None:
        return max(self.values) if self.values else None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "note": self.note,
            "skipped": self.skip,
            "median": self.median,
            "min": self.min,
            "max": self.max,
            "values": self.values,
            "ratio_to_baseline": self.ratio,
            "per_round_ratios": self.ratios,
            **self.extra,
        }


@dataclass
class Comparison:
    """A table: contenders measured side by side on one job, against a named baseline."""

    benchmark: str
    title: str
    unit: str
    baseline: str
    rows: list[Row]
    params: dict[str, Any] = field(default_factory=dict)
    columns: tuple[str, ...] = ()  # names of Row.extra entries shown in the table
    notes: list[str] = field(default_factory=list)

    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"{self.title}: no contender named {name!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "title": self.title,
            "unit": self.unit,
            "baseline": self.baseline,
            "params": self.params,
            "notes": self.notes,
            "rows": [r.to_json() for r in self.rows],
        }


def median_ratio(values: Sequence[float], baseline: Sequence[float]) -> tuple[float, list[float]]:
    """The median of the per-round ratios ``values[i] / baseline[i]``, and the ratios."""
    if len(values) != len(baseline) or not values:
        raise ValueError(
            f"need as many values as baseline values, got {len(values)}, {len(baseline)}"
        )
    ratios = [v / b if b > 0 else math.inf for v, b in zip(values, baseline, strict=True)]
    return statistics.median(ratios), ratios


def run_child(module: str, spec: str, error: type[Exception], what: str) -> dict[str, Any]:
    """One round in a fresh ``python -m MODULE --child SPEC``: the last JSON line it printed.

    A child that fails, or prints no JSON line, raises ``error`` naming ``what`` (the
    benchmark, the size, the contender) with the end of its stderr.
    """
    proc = subprocess.run(
        [sys.executable, "-m", module, "--child", spec],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise error(
            f"{what} failed in its child process (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    report: dict[str, Any] = json.loads(lines[-1])
    return report


def best_ratio(rows: list[Row], name: str, over: tuple[str, ...]) -> float | None:
    """The best round of ``name`` over the best round among ``over`` (None if unmeasured)."""
    by_name = {r.name: r for r in rows}
    top = by_name.get(name)
    bests = [m for o in over if o in by_name and (m := by_name[o].min) is not None]
    best = top.min if top is not None else None
    if best is None or not bests:
        return None
    return best / min(bests)


def module_main(
    benchmark: str, description: str, child: Callable[[str], None], argv: list[str] | None
) -> None:
    """``python -m benchmarks.NAME [options]``: that benchmark alone, with the usual options;
    or (``--child SPEC``, internal) one contender's round in this fresh process."""
    import argparse
    import os

    p = argparse.ArgumentParser(description=description, add_help=False)
    p.add_argument("--child")
    args, rest = p.parse_known_args(argv)
    if args.child:
        child(args.child)
        os._exit(0)  # torch's thread pools have aborted at interpreter exit: the report is out
    from ._cli import main as cli_main

    sys.exit(cli_main(["--only", benchmark, *rest]))


def interleave(
    contenders: Sequence[Contender],
    rounds: int,
    *,
    baseline: str,
    warmup: int = 1,
    log: Callable[[str], None] | None = None,
) -> list[Row]:
    """Measure every contender once per round, rotating the order, after warm-up rounds.

    Returns one row per contender (skipped ones included, with no values) with the ratio to
    ``baseline`` filled in. A contender that raises stops the whole comparison: a wrong or
    broken contender must not quietly drop out of a table.
    """
    active = [c for c in contenders if c.skip is None]
    values: dict[str, list[float]] = {c.name: [] for c in active}
    for r in range(-warmup, rounds):
        # Rotate so that no contender always runs first (after a pause) or right after the
        # same neighbour (whose threads may still be spinning down).
        shift = r % len(active) if active else 0
        for c in active[shift:] + active[:shift]:
            gc.collect()
            v = c.measure()
            if r >= 0:
                values[c.name].append(v)
        if log is not None and r >= 0:
            log(
                f"  round {r + 1}/{rounds}: "
                + ", ".join(f"{c.name}={values[c.name][-1]:.4g}" for c in active)
            )
    rows = [
        Row(c.name, c.note, values.get(c.name, []), skip=c.skip, extra=dict(c.extra))
        for c in contenders
    ]
    base = next((row for row in rows if row.name == baseline and row.values), None)
    if base is not None:
        for row in rows:
            if row.values:
                row.ratio, row.ratios = median_ratio(row.values, base.values)
    return rows


def loop_factory() -> Callable[[], Any] | None:
    """uvloop's event-loop factory when installed (dataflow.run's default), else None."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], Any] = uvloop.new_event_loop
    return factory


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            return str(v)
        if v == 0:
            return "0"
        mag = abs(v)
        if mag >= 1000:
            return f"{v:,.0f}"
        if mag >= 1:
            return f"{v:.3g}" if mag < 10 else f"{v:.1f}" if mag < 100 else f"{v:.0f}"
        return f"{v:.3g}"
    return str(v)


def format_table(cmp: Comparison) -> str:
    """The comparison as a fixed-width text table (also valid GitHub Markdown)."""
    ratio_col = [f"vs {cmp.baseline}"] if cmp.baseline else []
    header = [
        "contender",
        "setting",
        f"median ({cmp.unit})",
        "min",
        "max",
        *ratio_col,
        *cmp.columns,
    ]
    lines: list[list[str]] = []
    skipped: list[str] = []
    for r in cmp.rows:
        if r.skip is not None:
            lines.append(
                [
                    r.name,
                    r.note,
                    "skipped",
                    "",
                    "",
                    *("" for _ in ratio_col),
                    *("" for _ in cmp.columns),
                ]
            )
            reason = f"skipped: {r.skip}"
            skipped.append(reason)
            continue
        ratio = ["-" if r.ratio is None else f"{r.ratio:.3f}" for _ in ratio_col]
        lines.append(
            [
                r.name,
                r.note,
                _fmt(r.median),
                _fmt(r.min),
                _fmt(r.max),
                *ratio,
                *(_fmt(r.extra.get(col)) for col in cmp.columns),
            ]
        )
    widths = [
        max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
        for i, h in enumerate(header)
    ]

    def fmt_line(cells: Sequence[str]) -> str:
        out = []
        for i, (cell, w) in enumerate(zip(cells, widths, strict=True)):
            out.append(cell.ljust(w) if i < 2 else cell.rjust(w))
        return "| " + " | ".join(out) + " |"

    sep = (
        "|"
        + "|".join("-" * (w + 1) + ":" if i >= 2 else "-" * (w + 2) for i, w in enumerate(widths))
        + "|"
    )
    text = [f"### {cmp.title}", "", fmt_line(header), sep, *(fmt_line(x) for x in lines)]
    notes = [*cmp.notes, *dict.fromkeys(skipped)]
    if notes:
        text.append("")
        text.extend(f"- {n}" for n in notes)
    return "\n".join(text)


def json_line(benchmark: str, comparisons: Sequence[Comparison], **extra: Any) -> str:
    """The one machine-readable line printed per benchmark."""
    payload = {"benchmark": benchmark, **extra, "comparisons": [c.to_json() for c in comparisons]}
    return JSON_PREFIX + json.dumps(payload, default=_json_default, allow_nan=True)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)
