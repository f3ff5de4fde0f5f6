"""Measurement programs for the load tests and for docs/hardening.md; each prints one JSON line.

Run from the repository root::

    python -m tests.stress._programs million [--n 1000000] [--max-pending 100000|none]
    python -m tests.stress._programs server [--requests 1000] [--loop asyncio|uvloop]
        [--spread SECONDS] [--in-process]
    python -m tests.stress._programs soak [--seconds 60]

``million`` dispatches N tiny ops from one coroutine, in 1,000 chains dispatched round-robin
behind one slow root op (so, for the root's duration, every op dispatched must wait) and
reports the peak RSS; ``server`` serves N
concurrent requests on 127.0.0.1 and reports the loop's worst lag; ``soak`` runs mixed work
for a while and reports thread and RSS growth.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import random
import resource
import sys
import threading
import time
from typing import Any, NamedTuple

import numpy as np
import psutil
from threadpoolctl import threadpool_limits

import dataflow
import ops


class _Spec(NamedTuple):
    shape: tuple[int, ...]
    dtype: Any


_SPEC = _Spec((1,), np.dtype(np.float64))


def _meta(x: Any) -> _Spec:
    return _SPEC


def _bump(x: Any) -> Any:
    return x + 1.0


# The smallest useful op: trivial meta rule, a one-element kernel, always on the pool.
tiny: dataflow.Op[..., dataflow.Pending[Any]] = dataflow.op(
    "tiny", meta=_meta, handle=lambda task, index, spec: dataflow.Pending(task), inline=False
)(_bump)


def _root_kernel(x: Any, seconds: float) -> Any:
    time.sleep(seconds)
    return x


root: dataflow.Op[..., ops.Tensor] = dataflow.op(
    "root", meta=lambda x, s: _SPEC, handle=ops.Tensor
)(_root_kernel)


def _rss_mib() -> float:
    return float(psutil.Process().memory_info().rss) / 2**20


def _peak_rss_mib() -> float:
    """This process's peak resident memory. Linux's ``VmHWM`` where there is one: the
    ``ru_maxrss`` of a process started by another counts the starting process's resident
    memory at the fork (a test process that had imported torch made a fresh child read
    ~100 MiB more than it ever used)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


# -- million ---------------------------------------------------------------------------------


async def _million(n: int, chains: int, gate: float, sample: dict[str, int]) -> float:
    rt = dataflow.current_runtime()
    assert rt is not None
    start = root(np.zeros(1), gate)
    heads: list[Any] = [start] * chains
    most = 0
    for i in range(n):
        c = i % chains
        heads[c] = tiny(heads[c])
        if i & 1023 == 0:
            most = max(most, rt._inflight)
    sample["max_inflight_seen"] = most
    sample["peak_running"] = rt.peak_running
    total = 0.0
    for h in heads:
        total += float((await h)[0])
    return total


def million(n: int, max_pending: int | None, gate: float, chains: int = 1000) -> dict[str, Any]:
    """Dispatch ``n`` tiny ops in ``chains`` chains behind a root op that runs ``gate`` s."""
    gc.collect()
    base = _rss_mib()
    sample: dict[str, int] = {}
    t0 = time.perf_counter()
    total = dataflow.run(
        _million, n, chains, gate, sample, interop_threads=2, max_pending=max_pending
    )
    seconds = time.perf_counter() - t0
    return {
        "program": "million",
        "n": n,
        "max_pending": max_pending,
        "gate_s": gate,
        "ok": total == float(n),
        "seconds": round(seconds, 2),
        "us_per_op": round(seconds / n * 1e6, 2),
        "rss_before_mib": round(base, 1),
        "peak_rss_mib": round(_peak_rss_mib(), 1),
        "peak_growth_mib": round(_peak_rss_mib() - base, 1),
        **sample,
    }


# -- server ----------------------------------------------------------------------------------

_W = np.random.default_rng(0).standard_normal((256, 256)) / 16


