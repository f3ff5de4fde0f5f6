"""The TorchScript tutorial's LSTM ensemble ("Dynamic Parallelism in TorchScript"), in dataflow.

An ensemble of bidirectional LSTMs (T, B, C = 50, 50, 1024; 4 models): each model runs one
LSTM forward in time and one over the time-flipped input, flips the second output back and
concatenates the two on the channel axis; the ensemble stacks the models' outputs and sums.

The model below is written plainly, with no fork: each forward only dispatches ops and returns
pending tensors, so the scheduler sees all 8 LSTM directions at once and overlaps them by
itself. The script runs it three ways and compares:

* sequential: one inter-op thread (the tutorial's 2.05 s baseline);
* manual forks: the tutorial's ``fork`` per direction and per member, then ``wait``;
* automatic: the plain model on the same threads, no fork.

Run it with ``dataflow run examples/lstm_ensemble.py --small`` or
``python examples/lstm_ensemble.py --small``; without ``--small`` it runs the tutorial's size
(about a minute on 2 cores). Progress goes to stderr: a bar on a terminal, a line per round
otherwise (``--quiet``: none). Times are medians over the rounds; a speedup is the median of
the per-round ratios (sequential time / that way's time in the same round), so it need not
equal the ratio of the two medians. ``--trace parallel.json`` also profiles one automatic run
and writes its timeline.
Other code imports the model: ``from examples.lstm_ensemble import Ensemble``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

import dataflow
import ops

Array = np.ndarray[Any, Any]


class BiLSTM(ops.nn.Module):
    """One LSTM over x, one over x flipped in time; outputs concatenated on the channel axis."""

    def __init__(self, c: int, *, rng: np.random.Generator | None = None) -> None:
        self.cell_f = ops.nn.LSTM(c, c, rng=rng)
        self.cell_b = ops.nn.LSTM(c, c, rng=rng)

    async def forward(self, x: ops.Tensor | Array) -> ops.Tensor:
        out_f, _ = await self.cell_f(x)
        out_b, _ = await self.cell_b(ops.flip(x, axis=0))
        out: ops.Tensor = ops.concatenate([out_f, ops.flip(out_b, axis=0)], axis=2)
        return out


class Ensemble(ops.nn.Module):
    """``n`` BiLSTMs on the same input; their outputs stacked and summed."""

    def __init__(self, n: int, c: int, *, seed: int | None = 0) -> None:
        rng = np.random.default_rng(seed)
        self.models = [BiLSTM(c, rng=rng) for _ in range(n)]

    async def forward(self, x: ops.Tensor | Array) -> ops.Tensor:
        results = [await m(x) for m in self.models]  # returns pending tensors quickly
        out: ops.Tensor = ops.sum(ops.stack(results), axis=0)
        return out


# -- the tutorial's manual fork/wait placement, for comparison ---------------------------------


async def bilstm_forked(m: BiLSTM, x: ops.Tensor | Array) -> ops.Tensor:
    """BiLSTM.forward with the forward direction forked (the tutorial's first change)."""
    future_f = dataflow.fork(m.cell_f, x)
    out_b, _ = await m.cell_b(ops.flip(x, axis=0))
    out_f, _ = await dataflow.wait(future_f)
    out: ops.Tensor = ops.concatenate([out_f, ops.flip(out_b, axis=0)], axis=2)
    return out


async def ensemble_forked(ens: Ensemble, x: ops.Tensor | Array) -> ops.Tensor:
    """Ensemble.forward with every member forked, then waited (the tutorial's second change)."""
    futures = [dataflow.fork(bilstm_forked, m, x) for m in ens.models]
    results = [await dataflow.wait(f) for f in futures]
    out: ops.Tensor = ops.sum(ops.stack(results), axis=0)
    return out


async def ensemble_auto(ens: Ensemble, x: ops.Tensor | Array) -> Array:
    """The plain model: no fork anywhere (one await gives the output array)."""
    out: Array = await ens(x)
    return out


# -- running and timing -----------------------------------------------------------------------

Forward = Callable[[Ensemble, Array], Awaitable[ops.Tensor | Array]]


def matmul_gflop(steps: int, batch: int, channels: int, models: int) -> float:
    """GFLOP of matmul in one forward: per direction, projection + recurrence, 16*T*B*C^2."""
    return 2 * models * 16 * steps * batch * channels * channels / 1e9


def timed_run(
    forward: Forward,
    ens: Ensemble,
    x: Array,
    *,
    interop_threads: int,
    intraop_threads: int | None,
) -> tuple[float, Array]:
    """One forward in a fresh runtime: (seconds, output). The pool's start is not timed."""

    async def main() -> tuple[float, Array]:
        t0 = time.perf_counter()
        y: Array = await dataflow.materialize(await forward(ens, x))
        return time.perf_counter() - t0, y

    return dataflow.run(main, interop_threads=interop_threads, intraop_threads=intraop_threads)


class Progress:
    """Where ``compare`` is: a bar redrawn on a terminal, else a line per finished round.

    Args:
        stream: where to write (stderr, so stdout keeps only the results).
        runs: how many timed runs there will be (the warm-up included).
    """

    def __init__(self, stream: TextIO, runs: int) -> None:
        self.stream = stream
        self.runs = runs
        self.done = 0
        self.bar = stream.isatty()
        self._round: list[str] = []

    def run_done(self, round_no: int, rounds: int, name: str, seconds: float | None) -> None:
        """A run finished (``seconds`` None: the warm-up)."""
        self.done += 1
        what = "warm-up" if seconds is None else f"{name} {seconds * 1e3:.1f} ms"
        if self.bar:
            filled = round(24 * self.done / self.runs)
            where = what if seconds is None else f"round {round_no}/{rounds}: {what}"
            self.stream.write(
                f"\r\x1b[K[{'#' * filled}{'.' * (24 - filled)}] {self.done}/{self.runs} runs"
                f"  {where}"
            )
            self.stream.flush()
            return
        if seconds is None:
            return
        self._round.append(what)
        if len(self._round) == 3:
            self.stream.write(f"round {round_no}/{rounds}: {', '.join(self._round)}\n")
            self.stream.flush()
            self._round = []

    def close(self) -> None:
        """Clear the bar (on a terminal), so the results start on a clean line."""
        if self.bar:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def compare(
    ens: Ensemble,
    x: Array,
    *,
    interop_threads: int,
    intraop_threads: int | None,
    rounds: int,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run sequential, manual-fork and automatic ``rounds`` times each, interleaved.

    Interleaving round by round keeps a slow moment of a shared machine from landing on one
    contender only. The times are medians over the rounds; the speedups are medians of the
    per-round ratios (sequential / that way, each round), which need not equal the ratio of
    the medians.
    """
    modes: list[tuple[str, Forward, int]] = [
        ("sequential", ensemble_auto, 1),
        ("manual forks", ensemble_forked, interop_threads),
        ("automatic", ensemble_auto, interop_threads),
    ]
    # Warm-up: first touches of the weights, numpy's allocator, BLAS's buffers.
    timed_run(ensemble_auto, ens, x, interop_threads=1, intraop_threads=intraop_threads)
    if progress is not None:
        progress.run_done(0, rounds, "warm-up", None)
    times: dict[str, list[float]] = {name: [] for name, _, _ in modes}
    outputs: dict[str, Array] = {}
    for round_no in range(1, rounds + 1):
        for name, forward, threads in modes:
            seconds, y = timed_run(
                forward, ens, x, interop_threads=threads, intraop_threads=intraop_threads
            )
            times[name].append(seconds)
            outputs[name] = y
            if progress is not None:
                progress.run_done(round_no, rounds, name, seconds)
    seq = times["sequential"]
    return {
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "speedup": {
            k: statistics.median(s / t for s, t in zip(seq, v, strict=True))
            for k, v in times.items()
        },
        "outputs": outputs,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (``sys.argv[1:]`` by default, as ``dataflow run`` sets it)."""
    p = argparse.ArgumentParser(
        prog="lstm_ensemble.py",
        description="The TorchScript tutorial's LSTM ensemble: sequential vs fork vs automatic.",
    )
    p.add_argument("--small", action="store_true", help="quick run: T, B, C = 10, 4, 64")
    p.add_argument("--steps", "-T", type=int, default=None, help="time steps (default 50)")
    p.add_argument("--batch", "-B", type=int, default=None, help="batch size (default 50)")
    p.add_argument("--channels", "-C", type=int, default=None, help="channels (default 1024)")
    p.add_argument("--models", type=int, default=4, help="ensemble members (default 4)")
    p.add_argument(
        "--interop-threads",
        type=int,
        default=None,
        help="inter-op threads (default: dataflow's, the cores; the ensemble has 8 directions)",
    )
    p.add_argument("--intraop-threads", type=int, default=1, help="BLAS threads per op (default 1)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 3; 5 small)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the input")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument(
        "--trace",
        metavar="PATH",
        default=None,
        help="also profile one automatic run and write its Chrome trace (ui.perfetto.dev)",
    )
    args = p.parse_args(argv)
    small = (10, 4, 64) if args.small else (50, 50, 1024)
    # `is None`, not `or`: an explicit 0 is an error below, not the default.
    if args.steps is None:
        args.steps = small[0]
    if args.batch is None:
        args.batch = small[1]
    if args.channels is None:
        args.channels = small[2]
    if args.rounds is None:
        args.rounds = 5 if args.small else 3
    if args.interop_threads is None:
        args.interop_threads = dataflow.get_num_interop_threads()
    names = ("steps", "batch", "channels", "models", "interop_threads", "intraop_threads", "rounds")
    for name in names:
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.seed < 0:  # (numpy's seeds are non-negative: its own error was a traceback)
        p.error(f"--seed must be 0 or more, got {args.seed}")
    if args.trace is not None:
        # Checked now, not after the whole benchmark has run.
        trace = Path(args.trace)
        if not args.trace:
            p.error("--trace: the path is empty")
        if trace.is_dir():
            p.error(f"--trace: {args.trace} is a directory")
        if not trace.parent.is_dir():
            p.error(f"--trace: no directory {str(trace.parent)!r} to write {args.trace} in")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Build the ensemble, run the three ways, print times, speedups and the equality check."""
    args = parse_args(argv)
    t, b, c, n = args.steps, args.batch, args.channels, args.models
    ens = Ensemble(n, c, seed=args.seed)
    x = np.random.default_rng(args.seed + 1).random((t, b, c), dtype=np.float32)
    print(
        f"LSTM ensemble: {n} x BiLSTM, T, B, C = {t}, {b}, {c} "
        f"({matmul_gflop(t, b, c, n):.3g} GFLOP of matmul); inter-op threads "
        f"{args.interop_threads}, intra-op threads {args.intraop_threads}, {args.rounds} rounds"
    )
    sys.stdout.flush()  # the header before the progress lines, when both go to one log
    progress = None if args.quiet else Progress(sys.stderr, 1 + 3 * args.rounds)
    try:
        result = compare(
            ens,
            x,
            interop_threads=args.interop_threads,
            intraop_threads=args.intraop_threads,
            rounds=args.rounds,
            progress=progress,
        )
    finally:
        if progress is not None:
            progress.close()
    print(f"  {'':<28} {'median time':>13}   {'median speedup':>14}")
    for name, seconds in result["median_s"].items():
        threads = 1 if name == "sequential" else args.interop_threads
        label = f"{name} ({threads} thread{'s' if threads > 1 else ''})"
        speed = result["speedup"][name]
        print(f"  {label:<28} {seconds * 1e3:10.1f} ms   {speed:13.2f}x vs sequential")
    print(f"  times: medians of {args.rounds} rounds; speedups: medians of the per-round ratios")
    print("  (sequential / that way, in the same round), so not the ratio of the two medians")
    outs = result["outputs"]
    ref = outs["sequential"]
    equal = all(np.allclose(ref, y, rtol=1e-5, atol=1e-5) for y in outs.values())
    diff = max(float(np.max(np.abs(ref - y))) for y in outs.values())
    print(f"  outputs equal (np.allclose): {equal} (max abs diff {diff:.2e}), shape {ref.shape}")
    if args.trace:
        with dataflow.profile() as prof:
            timed_run(
                ensemble_auto,
                ens,
                x,
                interop_threads=args.interop_threads,
                intraop_threads=args.intraop_threads,
            )
        prof.export_chrome_trace(args.trace)
        print(f"trace of one automatic run written to {args.trace}:")
        print(prof.summary())
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
