"""The Dask backend against the local backend, and its per-task cost over Dask's own.

Run: ``python benchmarks/bench_dask.py [--rounds 3] [--workers 2] [--in-process]``

It starts a cluster on loopback: by default ``dask scheduler`` and ``dask worker``
(``--workers`` processes of ``--threads-per-worker`` threads) as separate processes, as in
production and in docs/dask.md; with ``--local-cluster`` a ``distributed.LocalCluster``, whose
scheduler shares this process (and its GIL) with the client (``--in-process``: and the
workers too). Then it measures, round by round with the
contenders interleaved (a shared machine's slow moment hits a round, not a contender; the
figures are medians over rounds, ratios the medians of per-round ratios):

* **ensemble**: the seed's LSTM ensemble (``examples/lstm_ensemble.py``; ``--steps``,
  ``--batch``, ``--channels``, ``--models``) on the local backend (``--interop-threads``)
  and on the cluster: in a new runtime each round (connect, scatter the weights, run) and in
  a warm one (a second forward: the weights are on the workers already). The outputs must
  agree with the local backend's.
* **wide**: ``--wide`` independent tiny ops (``ops.add`` of a 16-float array) reduced by one
  ``ops.stack`` + ``ops.sum``, every op shipped (``local_threshold=0``): ops per second and
  microseconds per task, against the same DAG written directly against Dask
  (``client.map`` + one ``client.submit``, the lowest-overhead public way) on the same
  cluster. The difference is what dataflow adds per task on top of Dask's own floor
  (Dask documents about 1 ms per task); "dispatch" is the client-side part of it (the op
  calls and sending the graph, before the cluster has run anything).
* **chain**: ``--chain`` dependent tiny ops (each reads the previous one): the per-hop
  latency, which bounds a recurrence such as the LSTM's steps, against the same chain in Dask.

It prints a table and one ``BENCH_JSON {...}`` line.

``--lost-worker N`` measures something else, robustness: a 2-layer LSTM on a
``LocalCluster`` of two worker processes under nannies, N times with one worker killed
(SIGKILL) at a random point of the run and N times without, interleaved; it counts the
outcomes (the right result, a wrong one, or an error) and the tasks sent again, and compares
the wall times (see docs/dask.md, "Lost workers").
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: import examples/ and ops/
    sys.path.insert(0, str(ROOT))

import dataflow  # noqa: E402
import ops  # noqa: E402
from examples.lstm_ensemble import Ensemble  # noqa: E402

Array = np.ndarray[Any, Any]
JSON_PREFIX = "BENCH_JSON "


def _distributed() -> Any:
    """``distributed``, untyped (its Client and LocalCluster have no annotations)."""
    return importlib.import_module("distributed")


# -- Dask-only baselines (plain functions, so workers run exactly what dataflow's tasks run) --


def _inc(x: Array) -> Array:
    return x + 1.0


def _total(xs: list[Array]) -> Array:
    out: Array = np.stack(xs).sum(axis=0)
    return out


# -- the measurements: each returns seconds -------------------------------------------------


def run_async(fn: Callable[[], Coroutine[Any, Any, float]]) -> float:
    return asyncio.run(fn())


def ensemble_local(
    ens: Ensemble, x: Array, threads: int, intraop: int, out: dict[str, Array]
) -> float:
    async def main() -> float:
        t0 = time.perf_counter()
        out["local"] = await ens(x)
        return time.perf_counter() - t0

    return dataflow.run(main, interop_threads=threads, intraop_threads=intraop, backend="local")


def ensemble_dask(
    address: str, ens: Ensemble, x: Array, warm: bool, intraop: int, out: dict[str, Array]
) -> float:
    async def main() -> float:
        t0 = time.perf_counter()
        async with dataflow.Runtime(backend="dask", address=address, intraop_threads=intraop):
            if warm:  # first forward scatters the weights; time the second one
                await ens(x)
                t0 = time.perf_counter()
            out["warm" if warm else "new"] = await ens(x)
            return time.perf_counter() - t0

    return run_async(main)


def wide_dataflow(address: str, n: int, timings: dict[str, list[float]]) -> float:
    base = np.ones(16)

    async def main() -> float:
        async with dataflow.Runtime(backend="dask", address=address, local_threshold=0):
            await ops.add(base, 0.0)  # connect and warm the path before timing
            c0, t0 = time.process_time(), time.perf_counter()
            parts = [ops.add(base, float(i)) for i in range(n)]
            total = ops.sum(ops.stack(parts), axis=0)
            await asyncio.sleep(0)  # let the flush run: the graph is sent now
            timings["dispatch"].append(time.perf_counter() - t0)
            await total
            timings["cpu"].append(time.process_time() - c0)
            return time.perf_counter() - t0

    return run_async(main)


def wide_dask(address: str, n: int, timings: dict[str, list[float]]) -> float:
    distributed = _distributed()
    base = np.ones(16)

    async def main() -> float:
        async with distributed.Client(address, asynchronous=True, set_as_default=False) as c:
            await c.submit(_inc, base, pure=False)
            c0, t0 = time.process_time(), time.perf_counter()
            parts = c.map(_inc, [base + i for i in range(n)], pure=False)
            total = c.submit(_total, parts, pure=False)
            timings["dispatch_dask"].append(time.perf_counter() - t0)
            await total
            timings["cpu_dask"].append(time.process_time() - c0)
            return time.perf_counter() - t0

    return run_async(main)


def chain_dataflow(address: str, n: int) -> float:
    async def main() -> float:
        async with dataflow.Runtime(backend="dask", address=address, local_threshold=0):
            await ops.add(np.ones(16), 0.0)
            t0 = time.perf_counter()
            h: Any = np.ones(16)
            for _ in range(n):
                h = ops.add(h, 1.0)
            await h
            return time.perf_counter() - t0

    return run_async(main)


def chain_dask(address: str, n: int) -> float:
    distributed = _distributed()

    async def main() -> float:
        async with distributed.Client(address, asynchronous=True, set_as_default=False) as c:
            await c.submit(_inc, np.ones(16), pure=False)
            t0 = time.perf_counter()
            h: Any = np.ones(16)
            for _ in range(n):
                h = c.submit(_inc, h, pure=False)
            await h
            return time.perf_counter() - t0

    return run_async(main)


# -- the cluster -------------------------------------------------------------------------------


@contextmanager
def cli_cluster(workers: int, threads: int) -> Iterator[str]:
    """``dask scheduler`` + ``dask worker`` processes on loopback; yields the address."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-dask-"))
    sched_file = tmp / "scheduler.json"
    quiet = subprocess.DEVNULL
    scheduler = ["--host", "127.0.0.1", "--port", "0", "--no-dashboard"]
    scheduler += ["--scheduler-file", str(sched_file)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", *scheduler],
            stdout=quiet,
            stderr=quiet,
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError("dask scheduler did not start")
            time.sleep(0.1)
        address = json.loads(sched_file.read_text())["address"]
        worker = ["--nworkers", str(workers), "--nthreads", str(threads), "--no-dashboard"]
        worker += ["--local-directory", str(tmp)]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", address, *worker],
                stdout=quiet,
                stderr=quiet,
            )
        )

        async def wait() -> None:
            async with _distributed().Client(address, asynchronous=True) as c:
                await c.wait_for_workers(workers, timeout=60)

        asyncio.run(wait())
        yield str(address)
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextmanager
def local_cluster(workers: int, threads: int, processes: bool) -> Iterator[str]:
    """A ``distributed.LocalCluster``: the scheduler runs in this process."""
    with _distributed().LocalCluster(
        n_workers=workers,
        threads_per_worker=threads,
        processes=processes,
        protocol="tcp",
        dashboard_address=":0",
        local_directory=tempfile.mkdtemp(prefix="bench-dask-"),
        silence_logs=logging.ERROR,
    ) as cluster:
        yield str(cluster.scheduler_address)


