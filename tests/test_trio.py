"""dataflow under trio: a Runtime, ops, fork and wait in `anyio.run(..., backend="trio")`."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from typing import Any

import anyio
import numpy as np
import pytest

import dataflow
import ops
from dataflow._trio import TrioLoop
from tests._helpers import fail_after, gated

trio = pytest.importorskip("trio")


def run_trio(main: Any, *args: Any) -> Any:
    return anyio.run(main, *args, backend="trio")


class TestTrio:
    def test_ops_fork_and_wait(self) -> None:
        """Ops, async and plain forks, wait and materialize give numpy's values under trio."""

        async def child(x: Any) -> Any:
            return ops.tanh(x)

        async def main() -> Any:
            async with dataflow.Runtime(interop_threads=2):
                x = np.arange(6.0).reshape(2, 3)
                y = ops.matmul(x, np.ones((3, 500)))  # big enough for the pool
                f = dataflow.fork(child, x)
                g = dataflow.fork(lambda v: float(v.sum()), y)
                return await y, await dataflow.materialize(await dataflow.wait(f)), await g

        y, t, s = run_trio(main)
        x = np.arange(6.0).reshape(2, 3)
        np.testing.assert_allclose(y, x @ np.ones((3, 500)))
        np.testing.assert_allclose(t, np.tanh(x))
        assert s == pytest.approx(float((x @ np.ones((3, 500))).sum()))

    def test_plain_trio_run(self) -> None:
        """trio.run itself (no anyio) works as well."""

        async def main() -> Any:
            async with dataflow.Runtime():
                return await ops.add(np.ones(2), 1.0)

        np.testing.assert_array_equal(trio.run(main), [2.0, 2.0])

    def test_worker_threads_wake_the_trio_loop(self) -> None:
        """A kernel finishing on a pool thread wakes the coroutine awaiting it."""

        async def main() -> Any:
            async with dataflow.Runtime(interop_threads=2):
                gate = threading.Event()
                h = gated(np.ones(3), gate)
                threading.Timer(0.05, gate.set).start()
                return await h

        np.testing.assert_array_equal(run_trio(main), np.ones(3))

    def test_kernel_error_reaches_the_awaiter(self) -> None:
        """A failed kernel's error is raised where it is awaited, under trio too."""

        async def main() -> str:
            async with dataflow.Runtime():
                gate = threading.Event()
                gate.set()
                with pytest.raises(dataflow.TaskError, match="boom after the gate"):
                    await fail_after(np.ones(2), gate)
            return "ok"

        assert run_trio(main) == "ok"

    def test_failing_body_cancels_forks(self) -> None:
        """An error in the body cancels the forked coroutines, which are awaited on exit."""
        seen: list[str] = []

        async def sleeper() -> None:
            try:
                await trio.sleep(10)
            finally:
                seen.append("cancelled")

        async def main() -> None:
            async with dataflow.Runtime():
                dataflow.fork(sleeper)
                await trio.sleep(0.01)
                raise RuntimeError("body failed")

        with pytest.raises(RuntimeError, match="body failed"):
            run_trio(main)
        assert seen == ["cancelled"]

    def test_a_fork_can_be_cancelled(self) -> None:
        """fork(...).cancel() cancels that coroutine only; waiting gives CancelledTaskError."""

        async def sleeper() -> str:
            await trio.sleep(10)
            return "woke"

        async def main() -> str:
            async with dataflow.Runtime():
                f = dataflow.fork(sleeper)
                await trio.sleep(0.01)
                assert f.cancel()
                with pytest.raises(dataflow.CancelledTaskError):
                    await f
                return await dataflow.fork(lambda: "other")

        assert run_trio(main) == "other"

    def test_a_fork_cancelled_before_it_started_never_runs(self) -> None:
        """Cancelled before its first step, a fork never runs and its future raises
        CancelledTaskError, as under asyncio. trio ran it up to its first checkpoint: one
        without any ran whole, and its future gave its value though cancel() said True."""
        ran: list[str] = []

        async def child() -> int:
            ran.append("child")
            return 42

        async def main() -> bool:
            async with dataflow.Runtime():
                f = dataflow.fork(child)
                said = f.cancel()
                with pytest.raises(dataflow.CancelledTaskError):
                    await f
                return said

        assert run_trio(main) is True
        assert ran == []

    def test_a_failing_body_cancels_forks_that_have_not_started(self) -> None:
        """A body that fails right after forking: the forks never run (they ran up to their
        first checkpoint, after the block had failed)."""
        ran: list[str] = []

        async def child() -> None:
            ran.append("child")

        async def main() -> None:
            async with dataflow.Runtime():
                dataflow.fork(child)
                raise KeyError("the body failed")

        with pytest.raises(KeyError):
            run_trio(main)
        assert ran == []

    def test_a_cancelled_fork_with_a_nursery_is_cancelled_not_failed(self) -> None:
        """With strict exception groups (trio's default from 0.25), a fork cancelled while
        its nursery's children sleep ends with a group of Cancelled: it is cancelled
        (CancelledTaskError), not failed. It was a TaskError, and a fork nobody awaited made
        the block raise UnobservedTaskError."""

        async def with_nursery() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.sleep, 10)
                nursery.start_soon(trio.sleep, 10)

        async def main() -> None:
            async with dataflow.Runtime():
                awaited = dataflow.fork(with_nursery)
                dropped = dataflow.fork(with_nursery)
                await trio.sleep(0.05)
                awaited.cancel()
                dropped.cancel()
                with pytest.raises(dataflow.CancelledTaskError):
                    await awaited

        trio.run(main, strict_exception_groups=True)

    def test_context_variables_reach_forks(self) -> None:
        """A forked coroutine sees the context variables of the code that forked it."""
        import contextvars

        var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

        async def read() -> str:
            return var.get()

        async def main() -> str:
            async with dataflow.Runtime():
                var.set("set")
                return await dataflow.fork(read)

        assert run_trio(main) == "set"

    def test_run_inside_trio_is_refused(self) -> None:
        """dataflow.run inside a running trio loop is refused, as under asyncio."""

        async def inner() -> None:
            pass

        async def main() -> str:
            with pytest.raises(dataflow.DataflowError, match="running event loop"):
                dataflow.run(inner)
            return "refused"

        assert run_trio(main) == "refused"

    def test_unobserved_failure_is_raised_at_exit(self) -> None:
        """A forked coroutine that failed and was never awaited is reported on exit."""

        async def bad() -> None:
            raise ValueError("nobody looked")

        async def main() -> None:
            async with dataflow.Runtime():
                dataflow.fork(bad)
                await trio.sleep(0.01)

        with pytest.raises(dataflow.UnobservedTaskError):
            run_trio(main)


