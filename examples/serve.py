"""The LSTM ensemble served over HTTP with aiohttp, every request sharing one inter-op pool.

One :class:`dataflow.Runtime` is opened when the app starts (an aiohttp ``cleanup_ctx``) and
closed when it stops, so the process has one pool of inter-op threads, as torch shares its
inter-op pool between inference requests. A request only dispatches the model's ops and
awaits the result: the event loop stays free to accept more requests meanwhile, and the ops of
concurrent requests interleave on the pool (oldest first).

Endpoints:

* ``GET /ensemble?seed=N``: run the ensemble on a seeded random input of the configured size;
* ``POST /ensemble`` with JSON ``{"seed": N}`` or ``{"x": [[[...]]]}`` (steps, batch, channels);
* ``GET /health``.

Each answers a JSON summary of the output (shape, sum, mean, std, min, max, a few values) and
the time the request took.

Usage::

    python examples/serve.py serve --port 8080          # serve on 127.0.0.1:8080
    python examples/serve.py bench                      # load test: 1, 8, 32 clients
    curl 'http://127.0.0.1:8080/ensemble?seed=1'
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import sys
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

import dataflow

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:  # `python examples/serve.py` puts examples/, not the root, first
    sys.path.insert(0, str(_ROOT))

from examples.lstm_ensemble import Ensemble  # noqa: E402 - needs the path set just above

T = TypeVar("T")
Array = np.ndarray[Any, Any]

# Posted inputs larger than this are refused (the server must stay bounded).
MAX_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class ServeConfig:
    """What the server runs: the input size of a seeded request, the model, the threads."""

    steps: int = 20
    batch: int = 8
    channels: int = 128
    models: int = 4
    interop_threads: int = 2
    intraop_threads: int | None = 1
    seed: int = 0


CONFIG = web.AppKey("config", ServeConfig)
MODEL = web.AppKey("model", Ensemble)
RUNTIME = web.AppKey("runtime", dataflow.Runtime)
CONTEXT = web.AppKey("context", contextvars.Context)


class BadRequest(ValueError):
    """The request's input cannot be used; answered with status 400."""


# -- the app ----------------------------------------------------------------------------------


async def _runtime_ctx(app: web.Application) -> AsyncIterator[None]:
    """Open the one runtime (and its pool) for the app's lifetime."""
    config = app[CONFIG]
    async with dataflow.Runtime(
        interop_threads=config.interop_threads, intraop_threads=config.intraop_threads
    ) as runtime:
        app[RUNTIME] = runtime
        # The runtime is current in this context. Handlers run in tasks aiohttp creates, whose
        # context is not guaranteed to descend from this one, so they run the model in a copy
        # of this context (see in_runtime).
        app[CONTEXT] = contextvars.copy_context()
        yield