# -- --lost-worker: one of two worker processes killed mid-run ---------------------------------


async def _two_workers(cluster: Any, client: Any) -> dict[str, int]:
    """{address: pid} of the cluster's two workers, once a killed one is gone and replaced."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        workers = cluster.scheduler.workers  # the scheduler runs in this process
        if len(workers) == 2 and all(ws.status.name == "running" for ws in workers.values()):
            try:
                pids: dict[str, int] = await client.run(os.getpid)
            except OSError:  # a worker the scheduler has not dropped yet
                pids = {}
            if len(pids) == 2:
                return pids
        await asyncio.sleep(0.05)
    raise RuntimeError("the cluster did not get its two workers back")


async def _lost_worker_trial(
    cluster: Any, lstm: Any, x: Array, expected: Array, kill_after: float | None
) -> tuple[str, float, int]:
    """One run: (outcome, wall seconds from dispatch to result, tasks sent again)."""
    # Ship every op, and scatter the weights (data Dask cannot recompute when it is lost).
    options: dict[str, Any] = {"local_threshold": 0.0, "scatter_bytes": 1024}
    async with dataflow.Runtime(backend="dask", address=cluster.scheduler_address, **options) as rt:
        backend: Any = rt.backend
        pids = await _two_workers(cluster, backend.client)
        t0 = time.perf_counter()
        out, _ = await lstm(x)
        if kill_after is not None:
            await asyncio.sleep(kill_after)  # the batch is sent; the cluster computes
            os.kill(pids[min(pids)], signal.SIGKILL)
        try:
            y = await out
            outcome = "right result" if np.allclose(y, expected, rtol=1e-5, atol=1e-6) else "wrong"
        except Exception as exc:
            outcome = type(exc).__name__
        wall = time.perf_counter() - t0
        await _two_workers(cluster, backend.client)  # the nanny restarted it
        return outcome, wall, getattr(backend, "resent", 0)


def lost_worker(trials: int) -> int:
    """``--lost-worker N`` (see the module docstring)."""
    import dask.config

    lstm = ops.nn.LSTM(32, 32, num_layers=2, seed=0)
    x = np.random.default_rng(1).random((40, 4, 32), dtype=np.float32)

    async def local() -> Array:
        out, _ = await lstm(x)
        y: Array = await out
        return y

    expected = dataflow.run(local, backend="local")
    rng = np.random.default_rng(0)
    killed: list[tuple[str, float, int]] = []
    calm: list[tuple[str, float, int]] = []
    # A worker killed twice within lost-worker-timeout of each other would lose its nanny.
    with (
        dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}),
        _distributed().LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            local_directory=tempfile.mkdtemp(prefix="bench-dask-"),
            silence_logs=logging.CRITICAL,
        ) as cluster,
    ):
        for i in range(trials):
            delay = float(rng.uniform(0.0, 0.7))
            for kill in (True, False) if i % 2 == 0 else (False, True):
                run = dataflow.run(
                    _lost_worker_trial, cluster, lstm, x, expected, delay if kill else None
                )
                (killed if kill else calm).append(run)
    med = statistics.median
    counts = {o: sum(1 for r in killed if r[0] == o) for o in sorted({r[0] for r in killed})}
    right = counts.get("right result", 0)
    print(
        f"Lost worker: 2-layer LSTM (T, B, C = 40, 4, 32) on 2 worker processes under nannies, "
        f"one killed (SIGKILL) 0-0.7 s after dispatch; {trials} runs with a kill, {trials} "
        f"without, interleaved; {os.cpu_count()} CPUs"
    )
    for outcome, n in counts.items():
        print(f"  {outcome:<22} {n}/{trials}")
    print(
        f"  wall, dispatch to result: {med(r[1] for r in calm):.2f} s without a kill, "
        f"{med(r[1] for r in killed):.2f} s with one (median)"
    )
    resent = [r[2] for r in killed if r[2]]
    print(
        f"  runs that sent tasks again: {len(resent)}/{trials} (median "
        f"{med(resent) if resent else 0:g} tasks; in the others Dask recovered by itself)"
    )
    result = {
        "benchmark": "dask_lost_worker",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "trials": trials,
        "outcomes": counts,
        "median_wall_s": {"calm": med(r[1] for r in calm), "killed": med(r[1] for r in killed)},
        "runs_resending": len(resent),
        "median_resent": med(resent) if resent else 0,
        "calm_outcomes": sorted({r[0] for r in calm}),
    }
    print(JSON_PREFIX + json.dumps(result, sort_keys=True))
    return 0 if right == trials and all(r[0] == "right result" for r in calm) else 1


# -- rounds, table, JSON ----------------------------------------------------------------------


def interleave(contenders: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Every contender once per round, in an order rotated from round to round."""
    names = list(contenders)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(contenders[name]())
    return times


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of times[a] / times[b]."""
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def fmt(s: float) -> str:
    return f"{s * 1e3:9.1f} ms" if s >= 1e-3 else f"{s * 1e6:9.1f} us"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads-per-worker", type=int, default=1)
    p.add_argument(
        "--local-cluster", action="store_true", help="a LocalCluster (scheduler in this process)"
    )
    p.add_argument("--in-process", action="store_true", help="with --local-cluster: worker threads")
    p.add_argument("--interop-threads", type=int, default=2, help="local backend's pool")
    p.add_argument(
        "--intraop-threads",
        type=int,
        default=1,
        help="BLAS threads per op on the client (worker processes get 1 from Dask's nanny)",
    )
    p.add_argument("--steps", "-T", type=int, default=20)
    p.add_argument("--batch", "-B", type=int, default=16)
    p.add_argument("--channels", "-C", type=int, default=256)
    p.add_argument("--models", type=int, default=4)
    p.add_argument("--wide", type=int, default=1000, help="tiny ops in the wide DAG")
    p.add_argument("--chain", type=int, default=100, help="ops in the dependent chain")
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes, 1 round")
    p.add_argument(
        "--lost-worker",
        type=int,
        metavar="N",
        help="instead: N runs with one of two worker processes killed mid-run (docstring)",
    )
    args = p.parse_args(argv)
    if args.lost_worker:
        return lost_worker(args.lost_worker)
    if args.quick:
        args.rounds, args.steps, args.batch, args.channels, args.models = 1, 4, 2, 16, 2
        args.wide, args.chain = 50, 10

    distributed = _distributed()
    t, b, c, m = args.steps, args.batch, args.channels, args.models
    ens = Ensemble(m, c, seed=0)
    x = np.random.default_rng(1).random((t, b, c), dtype=np.float32)
    if args.local_cluster:
        cluster = local_cluster(args.workers, args.threads_per_worker, not args.in_process)
    else:
        cluster = cli_cluster(args.workers, args.threads_per_worker)
    with cluster as address:
        threads, intraop = args.interop_threads, args.intraop_threads
        outputs: dict[str, Array] = {}
        ens_times = interleave(
            {
                "local": lambda: ensemble_local(ens, x, threads, intraop, outputs),
                "dask, new runtime": lambda: ensemble_dask(
                    address, ens, x, False, intraop, outputs
                ),
                "dask, warm runtime": lambda: ensemble_dask(
                    address, ens, x, True, intraop, outputs
                ),
            },
            args.rounds,
        )
        diff = max(float(np.max(np.abs(outputs["local"] - outputs[k]))) for k in ("new", "warm"))
        timings: dict[str, list[float]] = {
            "dispatch": [],
            "dispatch_dask": [],
            "cpu": [],
            "cpu_dask": [],
        }
        wide_times = interleave(
            {
                "dataflow on dask": lambda: wide_dataflow(address, args.wide, timings),
                "dask client.map": lambda: wide_dask(address, args.wide, timings),
            },
            args.rounds,
        )
        chain_times = interleave(
            {
                "dataflow on dask": lambda: chain_dataflow(address, args.chain),
                "dask client.submit": lambda: chain_dask(address, args.chain),
            },
            args.rounds,
        )

    med = statistics.median
    tasks = args.wide + 2
    wide_ours = med(wide_times["dataflow on dask"]) / tasks
    wide_dask_s = med(wide_times["dask client.map"]) / tasks
    chain_ours = med(chain_times["dataflow on dask"]) / args.chain
    chain_dask_s = med(chain_times["dask client.submit"]) / args.chain
    kind = "LocalCluster" if args.local_cluster else "dask scheduler + dask worker processes"
    in_process = args.local_cluster and args.in_process
    where = f"{args.workers} worker {'threads' if in_process else 'processes'}"
    print(
        f"Dask backend: {kind}, {where} x {args.threads_per_worker} thread(s); "
        f"{os.cpu_count()} CPUs; {args.rounds} rounds, medians"
    )
    print(f"\nensemble {m} x BiLSTM, T, B, C = {t}, {b}, {c} (max abs diff vs local {diff:.1e})")
    for name, v in ens_times.items():
        print(f"  {name:<22} {fmt(med(v))}   {ratio(ens_times, name, 'local'):5.2f}x local's time")
    print(f"\nwide DAG: {args.wide} tiny ops + stack + sum, every op shipped")
    for name, v in wide_times.items():
        per = med(v) / tasks
        print(f"  {name:<22} {fmt(med(v))}   {1 / per:8.0f} ops/s   {fmt(per)} per task")
    print(
        f"  dispatch (client side, until the graph is sent): dataflow "
        f"{fmt(med(timings['dispatch']) / tasks)} per op, dask client.map "
        f"{fmt(med(timings['dispatch_dask']) / tasks)} per task"
    )
    cpu_ours, cpu_dask = med(timings["cpu"]) / tasks, med(timings["cpu_dask"]) / tasks
    print(
        f"  client CPU (this process): dataflow {fmt(cpu_ours)} per task, dask {fmt(cpu_dask)}"
        f" per task: +{fmt(cpu_ours - cpu_dask).strip()}"
    )
    print(f"  dataflow's overhead on top of Dask's: {fmt(wide_ours - wide_dask_s)} per task (wall)")
    print(f"\nchain: {args.chain} dependent tiny ops")
    for name, v in chain_times.items():
        print(f"  {name:<22} {fmt(med(v))}   {fmt(med(v) / args.chain)} per hop")
    result = {
        "benchmark": "dask_backend",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "versions": {"distributed": distributed.__version__, "numpy": np.__version__},
        "cluster": {
            "kind": "LocalCluster" if args.local_cluster else "cli",
            "workers": args.workers,
            "threads_per_worker": args.threads_per_worker,
            "processes": not in_process,
        },
        "rounds": args.rounds,
        "ensemble": {
            "shape": [t, b, c],
            "models": m,
            "median_s": {k: med(v) for k, v in ens_times.items()},
            "rounds_s": ens_times,
            "ratio_to_local": {k: ratio(ens_times, k, "local") for k in ens_times},
            "max_abs_diff": diff,
        },
        "wide": {
            "ops": args.wide,
            "median_s": {k: med(v) for k, v in wide_times.items()},
            "ops_per_s": {"dataflow": 1 / wide_ours, "dask": 1 / wide_dask_s},
            "us_per_task": {"dataflow": wide_ours * 1e6, "dask": wide_dask_s * 1e6},
            "overhead_us_per_task": (wide_ours - wide_dask_s) * 1e6,
            "client_cpu_us_per_task": {"dataflow": cpu_ours * 1e6, "dask": cpu_dask * 1e6},
            "rounds_s": wide_times,
            "dispatch_us_per_op": {
                "dataflow": med(timings["dispatch"]) / tasks * 1e6,
                "dask": med(timings["dispatch_dask"]) / tasks * 1e6,
            },
        },
        "chain": {
            "ops": args.chain,
            "ms_per_hop": {"dataflow": chain_ours * 1e3, "dask": chain_dask_s * 1e3},
            "rounds_s": chain_times,
        },
    }
    print(JSON_PREFIX + json.dumps(result, sort_keys=True))
    return 0 if diff < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
