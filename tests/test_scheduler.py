"""The scheduler's policy: placement, the signature cache, measured kernel times, the GIL
lane, the synchronous mode, and the checks made at every call and on every kernel's value."""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow import OpOutputError, TaskError
from dataflow import _graphstate as gs
from dataflow._pool import GRAPH_LOCK
from dataflow._scheduler import note_overlap
from dataflow._scheduler._placement import (
    AWAIT_HERE_SECONDS,
    AWAITED_AT_ONCE,
    EWMA,
    FIRST_RUNS,
    GIL_DECIDE,
    GIL_WINDOW,
    MEASURE_POOL_ABOVE,
    OUTLIER,
    PROBE,
    SAMPLE,
    SERIAL_ABOVE,
    SERIAL_PARALLEL,
    WARM_UP,
    dispatcher_overlap,
    note_seconds,
    parallel_gil,
    runs_inline,
)
from dataflow._signature import Signature
from dataflow._task import FLOP_RATE, READY, RUNNING, Task
from tests._helpers import Arr, Spec, fail_after, gated, neg_pool

Array = np.ndarray[Any, Any]


def _thread(x: Any) -> Any:
    return np.array([threading.get_ident()], dtype=np.int64)


def _ident_meta(x: Any) -> Spec:
    return Spec((1,), np.dtype(np.int64))


# A tiny op (its cost rule says so), a big one, and one pinned to the pool.
tiny_where = dataflow.op(
    "tiny_where", meta=_ident_meta, handle=Arr, cost=lambda x: dataflow.Cost(1, 8)
)(_thread)
pool_where = dataflow.op("pool_where", meta=_ident_meta, handle=Arr, inline=False)(_thread)


def _after(x: Any, y: Any) -> Any:
    return np.array([threading.get_ident()], dtype=np.int64)


tiny_after = dataflow.op(
    "tiny_after",
    meta=lambda x, y: _ident_meta(x),
    handle=Arr,
    cost=lambda x, y: dataflow.Cost(1, 8),
)(_after)


class TestPlacement:
    def test_small_ready_op_runs_inline(self) -> None:
        """A small op whose inputs are ready runs at once, on the dispatching thread."""

        async def main() -> tuple[int, bool]:
            h = tiny_where(np.zeros(1))
            return int(h.result()[0]), h.done()

        where, done = dataflow.run(main, interop_threads=2)
        assert done and where == threading.get_ident()

    def test_pinned_op_runs_on_the_pool(self) -> None:
        """An op declared inline=False runs on an inter-op thread."""

        async def main() -> int:
            return int((await pool_where(np.zeros(1)))[0])

        assert dataflow.run(main, interop_threads=2) != threading.get_ident()

    def test_small_op_waiting_for_an_input_runs_where_the_input_finished(self) -> None:
        """A chain of small ops behind a pool op runs on the pool op's thread, no hand-off."""

        async def main() -> tuple[int, int]:
            gate = threading.Event()
            slow = gated(np.zeros(1), gate)
            first = pool_where(slow)
            second = tiny_after(first, slow)
            gate.set()
            # Awaiting the chain's end first: a loop that awaited ``first`` could wake while
            # ``second`` was queued and not yet started (the worker preempted in between, as
            # under load) and run it itself, as it should (the awaiting loop runs a queued
            # small task): that is another test's case.
            s = int((await second)[0])
            return int((await first)[0]), s

        first, second = dataflow.run(main, interop_threads=2)
        assert first == second != threading.get_ident()

    def test_awaiting_a_queued_small_task_runs_it_on_the_awaiting_thread(self) -> None:
        """A small task queued and not started is run by the coroutine awaiting it."""

        async def main() -> tuple[int, int]:
            rt = dataflow.current_runtime()
            assert rt is not None
            gate = threading.Event()
            busy = gated(np.zeros(1), gate)  # occupies the only worker
            sig = Signature("queued_small", Spec((1,), np.dtype(np.int64)))
            sig.seconds = 1e-6
            task = Task(sig, _thread, (np.zeros(1),), None, rt)
            with GRAPH_LOCK:
                rt._sched.inflight += 1
                gs.add(task)
                assert rt._sched.pool is not None
                rt._sched.pool.push_locked(task)
            value = await Arr(task, None, sig.spec)
            gate.set()
            await busy
            return int(value[0]), threading.get_ident()

        where, loop_thread = dataflow.run(main, interop_threads=1)
        assert where == loop_thread

    def test_a_timed_op_never_runs_inline(self) -> None:
        """An op with a timeout goes to the pool even when it is small."""

        async def main() -> int:
            rt = dataflow.current_runtime()
            assert rt is not None
            return int((await tiny_where(np.zeros(1)))[0])

        where = dataflow.run(main, interop_threads=2, op_timeout=5.0)
        assert where != threading.get_ident()


def _spin_thread(x: Any) -> Any:
    """A kernel of about 150 us (3x the inline threshold, under AWAIT_HERE_SECONDS by a margin
    a loaded machine's preemption does not eat)."""
    end = time.perf_counter() + 150e-6
    while time.perf_counter() < end:
        pass
    return np.array([threading.get_ident()], dtype=np.int64)


def _mid_op(name: str) -> Any:
    """A new op ``name`` of a 150 us kernel that returns the thread it ran on. Its cost rule
    says 150 us too, so its very first call is placed as a 150 us kernel. (Tests that set a
    signature's state make their own: ops of equal outcome share a signature.)"""
    return dataflow.op(
        name, meta=_ident_meta, handle=Arr, cost=lambda x: dataflow.Cost(150e-6 * FLOP_RATE, 0)
    )(_spin_thread)


mid_where = _mid_op("mid_where")


_ran_on: list[int] = []


def _step_kernel(x: Any) -> Any:
    _ran_on.append(threading.get_ident())
    return x + 1


def _tiny_step_op(name: str, kernel: Callable[[Any], Any]) -> Any:
    """A new op ``name`` on a (1,) int64 array whose cost rule says it is tiny."""
    return dataflow.op(
        name,
        meta=lambda x: Spec((1,), np.dtype(np.int64)),
        handle=Arr,
        cost=lambda x: dataflow.Cost(1, 8),
    )(kernel)


# A tiny op that notes the thread it ran on in _ran_on.
tiny_step = _tiny_step_op("tiny_step", _step_kernel)


