"""Scheduling quality on simulated kernels: makespan against the lower bound, 1..16 threads.

Each program below is run under ``dataflow.Runtime(simulate=...)``: every graph task's
kernel is replaced by a GIL-free ``time.sleep`` of the time the scheduler estimates for it
(``dataflow.estimate_seconds(task.cost)``), scaled so that the whole graph is about
``TARGET_WORK`` seconds of work. Sleeping threads need no core, so 16 inter-op threads can
be studied on a 2-core machine: what is measured is the scheduler (ready order, hand-offs,
its own overhead), not the kernels.

An instrument records every task as it is created (id, input ids, cost) and the simulated
kernel records how long each sleep really took. From them:

* ``lower bound`` = ``max(critical path, total work / threads)`` over the *measured* kernel
  durations of that very run: no schedule of those kernels on that many threads can be
  faster. The value reported is **makespan / lower bound** (1.0 is perfect).
* ``vs nominal`` uses the intended durations instead; the gap between the two is the
  simulator's own error (a sleep overshoots by tens of microseconds on a VM).

dask's threaded scheduler runs the same graph (captured once from dataflow) as a dask graph
of sleeps with the same durations, ``dask.threaded.get(graph, sinks, num_workers=n)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import math
import random
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import dataflow

from ._dag import Dag, DagRecorder, critical_path, dask_graph, lower_bound
from ._harness import Comparison, Config, Contender, interleave, loop_factory

__all__ = ["PROGRAMS", "Program", "run"]

TARGET_WORK = 0.8  # seconds of simulated work per graph (0.05 with --quick)


# -- the simulated kernel ------------------------------------------------------------------

_tls = threading.local()
_PR_SET_TIMERSLACK = 29


def _tight_timer() -> None:
    """Ask Linux for 1 ns timer slack on this thread (per-thread; 50 us by default)."""
    if getattr(_tls, "tight", False):
        return
    _tls.tight = True
    with contextlib.suppress(OSError, AttributeError):  # not Linux: keep the default
        ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)


def calibrate_overshoot(samples: int = 20) -> float:
    """The median amount by which ``time.sleep(1 ms)`` oversleeps on this machine."""
    _tight_timer()
    over = []
    for _ in range(samples):
        t0 = time.perf_counter()
        time.sleep(1e-3)
        over.append(time.perf_counter() - t0 - 1e-3)
    return max(0.0, statistics.median(over))


def _sleep(seconds: float, overshoot: float) -> float:
    """Sleep about ``seconds`` without holding the GIL; return how long it really took."""
    t0 = time.perf_counter()
    if seconds > 0:
        _tight_timer()
        if seconds > overshoot:
            time.sleep(seconds - overshoot)
    return time.perf_counter() - t0


def _stand_in(spec: Any) -> Any:
    """The value a simulated task stands for: None, or a tuple of them for a multi-output op
    (its handles index into it)."""
    if type(spec) is tuple:
        return tuple(_stand_in(s) for s in spec)
    return None


# -- the programs --------------------------------------------------------------------------


def _handle(task: dataflow.Task, index: int | None, spec: Any) -> dataflow.Pending[Any]:
    return dataflow.Pending(task, index)


def _work_meta(*inputs: Any, flops: float) -> None:
    return None


def _work_cost(*inputs: Any, flops: float) -> dataflow.Cost:
    return dataflow.Cost(flops=flops)


def _work_kernel(*inputs: Any, flops: float) -> None:
    return None  # never runs: the simulator replaces it


# A cost-only op: reads its inputs (so it depends on them) and costs ``flops``.
work = dataflow.op("work", meta=_work_meta, handle=_handle, cost=_work_cost)(_work_kernel)

MAIN = Callable[[], Awaitable[Any]]


@dataclass
class Program:
    """A dataflow program whose graph is simulated; ``build`` makes its ``main``."""

    name: str
    build: Callable[[bool], MAIN]
    unavailable: Callable[[], str | None] = lambda: None


def _random_layered(quick: bool) -> MAIN:
    """Layers of 4..12 tasks reading 1..3 tasks of the layer before; one heavy task per layer
    (8x the mean) chained through all layers and issued *last* in its layer, so the critical
    path is skewed away from issue order."""
    layers = 6 if quick else 24
    mean = 2e7

    async def main() -> Any:
        rng = random.Random(7)
        prev = [work(flops=mean)]
        heavy = prev[0]
        for _ in range(layers):
            cur = []
            for _ in range(rng.randint(3, 11)):
                deps = rng.sample(prev, min(len(prev), rng.randint(1, 3)))
                cur.append(work(*deps, flops=mean * rng.lognormvariate(0, 0.5)))
            heavy = work(heavy, rng.choice(prev), flops=8 * mean)
            cur.append(heavy)
            prev = cur
        return work(*prev, flops=mean)

    return main


def _fork_join(quick: bool) -> MAIN:
    """A binary fork-join tree: split, fork the left half, recurse right, wait, join."""
    depth = 4 if quick else 8

    async def tree(x: Any, d: int) -> Any:
        s = work(x, flops=1e7)
        if d == 0:
            return work(s, flops=4e7)
        fut = dataflow.fork(tree, s, d - 1)
        right = await tree(s, d - 1)
        left = await dataflow.wait(fut)
        return work(left, right, flops=2e7)

    async def main() -> Any:
        return await tree(work(flops=1e7), depth)

    return main


def _ensemble(quick: bool) -> MAIN:
    """The seed's ensemble (examples/lstm_ensemble.py) at (50, 50, 1024); tiny with --quick."""
    import numpy as np

    from . import _models

    t, b, c = (5, 2, 16) if quick else (50, 50, 1024)
    ens = _models._example().Ensemble(4, c)
    x = np.zeros((t, b, c), dtype=np.float32)

    async def main() -> Any:
        return await _models.forward_auto(ens, x)

    return main


