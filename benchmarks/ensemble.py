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

**Each contender's round runs in a fresh process** (``python -m benchmarks.ensemble
--child ...``): it rebuilds the weights from their seeds, loads the reference output the
parent saved once per size, builds its contender, runs warm-up rounds for at least half a
second (at least one; torch's profiling executor, dataflow's per-signature measurements, the
recurrent weights' layout, BLAS's threads all settle there), then the timed round, checks
the output, prints one JSON line and exits. So no contender inherits another's heap, threads
or caches, and the order rotates every round. A round's value is the mean time of ``k``
forward passes back to back (``k`` = 1 at the large sizes, more at the small ones so a round
lasts ~0.25 s). dataflow runs its ``k`` forwards inside one ``dataflow.run`` (so the
runtime's start, ~1 ms and measured in the ``overhead`` benchmark, is not counted); each
forward is timed from dispatch until its output array is ready.

Columns: ``median`` and ``min`` (the best round) of the rounds; ``vs numpy sequential``, the
median of per-round ratios; ``best vs best``, the ratio of the best rounds (noise on a shared
machine only ever adds time, so this is the steadier figure); ``roofline``, the fraction of
the GEMM roofline reached by the median: (the forward's projection GEMM flops / the rate
measured for that GEMM's own shape, plus the recurrent steps' flops / the rate measured for
the step GEMM's shape) / time, with the rates measured in the same run on one thread and on
all cores, and each row judged against the thread setting it runs with: a contender with one
BLAS thread per op and several inter-op threads against n cores x the one-thread rate, a
sequential one against the all-core rate (or the one-thread rate where that was faster).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

import dataflow

from . import _models
from . import _reference as ref
from ._harness import Comparison, Config, Contender, Row, interleave, module_main, run_child
from ._machine import cores

__all__ = ["MismatchError", "Workload", "gemm_rate", "matmul_rate", "run", "size_table"]

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


def gemm_rate(m: int, k: int, n: int, threads: int, min_seconds: float = 0.2) -> float:
    """The best float32 rate (flop/s) of ``(m, k) @ (n, k).T``, torch's layout, as the
    workload runs it: repeated for about ``min_seconds``, best single product."""
    rng = np.random.default_rng(0)
    a = rng.random((m, k), dtype=np.float32)
    w = rng.random((n, k), dtype=np.float32)
    out = np.empty((m, n), dtype=np.float32)
    best = float("inf")
    with threadpool_limits(limits=threads, user_api="blas"):
        np.matmul(a, w.T, out=out)
        t_end = time.perf_counter() + min_seconds
        reps = 0
        while reps < 3 or time.perf_counter() < t_end:
            t0 = time.perf_counter()
            np.matmul(a, w.T, out=out)
            best = min(best, time.perf_counter() - t0)
            reps += 1
    return 2.0 * m * k * n / best


def jax_missing() -> str | None:
    if importlib.util.find_spec("jax") is None:
        return "jax not installed (pip install jax jaxlib, or pip install -e '.[bench]')"
    return None


def torch_missing() -> str | None:
    return None if importlib.util.find_spec("torch") else "torch not installed"


def dask_missing() -> str | None:
    return None if importlib.util.find_spec("dask") else "dask not installed"


class Workload:
    """One size: weights, input, the reference output, and contender factories."""

    def __init__(
        self,
        size: tuple[int, int, int],
        quick: bool,
        *,
        expected: Any = None,
        repeats: int | None = None,
    ) -> None:
        self.size = size
        self.quick = quick
        t, b, c = size
        self.weights = ref.make_weights(c)
        self.x = ref.make_input(t, b, c)
        if expected is None or repeats is None:
            with threadpool_limits(limits=cores(), user_api="blas"):
                self.expected = ref.ensemble_forward(self.x, self.weights)
                t0 = time.perf_counter()
                ref.ensemble_forward(self.x, self.weights)
                once = time.perf_counter() - t0
            repeats = 1 if quick else max(1, min(50, round(ROUND_SECONDS / once)))
        else:
            self.expected = expected
        self.repeats = repeats
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

    def dataflow(
        self, name: str, interop: int, blas: int, forked: bool, note: str | None = None
    ) -> Contender:
        skip = _models.unavailable()
        ens: Any = None
        if skip is None:
            ens = _models.build_ensemble(self.weights)
        forward = _models.forward_forked if forked else _models.forward_auto

        def run(k: int) -> tuple[float, Any]:
            return run_dataflow(forward, ens, self.x, interop, k)

        note = f"inter-op {interop}, BLAS {blas}" if note is None else note
        return self.contender(name, note, run, blas=blas, skip=skip)

    def numpy_engine(self, compiled: bool = False) -> Contender:
        """dataflow with small directions on numpy's kernels (``ops.set_recurrent_engine(
        "numpy")``): what a program gets where numba is not installed, since the default
        engine, "auto", runs small float32 directions on numba's loops where it is (other
        sizes take numpy's kernels either way): the model as written (automatic), or
        ``dataflow.compile``'d (``compiled``)."""
        n = cores()
        name = "dataflow, compiled, numpy engine" if compiled else "dataflow, numpy engine"
        skip = _models.unavailable()
        model: Any = None
        if skip is None:
            ens = _models.build_ensemble(self.weights)
            model = dataflow.compile(ens) if compiled else ens

        async def call(f: Any, x: Any) -> Any:
            return await f(x)

        def run(k: int) -> tuple[float, Any]:
            import ops

            # The engine is process-wide: set for this contender's runs only (a child process
            # runs no other; in one process, as the quick check does, the others keep "auto").
            ops.set_recurrent_engine("numpy")
            try:
                forward = call if compiled else _models.forward_auto
                return run_dataflow(forward, model, self.x, n, k)
            finally:
                if self.quick:
                    ops.set_recurrent_engine("auto")

        return self.contender(name, f"inter-op {n}, BLAS 1", run, blas=1, skip=skip)

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

    def traced(self) -> Contender:
        """``dataflow.trace(ensemble, x).optimize()``: the captured graph, run each forward."""
        n = cores()
        skip = _models.unavailable()
        graph: Any = None
        if skip is None:
            ens = _models.build_ensemble(self.weights)
            graph = dataflow.trace(functools.partial(_models.forward_auto, ens), self.x)
            graph = graph.optimize()

        def run(k: int) -> tuple[float, Any]:
            return run_dataflow(lambda g, x: g(x), graph, self.x, n, k)

        return self.contender(
            "dataflow, traced graph", f"inter-op {n}, BLAS 1", run, blas=1, skip=skip
        )

    def compiled(self, name: str = "dataflow, compiled", interop: int | None = None) -> Contender:
        """``dataflow.compile(ensemble)``: the optimised graph launched whole each forward, its
        nodes run by the lean plan executor (``interop`` threads; default: the cores)."""
        n = cores() if interop is None else interop
        skip = _models.unavailable()
        forward: Any = None
        if skip is None:
            ens = _models.build_ensemble(self.weights)
            forward = dataflow.compile(ens)

        async def call(f: Any, x: Any) -> Any:
            return await f(x)

        def run(k: int) -> tuple[float, Any]:
            return run_dataflow(call, forward, self.x, n, k)

        return self.contender(name, f"inter-op {n}, BLAS 1", run, blas=1, skip=skip)

    def jax(self) -> Contender:
        n = cores()
        skip = jax_missing()
        call: Any = None
        if skip is None:
            from ._jax_models import build

            call = build(self.weights)
            call(self.x)  # compile

        def run(k: int) -> tuple[float, Any]:
            return _timed(k, lambda: call(self.x))

        return self.contender("JAX jit", f"XLA CPU, BLAS {n}", run, blas=n, skip=skip)

    def factories(self) -> dict[str, tuple[str, bool, Callable[[], Contender]]]:
        """Every contender by name: (its setting, whether it runs ops side by side on one
        BLAS thread each, and how to build it). Building is deferred: a child process builds
        only its own contender (and imports torch or JAX only for theirs)."""
        n = cores()
        return {
            "numpy sequential": (f"BLAS {n}", False, self.numpy_sequential),
            "numpy sequential, BLAS 1": ("BLAS 1", False, self.numpy_sequential_1),
            "numpy, directions on ThreadPoolExecutor": (
                f"{n} threads, BLAS 1",
                True,
                self.numpy_threads,
            ),
            "dataflow, 1 inter-op thread": (
                "inter-op 1, BLAS 1",
                False,
                lambda: self.dataflow("dataflow, 1 inter-op thread", 1, 1, forked=False),
            ),
            "dataflow, automatic": (
                f"inter-op {n}, BLAS 1",
                True,
                lambda: self.dataflow("dataflow, automatic", n, 1, forked=False),
            ),
            # Nothing set: BLAS keeps its own count (the cores), which a runtime lowers to one
            # thread while kernels run side by side (dataflow._blas).
            "dataflow, defaults": (
                f"inter-op {n}, BLAS adaptive",
                True,
                lambda: self.dataflow(
                    "dataflow, defaults", n, n, forked=False, note=f"inter-op {n}, BLAS adaptive"
                ),
            ),
            "dataflow, numpy engine": (f"inter-op {n}, BLAS 1", True, self.numpy_engine),
            "dataflow, traced graph": (f"inter-op {n}, BLAS 1", True, self.traced),
            "dataflow, compiled": (f"inter-op {n}, BLAS 1", True, self.compiled),
            "dataflow, compiled, numpy engine": (
                f"inter-op {n}, BLAS 1",
                True,
                lambda: self.numpy_engine(compiled=True),
            ),
            "dataflow, manual fork": (
                f"inter-op {n}, BLAS 1",
                True,
                lambda: self.dataflow("dataflow, manual fork", n, 1, forked=True),
            ),
            "torch eager": (
                f"intra-op {n}, no grad",
                False,
                lambda: self.torch("torch eager", n, script=False),
            ),
            "torch.jit.script": (
                f"intra-op {n}, no grad",
                False,
                lambda: self.torch("torch.jit.script", n, script=True),
            ),
            "script + fork members": (
                "intra-op 1, no grad",
                True,
                lambda: self.torch(
                    "script + fork members",
                    1,
                    script=True,
                    fork_directions=True,
                    fork_members=True,
                ),
            ),
            "JAX jit": (f"XLA CPU, BLAS {n}", False, self.jax),
            "dask threaded": (f"{n} workers, BLAS 1", True, self.dask),
        }

    def all_contenders(self) -> list[Contender]:
        """Every contender, built in this process (the quick check and the tests use this)."""
        return [build() for _, _, build in self.factories().values()]


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


SKIPS: dict[str, Callable[[], str | None]] = {
    "torch eager": torch_missing,
    "torch.jit.script": torch_missing,
    "script + fork members": torch_missing,
    "JAX jit": jax_missing,
    "dask threaded": dask_missing,
}


def roofline_seconds(
    size: tuple[int, int, int], models: int, rates: dict[str, float], parallel: bool
) -> float:
    """The GEMM roofline of one forward: its projection and step GEMMs at the rates measured
    for their own shapes, on n cores x one thread (``parallel``) or all cores at once."""
    t, b, c = size
    n = cores()
    proj = 2.0 * t * b * c * 4 * c * 2 * models
    steps = 2.0 * t * b * c * 4 * c * 2 * models
    if parallel:
        return (proj / rates["proj1"] + steps / rates["step1"]) / n
    proj_rate = max(rates["projN"], rates["proj1"])
    step_rate = max(rates["stepN"], rates["step1"])
    return proj / proj_rate + steps / step_rate


def measure_rates(size: tuple[int, int, int], quick: bool) -> dict[str, float]:
    """The projection (T*B, C) x (C, 4C) and step (B, C) x (C, 4C) GEMM rates, 1 and n threads."""
    t, b, c = size
    n = cores()
    secs = 0.02 if quick else 0.4
    shapes = {"proj": (t * b, c, 4 * c), "step": (b, c, 4 * c)}
    rates: dict[str, float] = {}
    # Twice each, alternating: a core that was away during one measurement (a shared VM)
    # would otherwise set the roofline below what the contenders then reach.
    for _ in range(1 if quick else 2):
        for name, (m, k, nn) in shapes.items():
            for threads, tag in ((1, "1"), (n, "N")):
                key = name + tag
                rates[key] = max(rates.get(key, 0.0), gemm_rate(m, k, nn, threads, secs))
    return rates


def add_roofline(rows: Any, roofline: dict[str, float], flops: float) -> None:
    """Fill the ``best vs best``, ``roofline`` and ``GFLOP/s`` columns."""
    base = next((r for r in rows if r.name == "numpy sequential" and r.values), None)
    for row in rows:
        if row.median:
            row.extra["best vs best"] = row.min / base.min if base is not None else None
            row.extra["roofline"] = roofline[row.name] / row.median
            row.extra["GFLOP/s"] = flops / row.median / 1e9


# -- fresh processes --------------------------------------------------------------------------


def _child_contender(
    name: str, note: str, size: tuple[int, int, int], repeats: int, expected: Path
) -> Contender:
    """A contender whose every round is a fresh ``python -m benchmarks.ensemble --child``."""
    args = json.dumps(
        {"name": name, "size": list(size), "repeats": repeats, "expected": str(expected)}
    )

    def measure() -> float:
        what = f"ensemble {size}: contender {name!r}"
        seconds: float = run_child("benchmarks.ensemble", args, MismatchError, what)["seconds"]
        return seconds

    return Contender(name, measure, note=note)


#: A fresh process's warm-up lasts at least this long after its first round (whole rounds;
#: at least one).
WARM_UP_SECONDS = 0.5


def child_main(spec: str) -> None:
    """One contender, one round, in this fresh process: warm-up, timed round, check, JSON."""
    d = json.loads(spec)
    size = (int(d["size"][0]), int(d["size"][1]), int(d["size"][2]))
    expected = np.load(d["expected"])
    w = Workload(size, False, expected=expected, repeats=int(d["repeats"]))
    contender = w.factories()[d["name"]][2]()
    # Warm-up rounds (checked too), for at least WARM_UP_SECONDS after the first: one round
    # of two forwards at (50, 50, 256) left a fresh runtime still measuring where its kernels
    # belong (its first 4-5 forwards took 76-119 ms, later ones 66-77), so two of three timed
    # rounds read 99-104 ms. The first round pays the process's one-time costs (imports,
    # loading numba's compiled loops: 0.6 s), which would otherwise use up the warm-up: at
    # (50, 1, 128) the timed round was then forwards 31-60 of the process, automatic's at
    # 2.7-3.4 ms a forward against 2.0-2.3 from about the 90th on.
    contender.measure()
    start = time.perf_counter()
    while True:
        contender.measure()
        if time.perf_counter() - start >= WARM_UP_SECONDS:
            break
    seconds = contender.measure()
    print(json.dumps({"name": d["name"], "seconds": seconds}), flush=True)
    # torch's thread pools have aborted at interpreter exit: the report is out, leave now.
    os._exit(0)


def size_table(
    benchmark: str,
    size: tuple[int, int, int],
    w: Workload,
    rows: list[Row],
    params: dict[str, Any],
    columns: tuple[str, ...],
    notes: list[str],
) -> Comparison:
    """One size's table of seconds per forward against numpy sequential (``ensemble`` and
    ``sizes``); ``params`` gain the size and the forwards per round."""
    t, b, c = size
    return Comparison(
        benchmark,
        f"ensemble (T, B, C) = ({t}, {b}, {c}): seconds per forward",
        "s",
        "numpy sequential",
        rows,
        params={"size": list(size), "repeats_per_round": w.repeats, **params},
        columns=columns,
        notes=notes,
    )


def chosen(factories: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The contenders named (``--contender``), with the baseline; all when none is named.

    Raises:
        ValueError: a name that is no contender (the message lists them).
    """
    if not names:
        return factories
    unknown = [n for n in names if n not in factories]
    if unknown:
        raise ValueError(
            f"ensemble: no contender named {', '.join(map(repr, unknown))}; the contenders: "
            + ", ".join(map(repr, factories))
        )
    return {k: v for k, v in factories.items() if k == "numpy sequential" or k in names}


def run(cfg: Config, log: Callable[[str], None]) -> list[Comparison]:
    """One table per size; every round of every contender in a fresh process (quick mode:
    every contender in this process, once, on a tiny size, as a check that each still runs
    and matches the reference)."""
    n = cores()
    comparisons = []
    sizes = QUICK_SIZES if cfg.quick else (cfg.sizes or SIZES)
    with tempfile.TemporaryDirectory(prefix="dataflow-bench-") as tmp:
        for size in sizes:
            w = Workload(size, cfg.quick)
            factories = chosen(w.factories(), cfg.contenders)
            log(f"ensemble: {size}: measuring the GEMM rates at the workload's shapes")
            rates = measure_rates(size, cfg.quick)
            expected = Path(tmp) / f"expected-{'x'.join(map(str, size))}.npy"
            np.save(expected, w.expected)
            contenders: list[Contender] = []
            roofline: dict[str, float] = {}
            for name, (note, parallel, build) in factories.items():
                roofline[name] = roofline_seconds(size, len(w.weights.models), rates, parallel)
                missing = SKIPS.get(name, lambda: None)()
                if missing is not None:
                    contenders.append(Contender(name, lambda: 0.0, note=note, skip=missing))
                elif cfg.quick:
                    contenders.append(build())
                else:
                    contenders.append(_child_contender(name, note, size, w.repeats, expected))
            rounds = 1 if cfg.quick else cfg.rounds_for(size)
            log(f"ensemble: {size}: {w.repeats} forward(s) per round, {w.flops / 1e9:.1f} GFLOP")
            load0 = os.getloadavg()[0]
            rows = interleave(
                contenders,
                rounds,
                baseline="numpy sequential",
                warmup=0,
                log=log,
            )
            load1 = os.getloadavg()[0]
            add_roofline(rows, roofline, w.flops)
            comparisons.append(
                size_table(
                    "ensemble",
                    size,
                    w,
                    rows,
                    {
                        "gemm_flops": w.flops,
                        "rounds": rounds,
                        "gemm_rates_flops": rates,
                        "roofline_s": roofline,
                        "load_average": [load0, load1],
                        "fresh_processes": not cfg.quick,
                    },
                    ("best vs best", "roofline", "GFLOP/s"),
                    [
                        f"{w.flops / 1e9:.1f} GFLOP of matmul per forward; GEMM rates at the "
                        f"workload's shapes, GFLOP/s: projection {rates['proj1'] / 1e9:.0f} "
                        f"(1 thread) / {rates['projN'] / 1e9:.0f} ({n}), step "
                        f"{rates['step1'] / 1e9:.0f} / {rates['stepN'] / 1e9:.0f}",
                        (
                            "quick check: one round of each contender in this process"
                            if cfg.quick
                            else f"{rounds} rounds, each contender's round in a fresh process "
                            f"after warming up there (at least {WARM_UP_SECONDS:g} s)"
                        )
                        + f"; round value = mean of {w.repeats} forward(s); "
                        "ratio = median of per-round ratios to numpy sequential, best vs "
                        "best = ratio of best rounds (lower is faster); outputs checked",
                        f"load average (1 min) {load0:.2f} -> {load1:.2f} on {n} cores",
                    ],
                )
            )
            del w, contenders
    return comparisons


def main(argv: list[str] | None = None) -> None:
    module_main("ensemble", __doc__.splitlines()[0], child_main, argv)


if __name__ == "__main__":
    main()
