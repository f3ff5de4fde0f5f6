"""Faults: failing kernels in big graphs, hanging kernels (timeouts), raising instruments/loggers.

Nothing is lost (every dependent of a failure fails with that failure, named) and nothing hangs
(independent work completes, the runtime stays usable, no thread is left behind).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import structlog

import dataflow
import ops
from dataflow import OpTimeoutError, TaskError, UnobservedTaskError
from tests.stress._support import Gate, dataflow_threads, spec_op, wait_for_no_threads


@pytest.fixture
def inline_threshold(request: pytest.FixtureRequest) -> Iterator[float]:
    """Set the inline threshold for one test (param: seconds) and restore it after."""
    old = dataflow.get_inline_threshold()
    value = float(request.param)
    dataflow.set_inline_threshold(value)
    try:
        yield value
    finally:
        dataflow.set_inline_threshold(old)


def _poison_kernel(x: Any) -> Any:
    def deep_inside_the_kernel() -> None:
        raise ValueError("poisoned input")

    deep_inside_the_kernel()
    return x


poison = spec_op("poison", _poison_kernel, inline=False)

# (kind, ops function, numpy function, arity): all keep values inside [-1, 1].
_KINDS: list[tuple[str, Any, Any, int]] = [
    ("tanh", ops.tanh, np.tanh, 1),
    ("negative", ops.negative, np.negative, 1),
    ("multiply", ops.multiply, np.multiply, 2),
    ("maximum", ops.maximum, np.maximum, 2),
    ("minimum", ops.minimum, np.minimum, 2),
]


class Dag:
    """A random DAG of ``n`` elementwise ops in 8 lanes, with rare cross-lane edges."""

    def __init__(self, n: int, seed: int, poison_at: int) -> None:
        rng = random.Random(seed)
        lanes = 8
        self.sources = [np.random.default_rng(seed + i).uniform(-1, 1, 4) for i in range(lanes)]
        self.nodes: list[tuple[int, list[int]]] = []  # (kind index or -1 for poison, parents)
        self.poison_at = poison_at
        lane_nodes: list[list[int]] = [[] for _ in range(lanes)]
        for i in range(n):
            lane = i % lanes
            if i < lanes:
                self.nodes.append((-2, []))  # a source
            elif i == poison_at:
                self.nodes.append((-1, [lane_nodes[lane][-1]]))
            else:
                kind = rng.randrange(len(_KINDS))
                arity = _KINDS[kind][3]
                pool = lane_nodes[lane][-50:]
                parents = [rng.choice(pool) for _ in range(arity)]
                if rng.random() < 0.002:  # a rare edge from another lane
                    other = lane_nodes[rng.randrange(lanes)]
                    parents[0] = rng.choice(other[-50:])
                self.nodes.append((kind, parents))
            lane_nodes[lane].append(i)
        self.tainted: set[int] = set()
        for i, (_, parents) in enumerate(self.nodes):
            if i == poison_at or any(p in self.tainted for p in parents):
                self.tainted.add(i)

    def reference(self) -> list[np.ndarray | None]:
        """Sequential numpy evaluation; None for nodes downstream of the poison."""
        out: list[np.ndarray | None] = []
        for i, (kind, parents) in enumerate(self.nodes):
            if kind == -2:
                out.append(self.sources[i])
            elif i in self.tainted:
                out.append(None)
            else:
                fn = _KINDS[kind][2]
                args = [out[p] for p in parents]
                out.append(fn(*args))
        return out

    def dispatch(self) -> list[Any]:
        """Dispatch every node as an op in the current runtime; return the handles."""
        handles: list[Any] = []
        for i, (kind, parents) in enumerate(self.nodes):
            if kind == -2:
                handles.append(ops.asarray(self.sources[i]))
            elif kind == -1:
                handles.append(poison(handles[parents[0]]))
            else:
                fn = _KINDS[kind][1]
                handles.append(fn(*[handles[p] for p in parents]))
        return handles


class TestKernelFaults:
    @pytest.mark.stress
    @pytest.mark.parametrize("inline_threshold", [20e-6, 0.0], indirect=True, ids=["auto", "pool"])
    def test_fault_in_10k_dag(self, inline_threshold: float, loop: str) -> None:
        """A kernel raising mid-DAG fails exactly its dependents, named; the rest is right."""
        dag = Dag(10_000, seed=7, poison_at=5_003)
        ref = dag.reference()
        assert 100 < len(dag.tainted) < 5_000  # independent lanes exist

        async def main() -> str:
            handles = dag.dispatch()
            first: TaskError | None = None
            for i, h in enumerate(handles):
                if i in dag.tainted:
                    with pytest.raises(TaskError) as info:
                        await h
                    err = info.value
                    first = first or err
                    assert err is first  # the same error, not a copy per dependent
                else:
                    np.testing.assert_array_equal(await h, ref[i])
            assert first is not None
            assert first.op == "poison"
            assert first.task == handles[dag.poison_at].task.name
            assert f"{first.task} failed: ValueError: poisoned input" in str(first)
            assert isinstance(first.__cause__, ValueError)
            frames = traceback.extract_tb(first.__cause__.__traceback__)
            assert frames[-1].name == "deep_inside_the_kernel"
            # The runtime is still usable.
            np.testing.assert_array_equal(await ops.add(np.ones(3), 1.0), np.full(3, 2.0))
            return "ok"

        assert dataflow.run(main, interop_threads=2, loop=loop) == "ok"
        # ... and so is the next run.
        assert dataflow.run(_one_op, loop=loop) == 2.0

    def test_dependent_dispatched_after_the_failure(self, loop: str) -> None:
        """An op whose input already failed fails at once with that input's error."""

        async def main() -> None:
            bad = poison(np.ones(2))
            with pytest.raises(TaskError) as first:
                await bad
            late = ops.tanh(ops.add(bad, 1.0))
            with pytest.raises(TaskError) as again:
                await late
            assert again.value is first.value

        dataflow.run(main, loop=loop)

    @pytest.mark.parametrize(
        "exc",
        [SystemExit(3), KeyboardInterrupt(), MemoryError("fake"), RecursionError("deep")],
        ids=lambda e: type(e).__name__,
    )
    def test_base_exceptions_in_pool_kernel(self, exc: BaseException, loop: str) -> None:
        """SystemExit/KeyboardInterrupt/MemoryError in a pool kernel fail the task, not the pool."""

        def kernel(x: Any) -> Any:
            raise exc

        op = spec_op("raiser", kernel, inline=False)

        async def main() -> float:
            y = ops.tanh(op(np.ones(2)))
            with pytest.raises(TaskError, match=rf"raiser#\d+ failed: {type(exc).__name__}"):
                await y
            return float((await ops.sum(ops.add(np.ones(2), 1.0)))[()])

        assert dataflow.run(main, interop_threads=1, loop=loop) == 4.0

    def test_exception_with_broken_str(self, loop: str) -> None:
        """A kernel exception whose str() raises still fails its task (and nothing hangs)."""

        class Unprintable(Exception):
            def __str__(self) -> str:
                raise RuntimeError("str() of this exception raises")

        def kernel(x: Any) -> Any:
            raise Unprintable

        pooled = spec_op("unprintable", kernel, inline=False)
        inline = spec_op("unprintable_inline", kernel, inline=True)

        async def main() -> str:
            for op in (pooled, inline):
                with pytest.raises(TaskError, match=r"unprintable\w*#\d+ failed: Unprintable") as e:
                    await ops.negative(op(np.ones(2)))
                assert isinstance(e.value.__cause__, Unprintable)
            return "ok"

        assert dataflow.run(main, interop_threads=1, loop=loop) == "ok"

    def test_fault_in_one_fork_of_many(self, loop: str) -> None:
        """One of 200 forked coroutines fails: the others complete; its waiter sees the error."""

        async def member(i: int, x: np.ndarray) -> Any:
            y = ops.tanh(ops.multiply(x, float(i)))
            if i == 117:
                raise LookupError(f"member {i} lost its weights")
            return await ops.sum(y)

        async def main(x: np.ndarray) -> list[Any]:
            futs = [dataflow.fork(member, i, x) for i in range(200)]
            out: list[Any] = []
            for f in futs:
                try:
                    out.append(await f)
                except TaskError as exc:
                    out.append(exc)
            return out

        x = np.linspace(-1, 1, 8)
        results = dataflow.run(main, x, loop=loop)
        for i, r in enumerate(results):
            if i == 117:
                assert isinstance(r, TaskError) and isinstance(r.__cause__, LookupError)
                assert r.op.endswith("member") and "member#" in r.task
            else:
                assert r == pytest.approx(np.tanh(x * float(i)).sum())

    def test_fault_in_plain_fork_fails_ops_on_its_result(self, loop: str) -> None:
        """Ops reading a failed plain fork's result fail with its error."""

        def load() -> np.ndarray:
            raise FileNotFoundError("weights.npy")

        async def main() -> None:
            w = dataflow.fork(load)
            y = ops.matmul(np.ones((2, 3)), ops.asarray(np.ones((3, 2))))
            z = ops.add(y, ops.asarray(np.ones((2, 2))))
            np.testing.assert_array_equal(await z, np.full((2, 2), 4.0))
            with pytest.raises(TaskError, match=r"load#\d+ failed: FileNotFoundError"):
                await w
            # A plain fork's result is an opaque value: an op can only take it via another fork.
            dep = dataflow.fork(lambda a: a * 2, w)
            with pytest.raises(TaskError, match=r"load#\d+"):
                await dep

        dataflow.run(main, loop=loop)


