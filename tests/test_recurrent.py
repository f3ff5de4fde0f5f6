"""The fused recurrent cells and step ops (ops._recurrent) against plain numpy and torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from ops._recurrent import (
    gru_step,
    lstm_step,
    rnn_output,
    rnn_projection,
    select,
    stack_states,
)

Array = np.ndarray[Any, Any]
TOL = 1e-5


def _sigmoid(a: Array) -> Array:
    # 1 / (1 + exp(-a)) computed without overflow: exp(-log(1 + exp(-a))).
    out: Array = np.exp(-np.logaddexp(0.0, -a))
    return out


def ref_lstm_cell(
    x: Array,
    h: Array,
    c: Array,
    w_ih: Array,
    w_hh: Array,
    b_ih: Array | None,
    b_hh: Array | None,
) -> tuple[Array, Array]:
    """torch.nn.LSTMCell's equations, written out in float64."""
    x, h, c, w_ih, w_hh = (a.astype(np.float64) for a in (x, h, c, w_ih, w_hh))
    gates = x @ w_ih.T + h @ w_hh.T
    for b in (b_ih, b_hh):
        if b is not None:
            gates = gates + b.astype(np.float64)
    i, f, g, o = np.split(gates, 4, axis=-1)
    c_new = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    return _sigmoid(o) * np.tanh(c_new), c_new


def ref_gru_cell(
    x: Array, h: Array, w_ih: Array, w_hh: Array, b_ih: Array | None, b_hh: Array | None
) -> Array:
    """torch.nn.GRUCell's equations, written out in float64."""
    x, h, w_ih, w_hh = (a.astype(np.float64) for a in (x, h, w_ih, w_hh))
    gi = x @ w_ih.T + (0.0 if b_ih is None else b_ih.astype(np.float64))
    gh = h @ w_hh.T + (0.0 if b_hh is None else b_hh.astype(np.float64))
    i_r, i_z, i_n = np.split(gi, 3, axis=-1)
    h_r, h_z, h_n = np.split(gh, 3, axis=-1)
    r = _sigmoid(i_r + h_r)
    z = _sigmoid(i_z + h_z)
    n = np.tanh(i_n + r * h_n)
    out: Array = (1.0 - z) * n + z * h
    return out


def _rand(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> Array:
    out: Array = (rng.standard_normal(shape) * scale).astype(np.float32)
    return out


def _params(rng: np.random.Generator, gates: int, inp: int, hidden: int) -> list[Array]:
    """w_ih, w_hh, b_ih, b_hh drawn as torch initialises them."""
    k = 1.0 / np.sqrt(hidden)
    shapes = [(gates * hidden, inp), (gates * hidden, hidden), (gates * hidden,), (gates * hidden,)]
    return [rng.uniform(-k, k, shape).astype(np.float32) for shape in shapes]


def _max_diff(a: Any, b: Any) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b))))


