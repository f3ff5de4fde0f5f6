"""Captured-and-optimised ensemble vs the eager automatic run: time, dispatch and peak memory.

Standalone: ``python benchmarks/bench_graph.py [--quick] [--rounds N] [--models N]``.

For each size, the tutorial's LSTM ensemble (``examples/lstm_ensemble.py``) runs three ways
in one process, interleaved round by round (order rotated), each in a fresh runtime:

* ``eager``: ``await ensemble(x)`` with no fork (the automatic run: every op dispatched by the
  model's Python code, its meta and cost rules run per call, issue-order priorities);
* ``graph``: the traced graph (``dataflow.trace(ensemble, x)``), same ops, critical-path
  priorities, no meta/cost rules per call;
* ``optimized``: ``graph.optimize()`` (CSE merges the models' flips of x, DCE drops the unused
  final LSTM states; the ensemble has no elementwise chains to fuse).

Reported per contender: the median wall time of a forward (the pool's start is not timed),
the median of per-round ratios to eager, the time to dispatch the whole forward (until every
op is issued), and the peak of traced memory (``tracemalloc``, which numpy reports its buffers
to) during one forward above what was allocated before, in separate runs (tracing memory slows
Python down, so it is never on while timing). The outputs are checked equal. The last line is
``BENCH_JSON {...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dataflow
from examples.lstm_ensemble import Ensemble

Array = np.ndarray[Any, Any]
Forward = Callable[[Array], Awaitable[Any]]
JSON_PREFIX = "BENCH_JSON "


def _one_forward(forward: Forward, x: Array, threads: int) -> tuple[float, float, Array]:
    """(seconds, dispatch seconds, output) of one forward in a fresh runtime."""

    async def main() -> tuple[float, float, Array]:
        async with dataflow.Runtime(interop_threads=threads, intraop_threads=1):
            t0 = time.perf_counter()
            with dataflow.model_code():  # the pending output: dispatch is timed apart
                pending = await forward(x)
            t1 = time.perf_counter()
            y: Array = await dataflow.materialize(pending)
            return time.perf_counter() - t0, t1 - t0, y

    return asyncio.run(main())


def _peak_bytes(forward: Forward, x: Array, threads: int) -> int:
    """Peak traced bytes during one forward, above what was allocated before it."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        _one_forward(forward, x, threads)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak - before


def bench_size(
    size: tuple[int, int, int], models: int, rounds: int, threads: int
) -> dict[str, Any]:
    """Every contender at one size: a dict of results (and the table rows)."""
    t, b, c = size
    ens = Ensemble(models, c, seed=0)
    x = np.random.default_rng(1).random((t, b, c), dtype=np.float32)
    t0 = time.perf_counter()
    graph = dataflow.trace(ens, x)
    trace_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    optimized = graph.optimize()
    optimize_s = time.perf_counter() - t0
    contenders: dict[str, Forward] = {"eager": ens, "graph": graph, "optimized": optimized}
    for forward in contenders.values():  # warm-up: first touches of weights, allocator, BLAS
        _one_forward(forward, x, threads)
    times: dict[str, list[float]] = {k: [] for k in contenders}
    dispatch: dict[str, list[float]] = {k: [] for k in contenders}
    outputs: dict[str, Array] = {}
    names = list(contenders)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            seconds, dispatched, y = _one_forward(contenders[name], x, threads)
            times[name].append(seconds)
            dispatch[name].append(dispatched)
            outputs[name] = y
    peaks = {name: _peak_bytes(f, x, threads) for name, f in contenders.items()}
    ref = outputs["eager"]
    equal = all(np.allclose(ref, y, rtol=1e-5, atol=1e-6) for y in outputs.values())
    result: dict[str, Any] = {
        "size": list(size),
        "models": models,
        "threads": threads,
        "rounds": rounds,
        "nodes": {"graph": len(graph.nodes), "optimized": len(optimized.nodes)},
        "trace_s": trace_s,
        "optimize_s": optimize_s,
        "critical_path_est_s": optimized.plan.critical_path_s,
        "outputs_equal": equal,
        "contenders": {},
    }
    for name in names:
        ratios = [e / v for e, v in zip(times["eager"], times[name], strict=True)]
        result["contenders"][name] = {
            "median_s": statistics.median(times[name]),
            "speedup_vs_eager": statistics.median(ratios),
            "dispatch_ms": statistics.median(dispatch[name]) * 1e3,
            "peak_mib": peaks[name] / 2**20,
        }
    return result


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """One block per size: a row per contender."""
    lines = []
    for res in results:
        t, b, c = res["size"]
        lines.append(
            f"ensemble {res['models']} x BiLSTM, T, B, C = {t}, {b}, {c}; "
            f"{res['threads']} inter-op threads, {res['rounds']} rounds; nodes "
            f"{res['nodes']['graph']} -> {res['nodes']['optimized']} optimized; trace "
            f"{res['trace_s'] * 1e3:.0f} ms, optimize {res['optimize_s'] * 1e3:.0f} ms; "
            f"outputs equal: {res['outputs_equal']}"
        )
        lines.append(
            f"  {'contender':<10} {'median ms':>10} {'vs eager':>9} {'dispatch ms':>12} "
            f"{'peak MiB':>9}"
        )
        for name, row in res["contenders"].items():
            lines.append(
                f"  {name:<10} {row['median_s'] * 1e3:10.2f} {row['speedup_vs_eager']:8.2f}x "
                f"{row['dispatch_ms']:12.2f} {row['peak_mib']:9.2f}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sizes, print the table and the JSON line; exit 1 if outputs differ."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="small sizes and 3 rounds (for tests)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 7)")
    p.add_argument("--models", type=int, default=4, help="ensemble members (default 4)")
    p.add_argument("--threads", type=int, default=2, help="inter-op threads (default 2)")
    args = p.parse_args(argv)
    sizes = [(5, 2, 16), (10, 1, 32)] if args.quick else [(50, 50, 256), (50, 1, 128)]
    rounds = args.rounds or (3 if args.quick else 7)
    results = [bench_size(s, args.models, rounds, args.threads) for s in sizes]
    print(format_table(results))
    print(JSON_PREFIX + json.dumps({"benchmark": "graph", "results": results}))
    return 0 if all(r["outputs_equal"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
