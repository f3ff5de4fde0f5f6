"""The LSTM ensemble served over HTTP with aiohttp, every request sharing one inter-op pool.

One :class:`dataflow.Runtime` is opened when the app starts (an aiohttp ``cleanup_ctx``) and
closed when it stops, so the process has one pool of inter-op threads, as torch shares its
inter-op pool between inference requests. A request only dispatches the model's ops and
awaits the result: the event loop stays free to accept more requests meanwhile, and the ops of
concurrent requests interleave on the pool (oldest first).

The model is compiled (``dataflow.compile``): a request of the configured input size
launches the cached plan, which costs the event loop a few microseconds whatever the model's
op count, and concurrent requests are batched (``batch_axis=1``: requests that arrive while a
batch runs are concatenated along the batch axis and run as one, at most ``max_wait`` later).
Inputs of another length run eagerly (the model's ops dispatched from the handler), so
clients cannot make the server compile without limit. The app warms up at startup (compiles,
measures its ops) and then calls ``gc.freeze()``, so the collector never walks the model's
long-lived objects again. A request that outlives its deadline is answered 504 and its queued
ops are dropped (the work runs in a task of its own, cancelled at the deadline); so are those
of a request whose client disconnected (the server runs with aiohttp's
``handler_cancellation=True``, ``SERVER_OPTIONS``: by default aiohttp lets the handler run on).
Input that cannot be used (not JSON, the wrong shape, anything but finite numbers) is answered
400 with the reason; aiohttp answers 413 to a body over its ``client_max_size`` (1 MiB).

Endpoints:

* ``GET /ensemble?seed=N``: run the ensemble on a seeded random input of the configured size;
* ``POST /ensemble`` with JSON ``{"seed": N}`` or ``{"x": [[[...]]]}`` (steps, batch, channels);
* ``/ensemble/compiled`` (compiled, no batching) and ``/ensemble/eager`` (no compiling), the
  same otherwise, for comparison;
* ``GET /health``: the config, the runtime, the compiled signatures;
* ``GET /trace``: the last minute of the runtime's tasks (at most 100,000 of them) as a
  Chrome/Perfetto trace (a ``dataflow.Recorder`` stays attached; ``kill -USR1`` writes the
  same to ``serve-trace-<time>.json``), written on a thread so that the loop goes on serving.

Each answers a JSON summary of the output (shape, sum, mean, std, min, max, a few values) and
the time the request took. See docs/serving.md for what a request costs and how to size it.

Usage::

    python examples/serve.py serve --port 8080          # serve on 127.0.0.1:8080
    python examples/serve.py bench                      # load test: 1, 8, 32 clients
    curl 'http://127.0.0.1:8080/ensemble?seed=1'
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import gc
import json
import signal
import sys
import tempfile
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
# A posted body larger than this is parsed on a thread, not on the event loop.
PARSE_ON_LOOP_BYTES = 64 * 1024


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
    max_wait: float = 0.01  # the longest a request waits to join a batch (seconds)
    deadline: float = 10.0  # a request still running after this many seconds gets a 504
    trace_seconds: float = 60.0  # how much of the timeline /trace keeps
    # ... and at most this many task records of it: by age alone, the buffer (and a dump of
    # it) grew with the load, hundreds of MB for a minute of a busy eager route.
    trace_spans: int = 100_000
    warm_up: bool = True  # compile and measure at startup, then gc.freeze()


CONFIG = web.AppKey("config", ServeConfig)
MODEL = web.AppKey("model", Ensemble)
RUNTIME = web.AppKey("runtime", dataflow.Runtime)
CONTEXT = web.AppKey("context", contextvars.Context)
COMPILED = web.AppKey("compiled", dataflow.Compiled)
BATCHED = web.AppKey("batched", dataflow.Compiled)
RECORDER = web.AppKey("recorder", dataflow.Recorder)
TRACE_LOCK = web.AppKey("trace_lock", asyncio.Lock)

# What the server is started with (``web.run_app`` in ``main``, the ``AppRunner`` of ``bench``):
# aiohttp cancels a handler whose client disconnected only when asked, and a cancelled
# handler is what drops the request's queued ops (see in_runtime).
SERVER_OPTIONS: dict[str, Any] = {"handler_cancellation": True}


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
        recorder = dataflow.Recorder(max_seconds=config.trace_seconds, max_spans=config.trace_spans)
        runtime.add_instrument(recorder)
        app[RECORDER] = recorder
        # The runtime is current in this context. Handlers run in tasks aiohttp creates, whose
        # context is not guaranteed to descend from this one, so they run the model in a copy
        # of this context (see in_runtime).
        app[CONTEXT] = contextvars.copy_context()
        if config.warm_up:
            # Compile both forwards and let the runtime measure the ops before the first
            # request, then move everything alive now out of the collector's sight.
            x = seeded_input(config, 0)
            for forward in (app[BATCHED], app[COMPILED]):
                # Every batch size a burst will run at is traced now, not mid-traffic.
                await in_runtime(app, forward.warm_up(x))
                for _ in range(2):
                    await in_runtime(app, forward(x))
            gc.freeze()
        try:
            yield
        finally:
            if config.warm_up:
                gc.unfreeze()


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
    """A request's seed: a non-negative JSON integer, or its decimal text (a query string)."""
    if type(value) is int:
        seed = value
    elif isinstance(value, str) and value.strip().removeprefix("+").isdecimal():
        try:
            seed = int(value)
        except ValueError:  # past Python's 4300 digits
            raise BadRequest(f"seed is too long: {len(value)} characters") from None
    else:  # a float (1.5, Infinity, NaN), a boolean, null, a list ...
        raise BadRequest(f"seed must be a non-negative integer, got {value!r:.40}")
    if seed < 0:
        raise BadRequest(f"seed must be >= 0, got {seed}")
    return seed