class TestUnobservedBaseException:
    def test_base_exception_in_an_unawaited_fork_is_reported(self) -> None:
        """A forked coroutine raising a BaseException subclass is not lost (issue #19.3)."""

        class Stop(BaseException):
            pass

        async def bad() -> None:
            raise Stop("odd")

        async def main() -> None:
            dataflow.fork(bad)

        with pytest.raises(dataflow.UnobservedTaskError) as info:
            dataflow.run(main)
        assert isinstance(info.value.__cause__, dataflow.TaskError)
        assert isinstance(info.value.__cause__.__cause__, Stop)


def _cancel_later(fut: Any) -> bool:
    return bool(fut.cancel())


class TestCancelFromAnotherThreadUnderTrio:
    @pytest.mark.timeout(60)
    def test_a_plain_fork_cancels_a_running_async_fork(self) -> None:
        """A running fork's cancel scope cancelled from a pool thread: the trio thread does
        it. It raised trio's RuntimeError ("must be called from async context") there."""
        import trio

        async def sleeper() -> str:
            await trio.sleep(20)
            return "slept"

        async def main() -> bool:
            async with dataflow.Runtime(interop_threads=1):
                f = dataflow.fork(sleeper)
                said = await dataflow.fork(_cancel_later, f)
                with pytest.raises(dataflow.CancelledTaskError):
                    await f
                return said

        assert trio.run(main) is True