async def in_runtime(app: web.Application, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` with the app's runtime current, in a task of its own context.

    Cancelling the caller (a client that went away) cancels the task too, and the runtime
    drops that request's queued ops.
    """
    if dataflow.current_runtime() is app[RUNTIME]:
        return await coro
    return await asyncio.create_task(coro, context=app[CONTEXT].copy())


def seeded_input(config: ServeConfig, seed: int) -> Array:
    """The input a ``seed`` request runs on: uniform [0, 1), (steps, batch, channels) float32."""
    rng = np.random.default_rng(seed)
    x: Array = rng.random((config.steps, config.batch, config.channels), dtype=np.float32)
    return x


def _parse_seed(value: Any) -> int:
    try:
        seed = int(value)
    except (TypeError, ValueError):
        raise BadRequest(f"seed must be an integer, got {value!r}") from None
    if seed < 0:
        raise BadRequest(f"seed must be >= 0, got {seed}")
    return seed


async def read_input(request: web.Request) -> tuple[Array, int | None]:
    """The request's input array and its seed (None for a posted array)."""
    config = request.app[CONFIG]
    if request.method == "GET":
        seed = _parse_seed(request.query.get("seed", 0))
        return seeded_input(config, seed), seed
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body must be JSON: {exc}") from None
    if not isinstance(body, dict) or ("x" in body) == ("seed" in body):
        raise BadRequest('post a JSON object with either "seed" or "x"')
    if "seed" in body:
        seed = _parse_seed(body["seed"])
        return seeded_input(config, seed), seed
    try:
        x = np.asarray(body["x"], dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f'"x" must be a nested list of numbers: {exc}') from None
    if x.ndim != 3 or x.shape[2] != config.channels or 0 in x.shape:
        raise BadRequest(
            f'"x" must have shape (steps, batch, {config.channels}), got {list(x.shape)}'
        )
    if x.size > MAX_ELEMENTS:
        raise BadRequest(f'"x" has {x.size} elements; the limit is {MAX_ELEMENTS}')
    return x, None


def summarize(y: Array) -> dict[str, Any]:
    """A JSON-able summary of an output array."""
    flat = y.reshape(-1)
    return {
        "shape": list(y.shape),
        "dtype": str(y.dtype),
        "sum": float(y.sum(dtype=np.float64)),
        "mean": float(y.mean(dtype=np.float64)),
        "std": float(y.std(dtype=np.float64)),
        "min": float(y.min()),
        "max": float(y.max()),
        "first": [float(v) for v in flat[:4]],
    }


async def _forward(model: Ensemble, x: Array) -> Array:
    y: Array = await model(x)  # one await: the output as an array
    return y


async def handle_ensemble(request: web.Request) -> web.Response:
    """GET/POST /ensemble: run the ensemble, answer a summary."""
    t0 = time.perf_counter()
    try:
        x, seed = await read_input(request)
    except BadRequest as exc:
        return web.json_response({"error": str(exc)}, status=400)
    try:
        y = await in_runtime(request.app, _forward(request.app[MODEL], x))
    except dataflow.OpInputError as exc:  # a shape the model cannot take
        return web.json_response({"error": str(exc)}, status=400)
    result = summarize(y)
    result["seed"] = seed
    result["ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    return web.json_response(result)


async def handle_health(request: web.Request) -> web.Response:
    """GET /health: the config and the runtime's state."""
    return web.json_response(
        {"ok": True, "config": asdict(request.app[CONFIG]), "runtime": repr(request.app[RUNTIME])}
    )


def create_app(config: ServeConfig | None = None) -> web.Application:
    """The aiohttp application: the model is built now, the runtime opens at startup."""
    config = config or ServeConfig()
    app = web.Application()
    app[CONFIG] = config
    app[MODEL] = Ensemble(config.models, config.channels, seed=config.seed)
    app.cleanup_ctx.append(_runtime_ctx)
    app.router.add_get("/ensemble", handle_ensemble)
    app.router.add_post("/ensemble", handle_ensemble)
    app.router.add_get("/health", handle_health)
    return app


# -- the load generator -----------------------------------------------------------------------


@dataclass(frozen=True)
class LoadResult:
    """One concurrency level's figures."""

    concurrency: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def throughput(self) -> float:
        """Requests per second."""
        return self.requests / self.seconds


def _percentile(sorted_values: list[float], q: float) -> float:
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


async def load(url: str, *, concurrency: int, requests: int) -> LoadResult:
    """``requests`` GETs of ``url`` (seeds 0, 1, ...) from ``concurrency`` clients at once."""
    latencies: list[float] = []
    next_index = 0

    async def client(session: ClientSession) -> None:
        nonlocal next_index
        while next_index < requests:
            seed = next_index
            next_index += 1
            t0 = time.perf_counter()
            async with session.get(url, params={"seed": str(seed)}) as resp:
                resp.raise_for_status()
                await resp.read()
            latencies.append(time.perf_counter() - t0)

    connector = TCPConnector(limit=concurrency)
    async with ClientSession(connector=connector, timeout=ClientTimeout(total=120)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        seconds = time.perf_counter() - t0
    lat = sorted(latencies)
    return LoadResult(
        concurrency, len(lat), seconds, _percentile(lat, 50) * 1e3, _percentile(lat, 99) * 1e3
    )


async def bench(
    config: ServeConfig | None = None,
    *,
    levels: Sequence[int] = (1, 8, 32),
    requests: int = 64,
    out: Any = None,
) -> list[LoadResult]:
    """Serve on 127.0.0.1 (a free port) and load it at each concurrency level; print a table.

    Server and clients share this process's event loop, so the figures include the clients'
    own overhead; they compare concurrency levels, not servers.
    """
    config = config or ServeConfig()
    runner = web.AppRunner(create_app(config), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        url = f"http://127.0.0.1:{port}/ensemble"
        write = print if out is None else out
        write(
            f"ensemble {config.models} x BiLSTM, T, B, C = {config.steps}, {config.batch}, "
            f"{config.channels}; inter-op {config.interop_threads}, intra-op "
            f"{config.intraop_threads}; {requests} requests per level"
        )
        await load(url, concurrency=1, requests=2)  # warm-up
        write(f"  {'clients':>7} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9}")
        results = []
        for level in levels:
            r = await load(url, concurrency=level, requests=max(requests, level))
            results.append(r)
            write(f"  {level:>7} {r.throughput:>9.1f} {r.p50_ms:>9.2f} {r.p99_ms:>9.2f}")
        write(json.dumps({"serve_bench": [asdict(r) | {"rps": r.throughput} for r in results]}))
        return results
    finally:
        await runner.cleanup()


# -- command line -----------------------------------------------------------------------------


def _config(args: argparse.Namespace) -> ServeConfig:
    return ServeConfig(
        steps=args.steps,
        batch=args.batch,
        channels=args.channels,
        models=args.models,
        interop_threads=args.interop_threads,
        intraop_threads=args.intraop_threads,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``serve`` (run the server) or ``bench`` (load-test one in this process)."""
    p = argparse.ArgumentParser(prog="serve.py", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["serve", "bench"], nargs="?", default="serve")
    d = ServeConfig()
    p.add_argument("--host", default="127.0.0.1", help="serve: address (default loopback)")
    p.add_argument("--port", type=int, default=8080, help="serve: port (default 8080)")
    p.add_argument("--steps", "-T", type=int, default=d.steps)
    p.add_argument("--batch", "-B", type=int, default=d.batch)
    p.add_argument("--channels", "-C", type=int, default=d.channels)
    p.add_argument("--models", type=int, default=d.models)
    p.add_argument("--interop-threads", type=int, default=d.interop_threads)
    p.add_argument("--intraop-threads", type=int, default=d.intraop_threads)
    p.add_argument("--requests", type=int, default=64, help="bench: requests per level")
    p.add_argument(
        "--levels", default="1,8,32", help="bench: comma-separated client counts (1,8,32)"
    )
    args = p.parse_args(argv)
    config = _config(args)
    if args.command == "serve":
        web.run_app(create_app(config), host=args.host, port=args.port)
        return 0
    levels = [int(v) for v in args.levels.split(",") if v.strip()]
    asyncio.run(bench(config, levels=levels, requests=args.requests))
    return 0


if __name__ == "__main__":
    sys.exit(main())