def _stacked(quick: bool) -> MAIN:
    """A 4-layer unidirectional ``ops.nn.LSTM`` at (50, 50, 1024): a wavefront of steps."""
    import numpy as np

    from . import _models

    t, b, c = (5, 2, 16) if quick else (50, 50, 1024)
    lstm = _models.stacked_lstm(c, 4)
    x = np.zeros((t, b, c), dtype=np.float32)

    async def main() -> Any:
        out, _ = await lstm(x)
        return out

    return main


def _ops_unavailable() -> str | None:
    from . import _models

    return _models.unavailable()


def _stacked_unavailable() -> str | None:
    try:
        import ops.nn

        ops.nn.LSTM  # noqa: B018
    except (ImportError, AttributeError) as exc:
        return f"ops.nn.LSTM not available ({type(exc).__name__}: {exc})"
    return None


PROGRAMS = [
    Program("LSTM ensemble (seed, 4 x bidirectional)", _ensemble, _ops_unavailable),
    Program("stacked LSTM, 4 layers (wavefront)", _stacked, _stacked_unavailable),
    Program("random layered DAG, skewed critical path", _random_layered),
    Program("fork-join tree, depth 8", _fork_join),
]


# -- running ---------------------------------------------------------------------------------


@dataclass
class RunResult:
    """One simulated run: its graph, measured kernel durations, makespan, peak overlap."""

    dag: Dag
    measured: dict[int, float]
    makespan: float
    peak_running: int


def run_dataflow(main: MAIN, threads: int, scale: float, overshoot: float) -> RunResult:
    """Run ``main`` under a simulating runtime with ``threads`` inter-op threads."""
    measured: dict[int, float] = {}

    def simulate(task: dataflow.Task) -> Any:
        measured[task.id] = _sleep(dataflow.estimate_seconds(task.cost) * scale, overshoot)
        return _stand_in(task.spec)

    recorder = DagRecorder()
    peak = 0

    async def body() -> float:
        nonlocal peak
        t0 = time.perf_counter()
        async with dataflow.Runtime(interop_threads=threads, simulate=simulate) as rt:
            await main()
        elapsed = time.perf_counter() - t0
        peak = rt.peak_running
        return elapsed

    dataflow.add_instrument(recorder)
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            makespan = runner.run(body())
    finally:
        dataflow.remove_instrument(recorder)
    return RunResult(recorder.dag, measured, makespan, peak)


def simulate_covers_inline() -> bool:
    """Whether ``Runtime(simulate=...)`` also replaces the kernels of ops run inline at dispatch.

    When it does not, an inline op would run its real kernel on the stand-in values of
    simulated inputs, so :func:`run` sends every op to the pool instead (inline threshold 0)
    and says so in the table's notes.
    """
    seen: list[int] = []

    def simulate(task: dataflow.Task) -> None:
        seen.append(task.id)

    async def body() -> None:
        async with dataflow.Runtime(interop_threads=1, simulate=simulate, private_pool=True):
            await work(flops=1.0)  # far below the inline threshold

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(body())
    return bool(seen)


def run_dask(dag: Dag, threads: int, scale: float, overshoot: float) -> RunResult:
    """Run the captured graph on dask's threaded scheduler, as sleeps of the same length."""
    import dask.threaded

    measured: dict[int, float] = {}

    def kernel(tid: int, seconds: float, *deps: Any) -> None:
        measured[tid] = _sleep(seconds, overshoot)

    graph, sinks = dask_graph(dag, dag.nominal(scale), kernel)
    t0 = time.perf_counter()
    dask.threaded.get(graph, sinks, num_workers=threads)
    return RunResult(dag, measured, time.perf_counter() - t0, 0)