def model(x: Any) -> Any:
    """A request's work: a small two-layer network (its matmuls run on the pool)."""
    h = ops.tanh(ops.matmul(x, _W))
    h = ops.tanh(ops.add(ops.matmul(h, _W), 0.5))
    return ops.sum(ops.multiply(h, h), axis=1)


def reference(x: np.ndarray) -> np.ndarray:
    h = np.tanh(x @ _W)
    h = np.tanh(h @ _W + 0.5)
    return np.asarray(np.sum(h * h, axis=1))


ROWS = 64
# The requests' inputs, made once (so the server's handler is only dataflow's work).
_INPUTS = np.random.default_rng(1).standard_normal((64, ROWS, 256))


def _request(i: int) -> np.ndarray:
    return np.asarray(_INPUTS[i % len(_INPUTS)])


async def _clients(port: int, requests: int, spread: float) -> list[bool]:
    """``requests`` concurrent clients (plain asyncio; run in a process of their own).

    Every client connects first (at most 50 connects under way at once, so the server's
    listen backlog never overflows into SYN retries); once all ``requests`` connections are
    open, each sends its request at a random moment within ``spread`` seconds (0: all at the
    same instant) and checks the answer against numpy.
    """
    connecting = asyncio.Semaphore(50)
    connected = 0
    all_open = asyncio.Event()
    rng = random.Random(0)
    delays = [rng.uniform(0, spread) for _ in range(requests)]

    async def client(i: int) -> bool:
        nonlocal connected
        async with connecting:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        connected += 1
        if connected == requests:
            all_open.set()
        await all_open.wait()
        if delays[i]:
            await asyncio.sleep(delays[i])
        writer.write(f"{i}\n".encode())
        await writer.drain()
        data = await reader.readexactly(8 * ROWS)
        writer.close()
        await writer.wait_closed()
        got = np.frombuffer(data, dtype=np.float64)
        return bool(np.allclose(got, reference(_request(i)), rtol=1e-9, atol=1e-12))

    return list(await asyncio.gather(*(client(i) for i in range(requests))))


