"""The ``"numba"`` recurrent engine (``ops._rnn_numba``): compiled sequence loops that release
the GIL, for small float32 models. Exact against the numpy kernels and torch; chosen only where
it applies; the API's errors; the GIL really released."""

from __future__ import annotations

import importlib.util
import itertools
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from ops import (
    _rnn_engine,
    _rnn_gru,
    _rnn_lstm,
    _rnn_numba,
    _rnn_projection,
    _rnn_sequence,
    nn,
)
from tests.test_nn import ref_rnn
from tests.test_rnn_sequence import GRU_CASES, GRU_HIDDEN, _rand, gru_case

needs_numba = pytest.mark.skipif(not _rnn_numba.available(), reason="numba not installed")

Array = np.ndarray[Any, Any]
TOL = 2e-5


@pytest.fixture(autouse=True)
def _default_engine_after() -> Iterator[None]:
    yield
    ops.set_recurrent_engine("auto")


def _plain_lstm(*args: Any) -> Any:
    return _rnn_lstm._lstm_sequence_plain(*args)


def _plain_gru(monkeypatch: pytest.MonkeyPatch, *args: Any) -> Any:
    with monkeypatch.context() as m:
        m.setattr(_rnn_engine, "SMALL_WEIGHTS_PER_STEP", 0)
        return _rnn_sequence.gru_sequence_kernel(*args)


@needs_numba
class TestTanh:
    def test_the_rational_tanh_is_within_4e7_of_tanh(self) -> None:
        """Over a dense grid of [-20, 20] (past the clamp) and random points: 3.3e-7 at most,
        against float64 tanh (numpy's float32 tanh: 6e-8)."""
        import numba

        _rnn_numba._compiled()  # (jits the module's _tanh)
        tanh = numba.njit(lambda a: np.array([_rnn_numba._tanh(v) for v in a]))
        for x in (
            np.linspace(-20, 20, 400_001, dtype=np.float32),
            np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * 4,
        ):
            err = np.abs(tanh(x).astype(np.float64) - np.tanh(x.astype(np.float64)))
            assert err.max() < 4e-7
        assert tanh(np.array([0.0, 50.0, -50.0], dtype=np.float32)).tolist() == [0.0, 1.0, -1.0]