def _contender(
    name: str,
    note: str,
    threads: int,
    scale: float,
    one: Callable[[], RunResult],
    details: dict[str, list[dict[str, float]]],
) -> Contender:
    details[name] = []

    def measure() -> float:
        r = one()
        lb = lower_bound(r.dag, r.measured, threads) or math.nan
        lb_nominal = lower_bound(r.dag, r.dag.nominal(scale), threads) or math.nan
        details[name].append(
            {
                "makespan": r.makespan,
                "lower_bound": lb,
                "vs_nominal": r.makespan / lb_nominal,
                "peak": r.peak_running,
            }
        )
        return r.makespan / lb

    return Contender(name, measure, note=note, extra={"threads": threads})


def _threads(n: int, what: str = "thread") -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _dask_unavailable() -> str | None:
    import importlib.util

    return None if importlib.util.find_spec("dask") else "dask not installed"


def run(cfg: Config, log: Callable[[str], None]) -> list[Comparison]:
    """One table per program: makespan / lower bound per scheduler and thread count."""
    target = 0.05 if cfg.quick else TARGET_WORK
    overshoot = calibrate_overshoot()
    threshold = dataflow.get_inline_threshold()
    extra_notes: list[str] = []
    if not simulate_covers_inline():
        dataflow.set_inline_threshold(0.0)
        extra_notes.append(
            "this dataflow's simulate hook does not cover ops run inline at dispatch, so the "
            "inline threshold was set to 0 for these runs (every op goes to the pool)"
        )
        log("simulated: " + extra_notes[-1])
    try:
        return _run_programs(cfg, log, target, overshoot, extra_notes)
    finally:
        dataflow.set_inline_threshold(threshold)


def _run_programs(
    cfg: Config, log: Callable[[str], None], target: float, overshoot: float, extra: list[str]
) -> list[Comparison]:
    comparisons = []
    for prog in PROGRAMS:
        why = prog.unavailable()
        if why is not None:
            log(f"simulated: {prog.name}: skipped ({why})")
            comparisons.append(
                Comparison(
                    "simulated", f"simulated: {prog.name}", "x", "", [], notes=[f"skipped: {why}"]
                )
            )
            continue
        main = prog.build(cfg.quick)
        # Capture the graph once without sleeping, to size the simulation.
        capture = run_dataflow(main, 1, 0.0, overshoot).dag
        work_est = sum(capture.nominal(1.0).values())
        scale = target / work_est if work_est > 0 else 0.0
        nominal = capture.nominal(scale)
        cp = critical_path(capture, nominal)
        log(
            f"simulated: {prog.name}: {len(capture)} tasks, {capture.edges()} edges, "
            f"work {sum(nominal.values()):.3f} s, critical path {cp:.3f} s"
        )
        details: dict[str, list[dict[str, float]]] = {}
        contenders = []
        dask_skip = _dask_unavailable()
        for n in cfg.threads:

            def df(n: int = n, main: MAIN = main, scale: float = scale) -> RunResult:
                return run_dataflow(main, n, scale, overshoot)

            def dk(n: int = n, dag: Dag = capture, scale: float = scale) -> RunResult:
                return run_dask(dag, n, scale, overshoot)

            contenders.append(
                _contender(f"dataflow, {_threads(n)}", "automatic", n, scale, df, details)
            )
            c = _contender(
                f"dask threaded, {_threads(n, 'worker')}", "same graph", n, scale, dk, details
            )
            c.skip = dask_skip
            contenders.append(c)
        rows = interleave(contenders, cfg.rounds, baseline="", warmup=0, log=log)
        for row in rows:
            ds = details.get(row.name) or []
            if not ds:
                continue
            row.extra["makespan_s"] = statistics.median(d["makespan"] for d in ds)
            row.extra["lower_bound_s"] = statistics.median(d["lower_bound"] for d in ds)
            row.extra["vs_nominal"] = statistics.median(d["vs_nominal"] for d in ds)
            if row.name.startswith("dataflow"):
                row.extra["peak_running"] = max(int(d["peak"]) for d in ds)
        comparisons.append(
            Comparison(
                "simulated",
                f"simulated: {prog.name}: makespan / lower bound",
                "x",
                "",
                rows,
                params={
                    "tasks": len(capture),
                    "edges": capture.edges(),
                    "work_s": sum(nominal.values()),
                    "critical_path_s": cp,
                    "scale": scale,
                    "sleep_overshoot_s": overshoot,
                },
                columns=("makespan_s", "lower_bound_s", "vs_nominal", "peak_running"),
                notes=[
                    f"{len(capture)} tasks, {capture.edges()} edges; nominal work "
                    f"{sum(nominal.values()):.3f} s, nominal critical path {cp:.3f} s; "
                    "value = makespan / max(critical path, work / threads) over the kernel "
                    "durations measured in that run (1.0 = perfect)",
                    *extra,
                ],
            )
        )
    return comparisons
