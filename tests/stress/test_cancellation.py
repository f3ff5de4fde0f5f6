"""Cancellation midway: task cancel, Runtime exit by exception, timeouts around a runtime, Ctrl-C.

After each: no thread left, no asyncio task left, queued kernels never started, kernels that
were running when the cancellation came finished (none is still running once the runtime
has exited), and repeating it does not grow the thread count or the memory.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from tests.stress._support import REPO, dataflow_threads, rss_mib, spec_op


class Counter:
    """A pool op that naps ``seconds`` (GIL-free) and counts kernels started and finished."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = 0
        self.finished = 0
        self.lock = threading.Lock()
        self.op = spec_op("nap", self._kernel, inline=False)

    def _kernel(self, x: Any) -> Any:
        with self.lock:
            self.started += 1
        time.sleep(self.seconds)
        with self.lock:
            self.finished += 1
        return x

    def dispatch(self, chains: int, length: int) -> list[Any]:
        """``chains`` independent chains of ``length`` naps; returns the chain ends."""
        heads = [ops.asarray(np.full(2, float(i))) for i in range(chains)]
        for _ in range(length):
            heads = [self.op(h) for h in heads]
        return heads


async def _forever() -> None:
    await asyncio.sleep(3600)


async def _body(counter: Counter, chains: int, length: int, raise_after: float | None) -> None:
    async with dataflow.Runtime(interop_threads=2):
        heads = counter.dispatch(chains, length)
        dataflow.fork(_forever)
        if raise_after is not None:
            await asyncio.sleep(raise_after)
            raise ZeroDivisionError("the body failed")
        for h in heads:
            await h


# Each scenario runs the body and cancels it midway; returns the exception that came out.
Scenario = Callable[[Counter, int, int], Awaitable[BaseException | None]]


async def _task_cancel(counter: Counter, chains: int, length: int) -> BaseException | None:
    task = asyncio.ensure_future(_body(counter, chains, length, None))
    await asyncio.sleep(0.03)
    task.cancel()
    try:
        await task
    except BaseException as exc:
        return exc
    return None


async def _exit_by_exception(counter: Counter, chains: int, length: int) -> BaseException | None:
    try:
        await _body(counter, chains, length, 0.03)
    except BaseException as exc:
        return exc
    return None


async def _timeout_around(counter: Counter, chains: int, length: int) -> BaseException | None:
    try:
        async with asyncio.timeout(0.03):
            await _body(counter, chains, length, None)
    except BaseException as exc:
        return exc
    return None


SCENARIOS: dict[str, tuple[Scenario, type[BaseException]]] = {
    "task_cancel": (_task_cancel, asyncio.CancelledError),
    "exit_by_exception": (_exit_by_exception, ZeroDivisionError),
    "asyncio_timeout": (_timeout_around, TimeoutError),
}


def _check_clean(counter: Counter, total: int) -> None:
    assert counter.started == counter.finished, "a kernel still runs after the runtime exited"
    assert counter.started < total, "queued kernels were started after the cancellation"
    assert not dataflow_threads(), f"threads left: {dataflow_threads()}"


class TestCancelMidway:
    @pytest.mark.asyncio
    @pytest.mark.parametrize("scenario", list(SCENARIOS))
    async def test_cancel_midway(self, scenario: str) -> None:
        """Cancelled midway: the right error, no thread/task left, queued kernels dropped."""
        run, expected = SCENARIOS[scenario]
        counter = Counter(0.002)
        t0 = time.monotonic()
        exc = await run(counter, 4, 250)
        assert isinstance(exc, expected), repr(exc)
        assert time.monotonic() - t0 < 5.0  # it did not wait for the 1,000 naps (2 s)
        _check_clean(counter, 1000)
        assert asyncio.all_tasks() == {asyncio.current_task()}

    def test_dataflow_run_main_cancelled(self, loop: str) -> None:
        """dataflow.run whose main task is cancelled midway raises CancelledError, cleanly."""
        counter = Counter(0.002)

        async def main() -> None:
            task = asyncio.current_task()
            assert task is not None
            asyncio.get_running_loop().call_later(0.03, task.cancel)
            for h in counter.dispatch(4, 250):
                await h

        with pytest.raises(asyncio.CancelledError):
            dataflow.run(main, interop_threads=2, loop=loop)
        _check_clean(counter, 1000)

    def test_cancelled_fork_leaves_graph_work(self, loop: str) -> None:
        """Cancelling a fork cancels its forked children; ops it dispatched still complete."""
        counter = Counter(0.001)

        async def worker(out: list[Any]) -> None:
            out.extend(counter.dispatch(2, 20))
            dataflow.fork(_forever)
            await asyncio.sleep(3600)

        async def main() -> float:
            handles: list[Any] = []
            f = dataflow.fork(worker, handles)
            await asyncio.sleep(0.01)
            assert f.cancel()
            with pytest.raises(dataflow.CancelledTaskError):
                await f
            total = 0.0
            for h in handles:
                total += float((await h)[0])
            return total

        assert dataflow.run(main, loop=loop) == 1.0
        assert counter.started == counter.finished == 40


