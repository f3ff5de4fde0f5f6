"""Load: backpressure keeps memory bounded, concurrent requests keep the loop responsive, and a
soak of mixed work grows neither threads nor memory.

The heavy programs live in ``tests/stress/_programs.py`` (run them by hand for the figures in
docs/hardening.md); here they run at CI sizes.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from tests.stress import _programs
from tests.stress._programs import root, tiny
from tests.stress._support import Gate, run_python, spec_op


def _chains(n: int, chains: int, start: Any, sample: list[int]) -> list[Any]:
    """Dispatch ``n`` tiny ops in round-robin chains from ``start``; sample the in-flight count."""
    rt = dataflow.current_runtime()
    assert rt is not None
    heads = [start] * chains
    for i in range(n):
        heads[i % chains] = tiny(heads[i % chains])
        sample.append(rt._inflight)
    return heads


async def _total(heads: list[Any]) -> float:
    total = 0.0
    for h in heads:
        total += float((await h)[0])
    return total


class TestBackpressure:
    def test_in_flight_stays_under_the_limit(self, loop: str) -> None:
        """20,000 ops behind a slow root with max_pending=500: never more than 501 in flight."""
        sample: list[int] = []

        async def main() -> float:
            heads = _chains(20_000, 100, root(np.zeros(1), 0.2), sample)
            return await _total(heads)

        got = dataflow.run(main, interop_threads=2, max_pending=500, loop=loop)
        assert got == 20_000.0
        assert max(sample) <= 501
        assert max(sample) >= 450  # the limit was reached, so the bound was exercised

    def test_no_limit(self) -> None:
        """max_pending=None lets dispatch run ahead of the pool without bound."""
        sample: list[int] = []
        # Held until all 5,000 are dispatched (a root that slept 0.3 s finished first when
        # dispatch was slow: a process heavy with earlier tests' objects).
        gate = Gate("no_limit_root")

        async def main() -> float:
            heads = _chains(5_000, 10, gate.op(np.zeros(1)), sample)
            gate.open()
            return await _total(heads)

        assert dataflow.run(main, interop_threads=2, max_pending=None) == 5_000.0
        assert max(sample) >= 4_900

    @pytest.mark.parametrize("threads", [1, 2])
    def test_dispatch_from_a_worker_thread(self, threads: int) -> None:
        """A forked plain function dispatching 5,000 ops over the limit helps, and completes."""
        sample: list[int] = []

        def producer(start: Any) -> list[Any]:
            return _chains(5_000, 20, np.zeros(1), sample)

        async def main() -> float:
            heads = await dataflow.fork(producer, None)
            return await _total(heads)

        assert dataflow.run(main, interop_threads=threads, max_pending=200) == 5_000.0
        # The producer's own task counts as in flight, so the bound is one more.
        assert max(sample) <= 202

    def test_no_deadlock_when_in_flight_work_waits_on_the_dispatcher(self) -> None:
        """Ops waiting on a fork that itself dispatches over the limit cannot deadlock it."""
        consume: dataflow.Op[..., dataflow.Pending[Any]] = dataflow.op(
            "consume",
            meta=lambda heads: _programs._SPEC,
            handle=lambda task, index, spec: dataflow.Pending(task),
        )(lambda heads: np.full(1, float(len(heads))))

        def producer() -> list[Any]:
            return _chains(3_000, 10, np.zeros(1), [])

        async def main() -> float:
            made = dataflow.fork(producer)
            waiting = [consume(made) for _ in range(400)]  # all in flight, all on `made`
            total = 0.0
            for w in waiting:
                total += float((await w)[0])
            return total + await _total(await made)

        assert dataflow.run(main, interop_threads=1, max_pending=300) == 400 * 10 + 3_000.0

    def test_helper_never_runs_timed_ops(self) -> None:
        """The loop thread helping under backpressure leaves ops with a timeout to the pool."""
        threads: list[str] = []

        def where(x: Any) -> Any:
            threads.append(threading.current_thread().name)
            return x

        timed = spec_op("timed_where", where, inline=False, timeout=30.0)

        async def main() -> None:
            x: Any = ops.asarray(np.ones(1))
            heads = [timed(root(np.zeros(1), 0.05)) for _ in range(4)]
            for i in range(400):
                heads[i % 4] = timed(heads[i % 4])
            for h in heads:
                await h
            assert x is not None

        dataflow.run(main, interop_threads=2, max_pending=50)
        assert len(threads) == 404
        assert all(name.startswith("interop") for name in threads), set(threads)

    @pytest.mark.stress
    def test_million_ops_bounded_memory(self) -> None:
        """1,000,000 tiny ops from one coroutine complete with in-flight and RSS bounded."""
        proc = run_python(["-m", "tests.stress._programs", "million"], timeout=150)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["ok"], out
        assert out["max_inflight_seen"] <= 100_001, out
        # About 0.5 KB per task in flight: 100,000 of them fit in ~50 MB (1M would be ~500).
        assert out["peak_growth_mib"] < 200, out


class TestConcurrentRequests:
    @pytest.mark.asyncio
    async def test_1000_requests_in_process(self) -> None:
        """1,000 concurrent request coroutines in a Runtime: all correct, all concurrent, and
        the loop keeps running meanwhile (its lag is measured by benchmarks/serving.py: tests
        assert behaviour, not wall times)."""
        out = await _programs.requests_in_process(1000, spread=0.5)
        assert out["correct"] == 1000 and out["concurrent"] == 1000, out
        assert out["ticks"] > 0, out

    @pytest.mark.stress
    @pytest.mark.asyncio
    async def test_1000_requests_over_tcp(self) -> None:
        """1,000 concurrent clients of an asyncio server embedding a Runtime: all answered right."""
        out = await _programs.serve(1000, spread=1.0)
        assert out["correct"] == 1000 and out["concurrent"] == 1000, out


class TestSoak:
    @pytest.mark.stress
    def test_soak(self) -> None:
        """Mixed work for $DATAFLOW_SOAK_SECONDS (default 10): no thread or RSS growth."""
        seconds = float(os.environ.get("DATAFLOW_SOAK_SECONDS", "10"))
        t0 = time.monotonic()
        out = _programs.soak(seconds)
        assert time.monotonic() - t0 < seconds + 30
        assert out["rounds"] >= 4
        # A thread stuck in a timed-out kernel may still be finishing when sampled.
        assert out["threads_at_end"] <= out["threads_after_warmup"] + 1, out
        assert out["rss_growth_mib"] < 16, out
