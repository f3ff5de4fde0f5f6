"""Scaling: the real-kernel ensemble over inter-op thread counts (``--threads``), BLAS 1:
dataflow automatic (the model as written) and compiled (``dataflow.compile``, the lean plan
executor) at each count.

Meant for many-core machines: on a 16-core machine ``--threads 1,2,4,8,16`` gives the real
scaling curve of the seed ensemble (8 independent LSTM chains, so little is expected beyond 8
threads). Counts above the cores this process may use are skipped (reported as such): on a
2-core machine it runs 1 and 2. The baseline is numpy sequential with BLAS on every core;
``speedup`` is relative to dataflow on 1 inter-op thread (same BLAS setting).
"""

from __future__ import annotations

from collections.abc import Callable

from ._harness import Comparison, Config, interleave
from ._machine import cores
from .ensemble import Workload

__all__ = ["run"]

SIZE = (50, 50, 1024)
QUICK_SIZE = (5, 4, 32)


def run(cfg: Config, log: Callable[[str], None]) -> list[Comparison]:
    """One table: numpy sequential, then dataflow automatic at each thread count."""
    size = QUICK_SIZE if cfg.quick else SIZE
    w = Workload(size, cfg.quick)
    n_cores = cores()
    contenders = [w.numpy_sequential()]
    for n in cfg.threads:
        for c in (
            w.dataflow(f"dataflow, {n} inter-op", n, 1, forked=False),
            w.compiled(f"compiled, {n} inter-op", n),
        ):
            if n > n_cores and c.skip is None:
                c.skip = f"more threads than the {n_cores} cores available"
            contenders.append(c)
    log(f"scaling: {size}, threads {list(cfg.threads)}, {n_cores} cores")
    rows = interleave(contenders, cfg.rounds_for(size), baseline="numpy sequential", log=log)
    for kind in ("dataflow", "compiled"):
        one = next((r for r in rows if r.name == f"{kind}, 1 inter-op" and r.median), None)
        for r in rows:
            if one is not None and one.median and r.median and r.name.startswith(kind):
                r.extra["speedup"] = one.median / r.median
    t, b, c_ = size
    return [
        Comparison(
            "scaling",
            f"scaling: ensemble (T, B, C) = ({t}, {b}, {c_}), dataflow automatic, BLAS 1",
            "s",
            "numpy sequential",
            rows,
            params={"size": list(size), "threads": list(cfg.threads), "cores": n_cores},
            columns=("speedup",),
            notes=[
                f"{n_cores} cores available; speedup = the same contender (automatic or "
                "compiled) on 1 inter-op thread / this; "
                "ratio = median of per-round ratios to numpy sequential (BLAS on all cores)"
            ],
        )
    ]
