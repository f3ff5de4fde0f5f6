"""Serving: the (20, 1, 256) BiLSTM ensemble behind an HTTP server, 1, 8 and 32 clients at once.

Issue #12's setting: one shared runtime in an aiohttp server, requests of one small input each,
against what a user would write without dataflow: the same numpy model in
``loop.run_in_executor`` on a 2-thread ``ThreadPoolExecutor``. Contenders:

* ``numpy run_in_executor`` (the baseline): ``benchmarks._reference.ensemble_forward`` on the
  executor, one BLAS thread per request; the loop only parses and answers;
* ``dataflow eager``: ``await model(x)`` in the app's one ``Runtime``: every request
  dispatches the model's ops from the loop;
* ``dataflow compiled``: ``dataflow.compile(model)``: a request launches the cached plan, the
  loop does O(1) work per request;
* ``dataflow compiled + batched``: ``dataflow.compile(model, batch_axis=1, max_wait=...)``:
  requests that arrive while a batch runs are concatenated along the batch axis and run as one.

**How it measures.** Each contender's round is a fresh server process (``python -m
benchmarks.serving --server NAME``) on a loopback port; the clients run in this process (so
their work never runs on the server's loop or holds its GIL; they share the machine's cores,
as any same-host load generator does). For 1, 8 and 32 concurrent clients, each client sends
requests back to back for a fixed time; the server's loop runs a 1 ms ticker the whole time
and reports its lag (how late each tick woke) per phase: the max and the 99th percentile. Every
answer's checksum is compared with the numpy reference's for that request's seed. Contenders
rotate order each round; tables give medians over rounds, the best round, and the ratio to the
baseline, and a last table judges issue #12's targets.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _reference as ref
from ._harness import Comparison, Config, Contender, Row, interleave

__all__ = ["CONTENDERS", "child_main", "run"]

SIZE = (20, 1, 256)
QUICK_SIZE = (4, 1, 16)
CLIENTS = (1, 8, 32)
PHASE_SECONDS = 3.0
QUICK_PHASE_SECONDS = 0.4
MAX_WAIT = 0.01  # the batched contender's max_wait (seconds)
CONTENDERS = ("numpy run_in_executor", "dataflow eager", "dataflow compiled", "dataflow batched")
TICK = 0.001


# -- the server (a child process) ---------------------------------------------------------------


class LagMeter:
    """A 1 ms ticker on the loop: how late each tick wakes is the loop's lag."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(TICK)
            self.lags.append(max(0.0, time.perf_counter() - t0 - TICK))

    def take(self) -> dict[str, float]:
        lags, self.lags = sorted(self.lags), []
        if not lags:
            return {"max_ms": 0.0, "p99_ms": 0.0, "ticks": 0}
        p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))]
        return {"max_ms": lags[-1] * 1e3, "p99_ms": p99 * 1e3, "ticks": len(lags)}


def _seeded(seed: int, size: tuple[int, int, int]) -> np.ndarray[Any, Any]:
    x: np.ndarray[Any, Any] = np.random.default_rng(seed).random(size, dtype=np.float32)
    return x


def _checksum(y: np.ndarray[Any, Any]) -> float:
    return float(np.asarray(y, dtype=np.float64).sum())