class TestRepeated:
    @pytest.mark.stress
    def test_cancel_100_times_no_growth(self) -> None:
        """100 cancellations in a row leave the thread count and RSS where they were."""
        scenarios = list(SCENARIOS.values())

        def once(i: int) -> None:
            run, expected = scenarios[i % len(scenarios)]
            counter = Counter(0.001)
            loop = "uvloop" if i % 2 else "asyncio"

            async def main() -> BaseException | None:
                return await run(counter, 4, 100)

            if loop == "asyncio":
                exc = asyncio.run(main())
            else:
                import uvloop

                exc = uvloop.run(main())
            assert isinstance(exc, expected)
            _check_clean(counter, 400)

        for i in range(10):  # warm-up: imports, allocator pools, first pool start
            once(i)
        gc.collect()
        threads0, rss0 = threading.active_count(), rss_mib()
        for i in range(10, 110):
            once(i)
        gc.collect()
        threads1, rss1 = threading.active_count(), rss_mib()
        assert threads1 == threads0
        assert rss1 - rss0 < 16.0, f"RSS grew {rss1 - rss0:.1f} MiB over 100 cancellations"


# -- Ctrl-C in `dataflow run` (a real SIGINT to a subprocess) -------------------------------

_SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    import numpy as np
    import dataflow, ops

    mode = sys.argv[1]
    lock = threading.Lock()
    count = {"started": 0, "finished": 0}

    def nap(x, seconds):
        with lock:
            count["started"] += 1
        time.sleep(seconds)
        with lock:
            count["finished"] += 1
        return x

    meta = lambda x, s: ops.spec_of(x)
    pool_nap = dataflow.op("nap", meta=meta, handle=ops.Tensor, inline=False)(nap)
    inline_nap = dataflow.op("inline_nap", meta=meta, handle=ops.Tensor, inline=True)(nap)

    async def main():
        x = ops.asarray(np.ones(2))
        if mode == "chain":  # awaiting 2,000 queued 5 ms kernels (about 5 s on 2 threads)
            heads = [x] * 4
            for _ in range(500):
                heads = [pool_nap(h, 0.005) for h in heads]
            print("ready", flush=True)
            for h in heads:
                await h
        elif mode == "long-kernel":  # awaiting a kernel that runs for 1 s
            y = pool_nap(x, 1.0)
            print("ready", flush=True)
            await y
        elif mode == "inline-kernel":  # the loop thread itself is inside a kernel
            print("ready", flush=True)
            for _ in range(10):
                inline_nap(x, 0.5)
                await ops.add(x, 1.0)
        elif mode == "dispatch":  # dispatching without ever awaiting (backpressure)
            print("ready", flush=True)
            for _ in range(10**7):
                x = pool_nap(x, 0.0001)
        return "finished"

    try:
        options = {"max_pending": 1000} if mode == "dispatch" else {}
        print(dataflow.run(main, **options))
    finally:
        print(f"kernels started={count['started']} finished={count['finished']}",
              file=sys.stderr)
    """
)


def _popen_script(tmp_path: Path, mode: str, loop: str) -> subprocess.Popen[str]:
    script = tmp_path / "interrupt_me.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PYTHONWARNINGS", None)
    cli = [sys.executable, "-m", "dataflow", "run", "--loop", loop, "--interop-threads", "2"]
    return subprocess.Popen(
        [*cli, str(script), mode],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _interrupt(proc: subprocess.Popen[str], signals: int = 1) -> tuple[int, str]:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the script is running its main
    assert line.strip() == "ready", line
    time.sleep(0.3)
    for _ in range(signals):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("dataflow run did not exit within 30 s of Ctrl-C")
    return proc.returncode, err


@pytest.mark.stress
class TestCtrlC:
    @pytest.mark.parametrize("mode", ["chain", "long-kernel", "inline-kernel", "dispatch"])
    @pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
    def test_sigint_exits_130(self, tmp_path: Path, mode: str, loop: str) -> None:
        """SIGINT to `python -m dataflow run script.py` exits 130, promptly and cleanly."""
        proc = _popen_script(tmp_path, mode, loop)
        rc, err = _interrupt(proc)
        assert rc == 130, err
        assert "dataflow run: interrupted" in err
        assert "Traceback" not in err, err
        m = re.search(r"kernels started=(\d+) finished=(\d+)", err)
        assert m is not None, err
        started, finished = int(m.group(1)), int(m.group(2))
        assert started == finished, err  # running kernels finished; none left running

    @pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
    def test_double_sigint(self, tmp_path: Path, loop: str) -> None:
        """A second Ctrl-C during the clean-up still exits 130 without hanging."""
        proc = _popen_script(tmp_path, "long-kernel", loop)
        rc, err = _interrupt(proc, signals=2)
        assert rc == 130, err
        assert "dataflow run: interrupted" in err