class TestBatchedCallersUnderTrio:
    def test_a_cancelled_caller_stops_its_running_batch(self) -> None:
        """Under trio too, the lone caller of a running compiled batch can be cancelled (its
        cancel scope): nothing hangs (the batch's task is cancelled through trio's cancel scope)
        and the model serves the next call."""
        from tests.test_compile import Gated

        gate = threading.Event()
        forward = dataflow.compile(Gated(gate), batch_axis=0, max_wait=5.0)
        x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)

        async def main() -> Any:
            async with dataflow.Runtime(interop_threads=2):
                gate.set()
                await forward(x)  # compiled
                gate.clear()
                scope = trio.CancelScope()

                async def call() -> None:
                    with scope:
                        await forward(x)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call)
                    await trio.sleep(0.05)
                    scope.cancel()
                gate.set()
                with trio.fail_after(30):
                    return await forward(x)

        np.testing.assert_array_equal(run_trio(main), x)  # 50 negations

    @pytest.mark.parametrize("batched", [False, True], ids=["plain", "batched"])
    def test_a_caught_timeout_around_a_call_drops_its_plan(self, batched: bool) -> None:
        """``trio.move_on_after`` around a compiled call: the plan's unstarted nodes are
        dropped, as an eager chain's are (trio reports no task as cancelled, and the call's
        wait did not tell the runtime it was interrupted: every node ran for nobody)."""
        from tests.test_compile import Counted

        gate = threading.Event()
        forward = dataflow.compile(Counted(gate), batch_axis=0 if batched else None)
        x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)

        async def main() -> tuple[int, Any]:
            async with dataflow.Runtime(interop_threads=2) as rt:
                gate.set()
                await forward(x)
                gate.clear()
                Counted.ran.clear()
                before = rt._sched.dropped
                with trio.move_on_after(0.05):
                    await forward(x)
                await trio.sleep(0.02)
                gate.set()
                await trio.sleep(0.1)
                assert Counted.ran == []  # the nodes queued behind the gate never ran
                with trio.fail_after(30):
                    again = await forward(x)
                return rt._sched.dropped - before, again

        dropped, again = run_trio(main)
        assert dropped >= 1
        np.testing.assert_allclose(again, x + 5, rtol=1e-6)


def _gate_kernel(x: Any, gate: threading.Event) -> Any:
    gate.wait(10)
    return x


trio_gate = dataflow.op(
    "trio_gate", meta=lambda x, g: ops.spec_of(x), handle=ops.Tensor, inline=False
)(_gate_kernel)
trio_neg = dataflow.op("trio_neg", meta=ops.spec_of, handle=ops.Tensor, inline=False)(np.negative)


def run_watched(main: Any) -> tuple[Any, list[Any]]:
    """Run ``main`` (run_trio) under a profile: its value, and the trio_neg ops
    that started."""
    with dataflow.profile() as prof:
        value = run_trio(main)
    return value, [t for t in prof.trace().tasks if t.op == "trio_neg"]


async def gated_chain(gate: threading.Event) -> Any:
    """A request: 200 trio_neg ops behind a gate, its last one awaited."""
    y = trio_gate(np.zeros(4), gate)
    for _ in range(200):
        y = trio_neg(y)
    return await y


async def _rounds(n: int = 8) -> None:
    """Let the run take ``n`` scheduling rounds (trio shuffles the order within a round)."""
    for _ in range(n):
        await trio.lowlevel.checkpoint()


