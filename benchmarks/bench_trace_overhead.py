"""What observing a run costs: off, a no-op instrument, a profile, structlog task events.

Run: ``python benchmarks/bench_trace_overhead.py [--rounds 7] [--ops 100000] [--quick]``

Two workloads, each contender in a fresh process per round, rounds interleaved (the order
rotated from round to round):

* **tiny ops**: ``--ops`` chained ``ops.add`` on a (4,) array in one ``dataflow.run``: every
  op runs inline at dispatch, the hot path at its shortest, where observing weighs most. The
  figure is the main thread's CPU time per op (``time.thread_time``: what the dispatching
  thread spent, whatever else the shared machine did).
* **ensemble**: one forward of the tutorial's ensemble at (T, B, C) = (50, 50, 256), 4
  members, inter-op 2, BLAS 1 (wall time, the best of 3 forwards per process).

Contenders: **off** (nothing attached); **no-op instrument** (an ``Instrument`` whose
``task_started``/``task_finished`` hooks do nothing, attached to the process: the price of a
hook call per event); **profile** (``dataflow.profile()``: one span record per task, written
by the scheduler); **structlog events** (``dataflow.TaskLogger``, with structlog configured
to drop everything at the lowest level: the price of building the events).

Reported per workload and contender: the median over rounds, the best round, and the ratio to
**off** of the medians and of the best rounds (noise on a shared machine only ever adds
time, so the ratio of best rounds is the steadier figure). Targets (issue #16): profile <= 10%
over off on tiny ops, <= 3% on the ensemble.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTENDERS = ("off", "no-op instrument", "profile", "structlog events")
JSON_PREFIX = "BENCH_JSON "


# -- one measurement, in a fresh process ---------------------------------------------------------


def _observe(contender: str) -> Any:
    """Attach the contender's observer to the process; a closer."""
    import dataflow

    if contender == "off":
        return lambda: None
    if contender == "no-op instrument":

        class Noop(dataflow.Instrument):
            def task_started(self, ts: int, task: Any) -> None:
                pass

            def task_finished(self, ts: int, task: Any) -> None:
                pass

        inst: Any = Noop()
        dataflow.add_instrument(inst)
        return lambda: dataflow.remove_instrument(inst)
    if contender == "profile":
        prof = dataflow.profile()
        prof.start()
        return prof.stop
    if contender == "structlog events":
        import logging

        import structlog

        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
            cache_logger_on_first_use=True,
        )
        inst = dataflow.TaskLogger()
        dataflow.add_instrument(inst)
        return lambda: dataflow.remove_instrument(inst)
    raise SystemExit(f"unknown contender {contender!r}")


def _tiny(contender: str, ops_count: int) -> float:
    import numpy as np

    import dataflow
    import ops

    async def chain(n: int) -> float:
        y: Any = ops.asarray(np.ones(4))
        for _ in range(1000):  # warm up: the signature cache, the first-call costs
            y = ops.add(y, 1.0)
        t0 = time.thread_time()
        for _ in range(n):
            y = ops.add(y, 1.0)
        spent = time.thread_time() - t0
        await y
        return spent / n

    close = _observe(contender)
    try:
        return dataflow.run(chain, ops_count, interop_threads=2)
    finally:
        close()


def _ensemble(contender: str) -> float:
    import numpy as np
    from threadpoolctl import threadpool_limits

    import dataflow

    sys.path.insert(0, ROOT)
    from examples.lstm_ensemble import Ensemble

    ens = Ensemble(4, 256, seed=0)
    x = np.random.default_rng(1).random((50, 50, 256), dtype=np.float32)

    async def forwards() -> float:
        await ens(x)  # warm up
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            await ens(x)
            best = min(best, time.perf_counter() - t0)
        return best

    close = _observe(contender)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            return dataflow.run(forwards, interop_threads=2)
    finally:
        close()


def _child(workload: str, contender: str, ops_count: int) -> None:
    value = _tiny(contender, ops_count) if workload == "tiny" else _ensemble(contender)
    print(json.dumps({"value": value}))


# -- the comparison --------------------------------------------------------------------------------


def _measure(workload: str, contender: str, ops_count: int) -> float:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, __file__, "--child", workload, contender, "--ops", str(ops_count)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=ROOT,
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])["value"])


def run(rounds: int, ops_count: int, workloads: tuple[str, ...]) -> dict[str, Any]:
    results: dict[str, Any] = {"load_start": os.getloadavg()[0]}
    for workload in workloads:
        times: dict[str, list[float]] = {c: [] for c in CONTENDERS}
        for r in range(rounds):
            order = CONTENDERS[r % len(CONTENDERS) :] + CONTENDERS[: r % len(CONTENDERS)]
            for contender in order:
                times[contender].append(_measure(workload, contender, ops_count))
        off_med = statistics.median(times["off"])
        off_best = min(times["off"])
        results[workload] = {
            c: {
                "median": statistics.median(v),
                "best": min(v),
                "median_ratio": statistics.median(v) / off_med,
                "best_ratio": min(v) / off_best,
            }
            for c, v in times.items()
        }
    results["load_end"] = os.getloadavg()[0]
    return results


def _table(results: dict[str, Any], rounds: int, ops_count: int) -> str:
    lines = []
    units = {"tiny": ("us/op", 1e6), "ensemble": ("ms/forward", 1e3)}
    targets = {"tiny": 1.10, "ensemble": 1.03}
    for workload in ("tiny", "ensemble"):
        if workload not in results:
            continue
        unit, scale = units[workload]
        what = (
            f"{ops_count} chained ops.add, thread CPU time"
            if workload == "tiny"
            else "ensemble (50, 50, 256) forward, inter-op 2, BLAS 1, wall time"
        )
        lines.append(f"{what}: {rounds} rounds, a fresh process each")
        lines.append(f"  {'contender':<18} {'median ' + unit:>18} {'best':>10} "
                     f"{'x off (median)':>15} {'x off (best)':>13}")  # fmt: skip
        for c, row in results[workload].items():
            lines.append(
                f"  {c:<18} {row['median'] * scale:>18.3f} {row['best'] * scale:>10.3f} "
                f"{row['median_ratio']:>15.3f} {row['best_ratio']:>13.3f}"
            )
        lines.append(f"  target: profile <= {targets[workload]:.2f}x off")
    lines.append(
        f"load average {results['load_start']:.2f} at the start, {results['load_end']:.2f} at "
        "the end"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--ops", type=int, default=100_000)
    p.add_argument("--quick", action="store_true", help="2 rounds, 5,000 ops, tiny ops only")
    p.add_argument("--child", nargs=2, metavar=("WORKLOAD", "CONTENDER"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], args.ops)
        return
    rounds, ops_count = (2, 5000) if args.quick else (max(args.rounds, 1), args.ops)
    workloads = ("tiny",) if args.quick else ("tiny", "ensemble")
    results = run(rounds, ops_count, workloads)
    print(_table(results, rounds, ops_count))
    print(JSON_PREFIX + json.dumps({"benchmark": "trace_overhead", "rounds": rounds,
                                    "ops": ops_count, **results}))  # fmt: skip


if __name__ == "__main__":
    main()
