"""Thread settings at both levels, and parallel_info()."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import dataflow
from dataflow import _blas, _threads


@pytest.fixture(autouse=True)
def restore_defaults() -> Iterator[None]:
    """Each test leaves the process defaults as it found them."""
    saved = _threads._interop_default
    chosen = _threads._intraop_chosen
    blas = dataflow.get_num_threads()
    yield
    _threads._interop_default = saved
    dataflow.set_num_threads(blas)
    _threads._intraop_chosen = chosen


class TestInterop:
    def test_set_and_get(self) -> None:
        """set_num_interop_threads sets the size the next runtime uses."""
        dataflow.set_num_interop_threads(3)
        assert dataflow.get_num_interop_threads() == 3

        async def main() -> int:
            return len([t for t in threading.enumerate() if t.name.startswith("interop")])

        assert dataflow.run(main) == 3

    def test_env_var(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """$DATAFLOW_NUM_INTEROP_THREADS is the default when nothing was set."""
        _threads._interop_default = None
        monkeypatch.setenv("DATAFLOW_NUM_INTEROP_THREADS", "5")
        assert dataflow.get_num_interop_threads() == 5
        monkeypatch.setenv("DATAFLOW_NUM_INTEROP_THREADS", "zero")
        with pytest.raises(ValueError, match="DATAFLOW_NUM_INTEROP_THREADS"):
            dataflow.get_num_interop_threads()

    @pytest.mark.parametrize("bad", [0, -1])
    def test_rejects_bad_counts(self, bad: object) -> None:
        """Counts must be positive ints."""
        with pytest.raises(dataflow.DataflowValueError, match="positive int"):
            dataflow.set_num_interop_threads(bad)  # type: ignore[arg-type]

    def test_numpy_integers_are_counts(self) -> None:
        """A numpy integer is a count, as torch's setters take it (`os.cpu_count() //
        np.int64(2)`, a count read from an array): it was a DataflowTypeError."""
        # (typed `int`, as torch's: a checker wants int(n); at run time numpy's are taken)
        dataflow.set_num_interop_threads(np.int64(2))  # type: ignore[arg-type]
        got = dataflow.get_num_interop_threads()
        assert got == 2 and type(got) is int
        rt = dataflow.Runtime(interop_threads=np.int32(1))  # type: ignore[arg-type]
        assert rt.interop_threads == 1

    @pytest.mark.parametrize("bad", [1.5, "2", True, np.True_, np.float64(2.0)])
    def test_rejects_counts_of_another_type_with_a_type_error(self, bad: object) -> None:
        """A count that is not an int is a DataflowTypeError (docs/api.md, "Errors")."""
        with pytest.raises(dataflow.DataflowTypeError, match="positive int, got"):
            dataflow.set_num_interop_threads(bad)  # type: ignore[arg-type]
        with pytest.raises(dataflow.DataflowTypeError, match="set_num_threads"):
            dataflow.set_num_threads(bad)  # type: ignore[arg-type]
        with pytest.raises(dataflow.DataflowTypeError, match="interop_threads"):
            dataflow.Runtime(interop_threads=bad)  # type: ignore[arg-type]
        with pytest.raises(dataflow.DataflowTypeError, match="intraop_threads"):
            dataflow.Runtime(intraop_threads=bad)  # type: ignore[arg-type]
        with pytest.raises(dataflow.DataflowTypeError, match="max_pending"):
            dataflow.Runtime(max_pending=bad)  # type: ignore[arg-type]

    def test_rejects_counts_past_a_c_int(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A count no C int holds is a DataflowValueError naming the setting, raised at the
        call: set_num_threads raised ctypes' ArgumentError from BLAS's setter (after it had
        stopped the adaptive governor), and an inter-op count was taken for a pool that
        would start threads until the system refused one."""
        huge = 2**64
        calls: list[tuple[Callable[[], object], str]] = [
            (lambda: dataflow.set_num_threads(huge), "set_num_threads"),
            (lambda: dataflow.set_num_interop_threads(huge), "set_num_interop_threads"),
            (lambda: dataflow.Runtime(interop_threads=huge), "interop_threads"),
            (lambda: dataflow.Runtime(intraop_threads=huge), "intraop_threads"),
        ]
        for call, name in calls:
            with pytest.raises(dataflow.DataflowValueError, match=rf"{name}.*at most 2147483647"):
                call()
        dataflow.set_num_interop_threads(_threads.MAX_THREADS)  # the largest is taken
        assert dataflow.get_num_interop_threads() == 2**31 - 1
        _threads._interop_default = None
        monkeypatch.setenv("DATAFLOW_NUM_INTEROP_THREADS", str(huge))
        with pytest.raises(dataflow.DataflowValueError, match=r"NUM_INTEROP_THREADS.*at most"):
            dataflow.get_num_interop_threads()

    @pytest.mark.asyncio
    async def test_cannot_resize_running_pool(self) -> None:
        """The shared pool is not resized under a running runtime."""
        async with dataflow.Runtime(interop_threads=2):
            with pytest.raises(RuntimeError, match="before any runtime starts"):
                dataflow.set_num_interop_threads(4)
            dataflow.set_num_interop_threads(2)
            assert dataflow.get_num_interop_threads() == 2


class TestIntraop:
    def test_set_and_get(self) -> None:
        """set_num_threads changes BLAS's thread count."""
        dataflow.set_num_threads(1)
        assert dataflow.get_num_threads() == 1

    def test_runtime_applies_and_restores(self) -> None:
        """Runtime(intraop_threads=) applies the count while open and restores it after."""
        dataflow.set_num_threads(2)

        async def main() -> int:
            return dataflow.get_num_threads()

        assert dataflow.run(main, intraop_threads=1) == 1
        assert dataflow.get_num_threads() == 2

    @pytest.mark.skipif(_blas._openblas() is None, reason="needs OpenBLAS's pthreads build")
    def test_any_thread_sets_the_count(self) -> None:
        """set_num_threads and intraop_threads= set BLAS's count from whichever thread calls:
        threadpoolctl lets one thread set a pthreads OpenBLAS's count (the first that set
        one, while it lives), and from another thread both silently did nothing."""
        dataflow.set_num_threads(1)  # (the main thread set the count: threadpoolctl's owner)
        seen: list[int] = []

        async def main() -> int:
            return dataflow.get_num_threads()

        def elsewhere() -> None:
            dataflow.set_num_threads(2)
            seen.append(dataflow.get_num_threads())
            seen.append(dataflow.run(main, intraop_threads=1, interop_threads=1))
            seen.append(dataflow.get_num_threads())

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        assert seen == [2, 1, 2]
        assert dataflow.get_num_threads() == 2


class TestNumpysBlas:
    """Another library's own BLAS (scipy bundles an OpenBLAS, and numba imports scipy) runs
    none of numpy's products: the counts read and governed are numpy's BLAS's."""

    class _Lib:
        def __init__(self, path: str, threads: int, api: str = "openblas") -> None:
            self.filepath, self.num_threads, self.internal_api = path, threads, api

        def get_num_threads(self) -> int:
            return self.num_threads

    def test_numpys_library_is_found_by_its_path_else_the_first_loaded(self) -> None:
        import os

        import numpy as np

        from dataflow import _blas
        from ops import _rnn_measure

        site = os.path.dirname(os.path.dirname(np.__file__))
        scipy_lib = self._Lib(os.path.join(site, "scipy.libs", "libscipy_openblas.so"), 2)
        wheel = self._Lib(os.path.join(site, "numpy.libs", "libscipy_openblas64_.so"), 1)
        system = self._Lib("/usr/lib/libopenblas.so", 4)
        for find in (_blas.numpy_blas, _rnn_measure._numpy_blas):
            assert find([scipy_lib, wheel]) is wheel
            assert find([system, scipy_lib]) is system  # none in numpy's package: the first
            assert find([]) is None

    def test_with_scipys_openblas_loaded_the_counts_are_numpys(self) -> None:
        """Measured: reading the highest count of every BLAS took scipy's ungoverned 2 for
        numpy's governed 1, and the recurrent kernels picked their two-thread forms."""
        pytest.importorskip("scipy.linalg")
        from threadpoolctl import ThreadpoolController

        from dataflow import _blas
        from ops import _rnn_measure

        libs = ThreadpoolController().select(user_api="blas").lib_controllers
        mine = _blas.numpy_blas(libs)
        others = [lib for lib in libs if lib is not mine]
        if mine is None or not others:
            pytest.skip("one BLAS library loaded")
        before = [(lib, lib.num_threads) for lib in libs]
        try:
            mine.set_num_threads(1)
            for lib in others:
                lib.set_num_threads(2)
            assert dataflow.get_num_threads() == 1
            assert _rnn_measure._blas_threads() == 1
            mine.set_num_threads(2)
            for lib in others:
                lib.set_num_threads(1)
            assert dataflow.get_num_threads() == 2
            assert _rnn_measure._blas_threads() == 2
        finally:
            for lib, n in before:
                lib.set_num_threads(n)


class TestParallelInfo:
    def test_report(self) -> None:
        """parallel_info names both levels, the BLAS library and the loop."""
        info = dataflow.parallel_info()
        assert "inter-op threads:" in info
        assert "intra-op threads (BLAS):" in info
        assert "BLAS: openblas" in info
        assert "event loop:" in info

    def test_names_the_blas_kernel_choice(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """$OPENBLAS_CORETYPE (which kernels OpenBLAS runs) is shown when set."""
        monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
        assert "OPENBLAS_CORETYPE=Haswell" in dataflow.parallel_info()

    def test_oversubscription_warning(self) -> None:
        """inter-op x intra-op above the cores is warned about."""
        dataflow.set_num_interop_threads(64)
        dataflow.set_num_threads(2)
        assert "WARNING: inter-op x intra-op" in dataflow.parallel_info()

    @pytest.mark.parametrize(
        ("interop", "intra", "fix"),
        [(2, 2, "set_num_threads(1)"), (3, 1, "set_num_interop_threads(2)"),
         (64, 2, "set_num_interop_threads(1)")],
    )  # fmt: skip
    def test_the_warning_suggests_a_count_that_fits(
        self, monkeypatch: pytest.MonkeyPatch, interop: int, intra: int, fix: str
    ) -> None:
        """The suggested count fits the cores: with more inter-op threads than cores it is an
        inter-op count (set_num_threads(1) was suggested with the count already 1)."""
        monkeypatch.setattr(_threads, "_cores", lambda: 2)
        monkeypatch.setattr(_threads, "get_num_threads", lambda: intra)
        monkeypatch.setattr(_threads, "_interop_default", interop)
        monkeypatch.setattr(_threads, "_intraop_chosen", True)
        assert f"Lower one of them, e.g. {fix}." in dataflow.parallel_info()

    def test_defaults_never_warn(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Nothing chosen (2 x 2 on 2 cores): no oversubscription warning, defaults named."""
        monkeypatch.setattr(_threads, "_cores", lambda: 2)
        monkeypatch.setattr(_threads, "get_num_threads", lambda: 2)
        monkeypatch.setattr(_threads, "_interop_default", None)
        monkeypatch.setattr(_threads, "_intraop_chosen", False)
        for var in (_threads._ENV_INTEROP, *_threads._ENV_INTRAOP):
            monkeypatch.delenv(var, raising=False)
        info = dataflow.parallel_info()
        assert "WARNING" not in info
        assert "inter-op threads: 2 (default: the cores)" in info
        assert "intra-op threads (BLAS): 2 (default: BLAS's own" in info

    def test_every_variable_that_chooses_a_count_is_shown(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """$BLIS_NUM_THREADS made the intra-op count chosen (and the report warn) without
        the report showing it."""
        for var in _threads._ENV_INTRAOP:
            monkeypatch.setenv(var, "2")
            assert f"\n{var}=2\n" in dataflow.parallel_info()
            monkeypatch.delenv(var)

    @pytest.mark.parametrize(
        ("value", "chosen"),
        [("", False), (" ", False), ("0", False), ("abc", False), ("2", True), ("4,2", True)],
    )
    def test_an_empty_or_zero_variable_chooses_nothing(
        self, monkeypatch: pytest.MonkeyPatch, value: str, chosen: bool
    ) -> None:
        """BLAS reads an empty $OMP_NUM_THREADS, 0 or no number as unset (OpenBLAS's atoi):
        so does the runtime, which then adapts the count (`OMP_NUM_THREADS=` in a shell made
        it chosen, and BLAS ungoverned); "4,2" (nested levels) is 4, a choice."""
        for var in _threads._ENV_INTRAOP:
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setattr(_threads, "_intraop_chosen", False)
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        assert _threads.intraop_chosen() is chosen

    def test_env_choice_warns(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """$OMP_NUM_THREADS is a choice: 2 x 2 on 2 cores is then warned about."""
        monkeypatch.setattr(_threads, "_cores", lambda: 2)
        monkeypatch.setattr(_threads, "get_num_threads", lambda: 2)
        monkeypatch.setattr(_threads, "_interop_default", None)
        monkeypatch.setattr(_threads, "_intraop_chosen", False)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert "WARNING: inter-op x intra-op threads = 2 x 2" in dataflow.parallel_info()

    def _blas(
        self,
        monkeypatch: pytest.MonkeyPatch,
        interop: int,
        intra: int,
        lib: str,
        chosen: bool = True,
    ) -> str:
        monkeypatch.setattr(_threads, "intraop_chosen", lambda: chosen)
        monkeypatch.setattr(_threads, "_intraop_chosen", chosen)
        for var in _threads._ENV_INTRAOP:
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setattr(_threads, "get_num_interop_threads", lambda: interop)
        monkeypatch.setattr(_threads, "get_num_threads", lambda: intra)
        info = {"internal_api": lib, "version": "0.3.34", "num_threads": intra}
        info["threading_layer"] = "pthreads" if lib == "openblas" else "intel"
        monkeypatch.setattr(_threads, "_blas_info", lambda: [info])
        return dataflow.parallel_info()

    def test_notes_that_openblas_runs_one_threaded_call_at_a_time(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Several inter-op threads beside a multithreaded OpenBLAS (pthreads) that the
        program chose: a note naming what to set."""
        info = self._blas(monkeypatch, 16, 16, "openblas")
        assert "note: OpenBLAS runs one multithreaded call at a time" in info
        assert "set_num_threads(1)" in info
        assert "or leave the count unset" in info

    def test_defaults_adapt_instead_of_a_note(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Left at the defaults, the same setting needs no note: the report says that BLAS
        gets one thread while kernels run side by side."""
        info = self._blas(monkeypatch, 16, 16, "openblas", chosen=False)
        assert "note:" not in info
        want = (
            "intra-op threads (BLAS): 16 (default: BLAS's own, 1 while 8+ long or BLAS kernels run "
        )
        assert want in info
        for interop, intra, lib in ((1, 16, "openblas"), (16, 16, "mkl"), (16, 1, "openblas")):
            info = self._blas(monkeypatch, interop, intra, lib, chosen=False)
            assert "side by side" not in info
            assert f"intra-op threads (BLAS): {intra} (default: BLAS's own)" in info

    def test_no_note_where_it_does_not_apply(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for interop, intra, lib in ((16, 1, "openblas"), (1, 16, "openblas"), (16, 16, "mkl")):
            assert "note:" not in self._blas(monkeypatch, interop, intra, lib)

    def test_reports_running_loop(self) -> None:
        """Inside a run, the loop in use is reported."""

        async def main() -> str:
            return dataflow.parallel_info()

        assert "event loop: uvloop" in dataflow.run(main, loop="uvloop")
        assert "event loop: asyncio" in dataflow.run(main, loop="asyncio")


class TestParallelInfoOfTheCallingRuntime:
    """Inside a runtime (on its loop, or in one of its kernels) parallel_info reports that
    runtime's pool, not the shared pool's default."""

    @staticmethod
    def _report() -> str:
        return dataflow.parallel_info()

    def test_a_private_pool(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Its size and kind, the shared pool beside it, and the warning (3 x 1 on 2 cores)
        naming the runtime's own setting: the report said 2 (the cores, the default) and
        warned of nothing."""
        monkeypatch.setattr(_threads, "_cores", lambda: 2)

        async def main() -> tuple[str, str]:
            async with dataflow.Runtime(interop_threads=3, intraop_threads=1, private_pool=True):
                return dataflow.parallel_info(), await dataflow.fork(self._report)

        on_loop, in_kernel = dataflow.run(main, interop_threads=2)
        for info in (on_loop, in_kernel):
            assert "inter-op threads: 3 (this runtime's private pool; the shared pool: 2" in info
            assert "intra-op threads (BLAS): 1\n" in info  # (the runtime chose it)
            assert "3 x 1 = 3 exceeds the 2 cores" in info
            assert "e.g. interop_threads=2." in info

    def test_the_synchronous_mode(self) -> None:
        """interop_threads=0 runs no pool: the report said the shared pool's default."""

        async def main() -> str:
            async with dataflow.Runtime(interop_threads=0):
                return dataflow.parallel_info()

        assert "inter-op threads: 0 (this runtime's synchronous mode" in asyncio.run(main())

    def test_the_loop_of_a_kernels_runtime(self) -> None:
        """In a kernel (a worker thread, no loop running there) the loop is the runtime's:
        it was the loop new runs would get."""

        async def main() -> str:
            return await dataflow.fork(self._report)

        info = dataflow.run(main, loop="asyncio")
        assert "event loop: asyncio (" in info
        assert "default for new runs" not in info


class TestBusyIntegral:
    """The pool's busy integral (kernels running, integrated over time) is kept only while a
    measured run is in progress, and then counts every start and end."""

    class _Clock:
        def __init__(self) -> None:
            self.now = 100.0

        def perf_counter(self) -> float:
            return self.now

    def test_overlap_of_a_measured_run(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from dataflow import _pool

        clock = self._Clock()
        pool = _pool.InteropPool(1, name="busy-test")
        try:
            monkeypatch.setattr(_pool, "time", clock)
            with pool.lock:
                pool.busy = 1  # the measured kernel itself
                clock.now += 5.0  # unmeasured time: not integrated
                i0 = pool.measure_begin_locked()
                clock.now += 1.0
                pool.tick_locked()
                pool.busy += 1  # another kernel starts beside it
                clock.now += 2.0
                pool.tick_locked()
                pool.busy -= 1  # and ends
                clock.now += 1.0
                i1 = pool.measure_end_locked()
            # 1 s alone, 2 s beside one other, 1 s alone: 1 + 4 + 1 kernel-seconds in 4 s.
            assert i1 - i0 == pytest.approx(6.0)
            assert pool.measuring == 0
        finally:
            monkeypatch.undo()
            pool.busy = 0
            pool.close()

    def test_nested_measured_runs_share_the_integral(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from dataflow import _pool

        clock = self._Clock()
        pool = _pool.InteropPool(1, name="busy-test")
        try:
            monkeypatch.setattr(_pool, "time", clock)
            with pool.lock:
                pool.busy = 2  # two measured kernels
                a0 = pool.measure_begin_locked()
                clock.now += 1.0
                b0 = pool.measure_begin_locked()
                clock.now += 1.0
                a1 = pool.measure_end_locked()
                pool.tick_locked()
                pool.busy -= 1
                clock.now += 3.0
                b1 = pool.measure_end_locked()
            assert a1 - a0 == pytest.approx(4.0)  # 2 s with 2 running
            assert b1 - b0 == pytest.approx(5.0)  # 1 s with 2, then 3 s with 1
            assert pool.measuring == 0
        finally:
            monkeypatch.undo()
            pool.busy = 0
            pool.close()

    def test_unmeasured_starts_and_ends_read_no_clock(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A tiny task's start and end only count (the hot path)."""
        from dataflow import _pool

        class NoClock:
            def perf_counter(self) -> float:
                raise AssertionError("the clock was read")

        async def main() -> None:
            monkeypatch.setattr(_pool, "time", NoClock())
            try:
                out = await _noop_pool(1)
            finally:
                monkeypatch.undo()
            assert out == 1

        dataflow.run(main, interop_threads=1)


def _noop_meta(x: object) -> None:
    return None


def _noop_handle(task: dataflow.Task, index: int | None, spec: object) -> dataflow.Pending[int]:
    return dataflow.Pending(task, index)


def _identity(x: int) -> int:
    return x


def _tiny_cost(x: object) -> dataflow.Cost:
    return dataflow.Cost(1.0, 8.0)


# Estimated tiny (no measured run), pinned to the pool.
_noop_pool = dataflow.op(
    "busy_test_noop", meta=_noop_meta, handle=_noop_handle, cost=_tiny_cost, inline=False
)(_identity)