def _parse_json(raw: bytes, charset: str | None) -> Any:
    """A request's body as JSON (aiohttp refused one over ``client_max_size`` with a 413)."""
    try:
        text = raw.decode(charset or "utf-8")
    except (LookupError, UnicodeDecodeError) as exc:  # an unknown charset, bad bytes
        raise BadRequest(f"the body must be JSON text: {exc}") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise BadRequest("the body must be JSON: it nests too deeply") from None
    except ValueError as exc:  # not JSON, or an integer of over 4300 digits
        raise BadRequest(f"the body must be JSON: {exc}") from None


def _parse_x(value: Any, channels: int) -> Array:
    """A posted input: a (steps, batch, channels) nested list of finite float32 numbers."""
    try:
        x = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as exc:  # ragged, too deep
        raise BadRequest(f'"x" must be a nested list of numbers: {exc}') from None
    if x.dtype.kind not in "iuf":  # strings, booleans, null, objects, huge integers
        raise BadRequest(f'"x" must be a nested list of numbers, got {x.dtype} values')
    if x.ndim != 3 or x.shape[2] != channels or 0 in x.shape:
        raise BadRequest(f'"x" must have shape (steps, batch, {channels}), got {list(x.shape)}')
    if x.size > MAX_ELEMENTS:
        raise BadRequest(f'"x" has {x.size} elements; the limit is {MAX_ELEMENTS}')
    if not np.isfinite(x).all() or np.abs(x).max() > np.finfo(np.float32).max:
        raise BadRequest('"x" must hold finite float32 numbers (no NaN, Infinity, or 1e39)')
    return x.astype(np.float32)


def parse_body(raw: bytes, charset: str | None, config: ServeConfig) -> tuple[Array, int | None]:
    """A posted body's input array and its seed (None for a posted array)."""
    body = _parse_json(raw, charset)
    if not isinstance(body, dict) or ("x" in body) == ("seed" in body):
        raise BadRequest('post a JSON object with either "seed" or "x"')
    if "seed" in body:
        seed = _parse_seed(body["seed"])
        return seeded_input(config, seed), seed
    return _parse_x(body["x"], config.channels), None


async def read_input(request: web.Request) -> tuple[Array, int | None]:
    """The request's input array and its seed (None for a posted array)."""
    config = request.app[CONFIG]
    if request.method == "GET":
        seed = _parse_seed(request.query.get("seed", "0"))
        return seeded_input(config, seed), seed
    raw = await request.read()
    if len(raw) > PARSE_ON_LOOP_BYTES:
        # Parsing a big body takes milliseconds (20 ms for 1 MiB of numbers): on a thread, so
        # that the loop goes on serving meanwhile.
        return await asyncio.to_thread(parse_body, raw, request.charset, config)
    return parse_body(raw, request.charset, config)


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