class TestRequestsUnderTrio:
    """Work belongs to the trio task that dispatched it (``TrioLoop``: requests are trio
    tasks, their ends reported by an instrument), as it does to an asyncio task."""

    def test_a_cancelled_request_drops_its_queued_ops(self) -> None:
        """A request cancelled while it awaits its chain (its nursery's scope cancelled)
        drops the chain's unstarted ops once it has ended (counted from the trace)."""

        async def main() -> int:
            async with dataflow.Runtime(interop_threads=2) as rt:
                gate = threading.Event()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(gated_chain, gate)
                    await trio.sleep(0.05)
                    nursery.cancel_scope.cancel()
                await _rounds()
                gate.set()
                return int(rt._sched.dropped)

        dropped, started = run_watched(main)
        assert dropped == 200 and started == []

    def test_a_request_an_anyio_task_group_cancelled_drops_its_queued_ops(self) -> None:
        """The same request in an anyio task group (on trio): cancelled while it awaits its
        chain, its unstarted ops are dropped. anyio keeps the request's Cancelled in a
        reference cycle, and with it the request's frames and their handles: every op ran
        for nobody."""

        async def main() -> int:
            async with dataflow.Runtime(interop_threads=2) as rt:
                gate = threading.Event()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(gated_chain, gate)
                    await trio.sleep(0.05)
                    # (a past deadline: cancel() passes trio a reason older trios refuse)
                    tg.cancel_scope.deadline = -math.inf
                await _rounds()
                gate.set()
                return int(rt._sched.dropped)

        dropped, started = run_watched(main)
        assert dropped == 200 and started == []

    def test_a_caught_cancellation_drops_what_its_scope_dispatched(self) -> None:
        """``trio.move_on_after`` inside the request: the ops dispatched in the scope that
        nobody holds any more are dropped once it has unwound; a handle the request holds
        outside the scope is kept and runs."""

        async def main() -> tuple[int, Any]:
            async with dataflow.Runtime(interop_threads=2) as rt:
                gate = threading.Event()
                kept = trio_neg(trio_gate(np.full(4, 2.0), gate))

                async def chain() -> Any:
                    y = trio_gate(np.zeros(4), gate)
                    for _ in range(200):
                        y = trio_neg(y)
                    return await y

                with trio.move_on_after(0.05):
                    await chain()
                await _rounds()
                gate.set()
                value = await kept
                return int(rt._sched.dropped), value

        (dropped, value), started = run_watched(main)
        np.testing.assert_array_equal(value, np.full(4, -2.0))
        assert dropped == 200 and len(started) == 1  # the kept one

    def test_a_request_that_returns_keeps_its_work(self) -> None:
        """A request that ends without a cancellation drops nothing: the chain it handed
        out runs to its value after the request's task is gone."""

        async def main() -> tuple[int, Any]:
            async with dataflow.Runtime(interop_threads=2) as rt:
                gate = threading.Event()
                out: list[Any] = []

                async def request() -> None:
                    y = trio_gate(np.ones(3), gate)
                    for _ in range(20):
                        y = trio_neg(y)
                    out.append(y)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(request)
                await _rounds()
                gate.set()
                return int(rt._sched.dropped), await out[0]

        dropped, value = run_trio(main)
        assert dropped == 0
        np.testing.assert_array_equal(value, np.ones(3))  # 20 negations

    def test_the_runtime_removes_its_instrument_when_it_closes(self) -> None:
        """The instrument that reports requests' ends is added with the first request and
        removed when the runtime closes (trio then no longer knows it)."""

        async def main() -> Any:
            async with dataflow.Runtime(interop_threads=2) as rt:
                await trio_neg(np.ones(2))  # a deferred op: the main task becomes a request
                host = rt.host
                assert isinstance(host, TrioLoop)
                instrument = host._instrument
                assert instrument is not None
            assert host._instrument is None
            with pytest.raises(KeyError):
                trio.lowlevel.remove_instrument(instrument)

        run_trio(main)


class TestStoppingTheProcess:
    @pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
    def test_a_fork_that_stops_the_process_raises_at_the_blocks_exit(self, exc: type) -> None:
        """A trio system task may not raise (trio makes it TrioInternalError): the fork's
        KeyboardInterrupt / SystemExit comes out of the runtime's block instead, as asyncio's
        loop lets it through; the awaiter got its TaskError meanwhile."""
        import trio

        seen: list[str] = []

        async def stop() -> None:
            raise exc()

        async def main() -> None:
            async with dataflow.Runtime():
                try:
                    await dataflow.fork(stop)
                except dataflow.TaskError:
                    seen.append("TaskError")

        with pytest.raises(exc):
            trio.run(main)
        assert seen == ["TaskError"]

    @pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
    def test_a_fork_whose_nursery_was_stopped_stops_the_process(self, exc: type) -> None:
        """The same interrupt inside an exception group (a nursery in the fork: trio groups
        its children's exceptions) comes out of the block too: the group became the fork's
        TaskError, and the interrupt was lost."""
        import trio

        async def stop() -> None:
            raise BaseExceptionGroup("a nursery in the fork", [exc()])

        async def main() -> None:
            async with dataflow.Runtime():
                with contextlib.suppress(dataflow.TaskError):
                    await dataflow.fork(stop)

        with pytest.raises(exc):
            trio.run(main)

    def test_ctrl_c_in_a_kernel_on_the_trio_thread_stops_the_run(self) -> None:
        """trio raises KeyboardInterrupt in whatever unprotected code the main thread runs:
        in a kernel run at dispatch it fails the task and leaves trio.run, where it was a
        TaskError that `except Exception` caught, so Ctrl-C was lost."""
        import trio

        def interrupted(x: Any) -> Any:
            raise KeyboardInterrupt

        op = ops.define("interrupted_on_trio", interrupted, ops.spec_of, inline=True)
        swallowed: list[BaseException] = []

        async def main() -> None:
            async with dataflow.Runtime(interop_threads=1):
                try:
                    await op(np.ones(2))
                except Exception as e:
                    swallowed.append(e)

        threads = threading.active_count()
        with pytest.raises(KeyboardInterrupt):
            trio.run(main)
        assert swallowed == []
        assert threading.active_count() == threads