async def _one_op() -> float:
    return float((await ops.sum(ops.add(np.ones(2), 0.0)))[()])


# -- timeouts ------------------------------------------------------------------------------


class TestTimeouts:
    def test_hanging_kernel_times_out(self, loop: str) -> None:
        """A kernel past its timeout fails its task and dependents with OpTimeoutError."""
        gate = Gate("stuck", timeout=0.2)

        async def main() -> None:
            x = np.ones(3)
            y = gate.op(x)
            z = ops.tanh(ops.add(y, 1.0))
            w = ops.add(ops.asarray(x), 2.0)
            t0 = time.monotonic()
            with pytest.raises(OpTimeoutError) as info:
                await z
            assert 0.15 < time.monotonic() - t0 < 5.0
            err = info.value
            assert isinstance(err, TimeoutError) and isinstance(err, TaskError)
            assert err.op == "stuck" and err.task == y.task.name
            assert f"{y.task.name} timed out" in str(err) and "0.2 s" in str(err)
            with pytest.raises(OpTimeoutError) as again:
                await y
            assert again.value is err
            np.testing.assert_array_equal(await w, np.full(3, 3.0))
            # The stuck kernel returns later: its result is discarded.
            gate.open()
            for _ in range(200):
                if gate.finished:
                    break
                await asyncio.sleep(0.01)
            assert gate.finished == 1
            await asyncio.sleep(0.02)
            with pytest.raises(OpTimeoutError):
                await y

        dataflow.run(main, interop_threads=2, loop=loop)
        assert not wait_for_no_threads()

    def test_pool_keeps_its_size(self, loop: str) -> None:
        """With one inter-op thread stuck past its timeout, later ops still run."""
        gate = Gate("stuck", timeout=0.1)

        async def main() -> float:
            try:
                with pytest.raises(OpTimeoutError):
                    await gate.op(np.ones(1))
                # The stuck thread is still inside the kernel: another thread runs this.
                assert gate.finished == 0
                total = ops.sum(ops.add(ops.asarray(np.ones(4)), 1.0))
                value = float((await asyncio.wait_for(asyncio.ensure_future(_aw(total)), 10))[()])
                return value
            finally:
                gate.open()

        assert dataflow.run(main, interop_threads=1, loop=loop) == 8.0
        assert not wait_for_no_threads()

    def test_runtime_default_and_per_op_override(self) -> None:
        """Runtime(op_timeout=) applies to every op; an op's own timeout wins."""

        def nap(x: Any, seconds: float) -> Any:
            time.sleep(seconds)
            return x

        short = spec_op("nap", nap, inline=False)
        patient = spec_op("patient_nap", nap, inline=False, timeout=5.0)

        async def main() -> None:
            async with dataflow.Runtime(interop_threads=2, op_timeout=0.1):
                ok = patient(np.ones(2), 0.3)
                bad = short(np.ones(2), 0.5)
                with pytest.raises(OpTimeoutError, match=r"nap#\d+ timed out.*0\.1 s"):
                    await bad
                np.testing.assert_array_equal(await ok, np.ones(2))

        asyncio.run(main())
        assert not wait_for_no_threads()

    def test_late_failure_is_discarded(self, loop: str) -> None:
        """A kernel that raises after its timeout adds no second (unobserved) error."""
        release = threading.Event()

        def late(x: Any) -> Any:
            release.wait(10)
            raise ValueError("too late to matter")

        op = spec_op("late", late, inline=False, timeout=0.05)

        async def main() -> str:
            y = op(np.ones(1))
            with pytest.raises(OpTimeoutError):
                await y
            release.set()
            await asyncio.sleep(0.1)
            return "ok"

        assert dataflow.run(main, loop=loop) == "ok"
        assert not wait_for_no_threads()

    def test_unawaited_timeout_is_reported(self) -> None:
        """A timed-out op nobody awaited makes run() raise UnobservedTaskError at the end."""
        gate = Gate("stuck", timeout=0.05)

        async def main() -> None:
            gate.op(np.ones(1))
            await asyncio.sleep(0.3)
            gate.open()

        with pytest.raises(UnobservedTaskError, match=r"stuck#\d+") as info:
            dataflow.run(main)
        assert isinstance(info.value.__cause__, OpTimeoutError)
        assert not wait_for_no_threads()

    def test_fast_timed_ops(self, loop: str) -> None:
        """2,000 timed ops that finish in time give their values; no false timeouts."""
        op = spec_op("timed_tanh", np.tanh, inline=False, timeout=30.0)

        async def main() -> float:
            y = ops.asarray(np.full(4, 0.5))
            for _ in range(2000):
                y = op(y)
            return float((await y)[0])

        expected = 0.5
        for _ in range(2000):
            expected = float(np.tanh(expected))
        assert dataflow.run(main, interop_threads=2, loop=loop) == pytest.approx(expected)

    def test_no_timeout_no_watchdog(self) -> None:
        """Without any timeout no watchdog thread is started (the feature costs nothing)."""

        async def main() -> list[str]:
            y = ops.asarray(np.ones(4))
            for _ in range(200):
                y = ops.tanh(y)
            await y
            return [t.name for t in dataflow_threads()]

        names = dataflow.run(main, interop_threads=2)
        assert not [n for n in names if not n.startswith("interop")]

    @pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "1", True])
    def test_timeout_validation(self, bad: Any) -> None:
        """A timeout must be a positive finite number of seconds; the error says so."""
        with pytest.raises((ValueError, TypeError), match="timeout"):
            dataflow.op("x", meta=lambda x: x, handle=ops.Tensor, timeout=bad)
        with pytest.raises((ValueError, TypeError), match="op_timeout"):
            dataflow.Runtime(op_timeout=bad)