class TestLSTMCell:
    """ops.lstm_cell computes torch's LSTM step."""

    @pytest.mark.parametrize(("batch", "inp", "hidden"), [(3, 5, 7), (1, 16, 8), (8, 33, 64)])
    def test_matches_numpy_reference(self, batch: int, inp: int, hidden: int) -> None:
        """h', c' match the written-out equations for random data."""
        rng = np.random.default_rng(batch + inp)
        x, h, c = _rand(rng, batch, inp), _rand(rng, batch, hidden), _rand(rng, batch, hidden)
        w_ih, w_hh, b_ih, b_hh = _params(rng, 4, inp, hidden)
        h1, c1 = ops.lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh)
        rh, rc = ref_lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh)
        assert _max_diff(h1.result(), rh) <= TOL
        assert _max_diff(c1.result(), rc) <= TOL

    def test_float32_stays_float32(self) -> None:
        """The outputs' spec and value are float32 for float32 inputs."""
        rng = np.random.default_rng(0)
        x, h, c = _rand(rng, 2, 3), _rand(rng, 2, 4), _rand(rng, 2, 4)
        w_ih, w_hh, b_ih, b_hh = _params(rng, 4, 3, 4)
        h1, c1 = ops.lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh)
        assert h1.dtype == c1.dtype == np.float32
        assert h1.result().dtype == c1.result().dtype == np.float32
        assert h1.shape == c1.shape == (2, 4)

    def test_no_state_means_zeros(self) -> None:
        """h = c = None gives the same result as zero states."""
        rng = np.random.default_rng(1)
        x = _rand(rng, 4, 6)
        w_ih, w_hh, b_ih, b_hh = _params(rng, 4, 6, 5)
        zeros = np.zeros((4, 5), np.float32)
        h1, c1 = ops.lstm_cell(x, None, None, w_ih, w_hh, b_ih, b_hh)
        h2, c2 = ops.lstm_cell(x, zeros, zeros, w_ih, w_hh, b_ih, b_hh)
        assert _max_diff(h1.result(), h2.result()) <= 1e-7
        assert _max_diff(c1.result(), c2.result()) <= 1e-7

    def test_without_bias_and_unbatched(self) -> None:
        """Biases are optional and a 1-D x is one unbatched sample."""
        rng = np.random.default_rng(2)
        x, h, c = _rand(rng, 6), _rand(rng, 5), _rand(rng, 5)
        w_ih, w_hh, _, _ = _params(rng, 4, 6, 5)
        h1, c1 = ops.lstm_cell(x, h, c, w_ih, w_hh)
        rh, rc = ref_lstm_cell(x, h, c, w_ih, w_hh, None, None)
        assert h1.shape == (5,)
        assert _max_diff(h1.result(), rh) <= TOL
        assert _max_diff(c1.result(), rc) <= TOL

    def test_saturated_gates_do_not_overflow(self) -> None:
        """Huge pre-activations saturate cleanly (warnings are errors in this suite)."""
        rng = np.random.default_rng(3)
        x = _rand(rng, 4, 8, scale=1e4)
        h, c = _rand(rng, 4, 8), _rand(rng, 4, 8)
        w_ih, w_hh, b_ih, b_hh = _params(rng, 4, 8, 8)
        h1, c1 = ops.lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh)
        rh, rc = ref_lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh)
        assert np.all(np.isfinite(h1.result()))
        assert _max_diff(h1.result(), rh) <= TOL
        assert _max_diff(c1.result(), rc) <= TOL

    def test_matches_torch(self) -> None:
        """Same outputs as torch.nn.LSTMCell with its weights."""
        torch = pytest.importorskip("torch")
        torch.manual_seed(0)
        cell = torch.nn.LSTMCell(12, 9)
        p = {k: v.detach().numpy() for k, v in cell.state_dict().items()}
        rng = np.random.default_rng(4)
        x, h, c = _rand(rng, 5, 12), _rand(rng, 5, 9), _rand(rng, 5, 9)
        with torch.no_grad():
            th, tc = cell(torch.from_numpy(x), (torch.from_numpy(h), torch.from_numpy(c)))
        h1, c1 = ops.lstm_cell(x, h, c, p["weight_ih"], p["weight_hh"], p["bias_ih"], p["bias_hh"])
        assert _max_diff(h1.result(), th.numpy()) <= TOL
        assert _max_diff(c1.result(), tc.numpy()) <= TOL