async def _serve(name: str, size: tuple[int, int, int], max_wait: float, freeze: bool) -> None:
    from aiohttp import web

    import dataflow

    from . import _models

    weights = ref.make_weights(size[2], 4, seed=0)
    lag = LagMeter()
    forward: Callable[[np.ndarray[Any, Any]], Any]
    runtime: Any = None
    if name == "numpy run_in_executor":
        # One BLAS thread per request, as the dataflow servers run one per op: two requests
        # on two threads with all cores in every GEMM oversubscribe the machine, and
        # OpenBLAS's spinning threads then lose badly as soon as anything else runs.
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")
        executor = ThreadPoolExecutor(max_workers=2)

        async def forward(x: np.ndarray[Any, Any]) -> Any:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(executor, ref.ensemble_forward, x, weights)

    else:
        runtime = dataflow.Runtime(interop_threads=2, intraop_threads=1)
        await runtime.__aenter__()
        model = _models.build_ensemble(weights)
        if name == "dataflow eager":
            call: Any = model
        elif name == "dataflow compiled":
            call = dataflow.compile(model)
        else:
            call = dataflow.compile(model, batch_axis=1, max_wait=max_wait)

        async def forward(x: np.ndarray[Any, Any]) -> Any:
            return await call(x)

    if name == "dataflow batched":  # trace every batch size a burst will run at
        await call.warm_up(_seeded(0, size))
    for seed in range(3):  # warm up: compile, measure the ops, lay out the weights
        await forward(_seeded(seed, size))
    if freeze:
        gc.freeze()

    async def infer(request: web.Request) -> web.Response:
        seed = int(request.query["seed"])
        y = await forward(_seeded(seed, size))
        return web.json_response({"seed": seed, "sum": _checksum(y)})

    async def lag_stats(request: web.Request) -> web.Response:
        return web.json_response(lag.take())

    app = web.Application()
    app.router.add_get("/infer", infer)
    app.router.add_get("/lag", lag_stats)
    app_runner = web.AppRunner(app, access_log=None)
    await app_runner.setup()
    site = web.TCPSite(app_runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    lag.start()
    print(json.dumps({"port": port}), flush=True)
    # Serve until the parent closes our stdin.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await app_runner.cleanup()
    if runtime is not None:
        await runtime.__aexit__(None, None, None)


def child_main(
    name: str,
    size: tuple[int, int, int],
    max_wait: float,
    freeze: bool,
    switch: float | None = None,
) -> None:
    """Run one contender's server until stdin closes (the parent's client drives it).

    ``switch``: the interpreter's GIL switch interval for the server (``sys.
    setswitchinterval``; None leaves Python's 5 ms)."""
    if switch is not None:
        sys.setswitchinterval(switch)
    try:
        import uvloop

        uvloop.run(_serve(name, size, max_wait, freeze))
    except ImportError:
        asyncio.run(_serve(name, size, max_wait, freeze))
    os._exit(0)


# -- the clients (this process) -----------------------------------------------------------------


@dataclass
class Phase:
    clients: int
    requests: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    lag: dict[str, float] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


class WrongAnswer(AssertionError):
    """A server's answer differs from the numpy reference."""


async def _drive(
    port: int, clients: int, seconds: float, expected: Callable[[int], float], name: str
) -> Phase:
    from aiohttp import ClientSession, ClientTimeout, TCPConnector

    phase = Phase(clients)
    url = f"http://127.0.0.1:{port}"
    connector = TCPConnector(limit=clients)
    async with ClientSession(connector=connector, timeout=ClientTimeout(total=60)) as session:
        async with session.get(f"{url}/lag") as r:  # reset the server's ticker
            await r.read()
        counter = iter(range(10**9))
        t_end = time.perf_counter() + seconds

        async def client() -> None:
            while time.perf_counter() < t_end:
                seed = next(counter) % 64
                t0 = time.perf_counter()
                async with session.get(f"{url}/infer", params={"seed": seed}) as r:
                    body = await r.json()
                phase.latencies.append(time.perf_counter() - t0)
                want = expected(seed)
                if r.status != 200 or not np.isclose(body["sum"], want, rtol=1e-4, atol=1e-3):
                    raise WrongAnswer(
                        f"serving: {name} answered {body} for seed {seed}; numpy gives sum "
                        f"{want:.6g}"
                    )
                phase.requests += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        phase.seconds = time.perf_counter() - t0
        async with session.get(f"{url}/lag") as r:
            phase.lag = await r.json()
    return phase


def _round(
    name: str,
    size: tuple[int, int, int],
    seconds: float,
    max_wait: float,
    freeze: bool,
    expected: Callable[[int], float],
    switch: float | None = None,
) -> list[Phase]:
    cmd = [sys.executable, "-m", "benchmarks.serving", "--server", name, "--size",
           *map(str, size), "--max-wait", str(max_wait)]  # fmt: skip
    if not freeze:
        cmd.append("--no-gc-freeze")
    if switch is not None:
        cmd += ["--switch-interval", str(switch)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"serving: the {name} server exited before serving")
        port = json.loads(line)["port"]
        return [asyncio.run(_drive(port, clients, seconds, expected, name)) for clients in CLIENTS]
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def run(cfg: Config, log: Callable[[str], None], *, max_wait: float = MAX_WAIT,
        freeze: bool = True, switch: float | None = None) -> list[Comparison]:  # fmt: skip
    """Tables: throughput per client count, loop lag, and issue #12's targets.

    ``switch``: every server's GIL switch interval (seconds; None: Python's 5 ms)."""
    size = QUICK_SIZE if cfg.quick else SIZE
    seconds = QUICK_PHASE_SECONDS if cfg.quick else PHASE_SECONDS
    rounds = 1 if cfg.quick else cfg.rounds
    weights = ref.make_weights(size[2], 4, seed=0)
    sums = [_checksum(ref.ensemble_forward(_seeded(s, size), weights)) for s in range(64)]
    phases: dict[str, list[list[Phase]]] = {n: [] for n in CONTENDERS}

    def contender(name: str) -> Contender:
        def measure() -> float:
            result = _round(name, size, seconds, max_wait, freeze, sums.__getitem__, switch)
            phases[name].append(result)
            return result[-1].throughput

        return Contender(name, measure)

    load0 = os.getloadavg()[0]
    interleave([contender(n) for n in CONTENDERS], rounds, baseline=CONTENDERS[0], warmup=0,
               log=log)  # fmt: skip
    load1 = os.getloadavg()[0]
    t, b, c = size
    notes = [
        f"input (T, B, C) = ({t}, {b}, {c}), 4 BiLSTM members; {seconds:g} s per client count; "
        f"{rounds} round(s), a fresh server process per contender per round; batched: "
        f"max_wait {max_wait * 1e3:g} ms; gc.freeze after warm-up: {freeze}; GIL switch "
        f"interval: {'5 ms (Python default)' if switch is None else f'{switch * 1e3:g} ms'}",
        f"load average (1 min) {load0:.2f} -> {load1:.2f}",
    ]
    return [
        _throughput_table(phases, notes),
        _lag_table(phases, notes),
        _targets_table(phases, notes),
    ]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _throughput_table(phases: dict[str, list[list[Phase]]], notes: list[str]) -> Comparison:
    rows = []
    base = [p[-1].throughput for p in phases[CONTENDERS[0]]]
    for name in CONTENDERS:
        rounds = phases[name]
        values = [p[-1].throughput for p in rounds]
        row = Row(name, "req/s at 32 clients", values)
        if base and values:
            row.ratio = _median([v / b for v, b in zip(values, base, strict=True)])
            row.extra["best vs best"] = max(values) / max(base)
        for i, clients in enumerate(CLIENTS):
            row.extra[f"{clients} clients"] = _median([p[i].throughput for p in rounds])
        row.extra["32 vs 1"] = _median([p[-1].throughput / p[0].throughput for p in rounds])
        row.extra["p50 latency ms"] = _median(
            [statistics.median(p[-1].latencies) * 1e3 for p in rounds if p[-1].latencies]
        )
        rows.append(row)
    return Comparison(
        "serving",
        "serving: throughput (requests/s; higher is better)",
        "req/s",
        CONTENDERS[0],
        rows,
        columns=("best vs best", *(f"{c} clients" for c in CLIENTS), "32 vs 1", "p50 latency ms"),
        notes=notes,
    )


def _lag_table(phases: dict[str, list[list[Phase]]], notes: list[str]) -> Comparison:
    rows = []
    for name in CONTENDERS:
        rounds = phases[name]
        row = Row(name, "loop lag at 32 clients, max ms", [p[-1].lag["max_ms"] for p in rounds])
        for i, clients in enumerate(CLIENTS):
            row.extra[f"max {clients}"] = _median([p[i].lag["max_ms"] for p in rounds])
            row.extra[f"p99 {clients}"] = _median([p[i].lag["p99_ms"] for p in rounds])
        rows.append(row)
    return Comparison(
        "serving",
        "serving: event-loop lag from a 1 ms ticker in the server (ms; lower is better)",
        "ms",
        "",
        rows,
        columns=tuple(f"{k} {c}" for c in CLIENTS for k in ("max", "p99")),
        notes=notes,
    )


def _targets_table(phases: dict[str, list[list[Phase]]], notes: list[str]) -> Comparison:
    base = _median([p[-1].throughput for p in phases[CONTENDERS[0]]])
    rows = []
    for name in CONTENDERS[1:]:
        rounds = phases[name]
        tput = _median([p[-1].throughput for p in rounds])
        lag_max = _median([p[-1].lag["max_ms"] for p in rounds])
        p99 = _median([p[-1].lag["p99_ms"] for p in rounds])
        scale = _median([p[-1].throughput / p[0].throughput for p in rounds])
        row = Row(name, "medians at 32 clients", [tput])
        row.extra.update(
            {
                "lag max <= 20 ms": lag_max <= 20.0,
                "lag p99 <= 5 ms": p99 <= 5.0,
                ">= baseline": tput >= base,
                ">= 2x baseline (batched)": tput >= 2 * base,
                "32 vs 1 >= 1.5": scale >= 1.5,
            }
        )
        rows.append(row)
    return Comparison(
        "serving",
        "serving: issue #12's targets (32 clients, medians over rounds)",
        "req/s",
        "",
        rows,
        columns=(
            "lag max <= 20 ms",
            "lag p99 <= 5 ms",
            ">= baseline",
            ">= 2x baseline (batched)",
            "32 vs 1 >= 1.5",
        ),
        notes=notes,
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", choices=CONTENDERS, help="run one contender's server (internal)")
    p.add_argument("--size", nargs=3, type=int, default=list(SIZE), metavar=("T", "B", "C"))
    p.add_argument("--max-wait", type=float, default=MAX_WAIT, help="batched: max_wait (s)")
    p.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="leave the collector alone (by default the servers call gc.freeze() after "
        "warm-up, as examples/serve.py does)",
    )
    p.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the servers' GIL switch interval (sys.setswitchinterval; default: Python's 5 ms)",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.switch_interval is not None and not args.switch_interval > 0:
        p.error(
            f"--switch-interval must be a positive number of seconds, got {args.switch_interval}"
        )
    if args.server:
        child_main(args.server, tuple(args.size), args.max_wait, args.gc_freeze,
                   args.switch_interval)  # fmt: skip
        return
    from ._harness import format_table

    cfg = Config(quick=args.quick, rounds=args.rounds)
    for cmp in run(cfg, lambda m: print(m, file=sys.stderr), max_wait=args.max_wait,
                   freeze=args.gc_freeze, switch=args.switch_interval):  # fmt: skip
        print(format_table(cmp) + "\n")


if __name__ == "__main__":
    main()
