"""Whole-sequence recurrent ops, weight layout and the recurrent modules' granularity.

Every kernel is checked against the float64 loop reference of tests/test_nn.py and, where
torch is installed, against ``torch.nn.LSTM`` / ``GRU`` on random data.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from ops import (
    _rnn_buffers,
    _rnn_engine,
    _rnn_forms,
    _rnn_gates,
    _rnn_gru,
    _rnn_layout,
    _rnn_lstm,
    _rnn_measure,
    _rnn_projection,
    _rnn_sequence,
    _rnn_small,
    nn,
)
from ops._recurrent import rnn_projection
from tests.test_nn import ref_rnn

Array = np.ndarray[Any, Any]
TOL = 2e-5


@pytest.fixture(autouse=True)
def _numpy_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """These are numpy's kernels: the default engine ("auto") would give the small and
    middle-sized float32 models here to numba's loops (tests/test_rnn_numba.py)."""
    monkeypatch.setattr(_rnn_engine, "_engine", ["numpy"])


def _rand(seed: int, *shape: int) -> Array:
    a: Array = np.random.default_rng(seed).uniform(-1.0, 1.0, shape).astype(np.float32)
    return a


# A GRU direction's kernel arguments over every flag and either bias alone (random weights,
# input and state), for the kernels that must agree (the small, plain and numba ones).
GRU_CASES = list(
    itertools.product((False, True), (False, True), (False, True), ("both", "ih", "hh", "none"))
)
GRU_HIDDEN = 7


def gru_case(reverse: bool, batch_first: bool, with_state: bool, biases: str) -> tuple[Any, ...]:
    """``(x, w_ih, b_ih, w_hh, b_hh, h0, reverse, batch_first)``: 9 steps, batch 2, 5 inputs,
    hidden GRU_HIDDEN (``b_hh`` is ``_rand(8, 3 * hidden)`` when present)."""
    steps, batch, inp, hid = 9, 2, 5, GRU_HIDDEN
    w_ih, w_hh = _rand(1, 3 * hid, inp), _rand(2, 3 * hid, hid)
    b_ih = _rand(3, 3 * hid) if biases in ("both", "ih") else None
    b_hh = _rand(8, 3 * hid) if biases in ("both", "hh") else None
    x = _rand(4, batch, steps, inp) if batch_first else _rand(4, steps, batch, inp)
    h0 = _rand(5, batch, hid) if with_state else None
    return (x, w_ih, b_ih, w_hh, b_hh, h0, reverse, batch_first)


def _module(mode: str, **kwargs: Any) -> nn.LSTM | nn.GRU:
    cls = nn.LSTM if mode == "LSTM" else nn.GRU
    return cls(**kwargs)


def _forward(m: nn.LSTM | nn.GRU, x: Array, h0: Array | None, c0: Array | None) -> Any:
    async def main() -> Any:
        if isinstance(m, nn.LSTM):
            return await m(x, None if h0 is None else (h0, c0))
        return await m(x, h0)

    return dataflow.run(main)