class TestGRUCell:
    """ops.gru_cell computes torch's GRU step."""

    @pytest.mark.parametrize(("batch", "inp", "hidden"), [(3, 5, 7), (1, 16, 8), (8, 33, 64)])
    def test_matches_numpy_reference(self, batch: int, inp: int, hidden: int) -> None:
        """h' matches the written-out equations for random data."""
        rng = np.random.default_rng(batch * inp)
        x, h = _rand(rng, batch, inp), _rand(rng, batch, hidden)
        w_ih, w_hh, b_ih, b_hh = _params(rng, 3, inp, hidden)
        h1 = ops.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh)
        assert h1.dtype == np.float32
        assert h1.result().dtype == np.float32
        assert _max_diff(h1.result(), ref_gru_cell(x, h, w_ih, w_hh, b_ih, b_hh)) <= TOL

    def test_no_state_and_no_bias(self) -> None:
        """h = None means zeros; biases are optional."""
        rng = np.random.default_rng(5)
        x = _rand(rng, 3, 4)
        w_ih, w_hh, b_ih, b_hh = _params(rng, 3, 4, 6)
        zeros = np.zeros((3, 6), np.float32)
        h1 = ops.gru_cell(x, None, w_ih, w_hh, b_ih, b_hh)
        assert _max_diff(h1.result(), ref_gru_cell(x, zeros, w_ih, w_hh, b_ih, b_hh)) <= TOL
        h2 = ops.gru_cell(x, zeros, w_ih, w_hh)
        assert _max_diff(h2.result(), ref_gru_cell(x, zeros, w_ih, w_hh, None, None)) <= TOL

    def test_matches_torch(self) -> None:
        """Same output as torch.nn.GRUCell with its weights."""
        torch = pytest.importorskip("torch")
        torch.manual_seed(1)
        cell = torch.nn.GRUCell(10, 7)
        p = {k: v.detach().numpy() for k, v in cell.state_dict().items()}
        rng = np.random.default_rng(6)
        x, h = _rand(rng, 4, 10), _rand(rng, 4, 7)
        with torch.no_grad():
            th = cell(torch.from_numpy(x), torch.from_numpy(h))
        h1 = ops.gru_cell(x, h, p["weight_ih"], p["weight_hh"], p["bias_ih"], p["bias_hh"])
        assert _max_diff(h1.result(), th.numpy()) <= TOL


class TestListsAndWarnings:
    """The recurrent ops take lists as every op does, and keep numpy's floating-point values
    under ``-W error`` (their kernels are ``ops._checks.array_kernel``)."""

    def test_lstm_and_gru_cells_take_lists(self) -> None:
        rng = np.random.default_rng(3)
        x, h, c = _rand(rng, 2, 3), _rand(rng, 2, 4), _rand(rng, 2, 4)
        w_ih, w_hh, b_ih, b_hh = _params(rng, 4, 3, 4)
        as_lists = [a.astype(np.float64).tolist() for a in (x, h, c, w_ih, w_hh, b_ih, b_hh)]
        h1, c1 = ops.lstm_cell(*as_lists)
        rh, rc = ref_lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh)
        assert h1.result().dtype == np.float64 and _max_diff(h1.result(), rh) <= TOL
        assert _max_diff(c1.result(), rc) <= TOL
        g_ih, g_hh, _, _ = _params(rng, 3, 3, 4)
        got = ops.gru_cell(x.tolist(), h.tolist(), g_ih.tolist(), g_hh.tolist(), None, None)
        assert _max_diff(got.result(), ref_gru_cell(x, h, g_ih, g_hh, None, None)) <= TOL

    def test_sequence_ops_take_lists(self) -> None:
        rng = np.random.default_rng(4)
        x = _rand(rng, 5, 2, 3).astype(np.float64)  # (lists of Python floats are float64)
        w_ih, w_hh, b_ih, b_hh = (a.astype(np.float64) for a in _params(rng, 4, 3, 4))
        want, _, _ = ops.lstm_sequence(x, w_ih, b_ih + b_hh, w_hh)
        got, _, _ = ops.lstm_sequence(
            x.tolist(), w_ih.tolist(), (b_ih + b_hh).tolist(), w_hh.tolist()
        )
        assert got.result().dtype == np.float64
        assert _max_diff(got.result(), want.result()) <= TOL
        g_ih, g_hh, gb_ih, gb_hh = (a.astype(np.float64) for a in _params(rng, 3, 3, 4))
        want_g, _ = ops.gru_sequence(x, g_ih, gb_ih, g_hh, gb_hh)
        got_g, _ = ops.gru_sequence(x.tolist(), g_ih.tolist(), gb_ih, g_hh.tolist(), gb_hh)
        assert _max_diff(got_g.result(), want_g.result()) <= TOL

    @pytest.mark.filterwarnings("error::RuntimeWarning")
    def test_overflow_gives_numpys_values_under_warnings_as_errors(self) -> None:
        """A product that overflows float64 warns in numpy; the op gives numpy's values."""
        x, w = np.full((1, 2), 1e300), np.full((8, 2), 1e300)
        with np.errstate(all="ignore"):
            want = ref_lstm_cell(
                x, np.zeros((1, 2)), np.zeros((1, 2)), w, np.ones((8, 2)), None, None
            )
        h1, c1 = ops.lstm_cell(x, None, None, w, np.ones((8, 2)))
        np.testing.assert_allclose(h1.result(), want[0])
        np.testing.assert_allclose(c1.result(), want[1])


