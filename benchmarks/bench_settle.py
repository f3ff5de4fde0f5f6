"""How fast automatic placement settles, and where it settles: the seed's ensemble against
numpy in one process, over inter-op thread counts.

Run: ``python benchmarks/bench_settle.py [--sizes 50x1x128,20x1x256] [--threads 1,2,16]
[--rounds 7] [--in-process] [--quick]``

The ``sizes`` benchmark runs every contender in a fresh process with a few dozen warm-up
forwards, which mixes two questions. This script separates them, for each size and
inter-op thread count (BLAS 1 throughout):

* **settling**: a fresh runtime's first ``--forwards`` forwards (default 80), each timed
  right after the same numpy forward run in the same loop. Per block of 10: the median
  forward over the block's best numpy forward, and the pool runs a forward. A runtime that
  has not yet learnt where its kernels belong (``dataflow._scheduler``, "the GIL lane")
  shows here as a high ratio with many pool runs.
* **settled**: after those forwards, numpy and dataflow (automatic, and compiled unless
  ``--no-compiled``) in blocks of about 20 ms, interleaved over ``--rounds`` rounds with
  the order rotated. It reports the best block against numpy's best, and the median of the
  per-round ratios.

Each (size, thread count) runs in a fresh process: what a runtime learns about a kernel
(its time, whether it holds the GIL) belongs to the op's signature and outlives the runtime,
so a row run after another of the same size would start settled and hide its own learning
phase. ``--in-process`` runs every row in this process instead (the first row of a size
learns, the later ones reuse it).

This is meant for many-core machines, where the learning phase was found
(``docs/benchmarks.md``, "Measured on 16 cores"). It measures whole processes from their
first forward, so it makes no claim about the fresh-process figures of ``python -m
benchmarks`` (which time after warming up). ``--engine numba`` measures the numba
recurrent engine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import dataflow  # noqa: E402
import ops  # noqa: E402
from benchmarks import _models  # noqa: E402
from benchmarks import _reference as ref  # noqa: E402

Size = tuple[int, int, int]


def _size(text: str) -> Size:
    t, b, c = (int(v) for v in text.lower().split("x"))
    return t, b, c


def settle(size: Size, threads: int, forwards: int, rounds: int, compiled: bool) -> str:
    """One size at one inter-op thread count: the settling line and the settled line."""
    t, b, c = size
    w = ref.make_weights(c, 4, seed=0)
    x = np.random.default_rng(0).standard_normal((t, b, c)).astype(np.float32)
    ens = _models.build_ensemble(w)
    fwd = dataflow.compile(ens) if compiled else None

    async def main() -> tuple[list[tuple[float, float, int]], dict[str, list[float]]]:
        rt = dataflow.current_runtime()
        assert rt is not None
        first: list[tuple[float, float, int]] = []
        for _ in range(forwards):
            t0 = time.perf_counter()
            ref.ensemble_forward(x, w)
            t1 = time.perf_counter()
            runs = rt.tasks_run
            await dataflow.materialize(await ens(x))
            first.append((t1 - t0, time.perf_counter() - t1, rt.tasks_run - runs))
        one = min(f[0] for f in first)
        n = max(2, int(0.02 / one))

        async def block(name: str) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                if name == "numpy":
                    ref.ensemble_forward(x, w)
                elif name == "compiled":
                    assert fwd is not None
                    await fwd(x)
                else:
                    await dataflow.materialize(await ens(x))
            return (time.perf_counter() - t0) / n

        names = ["numpy", "automatic"] + (["compiled"] if compiled else [])
        for name in names[2:]:  # the compiled plan's own warm-up
            for _ in range(max(1, 30 // n)):
                await block(name)
        times: dict[str, list[float]] = {k: [] for k in names}
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                times[name].append(await block(name))
        return first, times

    first, times = dataflow.run(main, interop_threads=threads)
    cells = []
    for a in range(0, len(first), 10):
        chunk = first[a : a + 10]
        best_np = min(f[0] for f in chunk)
        mid = sorted(f[1] for f in chunk)[len(chunk) // 2]
        cells.append(f"{mid / best_np:.2f}/p{sum(f[2] for f in chunk) / len(chunk):.0f}")
    best = min(times["numpy"])
    settled = []
    for name in list(times)[1:]:
        per = sorted(a / b_ for a, b_ in zip(times[name], times["numpy"], strict=True))
        settled.append(f"{name} {min(times[name]) / best:.2f} (median {per[len(per) // 2]:.2f})")
    return (
        f"({t}, {b}, {c}) inter-op {threads:2d}, numpy {best * 1e3:.2f} ms\n"
        f"  settling, per 10 forwards (median / numpy, pool runs a forward): {' '.join(cells)}\n"
        f"  settled, best / numpy best: {', '.join(settled)}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/bench_settle.py", description=__doc__)
    p.add_argument("--sizes", default="10x1x32,50x1x128,20x1x256,50x4x128")
    p.add_argument("--threads", default="1,2,16")
    p.add_argument("--forwards", type=int, default=80, help="timed one by one from the start")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--engine", choices=("numpy", "numba"), default="numpy")
    p.add_argument("--no-compiled", action="store_true")
    p.add_argument("--quick", action="store_true", help="smoke run: one tiny size, 2 threads")
    p.add_argument(
        "--in-process",
        action="store_true",
        help="every row in this process (later rows of a size start from what earlier ones learnt)",
    )
    p.add_argument("--row", help=argparse.SUPPRESS)  # TxBxC,THREADS: one row, in a child
    args = p.parse_args(argv)
    if args.quick:
        sizes, threads, forwards, rounds = [(4, 1, 8)], [2], 10, 2
    else:
        sizes = [_size(s) for s in args.sizes.split(",")]
        threads = [int(n) for n in args.threads.split(",")]
        forwards, rounds = args.forwards, args.rounds
    if forwards < 1 or rounds < 1:
        p.error("--forwards and --rounds must be at least 1")
    compiled = not args.no_compiled
    if args.row:
        text, n = args.row.split(",")
        _setup(args.engine)
        print(settle(_size(text), int(n), forwards, rounds, compiled), flush=True)
        return 0
    print(f"engine {args.engine}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    fresh = not (args.in_process or args.quick)
    if not fresh:
        _setup(args.engine)
    for size in sizes:
        for n in threads:
            if fresh:
                _child(size, n, args, forwards, rounds)
            else:
                print(settle(size, n, forwards, rounds, compiled), flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


def _setup(engine: str) -> None:
    threadpool_limits(1)
    ops.set_recurrent_engine(engine)


def _child(size: Size, threads: int, args: argparse.Namespace, forwards: int, rounds: int) -> None:
    """One row in a fresh process (its output goes straight to ours)."""
    t, b, c = size
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--row",
        f"{t}x{b}x{c},{threads}",
        "--forwards",
        str(forwards),
        "--rounds",
        str(rounds),
        "--engine",
        args.engine,
    ]
    if args.no_compiled:
        cmd.append("--no-compiled")
    sys.stdout.flush()
    done = subprocess.run(cmd, check=False)
    if done.returncode:
        print(f"({t}, {b}, {c}) inter-op {threads:2d}: the child failed (exit {done.returncode})")


if __name__ == "__main__":
    sys.exit(main())