class _Gate:
    """Holds every request's ops until the last request has arrived: all are truly concurrent.

    ``tensor`` is a pending zero array (its kernel waits for :meth:`arrived` to be called
    ``n`` times); each request adds it to its input, so no request can finish before all of
    them have been dispatched, however fast the machine is.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = 0
        self.opened = math.inf
        self.event = threading.Event()
        op = dataflow.op("gate", meta=ops.spec_of, handle=ops.Tensor, inline=False)(self._wait)
        self.tensor = op(np.zeros((ROWS, 256)))

    def _wait(self, x: Any) -> Any:
        self.event.wait(60.0)
        return x

    def arrived(self) -> None:
        self.count += 1
        if self.count == self.n:
            self.opened = time.monotonic()
            self.event.set()


class _Ticker:
    """Measures the loop's lag: how late a ``period`` sleep wakes up, for as long as it runs."""

    def __init__(self, period: float = 0.002) -> None:
        self.period = period
        self.lags: list[float] = []
        self.times: list[float] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            t = loop.time()
            await asyncio.sleep(self.period)
            self.lags.append(loop.time() - t - self.period)
            self.times.append(time.monotonic())

    async def __aenter__(self) -> _Ticker:
        self._task = asyncio.ensure_future(self._run())
        await asyncio.sleep(0.02)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    def report(self, split: float = math.inf) -> dict[str, Any]:
        """Lag statistics; the worst lag also before and after the moment ``split``."""
        lags_ms = sorted(x * 1e3 for x in self.lags)
        before = [x for x, t in zip(self.lags, self.times, strict=True) if t <= split]
        after = [x for x, t in zip(self.lags, self.times, strict=True) if t > split]
        return {
            "max_lag_ms": round(lags_ms[-1], 2),
            "max_lag_until_all_arrived_ms": round(max(before, default=0.0) * 1e3, 2),
            "max_lag_after_ms": round(max(after, default=0.0) * 1e3, 2),
            "p99_lag_ms": round(lags_ms[int(len(lags_ms) * 0.99)], 2),
            "median_lag_ms": round(lags_ms[len(lags_ms) // 2], 2),
            "ticks": len(lags_ms),
        }


async def serve(requests: int, spread: float = 1.0, threads: int = 2) -> dict[str, Any]:
    """Serve ``requests`` concurrent clients over TCP in a Runtime; measure the loop's lag.

    The clients run in another process (see :func:`_clients`), so the lag measured is the
    server's own: accepting, reading, dispatching ops, awaiting them and writing back.
    """
    async with dataflow.Runtime(interop_threads=threads, intraop_threads=1), _Ticker() as ticker:
        gate = _Gate(requests)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            line = await reader.readline()
            x = ops.add(gate.tensor, _request(int(line)))
            gate.arrived()
            y = await model(x)
            writer.write(np.asarray(y, dtype=np.float64).tobytes())
            await writer.drain()
            writer.close()
            await writer.wait_closed()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        t0 = time.perf_counter()
        async with server:
            cmd = ["-m", "tests.stress._programs", "clients", "--port", str(port)]
            cmd += ["--requests", str(requests), "--spread", str(spread)]
            proc = await asyncio.create_subprocess_exec(
                sys.executable, *cmd, stdout=asyncio.subprocess.PIPE
            )
            out, _ = await proc.communicate()
            results = json.loads(out)
        seconds = time.perf_counter() - t0
    return {
        "program": "server",
        "requests": requests,
        "spread_s": spread,
        "concurrent": gate.count,
        "correct": sum(results),
        "seconds": round(seconds, 3),
        **ticker.report(gate.opened),
    }


async def requests_in_process(
    requests: int, spread: float = 0.5, threads: int = 2
) -> dict[str, Any]:
    """``requests`` concurrent request coroutines inside a Runtime (no sockets); the loop's lag.

    Request ``i`` arrives at a random moment within ``spread`` seconds, dispatches the model
    and awaits it; the gate holds every request until the last one has arrived.
    """
    rng = random.Random(0)
    delays = [rng.uniform(0, spread) for _ in range(requests)]
    async with dataflow.Runtime(interop_threads=threads, intraop_threads=1), _Ticker() as ticker:
        gate = _Gate(requests)

        async def request(i: int) -> Any:
            await asyncio.sleep(delays[i])
            x = ops.add(gate.tensor, _request(i))
            gate.arrived()
            return await model(x)

        t0 = time.perf_counter()
        answers = await asyncio.gather(*(request(i) for i in range(requests)))
        seconds = time.perf_counter() - t0
    # Checked after the measurement (numpy on the loop thread would add to the lag), on one
    # BLAS thread: OpenBLAS's spinning threads can take seconds on a busy 2-vCPU machine.
    with threadpool_limits(limits=1, user_api="blas"):
        results = [
            np.allclose(y, reference(_request(i)), rtol=1e-9, atol=1e-12)
            for i, y in enumerate(answers)
        ]
    return {
        "program": "requests",
        "requests": requests,
        "spread_s": spread,
        "concurrent": gate.count,
        "correct": int(sum(results)),
        "seconds": round(seconds, 3),
        **ticker.report(gate.opened),
    }


# -- soak ------------------------------------------------------------------------------------


def _fails(x: Any) -> Any:
    raise ValueError("expected failure")


_failing = dataflow.op("fails", meta=ops.spec_of, handle=ops.Tensor, inline=False)(_fails)


def _slow(x: Any) -> Any:
    time.sleep(0.002)
    return x


_slow_op = dataflow.op("slow", meta=ops.spec_of, handle=ops.Tensor, inline=False)(_slow)
_timed_op = dataflow.op(
    "timed_slow", meta=ops.spec_of, handle=ops.Tensor, inline=False, timeout=0.001
)(_slow)


async def _mixed(round_: int) -> float:
    """One round of mixed work: ops, forks, a failure, a cancellation, a timeout, a burst."""
    rng = random.Random(round_)
    x = ops.asarray(np.full((16, 16), 0.01 * (round_ % 7)))

    async def member(k: int) -> float:
        y = x
        for _ in range(rng.randrange(5, 30)):
            y = ops.tanh(ops.add(ops.matmul(y, _W[:16, :16]), float(k)))
        return float(np.sum(await y))

    futs = [dataflow.fork(member, k) for k in range(4)]
    bad = ops.add(_failing(x), 1.0)
    doomed = ops.add(_slow_op(x), 1.0)
    doomed.cancel()
    late = _timed_op(x)
    total = 0.0
    for f in futs:
        total += await f
    for h in (bad, doomed, late):
        with contextlib.suppress(dataflow.TaskError, dataflow.CancelledTaskError):
            await h
    plain = dataflow.fork(np.add, np.ones(8), float(round_))
    total += float(np.sum(await plain))
    # A burst past the runtime's max_pending (100): backpressure, with the pool busy.
    heads: list[Any] = [root(np.zeros(1), 0.001)] * 10
    for i in range(300):
        heads[i % 10] = tiny(heads[i % 10])
    for h in heads:
        total += float((await h)[0])
    return total


def soak(seconds: float) -> dict[str, Any]:
    """Mixed work for ``seconds`` (a run per round, loops alternating); threads and RSS growth."""
    t_end = time.monotonic() + seconds
    rounds = 0
    samples: list[tuple[float, int, float]] = []
    warmup = max(1.0, seconds * 0.2)
    t0 = time.monotonic()
    while time.monotonic() < t_end or rounds < 4:
        loop = "uvloop" if rounds % 2 else "asyncio"
        dataflow.run(_mixed, rounds, interop_threads=2, loop=loop, max_pending=100)
        rounds += 1
        now = time.monotonic() - t0
        if now >= warmup:
            gc.collect()
            samples.append((now, threading.active_count(), _rss_mib()))
    first, last = samples[0], samples[-1]
    return {
        "program": "soak",
        "seconds": round(time.monotonic() - t0, 1),
        "rounds": rounds,
        "threads_after_warmup": first[1],
        "threads_at_end": last[1],
        "max_threads": max(s[1] for s in samples),
        "rss_after_warmup_mib": round(first[2], 1),
        "rss_at_end_mib": round(last[2], 1),
        "rss_growth_mib": round(last[2] - first[2], 1),
        "max_rss_mib": round(max(s[2] for s in samples), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.stress._programs")
    sub = parser.add_subparsers(dest="program", required=True)
    m = sub.add_parser("million")
    m.add_argument("--n", type=int, default=1_000_000)
    m.add_argument("--max-pending", default="100000")
    m.add_argument("--gate", type=float, default=1.0, help="seconds the root op runs")
    s = sub.add_parser("server")
    s.add_argument("--requests", type=int, default=1000)
    s.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop"])
    s.add_argument("--spread", type=float, default=1.0, help="seconds over which requests come")
    s.add_argument("--in-process", action="store_true", help="coroutines instead of sockets")
    c = sub.add_parser("clients", help="the server's clients (run by `server`)")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--requests", type=int, default=1000)
    c.add_argument("--spread", type=float, default=1.0)
    k = sub.add_parser("soak")
    k.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    out: Any
    if args.program == "million":
        limit = None if args.max_pending == "none" else int(args.max_pending)
        out = million(args.n, limit, args.gate)
    elif args.program == "clients":
        with threadpool_limits(limits=1, user_api="blas"):
            out = asyncio.run(_clients(args.port, args.requests, args.spread))
    elif args.program == "server":
        if args.loop == "uvloop":
            import uvloop

            runner: Any = uvloop.run
        else:
            runner = asyncio.run
        fn = requests_in_process if args.in_process else serve
        out = runner(fn(args.requests, args.spread))
    else:
        out = soak(args.seconds)
    print(json.dumps(out))  # noqa: T201 - the program's one output line


if __name__ == "__main__":
    main()