class TestErrors:
    """Bad inputs raise at the call, naming the op, the shapes and the dtypes."""

    def _lstm_args(self) -> list[Array]:
        rng = np.random.default_rng(7)
        return [_rand(rng, 3, 5), _rand(rng, 3, 7), _rand(rng, 3, 7), *_params(rng, 4, 5, 7)]

    def test_wrong_input_size(self) -> None:
        """x's features must match w_ih; the message shows every input's shape."""
        x, h, c, w_ih, w_hh, b_ih, b_hh = self._lstm_args()
        with pytest.raises(dataflow.OpInputError, match=r"lstm_cell: x must have shape") as e:
            ops.lstm_cell(x[:, :4], h, c, w_ih, w_hh, b_ih, b_hh)
        assert "x float32[3, 4]" in str(e.value)
        assert "w_ih float32[28, 5]" in str(e.value)

    def test_wrong_hidden_weight(self) -> None:
        """w_hh must be (4*hidden, hidden)."""
        x, h, c, w_ih, w_hh, b_ih, b_hh = self._lstm_args()
        with pytest.raises(dataflow.OpInputError, match=r"lstm_cell: w_hh must have shape"):
            ops.lstm_cell(x, h, c, w_ih, w_hh[:, :6], b_ih, b_hh)

    def test_wrong_state_shape(self) -> None:
        """h must be (batch, hidden)."""
        x, h, c, w_ih, w_hh, b_ih, b_hh = self._lstm_args()
        with pytest.raises(dataflow.OpInputError, match=r"h must have shape \(3, 7\)"):
            ops.lstm_cell(x, h[:2], c, w_ih, w_hh, b_ih, b_hh)

    def test_wrong_bias_shape(self) -> None:
        """Biases must be (4*hidden,)."""
        x, h, c, w_ih, w_hh, b_ih, b_hh = self._lstm_args()
        with pytest.raises(dataflow.OpInputError, match=r"b_hh must have shape \(28,\)"):
            ops.lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh[:27])

    def test_h_without_c(self) -> None:
        """h and c come together (or both None)."""
        x, h, _, w_ih, w_hh, b_ih, b_hh = self._lstm_args()
        with pytest.raises(dataflow.OpInputError, match="give both h and c"):
            ops.lstm_cell(x, h, None, w_ih, w_hh, b_ih, b_hh)

    def test_mixed_dtypes(self) -> None:
        """A float64 input among float32 ones is an OpTypeError naming the dtypes."""
        x, h, c, w_ih, w_hh, b_ih, b_hh = self._lstm_args()
        with pytest.raises(dataflow.OpTypeError, match=r"lstm_cell: .*x float64\[3, 5\]"):
            ops.lstm_cell(x.astype(np.float64), h, c, w_ih, w_hh, b_ih, b_hh)

    def test_integer_dtype(self) -> None:
        """Integer inputs are rejected with advice to cast."""
        rng = np.random.default_rng(8)
        x = np.ones((2, 5), np.int32)
        h = np.ones((2, 7), np.int32)
        w_ih, w_hh = (p.astype(np.int32) for p in _params(rng, 3, 5, 7)[:2])
        with pytest.raises(dataflow.OpTypeError, match=r"gru_cell: .*astype\(np.float32\)"):
            ops.gru_cell(x, h, w_ih, w_hh)

    def test_gru_shapes(self) -> None:
        """gru_cell checks for 3 gates, not 4."""
        rng = np.random.default_rng(9)
        w_ih, w_hh, b_ih, b_hh = _params(rng, 4, 5, 7)
        with pytest.raises(dataflow.OpInputError, match=r"gru_cell: w_hh must have shape \(3\*"):
            ops.gru_cell(_rand(rng, 2, 5), _rand(rng, 2, 7), w_ih, w_hh, b_ih, b_hh)

    def test_subclass_input_names_the_op_and_the_input(self) -> None:
        """A masked array or np.matrix among the inputs is refused naming the op and which
        input it is (the message once said only "an argument")."""
        x, h, c, w_ih, w_hh, b_ih, b_hh = self._lstm_args()
        masked = np.ma.masked_array(x)
        with pytest.raises(dataflow.OpTypeError, match=r"^lstm_cell: x is a np\.ma\.Masked"):
            ops.lstm_cell(masked, h, c, w_ih, w_hh, b_ih, b_hh)
        with pytest.raises(dataflow.OpTypeError, match=r"^lstm_sequence: h0 is a np\.ma\."):
            ops.lstm_sequence(x[None], w_ih, b_ih, w_hh, np.ma.masked_array(h), c)
        with pytest.raises(dataflow.OpTypeError, match=r"^gru_cell: w_ih is a np\.ma\."):
            ops.gru_cell(x, h, np.ma.masked_array(w_ih[:21]), w_hh[:21], None, None)

    def test_missing_required_input_is_an_op_type_error(self) -> None:
        """None for x or a weight names the op and the input (it was a bare AssertionError)."""
        x, h, c, w_ih, w_hh, b_ih, _ = self._lstm_args()
        missing: Any = None  # (what the annotations forbid, as a user may pass it)
        with pytest.raises(dataflow.OpTypeError, match=r"^lstm_sequence: x is None, but it is"):
            ops.lstm_sequence(missing, w_ih, b_ih, w_hh)
        with pytest.raises(dataflow.OpTypeError, match=r"^lstm_cell: w_ih is None, but it is"):
            ops.lstm_cell(x, h, c, missing, w_hh)
        with pytest.raises(dataflow.OpTypeError, match=r"^gru_sequence: w_hh is None, but it"):
            ops.gru_sequence(x[None], w_ih[:21], None, missing, None)

    def test_ragged_or_string_input_names_the_op(self) -> None:
        """A ragged list or a string input is refused naming the op and the input (a ragged
        list was numpy's bare ValueError)."""
        x, h, c, w_ih, w_hh, b_ih, b_hh = self._lstm_args()
        ragged: Any = [[1.0] * 5, [1.0]]
        text: Any = "bias"
        with pytest.raises(dataflow.OpInputError, match=r"^lstm_cell: x is a list that does"):
            ops.lstm_cell(ragged, h, c, w_ih, w_hh, b_ih, b_hh)
        with pytest.raises(dataflow.OpTypeError, match=r"^gru_cell: b_ih has type str"):
            ops.gru_cell(x, h, w_ih[:21], w_hh[:21], text, None)

    def test_raised_at_call_site_in_a_runtime(self) -> None:
        """Inside a runtime the meta rule raises before any task exists."""
        x, h, c, w_ih, w_hh, b_ih, b_hh = self._lstm_args()

        async def main() -> int:
            with pytest.raises(dataflow.OpInputError, match="lstm_cell"):
                ops.lstm_cell(x, h, c, w_hh, w_ih, b_ih, b_hh)
            rt = dataflow.current_runtime()
            assert rt is not None
            return rt.tasks_run

        assert dataflow.run(main, interop_threads=1) == 0

    def test_step_index_checked(self) -> None:
        """lstm_step's t must index xproj."""
        rng = np.random.default_rng(10)
        xproj = _rand(rng, 4, 2, 12)
        with pytest.raises(dataflow.OpInputError, match=r"lstm_step: t must be a step index"):
            lstm_step(xproj, 4, None, None, _rand(rng, 12, 3))