@needs_numba
class TestKernels:
    @pytest.mark.parametrize(
        ("reverse", "batch_first", "with_state", "bias"),
        list(itertools.product((False, True), repeat=4)),
    )
    def test_lstm_equals_the_numpy_kernel(
        self, reverse: bool, batch_first: bool, with_state: bool, bias: bool
    ) -> None:
        steps, batch, inp, hid = 9, 2, 5, 7
        w_ih, w_hh = _rand(1, 4 * hid, inp), _rand(2, 4 * hid, hid)
        b = _rand(3, 4 * hid) if bias else None
        x = _rand(4, batch, steps, inp) if batch_first else _rand(4, steps, batch, inp)
        h0 = _rand(5, batch, hid) if with_state else None
        c0 = _rand(6, batch, hid) if with_state else None
        args = (x, w_ih, b, w_hh, h0, c0, reverse, batch_first)
        for got, want in zip(_rnn_numba.lstm_sequence(*args), _plain_lstm(*args), strict=True):
            assert got.shape == want.shape and got.dtype == np.float32
            np.testing.assert_allclose(got, want, atol=2e-6)
        if with_state:  # the caller's states are left alone
            np.testing.assert_array_equal(h0, _rand(5, batch, hid))

    @pytest.mark.parametrize(("reverse", "batch_first", "with_state", "biases"), GRU_CASES)
    def test_gru_equals_the_numpy_kernel(
        self,
        reverse: bool,
        batch_first: bool,
        with_state: bool,
        biases: str,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        args = gru_case(reverse, batch_first, with_state, biases)
        hid, b_hh = GRU_HIDDEN, args[4]
        want = _plain_gru(monkeypatch, *args)
        for got, exp in zip(_rnn_numba.gru_sequence(*args), want, strict=True):
            np.testing.assert_allclose(got, exp, atol=2e-6)
        if b_hh is not None:
            np.testing.assert_array_equal(b_hh, _rand(8, 3 * hid))

    @pytest.mark.parametrize(
        ("reverse", "batch_first", "with_state", "bias"),
        list(itertools.product((False, True), repeat=4)),
    )
    def test_the_blocked_and_fused_kernels_gate_step_equals_numpys(
        self, reverse: bool, batch_first: bool, with_state: bool, bias: bool
    ) -> None:
        """Past the compiled loops' bound the blocked and fused LSTM kernels keep BLAS's GEMMs
        and run each step's gate math as one compiled pass (bias folded in): the same values
        as numpy's passes (the numpy engine), for blocks copied or read in place, every
        flag, and torch's where torch is installed; the caller's states are left alone."""
        steps, batch, inp, hid = 7, 5, 24, 64
        w_ih, w_hh = _rand(1, 4 * hid, inp), _rand(2, 4 * hid, hid) * np.float32(0.3)
        b = _rand(3, 4 * hid) if bias else None
        x = _rand(4, batch, steps, inp) if batch_first else _rand(4, steps, batch, inp)
        h0 = _rand(5, batch, hid) if with_state else None
        c0 = _rand(6, batch, hid) if with_state else None
        args = (x, w_ih, b, w_hh, h0, c0, reverse, batch_first)
        kernels = [
            (_rnn_lstm._lstm_sequence_blocked, (16,)),
            (_rnn_lstm._lstm_sequence_blocked, (8, True)),
            (_rnn_lstm._lstm_sequence_fused, (32,)),
        ]
        ops.set_recurrent_engine("numpy")
        assert _rnn_engine._numba_gates(np.dtype(np.float32)) is None
        want = [kernel(*args, *extra) for kernel, extra in kernels]
        ops.set_recurrent_engine("numba")
        assert _rnn_engine._numba_gates(np.dtype(np.float32)) is not None
        assert _rnn_engine._numba_gates(np.dtype(np.float64)) is None
        for (kernel, extra), exp in zip(kernels, want, strict=True):
            got = kernel(*args, *extra)
            for g, w in zip(got, exp, strict=True):
                assert g.shape == w.shape and g.dtype == np.float32
                np.testing.assert_allclose(g, w, atol=2e-6)
        if with_state:
            np.testing.assert_array_equal(h0, _rand(5, batch, hid))
            np.testing.assert_array_equal(c0, _rand(6, batch, hid))
        torch = pytest.importorskip("torch")
        lstm = torch.nn.LSTM(inp, hid, batch_first=batch_first)
        with torch.no_grad():
            lstm.weight_ih_l0.copy_(torch.from_numpy(w_ih))
            lstm.weight_hh_l0.copy_(torch.from_numpy(w_hh))
            lstm.bias_ih_l0.copy_(torch.from_numpy(b if bias else np.zeros(4 * hid, np.float32)))
            lstm.bias_hh_l0.zero_()
            xt = (
                torch.from_numpy(x).flip(1 if batch_first else 0)
                if reverse
                else torch.from_numpy(x)
            )
            state = None
            if with_state:
                state = (torch.from_numpy(h0)[None], torch.from_numpy(c0)[None])
            out, (h_n, c_n) = lstm(xt, state)
            if reverse:
                out = out.flip(1 if batch_first else 0)
        got = _rnn_lstm._lstm_sequence_blocked(*args, 8, True)
        np.testing.assert_allclose(got[0], out.numpy(), atol=1e-5)
        np.testing.assert_allclose(got[1], h_n[0].numpy(), atol=1e-5)
        np.testing.assert_allclose(got[2], c_n[0].numpy(), atol=1e-5)

    @pytest.mark.parametrize("reverse", [False, True])
    def test_the_gate_step_across_projection_chunks(
        self, reverse: bool, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The projection in chunks of 2 steps (a long sequence's, bounded by CHUNK_BYTES):
        the compiled gate step reads each chunk's rows as numpy's passes do, forwards and
        reversed, LSTM and GRU."""
        steps, batch, inp, hid = 7, 3, 5, 16
        one_step = batch * 4 * hid * 4  # an LSTM step's projection, float32
        monkeypatch.setattr(_rnn_projection, "CHUNK_BYTES", 2 * one_step)
        assert _rnn_projection.chunk_steps(steps, batch, 4 * hid, 4) == 2
        x, h0 = _rand(4, steps, batch, inp), _rand(5, batch, hid)
        lstm = (x, _rand(1, 4 * hid, inp), _rand(3, 4 * hid), _rand(2, 4 * hid, hid), h0,
                _rand(6, batch, hid), reverse, False)  # fmt: skip
        gru = (x, _rand(1, 3 * hid, inp), _rand(3, 3 * hid), _rand(2, 3 * hid, hid),
               _rand(8, 3 * hid), h0, reverse, False)  # fmt: skip

        def runs() -> list[tuple[Array, ...]]:
            return [
                _rnn_lstm._lstm_sequence_blocked(*lstm, 8, True),
                _rnn_gru._gru_sequence_blocked(*gru, 8, True),
            ]

        ops.set_recurrent_engine("numpy")
        want = runs()
        ops.set_recurrent_engine("numba")
        for got, exp in zip(runs(), want, strict=True):
            for g, w in zip(got, exp, strict=True):
                np.testing.assert_allclose(g, w, atol=2e-6)

    @pytest.mark.parametrize(("reverse", "batch_first", "with_state", "biases"), GRU_CASES)
    def test_the_blocked_gru_kernels_gate_step_equals_numpys(
        self, reverse: bool, batch_first: bool, with_state: bool, biases: str
    ) -> None:
        """The blocked GRU kernel's gate step, compiled (both biases folded in): numpy's
        passes' values for blocks copied (of 1 and 7 columns) or read in place, every flag
        and either bias alone; the caller's state and biases are left alone."""
        args = gru_case(reverse, batch_first, with_state, biases)
        kernels = [(1,), (GRU_HIDDEN,), (1, True)]
        ops.set_recurrent_engine("numpy")
        want = [_rnn_gru._gru_sequence_blocked(*args, *extra) for extra in kernels]
        ops.set_recurrent_engine("numba")
        assert _rnn_engine._numba_gates(np.dtype(np.float32), gru=True) is not None
        for extra, exp in zip(kernels, want, strict=True):
            got = _rnn_gru._gru_sequence_blocked(*args, *extra)
            for g, w in zip(got, exp, strict=True):
                assert g.shape == w.shape and g.dtype == np.float32
                np.testing.assert_allclose(g, w, atol=2e-6)
        if with_state:
            np.testing.assert_array_equal(args[5], _rand(5, 2, GRU_HIDDEN))
        if args[4] is not None:
            np.testing.assert_array_equal(args[4], _rand(8, 3 * GRU_HIDDEN))

    def test_nan_and_inf_propagate_as_in_numpy(self) -> None:
        """A NaN in the input gives NaN where the numpy kernel gives NaN (not a clamped 1);
        infinities saturate the gates as tanh does."""
        w_ih, w_hh = _rand(1, 24, 5), _rand(2, 24, 6)
        for bad in (np.nan, np.inf, -np.inf):
            x = _rand(3, 7, 2, 5)
            x[3, 1, 2] = bad
            args = (x, w_ih, None, w_hh, None, None, False, False)
            with np.errstate(invalid="ignore", over="ignore"):
                want = _plain_lstm(*args)
            got = _rnn_numba.lstm_sequence(*args)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
                ok = ~np.isnan(w)
                np.testing.assert_allclose(g[ok], w[ok], atol=2e-6)

    def test_a_fortran_ordered_weight_gives_the_same_values(self) -> None:
        """``lay_out`` may store the recurrent weight in Fortran order."""
        w_ih, w_hh, x = _rand(1, 24, 5), _rand(2, 24, 6), _rand(3, 7, 2, 5)
        c_order = _rnn_numba.lstm_sequence(x, w_ih, None, w_hh, None, None, False, False)
        f_order = _rnn_numba.lstm_sequence(
            x, w_ih, None, np.asfortranarray(w_hh), None, None, False, False
        )
        for a, b in zip(c_order, f_order, strict=True):
            np.testing.assert_array_equal(a, b)

    def test_first_use_from_two_threads_at_once(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Two directions' first kernels on two workers compile the loops once (a race there
        jitted an already jitted helper: TypeError)."""
        monkeypatch.setattr(_rnn_numba, "_loops", None)
        for name, fn in _rnn_numba._PY.items():
            monkeypatch.setattr(_rnn_numba, name, fn)
        w_ih, w_hh, x = _rand(1, 24, 5), _rand(2, 24, 6), _rand(3, 7, 2, 5)
        start = threading.Barrier(4)
        outs: list[Any] = []

        def run() -> None:
            start.wait()
            outs.append(_rnn_numba.lstm_sequence(x, w_ih, None, w_hh, None, None, False, False))

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(outs) == 4
        want = _plain_lstm(x, w_ih, None, w_hh, None, None, False, False)
        for out in outs:
            np.testing.assert_allclose(out[0], want[0], atol=2e-6)

    def test_the_kernel_releases_the_gil(self) -> None:
        """Two long runs on two threads overlap in time, with a switch interval no GIL-bound
        kernel could be preempted within."""
        w_ih, w_hh, x = _rand(1, 512, 128), _rand(2, 512, 128) * 0.1, _rand(3, 3000, 1, 128)
        _rnn_numba.lstm_sequence(x[:2], w_ih, None, w_hh, None, None, False, False)  # compiled
        spans: list[tuple[float, float]] = []
        start = threading.Barrier(2)

        def run() -> None:
            start.wait()
            t0 = time.perf_counter()
            _rnn_numba.lstm_sequence(x, w_ih, None, w_hh, None, None, False, False)
            spans.append((t0, time.perf_counter()))

        before = sys.getswitchinterval()
        sys.setswitchinterval(5.0)
        try:
            threads = [threading.Thread(target=run) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(before)
        (_, a1), (b0, _) = sorted(spans)
        assert b0 < a1  # the second started before the first ended


@needs_numba
class TestEngine:
    def test_small_float32_models_take_it_and_others_keep_numpy(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        used: list[tuple[int, ...]] = []
        real = _rnn_numba.lstm_sequence

        def spy(*args: Any) -> Any:
            used.append(args[3].shape)
            return real(*args)

        monkeypatch.setattr(_rnn_numba, "lstm_sequence", spy)
        ops.set_recurrent_engine("numba")
        assert ops.get_recurrent_engine() == "numba"
        small_w = (_rand(1, 24, 6), _rand(2, 24, 6))
        _rnn_sequence.lstm_sequence_kernel(_rand(3, 7, 1, 6), small_w[0], None, small_w[1],
                                           None, None, False, False)  # fmt: skip
        _rnn_sequence.lstm_sequence_kernel(  # float64: numpy's exact functions
            _rand(3, 7, 1, 6).astype(np.float64),
            small_w[0].astype(np.float64), None, small_w[1].astype(np.float64),
            None, None, False, False,
        )  # fmt: skip
        # Past numpy's small kernel but within NUMBA_STEP_MACS_MAX (1 x 256 x 64 a step).
        mid = _rand(4, 256, 64), _rand(5, 256, 64)
        _rnn_sequence.lstm_sequence_kernel(_rand(6, 2, 1, 64), mid[0], None, mid[1], None, None,
                                           False, False)  # fmt: skip
        # Past it (32 x 512 x 128 a step): BLAS's products win there.
        big = _rand(4, 512, 128), _rand(5, 512, 128)
        assert _rnn_engine.NUMBA_STEP_MACS_MAX < 32 * 512 * 128
        _rnn_sequence.lstm_sequence_kernel(_rand(6, 2, 32, 128), big[0], None, big[1], None,
                                           None, False, False)  # fmt: skip
        assert used == [(24, 6), (256, 64)]
        ops.set_recurrent_engine("numpy")
        _rnn_sequence.lstm_sequence_kernel(_rand(3, 7, 1, 6), small_w[0], None, small_w[1],
                                           None, None, False, False)  # fmt: skip
        assert used == [(24, 6), (256, 64)]

    @pytest.mark.parametrize("mode", ["LSTM", "GRU"])
    def test_modules_match_the_reference(self, mode: str) -> None:
        """A bidirectional two-layer module on the engine: the reference loop's values."""
        ops.set_recurrent_engine("numba")
        cls = nn.LSTM if mode == "LSTM" else nn.GRU
        m = cls(8, 16, num_layers=2, bidirectional=True, seed=0)
        x = _rand(1, 12, 2, 8)

        async def main() -> Any:
            return await m(x)

        got = dataflow.run(main)
        out_ref, h_ref, _ = ref_rnn(mode, m.state_dict(), x, None, None, 2, True, False)
        np.testing.assert_allclose(got[0], out_ref, atol=TOL)
        h_n = got[1][0] if mode == "LSTM" else got[1]
        np.testing.assert_allclose(h_n, h_ref, atol=TOL)

    @pytest.mark.parametrize("mode", ["LSTM", "GRU"])
    @pytest.mark.parametrize(("batch", "hidden"), [(1, 256), (2, 256), (4, 128)])
    def test_middle_sized_models_match_the_reference(
        self, mode: str, batch: int, hidden: int
    ) -> None:
        """Past numpy's small kernel, within NUMBA_STEP_MACS_MAX: longer dot products in the
        compiled loop, still the reference loop's values."""
        gates = 4 if mode == "LSTM" else 3
        assert batch * gates * hidden * hidden <= _rnn_engine.NUMBA_STEP_MACS_MAX
        used: list[int] = []
        real = _rnn_numba.lstm_sequence if mode == "LSTM" else _rnn_numba.gru_sequence

        def spy(*args: Any) -> Any:
            used.append(1)
            return real(*args)

        ops.set_recurrent_engine("auto")
        cls = nn.LSTM if mode == "LSTM" else nn.GRU
        m = cls(hidden, hidden, bidirectional=True, seed=1)
        x = _rand(2, 6, batch, hidden)

        async def main() -> Any:
            return await m(x)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_rnn_numba, "lstm_sequence" if mode == "LSTM" else "gru_sequence", spy)
            got = dataflow.run(main)
        assert used  # it ran on numba's loop
        out_ref, _, _ = ref_rnn(mode, m.state_dict(), x, None, None, 1, True, False)
        np.testing.assert_allclose(got[0], out_ref, atol=TOL)

    @pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
    @pytest.mark.parametrize("mode", ["LSTM", "GRU"])
    def test_modules_match_torch(self, mode: str) -> None:
        import torch

        ops.set_recurrent_engine("numba")
        torch.manual_seed(0)
        tm = getattr(torch.nn, mode)(16, 24, bidirectional=True)
        cls = nn.LSTM if mode == "LSTM" else nn.GRU
        m = cls(16, 24, bidirectional=True)
        m.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
        x = _rand(3, 20, 3, 16)
        with torch.no_grad():
            expected = tm(torch.from_numpy(x))

        async def main() -> Any:
            return await m(x)

        got = dataflow.run(main)
        np.testing.assert_allclose(got[0], expected[0].numpy(), atol=TOL, rtol=1e-4)

    def test_parameters_written_in_place_take_effect(self) -> None:
        ops.set_recurrent_engine("numba")
        m = nn.LSTM(4, 5, seed=3)
        x = _rand(1, 6, 2, 4)

        async def main() -> Any:
            return await m(x)

        before = dataflow.run(main)[0]
        w_hh: Array = getattr(m, "weight_hh_l0")  # noqa: B009 - set by name
        w_hh *= np.float32(0.5)
        after = dataflow.run(main)[0]
        out_ref, _, _ = ref_rnn("LSTM", m.state_dict(), x, None, None, 1, False, False)
        np.testing.assert_allclose(after, out_ref, atol=TOL)
        assert not np.allclose(after, before, atol=1e-3)

    def test_changing_the_engine_forgets_what_the_sequence_ops_learnt(self) -> None:
        m = nn.GRU(4, 5, bidirectional=True, seed=1)

        async def main() -> Any:
            return await m(_rand(1, 6, 2, 4))

        dataflow.run(main)
        assert ops._rnn_ops._gru_sequence._sigs
        ops.set_recurrent_engine("numba")
        assert not ops._rnn_ops._gru_sequence._sigs
        assert not ops._rnn_ops._lstm_sequence._sigs


class TestErrors:
    """Bad engine names fail at the call, whether numba is installed or not."""

    def test_unknown_or_mistyped_names(self) -> None:
        ops.set_recurrent_engine("numpy")
        with pytest.raises(
            dataflow.OpInputError, match="one of 'auto', 'numpy', 'numba', got 'cuda'"
        ):
            ops.set_recurrent_engine("cuda")
        with pytest.raises(dataflow.OpTypeError, match="got int: 5"):
            ops.set_recurrent_engine(5)  # type: ignore[arg-type]
        assert ops.get_recurrent_engine() == "numpy"

    def test_numba_missing_names_the_extra(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The fix named installs numba from PyPI, or the extra from a checkout: the
        distribution itself is not on PyPI (README), so `pip install numpy-dataflow[numba]`
        would fail."""
        ops.set_recurrent_engine("numpy")
        monkeypatch.setattr(_rnn_numba, "available", lambda: False)
        with pytest.raises(dataflow.DataflowRuntimeError) as info:
            ops.set_recurrent_engine("numba")
        assert "numpy-dataflow[" not in str(info.value)
        assert "pip install 'numba>=0.60'" in str(info.value)
        assert "pip install -e '.[numba]'" in str(info.value)
        assert ops.get_recurrent_engine() == "numpy"


class TestAuto:
    """The default engine, "auto": numba where it is installed and works, else numpy."""

    @staticmethod
    def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
        ops.set_recurrent_engine("auto")
        monkeypatch.setattr(_rnn_engine, "_auto", [None])

    def test_it_is_the_default(self) -> None:
        assert _rnn_engine._engine[0] == "auto"  # (the fixture restores it after each test)

    @needs_numba
    def test_numba_when_installed(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._fresh(monkeypatch)
        assert ops.get_recurrent_engine() == "numba"
        x = _rand(2, 5, 1, 8)
        w_ih, w_hh = _rand(3, 16, 8), _rand(4, 16, 4)
        assert _rnn_engine._small_engine(x, w_ih, w_hh, 4, False) == "numba"

    def test_numpy_without_numba(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._fresh(monkeypatch)
        monkeypatch.setattr(_rnn_numba, "available", lambda: False)
        assert ops.get_recurrent_engine() == "numpy"

    def test_a_broken_numba_warns_once_and_runs_numpy(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self._fresh(monkeypatch)
        monkeypatch.setattr(_rnn_numba, "available", lambda: True)

        def broken() -> None:
            raise ImportError("numba needs a newer numpy")

        monkeypatch.setattr(_rnn_numba, "check", broken)
        m = nn.LSTM(4, 3, bidirectional=True)
        x = _rand(6, 5, 2, 4)

        async def main() -> Any:
            return await m(x)

        with pytest.warns(RuntimeWarning, match="numba needs a newer numpy"):
            out, _ = dataflow.run(main)
        ref, _, _ = ref_rnn("LSTM", m.state_dict(), x, None, None, 1, True, False)
        np.testing.assert_allclose(np.asarray(out), ref, rtol=TOL, atol=TOL)
        assert ops.get_recurrent_engine() == "numpy"
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dataflow.run(main)  # no second warning

    def test_float64_models_keep_numpy(self) -> None:
        x = _rand(7, 5, 1, 8).astype(np.float64)
        w_ih, w_hh = _rand(8, 16, 8).astype(np.float64), _rand(9, 16, 4).astype(np.float64)
        assert _rnn_engine._small_engine(x, w_ih, w_hh, 4, False) == "numpy"
