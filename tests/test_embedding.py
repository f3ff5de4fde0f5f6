"""dataflow inside a running asyncio server: shared pool, correct results, loop never blocked."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

import dataflow


def heavy(seed: int) -> float:
    """numpy work for one request: GEMMs (which release the GIL) and a reduction.

    Model work is GEMM-dominated; the Python between kernels holds the GIL, and the loop thread
    competes with the workers for it, so per-request Python overhead is kept realistic.
    """
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((384, 384)).astype(np.float32)
    b = np.tanh(a @ a / 20)
    b = np.tanh(b @ a / 20)
    return float(b.sum())


async def lag_ticker(stop: asyncio.Event, lags: list[float]) -> None:
    """Measure how late the loop wakes a 1 ms sleeper (the loop lag)."""
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - t - 0.001)


class TestEmbedding:
    @pytest.mark.asyncio
    async def test_32_concurrent_requests(self) -> None:
        """32 concurrent requests each fork numpy work; all answers right, and the loop keeps
        ticking meanwhile (the lag bound itself is measured by benchmarks/serving.py: tests
        assert behaviour, not wall times)."""
        await self._serve_32_requests()

    async def _serve_32_requests(self) -> float:
        """One attempt: serve 32 concurrent clients, check every answer, return the max lag."""

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seed = int((await reader.readline()).decode())
            parts = [dataflow.fork(heavy, seed + k) for k in range(3)]
            values = [await dataflow.wait(p) for p in parts]
            writer.write((json.dumps(values) + "\n").encode())
            await writer.drain()
            writer.close()

        async def client(port: int, seed: int) -> list[float]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"{seed}\n".encode())
            await writer.drain()
            line = await reader.readline()
            writer.close()
            await writer.wait_closed()
            return list(json.loads(line))

        expected = {s: [heavy(s + k) for k in range(3)] for s in range(0, 320, 10)}
        lags: list[float] = []
        stop = asyncio.Event()
        async with dataflow.Runtime(interop_threads=2, intraop_threads=1):
            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            ticker = asyncio.ensure_future(lag_ticker(stop, lags))
            try:
                results = await asyncio.gather(*(client(port, s) for s in expected))
            finally:
                stop.set()
                await ticker
                server.close()
                await server.wait_closed()
        for seed, got in zip(expected, results, strict=True):
            assert got == pytest.approx(expected[seed], rel=1e-3, abs=1e-3)
        assert len(lags) > 10
        return max(lags)