async def _forward(model: Any, x: Array) -> Array:
    y: Array = await model(x)  # one await: the output as an array
    return y


def _model_for(app: web.Application, route: str, x: Array) -> tuple[Any, str]:
    """What runs a request: the compiled forwards take inputs of the configured size only."""
    config = app[CONFIG]
    if route == "eager" or x.shape != (config.steps, config.batch, config.channels):
        return app[MODEL], "eager"
    if route == "compiled":
        return app[COMPILED], "compiled"
    return app[BATCHED], "batched"


def _handler(route: str) -> Any:
    async def handle(request: web.Request) -> web.Response:
        """Run the ensemble (``route``: batched, compiled or eager), answer a summary."""
        t0 = time.perf_counter()
        try:
            x, seed = await read_input(request)
        except BadRequest as exc:
            return web.json_response({"error": str(exc)}, status=400)
        app = request.app
        model, ran = _model_for(app, route, x)
        # The work runs in a task of its own (in_runtime): at the deadline wait_for cancels
        # it, and the runtime drops that request's ops that have not started.
        try:
            y = await asyncio.wait_for(in_runtime(app, _forward(model, x)), app[CONFIG].deadline)
        except TimeoutError:
            return web.json_response(
                {"error": f"deadline of {app[CONFIG].deadline} s passed; the work was dropped"},
                status=504,
            )
        except dataflow.OpInputError as exc:  # a shape the model cannot take
            return web.json_response({"error": str(exc)}, status=400)
        result = summarize(y)
        result["seed"] = seed
        result["ran"] = ran
        result["ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        return web.json_response(result)

    return handle


handle_ensemble = _handler("batched")


async def handle_health(request: web.Request) -> web.Response:
    """GET /health: the config, the runtime's state and what has been compiled."""
    app = request.app
    return web.json_response(
        {
            "ok": True,
            "config": asdict(app[CONFIG]),
            "runtime": repr(app[RUNTIME]),
            "compiled": {"batched": repr(app[BATCHED]), "compiled": repr(app[COMPILED])},
        }
    )


def dump_trace(app: web.Application, path: str) -> str:
    """Write the recorder's buffer (the last ``trace_seconds`` of tasks, at most
    ``trace_spans`` of them) to ``path``.

    Building and writing a minute of a busy server's tasks takes a while (tens of thousands of
    spans): call it on a thread, never on the event loop (``handle_trace`` and the ``USR1``
    handler do)."""
    app[RECORDER].dump(path)
    return path


def _trace_body(app: web.Application) -> bytes:
    """The recorder's buffer as Chrome trace JSON (on a thread: see :func:`dump_trace`)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = dump_trace(app, f"{tmp}/trace.json")
        return Path(path).read_bytes()


async def handle_trace(request: web.Request) -> web.StreamResponse:
    """GET /trace: the recent timeline as a Chrome/Perfetto trace (JSON)."""
    app = request.app
    # On a thread, so that the loop goes on serving; one dump at a time (each is CPU-bound
    # and walks the whole buffer).
    async with app[TRACE_LOCK]:
        job = asyncio.get_running_loop().run_in_executor(None, _trace_body, app)
        try:
            body = await asyncio.shield(job)
        except dataflow.DataflowError as exc:  # nothing recorded yet
            return web.json_response({"error": str(exc)}, status=404)
        except asyncio.CancelledError:
            # The client left. The lock is kept until the thread is done, or clients that
            # come and go would run dumps side by side (each a few seconds of CPU).
            with contextlib.suppress(BaseException):
                await job
            raise
    return web.Response(body=body, content_type="application/json")


async def _on_signal(app: web.Application) -> None:
    """``kill -USR1 <pid>`` writes the recent timeline to serve-trace-<time>.json."""

    def dump() -> None:  # on a thread (see dump_trace)
        path = f"serve-trace-{time.strftime('%Y%m%d-%H%M%S')}.json"
        try:
            print(f"trace written to {dump_trace(app, path)}", file=sys.stderr)
        except dataflow.DataflowError as exc:
            print(f"no trace written: {exc}", file=sys.stderr)

    if hasattr(signal, "SIGUSR1"):
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, loop.run_in_executor, None, dump)


def create_app(config: ServeConfig | None = None) -> web.Application:
    """The aiohttp application: the model is built now, the runtime opens at startup."""
    config = config or ServeConfig()
    app = web.Application()
    app[CONFIG] = config
    model = Ensemble(config.models, config.channels, seed=config.seed)
    app[MODEL] = model
    app[COMPILED] = dataflow.compile(model)
    app[BATCHED] = dataflow.compile(model, batch_axis=1, max_wait=config.max_wait)
    app[TRACE_LOCK] = asyncio.Lock()
    app.cleanup_ctx.append(_runtime_ctx)
    for route, path in (("batched", ""), ("compiled", "/compiled"), ("eager", "/eager")):
        app.router.add_get(f"/ensemble{path}", _handler(route))
        app.router.add_post(f"/ensemble{path}", _handler(route))
    app.router.add_get("/health", handle_health)
    app.router.add_get("/trace", handle_trace)
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
    runner = web.AppRunner(create_app(config), access_log=None, **SERVER_OPTIONS)
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


def _at_least_one(text: str, bad_int: str, too_small: str) -> int:
    """``text`` as an int of at least 1, or argparse's error (``bad_int``, ``too_small``:
    the messages, ``{n}`` the value)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(bad_int) from None
    if n < 1:
        raise argparse.ArgumentTypeError(too_small.format(n=n))
    return n