class TestStepOps:
    """The decomposition the modules use gives the fused cell's results."""

    def test_projection_then_lstm_steps(self) -> None:
        """rnn_projection + lstm_step over a sequence equals lstm_cell step by step."""
        rng = np.random.default_rng(11)
        steps, batch, inp, hidden = 6, 3, 5, 4
        x = _rand(rng, steps, batch, inp)
        w_ih, w_hh, b_ih, b_hh = _params(rng, 4, inp, hidden)
        xproj = rnn_projection(x, w_ih, b_ih + b_hh)
        assert xproj.shape == (steps, batch, 4 * hidden)
        h: Any = None
        c: Any = None
        rh = rc = np.zeros((batch, hidden), np.float32)
        for t in range(steps):
            h, c = lstm_step(xproj, t, h, c, w_hh)
            rh, rc = ref_lstm_cell(x[t], rh, rc, w_ih, w_hh, b_ih, b_hh)
            assert _max_diff(h.result(), rh) <= TOL
            assert _max_diff(c.result(), rc) <= TOL

    def test_batch_first_projection(self) -> None:
        """A batch-first x projects to the same (steps, batch, gates) layout."""
        rng = np.random.default_rng(12)
        x = _rand(rng, 4, 3, 5)  # (steps, batch, in)
        w_ih = _rand(rng, 8, 5)
        a = rnn_projection(x, w_ih, None)
        b = rnn_projection(np.ascontiguousarray(x.swapaxes(0, 1)), w_ih, None, batch_first=True)
        assert a.shape == b.shape == (4, 3, 8)
        assert _max_diff(a.result(), b.result()) <= 1e-6

    def test_gru_steps(self) -> None:
        """rnn_projection + gru_step equals gru_cell step by step."""
        rng = np.random.default_rng(13)
        steps, batch, inp, hidden = 5, 2, 3, 4
        x = _rand(rng, steps, batch, inp)
        w_ih, w_hh, b_ih, b_hh = _params(rng, 3, inp, hidden)
        xproj = rnn_projection(x, w_ih, b_ih)
        h: Any = None
        rh = np.zeros((batch, hidden), np.float32)
        for t in range(steps):
            h = gru_step(xproj, t, h, w_hh, b_hh)
            rh = ref_gru_cell(x[t], rh, w_ih, w_hh, b_ih, b_hh)
            assert _max_diff(h.result(), rh) <= TOL

    def test_output_and_states(self) -> None:
        """rnn_output lays out both directions; stack_states and select index axis 0."""
        hs_f = [np.full((2, 3), t, np.float32) for t in range(4)]
        hs_b = [np.full((2, 3), -t, np.float32) for t in range(4)]
        out = rnn_output(hs_f, hs_b).result()  # type: ignore[arg-type]
        assert out.shape == (4, 2, 6)
        assert np.all(out[2, :, :3] == 2) and np.all(out[2, :, 3:] == -2)
        bf = rnn_output(hs_f, None, batch_first=True).result()  # type: ignore[arg-type]
        assert bf.shape == (2, 4, 3) and np.all(bf[:, 3] == 3)
        st = stack_states(hs_f).result()  # type: ignore[arg-type]
        assert st.shape == (4, 2, 3)
        assert np.array_equal(select(st, 1).result(), hs_f[1])

    def test_cells_in_a_runtime(self) -> None:
        """Inside a runtime the cells return pending tensors with the same values."""
        rng = np.random.default_rng(14)
        x, h, c = _rand(rng, 4, 6), _rand(rng, 4, 5), _rand(rng, 4, 5)
        p = _params(rng, 4, 6, 5)
        g = _params(rng, 3, 5, 5)

        async def main() -> tuple[Array, Array, Array]:
            h1, c1 = ops.lstm_cell(x, h, c, *p)
            h2 = ops.gru_cell(h1, h, *g)  # reads the pending h1
            assert isinstance(h1, ops.Tensor) and h1.shape == (4, 5)
            return await h1, await c1, await h2

        h1, c1, h2 = dataflow.run(main, interop_threads=2)
        rh, rc = ref_lstm_cell(x, h, c, *p)
        assert _max_diff(h1, rh) <= TOL
        assert _max_diff(c1, rc) <= TOL
        assert _max_diff(h2, ref_gru_cell(h1, h, *g)) <= TOL
