"""Benchmarks for dataflow: ``python -m benchmarks`` (see ``docs/benchmarks.md``).

Every comparison runs its contenders side by side in one run, round by round (``ensemble``,
``memory`` and ``serving`` run each contender's round in a fresh process), and prints a table
plus one ``BENCH_JSON`` line per benchmark; the full results are saved as JSON together with a
description of the machine.

Benchmarks: ``overhead`` (us per tiny task, and a tiny real op against ``np.add``),
``ensemble`` (the TorchScript tutorial's LSTM ensemble on real kernels vs numpy, torch, JAX
and dask), ``simulated`` (scheduling quality on simulated kernels, against the lower bound),
``memory`` (peak RSS), ``scaling`` (real kernels over inter-op thread counts), ``serving``
(the ensemble behind an HTTP server: throughput and event-loop lag).
"""

from __future__ import annotations

from ._cli import BENCHMARKS as BENCHMARKS
from ._cli import main as main

__all__ = ("BENCHMARKS", "main")
