"""The seed tutorial's LSTM ensemble on real kernels: dataflow vs numpy, torch and dask.

Sizes (T, B, C): (50, 50, 1024) (the tutorial's), (50, 50, 256), (50, 1, 128); 4 members.
Every contender computes the same function with the same float32 weights, and every output
is checked against the numpy reference (``np.allclose``, rtol 1e-4, atol 1e-5) in every round:
a mismatch stops the benchmark with an error.

Thread settings are part of each contender and shown in the table: BLAS (OpenBLAS, numpy's)
intra-op threads are set with threadpoolctl and torch's with ``torch.set_num_threads``, both
outside the timed part. The inter-op/intra-op split follows REFERENCE.md: the sequential
contenders use every core inside each GEMM; the parallel ones one thread per GEMM and one
inter-op thread per core.

A round's value is the mean time of ``k`` forward passes back to back (``k`` = 1 at the
large sizes, more at the small ones so a round lasts ~0.25 s). dataflow runs its ``k``
forwards inside one ``dataflow.run`` (so the runtime's start, ~1 ms and measured in the
``overhead`` benchmark, is not counted); each forward is timed from dispatch until its
output array is ready.

``roofline`` is the fraction of the GEMM roofline reached: (GEMM flops / best float32 matmul
rate measured in the same run with all cores) / time. 1.0 would mean every core did nothing
but peak-rate matmul the whole time.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

import dataflow

from . import _models
from . import _reference as ref
from ._harness import Comparison, Config, Contender, interleave
from ._machine import cores

__all__ = ["MismatchError", "Workload", "matmul_rate", "run"]

SIZES = ((50, 50, 1024), (50, 50, 256), (50, 1, 128))
QUICK_SIZES = ((5, 4, 32),)
ROUND_SECONDS = 0.25  # small sizes repeat the forward so a round lasts about this long


class MismatchError(AssertionError):
    """A contender's output differs from the numpy reference."""


def matmul_rate(n: int, reps: int, threads: int) -> float:
    """The best float32 matmul rate (flop/s) of ``reps`` (n, n) x (n, n) products."""
    rng = np.random.default_rng(0)
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    best = 0.0
    with threadpool_limits(limits=threads, user_api="blas"):
        a @ b  # warm up (threads, page faults)
        for _ in range(reps):
            t0 = time.perf_counter()
            a @ b
            best = max(best, 2.0 * n**3 / (time.perf_counter() - t0))
    return best


def torch_missing() -> str | None:
    return None if importlib.util.find_spec("torch") else "torch not installed"


def dask_missing() -> str | None:
    return None if importlib.util.find_spec("dask") else "dask not installed"