async def _aw(x: Any) -> Any:
    return await x


# -- instruments and log consumers that raise -----------------------------------------------

_HOOKS = [
    "task_created",
    "task_ready",
    "task_started",
    "task_finished",
    "task_failed",
    "task_cancelled",
    "fork",
    "fork_finished",
    "wait_started",
    "wait_finished",
]


def _raising(hook: str) -> dataflow.Instrument:
    """An instrument whose ``hook`` raises (a subclass, as instruments override hooks)."""

    def broken(self: Any, *args: Any) -> None:
        raise RuntimeError(f"instrument bug in {hook}")

    cls = type(f"Raising_{hook}", (dataflow.Instrument,), {hook: broken})
    inst: dataflow.Instrument = cls()
    return inst


async def _mixed_workload(x: np.ndarray) -> float:
    """Inline ops, pool ops, a failing op, a cancelled op, forks and waits."""

    async def child(v: Any) -> Any:
        await asyncio.sleep(0.05)  # so that wait() below really waits
        return await ops.sum(ops.tanh(v))

    big = ops.matmul(ops.asarray(np.ones((64, 64))), np.ones((64, 64)))  # pool
    small = ops.add(x, 1.0)  # inline
    f = dataflow.fork(child, small)
    bad = poison(x)
    blocker = Gate("blocker")
    queued = ops.tanh(blocker.op(x))
    queued.cancel()
    blocker.open()
    with contextlib.suppress(TaskError):
        await bad
    total = float(await dataflow.wait(f)) + float((await big)[0, 0])
    await asyncio.sleep(0)
    return total


