"""Never slower than plain numpy, at any size: the seed's LSTM ensemble over a grid of sizes.

The ``ensemble`` benchmark measures three sizes with every contender; this one measures the
promise itself over many sizes, from a forward of about a millisecond (where dispatching an
op costs as much as running it) to tens of milliseconds, with the contenders the promise is
about:

* **numpy sequential** (BLAS on every core: the same numpy code run plainly) and
  **numpy sequential, BLAS 1**;
* **dataflow, automatic** (inter-op threads on every core, BLAS 1), **dataflow, 1 inter-op
  thread** (BLAS 1), **dataflow, compiled** (``dataflow.compile``, inter-op on every core) and
  **dataflow, numpy engine** (automatic, with ``ops.set_recurrent_engine("numpy")``: what a
  program gets without numba; the default engine, "auto", runs small float32 directions on
  numba's compiled loops where numba is installed).

Every contender's round runs in a fresh process, as in ``ensemble`` (the same child command,
``python -m benchmarks.ensemble --child``), rounds interleaved with the order rotated, every
output checked against the numpy reference. A table per size, then a summary: for each size
the ratios of best rounds (lower is faster) that the promise and issue #11's invariants are
about:

* ``auto / numpy``: automatic against numpy run plainly (BLAS on every core);
* ``auto / best numpy``: against the faster of the two numpy settings;
* ``1 thread / numpy 1``: one inter-op thread against numpy with one BLAS thread (the
  invariant: within 5%);
* ``auto / 1 thread``: more inter-op threads against one (the invariant: never slower);
* ``numpy engine / numpy``: automatic on numpy's kernels against numpy run plainly;
* ``compiled / best numpy``.

Run: ``python -m benchmarks --only sizes [--rounds 3]`` (about 4 minutes at 3 rounds on 2
cores); ``--quick`` measures one tiny size once, in this process.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ._harness import Comparison, Config, Contender, Row, best_ratio, interleave
from ._machine import cores
from .ensemble import Workload, _child_contender, size_table

__all__ = ["SIZES", "run"]

#: (T, B, C), smallest forward first; 4 members each.
SIZES = (
    (10, 1, 32),
    (10, 2, 32),
    (20, 1, 64),
    (50, 1, 64),
    (50, 1, 128),
    (20, 1, 256),
    (50, 4, 128),
    (50, 16, 128),
    (50, 8, 512),
    (50, 50, 256),
)
QUICK_SIZES = ((5, 1, 16),)
CONTENDERS = (
    "numpy sequential",
    "numpy sequential, BLAS 1",
    "dataflow, automatic",
    "dataflow, defaults",
    "dataflow, 1 inter-op thread",
    "dataflow, compiled",
    "dataflow, numpy engine",
)
#: Summary columns: (name, numerator contender, denominator contenders: the best of them).
RATIOS = (
    ("auto / numpy", "dataflow, automatic", ("numpy sequential",)),
    ("auto / best numpy", "dataflow, automatic", ("numpy sequential", "numpy sequential, BLAS 1")),
    ("defaults / numpy", "dataflow, defaults", ("numpy sequential",)),
    ("1 thread / numpy 1", "dataflow, 1 inter-op thread", ("numpy sequential, BLAS 1",)),
    ("auto / 1 thread", "dataflow, automatic", ("dataflow, 1 inter-op thread",)),
    (
        "compiled / best numpy",
        "dataflow, compiled",
        ("numpy sequential", "numpy sequential, BLAS 1"),
    ),
    ("numpy engine / numpy", "dataflow, numpy engine", ("numpy sequential",)),
)


def summary(per_size: list[tuple[tuple[int, int, int], list[Row]]]) -> Comparison:
    """One row per size: numpy's best round, and the ratios of best rounds in ``RATIOS``."""
    rows = []
    for size, measured in per_size:
        by_name = {r.name: r for r in measured}
        numpy_rows = [by_name[n] for n in ("numpy sequential", "numpy sequential, BLAS 1")]
        values = min((r.values for r in numpy_rows if r.values), key=min, default=[])
        extra = {col: best_ratio(measured, num, den) for col, num, den in RATIOS}
        slower = [
            col
            for col, limit in (
                ("auto / numpy", 1.0),
                ("defaults / numpy", 1.0),
                ("numpy engine / numpy", 1.0),
                ("1 thread / numpy 1", 1.05),
            )
            if (v := extra[col]) is not None and v > limit
        ]
        extra["holds"] = not slower
        rows.append(Row(str(size), "best numpy round (s)", values, extra=extra))
    return Comparison(
        "sizes",
        "never slower than numpy: ratios of best rounds per size (lower is faster)",
        "s",
        "",
        rows,
        columns=(*(col for col, _, _ in RATIOS), "holds"),
        notes=[
            "holds: automatic (BLAS 1), the defaults (BLAS adaptive) and automatic on numpy's "
            "kernels no slower than numpy run plainly, and one inter-op thread within 5% of "
            "numpy with one BLAS thread",
        ],
    )


def run(cfg: Config, log: Callable[[str], None]) -> list[Comparison]:
    """A table per size (every round of every contender in a fresh process; quick mode: each
    contender once in this process on a tiny size), then the summary."""
    n = cores()
    comparisons: list[Comparison] = []
    per_size: list[tuple[tuple[int, int, int], list[Row]]] = []
    with tempfile.TemporaryDirectory(prefix="dataflow-sizes-") as tmp:
        for size in QUICK_SIZES if cfg.quick else SIZES:
            w = Workload(size, cfg.quick)
            expected = Path(tmp) / f"expected-{'x'.join(map(str, size))}.npy"
            np.save(expected, w.expected)
            factories = w.factories()
            contenders: list[Contender] = []
            for name in CONTENDERS:
                note, _, build = factories[name]
                if cfg.quick:
                    contenders.append(build())
                else:
                    contenders.append(_child_contender(name, note, size, w.repeats, expected))
            rounds = 1 if cfg.quick else cfg.rounds
            log(f"sizes: {size}: {w.repeats} forward(s) per round, {rounds} round(s)")
            load0 = os.getloadavg()[0]
            rows = interleave(contenders, rounds, baseline="numpy sequential", warmup=0, log=log)
            load1 = os.getloadavg()[0]
            for row in rows:
                row.extra["best vs best"] = best_ratio(rows, row.name, ("numpy sequential",))
            comparisons.append(
                size_table(
                    "sizes",
                    size,
                    w,
                    rows,
                    {
                        "rounds": rounds,
                        "load_average": [load0, load1],
                        "fresh_processes": not cfg.quick,
                    },
                    ("best vs best",),
                    [
                        f"{rounds} round(s); round value = mean of {w.repeats} forward(s); "
                        f"load average (1 min) {load0:.2f} -> {load1:.2f} on {n} cores",
                    ],
                )
            )
            per_size.append((size, rows))
            del w, contenders
    comparisons.append(summary(per_size))
    return comparisons
