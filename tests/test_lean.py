"""The lean plan executor (``dataflow.graph._lean``): a compiled forward's nodes run by a few
runners, not one task each. Behaviour only: results, where nodes ran, drops, failures, order."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow._scheduler._placement import SPAWN_CPU_SHARE
from dataflow.graph import _launch

Array = np.ndarray[Any, Any]


def _x(*shape: int, seed: int = 0) -> Array:
    out: Array = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return out


class _Log:
    """What marking kernels saw: (name, thread, start, end), in the order they started."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: list[tuple[str, int, float, float]] = []

    def op(self, name: str, seconds: float) -> Any:
        log = self

        def kernel(x: Any, tag: int) -> Any:
            t0 = time.perf_counter()
            if seconds:
                time.sleep(seconds)  # releases the GIL, as BLAS does
            with log.lock:
                log.entries.append((f"{name}{tag}", threading.get_ident(), t0,
                                    time.perf_counter()))  # fmt: skip
            return x + 1.0

        return dataflow.op(name, meta=lambda x, tag: ops.spec_of(x), handle=ops.Tensor)(kernel)

    def names(self) -> list[str]:
        return [e[0] for e in sorted(self.entries, key=lambda e: e[2])]


def _unobserved() -> None:
    """Nothing observes the runtime, so launches take the lean executor."""
    rt = dataflow.current_runtime()
    assert rt is not None and not rt._sched.watching