@pytest.fixture
def no_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small models take _lstm_sequence_small / _gru_sequence_small; this sends them to the
    other forms."""
    monkeypatch.setattr(_rnn_engine, "SMALL_WEIGHTS_PER_STEP", 0)


class TestSequenceOps:
    """lstm_sequence / gru_sequence against the loop reference, every flag."""

    @pytest.mark.parametrize(
        ("mode", "reverse", "batch_first", "with_state"),
        list(itertools.product(("LSTM", "GRU"), (False, True), (False, True), (False, True))),
    )
    def test_against_reference(
        self, mode: str, reverse: bool, batch_first: bool, with_state: bool
    ) -> None:
        """One direction over a sequence equals the reference loop (reverse: flipped time)."""
        steps, batch, inp, hid = 7, 3, 5, 6
        m = _module(mode, input_size=inp, hidden_size=hid, seed=2, batch_first=batch_first)
        p = m.state_dict()
        x = _rand(1, batch, steps, inp) if batch_first else _rand(1, steps, batch, inp)
        h0 = _rand(3, 1, batch, hid) if with_state else None
        c0 = _rand(4, 1, batch, hid) if with_state and mode == "LSTM" else None
        t_axis = 1 if batch_first else 0
        x_in = np.flip(x, t_axis).copy() if reverse else x
        out_ref, h_ref, c_ref = ref_rnn(mode, p, x_in, h0, c0, 1, False, batch_first)
        if reverse:
            out_ref = np.flip(out_ref, t_axis)
        h0_ = None if h0 is None else h0[0]
        if mode == "LSTM":
            c0_ = None if c0 is None else c0[0]
            b = p["bias_ih_l0"] + p["bias_hh_l0"]
            got = ops.lstm_sequence(
                x, p["weight_ih_l0"], b, p["weight_hh_l0"], h0_, c0_, reverse, batch_first
            )
            out, h_n, c_n = (g.result() for g in got)
            np.testing.assert_allclose(c_n, c_ref[0], atol=TOL)
        else:
            got2 = ops.gru_sequence(
                x,
                p["weight_ih_l0"],
                p["bias_ih_l0"],
                p["weight_hh_l0"],
                p["bias_hh_l0"],
                h0_,
                reverse,
                batch_first,
            )
            out, h_n = (g.result() for g in got2)
        np.testing.assert_allclose(out, out_ref, atol=TOL)
        np.testing.assert_allclose(h_n, h_ref[0], atol=TOL)

    @pytest.mark.parametrize(
        ("reverse", "batch_first", "with_state"), list(itertools.product((False, True), repeat=3))
    )
    def test_transposed_form_against_reference(
        self,
        reverse: bool,
        batch_first: bool,
        with_state: bool,
        monkeypatch: pytest.MonkeyPatch,
        no_small: None,
    ) -> None:
        """The LSTM kernel in its transposed form (W @ h.T: where that GEMM is faster) equals
        the reference loop, every flag, with the projection in chunks of 3 steps."""
        used: list[bool] = []
        transposed = _rnn_lstm._lstm_sequence_transposed

        def spy(*args: Any) -> Any:
            used.append(True)
            return transposed(*args)

        monkeypatch.setattr(_rnn_forms, "_kernel_form", lambda *a: "transposed")
        monkeypatch.setattr(_rnn_lstm, "_lstm_sequence_transposed", spy)
        monkeypatch.setattr(_rnn_projection, "CHUNK_BYTES", 3 * 3 * 4 * 6 * 4)
        self.test_against_reference("LSTM", reverse, batch_first, with_state)
        assert used

    @pytest.mark.parametrize("block", [1, 2, 3, 6])
    @pytest.mark.parametrize(
        ("reverse", "batch_first", "with_state"), list(itertools.product((False, True), repeat=3))
    )
    @pytest.mark.parametrize("mode", ["LSTM", "GRU"])
    @pytest.mark.parametrize("view", [False, True])
    def test_blocked_form_against_reference(
        self,
        view: bool,
        mode: str,
        block: int,
        reverse: bool,
        batch_first: bool,
        with_state: bool,
        monkeypatch: pytest.MonkeyPatch,
        no_small: None,
    ) -> None:
        """The LSTM and GRU kernels with their recurrent GEMM in column blocks (h @ Wb[k], one
        stacked matmul: where that is faster) equal the reference loop, every flag and block
        width (hidden 6: blocks of 1, 2, 3 and 6 gate columns), with the projection in chunks
        of 3 steps; W_hh copied into blocks, or read in place (("view", width): its row
        blocks as transposed operands, no copy)."""
        used: list[tuple[Any, ...]] = []
        name = f"_{mode.lower()}_sequence_blocked"
        kernels = _rnn_lstm if mode == "LSTM" else _rnn_gru  # (the blocked kernel's module)
        blocked = getattr(kernels, name)

        def spy(*args: Any) -> Any:
            used.append(args[8:])
            return blocked(*args)

        copies: list[bool] = []
        weight_blocks = _rnn_buffers._weight_blocks

        def blocks_spy(w: Any, block: int, view: bool = False) -> Any:
            got = weight_blocks(w, block, view)
            copies.append(not np.shares_memory(got, w))
            return got

        gates = 4 if mode == "LSTM" else 3
        form = ("view", block) if view else block
        monkeypatch.setattr(_rnn_forms, "_kernel_form", lambda *a: form)
        monkeypatch.setattr(kernels, name, spy)
        monkeypatch.setattr(kernels, "_weight_blocks", blocks_spy)  # (the kernel's binding)
        monkeypatch.setattr(_rnn_projection, "CHUNK_BYTES", 3 * 3 * gates * 6 * 4)
        self.test_against_reference(mode, reverse, batch_first, with_state)
        assert used == [(block, True) if view else (block,)]
        assert copies == [not view]

    @pytest.mark.parametrize("block", [1, 2, 3, 6])
    @pytest.mark.parametrize(
        ("reverse", "batch_first", "with_state"), list(itertools.product((False, True), repeat=3))
    )
    def test_fused_form_against_reference(
        self,
        block: int,
        reverse: bool,
        batch_first: bool,
        with_state: bool,
        monkeypatch: pytest.MonkeyPatch,
        no_small: None,
    ) -> None:
        """The LSTM kernel with the input projection inside each step's blocked GEMM ([x_t, h]
        @ Wb[k]: where that is faster) equals the reference loop, every flag and block width
        (hidden 6, input 5: the weights' copy has unequal parts)."""
        used: list[int] = []
        fused = _rnn_lstm._lstm_sequence_fused

        def spy(*args: Any) -> Any:
            used.append(args[-1])
            return fused(*args)

        monkeypatch.setattr(_rnn_forms, "_kernel_form", lambda *a: ("fused", block))
        monkeypatch.setattr(_rnn_lstm, "_lstm_sequence_fused", spy)
        self.test_against_reference("LSTM", reverse, batch_first, with_state)
        assert used == [block]

    def test_the_fused_form_equals_torch_and_the_other_forms(self) -> None:
        """On random data at a real width (hidden 64, input 48, batch 5), with the weights in
        either memory order and a dtype-cast state: the fused kernel agrees with the plain,
        transposed and blocked ones (weight copied or read in place), and with torch's LSTM
        where torch is installed."""
        steps, batch, inp, hid = 9, 5, 48, 64
        w_ih, w_hh, bias = _rand(1, 4 * hid, inp), _rand(2, 4 * hid, hid), _rand(3, 4 * hid)
        w_hh *= np.float32(0.2)
        x, h0, c0 = _rand(4, steps, batch, inp), _rand(5, batch, hid), _rand(6, batch, hid)
        args = (x, w_ih, bias, w_hh, h0, c0, False, False)
        want = _rnn_lstm._lstm_sequence_plain(*args)
        others = [
            _rnn_lstm._lstm_sequence_transposed(*args),
            _rnn_lstm._lstm_sequence_blocked(*args, 32),
            _rnn_lstm._lstm_sequence_blocked(*args, 8, True),
            _rnn_lstm._lstm_sequence_blocked(*args, 16, True),
        ]
        for block in (16, 32, 64):
            for ih, hh in ((w_ih, w_hh), (np.asfortranarray(w_ih), np.asfortranarray(w_hh))):
                others.append(
                    _rnn_lstm._lstm_sequence_fused(x, ih, bias, hh, h0, c0, False, False, block)
                )
        others.append(
            _rnn_lstm._lstm_sequence_fused(
                x, w_ih, None, w_hh, h0.astype(np.float64), c0, False, False, 16
            )
        )
        no_bias = _rnn_lstm._lstm_sequence_plain(x, w_ih, None, w_hh, h0, c0, False, False)
        for got in others[:-1]:
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, atol=1e-5)
        for g, w in zip(others[-1], no_bias, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-5)
        torch = pytest.importorskip("torch")
        lstm = torch.nn.LSTM(inp, hid)
        with torch.no_grad():
            lstm.weight_ih_l0.copy_(torch.from_numpy(w_ih))
            lstm.weight_hh_l0.copy_(torch.from_numpy(w_hh))
            lstm.bias_ih_l0.copy_(torch.from_numpy(bias))
            lstm.bias_hh_l0.zero_()
            out, (h_n, c_n) = lstm(
                torch.from_numpy(x), (torch.from_numpy(h0)[None], torch.from_numpy(c0)[None])
            )
        fused = others[5]
        np.testing.assert_allclose(fused[0], out.numpy(), atol=1e-5)
        np.testing.assert_allclose(fused[1], h_n[0].numpy(), atol=1e-5)
        np.testing.assert_allclose(fused[2], c_n[0].numpy(), atol=1e-5)

    @pytest.mark.parametrize("order", ["C", "F"])
    def test_the_blocked_form_reads_either_weight_order_and_equals_the_others(
        self, order: str
    ) -> None:
        """Its per-call block copy of W_hh reads a row-major or Fortran-ordered weight alike;
        plain, transposed and blocked kernels agree on random data (hidden 64, batch 5)."""
        steps, batch, inp, hid = 6, 5, 7, 64
        w_ih, w_hh, bias = _rand(1, 4 * hid, inp), _rand(2, 4 * hid, hid), _rand(3, 4 * hid)
        w_hh *= np.float32(0.2)
        x, h0, c0 = _rand(4, steps, batch, inp), _rand(5, batch, hid), _rand(6, batch, hid)
        args = (x, w_ih, bias, w_hh, h0, c0, True, False)
        want = _rnn_lstm._lstm_sequence_plain(*args)
        laid = np.asfortranarray(w_hh) if order == "F" else w_hh
        for block in (32, 64, 16):
            got = _rnn_lstm._lstm_sequence_blocked(x, w_ih, bias, laid, h0, c0, True, False, block)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, atol=1e-5)
        got = _rnn_lstm._lstm_sequence_transposed(*args)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-5)

    def test_a_form_is_measured_by_one_thread_while_the_others_wait(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The first calls of a model's directions come on several threads at once: one
        measures, the others wait for its answer instead of timing kernels side by side."""
        import threading
        import time

        calls: list[tuple[Any, ...]] = []

        def measure(*key: Any) -> Any:
            calls.append(key)
            time.sleep(0.05)
            return 64

        monkeypatch.setattr(_rnn_forms, "_measure_form", measure)
        monkeypatch.setattr(_rnn_forms, "_forms", {})
        monkeypatch.setattr(_rnn_forms, "_buckets", {})
        got: list[Any] = []
        key = (7, 192, 4, np.dtype(np.float32), 1, False, 96)
        threads = [
            threading.Thread(target=lambda: got.append(_rnn_forms._kernel_form(*key)))
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == [64] * 4
        assert calls == [key]
        # No input size given: the hidden size's, a key of its own.
        assert _rnn_forms._kernel_form(*key[:6]) == 64
        assert calls == [key, (*key[:6], 192)]

    def test_forms_are_measured_per_blas_thread_count(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The kernels ask for the form at the BLAS thread count of the moment (a runtime
        sets it for the process: a model built outside one measured its layout under
        another) and for the weight's order: a Fortran-ordered one (laid out for the plain
        form, perhaps under another count) is measured without the transposed form, which
        would need a row-major copy at every call; given it anyway, the kernel runs plain."""
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1, user_api="blas"):
            assert _rnn_measure._blas_threads() == 1
        asked: list[tuple[Any, ...]] = []
        ran: list[bool] = []
        transposed = _rnn_lstm._lstm_sequence_transposed

        def form(*args: Any) -> Any:
            asked.append(args)
            return "transposed"

        def spy(*args: Any) -> Any:
            ran.append(bool(args[3].flags.c_contiguous))
            return transposed(*args)

        monkeypatch.setattr(_rnn_measure, "_blas_threads", lambda: 7)
        monkeypatch.setattr(_rnn_forms, "_kernel_form", form)
        monkeypatch.setattr(_rnn_lstm, "_lstm_sequence_transposed", spy)
        monkeypatch.setattr(_rnn_engine, "SMALL_WEIGHTS_PER_STEP", 0)
        hid = 8
        w_ih, w_hh, bias = _rand(1, 4 * hid, 5), _rand(2, 4 * hid, hid), _rand(3, 4 * hid)
        x = _rand(4, 6, 3, 5)
        args = (x, w_ih, bias, np.asfortranarray(w_hh), None, None, False, False)
        got = _rnn_sequence.lstm_sequence_kernel(*args)
        assert asked == [(3, hid, 4, np.dtype(np.float32), 7, True, 5)]
        assert ran == []  # plain: the transposed form wants the weight row-major
        want = transposed(x, w_ih, bias, w_hh, None, None, False, False)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-6)
        _rnn_sequence.lstm_sequence_kernel(x, w_ih, bias, w_hh, None, None, False, False)
        assert asked[-1][5] is False and ran == [True]

    @pytest.mark.parametrize("mode", ["LSTM", "GRU"])
    def test_a_weight_past_the_copy_bound_runs_in_either_order(
        self, mode: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A weight whose block copy would pass BLOCK_COPY_BYTES_MAX (the tutorial's size:
        here a smaller one with the bound lowered), row-major or in Fortran order (as
        lay_out stores it where the plain form won; an op's argument that big reaches the
        kernel as it is), runs and equals the plain kernel: the form measurement has fewer
        candidates, down to one."""
        monkeypatch.setattr(_rnn_forms, "BLOCK_COPY_BYTES_MAX", 1024)
        monkeypatch.setattr(_rnn_forms, "_forms", {})
        monkeypatch.setattr(_rnn_forms, "_buckets", {})
        monkeypatch.setattr(_rnn_engine, "SMALL_WEIGHTS_PER_STEP", 0)
        gates, hid, inp = (4, 64, 16) if mode == "LSTM" else (3, 64, 16)
        w_ih, w_hh, bias = (
            _rand(1, gates * hid, inp),
            _rand(2, gates * hid, hid),
            _rand(3, gates * hid),
        )
        w_hh *= np.float32(0.2)
        x = _rand(4, 6, 4, inp)
        got: tuple[Array, ...]
        want: tuple[Array, ...]
        for laid in (w_hh, np.asfortranarray(w_hh)):
            if mode == "LSTM":
                got = _rnn_sequence.lstm_sequence_kernel(
                    x, w_ih, bias, laid, None, None, False, False
                )
                want = _rnn_lstm._lstm_sequence_plain(x, w_ih, bias, w_hh, None, None, False, False)
            else:
                got = _rnn_sequence.gru_sequence_kernel(
                    x, w_ih, bias, laid, bias, None, False, False
                )
                want = _rnn_gru._gru_sequence_plain(x, w_ih, bias, w_hh, bias, None, False, False)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, atol=1e-5)

    def test_the_blocked_form_reads_weights_written_in_place(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """It copies W_hh into blocks at each call: an in-place write shows at the next one."""
        monkeypatch.setattr(_rnn_forms, "_kernel_form", lambda *a: 4)
        monkeypatch.setattr(_rnn_engine, "SMALL_WEIGHTS_PER_STEP", 0)
        m = nn.LSTM(4, 8, seed=3)
        x = _rand(1, 6, 3, 4)
        before = _forward(m, x, None, None)[0]
        w_hh: Array = getattr(m, "weight_hh_l0")  # noqa: B009 - set by name
        w_hh *= np.float32(0.5)
        after = _forward(m, x, None, None)[0]
        out_ref, _, _ = ref_rnn("LSTM", m.state_dict(), x, None, None, 1, False, False)
        np.testing.assert_allclose(after, out_ref, atol=TOL)
        assert not np.allclose(after, before, atol=1e-3)

    @pytest.mark.parametrize(
        ("tanh_form", "form"), list(itertools.product((False, True), ("plain", "transposed", 3)))
    )
    @pytest.mark.parametrize("mode", ["LSTM", "GRU"])
    def test_either_form_of_the_nonlinearities_against_reference(
        self,
        mode: str,
        tanh_form: bool,
        form: str | int,
        monkeypatch: pytest.MonkeyPatch,
        no_small: None,
    ) -> None:
        """Gates through np.tanh (sigmoid = (tanh(x/2) + 1) / 2) or through np.exp, whichever
        measures faster, in every GEMM form: the same results within float32 rounding."""
        monkeypatch.setattr(_rnn_gates, "_tanh_form_is_faster", lambda *a: tanh_form)
        monkeypatch.setattr(_rnn_forms, "_kernel_form", lambda *a: form)
        for reverse, with_state in ((False, False), (True, True)):
            self.test_against_reference(mode, reverse, False, with_state)

    @pytest.mark.parametrize("projection_form", [0, 1, 2, 3, 6])
    @pytest.mark.parametrize("mode", ["LSTM", "GRU"])
    def test_every_form_of_the_projection_against_reference(
        self,
        mode: str,
        projection_form: int,
        monkeypatch: pytest.MonkeyPatch,
        no_small: None,
    ) -> None:
        """The input projection as ``x @ W.T``, as the transpose of ``W @ x.T``, or in blocks
        of W's rows read in place (faster for few rows with some BLAS kernels; hidden 6: 4 or
        3 gates, blocks of 2, 3 and 6 rows): the same results, chunked or not."""
        monkeypatch.setattr(_rnn_projection, "_projection_form", lambda *a: projection_form)
        monkeypatch.setattr(_rnn_forms, "_kernel_form", lambda *a: "plain")
        for reverse, batch_first, with_state in ((False, False, False), (True, True, True)):
            self.test_against_reference(mode, reverse, batch_first, with_state)
        monkeypatch.setattr(_rnn_projection, "CHUNK_BYTES", 3 * 3 * 4 * 6 * 4)
        self.test_against_reference(mode, True, False, True)

    def test_the_projection_form_is_measured_for_small_shapes_only(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        decide = _rnn_projection._projection_form
        forms = (
            _rnn_projection.PLAIN,
            _rnn_projection.TRANSPOSED,
            *_rnn_projection.PROJECTION_VIEW_WIDTHS,
        )
        small = decide(20, 64, 256, np.dtype(np.float32))
        assert small in forms
        assert decide(20, 64, 256, np.dtype(np.float32)) == small  # measured once
        ran: list[int] = []
        project = _rnn_projection._project

        def spy(*args: Any) -> None:
            ran.append(args[3])
            project(*args)

        monkeypatch.setattr(_rnn_projection, "_project", spy)
        monkeypatch.setattr(_rnn_projection, "_buckets", {})  # (measured again, unbucketed)
        assert decide.__wrapped__(20, 64, 256, np.dtype(np.float32)) in forms
        assert set(ran) == set(forms)  # a small one: every form timed
        ran.clear()
        decide.__wrapped__(20, 64, 48, np.dtype(np.float32))
        assert set(ran) == {0, 1, 16}  # only the block widths that divide the outputs
        ran.clear()
        big = 1 + _rnn_projection.PROJECTION_MEASURED_MAX // (256 * 1024)
        assert decide.__wrapped__(big, 256, 1024, np.dtype(np.float32)) == _rnn_projection.PLAIN
        assert ran == []  # not measured: nothing of that size ran

    @pytest.mark.parametrize("form", [0, 1, 16, 32])
    def test_every_projection_form_equals_the_plain_product(self, form: int) -> None:
        """On random data: each form of ``_project`` writes ``rows @ w.T``; ``project_rows``
        takes the measured one for a row-major weight and the plain one otherwise."""
        rows, w = _rand(1, 20, 48), _rand(2, 64, 48)
        out = np.empty((20, 64), dtype=np.float32)
        _rnn_projection._project(rows, w, out, form)
        np.testing.assert_allclose(out, rows @ w.T, rtol=1e-5, atol=1e-5)
        out[...] = 0.0
        _rnn_projection.project_rows(rows, np.asfortranarray(w), out)
        np.testing.assert_allclose(out, rows @ w.T, rtol=1e-5, atol=1e-5)

    def test_the_form_is_measured_once_and_small_weights_keep_the_plain_one(self) -> None:
        f32 = np.dtype(np.float32)
        assert _rnn_forms._kernel_form(3, 16, 4, f32) == "plain"
        assert _rnn_gates._tanh_form_is_faster((3, 64), f32) is False
        big_gates = _rnn_gates._tanh_form_is_faster((50, 1024), f32)
        assert _rnn_gates._tanh_form_is_faster((50, 1024), f32) is big_gates
        big = _rnn_forms._kernel_form(8, 512, 4, f32)
        assert big in (
            "plain",
            "transposed",
            *_rnn_forms.BLOCK_WIDTHS,
            *(("view", b) for b in _rnn_forms.VIEW_WIDTHS),
            *(("fused", b) for b in _rnn_forms.FUSED_WIDTHS),
        )
        assert _rnn_forms._kernel_form(8, 512, 4, f32) == big

    def test_the_form_is_decided_by_timing_every_whole_kernel(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Every LSTM kernel form runs on a short sequence of the real shape (plain,
        transposed, the blocked one at each block width that divides the hidden size, and
        the fused one at each of its widths that does), each with the weight in the order
        the call has it; the fastest form that copies no weight is taken, one that copies
        them (blocked, fused) only when it times at least 5% faster than that (the GEMM
        alone flipped between processes and missed the gate math's difference). The timings
        are given here, not measured."""
        ran: list[tuple[Any, tuple[int, ...], bool]] = []
        for name in ("plain", "transposed", "blocked", "fused"):
            kernel = getattr(_rnn_lstm, f"_lstm_sequence_{name}")

            def spy(*args: Any, name: str = name, kernel: Any = kernel) -> Any:
                form: Any = name
                if name == "blocked":
                    form = ("view", args[8]) if len(args) > 9 and args[9] else args[8]
                elif name == "fused":
                    form = ("fused", args[8])
                ran.append((form, args[0].shape, bool(args[3].flags.c_contiguous)))
                return kernel(*args)

            monkeypatch.setattr(_rnn_lstm, f"_lstm_sequence_{name}", spy)
        times: list[float] = []
        real = _rnn_measure._best_times

        def best_times(runs: Any, *rest: Any) -> list[float]:
            if len(runs) != len(times):  # another measurement (the projection's form)
                return real(runs, *rest)
            for run in runs:
                run()
            return times

        monkeypatch.setattr(_rnn_measure, "_best_times", best_times)
        fused_cap = _rnn_forms.FUSED_COPY_BYTES_MAX
        monkeypatch.setattr(_rnn_forms, "FUSED_COPY_BYTES_MAX", 0)  # (until their own parts)
        monkeypatch.setattr(_rnn_forms, "VIEW_WIDTHS", ())
        decide = _rnn_forms._measure_form
        f32 = np.dtype(np.float32)
        forms = ["plain", "transposed", 32, 64, 128]
        for given, expected in (
            ([0.02, 0.01, 0.015, 0.015, 0.015], "transposed"),
            ([0.01, 0.02, 0.02, 0.02, 0.02], "plain"),
            ([0.02, 0.015, 0.014, 0.01, 0.012], 64),
        ):
            ran.clear()
            times[:] = given
            assert decide(8, 256, 4, f32) == expected
            assert [form for form, _, _ in ran] == forms
            assert {shape for _, shape, _ in ran} == {(_rnn_forms._FORM_STEPS, 8, 256)}
            # A row-major weight is measured row-major in every form, the plain one too (as
            # it will run).
            assert all(c for _, _, c in ran)
        # Only block widths that divide the hidden size are tried.
        ran.clear()
        times[:] = [0.02, 0.03, 0.01]
        assert decide(8, 96, 4, f32) == 32
        assert [form for form, _, _ in ran] == ["plain", "transposed", 32]
        # The GRU's kernel: plain and blocked forms only.
        ran.clear()
        for name in ("plain", "blocked"):
            kernel = getattr(_rnn_gru, f"_gru_sequence_{name}")

            def gru_spy(*args: Any, name: str = name, kernel: Any = kernel) -> Any:
                ran.append((args[8] if name == "blocked" else "gru", args[0].shape, True))
                return kernel(*args)

            monkeypatch.setattr(_rnn_gru, f"_gru_sequence_{name}", gru_spy)
        times[:] = [0.02, 0.015, 0.01, 0.012]
        assert decide(8, 256, 3, f32) == 64
        assert [form for form, _, _ in ran] == ["gru", 32, 64, 128]
        # A weight over BLOCK_COPY_BYTES_MAX (copied at every call): no blocked forms.
        ran.clear()
        times[:] = [0.02, 0.01]
        cap = _rnn_forms.BLOCK_COPY_BYTES_MAX
        monkeypatch.setattr(_rnn_forms, "BLOCK_COPY_BYTES_MAX", 4 * 256 * 256 * 4 - 1)
        assert decide(8, 256, 4, f32) == "transposed"
        assert [form for form, _, _ in ran] == ["plain", "transposed"]
        monkeypatch.setattr(_rnn_forms, "BLOCK_COPY_BYTES_MAX", cap)
        # Nothing to choose from: past the copy bound, a Fortran-ordered LSTM weight and any
        # GRU weight have the plain form only, kept without running a kernel (this raised
        # "min() arg is an empty sequence" at the tutorial's size when lay_out had stored
        # the weight in Fortran order).
        ran.clear()
        monkeypatch.setattr(_rnn_forms, "BLOCK_COPY_BYTES_MAX", 3 * 256 * 256 * 4 - 1)
        assert decide(8, 256, 4, f32, 1, True) == "plain"
        assert decide(8, 256, 3, f32, 1, False) == "plain"
        assert ran == []
        monkeypatch.setattr(_rnn_forms, "BLOCK_COPY_BYTES_MAX", cap)
        # A Fortran-ordered weight: no transposed form, the others measured in its order.
        ran.clear()
        times[:] = [0.02, 0.01, 0.015, 0.015]
        assert decide(8, 256, 4, f32, 1, True) == 32
        assert [form for form, _, _ in ran] == ["plain", 32, 64, 128]
        assert not any(c for _, _, c in ran)
        # A close call among forms that copy nothing goes to the faster; a form that copies
        # the weights must be clearly faster than it ...
        times[:] = [0.020, 0.0195, 0.0190, 0.0197, 0.0198]
        assert decide(8, 256, 4, f32) == "transposed"
        times[:] = [0.0195, 0.020, 0.0190, 0.0197, 0.0198]
        assert decide(8, 256, 4, f32) == "plain"
        # ... and a batch of one and a small hidden size keep the plain form without
        # running any kernel.
        ran.clear()
        assert decide(_rnn_forms._FORM_MIN_BATCH - 1, 256, 4, f32) == "plain"
        assert decide(8, _rnn_forms._FORM_MIN_HIDDEN - 1, 4, f32) == "plain"
        assert ran == []
        # The blocked form reading W_hh in place: each of its widths that divides the hidden
        # size, LSTM and GRU alike; not for a Fortran-ordered weight (its blocks are row
        # blocks of a row-major one); no bound on the weight's size (nothing is copied).
        monkeypatch.setattr(_rnn_forms, "VIEW_WIDTHS", (8, 16))
        monkeypatch.setattr(_rnn_forms, "BLOCK_COPY_BYTES_MAX", 0)
        ran.clear()
        times[:] = [0.02, 0.015, 0.012, 0.01]
        assert decide(8, 256, 4, f32) == ("view", 16)
        assert [form for form, _, _ in ran] == ["plain", "transposed", ("view", 8), ("view", 16)]
        assert all(c for _, _, c in ran)
        ran.clear()
        times[:] = [0.02, 0.01, 0.015]
        assert decide(8, 72, 4, f32) == "transposed"
        assert [form for form, _, _ in ran] == ["plain", "transposed", ("view", 8)]
        ran.clear()
        assert decide(8, 256, 4, f32, 1, True) == "plain"  # nothing else left to measure
        assert ran == []
        monkeypatch.setattr(_rnn_forms, "BLOCK_COPY_BYTES_MAX", cap)
        monkeypatch.setattr(_rnn_forms, "VIEW_WIDTHS", ())
        # The fused form: each of its widths, on the real input size (it takes the input
        # projection into the step's GEMM); the LSTM's only, any weight order, bounded by its
        # copy of both weights (G*H x (I + H)).
        monkeypatch.setattr(_rnn_forms, "FUSED_COPY_BYTES_MAX", fused_cap)
        ran.clear()
        times[:] = [0.02, 0.015, 0.015, 0.015, 0.015, 0.012, 0.01]
        assert decide(8, 256, 4, f32, 1, False, 40) == ("fused", 32)
        assert [form for form, _, _ in ran] == [*forms, ("fused", 16), ("fused", 32)]
        assert {shape for _, shape, _ in ran} == {(_rnn_forms._FORM_STEPS, 8, 40)}
        ran.clear()
        times[:] = [0.02, 0.01, 0.015, 0.015, 0.009, 0.0095]
        assert decide(8, 256, 4, f32, 1, True, 40) == ("fused", 16)
        assert [form for form, _, _ in ran] == ["plain", 32, 64, 128, ("fused", 16), ("fused", 32)]
        ran.clear()
        times[:] = [0.02, 0.03, 0.01]
        assert decide(8, 80, 4, f32, 1, False, 40) == ("fused", 16)
        assert [form for form, _, _ in ran] == ["plain", "transposed", ("fused", 16)]
        monkeypatch.setattr(_rnn_forms, "FUSED_COPY_BYTES_MAX", 4 * 256 * (40 + 256) * 4 - 1)
        ran.clear()
        times[:] = [0.02, 0.015, 0.015, 0.01, 0.015]
        assert decide(8, 256, 4, f32, 1, False, 40) == 64
        assert [form for form, _, _ in ran] == forms
        ran.clear()
        times[:] = [0.02, 0.015, 0.01, 0.012]
        assert decide(8, 256, 3, f32, 1, False, 40) == 64  # a GRU: never fused
        assert [form for form, _, _ in ran] == ["gru", 32, 64, 128]

    def test_the_small_kernel_serves_small_models_only(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Weights of at most SMALL_WEIGHTS_PER_STEP elements a step take the small kernel
        (the numpy engine's)."""
        used: list[tuple[int, ...]] = []
        small = _rnn_small._lstm_sequence_small

        def spy(*args: Any) -> Any:
            used.append(args[3].shape)
            return small(*args)

        monkeypatch.setattr(_rnn_small, "_lstm_sequence_small", spy)
        for steps, hidden in ((7, 6), (2, 64)):  # 264 and 32768 weight elements
            w_ih, w_hh = _rand(5, 4 * hidden, hidden), _rand(6, 4 * hidden, hidden)
            x = _rand(7, steps, 1, hidden)
            _rnn_sequence.lstm_sequence_kernel(x, w_ih, None, w_hh, None, None, False, False)
        assert used == [(24, 6)]

    @pytest.mark.parametrize(
        ("reverse", "batch_first", "with_state"), list(itertools.product((False, True), repeat=3))
    )
    def test_the_small_kernel_equals_the_plain_one(
        self, reverse: bool, batch_first: bool, with_state: bool
    ) -> None:
        """Reordered, halved weights and one tanh for all gates: the same values, every flag
        (random weights, input and state; the projection in chunks of 3 steps)."""
        steps, batch, inp, hid = 9, 2, 5, 7
        w_ih, w_hh, bias = _rand(1, 4 * hid, inp), _rand(2, 4 * hid, hid), _rand(3, 4 * hid)
        x = _rand(4, batch, steps, inp) if batch_first else _rand(4, steps, batch, inp)
        h0 = _rand(5, batch, hid) if with_state else None
        c0 = _rand(6, batch, hid) if with_state else None
        args = (x, w_ih, bias, w_hh, h0, c0, reverse, batch_first)
        small = _rnn_small._lstm_sequence_small(*args)
        plain = _rnn_lstm._lstm_sequence_plain(*args)
        for got, want in zip(small, plain, strict=True):
            np.testing.assert_allclose(got, want, atol=1e-6)

    def test_the_small_kernel_reads_parameters_written_in_place(self) -> None:
        """It copies the weights at each call, so nothing stale survives an in-place write."""
        m = nn.LSTM(4, 5, seed=3)
        x = _rand(1, 6, 2, 4)
        before = _forward(m, x, None, None)[0]
        w_hh: Array = getattr(m, "weight_hh_l0")  # noqa: B009 - set by name
        b_ih: Array = getattr(m, "bias_ih_l0")  # noqa: B009
        w_hh *= np.float32(0.5)
        b_ih += np.float32(0.25)
        after = _forward(m, x, None, None)[0]
        out_ref, _, _ = ref_rnn("LSTM", m.state_dict(), x, None, None, 1, False, False)
        np.testing.assert_allclose(after, out_ref, atol=TOL)
        assert not np.allclose(after, before, atol=1e-3)

    def test_the_small_gru_kernel_serves_small_models_only(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The GRU takes its small kernel within the LSTM's bounds (weights a step, gates)."""
        used: list[tuple[int, ...]] = []
        small = _rnn_small._gru_sequence_small

        def spy(*args: Any) -> Any:
            used.append(args[3].shape)
            return small(*args)

        monkeypatch.setattr(_rnn_small, "_gru_sequence_small", spy)
        for steps, batch, hidden in ((7, 1, 6), (2, 1, 64), (7, 64, 6)):
            w_ih, w_hh = _rand(5, 3 * hidden, hidden), _rand(6, 3 * hidden, hidden)
            x = _rand(7, steps, batch, hidden)
            _rnn_sequence.gru_sequence_kernel(x, w_ih, None, w_hh, None, None, False, False)
        assert used == [(18, 6)]  # not the big weights, nor the 64 x 18 gate array

    @pytest.mark.parametrize(("reverse", "batch_first", "with_state", "biases"), GRU_CASES)
    def test_the_small_gru_kernel_equals_the_plain_one(
        self,
        reverse: bool,
        batch_first: bool,
        with_state: bool,
        biases: str,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """Halved r and z rows, one tanh for both sigmoids, b_hh's r and z parts folded into
        the projection: the same values as the plain kernel, every flag and either bias
        alone (random weights, input and state; the projection in chunks of 3 steps)."""
        args = gru_case(reverse, batch_first, with_state, biases)
        batch, hid = 2, GRU_HIDDEN
        b_hh = args[4]
        monkeypatch.setattr(_rnn_projection, "CHUNK_BYTES", 3 * batch * 3 * hid * 4)
        small = _rnn_small._gru_sequence_small(*args)
        monkeypatch.setattr(_rnn_engine, "SMALL_WEIGHTS_PER_STEP", 0)
        plain = _rnn_sequence.gru_sequence_kernel(*args)
        for got, want in zip(small, plain, strict=True):
            np.testing.assert_allclose(got, want, atol=1e-6)
        if b_hh is not None:
            assert not np.shares_memory(small[0], b_hh)
            np.testing.assert_array_equal(b_hh, _rand(8, 3 * hid))  # the caller's bias intact

    def test_the_small_gru_kernel_reads_parameters_written_in_place(self) -> None:
        m = nn.GRU(4, 5, seed=3)
        x = _rand(1, 6, 2, 4)
        before = _forward(m, x, None, None)[0]
        w_hh: Array = getattr(m, "weight_hh_l0")  # noqa: B009 - set by name
        b_hh: Array = getattr(m, "bias_hh_l0")  # noqa: B009
        w_hh *= np.float32(0.5)
        b_hh += np.float32(0.25)
        after = _forward(m, x, None, None)[0]
        out_ref, _, _ = ref_rnn("GRU", m.state_dict(), x, None, None, 1, False, False)
        np.testing.assert_allclose(after, out_ref, atol=TOL)
        assert not np.allclose(after, before, atol=1e-3)

    def test_the_gru_kernel_has_no_transposed_form(self) -> None:
        """Three gates (a GRU weight) measure the GRU's plain and blocked kernels only;
        lay_out stores the weight in Fortran order only where its plain kernel won against
        those; two or five gates are never measured."""
        f32 = np.dtype(np.float32)
        form = _rnn_forms._kernel_form(50, 512, 3, f32)
        assert form in (
            "plain",
            *_rnn_forms.BLOCK_WIDTHS,
            *(("view", b) for b in _rnn_forms.VIEW_WIDTHS),
        )
        assert _rnn_forms._kernel_form(50, 512, 2, f32) == "plain"
        assert _rnn_forms._kernel_form(50, 512, 5, f32) == "plain"
        w = np.random.default_rng(1).standard_normal((3 * 512, 512)).astype(np.float32)
        laid = _rnn_layout.lay_out(w)
        np.testing.assert_array_equal(laid, w)
        assert laid.flags.f_contiguous is _rnn_layout._layout_fortran(512, 3, f32)

    @pytest.mark.parametrize(("reverse", "batch_first", "with_state", "biases"), GRU_CASES)
    def test_the_blocked_gru_equals_the_plain_one(
        self, reverse: bool, batch_first: bool, with_state: bool, biases: str
    ) -> None:
        """Blocked and plain GRU kernels agree on random data, every flag and either bias
        alone, with the weight in either memory order (hidden 7: blocks of 1 and 7)."""
        args = gru_case(reverse, batch_first, with_state, biases)
        want = _rnn_gru._gru_sequence_plain(*args)
        x, w_ih, b_ih, w_hh, b_hh, h0 = args[:6]
        for block, laid in ((1, w_hh), (GRU_HIDDEN, np.asfortranarray(w_hh))):
            got = _rnn_gru._gru_sequence_blocked(
                x, w_ih, b_ih, laid, b_hh, h0, reverse, batch_first, block
            )
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, atol=1e-6)

    @pytest.mark.parametrize("mode", ["LSTM", "GRU"])
    def test_time_chunks_give_the_same_result(
        self, mode: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A projection computed a few steps at a time equals one computed all at once."""
        m = _module(mode, input_size=8, hidden_size=16, seed=0, bidirectional=True)
        x = _rand(5, 11, 4, 8)
        whole = _forward(m, x, None, None)
        monkeypatch.setattr(_rnn_projection, "CHUNK_BYTES", 3 * 4 * m._gates * 16 * 4)
        assert _rnn_projection.chunk_steps(11, 4, m._gates * 16, 4) == 3
        chunked = _forward(m, x, None, None)
        for a, b in zip(np.atleast_1d(whole[0]), np.atleast_1d(chunked[0]), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6)

    @pytest.mark.parametrize(
        ("tanh_form", "form"),
        list(
            itertools.product(
                (False, True), ("plain", "transposed", 32, ("view", 16), ("fused", 32))
            )
        ),
    )
    def test_a_large_state_in_every_form(
        self, tanh_form: bool, form: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Above TANH_DIRECT_MAX elements (the state's tanh through np.tanh or through exp),
        in every GEMM form (the plain one with Fortran-ordered weights): still exact."""
        monkeypatch.setattr(_rnn_gates, "_tanh_form_is_faster", lambda *a: tanh_form)
        monkeypatch.setattr(_rnn_forms, "_kernel_form", lambda *a: form)
        monkeypatch.setattr(_rnn_layout, "_layout_fortran", lambda *a: form == "plain")
        hid = 96
        batch = _rnn_gates.TANH_DIRECT_MAX // hid + 1
        m = nn.LSTM(4, hid, seed=1)
        x = _rand(2, 3, batch, 4)
        out, (h_n, c_n) = _forward(m, x, None, None)
        ref = ref_rnn("LSTM", m.state_dict(), x, None, None, 1, False, False)
        np.testing.assert_allclose(out, ref[0], atol=TOL)
        np.testing.assert_allclose(h_n, ref[1], atol=TOL)
        np.testing.assert_allclose(c_n, ref[2], atol=TOL)

    def test_bad_shapes_and_dtypes_are_named_at_the_call(self) -> None:
        """Errors name the op and every input's shape and dtype, raised where called."""
        x, w_ih, w_hh = _rand(0, 5, 2, 3), _rand(1, 16, 3), _rand(2, 16, 4)
        with pytest.raises(dataflow.OpInputError, match=r"lstm_sequence: w_ih must have shape"):
            ops.lstm_sequence(x, _rand(1, 12, 3), None, w_hh)
        with pytest.raises(dataflow.OpInputError, match=r"x must have shape.*input_size 3"):
            ops.lstm_sequence(_rand(0, 5, 2, 7), w_ih, None, w_hh)
        with pytest.raises(dataflow.OpInputError, match=r"h0 must have shape \(2, 4\)"):
            ops.lstm_sequence(x, w_ih, None, w_hh, _rand(3, 3, 4), _rand(3, 3, 4))
        with pytest.raises(dataflow.OpInputError, match=r"give both h0 and c0"):
            ops.lstm_sequence(x, w_ih, None, w_hh, _rand(3, 2, 4), None)
        with pytest.raises(dataflow.OpInputError, match=r"bias must have shape \(16,\)"):
            ops.lstm_sequence(x, w_ih, _rand(4, 8), w_hh)
        with pytest.raises(dataflow.OpTypeError, match=r"same floating-point dtype.*float64"):
            ops.lstm_sequence(x.astype(np.float64), w_ih, None, w_hh)
        with pytest.raises(dataflow.OpTypeError, match=r"reverse must be True or False"):
            ops.lstm_sequence(x, w_ih, None, w_hh, None, None, "yes")  # type: ignore[arg-type]
        with pytest.raises(dataflow.OpInputError, match=r"gru_sequence: w_hh must have shape"):
            ops.gru_sequence(x, _rand(1, 12, 3), None, w_hh, None)
        with pytest.raises(dataflow.OpTypeError, match=r"lstm_sequence: stacked must be True"):
            ops.lstm_sequence(x, w_ih, None, w_hh, stacked=1)  # type: ignore[arg-type]
        with pytest.raises(dataflow.OpTypeError, match=r"gru_sequence: stacked must be True"):
            ops.gru_sequence(x, _rand(1, 12, 3), None, _rand(2, 12, 4), None, stacked="no")  # type: ignore[arg-type]

    @pytest.mark.parametrize("mode", ["LSTM", "GRU"])
    @pytest.mark.parametrize("reverse", [False, True])
    def test_stacked_states(self, mode: str, reverse: bool) -> None:
        """stacked=True: the final states as (1, batch, hidden), the same values."""
        steps, batch, inp, hid = 6, 3, 5, 4
        gates = 4 if mode == "LSTM" else 3
        x, w_ih, w_hh = (
            _rand(1, steps, batch, inp),
            _rand(2, gates * hid, inp),
            _rand(3, gates * hid, hid),
        )
        b, h0, c0 = _rand(4, gates * hid), _rand(5, batch, hid), _rand(6, batch, hid)
        flat: list[ops.Tensor]
        stacked: list[ops.Tensor]
        if mode == "LSTM":
            flat = list(ops.lstm_sequence(x, w_ih, b, w_hh, h0, c0, reverse))
            stacked = list(ops.lstm_sequence(x, w_ih, b, w_hh, h0, c0, reverse, stacked=True))
        else:
            b_hh = b[::-1].copy()
            flat = list(ops.gru_sequence(x, w_ih, b, w_hh, b_hh, h0, reverse))
            stacked = list(ops.gru_sequence(x, w_ih, b, w_hh, b_hh, h0, reverse, stacked=True))
        np.testing.assert_array_equal(stacked[0].result(), flat[0].result())
        for got, want in zip(stacked[1:], flat[1:], strict=True):
            assert got.shape == (1, batch, hid)
            np.testing.assert_array_equal(got.result(), want.result()[None])


class TestWeightLayout:
    def test_lay_out_keeps_values_and_follows_the_measurement(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """lay_out returns the same values, in the order measured fastest for the shape."""
        w = _rand(0, 64, 16)
        monkeypatch.setattr(_rnn_layout, "_fortran_is_faster", lambda *a: True)
        f = _rnn_layout.lay_out(w)
        assert f.flags.f_contiguous and not f.flags.c_contiguous
        np.testing.assert_array_equal(f, w)
        assert _rnn_layout.lay_out(f) is f
        monkeypatch.setattr(_rnn_layout, "_fortran_is_faster", lambda *a: False)
        c = _rnn_layout.lay_out(f)
        assert c.flags.c_contiguous
        np.testing.assert_array_equal(c, w)

    @pytest.mark.parametrize(
        ("at_now", "at_one", "fortran"),
        [(True, False, False), (False, True, False), (True, True, True)],
    )
    def test_the_layout_weighs_the_forms_at_one_blas_thread_too(
        self, at_now: bool, at_one: bool, fortran: bool, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A model is built under the process's BLAS count, while a runtime runs recurrent
        kernels side by side on one BLAS thread each: the weight is stored in Fortran order
        (which only the plain form gains from) only where the plain kernel with it wins at
        both counts. One thread is measured first, under a one-thread BLAS limit that ends
        with the measurement; row-major there settles it without measuring the process's
        count."""
        from threadpoolctl import threadpool_info, threadpool_limits

        def blas_now() -> int:
            return max(int(i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas")

        asked: list[tuple[int, int]] = []

        def is_fortran(hidden: int, gates: int, dtype: Any, threads: int) -> bool:
            assert (hidden, gates) == (64, 4)
            asked.append((threads, blas_now()))
            return at_now if threads == 2 else at_one

        monkeypatch.setattr(_rnn_layout, "_layout_is_fortran", is_fortran)
        w = _rand(0, 4 * 64, 64)
        with threadpool_limits(limits=2, user_api="blas"):
            laid = _rnn_layout.lay_out(w)
            assert blas_now() == 2
        assert asked == ([(1, 1), (2, 2)] if at_one else [(1, 1)])
        assert laid.flags.f_contiguous is fortran
        np.testing.assert_array_equal(laid, w)
        # At one BLAS thread already: measured once.
        asked.clear()
        with threadpool_limits(limits=1, user_api="blas"):
            _rnn_layout.lay_out(w)
        assert asked == [(1, 1)]

    def test_the_layout_weighs_the_fortran_plain_kernel_against_every_row_major_form(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Fortran order is kept only where the plain kernel with it beats every form a
        row-major weight takes (the plain one row-major included) by the margin: a tie keeps
        row-major. One interleaved measurement, whose answer for a row-major weight becomes
        the kernels' own (no second measurement at the first forward); where the plain GEMM
        is not faster in Fortran order, nothing is measured."""
        ran: list[tuple[Any, bool]] = []
        for name in ("plain", "transposed", "blocked"):
            kernel = getattr(_rnn_lstm, f"_lstm_sequence_{name}")

            def spy(*args: Any, name: str = name, kernel: Any = kernel) -> Any:
                form: Any = ("view", args[8]) if name == "blocked" else name
                ran.append((form, bool(args[3].flags.f_contiguous)))
                return kernel(*args)

            monkeypatch.setattr(_rnn_lstm, f"_lstm_sequence_{name}", spy)
        times: list[float] = []
        monkeypatch.setattr(
            _rnn_measure,
            "_best_times",
            lambda runs, *a: [(r() and 0) or t for r, t in zip(runs, times, strict=True)],
        )
        monkeypatch.setattr(_rnn_forms, "VIEW_WIDTHS", (8,))
        monkeypatch.setattr(_rnn_forms, "BLOCK_WIDTHS", ())
        monkeypatch.setattr(_rnn_forms, "FUSED_WIDTHS", ())
        monkeypatch.setattr(_rnn_layout, "_layouts", {})
        monkeypatch.setattr(_rnn_forms, "_forms", {})
        monkeypatch.setattr(_rnn_forms, "_buckets", {})
        monkeypatch.setattr(_rnn_layout, "_fortran_is_faster", lambda *a: True)
        f32 = np.dtype(np.float32)
        measure = _rnn_layout._layout_is_fortran
        batch = _rnn_layout.LAYOUT_BATCH
        for given, fortran, form in (
            ([0.010, 0.012, 0.011, 0.0108], True, ("view", 8)),
            ([0.010, 0.012, 0.011, 0.0104], False, ("view", 8)),
            ([0.010, 0.0103, 0.012, 0.011], False, "plain"),
        ):
            ran.clear()
            times[:] = given
            hidden = 64 + 8 * len(_rnn_layout._layouts)  # (a new key each time)
            assert measure(hidden, 4, f32, 1) is fortran
            assert ran == [
                ("plain", True),
                ("plain", False),
                ("transposed", False),
                (("view", 8), False),
            ]
            assert _rnn_forms._forms[(batch, hidden, 4, f32, 1, False, hidden)] == form
            assert _rnn_forms._kernel_form(batch, hidden, 4, f32, 1, False) == form
            ran.clear()
            assert measure(hidden, 4, f32, 1) is fortran  # once per key
            assert ran == []
        monkeypatch.setattr(_rnn_layout, "_fortran_is_faster", lambda *a: False)
        assert measure(128, 4, f32, 1) is False
        assert ran == []

    def test_a_module_run_per_step_lays_its_weights_out_for_the_step_gemm(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A step op's one GEMM is h @ w.T with the gate math on its result: a module whose
        forwards run per step at the layout's batch (a unidirectional stack with big steps)
        stores its recurrent weights in the order that GEMM measured fastest, whatever the
        sequence kernels' forms; a bidirectional one (sequence kernels) as they want."""
        monkeypatch.setattr(_rnn_layout, "_layout_fortran", lambda *a: False)
        monkeypatch.setattr(_rnn_layout, "_fortran_is_faster", lambda *a: True)
        w = _rand(0, 4 * 64, 64)
        assert _rnn_layout.lay_out(w).flags.c_contiguous
        assert _rnn_layout.lay_out(w, steps=True).flags.f_contiguous
        stack = nn.LSTM(512, 512, num_layers=2, seed=0)
        assert stack.granularity_for(_rnn_layout.LAYOUT_BATCH) == "step"
        assert stack.weight_hh_l0.flags.f_contiguous
        assert stack.weight_hh_l1.flags.f_contiguous
        stack.load_state_dict(stack.state_dict())
        assert stack.weight_hh_l1.flags.f_contiguous
        bi = nn.LSTM(64, 64, bidirectional=True, seed=0)
        assert bi.weight_hh_l0.flags.c_contiguous
        assert bi.weight_hh_l0_reverse.flags.c_contiguous

    @pytest.mark.parametrize("transposed", [False, True])
    def test_the_step_kernels_recurrent_product(
        self, transposed: bool, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """recurrent_product is h @ w.T, computed as (w @ h.T).T where that measured faster
        for a row-major w (a transposed result, same values); a Fortran-ordered w, a batch of
        one and a small product run as written, without measuring. The step and cell ops
        give the same results either way."""
        asked: list[tuple[Any, ...]] = []

        def decide(*key: Any) -> bool:
            asked.append(key)
            return transposed

        monkeypatch.setattr(_rnn_layout, "_product_is_transposed", decide)
        batch, hid = 8, 128
        w = _rand(0, 4 * hid, hid)
        h = _rand(1, batch, hid)
        got = _rnn_layout.recurrent_product(h, w)
        np.testing.assert_allclose(got, h @ w.T, rtol=1e-5, atol=1e-4)
        assert got.flags.f_contiguous is transposed
        assert asked == [(batch, 4 * hid, hid, np.dtype(np.float32), _rnn_measure._blas_threads())]
        asked.clear()
        _rnn_layout.recurrent_product(h, np.asfortranarray(w))
        _rnn_layout.recurrent_product(h[:1], w)
        _rnn_layout.recurrent_product(h[:2, :16], _rand(2, 64, 16))
        assert asked == []
        # The ops, against a float64 reference of the same step.
        from ops import _recurrent

        xproj, c = _rand(3, 2, batch, 4 * hid), _rand(4, batch, hid)
        h_new, c_new = _recurrent._lstm_step_kernel(xproj, 1, h, c, w)
        gates = (h.astype(np.float64) @ w.T.astype(np.float64)) + xproj[1]
        i, f, g, o = np.split(gates, 4, axis=1)

        def sig(a: Array) -> Array:
            out: Array = 1.0 / (1.0 + np.exp(-a))
            return out

        c_ref = sig(f) * c + sig(i) * np.tanh(g)
        np.testing.assert_allclose(c_new, c_ref, atol=1e-5)
        np.testing.assert_allclose(h_new, sig(o) * np.tanh(c_ref), atol=1e-5)

    def test_the_product_form_is_measured_once_per_key(self) -> None:
        f32 = np.dtype(np.float32)
        key = (8, 4 * 96, 96, f32, 1)
        _rnn_layout._products.pop(key, None)
        first = _rnn_layout._product_is_transposed(*key)
        assert _rnn_layout._products[key] is first
        assert _rnn_layout._product_is_transposed(*key) is first

    def test_small_weights_keep_row_major_without_measuring(self) -> None:
        """Below the size where the GEMM forms differ, nothing is measured or changed."""
        w = _rand(0, 32, 8)
        assert _rnn_layout.lay_out(w) is w

    def test_fortran_weights_are_exact_and_writes_take_effect(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With Fortran-ordered recurrent weights the module is exact; loading a state dict
        and writing a parameter in place both change the next forward (no stale copy)."""
        monkeypatch.setattr(_rnn_layout, "_fortran_is_faster", lambda *a: True)
        m = nn.LSTM(6, 8, seed=0, bidirectional=True)
        assert m.weight_hh_l0.flags.f_contiguous
        x = _rand(1, 5, 2, 6)

        def ref(params: dict[str, Array]) -> Array:
            return ref_rnn("LSTM", params, x, None, None, 1, True, False)[0]

        out, _ = _forward(m, x, None, None)
        np.testing.assert_allclose(out, ref(m.state_dict()), atol=TOL)
        new = {k: _rand(9, *v.shape) for k, v in m.state_dict().items()}
        m.load_state_dict(new)
        assert m.weight_hh_l0_reverse.flags.f_contiguous
        out2, _ = _forward(m, x, None, None)
        np.testing.assert_allclose(out2, ref(new), atol=TOL)
        m.weight_hh_l0[:] = 0.0  # in place
        out3, _ = _forward(m, x, None, None)
        np.testing.assert_allclose(out3, ref(m.state_dict()), atol=TOL)
        assert not np.allclose(out3, out2)


class TestGranularity:
    def _ops_of(self, m: nn.LSTM | nn.GRU, x: Array) -> dict[str, int]:
        async def program(x: Any) -> Any:
            out, _ = await m.forward(x)
            return out

        return dataflow.trace(program, x).op_counts()

    def test_auto_is_one_op_per_direction_for_small_or_bidirectional(self) -> None:
        m = nn.LSTM(8, 16, num_layers=2, bidirectional=True, seed=0)
        assert m.granularity_for(50) == "sequence"
        counts = self._ops_of(m, _rand(0, 5, 2, 8))
        assert counts["ops.lstm_sequence"] == 4
        assert "ops.lstm_step" not in counts

    def test_auto_steps_a_big_unidirectional_stack(self) -> None:
        """Big steps in a unidirectional stack: per-step ops, for the wavefront."""
        m = nn.LSTM(512, 512, num_layers=2, seed=0)
        assert m.granularity_for(50) == "step"
        assert m.granularity_for(1) == "sequence"
        assert nn.LSTM(512, 512, num_layers=1, seed=0).granularity_for(50) == "sequence"

    @pytest.mark.parametrize("mode", ["LSTM", "GRU"])
    @pytest.mark.parametrize("granularity", ["sequence", "step"])
    def test_forced_granularity_is_exact(self, mode: str, granularity: str) -> None:
        """Both granularities give the reference result, stacked, bidirectional, batch-first."""
        for layers, bi, bf in itertools.product((1, 3), (False, True), (False, True)):
            m = _module(
                mode,
                input_size=5,
                hidden_size=4,
                num_layers=layers,
                bidirectional=bi,
                batch_first=bf,
                seed=layers,
                granularity=granularity,
            )
            d = 2 if bi else 1
            x = _rand(7, 2, 6, 5) if bf else _rand(7, 6, 2, 5)
            h0 = _rand(8, layers * d, 2, 4)
            c0 = _rand(9, layers * d, 2, 4) if mode == "LSTM" else None
            got = _forward(m, x, h0, c0)
            ref = ref_rnn(mode, m.state_dict(), x, h0, c0, layers, bi, bf)
            out, h_n = got[0], got[1][0] if mode == "LSTM" else got[1]
            np.testing.assert_allclose(out, ref[0], atol=TOL)
            np.testing.assert_allclose(h_n, ref[1], atol=TOL)
            if mode == "LSTM":
                np.testing.assert_allclose(got[1][1], ref[2], atol=TOL)

    @pytest.mark.parametrize("mode", ["LSTM", "GRU"])
    def test_one_layer_direction_is_one_op(self, mode: str) -> None:
        """One layer and direction: its op returns the states stacked, no stack_states op."""
        m = _module(mode, input_size=8, hidden_size=16, seed=0)
        counts = self._ops_of(m, _rand(0, 5, 2, 8))
        assert counts == {f"ops.{mode.lower()}_sequence": 1}
        two = _module(mode, input_size=8, hidden_size=16, num_layers=2, seed=0)
        assert self._ops_of(two, _rand(0, 5, 2, 8))["ops.stack_states"] == (
            2 if mode == "LSTM" else 1
        )

    def test_step_granularity_dispatches_steps(self) -> None:
        m = nn.GRU(4, 4, seed=0, granularity="step")
        counts = self._ops_of(m, _rand(0, 5, 1, 4))
        assert counts["ops.gru_step"] == 5
        assert "granularity='step'" in repr(m)


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch") is None, reason="torch not installed"
)
class TestAgainstTorch:
    @pytest.mark.parametrize("mode", ["LSTM", "GRU"])
    @pytest.mark.parametrize("granularity", ["sequence", "step"])
    def test_matches_torch(self, mode: str, granularity: str) -> None:
        """torch's weights loaded unchanged give torch's outputs, at a size that chunks."""
        import torch

        torch.manual_seed(0)
        tm = getattr(torch.nn, mode)(32, 64, num_layers=2, bidirectional=True)
        m = _module(
            mode,
            input_size=32,
            hidden_size=64,
            num_layers=2,
            bidirectional=True,
            granularity=granularity,
        )
        m.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
        x = _rand(3, 20, 8, 32)
        with torch.no_grad():
            expected = tm(torch.from_numpy(x))
        got = _forward(m, x, None, None)
        np.testing.assert_allclose(got[0], expected[0].numpy(), atol=TOL, rtol=1e-4)

    @pytest.mark.parametrize("mode", ["LSTM", "GRU"])
    def test_one_layer_direction_states_match_torch(self, mode: str) -> None:
        """The stacked states of a one-layer, one-direction module: torch's shapes and values."""
        import torch

        torch.manual_seed(1)
        tm = getattr(torch.nn, mode)(16, 24)
        m = _module(mode, input_size=16, hidden_size=24)
        m.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
        x = _rand(4, 9, 3, 16)
        with torch.no_grad():
            expected = tm(torch.from_numpy(x))
        got = _forward(m, x, None, None)
        np.testing.assert_allclose(got[0], expected[0].numpy(), atol=TOL, rtol=1e-4)
        states = (
            zip(got[1], expected[1], strict=True) if mode == "LSTM" else [(got[1], expected[1])]
        )
        for mine, theirs in states:
            assert mine.shape == tuple(theirs.shape) == (1, 3, 24)
            np.testing.assert_allclose(mine, theirs.numpy(), atol=TOL, rtol=1e-4)


class TestArguments:
    """Module arguments are checked where the module is built, naming the argument."""

    @pytest.mark.parametrize(
        ("kwargs", "error", "match"),
        [
            ({"bias": "False"}, TypeError, r"bias must be True or False, got str"),
            ({"batch_first": 1}, TypeError, r"batch_first must be True or False, got int"),
            ({"bidirectional": None}, TypeError, r"bidirectional must be True or False"),
            ({"dropout": "0.5"}, TypeError, r"dropout must be a number"),
            ({"dropout": 1.5}, ValueError, r"dropout must be in \[0, 1\]"),
            ({"dropout": float("nan")}, ValueError, r"dropout must be in \[0, 1\]"),
            ({"granularity": "chunk"}, ValueError, r"granularity must be one of 'auto'"),
            ({"dtype": "banana"}, TypeError, r"dtype 'banana' is not a numpy dtype"),
            ({"dtype": np.int32}, TypeError, r"dtype must be a floating dtype"),
            ({"hidden_size": 0}, ValueError, r"hidden_size must be a positive int, got 0"),
            ({"num_layers": 1.5}, TypeError, r"num_layers must be a positive int, got float"),
        ],
    )
    def test_bad_argument(self, kwargs: dict[str, Any], error: type, match: str) -> None:
        args: dict[str, Any] = {"input_size": 4, "hidden_size": 4, **kwargs}
        with pytest.raises(error, match=match) as info:
            nn.GRU(**args)
        assert isinstance(info.value, dataflow.DataflowError)
        assert "nn.GRU" in str(info.value)


class TestSecondBias:
    """``bias_hh``: lstm_sequence and rnn_projection add a second bias in their kernels, as
    ``nn.LSTM`` passes its two biases (so a traced graph reads both parameters)."""

    def test_equals_the_sum_given_as_one_bias(self) -> None:
        x, w_ih, w_hh = _rand(1, 6, 3, 4), _rand(2, 20, 4), _rand(3, 20, 5)
        b_ih, b_hh = _rand(4, 20), _rand(5, 20)
        for reverse in (False, True):
            want = ops.lstm_sequence(x, w_ih, b_ih + b_hh, w_hh, reverse=reverse)
            got = ops.lstm_sequence(x, w_ih, b_ih, w_hh, reverse=reverse, bias_hh=b_hh)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g.result(), w.result(), rtol=1e-6, atol=1e-6)
            alone = ops.lstm_sequence(x, w_ih, None, w_hh, reverse=reverse, bias_hh=b_hh)
            np.testing.assert_allclose(
                alone[0].result(),
                ops.lstm_sequence(x, w_ih, b_hh, w_hh, reverse=reverse)[0].result(),
            )
        np.testing.assert_allclose(
            rnn_projection(x, w_ih, b_ih, False, b_hh).result(),
            rnn_projection(x, w_ih, b_ih + b_hh).result(),
            rtol=1e-6,
        )

    def test_a_wrong_second_bias_is_named(self) -> None:
        x, w_ih, w_hh = _rand(1, 6, 3, 4), _rand(2, 20, 4), _rand(3, 20, 5)
        with pytest.raises(dataflow.OpInputError, match=r"lstm_sequence: bias_hh must have shape"):
            ops.lstm_sequence(x, w_ih, _rand(4, 20), w_hh, bias_hh=_rand(5, 19))
        with pytest.raises(dataflow.OpInputError, match=r"rnn_projection: bias_hh must have"):
            rnn_projection(x, w_ih, None, False, _rand(5, 19))
        with pytest.raises(dataflow.OpTypeError, match=r"lstm_sequence: every input must have"):
            ops.lstm_sequence(x, w_ih, None, w_hh, bias_hh=_rand(5, 20).astype(np.float64))


class TestSizeBuckets:
    """Kernel forms are measured once per bucket of batch sizes (or projection rows): a
    server whose batches come in every size measures a few times, not at every new size."""

    def test_buckets_are_the_small_sizes_and_the_nearest_power_of_two(self) -> None:
        bucket = _rnn_measure._size_bucket
        assert [bucket(n) for n in range(1, 7)] == [1, 2, 3, 4, 4, 8]
        assert {bucket(n) for n in range(6, 12)} == {8}
        assert {bucket(n) for n in range(12, 23)} == {16}
        assert {bucket(n) for n in range(23, 46)} == {32}
        assert bucket(50) == 64 and bucket(1000) == 1024

    def test_a_kernel_form_is_measured_once_per_bucket_with_its_first_batch(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        calls: list[tuple[Any, ...]] = []

        def measure(*key: Any) -> Any:
            calls.append(key)
            return ("view", 16) if key[0] < 23 else "transposed"

        monkeypatch.setattr(_rnn_forms, "_measure_form", measure)
        monkeypatch.setattr(_rnn_forms, "_forms", {})
        monkeypatch.setattr(_rnn_forms, "_buckets", {})
        f32 = np.dtype(np.float32)
        got = {b: _rnn_forms._kernel_form(b, 256, 4, f32, 1) for b in range(2, 33)}
        assert [key[0] for key in calls] == [2, 3, 4, 6, 12, 23]
        assert all(key[1:] == (256, 4, f32, 1, False, 256) for key in calls)
        assert got[5] == got[11] == ("view", 16) and got[32] == "transposed"
        # Another BLAS thread count or weight order is a bucket of its own.
        _rnn_forms._kernel_form(20, 256, 4, f32, 2)
        _rnn_forms._kernel_form(20, 256, 4, f32, 1, True)
        assert [key[0] for key in calls[-2:]] == [20, 20]

    def test_a_layout_measurement_fills_its_bucket(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(_rnn_forms, "_forms", {})
        monkeypatch.setattr(_rnn_forms, "_buckets", {})
        monkeypatch.setattr(_rnn_forms, "_measure_form", lambda *key: pytest.fail("measured"))
        f32 = np.dtype(np.float32)
        with _rnn_forms._forms_lock:
            _rnn_forms._remember((50, 96, 4, f32, 1, False, 96), "transposed")
        assert _rnn_forms._kernel_form(60, 96, 4, f32, 1) == "transposed"

    def test_a_projection_form_is_measured_once_per_bucket_of_rows(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from ops import _rnn_projection

        calls: list[int] = []

        def measure(rows: int, *rest: Any) -> int:
            calls.append(rows)
            return _rnn_projection.TRANSPOSED

        monkeypatch.setattr(_rnn_projection, "_measure_projection", measure)
        monkeypatch.setattr(_rnn_projection, "_buckets", {})
        _rnn_projection._projection_form.cache_clear()
        try:
            f32 = np.dtype(np.float32)
            forms = {_rnn_projection._projection_form(r, 40, 160, f32) for r in range(24, 46)}
            assert forms == {_rnn_projection.TRANSPOSED}
            assert calls == [24]
        finally:
            _rnn_projection._projection_form.cache_clear()

    def test_a_step_product_form_is_measured_once_per_bucket(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        timed: list[int] = []

        def best_times(runs: Any, *args: Any) -> list[float]:
            timed.append(len(runs))
            return [1.0, 0.5]

        monkeypatch.setattr(_rnn_measure, "_best_times", best_times)
        monkeypatch.setattr(_rnn_layout, "_products", {})
        monkeypatch.setattr(_rnn_layout, "_product_buckets", {})
        f32 = np.dtype(np.float32)
        assert all(_rnn_layout._product_is_transposed(b, 384, 96, f32, 1) for b in range(12, 23))
        assert timed == [2]