class TestRaisingObservers:
    @pytest.mark.parametrize("hook", _HOOKS)
    def test_raising_instrument_is_removed_not_fatal(self, hook: str, loop: str) -> None:
        """An instrument raising in any hook is detached with a warning; the run is unaffected."""
        inst = _raising(hook)
        x = np.linspace(0, 1, 5)
        expected = float(np.tanh(x + 1.0).sum()) + 64.0
        dataflow.add_instrument(inst)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = dataflow.run(_mixed_workload, x, loop=loop)
        finally:
            dataflow.remove_instrument(inst)
        assert got == pytest.approx(expected)
        msgs = [str(w.message) for w in caught]
        assert any(f"raised in {hook}()" in m and "removed" in m for m in msgs), msgs

    @pytest.mark.parametrize("hook", ["task_started", "task_ready", "task_finished"])
    def test_raising_instrument_with_warnings_as_errors(self, hook: str) -> None:
        """Even when warnings are errors (-W error), a raising instrument cannot break a run."""
        inst = _raising(hook)
        x = np.linspace(0, 1, 5)
        dataflow.add_instrument(inst)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                got = dataflow.run(_mixed_workload, x, interop_threads=2)
        finally:
            dataflow.remove_instrument(inst)
        assert got == pytest.approx(float(np.tanh(x + 1.0).sum()) + 64.0)

    def test_raising_log_consumer(self, loop: str) -> None:
        """A structlog processor that raises cannot break a run logged with TaskLogger."""

        def broken_processor(logger: Any, method: str, event: Any) -> Any:
            raise OSError("log sink is gone")

        old = structlog.get_config()
        structlog.configure(processors=[broken_processor], cache_logger_on_first_use=False)
        inst = dataflow.TaskLogger()
        dataflow.add_instrument(inst)
        x = np.linspace(0, 1, 5)
        try:
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                got = dataflow.run(_mixed_workload, x, loop=loop)
        finally:
            dataflow.remove_instrument(inst)
            structlog.configure(**old)
        assert got == pytest.approx(float(np.tanh(x + 1.0).sum()) + 64.0)

    def test_raising_logger_at_exit_keeps_the_real_error(self) -> None:
        """If logging an unobserved failure raises at exit, the body's own error still wins."""

        def broken_processor(logger: Any, method: str, event: Any) -> Any:
            raise OSError("log sink is gone")

        async def bad() -> None:
            raise KeyError("never awaited")

        async def main() -> None:
            f = dataflow.fork(bad)
            while not f.done():
                await asyncio.sleep(0.001)
            raise ZeroDivisionError("the body's own error")

        old = structlog.get_config()
        structlog.configure(processors=[broken_processor], cache_logger_on_first_use=False)
        try:
            with pytest.raises(ZeroDivisionError, match="the body's own error"):
                dataflow.run(main)
        finally:
            structlog.configure(**old)