class Workload:
    """One size: weights, input, the reference output, and contender factories."""

    def __init__(self, size: tuple[int, int, int], quick: bool) -> None:
        self.size = size
        t, b, c = size
        self.weights = ref.make_weights(c)
        self.x = ref.make_input(t, b, c)
        with threadpool_limits(limits=cores(), user_api="blas"):
            self.expected = ref.ensemble_forward(self.x, self.weights)
            t0 = time.perf_counter()
            ref.ensemble_forward(self.x, self.weights)
            once = time.perf_counter() - t0
        self.repeats = 1 if quick else max(1, min(50, round(ROUND_SECONDS / once)))
        self.flops = ref.gemm_flops(t, b, c, len(self.weights.models))

    def check(self, name: str, out: Any) -> None:
        ok, diff = ref.allclose(out, self.expected)
        if not ok:
            got = np.shape(out)
            raise MismatchError(
                f"ensemble {self.size}: {name}'s output differs from the numpy reference "
                f"(shape {got} vs {self.expected.shape}, max |diff| {diff:.3g}, rtol "
                f"{ref.RTOL}, atol {ref.ATOL})"
            )

    def contender(
        self,
        name: str,
        note: str,
        run: Callable[[int], tuple[float, Any]],
        *,
        blas: int,
        torch_threads: int | None = None,
        skip: str | None = None,
    ) -> Contender:
        """A contender whose ``run(k)`` returns (mean seconds of k forwards, last output)."""
        k = self.repeats

        def measure() -> float:
            with threadpool_limits(limits=blas, user_api="blas"):
                if torch_threads is not None:
                    import torch

                    torch.set_num_threads(torch_threads)
                seconds, out = run(k)
            self.check(name, out)
            return seconds

        return Contender(name, measure, note=note, skip=skip)

    # -- contenders ----------------------------------------------------------------------

    def numpy_sequential(self) -> Contender:
        def run(k: int) -> tuple[float, Any]:
            return _timed(k, lambda: ref.ensemble_forward(self.x, self.weights))

        n = cores()
        return self.contender("numpy sequential", f"BLAS {n}", run, blas=n)

    def numpy_sequential_1(self) -> Contender:
        """The same with one BLAS thread: faster than all cores at the small sizes."""

        def run(k: int) -> tuple[float, Any]:
            return _timed(k, lambda: ref.ensemble_forward(self.x, self.weights))

        return self.contender("numpy sequential, BLAS 1", "BLAS 1", run, blas=1)

    def numpy_threads(self) -> Contender:
        """The 8 directions hand-threaded on a ThreadPoolExecutor (REFERENCE.md's "numpy with
        the 8 directions on a 2-thread pool")."""
        n = cores()
        x_rev = np.ascontiguousarray(self.x[::-1])

        def forward(ex: ThreadPoolExecutor) -> Any:
            futs = [
                (
                    ex.submit(ref.lstm_forward, self.x, m.forward),
                    ex.submit(ref.lstm_forward, x_rev, m.backward),
                )
                for m in self.weights.models
            ]
            members = [np.concatenate([f.result(), b.result()[::-1]], axis=2) for f, b in futs]
            return np.stack(members).sum(axis=0)

        def run(k: int) -> tuple[float, Any]:
            with ThreadPoolExecutor(max_workers=n) as ex:
                return _timed(k, lambda: forward(ex))

        return self.contender(
            "numpy, directions on ThreadPoolExecutor", f"{n} threads, BLAS 1", run, blas=1
        )

    def dataflow(self, name: str, interop: int, blas: int, forked: bool) -> Contender:
        skip = _models.unavailable()
        ens: Any = None
        if skip is None:
            ens = _models.build_ensemble(self.weights)
        forward = _models.forward_forked if forked else _models.forward_auto

        def run(k: int) -> tuple[float, Any]:
            return run_dataflow(forward, ens, self.x, interop, k)

        return self.contender(name, f"inter-op {interop}, BLAS {blas}", run, blas=blas, skip=skip)

    def torch(
        self,
        name: str,
        threads: int,
        *,
        script: bool,
        fork_directions: bool = False,
        fork_members: bool = False,
    ) -> Contender:
        skip = torch_missing()
        if skip is not None:
            return Contender(name, lambda: 0.0, note=f"intra-op {threads}", skip=skip)
        import torch

        from . import _torch_models

        model = _torch_models.build(
            self.weights, fork_directions=fork_directions, fork_members=fork_members, script=script
        )
        xt = torch.from_numpy(self.x)

        def call() -> Any:
            with torch.no_grad():
                return model(xt)

        torch.set_num_threads(threads)
        call()  # the profiling executor optimises a scripted model after its first runs
        call()

        def run(k: int) -> tuple[float, Any]:
            seconds, out = _timed(k, call)
            return seconds, out.numpy()

        return self.contender(
            name, f"intra-op {threads}, no grad", run, blas=1, torch_threads=threads
        )

    def dask(self) -> Contender:
        n = cores()
        skip = dask_missing()
        graph: dict[Any, Any] = {}
        if skip is None:
            from ._dask_ensemble import ensemble_graph

            graph = ensemble_graph(self.x, self.weights)

        def run(k: int) -> tuple[float, Any]:
            import dask.threaded

            from ._dask_ensemble import OUTPUT_KEY

            return _timed(k, lambda: dask.threaded.get(graph, OUTPUT_KEY, num_workers=n))

        return self.contender("dask threaded", f"{n} workers, BLAS 1", run, blas=1, skip=skip)

    def all_contenders(self) -> list[Contender]:
        n = cores()
        return [
            self.numpy_sequential(),
            self.numpy_sequential_1(),
            self.numpy_threads(),
            self.dataflow("dataflow, 1 inter-op thread", 1, n, forked=False),
            self.dataflow("dataflow, automatic", n, 1, forked=False),
            self.dataflow("dataflow, manual fork", n, 1, forked=True),
            self.torch("torch eager", n, script=False),
            self.torch("torch.jit.script", n, script=True),
            self.torch("script + fork directions", 1, script=True, fork_directions=True),
            self.torch(
                "script + fork members", 1, script=True, fork_directions=True, fork_members=True
            ),
            self.dask(),
        ]