class TestLoopThreadUnderTrio:
    def test_the_loop_thread_is_the_loop_lane_and_parallel_info_says_trio(self) -> None:
        """The profile's lanes and parallel_info() recognised only asyncio's loop: under trio
        the loop's thread was counted as a pool thread (halving the lower bound)."""
        import trio

        async def main() -> tuple[list[str], int, str]:
            info = dataflow.parallel_info()
            async with dataflow.Runtime(interop_threads=2), dataflow.profile() as prof:
                for _ in range(3):
                    await ops.add(ops.add(np.ones(4), 1.0), 1.0)
            summary = prof.summary()
            return list(summary.busy_s), summary.pool_threads, info

        lanes, pool_threads, info = trio.run(main)
        assert "loop" in lanes and "MainThread" not in lanes
        assert pool_threads <= 2
        assert "event loop: trio" in info


class TestTraceUnderTrio:
    def test_trace_is_refused_inside_trio_as_inside_asyncio(self) -> None:
        """trace() runs its own asyncio loop: inside trio's it blocked trio for the whole
        trace; it says to await trace_async instead, as under asyncio."""
        import trio

        async def model(x: Any) -> Any:
            return ops.tanh(x)

        async def main() -> None:
            with pytest.raises(dataflow.DataflowError, match=r"trace_async"):
                dataflow.trace(model, np.ones(3))
            graph = await dataflow.graph.trace_async(model, np.ones(3))
            assert [n.op.name for n in graph.nodes] == ["tanh"]

        trio.run(main)


class TestTrioGuestRun:
    def test_a_runtime_in_a_trio_guest_run_on_asyncio_uses_trio(self) -> None:
        """trio's guest mode runs trio's tasks inside an asyncio loop's callbacks: a runtime
        entered there is trio's (sniffio says so, as anyio hears it). The running asyncio loop
        made it asyncio's: awaiting an op handed trio an asyncio future (a TypeError), and the
        runtime's exit failed the same way."""

        async def child(x: Any) -> Any:
            return ops.negative(x)

        async def in_trio() -> tuple[str, Any, Any, str]:
            async with dataflow.Runtime(interop_threads=2) as rt:
                y = ops.matmul(np.ones((3, 4)), np.ones((4, 500)))  # big enough for the pool
                f = dataflow.fork(child, np.ones(2))
                assert rt.host is not None
                return rt.host.library, await y, await f, dataflow.parallel_info()

        async def host() -> Any:
            loop = asyncio.get_running_loop()
            done: asyncio.Future[Any] = loop.create_future()
            trio.lowlevel.start_guest_run(
                in_trio,
                run_sync_soon_threadsafe=loop.call_soon_threadsafe,
                done_callback=done.set_result,
                host_uses_signal_set_wakeup_fd=True,
            )
            return (await done).unwrap()

        library, y, negated, info = asyncio.run(host())
        assert library == "trio"
        np.testing.assert_array_equal(y, np.full((3, 500), 4.0))
        np.testing.assert_array_equal(negated, [-1.0, -1.0])
        assert "event loop: trio" in info