class TestResults:
    def test_a_chain_a_fan_and_multi_output_nodes_match_numpy(self) -> None:
        x = _x(5, 7)

        async def prog(a: Any) -> Any:
            b = ops.tanh(ops.add(a, 1.5))
            parts = [ops.multiply(b, float(k)) for k in range(6)]  # a fan out, then in
            s = ops.sum(ops.stack(parts), axis=0)
            q, r = ops.split(s, [2], axis=1)  # a node with two outputs
            return ops.add(q, 1.0), ops.exp(r)

        forward = dataflow.compile(prog)

        async def main() -> Any:
            _unobserved()
            return [await forward(x) for _ in range(3)]

        b = np.tanh(x + 1.5)
        s = b * sum(range(6))
        for q, r in dataflow.run(main):
            np.testing.assert_allclose(q, s[:, :2] + 1.0, rtol=1e-5)
            np.testing.assert_allclose(r, np.exp(s[:, 2:]), rtol=1e-5)

    def test_a_program_with_no_ops(self) -> None:
        async def ident(a: Any) -> Any:
            return a

        forward = dataflow.compile(ident)
        x = _x(3)

        async def main() -> Any:
            return await forward(x)

        np.testing.assert_array_equal(dataflow.run(main), x)

    @pytest.mark.parametrize("threads", [0, 1, 2, 3])
    def test_the_ensemble_at_any_thread_count(self, threads: int) -> None:
        from examples.lstm_ensemble import Ensemble

        ens = Ensemble(2, 8, seed=3)
        forward = dataflow.compile(ens)
        x = _x(4, 2, 8, seed=1)

        async def main() -> Any:
            return await ens(x), await forward(x), await forward(x)

        eager, first, second = dataflow.run(main, interop_threads=threads)
        np.testing.assert_allclose(first, eager, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(second, eager, rtol=1e-5, atol=1e-6)


class TestPlacement:
    def test_small_nodes_run_back_to_back_on_one_thread(self) -> None:
        log = _Log()
        mark = log.op("small", 0.0)

        async def prog(a: Any) -> Any:
            outs = [mark(a, k) for k in range(20)]  # independent, but each far below 50 us
            return ops.stack(outs)

        forward = dataflow.compile(prog, check=False)

        async def main() -> None:
            for _ in range(10):  # past the first (timed) runs
                await forward(_x(2))

        dataflow.run(main, interop_threads=2)
        last = log.entries[-20:]
        assert len({e[1] for e in last}) == 1

    def test_a_short_plan_runs_whole_on_the_launching_thread(self) -> None:
        """A plan of small kernels, well under PLAN_HERE_SECONDS in all, runs on the thread
        that launched it (the event loop's), once their times are known: no hand-off to a
        worker and back."""
        log = _Log()
        mark = log.op("here", 0.0)

        async def prog(a: Any) -> Any:
            return ops.stack([mark(a, k) for k in range(6)])

        forward = dataflow.compile(prog, check=False)

        async def main() -> tuple[int, Any]:
            await forward(_x(2))  # compiles and runs once
            (program,) = forward.programs.values()
            for sig in program.sigs:  # as if measured: a few microseconds each, on a quiet
                sig.seconds = 5e-6  # machine (a loaded one's samples must not decide here)
            program._launches = 0  # the next launch works the answer out again
            log.entries.clear()
            out = await forward(_x(2))
            return threading.get_ident(), out

        loop_thread, out = dataflow.run(main, interop_threads=2)
        assert len(log.entries) == 6 and {e[1] for e in log.entries} == {loop_thread}
        np.testing.assert_allclose(out, np.stack([_x(2) + 1.0] * 6), rtol=1e-6)

    def test_a_plan_with_a_blocking_op_or_past_the_bound_goes_to_the_pool(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An op declared inline=False (it may block) keeps its plan off the launching thread,
        and so does a plan whose kernels add up to PLAN_HERE_SECONDS or more."""
        log = _Log()
        mark = log.op("short", 0.0)

        def kernel(x: Any) -> Any:
            with log.lock:
                log.entries.append(("blocking", threading.get_ident(), 0.0, 0.0))
            return x

        blocking = dataflow.op("blocks_maybe", meta=ops.spec_of, handle=ops.Tensor, inline=False)(
            kernel
        )

        async def with_blocking(a: Any) -> Any:
            return blocking(ops.add(a, 1.0))

        async def plain(a: Any) -> Any:
            return mark(a, 0)

        forward_b = dataflow.compile(with_blocking, check=False)
        forward_p = dataflow.compile(plain, check=False)

        async def main() -> int:
            n = _launch.PLAN_HERE_EVERY + 4  # past the kernels' first timings
            for _ in range(n):
                await forward_b(_x(2))
            monkeypatch.setattr(_launch, "PLAN_HERE_SECONDS", 0.0)
            for _ in range(n):
                await forward_p(_x(2))
            return threading.get_ident()

        loop_thread = dataflow.run(main, interop_threads=2)
        assert all(e[1] != loop_thread for e in log.entries)

    def test_a_batched_forward_never_runs_its_plan_on_the_launching_thread(self) -> None:
        """With batch_axis, a short plan still runs on the pool: calls made while it runs
        gather into the next batch, which they could not while it held the loop."""
        log = _Log()
        mark = log.op("batched", 0.0)

        async def prog(a: Any) -> Any:
            return mark(a, 0)

        forward = dataflow.compile(prog, check=False, batch_axis=0)

        async def main() -> int:
            for _ in range(_launch.PLAN_HERE_EVERY + 4):
                await forward(_x(1, 3))
            return threading.get_ident()

        loop_thread = dataflow.run(main, interop_threads=2)
        assert log.entries and all(e[1] != loop_thread for e in log.entries)

    def test_big_gil_free_nodes_run_side_by_side(self) -> None:
        """Independent nodes that release the GIL get a second runner: their kernels overlap."""
        log = _Log()
        slow = log.op("slow", 0.02)

        async def prog(a: Any) -> Any:
            return ops.add(slow(a, 0), slow(a, 1))

        forward = dataflow.compile(prog, check=False)

        async def main() -> Any:
            return await forward(_x(3))

        dataflow.run(main, interop_threads=2)
        (_, t0, s0, e0), (_, t1, s1, e1) = log.entries
        assert t0 != t1 and s1 < e0 and s0 < e1

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("serial", True),  # as the GIL measurement would mark it
            ("cpu_share", 0.1),  # as many GIL-bound runs side by side on many cores leave it
        ],
    )
    def test_nodes_that_hold_or_wait_for_the_gil_get_no_second_runner(
        self, field: str, value: object
    ) -> None:
        """Nodes whose signature is known to hold the GIL (``serial``), or whose kernels
        measured a CPU share beside others under SPAWN_CPU_SHARE (they waited for the GIL;
        even when not marked serial), stay on one runner."""
        log = _Log()
        forward = _four_stacked(log.op("held", 0.005))

        async def main() -> None:
            await forward(_x(3))
            prog_ = next(iter(forward.programs.values()))
            for sig in prog_.sigs:
                if sig.name == "held":
                    setattr(sig, field, value)
            log.entries.clear()
            await forward(_x(3))

        dataflow.run(main, interop_threads=2)
        assert len(log.entries) == 4 and len({e[1] for e in log.entries}) == 1

    def test_gil_bound_python_kernels_end_up_on_one_runner(self) -> None:
        """Pure-Python kernels (they hold the GIL) first run side by side, measure a low CPU
        share there (under SPAWN_CPU_SHARE: they waited for the GIL), and from then on keep
        to one runner."""
        seen: list[int] = []

        def spin(x: Any, tag: int) -> Any:
            # A fixed amount of Python work that lets go of the GIL between pieces, as a time
            # loop of small numpy calls does (it waits for the GIL inside its own run).
            seen.append(threading.get_ident())
            for _ in range(100):
                sum(range(300))
                time.sleep(0)
            return x + 1.0

        forward = _four_stacked(
            dataflow.op("spin", meta=lambda x, tag: ops.spec_of(x), handle=ops.Tensor)(spin)
        )
        threads: list[int] = []

        async def main() -> None:
            for _ in range(40):
                seen.clear()
                await forward(_x(3))
                threads.append(len(set(seen)))

        dataflow.run(main, interop_threads=2)
        spins = [s for s in next(iter(forward.programs.values())).sigs if s.name == "spin"]
        assert all(s.serial or s.cpu_share < SPAWN_CPU_SHARE for s in spins), [
            (s.gil, s.cpu_share) for s in spins
        ]
        assert threads[-5:] == [1] * 5

    def test_one_thread_never_gets_a_second_runner(self) -> None:
        log = _Log()
        forward = _four_stacked(log.op("slow1t", 0.005))

        async def main() -> Any:
            return await forward(_x(3))

        dataflow.run(main, interop_threads=1)
        spans = sorted((e[2], e[3]) for e in log.entries)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


async def _cancel_midway(forward: Any, seconds: float) -> Any:
    """Call ``forward``, cancel the call after ``seconds``, wait for the runtime to drain."""
    req = asyncio.ensure_future(forward(_x(2)))
    await asyncio.sleep(seconds)
    req.cancel()
    with pytest.raises(asyncio.CancelledError):
        await req
    rt = dataflow.current_runtime()
    assert rt is not None
    await rt._join()
    return rt


def _chain_of(op: Any, n: int) -> Any:
    """A compiled program of ``n`` calls of a marking op, each reading the one before."""

    async def prog(a: Any) -> Any:
        for k in range(n):
            a = op(a, k)
        return a

    return dataflow.compile(prog, check=False)


def _four_stacked(op: Any) -> Any:
    """A compiled program of four independent calls of a marking op, stacked."""

    async def prog(a: Any) -> Any:
        return ops.stack([op(a, k) for k in range(4)])

    return dataflow.compile(prog, check=False)


class TestFailures:
    def test_a_failing_node_names_itself_and_keeps_its_type(self) -> None:
        calls = [0]

        def kernel(x: Any) -> Any:
            calls[0] += 1
            if calls[0] > 2:
                raise ZeroDivisionError("third time")
            return x

        bad = dataflow.op("bad_lean", meta=ops.spec_of, handle=ops.Tensor)(kernel)

        async def prog(a: Any) -> Any:
            return ops.tanh(bad(ops.add(a, 1.0)))

        forward = dataflow.compile(prog, check=False)

        async def main() -> Any:
            await forward(_x(2))  # the trace ran no kernel: this is call 1
            await forward(_x(2))
            with pytest.raises(ZeroDivisionError, match="third time") as info:
                await forward(_x(2))
            assert isinstance(info.value, dataflow.TaskError)
            message = str(info.value)
            assert "bad_lean (node %1 of" in message and "test_lean.py" in message
            # The runtime goes on: another call of another program runs.
            return await dataflow.compile(_double)(np.ones(2))

        np.testing.assert_array_equal(dataflow.run(main, interop_threads=2), [2.0, 2.0])

    def test_a_profile_counts_each_node_of_a_failed_run_once(self) -> None:
        """Every node of a failed run is a span record or one of the tasks that never ran,
        never both: a node another runner was still running was counted as never run, and
        the run's gather task (no node) too."""

        def refuse(x: Any) -> Any:
            raise ValueError("refused")

        bad = dataflow.op("refuse_lean", meta=ops.spec_of, handle=ops.Tensor)(refuse)
        slow = _Log().op("slow_fail", 0.02)

        async def prog(a: Any) -> Any:
            return ops.add(slow(slow(a, 0), 1), ops.tanh(bad(ops.negative(a))))

        forward = dataflow.compile(prog, check=False)

        async def main() -> list[tuple[int, int]]:
            counts = []
            for _ in range(3):
                with dataflow.profile() as prof:
                    with pytest.raises(ValueError, match="refused"):
                        await forward(_x(3))
                    await asyncio.sleep(0.1)  # a node still running ends
                trace = prof.trace()
                counts.append((len(trace.tasks), trace.unrun_failed))
            return counts

        counts = dataflow.run(main, interop_threads=2)
        (program,) = forward.programs.values()
        for spans, unrun in counts:
            assert spans + unrun == program.size, (spans, unrun, program.size)

    def test_a_wrong_output_is_caught_on_the_first_runs(self) -> None:
        liar = dataflow.op("liar_lean", meta=ops.spec_of, handle=ops.Tensor)(
            lambda x: x.astype(np.float64)
        )

        async def prog(a: Any) -> Any:
            return liar(a)

        forward = dataflow.compile(prog, check=False)

        async def main() -> None:
            with pytest.raises(dataflow.OpOutputError, match="liar_lean"):
                await forward(_x(2))

        dataflow.run(main)


async def _double(a: Any) -> Any:
    return ops.multiply(a, 2.0)


def _small(forward: Any) -> Any:
    """The forward's one program, its kernels taken as measured small (a loaded machine's
    samples must not decide) and its next launch deciding again where it runs."""
    (program,) = forward.programs.values()
    for sig in program.sigs:
        sig.seconds = 5e-6
    program._launches = 0
    return program


class TestRunHere:
    """A short plan of small kernels, unobserved, runs whole on the calling thread without a
    launch (``_here.run_here``): no gather or runner task, no waiter."""

    def test_it_runs_the_nodes_here_without_a_launch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        log = _Log()
        mark = log.op("direct", 0.0)
        launched: list[Any] = []
        real_launch = dataflow._compile.launch  # type: ignore[attr-defined]

        def spy(*args: Any, **kwargs: Any) -> Any:
            launched.append(args[1])
            return real_launch(*args, **kwargs)

        async def prog(a: Any) -> Any:
            return ops.sum(ops.stack([mark(a, k) for k in range(6)]), axis=0)

        forward = dataflow.compile(prog, check=False)

        async def main() -> tuple[int, Any, int]:
            await forward(_x(3))
            program = _small(forward)
            rt = dataflow.current_runtime()
            assert rt is not None
            before = rt._sched.inline_run
            monkeypatch.setattr(dataflow._compile, "launch", spy)
            log.entries.clear()
            out = await forward(_x(3))
            return threading.get_ident(), out, rt._sched.inline_run - before - program.size

        loop_thread, out, extra = dataflow.run(main, interop_threads=2)
        assert launched == [] and extra == 0
        assert len(log.entries) == 6 and {e[1] for e in log.entries} == {loop_thread}
        np.testing.assert_allclose(out, 6 * (_x(3) + 1.0), rtol=1e-6)

    def test_a_failing_node_fails_the_call_observed(self) -> None:
        """The call raises the TaskError a launched run gives (the node named, its type
        kept), recorded in the runtime's failures as observed: the run ends without an
        UnobservedTaskError, and the runtime goes on."""
        calls = [0]

        def kernel(x: Any) -> Any:
            calls[0] += 1
            if calls[0] > 1:
                raise ZeroDivisionError("second time")
            return x

        bad = dataflow.op("bad_here", meta=ops.spec_of, handle=ops.Tensor)(kernel)

        async def prog(a: Any) -> Any:
            return ops.tanh(bad(ops.add(a, 1.0)))

        forward = dataflow.compile(prog, check=False)

        async def main() -> tuple[Any, list[BaseException]]:
            await forward(_x(2))
            _small(forward)
            with pytest.raises(ZeroDivisionError, match="second time") as info:
                await forward(_x(2))
            assert isinstance(info.value, dataflow.TaskError)
            assert "bad_here (node %1 of" in str(info.value) and "test_lean.py" in str(info.value)
            assert isinstance(info.value.__cause__, ZeroDivisionError)
            rt = dataflow.current_runtime()
            assert rt is not None
            return await dataflow.compile(_double)(np.ones(2)), rt.failures

        out, failures = dataflow.run(main, interop_threads=2)
        np.testing.assert_array_equal(out, [2.0, 2.0])
        assert len(failures) == 1 and getattr(failures[0], "observed", False)

    def test_a_wrong_output_is_caught_on_the_sampled_runs(self) -> None:
        """A kernel's value is checked against its meta rule on the runs that are timed
        (the first ones, then one in SAMPLE), as on the lean executor."""
        lie = [False]
        liar = dataflow.op("liar_here", meta=ops.spec_of, handle=ops.Tensor)(
            lambda x: x.astype(np.float64) if lie[0] else x
        )

        async def prog(a: Any) -> Any:
            return liar(a)

        forward = dataflow.compile(prog, check=False)

        async def main() -> None:
            await forward(_x(2))
            program = _small(forward)
            program.sigs[0].calls = 0  # its next run is one of the first: checked
            lie[0] = True
            with pytest.raises(dataflow.OpOutputError, match="liar_here"):
                await forward(_x(2))

        dataflow.run(main)

    def test_a_profile_takes_the_launch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Observed, the nodes give the profile their span records: a launch."""
        forward = dataflow.compile(_double)
        launched: list[Any] = []
        real_launch = dataflow._compile.launch  # type: ignore[attr-defined]

        def spy(*args: Any, **kwargs: Any) -> Any:
            launched.append(args[1])
            return real_launch(*args, **kwargs)

        async def main() -> Any:
            await forward(np.ones(2))
            _small(forward)
            monkeypatch.setattr(dataflow._compile, "launch", spy)
            with dataflow.profile() as prof:
                out = await forward(np.ones(2))
            assert len(launched) == 1 and [t.op for t in prof.trace().tasks] == ["multiply"]
            return out

        np.testing.assert_array_equal(dataflow.run(main, interop_threads=2), [2.0, 2.0])
