"""Benchmarks for dataflow: ``python -m benchmarks`` (see ``docs/benchmarks.md``).

Every comparison runs its contenders side by side in one process run, round by round, and
prints a table plus one ``BENCH_JSON`` line per benchmark; the full results are saved as JSON
together with a description of the machine.

Benchmarks: ``overhead`` (us per tiny task), ``ensemble`` (the TorchScript tutorial's LSTM
ensemble on real kernels vs numpy, torch and dask), ``simulated`` (scheduling quality on
simulated kernels, against the lower bound), ``memory`` (peak RSS), ``scaling`` (real kernels
over inter-op thread counts).
"""

from __future__ import annotations

from ._cli import BENCHMARKS as BENCHMARKS
from ._cli import main as main

__all__ = ("BENCHMARKS", "main")