def _timed(k: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    out = None
    t0 = time.perf_counter()
    for _ in range(k):
        out = fn()
    return (time.perf_counter() - t0) / k, out


def run_dataflow(
    forward: Callable[[Any, Any], Any], ens: Any, x: Any, interop: int, k: int
) -> tuple[float, Any]:
    """``k`` forwards in one runtime, each timed from dispatch to its output array."""

    async def main() -> tuple[float, Any]:
        times = []
        out = None
        for _ in range(k):
            t0 = time.perf_counter()
            out = await dataflow.materialize(await forward(ens, x))
            times.append(time.perf_counter() - t0)
        return statistics.fmean(times), out

    return dataflow.run(main, interop_threads=interop)


def add_roofline(rows: Any, flops: float, rate: float) -> None:
    """Fill the ``roofline`` and ``GFLOP/s`` columns."""
    for row in rows:
        if row.median:
            row.extra["roofline"] = flops / rate / row.median
            row.extra["GFLOP/s"] = flops / row.median / 1e9


def run(cfg: Config, log: Callable[[str], None]) -> list[Comparison]:
    """One table per size."""
    n = cores()
    big = 512 if cfg.quick else 4096
    log(f"ensemble: measuring the float32 matmul rate ({big}^3, BLAS {n} threads)")
    rate_all = matmul_rate(big, 2 if cfg.quick else 5, n)
    rate1 = matmul_rate(big // 2, 2 if cfg.quick else 3, 1)
    # The best rate seen: if one thread beat all of them, a core was away during the run.
    rate = max(rate_all, rate1)
    log(
        f"ensemble: best matmul {rate_all / 1e9:.1f} GFLOP/s ({n} threads), "
        f"{rate1 / 1e9:.1f} GFLOP/s (1 thread)"
    )
    comparisons = []
    for size in QUICK_SIZES if cfg.quick else SIZES:
        log(f"ensemble: {size}: building contenders")
        w = Workload(size, cfg.quick)
        contenders = w.all_contenders()
        log(f"ensemble: {size}: {w.repeats} forward(s) per round, {w.flops / 1e9:.1f} GFLOP")
        rows = interleave(contenders, cfg.rounds_for(size), baseline="numpy sequential", log=log)
        add_roofline(rows, w.flops, rate)
        t, b, c = size
        comparisons.append(
            Comparison(
                "ensemble",
                f"ensemble (T, B, C) = ({t}, {b}, {c}): seconds per forward",
                "s",
                "numpy sequential",
                rows,
                params={
                    "size": list(size),
                    "gemm_flops": w.flops,
                    "repeats_per_round": w.repeats,
                    "rounds": cfg.rounds_for(size),
                    "matmul_rate_flops": rate,
                    "matmul_rate_1thread_flops": rate1,
                    "roofline_s": w.flops / rate,
                },
                columns=("roofline", "GFLOP/s"),
                notes=[
                    f"{w.flops / 1e9:.1f} GFLOP of matmul per forward; best float32 matmul "
                    f"{rate_all / 1e9:.0f} GFLOP/s on {n} threads ({rate1 / 1e9:.0f} on 1) -> "
                    f"roofline {w.flops / rate:.4g} s",
                    f"{cfg.rounds_for(size)} rounds (+1 warm-up); round value = mean of "
                    f"{w.repeats} forward(s); ratio = median of per-round "
                    "ratios to numpy sequential (lower is faster); outputs checked every round",
                ],
            )
        )
        del w, contenders
    return comparisons
