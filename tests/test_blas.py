"""Adaptive intra-op threads (dataflow._blas): BLAS gets one thread while kernels run side by
side, its own count for a kernel that runs alone, and the program's count where it chose one."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import dataflow
from dataflow import Cost, _blas, _threads
from tests._helpers import Arr, _same

_fns = _blas._openblas()
needs_openblas = pytest.mark.skipif(
    _fns is None, reason="needs OpenBLAS's pthreads build (numpy's wheels bundle it)"
)


def _blas_now() -> int:
    assert _fns is not None
    return int(_fns[1]())


def _paired_kernel(x: Any, barrier: threading.Barrier) -> Any:
    """Wait until the other kernel runs too, then read BLAS's count (and wait again, so that
    neither ends before both have read it)."""
    barrier.wait(10)
    n = _blas_now()
    barrier.wait(10)
    return np.full_like(x, n)


def _count_kernel(x: Any) -> Any:
    return np.full_like(x, _blas_now())


def _held_kernel(x: Any, gate: threading.Event) -> Any:
    gate.wait(10)
    return x


def _held_count_kernel(x: Any, gate: threading.Event) -> Any:
    gate.wait(10)
    return np.full_like(x, _blas_now())


def _tiny(x: Any, *_: Any) -> Cost:
    return Cost(1, 8)


paired = dataflow.op("paired_blas", meta=_same, handle=Arr, inline=False)(_paired_kernel)
count = dataflow.op("count_blas", meta=_same, handle=Arr, inline=False)(_count_kernel)
held = dataflow.op("held_blas_kernel", meta=_same, handle=Arr, inline=False)(_held_kernel)
held_count = dataflow.op("held_count_blas", meta=_same, handle=Arr, inline=False)(
    _held_count_kernel
)
short = dataflow.op("short_blas", meta=_same, handle=Arr, cost=_tiny, inline=False)(np.negative)
# Short too, but declared to call BLAS: it counts toward a crowd however short it is.
short_paired = dataflow.op("short_paired_blas", meta=_same, handle=Arr, cost=_tiny, inline=False)(
    _paired_kernel
)
short_paired.intraop = True


def _crowd() -> None:
    """Two kernels side by side, as the scheduler reports them to the governor: BLAS at 1.
    (Kernels on a barrier, ``paired``, are the real thing, but a suite's runs of their
    signature may learn it GIL-bound: the lane then runs one at a time, and the barrier
    breaks.)"""
    from dataflow._pool import GRAPH_LOCK

    gov = _blas.GOVERNOR
    assert gov is not None
    with GRAPH_LOCK:
        gov.start_locked(-1)
        gov.start_locked(-2)
        gov.end_locked(-1)
        gov.end_locked(-2)


@pytest.fixture
def own_two(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """BLAS at 2 threads and nothing chosen by the program, a short hold, no pairing in a
    previous runtime, and every kernel counted as long (the test kernels are quick, and their
    signatures' measured times carry over from test to test); restored afterwards."""
    assert _fns is not None
    before = _blas_now()
    for var in _threads._ENV_INTRAOP:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(_threads, "_intraop_chosen", False)
    monkeypatch.setattr(_blas, "HOLD_SECONDS", 0.05)
    monkeypatch.setattr(_blas, "_paired", -math.inf)
    monkeypatch.setattr(_blas, "LONG_SECONDS", 0.0)
    _fns[0](2)
    yield
    _fns[0](before)


async def _pair_then_alone() -> tuple[float, float, float, int | None]:
    """Two kernels side by side, then one alone once the hold has passed: the counts each
    saw, and what parallel_info reports meanwhile."""
    barrier = threading.Barrier(2)
    x = np.zeros(4)
    a, b = paired(x, barrier), paired(x, barrier)
    side_by_side = await dataflow.materialize(a), await dataflow.materialize(b)
    await asyncio.sleep(_blas.HOLD_SECONDS * 1.5)
    alone = await dataflow.materialize(count(x))
    return side_by_side[0][0], side_by_side[1][0], alone[0], _blas.governed()


@needs_openblas
class TestRuntime:
    def test_side_by_side_one_thread_alone_its_own(self, own_two: None) -> None:
        """Two kernels running at once each see BLAS at one thread; a kernel that runs alone
        once the hold has passed sees BLAS's own count; after the run, BLAS has its own count
        again."""
        first, second, alone, own = dataflow.run(_pair_then_alone, interop_threads=2)
        assert (first, second) == (1, 1)
        assert alone == 2
        assert own == 2  # what parallel_info reports meanwhile
        assert _blas_now() == 2
        assert _blas.GOVERNOR is None

    def test_a_lone_kernel_within_the_hold_keeps_one_thread(self, own_two: None) -> None:
        """Right after kernels ran side by side, a kernel alone keeps BLAS at one thread (its
        own threads would spin beside the next parallel branch)."""
        _blas.HOLD_SECONDS = 60.0

        async def main() -> tuple[float, float]:
            barrier = threading.Barrier(2)
            x = np.zeros(4)
            a, b = paired(x, barrier), paired(x, barrier)
            await dataflow.materialize(a)
            await dataflow.materialize(b)
            first = (await dataflow.materialize(count(x)))[0]
            return first, (await dataflow.materialize(count(x)))[0]

        assert dataflow.run(main, interop_threads=2) == (1, 1)
        assert _blas_now() == 2  # restored at the close
        # The next runtime, within the hold, starts at one thread.
        assert dataflow.run(main, interop_threads=2) == (1, 1)

    def test_private_pool_too(self, own_two: None) -> None:
        async def main() -> tuple[float, float, float, int | None]:
            async with dataflow.Runtime(interop_threads=2, private_pool=True):
                return await _pair_then_alone()

        assert dataflow.run(main, interop_threads=1)[:3] == (1, 1, 2)
        assert _blas_now() == 2

    def test_parallel_info_reports_the_own_count(self, own_two: None) -> None:
        """While kernels run side by side (BLAS at 1), parallel_info reports BLAS's own."""
        barrier = threading.Barrier(3)

        def kernel(x: Any) -> Any:
            barrier.wait(10)
            barrier.wait(10)
            return x

        op = dataflow.op("held_blas", meta=_same, handle=Arr, inline=False)(kernel)

        async def main() -> tuple[int, str]:
            x = np.zeros(2)
            a, b = op(x), op(x)
            loop_barrier = dataflow.fork(barrier.wait, 10)
            await loop_barrier
            now, info = _blas_now(), dataflow.parallel_info()
            await dataflow.fork(barrier.wait, 10)
            await dataflow.materialize(a)
            await dataflow.materialize(b)
            return now, info

        now, info = dataflow.run(main, interop_threads=3)
        assert now == 1
        want = (
            "intra-op threads (BLAS): 2 (default: BLAS's own, 1 while 2+ long or BLAS kernels run"
        )
        assert want in info

    def test_a_chosen_count_stays(self, own_two: None) -> None:
        """intraop_threads= on the runtime, or set_num_threads: BLAS keeps that count."""
        first, second, alone, own = dataflow.run(
            _pair_then_alone, interop_threads=2, intraop_threads=2
        )
        assert (first, second, alone, own) == (2, 2, 2, None)
        dataflow.set_num_threads(2)
        assert dataflow.run(_pair_then_alone, interop_threads=2)[:3] == (2, 2, 2)

    def test_environment_choice_stays(self, own_two: None, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert dataflow.run(_pair_then_alone, interop_threads=2)[:3] == (2, 2, 2)

    def test_one_inter_op_thread_is_not_governed(self, own_two: None) -> None:
        async def main() -> tuple[int | None, float]:
            alone = await dataflow.materialize(count(np.zeros(2)))
            return _blas.governed(), alone[0]

        assert dataflow.run(main, interop_threads=1) == (None, 2)

    def test_set_num_threads_while_governed_stops_it(self, own_two: None) -> None:
        """A count set while a governed runtime runs is the count from then on."""

        async def main() -> tuple[int | None, float, float]:
            before = _blas.governed()
            dataflow.set_num_threads(2)
            barrier = threading.Barrier(2)
            x = np.zeros(2)
            a, b = paired(x, barrier), paired(x, barrier)
            return before, (await dataflow.materialize(a))[0], (await dataflow.materialize(b))[0]

        assert dataflow.run(main, interop_threads=2) == (2, 2, 2)
        assert _blas.GOVERNOR is None
        assert _blas_now() == 2

    def test_a_count_someone_else_sets_stays(self, own_two: None) -> None:
        """threadpoolctl (or any library) setting BLAS's count while a governed runtime runs:
        the governor finds a count it did not set at its next change and steps aside."""
        assert _fns is not None
        setter = _fns[0]

        async def main() -> tuple[float, int | None]:
            barrier = threading.Barrier(2)
            x = np.zeros(4)
            a, b = paired(x, barrier), paired(x, barrier)
            await dataflow.materialize(a)
            await dataflow.materialize(b)  # BLAS at 1 now
            setter(2)  # someone else's choice
            await asyncio.sleep(_blas.HOLD_SECONDS * 1.5)
            barrier = threading.Barrier(2)
            a, b = paired(x, barrier), paired(x, barrier)  # would set 1: steps aside instead
            first = (await dataflow.materialize(a))[0]
            await dataflow.materialize(b)
            return first, _blas.governed()

        assert dataflow.run(main, interop_threads=2) == (2, None)
        assert _blas_now() == 2

    def test_a_count_set_and_put_back_meanwhile_is_restored_at_the_close(
        self, own_two: None
    ) -> None:
        """Someone sets a count while BLAS is at the governor's 1 and puts the 1 back after
        (a `with threadpool_limits()` block restores the count it found): the governor
        stepped aside, and the runtime's close left BLAS at 1 for good. A count that is the
        governor's again is restored to BLAS's own."""
        assert _fns is not None
        setter = _fns[0]

        async def main() -> tuple[int | None, int]:
            x = np.zeros(4)
            _crowd()
            found = _blas_now()  # the governor's 1
            setter(3)  # a block of someone else's starts...
            await asyncio.sleep(_blas.HOLD_SECONDS * 1.5)
            await dataflow.materialize(count(x))  # (the governor finds 3: steps aside)
            setter(found)  # ...and ends, putting back what it found
            return _blas.governed(), found

        assert dataflow.run(main, interop_threads=2) == (None, 1)
        assert _blas_now() == 2

    def test_kernels_running_before_it_do_not_count(self, own_two: None) -> None:
        """A governor made while another runtime's kernel runs ignores that kernel's end (it
        never counted its start)."""
        gate = threading.Event()

        async def main() -> tuple[int, int]:
            h = held(np.zeros(2), gate)  # (this runtime has one thread: not governed)
            while dataflow.current_runtime().running == 0:  # type: ignore[union-attr]
                await asyncio.sleep(0.001)
            async with dataflow.Runtime(interop_threads=2, private_pool=True):
                gov = _blas.GOVERNOR
                assert gov is not None
                before = len(gov.counted)
                gate.set()
                await h
                await asyncio.sleep(0.05)
                return before, len(gov.counted)

        assert dataflow.run(main, interop_threads=1) == (0, 0)

    def test_short_kernels_make_no_crowd(
        self, own_two: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Small ops on the pool beside a long kernel leave it BLAS's threads."""
        monkeypatch.setattr(_blas, "LONG_SECONDS", 1e-3)  # the real threshold
        gate = threading.Event()

        async def main() -> float:
            h = held_count(np.zeros(2), gate)  # long: no cost rule, not timed yet
            while dataflow.current_runtime().running == 0:  # type: ignore[union-attr]
                await asyncio.sleep(0.001)
            for _ in range(5):
                await short(np.zeros(2))  # estimated by its cost rule at 1 ns
            gate.set()
            return float((await h)[0])

        assert dataflow.run(main, interop_threads=2) == 2

    def test_short_blas_kernels_make_a_crowd(
        self, own_two: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Kernels of an op that calls BLAS (``op.intraop = True``: ops' matmul, linear and
        recurrent ops) count however short: two side by side get one thread each, where
        BLAS's helper threads would otherwise spin beside the other kernel."""
        monkeypatch.setattr(_blas, "LONG_SECONDS", 1e-3)  # the real threshold

        async def main() -> tuple[float, float]:
            barrier = threading.Barrier(2)
            x = np.zeros(2)
            a, b = short_paired(x, barrier), short_paired(x, barrier)
            return float((await a)[0]), float((await b)[0])

        assert dataflow.run(main, interop_threads=2) == (1, 1)

    def test_the_flag_is_read_from_the_op(self) -> None:
        from dataflow._signature import Signature

        assert Signature("x", op=short_paired).intraop is True
        assert Signature("x", op=short).intraop is False
        assert Signature("x").intraop is False

    def test_nested_runtimes_restore_at_the_last_close(self, own_two: None) -> None:
        async def main() -> tuple[bool, bool]:
            async with dataflow.Runtime(interop_threads=2, private_pool=True):
                inner = _blas.GOVERNOR is not None
            return inner, _blas.GOVERNOR is not None

        assert dataflow.run(main, interop_threads=2) == (True, True)
        assert _blas.GOVERNOR is None


@needs_openblas
class TestChosenCounts:
    """Runtimes that chose their intra-op count (``intraop_threads=``): the count is the
    process's, whatever order they close in."""

    @staticmethod
    async def _open(n: int, opened: asyncio.Event, close: asyncio.Event) -> None:
        async with dataflow.Runtime(intraop_threads=n, interop_threads=1, private_pool=True):
            opened.set()
            await close.wait()

    def test_runtimes_closed_out_of_order_restore_the_count_from_before(
        self, own_two: None
    ) -> None:
        """The first to open closes first: BLAS keeps the one still open's count, and the
        last to close puts back the count from before the first (each restored the count it
        found: the second found the first's, and left it for good)."""

        async def main() -> list[int]:
            a_open, b_open, a_close, b_close = (asyncio.Event() for _ in range(4))
            a = asyncio.create_task(self._open(1, a_open, a_close))
            await a_open.wait()
            b = asyncio.create_task(self._open(3, b_open, b_close))
            await b_open.wait()
            seen = [_blas_now()]
            a_close.set()
            await a
            seen.append(_blas_now())
            b_close.set()
            await b
            return [*seen, _blas_now()]

        assert asyncio.run(main()) == [3, 3, 2]

    def test_a_count_that_cannot_be_set_holds_nothing(
        self, own_two: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """threadpoolctl failing as the runtime opens: the runtime does not open, and no
        count stays held (a runtime opened later is governed again)."""
        from dataflow import _intraop

        def fail(n: int) -> None:
            raise OSError("no BLAS here")

        limit_every = _intraop.limit_every

        async def main() -> bool:
            monkeypatch.setattr(_intraop, "limit_every", fail)
            with pytest.raises(OSError, match="no BLAS here"):
                async with dataflow.Runtime(intraop_threads=1, private_pool=True):
                    pass
            monkeypatch.setattr(_intraop, "limit_every", limit_every)
            async with dataflow.Runtime(interop_threads=2, private_pool=True):
                return _blas.GOVERNOR is not None

        assert asyncio.run(main()) is True
        assert not _intraop.held()

    def test_nested_runtimes_restore_each_outer_count(self, own_two: None) -> None:
        async def main() -> list[int]:
            seen = []
            async with dataflow.Runtime(intraop_threads=1, interop_threads=1, private_pool=True):
                async with dataflow.Runtime(
                    intraop_threads=3, interop_threads=1, private_pool=True
                ):
                    seen.append(_blas_now())
                seen.append(_blas_now())
            return [*seen, _blas_now()]

        assert asyncio.run(main()) == [3, 1, 2]

    def test_a_count_the_program_sets_meanwhile_stays(self, own_two: None) -> None:
        """set_num_threads while such a runtime is open: its count stays after the runtime
        closes (it is the program's choice), not the count from before."""

        async def main() -> int:
            async with dataflow.Runtime(intraop_threads=1, interop_threads=1, private_pool=True):
                dataflow.set_num_threads(3)
            return _blas_now()

        assert asyncio.run(main()) == 3

    def test_opened_inside_a_governed_runtime_it_restores_blas_own_count(
        self, own_two: None
    ) -> None:
        """A runtime that chose a count, opened while a governed runtime had set BLAS to one
        thread (a crowd had just run), stops the governor (BLAS's own count back first): it
        restored the governor's 1 at its close, after the governor had stepped aside from
        its count, and BLAS kept one thread for good."""

        async def main() -> tuple[int, bool, int]:
            x = np.zeros(4)
            _crowd()
            crowd = _blas_now()
            async with dataflow.Runtime(intraop_threads=3, interop_threads=1, private_pool=True):
                await asyncio.sleep(_blas.HOLD_SECONDS * 1.5)
                await dataflow.materialize(count(x))  # (a kernel start the governor saw)
                async with dataflow.Runtime(interop_threads=2, private_pool=True):
                    governed = _blas.GOVERNOR is not None  # (the count is chosen: not)
            return crowd, governed, _blas_now()

        assert dataflow.run(main, interop_threads=2) == (1, False, 2)
        assert _blas_now() == 2

    def test_a_governed_runtime_is_governed_again_after_one_that_chose_closes(
        self, own_two: None
    ) -> None:
        """A runtime that chose its count, opened and closed inside a governed one, stops
        the governor while it is open; at its close the governed runtime still open is
        governed again (it ran ungoverned to its end: its kernels side by side on BLAS's own
        count each, more threads than cores)."""

        async def main() -> tuple[bool, bool, bool]:
            before = _blas.GOVERNOR is not None
            async with dataflow.Runtime(intraop_threads=1, interop_threads=1, private_pool=True):
                during = _blas.GOVERNOR is not None
            return before, during, _blas.GOVERNOR is not None

        assert dataflow.run(main, interop_threads=2) == (True, False, True)
        assert _blas.GOVERNOR is None and _blas_now() == 2


class _Kernels:
    """Long kernels starting and ending under a governor, as the scheduler reports them."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.next = 1

    def step(self, delta: int) -> None:
        gov = _blas.GOVERNOR
        assert gov is not None
        if delta > 0:
            self.ids.append(self.next)
            gov.start_locked(self.next)
            self.next += 1
        else:
            gov.end_locked(self.ids.pop(0))


class TestGovernor:
    """The transitions, with a recording setter (no BLAS needed)."""

    @pytest.fixture
    def pool(self, monkeypatch: pytest.MonkeyPatch) -> tuple[_Kernels, list[int]]:
        calls: list[int] = []
        monkeypatch.setattr(_blas, "GOVERNOR", _blas.BlasGovernor(calls.append, 4))
        return _Kernels(), calls

    def _age(self) -> None:
        """As if no crowd had run for longer than the hold."""
        gov = _blas.GOVERNOR
        assert gov is not None
        gov.paired -= _blas.HOLD_SECONDS + 1

    def test_a_lone_chain_sets_nothing(self, pool: tuple[_Kernels, list[int]]) -> None:
        p, calls = pool
        for _ in range(3):
            p.step(1)
            p.step(-1)
        assert calls == []

    def test_second_kernel_sets_one(self, pool: tuple[_Kernels, list[int]]) -> None:
        p, calls = pool
        p.step(1)
        p.step(1)
        assert calls == [1]
        p.step(1)  # a third: already one
        p.step(-1)
        p.step(-1)  # ends change nothing
        p.step(-1)
        assert calls == [1]

    def test_a_lone_start_restores_after_the_hold_only(
        self, pool: tuple[_Kernels, list[int]]
    ) -> None:
        p, calls = pool
        p.step(1)
        p.step(1)
        p.step(-1)
        p.step(-1)
        p.step(1)  # alone, within the hold: stays one
        p.step(-1)
        assert calls == [1]
        self._age()
        p.step(1)  # alone, the hold passed: its own count
        assert calls == [1, 4]
        p.step(1)  # and beside it again: one
        assert calls == [1, 4, 1]

    def test_the_hold_counts_from_the_last_end_in_a_crowd(
        self, pool: tuple[_Kernels, list[int]]
    ) -> None:
        """A long parallel phase: the hold starts when its kernels stop running side by side,
        not when the last of them started."""
        p, calls = pool
        p.step(1)
        p.step(1)
        self._age()  # they started long ago ...
        p.step(-1)  # ... and ran side by side until now
        p.step(-1)
        p.step(1)  # alone, right after: stays one
        assert calls == [1]

    def test_a_busy_pool_changes_nothing(self, pool: tuple[_Kernels, list[int]]) -> None:
        """Workers going from one task to the next set nothing."""
        p, calls = pool
        p.step(1)
        p.step(1)
        for _ in range(5):
            p.step(-1)
            p.step(1)
        assert calls == [1]

    def test_an_end_it_never_saw_start_is_ignored(self, pool: tuple[_Kernels, list[int]]) -> None:
        p, calls = pool
        gov = _blas.GOVERNOR
        assert gov is not None
        gov.end_locked(12345)  # started before this governor existed
        p.step(1)
        p.step(1)
        assert calls == [1]
        assert len(gov.counted) == 2

    def test_a_crowd_is_half_the_own_count(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With 16 BLAS threads, up to 7 kernels side by side keep them (one multithreaded
        call at a time); the 8th sets one thread each."""
        calls: list[int] = []
        gov = _blas.BlasGovernor(calls.append, 16)
        assert gov.crowd == 8
        assert [_blas.BlasGovernor(calls.append, n).crowd for n in (2, 3, 5, 6)] == [2, 2, 2, 3]
        monkeypatch.setattr(_blas, "GOVERNOR", gov)
        p = _Kernels()
        for _ in range(7):
            p.step(1)
        assert calls == []
        p.step(1)
        assert calls == [1]
        for _ in range(6):
            p.step(-1)  # two left: no crowd, but within the hold
        p.step(1)
        assert calls == [1]
        self._age()  # the crowd ran long ago
        p.step(1)
        assert calls == [1, 16]  # (4 running: no crowd)

    def test_steps_aside_from_a_count_it_did_not_set(self, monkeypatch: pytest.MonkeyPatch) -> None:
        calls: list[int] = []
        now = [4]
        gov = _blas.BlasGovernor(calls.append, 4, lambda: now[0])
        monkeypatch.setattr(_blas, "GOVERNOR", gov)
        p = _Kernels()
        p.step(1)
        now[0] = 3  # someone else set 3
        p.step(1)  # would set 1
        assert calls == []
        assert _blas.GOVERNOR is None

    def test_restore(self) -> None:
        calls: list[int] = []
        gov = _blas.BlasGovernor(calls.append, 4)
        gov.restore()
        assert calls == []
        gov.change(1)
        gov.restore()
        assert calls == [1, 4]