def _positive_int(text: str) -> int:
    """argparse type: an int of at least 1 (``--requests``)."""
    return _at_least_one(text, f"not an int: {text!r}", "must be at least 1, got {n}")


def _port(text: str) -> int:
    """argparse type: a TCP port, 0 (any free one) to 65535 (``--port``)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an int: {text!r}") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {n}")
    return n


def _levels(text: str) -> list[int]:
    """argparse type: comma-separated client counts, each at least 1 (``--levels``)."""
    parts = [v.strip() for v in text.split(",") if v.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"no client counts in {text!r}")
    too_small = "client counts must be at least 1, got {n}"
    return [_at_least_one(v, f"{v!r} is not an int (in {text!r})", too_small) for v in parts]


def main(argv: Sequence[str] | None = None) -> int:
    """``serve`` (run the server) or ``bench`` (load-test one in this process)."""
    p = argparse.ArgumentParser(prog="serve.py", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["serve", "bench"], nargs="?", default="serve")
    d = ServeConfig()
    p.add_argument("--host", default="127.0.0.1", help="serve: address (default loopback)")
    p.add_argument("--port", type=_port, default=8080, help="serve: port (default 8080)")
    p.add_argument("--steps", "-T", type=_positive_int, default=d.steps)
    p.add_argument("--batch", "-B", type=_positive_int, default=d.batch)
    p.add_argument("--channels", "-C", type=_positive_int, default=d.channels)
    p.add_argument("--models", type=_positive_int, default=d.models)
    p.add_argument("--interop-threads", type=_positive_int, default=d.interop_threads)
    p.add_argument("--intraop-threads", type=_positive_int, default=d.intraop_threads)
    p.add_argument(
        "--requests", type=_positive_int, default=64, help="bench: requests per level (default 64)"
    )
    p.add_argument(
        "--levels",
        type=_levels,
        default="1,8,32",
        help="bench: comma-separated client counts (default 1,8,32)",
    )
    args = p.parse_args(argv)
    config = _config(args)
    if args.command == "serve":
        app = create_app(config)
        app.on_startup.append(_on_signal)
        try:
            web.run_app(app, host=args.host, port=args.port, **SERVER_OPTIONS)
        except OSError as exc:  # the address: unknown host, port taken, no permission
            print(f"serve.py: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
            return 1
        return 0
    asyncio.run(bench(config, levels=args.levels, requests=args.requests))
    return 0


if __name__ == "__main__":
    sys.exit(main())