class TestHandBack:
    """Small tasks a worker makes ready while the loop dispatches work that waits are handed
    back to the loop (``_placement.HANDBACK_SECONDS``): a chain of tiny ops behind a big one,
    run on a worker while the loop dispatched the rest of it, took turns with the loop on the
    GIL and the graph lock at every op and never caught up (14.5 us an op, against 2.7)."""

    @pytest.fixture(autouse=True)
    def _wide_window(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # The mechanism, not the window: a loaded machine may preempt the loop between two
        # dispatches for longer than 50 us.
        from dataflow._scheduler import _execution

        monkeypatch.setattr(_execution, "HANDBACK_NS", 10**10)
        _ran_on.clear()

    def test_a_chain_behind_a_big_op_is_run_by_the_dispatching_loop(self) -> None:
        """The loop runs the handed-back chain at its next dispatch, which then finds its
        input done and runs inline: the chain has caught up."""

        async def main() -> tuple[bool, int, Any]:
            for _ in range(2 * FIRST_RUNS):  # its time settled (a slow first run is no clue)
                await tiny_step(np.zeros(1, dtype=np.int64))
            _ran_on.clear()
            await _workers_parked()
            gate = threading.Event()
            y: Any = gated(np.zeros(1, dtype=np.int64), gate)
            for _ in range(50):
                y = tiny_step(y)  # waits for the big op
            gate.set()
            extra = 0
            while extra < 2000:
                time.sleep(0.001)  # the worker needs the GIL to finish the big op
                y = tiny_step(y)
                extra += 1
                if y.done():
                    break
            return y.done(), extra, int((await y)[0])

        caught_up, extra, value = dataflow.run(main, interop_threads=2)
        assert caught_up and value == 50 + extra
        assert set(_ran_on) == {threading.get_ident()}  # every step on the loop's thread

    def test_handed_back_work_runs_while_the_loop_awaits_something_else(self) -> None:
        """A drain is posted to the loop: the step runs though nothing of it is awaited."""

        async def main() -> tuple[bool, int]:
            for _ in range(2 * FIRST_RUNS):
                await tiny_step(np.zeros(1, dtype=np.int64))
            _ran_on.clear()
            await _workers_parked()
            gate = threading.Event()
            y = tiny_step(gated(np.zeros(1, dtype=np.int64), gate))
            gate.set()
            ok = await _yielding_until(y.done)
            return ok, int((await y)[0])

        ok, value = dataflow.run(main, interop_threads=2)
        assert ok and value == 1 and _ran_on == [threading.get_ident()]

    def test_the_loop_goes_on_with_tiny_work_only(self) -> None:
        """Running what was handed back, the loop queues a GIL-bound kernel it makes ready
        rather than run it (up to a switch interval on the loop: a server's lag)."""

        # Its own op: a signature marked serial here must not leak into other tests.
        serial_mid = _mid_op("serial_mid")

        async def main() -> int:
            for _ in range(2 * FIRST_RUNS):
                await tiny_step(np.zeros(1, dtype=np.int64))
            await _workers_parked()
            gate = threading.Event()
            m = serial_mid(tiny_step(gated(np.zeros(1, dtype=np.int64), gate)))
            m.task.sig.serial = True  # GIL-bound and short: "small", but not tiny
            gate.set()
            await asyncio.sleep(0.05)  # the posted drain runs the step on the loop
            return int((await m)[0])

        assert dataflow.run(main, interop_threads=2) != threading.get_ident()

    def test_a_failed_input_fails_the_handed_back_chain(self) -> None:
        async def main() -> None:
            await _workers_parked()
            gate = threading.Event()
            from tests._helpers import fail_after

            y: Any = fail_after(np.zeros(1, dtype=np.int64), gate)
            for _ in range(5):
                y = tiny_step(y)
            gate.set()
            await y

        with pytest.raises(TaskError, match="boom after the gate"):
            dataflow.run(main, interop_threads=2)
        assert _ran_on == []


def _spin_fail(x: Any) -> Any:
    _spin_thread(x)
    raise ValueError("mid_fails: broken on purpose")


mid_fails = dataflow.op(
    "mid_fails", meta=_ident_meta, handle=Arr, cost=lambda x: dataflow.Cost(150e-6 * FLOP_RATE, 0)
)(_spin_fail)


def _blocked_until(done: Callable[[], bool], seconds: float = 5.0) -> bool:
    """Hold this thread (the loop's: no callback runs) until ``done()`` or ``seconds`` pass."""
    end = time.monotonic() + seconds
    while not done():
        if time.monotonic() > end:
            return False
        time.sleep(0.002)
    return True


async def _yielding_until(done: Callable[[], bool], seconds: float = 5.0) -> bool:
    """Let the loop run until ``done()`` or ``seconds`` pass."""
    end = time.monotonic() + seconds
    while not done():
        if time.monotonic() > end:
            return False
        await asyncio.sleep(0.002)
    return True


async def _workers_parked() -> None:
    """Wait until every worker of the runtime's pool is parked (a worker still starting up
    would find a queued task without being woken)."""
    rt = dataflow.current_runtime()
    assert rt is not None and rt._sched.pool is not None
    pool = rt._sched.pool
    assert await _yielding_until(lambda: pool.idle == pool.num_threads)


class TestAwaitedRunsHere:
    """A task under AWAIT_HERE_SECONDS dispatched by the loop wakes no worker until the loop's
    callback ends, and the loop runs it if it awaits it first (``dataflow._scheduler``)."""

    def test_the_bound_is_between_a_hand_off_and_a_loop_stall(self) -> None:
        assert dataflow.get_inline_threshold() < 150e-6 < AWAIT_HERE_SECONDS <= 1e-3

    def test_an_op_awaited_at_once_runs_on_the_awaiting_thread(self) -> None:
        """Over the inline threshold, under the bound: awaited right away, it runs on the
        loop's thread (no worker wake-up, then no loop wake-up). (A first run preempted past
        the bound may send the next call to a worker once: the last calls are asserted.)"""

        async def main() -> list[int]:
            return [int((await mid_where(np.zeros(1)))[0]) for _ in range(8)]

        where = dataflow.run(main, interop_threads=2)
        assert set(where[-4:]) == {threading.get_ident()}

    def test_an_inline_threshold_of_zero_still_sends_it_to_the_pool(self) -> None:
        async def main() -> list[int]:
            async with dataflow.Runtime(inline_threshold=0.0, private_pool=True):
                return [int((await mid_where(np.zeros(1)))[0]) for _ in range(3)]

        assert threading.get_ident() not in dataflow.run(main, interop_threads=2)

    def test_a_lone_quiet_task_starts_when_the_loop_moves_on(self) -> None:
        """Not awaited, it is not lost: the wake-up posted to the loop starts it on a worker
        once the coroutine yields; before that, no worker has it."""

        async def main() -> tuple[bool, bool, int]:
            await _workers_parked()
            h = mid_where(np.zeros(1))
            time.sleep(0.05)  # the loop's thread is busy: the posted wake-up has not run
            before = h.done()
            after = await _yielding_until(h.done)  # it runs now
            return before, after, int((await h)[0])

        before, after, where = dataflow.run(main, interop_threads=2)
        assert not before and after and where != threading.get_ident()

    def test_ready_tasks_wait_for_the_loop_to_move_on_then_each_gets_a_worker(self) -> None:
        """Two ready tasks queued by the loop: no worker starts while its callback runs
        (a worker woken then would wait for the GIL the loop holds as it dispatches); when
        the coroutine yields, a worker starts for each (not one after the other)."""

        async def main() -> tuple[bool, bool, set[int]]:
            await _workers_parked()
            first = mid_where(np.zeros(1))
            second = mid_where(np.ones(1))
            started = _blocked_until(lambda: first.done() or second.done(), 0.05)
            both = await _yielding_until(lambda: first.done() and second.done())
            return started, both, {int((await h)[0]) for h in (first, second)}

        started, both, where = dataflow.run(main, interop_threads=2)
        assert not started and both and threading.get_ident() not in where

    def test_awaiting_wakes_workers_for_the_other_queued_tasks(self) -> None:
        """The loop stops dispatching to await one of two queued small tasks: a worker is
        woken for the other at once, not when the loop's callback ends, so the two run side
        by side (the awaited one, run by the loop, meets the other one started)."""
        started = threading.Event()

        def meet(x: Any) -> Any:
            if int(x[0]) == 1:  # the other task: say it started
                started.set()
                return np.array([threading.get_ident()], dtype=np.int64)
            met = started.wait(2.0)  # the awaited one waits for the other to start
            return np.array([threading.get_ident() if met else -1], dtype=np.int64)

        meeting = dataflow.op(
            "meeting", meta=_ident_meta, handle=Arr,
            cost=lambda x: dataflow.Cost(150e-6 * FLOP_RATE, 0),
        )(meet)  # fmt: skip

        async def main() -> list[int]:
            await _workers_parked()
            first, other = meeting(np.zeros(1)), meeting(np.ones(1))
            return [int((await h)[0]) for h in (first, other)]

        first, other = dataflow.run(main, interop_threads=2)
        assert first == threading.get_ident()  # the loop ran the awaited one, having met
        assert other not in (-1, threading.get_ident())

    def test_workers_wake_when_the_loop_dispatches_past_the_quiet_bound(self) -> None:
        """A loop that goes on dispatching small ready tasks for longer than QUIET_SECONDS
        (a long forward) wakes the workers at its next one: they start while it dispatches."""
        from dataflow._scheduler._placement import QUIET_SECONDS

        async def main() -> tuple[bool, bool]:
            await _workers_parked()
            first = mid_where(np.zeros(1))
            time.sleep(2 * QUIET_SECONDS)  # the loop's thread busy, still in its callback
            before = first.done()
            second = mid_where(np.ones(1))
            started = _blocked_until(lambda: first.done() or second.done())
            await first, await second
            return before, started

        before, started = dataflow.run(main, interop_threads=2)
        assert not before and started

    def test_the_wake_up_wakes_a_parked_worker_per_ready_task(self) -> None:
        """``wake_locked`` after quiet pushes: as many parked workers as tasks are ready."""
        from dataflow._pool import InteropPool

        released: list[int] = []

        class Gate:
            def __init__(self, i: int) -> None:
                self.i = i

            def release(self) -> None:
                released.append(self.i)

        pool = InteropPool.__new__(InteropPool)  # (its queue and parked workers only)
        pool._heap = []
        pool._idle = [Gate(i) for i in range(3)]  # type: ignore[misc]
        tasks = []
        for i in range(2):
            t = Task(Signature("q"), lambda: None, (), None, None)
            t.state = READY
            t.priority = float(i)
            tasks.append(t)
        with GRAPH_LOCK:
            for t in tasks:
                pool.push_quietly_locked(t)
            assert released == []  # queued quietly: nobody woken
            pool.wake_locked()
        assert sorted(released) == [1, 2]  # two tasks, two of the three parked workers

    def test_a_closed_loop_wakes_a_worker_at_once(self, monkeypatch: Any) -> None:
        """If the wake-up cannot be posted (the loop is closing), a worker is woken now."""

        async def main() -> tuple[bool, int]:
            await _workers_parked()
            rt = dataflow.current_runtime()
            assert rt is not None

            def closed(fn: Any) -> None:
                raise RuntimeError("Event loop is closed")

            monkeypatch.setattr(rt._sched.host, "later", closed)
            h = mid_where(np.zeros(1))
            done = _blocked_until(h.done)
            return done, int((await h)[0])

        done, where = dataflow.run(main, interop_threads=2)
        assert done and where != threading.get_ident()

    def test_with_one_worker_it_runs_at_dispatch(self) -> None:
        """One inter-op thread: the worker could not start it before the dispatching thread
        lets go of the GIL anyway, so it runs at dispatch, done before the call returns."""

        async def main() -> tuple[bool, int]:
            h = mid_where(np.zeros(1))
            return h.done(), int((await h)[0])

        done, where = dataflow.run(main, interop_threads=1)
        assert done and where == threading.get_ident()

    def test_with_one_worker_and_a_zero_threshold_it_goes_to_the_pool(self) -> None:
        async def main() -> int:
            async with dataflow.Runtime(inline_threshold=0.0, private_pool=True):
                return int((await mid_where(np.zeros(1)))[0])

        assert dataflow.run(main, interop_threads=1) != threading.get_ident()

    def test_an_op_always_awaited_at_once_is_learnt_and_run_at_dispatch(self) -> None:
        """After AWAITED_AT_ONCE runs in a row by the awaiting loop, its next calls run at
        dispatch (the lean path: done when the call returns)."""

        async def main() -> tuple[list[bool], int]:
            done = []
            for _ in range(AWAITED_AT_ONCE + 8):
                h = mid_where(np.zeros(1))
                done.append(h.done())
                await h
            return done, h.task.sig.awaited

        done, awaited = dataflow.run(main, interop_threads=2)
        assert done[:AWAITED_AT_ONCE] == [False] * AWAITED_AT_ONCE
        assert done[-2:] == [True, True] and awaited >= AWAITED_AT_ONCE

    def test_a_probe_run_by_a_worker_unlearns_it(self) -> None:
        """One call in PROBE takes the usual way; run by a worker (not awaited at once), it
        resets the count, and the calls after it are queued again."""

        async def main() -> tuple[bool, bool, int, bool]:
            sig = mid_where(np.zeros(1)).task.sig
            for _ in range(20):  # learnt: ran at dispatch
                h = mid_where(np.zeros(1))
                if h.done():
                    break
                await h
            learnt = sig.awaited >= AWAITED_AT_ONCE
            await _workers_parked()
            sig.calls = PROBE - 1  # the next call is a probe
            probe = mid_where(np.zeros(1))
            queued = not probe.done()
            # Not awaited: the posted wake-up gives it to a worker.
            assert await _yielding_until(probe.done)
            awaited = sig.awaited
            after = mid_where(np.zeros(1))
            after_done = after.done()
            await after
            return learnt, queued, awaited, after_done

        learnt, queued, awaited, after_done = dataflow.run(main, interop_threads=2)
        assert learnt and queued and awaited == 0 and not after_done

    def test_a_pinned_op_is_never_run_by_the_awaiting_thread(self) -> None:
        async def main() -> list[int]:
            return [int((await pool_where(np.zeros(1)))[0]) for _ in range(3)]

        assert threading.get_ident() not in dataflow.run(main, interop_threads=2)


def _gather(*xs: Any) -> Any:
    return np.concatenate(xs)


# A tiny op waiting for any number of the others' outputs: where each of them ran.
tiny_gather = dataflow.op(
    "tiny_gather",
    meta=lambda *xs: Spec((len(xs),), np.dtype(np.int64)),
    handle=Arr,
    cost=lambda *xs: dataflow.Cost(1, 8),
)(_gather)


class TestAwaitingHelps:
    """The loop awaiting a task that waits for its inputs runs the queued tasks it waits for
    itself, within AWAIT_HERE_SECONDS (``Scheduler._help``). The workers are woken for the
    second of them, but cannot take the GIL from the loop's thread before it awaits: a long
    switch interval keeps a loaded machine's preemption from handing it over earlier."""

    @pytest.fixture(autouse=True)
    def _long_switch_interval(self) -> Any:
        before = sys.getswitchinterval()
        sys.setswitchinterval(1.0)
        yield
        sys.setswitchinterval(before)

    def test_the_inputs_of_an_awaited_task_run_on_the_awaiting_thread(self) -> None:
        """Two mid-sized kernels and a tiny one on both, awaited at once (the shape of a
        bidirectional layer whose output is awaited): all three run on the loop's thread,
        instead of one after the other on one woken worker while the loop waits."""

        async def main() -> list[int]:
            await _workers_parked()
            a = mid_where(np.zeros(1))
            b = mid_where(np.ones(1))
            return [int(v) for v in await tiny_gather(a, b, tiny_where(np.zeros(1)))]

        where = dataflow.run(main, interop_threads=2)
        assert where[:2] == [threading.get_ident()] * 2

    def test_with_two_requests_in_flight_the_loop_does_not_help(self) -> None:
        """Two tasks on the loop with deferred work (a server's requests): the loop helping
        one would delay the other (loop lag max 159 ms at 32 clients), so the workers run
        the inputs."""

        async def request(k: int) -> list[int]:
            a = mid_where(np.full(1, k))
            b = mid_where(np.full(1, k + 1))
            await asyncio.sleep(0)  # both requests have dispatched before either awaits
            return [int(v) for v in await tiny_gather(a, b)][:2]

        async def main() -> list[list[int]]:
            await _workers_parked()
            return list(await asyncio.gather(request(0), request(10)))

        for where in dataflow.run(main, interop_threads=2):
            assert threading.get_ident() not in where

    def test_a_kernel_the_loop_runs_itself_is_counted_while_it_runs(self) -> None:
        """A measurable kernel the awaiting loop takes makes ``loop_kernels`` odd while it
        runs and even again after (pool runs beside it then keep their CPU share out of
        the GIL lane's figures)."""
        box: dict[str, Any] = {}
        during: list[int] = []

        def kernel(x: Any) -> Any:
            during.append(box["sched"].loop_kernels)
            return _spin_thread(x)

        op = dataflow.op(
            "counted_by_the_loop",
            meta=_ident_meta,
            handle=Arr,
            cost=lambda x: dataflow.Cost(150e-6 * FLOP_RATE, 0),
        )(kernel)

        async def main() -> tuple[int, int, int]:
            rt = dataflow.current_runtime()
            assert rt is not None
            box["sched"] = rt._sched
            await _workers_parked()
            before = rt._sched.loop_kernels
            where = int((await op(np.zeros(1)))[0])
            return where, before, rt._sched.loop_kernels

        where, before, after = dataflow.run(main, interop_threads=2)
        assert where == threading.get_ident()  # the loop ran it
        assert during == [before + 1] and before % 2 == 0 and after == before + 2

    def test_it_runs_no_more_than_the_bound_holds(self) -> None:
        """Twelve kernels of 150 us (1.8 ms): the loop runs those that fit in
        AWAIT_HERE_SECONDS and leaves the rest to the workers."""

        async def main() -> list[int]:
            await _workers_parked()
            return [int(v) for v in await tiny_gather(*[mid_where(np.zeros(1)) for _ in range(12)])]

        where = dataflow.run(main, interop_threads=2)
        here = where.count(threading.get_ident())
        assert 1 <= here <= int(AWAIT_HERE_SECONDS / 150e-6) + 1 and here < 12

    @staticmethod
    def _measured_gil_free(monkeypatch: pytest.MonkeyPatch) -> Any:
        """A 150 us op of its own whose signature reads as measured GIL-free (not serial, a
        CPU share of 1 over GIL_DECIDE overlapped runs), its measurements frozen so that the
        test's own runs on a loaded machine cannot change that."""
        from dataflow._scheduler import _execution

        monkeypatch.setattr(_execution, "note_overlap", lambda *a, **k: None)
        monkeypatch.setattr(_execution, "note_seconds", lambda *a, **k: None)
        free_where = _mid_op("free_where")

        def mark(sig: Signature) -> None:
            sig.seconds, sig.serial, sig.cpu_share = 150e-6, False, 1.0
            sig.overlaps[:] = [(150e-6, 1.0, 0.0)] * GIL_DECIDE

        return free_where, mark

    def test_gil_free_inputs_are_left_to_the_workers(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Measured GIL-free, the inputs of an awaited task are left to the pool's threads
        while the pool has other work: the loop taking one beside both workers put three
        threads on two cores (the numba engine's (50, 1, 128) ensemble: 1.78 ms a forward
        left to the pool, 2.2 ms helped)."""
        free_where, mark = self._measured_gil_free(monkeypatch)

        async def main() -> list[int]:
            first = free_where(np.zeros(1))
            await first
            mark(first.task.sig)
            await _workers_parked()
            ins = [free_where(np.full(1, float(i))) for i in range(4)]
            return [int(v) for v in await tiny_gather(*ins)][:4]

        assert threading.get_ident() not in dataflow.run(main, interop_threads=2)

    def test_a_lone_gil_free_task_is_still_run_by_the_awaiting_loop(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Nothing else queued or running: the loop, awaiting it, runs it itself (no hand-off
        to pay), GIL-free or not."""
        free_where, mark = self._measured_gil_free(monkeypatch)

        async def main() -> int:
            first = free_where(np.zeros(1))
            await first
            mark(first.task.sig)
            await _workers_parked()
            return int((await free_where(np.ones(1)))[0])

        assert dataflow.run(main, interop_threads=2) == threading.get_ident()

    def test_a_pinned_input_is_left_to_the_pool(self) -> None:
        async def main() -> list[int]:
            await _workers_parked()
            a = pool_where(np.zeros(1))
            b = pool_where(np.ones(1))
            return [int(v) for v in await tiny_gather(a, b)]

        assert threading.get_ident() not in dataflow.run(main, interop_threads=2)

    def test_an_inline_threshold_of_zero_leaves_them_to_the_pool(self) -> None:
        async def main() -> list[int]:
            async with dataflow.Runtime(inline_threshold=0.0, private_pool=True):
                await _workers_parked()
                a = mid_where(np.zeros(1))
                b = mid_where(np.ones(1))
                return [int(v) for v in await tiny_gather(a, b)][:2]

        assert threading.get_ident() not in dataflow.run(main, interop_threads=2)

    def test_a_chain_the_loop_runs_wakes_no_worker(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Each op of a chain the loop runs, awaiting its end, makes the next one ready: it is
        queued without waking a worker (one woken found it taken by the loop, and took the
        GIL and a core from the loop's kernels: an MLP of (32, 256) linear + relu layers ran
        1.9x numpy's time on two inter-op threads, 1.1x on one)."""
        from dataflow import _pool

        woken: list[str] = []
        push = _pool.InteropPool.push_locked

        def counted(pool: Any, task: Task) -> None:
            if pool.idle:
                woken.append(task.name)
            push(pool, task)

        monkeypatch.setattr(_pool.InteropPool, "push_locked", counted)
        chain = _mid_op("chained_mid")

        async def main() -> list[int]:
            await _workers_parked()
            x = chain(np.zeros(1))
            for _ in range(3):
                x = chain(x)
            return [int((await x)[0])]

        assert dataflow.run(main, interop_threads=2) == [threading.get_ident()]
        assert woken == []

    def test_a_chain_the_loop_runs_alone_is_learnt_and_run_at_dispatch(self) -> None:
        """Its ops count as awaited at once (AWAITED_AT_ONCE): after a few forwards the whole
        chain runs as it is dispatched, on the lean path, as with one inter-op thread."""
        chain = _mid_op("learnt_chain")

        async def main() -> list[bool]:
            done = []
            for _ in range(AWAITED_AT_ONCE + 4):
                x = chain(np.zeros(1))
                for _ in range(3):
                    x = chain(x)
                done.append(x.done())
                await tiny_where(x)  # (not the chain's op: it is only run helping)
            return done

        done = dataflow.run(main, interop_threads=2)
        assert not done[0] and done[-2:] == [True, True]

    def test_ops_the_loop_runs_beside_a_worker_are_not_learnt(self) -> None:
        """With a branch on a worker meanwhile, the inputs the loop runs are not counted as
        awaited at once: run at dispatch, they would hold back the dispatch of the branches
        after them."""
        beside = _mid_op("beside_a_worker")
        release = threading.Event()

        def gate(x: Any) -> Any:
            release.wait(5.0)
            return np.array([threading.get_ident()], dtype=np.int64)

        slow = dataflow.op("gated_branch", meta=_ident_meta, handle=Arr, inline=False)(gate)

        async def main() -> int:
            sig = beside(np.zeros(1)).task.sig
            await _workers_parked()
            rt = dataflow.current_runtime()
            assert rt is not None
            for _ in range(AWAITED_AT_ONCE + 2):
                release.clear()
                other = slow(np.zeros(1))
                assert await _yielding_until(lambda: rt._sched.running > 0)
                await tiny_gather(beside(np.zeros(1)))  # the loop runs its input, helping
                release.set()
                await other
            return int(sig.awaited)

        assert dataflow.run(main, interop_threads=2) < AWAITED_AT_ONCE

    def test_a_failed_input_fails_the_awaited_task(self) -> None:
        """A kernel the loop runs as a helper fails as anywhere else: the awaited task gets
        the error, and nothing hangs."""

        async def main() -> None:
            await _workers_parked()
            a = mid_where(np.zeros(1))
            bad = mid_fails(np.zeros(1))
            await tiny_gather(a, bad)

        with pytest.raises(TaskError, match="mid_fails"):
            dataflow.run(main, interop_threads=2)


def _counting_meta(calls: list[Any]) -> Any:
    def meta(x: Any, y: Any) -> ops.TensorSpec:
        calls.append((type(x).__name__, type(y).__name__))
        if np.shape(x) == (13,):
            raise dataflow.OpInputError("counted: 13 is refused")
        return ops.spec_of(x)

    return meta


class TestSignatureCache:
    def test_repeated_call_runs_the_meta_rule_once(self) -> None:
        """The same argument signature reuses the meta rule's result (and a new one does not)."""
        calls: list[Any] = []
        op = ops.define("counted", np.add, _counting_meta(calls))
        x = np.ones(3)
        for _ in range(5):
            op(x, 1.0)
        assert len(calls) == 1
        op(np.ones(4), 1.0)  # another shape
        op(x, 2)  # another scalar type
        op(np.ones(3, np.float32), 1.0)  # another dtype
        assert len(calls) == 4

    def test_dtype_and_class_arguments_are_keyed(self) -> None:
        """``astype(x, np.float32)``: a class or a numpy dtype is keyed by value, so a repeated
        call runs the meta rule once (it ran at every call), and another dtype, byte order
        or class is another signature."""
        calls: list[Any] = []

        def meta(x: Any, dtype: Any) -> ops.TensorSpec:
            calls.append(dtype)
            return ops.TensorSpec(np.shape(x), np.dtype(dtype))

        op = ops.define("cast_counted", lambda x, dtype: np.asarray(x).astype(dtype), meta)
        x = np.ones(3)
        dtypes = (np.float32, np.dtype(np.float32), float, np.dtype(">f8"), np.dtype("<f8"))
        for dtype in dtypes:
            for _ in range(3):
                op(x, dtype)
            for _ in range(2):
                op(x, dtype=dtype)
        # Each once by position and once as a keyword (a signature of its own).
        assert [type(c) for c in calls] == [type(d) for d in dtypes for _ in range(2)]
        assert [str(c) for c in calls] == [str(d) for d in dtypes for _ in range(2)]

    def test_plain_keywords_are_cached_as_the_general_scan_keys_them(self) -> None:
        """Keywords with plain values take the fast path; its key is the one ``_scan`` gives
        them, so a call the general path keys (a container beside them) shares the
        signature, and another keyword value is another signature."""
        calls: list[Any] = []

        def meta(x: Any, *, k: Any = 0) -> ops.TensorSpec:
            calls.append(k)
            if np.shape(x) == (13,):
                raise dataflow.OpInputError("kw_counted: 13 is refused")
            return ops.spec_of(x)

        op = ops.define("kw_counted", lambda x, k=0: x + k, meta)
        x = np.ones(3)
        for _ in range(3):
            op(x, k=1)
        assert calls == [1]
        key = next(iter(op._sigs))
        assert op._scan((x,), {"k": 1})[0] == list(key)
        op(x, k=2)
        op(x, k=1.0)  # another type
        assert calls == [1, 2, 1.0]
        for _ in range(2):  # refused calls are not cached: checked at every call
            with pytest.raises(dataflow.OpInputError, match="13 is refused"):
                op(np.ones(13), k=1)

    def test_flat_sequences_are_keyed_as_the_general_scan_keys_them(self) -> None:
        """A list or tuple of arrays, handles and scalars takes the fast path: its key is the
        one ``_scan`` gives it (the two paths share signatures), another length, shape or
        container type is another signature, and the kernel gets the same container type
        with every handle replaced by its value."""
        calls: list[Any] = []
        seen: list[Any] = []

        def meta(xs: Any, *, axis: int = 0) -> ops.TensorSpec:
            calls.append(len(xs))
            return ops.spec_of(np.concatenate([np.zeros(ops.spec_of(x).shape) for x in xs]))

        def kernel(xs: Any, axis: int = 0) -> Any:
            seen.append(type(xs))
            assert not any(isinstance(x, dataflow.Pending) for x in xs)
            return np.concatenate(xs, axis=axis)

        op = ops.define("seq_counted", kernel, meta)
        a, b = np.ones(2), np.arange(3.0)

        async def main() -> Any:
            h = ops.add(a, 1.0)  # a handle (light: run at dispatch)
            outs = [op([h, b], axis=0) for _ in range(3)]
            key = next(iter(op._sigs))
            assert op._scan(([h, b],), {"axis": 0})[0] == list(key)
            scans = 0
            general = op._scan

            def counted(*args: Any) -> Any:
                nonlocal scans
                scans += 1
                return general(*args)

            op._scan = counted  # type: ignore[assignment]
            outs.append(op((h, b), axis=0))  # a tuple: another signature
            outs.append(op([b, h, b], axis=0))  # another length
            assert scans == 0  # (the fast path: no general scan, no walk at dispatch)
            return [await o for o in outs]

        got = dataflow.run(main)
        for g in got[:4]:
            np.testing.assert_array_equal(g, np.concatenate([a + 1.0, b]))
        np.testing.assert_array_equal(got[4], np.concatenate([b, a + 1.0, b]))
        assert calls == [2, 2, 3]
        # (in any order: the op has no cost rule, so its calls run on the pool's two workers)
        assert sorted(t.__name__ for t in seen) == ["list"] * 4 + ["tuple"]

    def test_a_sequence_without_handles_reaches_the_kernel_as_it_was_passed(self) -> None:
        """A list of plain arrays run at once (an inline op) is the caller's own object in
        the kernel, as on the general path: only a list holding handles is rebuilt with
        their values. (A deferred op's arguments are copied or frozen: ``protect``.)"""
        seen: list[Any] = []

        def kernel(xs: Any) -> Any:
            seen.append(xs)
            return np.concatenate(xs)

        op = ops.define(
            "seq_identity", kernel, lambda xs: ops.spec_of(np.concatenate(xs)), inline=True
        )
        arrays = [np.ones(2), np.zeros(1)]

        async def main() -> Any:
            return await op(arrays)

        np.testing.assert_array_equal(dataflow.run(main), [1.0, 1.0, 0.0])
        assert seen[0] is arrays

    def test_a_sequence_with_a_pending_handle_waits_for_it(self) -> None:
        """A list holding an unfinished input defers the op like a plain pending argument:
        it runs once the input is done, with the value in the list; an input's failure
        reaches it and whoever awaits it."""
        gate = threading.Event()

        def held(x: Any) -> Any:
            assert gate.wait(10)
            return x * 3.0

        def broken(x: Any) -> Any:
            assert gate.wait(10)
            raise ValueError("broken on purpose")

        held_op = dataflow.op("held", meta=ops.spec_of, handle=ops.Tensor, inline=False)(held)
        broken_op = dataflow.op("broken", meta=ops.spec_of, handle=ops.Tensor, inline=False)(broken)

        async def main() -> Any:
            slow = held_op(np.full(3, 2.0))
            joined = ops.concatenate([slow, np.ones(2)])
            assert not slow.done() and not joined.done()
            gate.set()
            return await joined

        np.testing.assert_array_equal(
            dataflow.run(main, interop_threads=2), np.array([6.0, 6.0, 6.0, 1.0, 1.0])
        )

        async def failing() -> Any:
            bad = broken_op(np.ones(2))
            return await ops.stack([np.ones(2), bad])

        with pytest.raises(TaskError, match="broken on purpose"):
            dataflow.run(failing, interop_threads=2)

    def test_a_sequence_with_an_unkeyed_element_takes_the_general_path(self) -> None:
        """Something the fast path does not key (a nested list, another type) inside the
        sequence gives the general scan's answer: right, if not cached."""
        op = ops.define(
            "nested_seq",
            lambda xs: np.asarray(xs[0]) + np.asarray(xs[1]).sum(),
            lambda xs: ops.spec_of(np.asarray(xs[0])),
        )

        async def main() -> Any:
            h = ops.add(np.ones(2), 1.0)
            return await op([h, [np.ones(2), h]])

        np.testing.assert_array_equal(dataflow.run(main), np.full(2, 8.0))  # 2 + (1 + 1 + 2 + 2)

    def test_a_bad_call_raises_every_time(self) -> None:
        """A call the meta rule refuses is never cached: it raises again, at the call."""
        calls: list[Any] = []
        op = ops.define("counted", np.add, _counting_meta(calls))
        for _ in range(3):
            with pytest.raises(dataflow.OpInputError, match="13 is refused"):
                op(np.ones(13), 1.0)
        assert len(calls) == 3

    def test_pending_inputs_are_keyed_by_their_spec(self) -> None:
        """A chain of the same op on same-shaped values is one signature, not one per link."""
        calls: list[Any] = []
        op = ops.define("counted", np.add, _counting_meta(calls))

        async def main() -> Any:
            y: Any = ops.asarray(np.ones(3))
            for _ in range(50):
                y = op(y, 1.0)
            return await y

        np.testing.assert_array_equal(dataflow.run(main), np.full(3, 51.0))
        assert len(calls) == 1

    def test_scalar_values_are_part_of_the_signature(self) -> None:
        """int8 + 1 is cached, and int8 + 1000 still raises at the call: the value is keyed."""
        x = np.ones(3, np.int8)
        assert ops.add(x, 1).dtype == np.int8
        with pytest.raises(dataflow.OpInputError, match="out of bounds for int8"):
            ops.add(x, 1000)
        assert ops.add(x, 1.0).dtype == np.float64
        assert ops.add(x, True).dtype == np.int8

    def test_spec_keys_are_cached_per_spec_and_cleared_with_the_interned_ints(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A call missing its key cache looks its spec's keys up once; the answer is the
        interned ints as before, for one spec or several, None for an unhashable one, and
        new ints (not stale ones) once the interned ints restart."""
        from dataflow import _signature as sg

        a, b = Spec((3, 4), np.dtype(np.float32)), Spec((5,), np.dtype(np.int64))
        ka, kb = sg.spec_key(a), sg.spec_key(b)
        assert sg.spec_keys(a) == (ka,) and sg.spec_keys(a) is sg.spec_keys(a)
        assert sg.spec_keys((a, b)) == (ka, kb)
        assert sg.spec_keys(Spec((3, 4), np.dtype(np.float32))) == (ka,)  # equal, not same
        assert sg.spec_keys([1]) == (None,)  # unhashable: computed, not cached
        assert sg.spec_keys((a, [1])) == (ka, None)
        monkeypatch.setattr(sg, "_MAX_SPECS", len(sg._spec_ids))
        fresh = object()  # a spec never seen: interning it goes past the limit
        kf = sg.spec_key(fresh)  # so the ints restart, and the keys cache with them
        assert sg._keys_of == {} and sg.spec_keys(fresh) == (kf,)
        assert sg.spec_keys(a) == (sg.spec_key(a),) != (ka,)

    def test_unkeyable_arguments_still_give_the_right_result(self) -> None:
        """An argument of another type makes the call uncached, not wrong."""
        calls: list[Any] = []

        class Weird:
            pass

        def kernel(x: Any, w: Any) -> Any:
            return np.asarray(x) + 1

        def meta(x: Any, w: Any) -> ops.TensorSpec:
            calls.append(1)
            return ops.spec_of(x)

        op = ops.define("weird", kernel, meta)
        for _ in range(3):
            np.testing.assert_array_equal(np.asarray(op(np.ones(2), Weird()).result()), [2, 2])
        assert len(calls) == 3


class TestMeasuredTime:
    def test_a_fast_kernel_with_a_big_estimate_moves_inline(self) -> None:
        """Placement follows the measured kernel time once it is known."""
        big = ops.define(
            "big_estimate", _thread, _ident_meta, cost=lambda x: dataflow.Cost(1e12, 0)
        )

        async def main() -> list[int]:
            return [int((await big(np.zeros(1)))[0]) for _ in range(6)]

        where = dataflow.run(main, interop_threads=2)
        assert where[0] != threading.get_ident()  # the estimate: 50 s, so the pool
        assert where[-1] == threading.get_ident()  # measured: microseconds, so inline

    def test_no_cost_rule_means_the_pool_until_timed(self) -> None:
        """Without a cost rule the first run goes to the pool."""
        unknown = dataflow.op("unknown_cost", meta=_ident_meta, handle=Arr)(_thread)

        async def main() -> int:
            return int((await unknown(np.zeros(1)))[0])

        assert dataflow.run(main, interop_threads=2) != threading.get_ident()

    def test_inline_threshold_is_per_runtime(self) -> None:
        """Runtime(inline_threshold=0) sends even tiny ops to the pool; others keep theirs."""
        tiny = dataflow.op(
            "tiny_where2", meta=_ident_meta, handle=Arr, cost=lambda x: dataflow.Cost(1, 8)
        )(_thread)

        async def main() -> int:
            return int((await tiny(np.zeros(1)))[0])

        async def scoped() -> tuple[int, int]:
            inline = await main()
            async with dataflow.Runtime(inline_threshold=0.0, private_pool=True):
                pooled = await main()
            return inline, pooled

        inline, pooled = dataflow.run(scoped, interop_threads=2)
        assert inline == threading.get_ident() and pooled != threading.get_ident()
        assert dataflow.get_inline_threshold() == 50e-6

    def test_numpys_numbers_are_seconds_too(self) -> None:
        """The inline threshold and op_timeout take numpy's numbers as a Cost does, as
        floats: np.float32(1e-4) was refused as "not a number of seconds" (np.float64 taken,
        and kept as a numpy scalar the dispatch compared at every call); a bool is not one."""
        before = dataflow.get_inline_threshold()
        try:
            dataflow.set_inline_threshold(np.float32(1e-4))  # type: ignore[arg-type]
            assert type(dataflow.get_inline_threshold()) is float
            dataflow.set_inline_threshold(np.int64(0))  # type: ignore[arg-type]
            assert dataflow.get_inline_threshold() == 0.0
        finally:
            dataflow.set_inline_threshold(before)
        rt = dataflow.Runtime(inline_threshold=np.float64(1e-4), op_timeout=np.float32(2))  # type: ignore[arg-type]
        assert type(rt._inline_threshold) is float and type(rt.op_timeout) is float
        for bad in (True, np.bool_(True), "1e-4"):
            with pytest.raises(dataflow.DataflowTypeError, match="inline_threshold"):
                dataflow.Runtime(inline_threshold=bad)  # type: ignore[arg-type]
            with pytest.raises(dataflow.DataflowTypeError, match="set_inline_threshold"):
                dataflow.set_inline_threshold(bad)  # type: ignore[arg-type]


def _interval(x: Any, log: list[tuple[float, float]], gate: Any) -> Any:
    t0 = time.perf_counter()
    if gate is not None:
        gate.wait(5)
    else:
        time.sleep(0.01)
    log.append((t0, time.perf_counter()))
    return x


interval = dataflow.op(
    "interval", meta=lambda x, log, gate: ops.spec_of(x), handle=ops.Tensor, inline=False
)(_interval)


class TestMeasuredSeconds:
    def test_the_second_run_replaces_a_slower_first(self) -> None:
        """The first run pays one-off costs: a faster second run replaces it outright."""
        sig = Signature("first_slow", Spec((1,), np.dtype(np.int64)))
        note_seconds(sig, 3e-3)
        assert sig.seconds == 3e-3 and sig.runs == 1
        note_seconds(sig, 65e-6)
        assert sig.seconds == 65e-6 and sig.runs == 2
        note_seconds(sig, 85e-6)  # then a running average
        assert sig.seconds == pytest.approx(65e-6 + 20e-6 * EWMA) and sig.runs == 3

    def test_a_slower_second_run_leaves_the_first(self) -> None:
        sig = Signature("second_slow", Spec((1,), np.dtype(np.int64)))
        note_seconds(sig, 65e-6)
        note_seconds(sig, 3e-3)  # one slow run (a preempted thread) does not take over
        assert sig.seconds == 65e-6 and sig.runs == 2

    def test_an_outlier_counts_as_at_most_outlier_times_the_estimate(self) -> None:
        """A 1 us kernel's sampled run that a 5 ms preemption fell into moves its estimate to
        1.75 us, not past the inline threshold; slow runs that keep coming still lift it."""
        sig = Signature("outlier", Spec((1,), np.dtype(np.int64)))
        note_seconds(sig, 1e-6)
        note_seconds(sig, 1e-6)
        note_seconds(sig, 5e-3)
        assert sig.seconds == pytest.approx(1e-6 * (1 + (OUTLIER - 1) * EWMA))
        assert sig.seconds < dataflow.get_inline_threshold()
        for _ in range(40):
            note_seconds(sig, 5e-3)
        assert sig.seconds == pytest.approx(5e-3, rel=0.05)

    def test_one_slow_sample_does_not_send_a_chain_of_tiny_ops_to_the_pool(self) -> None:
        """A chain of tiny ops with one sampled run slowed 5 ms keeps running inline: before,
        that op went to the pool, every later op of the chain waited for it, and the chain
        ran on a worker through the full task path from then on, 10x slower."""
        calls = [0]

        def kernel(x: Any) -> Any:
            calls[0] += 1
            if calls[0] == 4 * SAMPLE:  # a sampled run (FIRST_RUNS < n, n % SAMPLE == 0)
                time.sleep(5e-3)
            return x + 1

        step = _tiny_step_op("slow_once_step", kernel)

        async def main() -> tuple[list[bool], int]:
            y: Any = np.zeros(1, dtype=np.int64)
            done = []
            for _ in range(8 * SAMPLE):
                y = step(y)
                done.append(y.done())
            return done, int((await y)[0])

        done, value = dataflow.run(main, interop_threads=2)
        assert value == 8 * SAMPLE and all(done)


def _pool_runs(name: str, kernel: Callable[[Any], Any], count: int) -> Signature:
    """``count`` tasks of a new op ``name`` (``kernel``, never inline) dispatched at once on a
    4-thread pool and awaited: the op's signature, as they left it."""
    op = dataflow.op(name, meta=ops.spec_of, handle=ops.Tensor, inline=False)(kernel)

    async def main() -> Signature:
        handles = [op(np.zeros(1)) for _ in range(count)]
        await dataflow.materialize(handles)
        sig: Signature = handles[0].task.sig
        return sig

    return dataflow.run(main, interop_threads=4)


def _count_measured(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the signatures whose pool runs are measured for the GIL from now on, one
    per run (``Execution._measured`` spied on)."""
    from dataflow._scheduler._execution import Execution

    measured: list[str] = []
    real = Execution._measured

    def counting(self: Any, sig: Signature, *args: Any) -> Any:
        measured.append(sig.name)
        return real(self, sig, *args)

    monkeypatch.setattr(Execution, "_measured", counting)
    return measured


class TestGilLane:
    def test_overlap_slowdown_decides(self) -> None:
        """Runs overlapped and 3x slower than the best mark a signature serial; 1.1x frees it."""
        sig = Signature("k")
        note_overlap(sig, 0.01, 0.0)  # the best time, alone
        for _ in range(12):
            note_overlap(sig, 0.03, 1.0)
        assert sig.serial and sig.gil == pytest.approx(2.0)
        sig.calls = 256  # the next measured run is a probe
        for _ in range(16):
            note_overlap(sig, 0.011, 1.0)
        assert not sig.serial

    def test_only_time_off_the_cpu_counts_as_a_wait_for_the_gil(self) -> None:
        """A thread waiting for the GIL sleeps: a run twice its best beside another, on a
        CPU the whole time (a slower core, not the GIL), reads g = 0 and is never marked
        serial; the same run off the CPU for the extra time reads g = 1, and 2.5x reads past
        the mark. Without the thread's CPU time the run's wall time counts as before."""
        sig = Signature("on_cpu")
        note_overlap(sig, 0.01, 0.0)  # the best time, alone
        for _ in range(16):
            note_overlap(sig, 0.02, 1.0, 0.02)
        assert sig.gil == pytest.approx(0.0) and not sig.serial
        waits = Signature("waits")
        note_overlap(waits, 0.01, 0.0)
        for _ in range(16):
            note_overlap(waits, 0.02, 1.0, 0.01)
        assert waits.gil == pytest.approx(1.0) and not waits.serial  # (under the mark)
        for _ in range(16):
            note_overlap(waits, 0.025, 1.0, 0.01)
        assert waits.gil == pytest.approx(1.5) and waits.serial
        # Partly on the CPU: only the time off it counts (0.025 s wall, 0.012 s on a CPU:
        # 0.002 s past the best ran, 0.013 s waited).
        part = Signature("part")
        note_overlap(part, 0.01, 0.0)
        for _ in range(16):
            note_overlap(part, 0.025, 1.0, 0.012)
        assert part.gil == pytest.approx(1.3)
        unknown = Signature("unknown")
        note_overlap(unknown, 0.01, 0.0)
        for _ in range(16):
            note_overlap(unknown, 0.02, 1.0)
        assert unknown.gil == pytest.approx(1.0)

    def test_the_cpu_share_of_overlapped_runs_is_folded_in(self) -> None:
        """A run beside others folds its CPU share into ``cpu_share`` (1 until measured); a
        run alone, or too short to say anything, does not."""
        sig = Signature("k")
        assert sig.cpu_share == 1.0
        note_overlap(sig, 0.01, 0.0, 0.002)  # alone: its share says nothing about the GIL
        note_overlap(sig, 20e-6, 3.0, 1e-6)  # too short to measure
        assert sig.cpu_share == 1.0
        for _ in range(20):
            note_overlap(sig, 0.01, 1.0, 0.005)  # half of it spent waiting for the GIL
        assert sig.cpu_share == pytest.approx(0.5, abs=0.01)
        for _ in range(20):
            note_overlap(sig, 0.01, 1.0, 0.02)  # (CPU time over wall, from a second thread)
        assert sig.cpu_share == pytest.approx(1.0, abs=0.01)

    def test_a_run_beside_a_kernel_of_the_loops_does_not_fold_its_cpu_share(self) -> None:
        """``share=False`` (the loop ran a kernel of its own beside the run: one thread more
        than the pool's on the cores) leaves ``cpu_share`` as it was; the run still counts
        for the GIL estimate."""
        sig = Signature("k")
        note_overlap(sig, 0.01, 0.0, 0.01)
        for _ in range(20):
            note_overlap(sig, 0.01, 1.0, 0.002, share=False)
        assert sig.cpu_share == 1.0 and len(sig.overlaps) == GIL_WINDOW
        note_overlap(sig, 0.01, 1.0, 0.002)
        assert sig.cpu_share < 1.0

    @pytest.mark.parametrize("loop_kernel", ["none", "starts during the run", "runs at its start"])
    def test_a_pool_run_tells_whether_the_loop_ran_a_kernel_beside_it(
        self, monkeypatch: pytest.MonkeyPatch, loop_kernel: str
    ) -> None:
        """A measured pool run folds its CPU share only if no kernel the loop ran itself
        (``loop_kernels``: odd while one runs) started or was running during it."""
        from dataflow._scheduler import _execution

        seen: list[bool] = []

        def spy(sig: Signature, *args: Any, share: bool = True) -> None:
            if sig.name == "beside_loop":
                seen.append(share)

        monkeypatch.setattr(_execution, "note_overlap", spy)
        box: dict[str, Any] = {}

        def kernel(x: Any) -> Any:
            sched = box.get("sched")
            if sched is not None and loop_kernel == "starts during the run":
                sched.loop_kernels += 1  # the loop takes a kernel while this one runs
            return x + 1.0

        op = ops.define(
            "beside_loop",
            kernel,
            lambda x: ops.spec_of(x),
            inline=False,
            cost=lambda x: dataflow.Cost(1e9, 0),  # long enough to be measured
        )

        async def main() -> None:
            warm = op(np.zeros(1))
            await warm
            rt = warm.task.runtime
            assert rt is not None
            sched = rt._sched
            sig = warm.task.sig
            sig.seconds, sig.runs = 1e-3, WARM_UP + 1  # measured, past its warm-up
            sched.loop_kernels = 1 if loop_kernel == "runs at its start" else 0
            box["sched"] = sched
            await op(np.zeros(1))

        dataflow.run(main, interop_threads=2)
        assert seen == [loop_kernel == "none"]

    def test_the_cores_the_process_used_give_a_second_gil_estimate(self) -> None:
        """On many cores a run's process CPU time over its wall time says how many cores the
        process used: about one for GIL-bound kernels however many run, all of them for
        GIL-free ones. On the scale of g: 0 when it used every core it could, past the serial
        mark 1.5 under SERIAL_PARALLEL of them, and each extra core it could use only if a
        kernel beside it (or the machine) allowed it."""
        # 16 cores, 15 others: 1.1 cores used (16 GIL-bound LSTM directions, measured).
        assert parallel_gil(0.01, 15.0, 0.011, 16) > SERIAL_ABOVE
        assert parallel_gil(0.01, 15.0, 0.16, 16) == pytest.approx(0.0)  # all 16: GIL-free
        # At the threshold fraction of the extra cores (2 beside it), the serial mark exactly.
        edge = 0.01 * (1.0 + SERIAL_PARALLEL * 2)
        assert parallel_gil(0.01, 2.0, edge, 16, blocked=True) == pytest.approx(SERIAL_ABOVE)
        # Only the cores there are count: 8 others on 4 cores could use 3 more, not 8.
        assert parallel_gil(0.01, 8.0, 0.04, 4) == pytest.approx(0.0)
        assert parallel_gil(0.01, 8.0, 0.01, 4) > SERIAL_ABOVE  # one core of four
        # Not known whether the thread blocked: a process that used 2 of 16 cores (a
        # container's CPU quota, a loaded machine) was held back by something else than the
        # GIL alone: at most the free mark.
        assert parallel_gil(0.01, 15.0, 0.02, 16) <= 1.0

    def test_the_gil_bound_runs_measured_on_a_16_core_vm_read_serial(self) -> None:
        """Seven or eight GIL-bound LSTM directions side by side on a 16-core VM (2026-11-27,
        recorded): each thread ran 0.21-0.41 of its run's wall time and the process 1.4-2.3
        cores (taking turns on the GIL costs CPU time there); with g reading 1.0 the forward
        ran at twice numpy's time for 60 forwards. Knowing the threads blocked, these read
        serial."""
        recorded = [  # (wall, others, thread CPU / wall, process CPU / wall)
            (12.47e-3, 6.8, 0.21, 1.59),  # (50, 1, 128)
            (8.92e-3, 6.9, 0.25, 1.99),
            (11.27e-3, 6.2, 0.22, 2.14),  # (20, 1, 256)
            (8.13e-3, 6.9, 0.41, 2.16),
            (9.21e-3, 6.8, 0.32, 2.26),
            (41.8e-3, 6.8, 0.27, 2.14),  # (50, 4, 128)
            (33.5e-3, 7.0, 0.31, 2.21),
        ]
        for wall, others, share, busy in recorded:
            cpu, process = share * wall, busy * wall
            assert parallel_gil(wall, others, process, 16, cpu, blocked=True) > SERIAL_ABOVE
            # Without the switch count they read at most the free mark, as before.
            assert parallel_gil(wall, others, process, 16, cpu) <= 1.0

    def test_other_waits_than_the_gil_say_nothing(self) -> None:
        """A run that never blocked was preempted (a GIL-free kernel on a loaded machine);
        one whose process mostly idled, or whose thread barely ran, waited for something else
        (a sleep, I/O). All read 0, whatever cores the process used."""
        wall, others = 0.01, 7.0
        # GIL-free kernels starved of cores: 2 of 16 used, the threads never blocked.
        assert parallel_gil(wall, others, 0.02, 16, 0.0025, blocked=False) == 0.0
        # Sleeping kernels: the process idle, the thread off the CPU but blocked.
        assert parallel_gil(wall, others, 0.001, 16, 0.0001, blocked=True) == 0.0
        # A sleeping kernel beside a busy process: its thread ran under a quarter of an
        # even share of the run.
        assert parallel_gil(wall, others, 0.011, 16, 0.0002, blocked=True) == 0.0
        # The same process, a thread that ran its share: a wait for the GIL.
        assert parallel_gil(wall, others, 0.011, 16, 0.0015, blocked=True) > SERIAL_ABOVE

    def test_dispatcher_overlap_is_the_others_time_on_the_cpu(self) -> None:
        """A lone worker's overlap with the dispatching thread: the share of the run the
        process's other threads were on a CPU while the worker was not."""
        assert dispatcher_overlap(1.0, 1.0, 1.0) == 0.0  # the worker alone, on the CPU
        assert dispatcher_overlap(1.0, 0.4, 1.0) == pytest.approx(0.6)  # waited for the GIL
        assert dispatcher_overlap(1.0, 0.4, 0.4) == 0.0  # the whole process was off the CPU
        assert dispatcher_overlap(1.0, 0.4, 2.0) == pytest.approx(0.6)  # BLAS threads too
        assert dispatcher_overlap(1.0, 1.2, 1.3) == 0.0  # clock granularity: never negative
        assert dispatcher_overlap(0.0, 0.0, 0.0) == 0.0

    @pytest.mark.parametrize("case", ["gil-bound", "sleeping", "preempted"])
    def test_one_thread_learns_a_kernel_gil_bound_beside_the_dispatcher(
        self, case: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With one inter-op thread no kernel overlaps another, so the busy integral sees
        nothing; the time the dispatching thread was on a CPU while the worker was not is
        their overlap. Runs alone (1 ms, on the CPU throughout) alternate with runs the worker
        spent 60% off the CPU: when those took 2.5x as long while the dispatcher ran (it
        waited for the GIL) the kernel is marked serial; when they took no longer (it was
        off the CPU sleeping, say, not waiting), or when the whole process was off the CPU
        (other processes took the machine), it is not. (Thread and process CPU times are
        fed: a real convoy with the dispatching thread depends on the OS's scheduling.)"""
        from dataflow._scheduler import _execution

        clocks = {"thread": [0, 0.0, 0.0], "process": [0, 0.0, 0.0]}  # calls, now, next

        def clock(name: str) -> Callable[[], float]:
            def read() -> float:  # called before and after each measured run
                c = clocks[name]
                c[0] += 1
                if c[0] % 2 == 0:
                    c[1] += c[2]
                return c[1]

            return read

        monkeypatch.setattr(_execution, "_thread_time", clock("thread"))
        monkeypatch.setattr(_execution, "_process_time", clock("process"))

        def kernel(x: Any, beside: bool) -> Any:
            wall = 0.0025 if beside and case != "sleeping" else 0.001
            time.sleep(wall)
            mine = 0.4 * wall if beside else wall  # this thread's CPU time in the run
            clocks["thread"][2] = mine
            # The dispatcher ran beside it throughout, except when the machine was taken.
            clocks["process"][2] = mine if case == "preempted" else wall
            return x

        op = dataflow.op(
            f"beside_loop_{case}",
            meta=lambda x, beside: ops.spec_of(x),
            handle=ops.Tensor,
            inline=False,
        )(kernel)

        async def main() -> Signature:
            sig: Signature | None = None
            for i in range(44):
                h = op(np.zeros(1), bool(i % 2))
                await h
                sig = h.task.sig
            assert sig is not None
            return sig

        sig = dataflow.run(main, interop_threads=1)
        assert sig.serial is (case == "gil-bound")

    def test_contended_gil_bound_runs_on_many_cores_are_marked_serial(self) -> None:
        """Every run contended, so its slowdown against the (contended) best reads g = 0.1,
        yet the process used one core of sixteen: serial. The same runs measured without the
        process's CPU time, on a 2-core machine or beside under 2 others stay free, and
        GIL-free runs that used the cores stay free too."""

        def runs(process: float | None, cores: int, others: float = 15.0) -> Signature:
            sig = Signature("k")
            note_overlap(sig, 0.010, 0.0)  # the best time (itself contended)
            for _ in range(16):
                note_overlap(sig, 0.011, others, 0.0006, process, cores)
            return sig

        assert runs(0.011, 16).serial  # 1 core used of 16
        assert not runs(None, 16).serial  # not measured: g alone, 0.1
        assert not runs(0.011, 2).serial  # a 2-core machine: g alone decides there
        assert not runs(0.011, 16, others=1.5).serial  # too few beside it to tell
        assert not runs(0.15, 16).serial  # 15 cores used: GIL-free

    def test_a_serial_mark_from_the_cores_is_lifted_by_probes_that_use_them(self) -> None:
        sig = Signature("k")
        note_overlap(sig, 0.010, 0.0)
        for _ in range(16):
            note_overlap(sig, 0.011, 15.0, 0.0006, 0.011, 16)
        assert sig.serial
        sig.calls = PROBE  # every measured run below is a probe
        for _ in range(16):
            note_overlap(sig, 0.011, 15.0, 0.01, 0.15, 16)
        assert not sig.serial

    def test_a_few_or_unshared_runs_decide_nothing(self) -> None:
        """Under 12 overlapped runs, or runs that were alone, leave a signature free."""
        sig = Signature("k")
        note_overlap(sig, 0.01, 0.0)
        for _ in range(11):
            note_overlap(sig, 0.05, 1.0)
        for _ in range(50):
            note_overlap(sig, 0.05, 0.1)
        assert not sig.serial

    @pytest.mark.parametrize("cores", [2, 16])
    def test_pool_runs_read_the_process_cpu_time_on_many_cores(
        self, cores: int, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Pool runs beside two or more others read the process's CPU time where the machine
        has the cores for it (here pretended: 16), and give their second GIL estimate from
        it; on 2 cores they do not (the estimate stays 0)."""
        from dataflow._scheduler import _execution

        monkeypatch.setattr(_execution, "_CORES", cores)

        def spin(x: Any) -> Any:  # pure Python: holds the GIL
            end = time.perf_counter() + 0.002
            while time.perf_counter() < end:
                pass
            return x

        # Preempted every 0.2 ms, the four workers' kernels take turns on the GIL all along;
        # at the default 5 ms each 2 ms kernel could run whole before the next one started,
        # and the runs then overlapped one other at times, not two (a flaky test).
        switch = sys.getswitchinterval()
        sys.setswitchinterval(2e-4)
        try:
            sig = _pool_runs("busy_gil", spin, 60)
        finally:
            sys.setswitchinterval(switch)
        estimates = [p for _, o, p in sig.overlaps if o >= 2.0]
        if cores == 2:
            assert all(p == 0.0 for _, _, p in sig.overlaps)
        else:  # four Python loops side by side used about one core between them
            assert estimates and max(estimates) > SERIAL_ABOVE, sig.overlaps

    def test_kernels_that_sleep_on_many_cores_are_not_taken_for_gil_bound(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Kernels that wait for something else than the GIL (here they sleep, as I/O does)
        keep the process off the CPU, as GIL-bound ones keep it on one core; read by the
        process's CPU time alone they looked GIL-bound on many cores and were serialized. On
        a pretended 16 cores they give no serial estimate and stay free."""
        from dataflow._scheduler import _execution

        monkeypatch.setattr(_execution, "_CORES", 16)

        def nap(x: Any) -> Any:
            time.sleep(0.002)
            return x

        sig = _pool_runs("napping", nap, 80)
        measured = [p for _, o, p in sig.overlaps if o >= 2.0]
        assert measured and max(measured) == 0.0, sig.overlaps
        assert not sig.serial

    def test_serial_kernels_never_overlap_and_free_ones_still_do(self) -> None:
        """With a serial signature, its kernels run one at a time on a 2-thread pool, while
        a GIL-free kernel runs beside them."""
        log: list[tuple[float, float]] = []

        async def main() -> None:
            first = interval(np.zeros(1), log, None)
            await first
            first.task.sig.serial = True  # as if measured GIL-bound
            gate = threading.Event()
            serial = [interval(np.full(1, float(i)), log, None) for i in range(4)]
            assert all(h.task.sig is first.task.sig for h in serial)
            other = ops.define("free_op", lambda x, g: (g.set(), x)[1], lambda x, g: x.spec,
                               inline=False)  # fmt: skip
            opened = other(serial[0], gate)
            waiter = interval(np.zeros(1), [], gate)  # another signature (gate): not serial
            await dataflow.materialize([*serial, opened, waiter])

        dataflow.run(main, interop_threads=2)
        spans = sorted(log[1:])
        assert len(spans) == 4
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))

    def test_only_kernels_long_enough_to_say_something_are_measured_on_every_pool_run(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A pool run is measured for the GIL (``_measured``: the pool's busy integral, the
        thread's clocks) only when the kernel is estimated at MEASURE_POOL_ABOVE or more; a
        kernel of a few microseconds forced to the pool is timed on sampled runs only, as
        its measurement would be thrown away (shorter than MIN_MEASURED)."""
        measured = _count_measured(monkeypatch)

        def nap(x: Any) -> Any:
            # Off the GIL, estimated above the mark; and long enough that the awaiting loop
            # leaves every run to the workers (a run there is not a pool run).
            time.sleep(2 * AWAIT_HERE_SECONDS)
            return x

        tiny = _pool_runs("tiny_pool", lambda x: x, 200)
        assert tiny.seconds < MEASURE_POOL_ABOVE
        # (An op without a cost rule starts from a long estimate: its first run is measured.)
        assert measured.count("tiny_pool") <= FIRST_RUNS and tiny.overlaps == []
        long = _pool_runs("napping_pool", nap, 40)
        assert long.seconds >= MEASURE_POOL_ABOVE
        # Every run past the first timed ones (which set the estimate) was measured.
        assert measured.count("napping_pool") >= 40 - FIRST_RUNS

    def test_a_forked_plain_function_is_not_measured_for_the_gil(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Each fork of a plain function has a signature of its own (Signature.measure is
        False): its pool run is timed, never measured for the GIL lane, whose measurement
        (two system calls on a worker) would be thrown away with the signature."""
        measured = _count_measured(monkeypatch)

        def forked(x: int) -> int:
            time.sleep(2 * AWAIT_HERE_SECONDS)
            return x

        async def main() -> list[int]:
            futs = [dataflow.fork(forked, i) for i in range(8)]
            return [await f for f in futs]

        assert dataflow.run(main, interop_threads=2) == list(range(8))
        assert not any(name.endswith("forked") for name in measured), measured

    def test_a_failing_serial_kernel_passes_the_lane_on(self) -> None:
        """A serial kernel that raises still hands the lane to the next one."""

        def kernel(x: Any, bad: bool) -> Any:
            if bad:
                raise ValueError("no")
            return x

        flaky = dataflow.op(
            "flaky", meta=lambda x, bad: ops.spec_of(x), handle=ops.Tensor, inline=False
        )(kernel)

        async def main() -> int:
            warm = flaky(np.zeros(1), False)
            await warm
            warm.task.sig.serial = True
            handles = [flaky(np.zeros(1), bool(i % 2)) for i in range(6)]
            ok = 0
            for h in handles:
                try:
                    await h
                    ok += 1
                except TaskError:
                    pass
            return ok

        assert dataflow.run(main, interop_threads=2) == 3


class TestSerialRunsWhereNeeded:
    """A GIL-bound kernel shorter than a GIL switch interval runs on the thread that needs it."""

    def test_rule(self) -> None:
        """Tiny: inline; serial and short: inline, except probe runs; serial and long: pool."""
        sig = Signature("k")
        sig.seconds = 1e-3
        assert not runs_inline(sig, 50e-6)
        sig.serial = True
        assert runs_inline(sig, 50e-6)
        sig.calls = PROBE - 1  # the next run is a probe: it goes to the pool to measure
        assert not runs_inline(sig, 50e-6)
        sig.calls = 0
        sig.seconds = 2 * sys.getswitchinterval()
        assert not runs_inline(sig, 50e-6)
        sig.seconds = 1e-6
        sig.serial = False
        assert runs_inline(sig, 50e-6)

    def test_serial_kernel_runs_on_the_dispatching_thread(self) -> None:
        """Once its signature is serial, a 1 ms kernel runs on the event loop's thread (no
        hand-off to a worker), and what it makes ready goes on there too."""
        where: list[int] = []

        def kernel(x: Any) -> Any:
            where.append(threading.get_ident())
            time.sleep(1e-3)  # keeps its measured time over the inline threshold
            return x + 1.0

        slowish = dataflow.op("slowish", meta=lambda x: ops.spec_of(x), handle=ops.Tensor)(kernel)

        async def main() -> int:
            warm = slowish(np.zeros(1))
            await warm
            sig = warm.task.sig
            sig.seconds, sig.serial = 1e-3, True  # as if measured: 1 ms, GIL-bound
            where.clear()
            y = slowish(slowish(np.zeros(1)))
            await y
            return threading.get_ident()

        loop_thread = dataflow.run(main, interop_threads=2)
        assert where == [loop_thread, loop_thread]

    def test_a_serial_kernel_run_here_counts_as_a_running_kernel(self) -> None:
        """A serial kernel run on the dispatching thread's lean path counts among the pool's
        running kernels while it runs (the busy integral), as a pool run does: a probe (the
        one run in PROBE that goes to the pool to measure the GIL again) running beside it
        then reads that overlap. Uncounted, a probe read none beside runs that all happen on
        the loop, measured nothing, and the serial mark was never lifted."""
        busy: list[int] = []
        overlap: list[float] = []

        def kernel(x: Any) -> Any:
            time.sleep(2e-3)
            return x + 1.0

        op = dataflow.op("counted_here", meta=lambda x: ops.spec_of(x), handle=ops.Tensor)(kernel)

        async def main() -> tuple[int, int]:
            warm = op(np.zeros(1))
            await warm
            sig = warm.task.sig
            rt = warm.task.runtime
            assert rt is not None
            sched = rt._sched
            pool = sched.pool
            assert pool is not None
            sig.seconds, sig.serial = 2e-3, True  # as if measured: 2 ms, GIL-bound
            sig.calls = 2 * PROBE  # no probe among the next calls

            def watch(x: Any) -> Any:  # the kernel, watching the pool's count while it runs
                busy.append(pool.busy)
                with GRAPH_LOCK:
                    i0 = pool.measure_begin_locked()
                t0 = time.perf_counter()
                out = kernel(x)
                wall = time.perf_counter() - t0
                with GRAPH_LOCK:
                    i1 = pool.measure_end_locked()
                overlap.append((i1 - i0) / wall)
                return out

            before = pool.busy
            await op(np.zeros(1))  # the lean path, counted
            value = sched._serial_here(sig, watch, (np.zeros(1),), None, 2 * PROBE + 1)
            assert value[0] == 1.0
            return before, pool.busy

        before, after = dataflow.run(main, interop_threads=2)
        assert before == after == 0
        assert busy == [1]
        assert overlap[0] == pytest.approx(1.0, abs=0.05)

    def test_a_serial_kernel_run_here_reads_the_callers_array(self) -> None:
        """Run on the dispatching thread, a serial kernel reads its argument at once: it gets
        the caller's own array, neither copied nor frozen (the protection of ops that run
        later is not needed)."""
        seen: list[tuple[int, bool]] = []

        def kernel(x: Any) -> Any:
            seen.append((id(x), bool(x.flags.writeable)))
            time.sleep(1e-3)
            return x + 1.0

        op = dataflow.op("reads_here", meta=lambda x: ops.spec_of(x), handle=ops.Tensor)(kernel)
        a = np.arange(4.0)

        async def main() -> tuple[int, int]:
            warm = op(np.zeros(4))
            await warm
            sig = warm.task.sig
            sig.seconds, sig.serial = 1e-3, True  # as if measured: 1 ms, GIL-bound
            seen.clear()
            sched = dataflow.current_runtime()._sched  # type: ignore[union-attr]
            inline, pooled = sched.inline_run, sched.tasks_run
            np.testing.assert_array_equal(await op(a), a + 1.0)
            return sched.inline_run - inline, sched.tasks_run - pooled

        # With the GIL lane free it ran on the small ops' lean path: at dispatch, no task
        # record until its value existed.
        assert dataflow.run(main, interop_threads=2) == (1, 0)
        assert seen == [(id(a), True)]

    def test_a_serial_kernel_waiting_for_the_lane_is_protected(self) -> None:
        """A serial kernel that would run here but finds the GIL lane taken waits for it, so
        it runs later: its small array argument is copied at the call, as for any queued op,
        and a write by the caller meanwhile does not change its result."""
        gate = threading.Event()

        def hold(x: Any, g: threading.Event) -> Any:
            g.wait(5.0)
            return x

        def add_one(x: Any) -> Any:
            return x + 1.0

        blocker = dataflow.op(
            "lane_holder", meta=lambda x, g: ops.spec_of(x), handle=ops.Tensor, inline=False
        )(hold)
        quick = dataflow.op("lane_waiter", meta=lambda x: ops.spec_of(x), handle=ops.Tensor)(
            add_one
        )
        a = np.arange(4.0)

        async def main() -> Any:
            opened = threading.Event()
            opened.set()
            warm_b, warm_q = blocker(np.zeros(4), opened), quick(np.zeros(4))
            await dataflow.materialize([warm_b, warm_q])
            warm_b.task.sig.serial = True  # GIL-bound and long: on the pool, holding the lane
            warm_b.task.sig.seconds = 1.0
            q = warm_q.task.sig
            q.seconds, q.serial = 1e-3, True  # GIL-bound and short: here, through the lane
            held = blocker(np.zeros(4), gate)
            deadline = time.monotonic() + 5.0
            while held.task.state != RUNNING and time.monotonic() < deadline:
                await asyncio.sleep(1e-3)
            y = quick(a)
            a[:] = 100.0  # after the call: the kernel must not see it
            gate.set()
            return await y

        got = dataflow.run(main, interop_threads=2)
        np.testing.assert_array_equal(got, np.arange(4.0) + 1.0)


class TestSynchronousMode:
    def test_everything_runs_on_the_calling_thread_in_program_order(self) -> None:
        """interop_threads=0: no pool, every op and plain fork runs at once, in order."""
        order: list[str] = []

        def step(name: str) -> Any:
            order.append(name)
            return np.array([threading.get_ident()], dtype=np.int64)

        note = dataflow.op("note", meta=lambda n: _ident_meta(n), handle=Arr, inline=False)(step)

        async def main() -> list[int]:
            a = note("a")
            b = dataflow.fork(step, "b")
            c = note("c")
            assert not [t for t in threading.enumerate() if t.name.startswith("interop")]
            return [int((await h)[0]) for h in (a, b, c)]

        where = dataflow.run(main, interop_threads=0)
        assert order == ["a", "b", "c"]
        assert set(where) == {threading.get_ident()}


def _liar_kernel(x: Any, shape: Any, dtype: Any) -> Any:
    return np.zeros(shape, dtype)


liar = dataflow.op(
    "liar",
    meta=lambda x, shape, dtype: ops.TensorSpec(np.shape(x), np.dtype(np.float64)),
    handle=ops.Tensor,
)(_liar_kernel)


class TestValueCheck:
    @pytest.mark.parametrize("inline", [True, False])
    def test_wrong_shape_fails_the_task(self, inline: bool) -> None:
        """A kernel returning another shape than declared fails its task, naming both."""
        op = dataflow.op(
            "liar2",
            meta=lambda x: ops.TensorSpec((3,), np.dtype(np.float64)),
            handle=ops.Tensor,
            inline=inline,
        )(lambda x: np.zeros(7))

        async def main() -> None:
            y = op(np.ones(3))
            z = ops.add(y, 1.0)
            with pytest.raises(TaskError) as info:
                await z
            assert isinstance(info.value.__cause__, OpOutputError)
            assert "liar2" in str(info.value.__cause__)
            assert "float64[7]" in str(info.value.__cause__)
            assert "float64[3]" in str(info.value.__cause__)

        dataflow.run(main, interop_threads=2)

    @pytest.mark.parametrize("inline", [True, False])
    def test_a_wrong_output_of_several_is_named_by_its_index(self, inline: bool) -> None:
        """Of an op's several outputs, the one that does not match its spec is named by its
        index (the others matching); a tuple of another length is refused as a whole."""
        spec = ops.TensorSpec((2,), np.dtype(np.float64))
        second_wrong = dataflow.op(
            "liar_multi", meta=lambda x: (spec, spec, spec), handle=ops.Tensor, inline=inline
        )(lambda x: (np.zeros(2), np.zeros(2, np.float32), np.zeros(2)))
        short = dataflow.op(
            "liar_short", meta=lambda x: (spec, spec), handle=ops.Tensor, inline=inline
        )(lambda x: (np.zeros(2),))

        async def main() -> None:
            with pytest.raises(TaskError) as info:
                await second_wrong(np.ones(2))[2]
            assert isinstance(info.value.__cause__, OpOutputError)
            assert "output 1:" in str(info.value.__cause__)
            assert "float32[2]" in str(info.value.__cause__)
            with pytest.raises(TaskError, match="a tuple of 2 outputs"):
                await short(np.ones(2))[0]

        dataflow.run(main, interop_threads=2)

    def test_wrong_dtype_fails_the_task(self) -> None:
        """Declared float64, returned uint8: the task fails instead of overflowing later."""

        async def main() -> None:
            with pytest.raises(TaskError, match=r"uint8\[3\].*declared float64\[3\]"):
                await liar(np.ones(3), (3,), np.uint8)

        dataflow.run(main)

    def test_checked_outside_a_runtime(self) -> None:
        """Eager mode checks too, raising at the call."""
        with pytest.raises(TaskError, match="the kernel returned float64\\[2\\]"):
            liar(np.ones(3), (2,), np.float64)

    def test_checked_in_graph_runs(self) -> None:
        """A graph node's kernel is checked like an eager op's."""

        async def f(x: Any) -> Any:
            return liar(x, (5,), np.float64)

        graph = dataflow.trace(f, np.ones(3), check=False)
        with pytest.raises(TaskError, match="liar"):
            graph.run(np.ones(3))

    def test_honest_ops_pass(self) -> None:
        """Every ops kernel in a small program matches its declared spec."""

        async def main() -> Any:
            x = ops.asarray(np.arange(12.0).reshape(3, 4))
            return await ops.sum(ops.tanh(x @ x.T) * 2, axis=0)

        assert dataflow.run(main).shape == (3,)


# Untyped handles on the API, to make the wrong calls that a type checker would catch.
_Runtime: Any = dataflow.Runtime
_op: Any = dataflow.op


class TestValidation:
    @pytest.mark.parametrize(
        ("make", "pattern"),
        [
            (lambda: _Runtime(private_pool="no"), r"private_pool=\) must be True or"),
            (lambda: _Runtime(simulate=5), r"simulate=\) must be a function"),
            (lambda: _Runtime(inline_threshold="x"), r"inline_threshold=\) must be a"),
            (lambda: _op(123, meta=ops.spec_of, handle=ops.Tensor), r"name must be a"),
            (lambda: _op("x", meta=5, handle=ops.Tensor)(np.negative), r"meta must be"),
            (lambda: _op("x", meta=ops.spec_of, handle=None)(np.negative), r"handle"),
            (
                lambda: _op("x", meta=ops.spec_of, handle=ops.Tensor, cost=3)(abs),
                r"cost must be a function \(or None\)",
            ),
            (lambda: _op("x", meta=ops.spec_of, handle=ops.Tensor)(5), r"decorates the"),
            (
                lambda: _op("x", meta=ops.spec_of, handle=ops.Tensor, inline="no")(abs),
                r"inline must be True, False or None",
            ),
        ],
    )
    def test_bad_arguments_are_refused_at_the_call(self, make: Any, pattern: str) -> None:
        """A wrong type for a flag or a function is a TypeError naming the argument."""
        with pytest.raises(TypeError, match=pattern) as info:
            make()
        assert isinstance(info.value, dataflow.DataflowError)

    @pytest.mark.parametrize("declare", [_op, dataflow.Op])
    def test_an_empty_op_name_is_a_value_error(self, declare: Any) -> None:
        """An op's name of the right type but empty is a ValueError (a wrong type stays a
        TypeError, above), from the decorator and from ``Op`` itself."""
        with pytest.raises(dataflow.DataflowValueError, match=r"name must be a non-empty str"):
            if declare is _op:
                declare("", meta=ops.spec_of, handle=ops.Tensor)
            else:
                declare("", np.negative, ops.spec_of, ops.Tensor)

    def test_sync_with_says_async_with(self) -> None:
        """`with dataflow.Runtime():` says to use `async with`."""
        with (
            pytest.raises(dataflow.DataflowError, match=r"use `async with dataflow\.Runtime"),
            _Runtime(),
        ):
            pass

    def test_awaiting_on_another_loop_is_refused(self) -> None:
        """A handle awaited from a loop in another thread is a DataflowError, not a hang."""
        got: list[Any] = []

        async def owner() -> None:
            gate = threading.Event()
            h = pool_where(gated(np.zeros(1), gate))

            def other() -> None:
                async def steal() -> None:
                    try:
                        await h
                    except dataflow.DataflowError as exc:
                        got.append(exc)

                asyncio.run(steal())

            t = threading.Thread(target=other)
            t.start()
            while t.is_alive():
                await asyncio.sleep(0.01)
            gate.set()
            await h

        dataflow.run(owner)
        assert got and "another event loop" in str(got[0])


class TestRequestHoldsOnlyUnstarted:
    """A request (a coroutine on the loop) keeps what it dispatched only until it starts: the
    tasks a cancellation may still drop, in dispatch order (``_requests._Owner``)."""

    @staticmethod
    def _owner(rt: Any) -> Any:
        current = asyncio.current_task()
        return rt._sched._owners[current]

    def test_a_started_op_and_its_value_are_freed_while_the_request_goes_on(self) -> None:
        """Without the garbage collector: the request's own bookkeeping lets go of a task
        when it starts, so the value goes with the last handle."""
        import gc
        import weakref

        refs: list[weakref.ref[Any]] = []

        async def main() -> None:
            rt = dataflow.current_runtime()
            x = np.arange(1000.0)
            h = neg_pool(x)
            owner = self._owner(rt)
            value = await h
            refs.append(weakref.ref(value))
            assert h._t.id not in owner.live  # it ran: no longer the request's to drop
            del value, h
            assert refs[0]() is None
            assert not owner.live

        gc.disable()
        try:
            dataflow.run(main, interop_threads=2)
        finally:
            gc.enable()

    def test_unstarted_tasks_stay_in_dispatch_order_until_they_start(self) -> None:
        async def main() -> None:
            rt = dataflow.current_runtime()
            gate = threading.Event()
            first = gated(np.zeros(1), gate)  # holds the pool's only worker
            later = [neg_pool(np.full(1, float(i))) for i in range(5)]
            owner = self._owner(rt)
            ids = [h._t.id for h in later]
            assert [i for i in owner.live if i in ids] == ids
            gate.set()
            await first
            for h in later:
                await h
            assert not owner.live

        dataflow.run(main, interop_threads=1)

    def test_tasks_that_fail_unstarted_are_forgotten_in_time(self) -> None:
        """Dependents failed through their input (never started) are pruned: the record of
        a long request stays bounded."""

        async def main() -> None:
            rt = dataflow.current_runtime()
            owner = None
            for _ in range(6):
                gate = threading.Event()
                bad = fail_after(np.zeros(1), gate)
                deps = [neg_pool(bad) for _ in range(1000)]
                owner = self._owner(rt)
                gate.set()
                for d in deps:
                    with pytest.raises(TaskError):
                        await d
                with pytest.raises(TaskError):
                    await bad
            assert owner is not None
            assert len(owner.live) <= 2 * 1024

        dataflow.run(main, interop_threads=1)

    def test_a_compiled_call_is_released_when_its_runner_finishes_it(self) -> None:
        """A lean plan's gather task gets its value without starting (``finish_outside``):
        the request lets go of it then too."""

        async def f(x: Any) -> Any:
            return ops.add(ops.multiply(x, 2.0), 1.0)

        async def main() -> None:
            rt = dataflow.current_runtime()
            fc = dataflow.compile(f)
            x = np.arange(1_000_000.0)  # big: the plan runs on the pool, not at the call
            for _ in range(3):
                out = await fc(x)
                np.testing.assert_array_equal(np.asarray(out), x * 2.0 + 1.0)
            assert not self._owner(rt).live

        dataflow.run(main, interop_threads=2)


class TestHandlesHeld:
    """A deferred task holds its handles until it ends; whether someone else wants its value
    (a cancelled request drops it otherwise) is whether a handle has more references than the
    task's own (``_requests.handles_held``)."""

    @staticmethod
    def _pending(gate: threading.Event) -> tuple[Any, Any]:
        """A handle on a task that cannot start before ``gate`` opens (its input waits)."""
        first = gated(np.zeros(3), gate)
        return first, neg_pool(first)

    def test_a_handle_only_its_task_holds_is_not_held(self) -> None:
        from dataflow._scheduler._requests import handles_held

        async def main() -> None:
            gate = threading.Event()
            first, h = self._pending(gate)
            t = h._t
            assert t.handles is h and handles_held(t)  # the variable h holds it
            kept: list[Any] = [h]
            del h
            assert handles_held(t)  # the list holds it
            kept.clear()
            assert not handles_held(t)  # only the task itself
            gate.set()
            await first

        dataflow.run(main, interop_threads=1)

    def test_a_reader_task_holds_the_handle_in_its_arguments(self) -> None:
        from dataflow._scheduler._requests import handles_held

        async def main() -> None:
            gate = threading.Event()
            _first, h = self._pending(gate)
            t = h._t
            reader = neg_pool(h)
            del h
            assert handles_held(t)  # the reader's arguments
            gate.set()
            await reader
            assert t.handles is None  # it ended: no reference left to count

        dataflow.run(main, interop_threads=1)

    def test_an_op_of_several_outputs(self) -> None:
        from dataflow._scheduler._requests import handles_held

        async def main() -> None:
            gate = threading.Event()
            first = gated(np.zeros(4), gate)
            both: Any = _split_pool(first)
            t = both[0]._t
            assert type(t.handles) is list and t.handles[0] is both[0]
            assert handles_held(t)  # the tuple the caller got
            a, b = both
            del both
            assert handles_held(t)
            del a
            assert handles_held(t)  # b still
            del b
            assert not handles_held(t)
            gate.set()
            await first

        dataflow.run(main, interop_threads=1)

    def test_a_forked_future_is_held_weakly(self) -> None:
        from dataflow._scheduler._requests import handles_held

        async def main() -> None:
            gate = threading.Event()
            fut: Any = dataflow.fork(gate.wait, 10)
            t = fut._t
            assert handles_held(t)
            del fut
            import gc

            gc.collect()
            assert not handles_held(t)
            gate.set()

        dataflow.run(main, interop_threads=2)

    def test_a_deferred_op_costs_few_tracked_objects(self) -> None:
        """The objects the garbage collector tracks for each queued op (its passes over them
        were a quarter of a tiny offloaded op's cost): the task, its handle, its queue entry
        and its arguments' tuple. No weak reference per op."""
        import gc

        async def main() -> float:
            gate = threading.Event()
            first = gated(np.zeros(1), gate)  # the only worker waits: the ops stay queued
            x = np.zeros(1)
            warm = [neg_pool(x) for _ in range(100)]  # (the request's record, the signature)
            handles: list[Any] = []
            gc.disable()
            try:
                before = gc.get_count()[0]
                for _ in range(500):
                    handles.append(neg_pool(x))
                after = gc.get_count()[0]
            finally:
                gc.enable()
            handles += warm
            gate.set()
            await first
            for h in handles:
                await h
            return (after - before) / 500

        per_op = dataflow.run(main, interop_threads=1)
        assert per_op <= 4.05, per_op


def _split_kernel(x: Any) -> tuple[Any, Any]:
    return x[:2].copy(), x[2:].copy()


def _split_meta(x: Any) -> tuple[Spec, Spec]:
    n = x.shape[0]
    return Spec((2,), x.dtype), Spec((n - 2,), x.dtype)


_split_pool = dataflow.op("split_pool", meta=_split_meta, handle=Arr, inline=False)(_split_kernel)
