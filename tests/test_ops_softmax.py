"""softmax and log_softmax: against a float64 reference, scipy and torch; stability; errors."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow import OpInputError, OpTypeError
from tests._ops_helpers import assert_like, both, check, rand

FLOATS = [np.float16, np.float32, np.float64]


def _softmax_ref(x: np.ndarray, axis: Any) -> np.ndarray:
    """The textbook formula in float64 (fine for moderate inputs), cast to x's dtype."""
    e = np.exp(x.astype(np.float64))
    out: np.ndarray = (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)
    return out


def _log_softmax_ref(x: np.ndarray, axis: Any) -> np.ndarray:
    x64 = x.astype(np.float64)
    out: np.ndarray = (x64 - np.log(np.exp(x64).sum(axis=axis, keepdims=True))).astype(x.dtype)
    return out


class TestValues:
    @pytest.mark.parametrize("axis", [-1, 0, 1, (0, 2), None], ids=str)
    @pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
    def test_softmax_matches_the_formula(self, dtype: Any, axis: Any) -> None:
        """softmax over any axis (int, tuple, None) equals exp(x) / sum(exp(x))."""
        x = rand((3, 4, 5), dtype, 1) * np.asarray(3, dtype)
        check(lambda: ops.softmax(x, axis), _softmax_ref(x, axis))

    @pytest.mark.parametrize("axis", [-1, 0, (1, 2), None], ids=str)
    @pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
    def test_log_softmax_matches_the_formula(self, dtype: Any, axis: Any) -> None:
        """log_softmax equals x - log(sum(exp(x)))."""
        x = rand((3, 4, 5), dtype, 2) * np.asarray(3, dtype)
        # x - max - log(sum): near 0 the error is absolute, a few ulps of |x| (as in torch).
        atol = 8 * float(np.finfo(dtype).eps) * max(1.0, float(np.abs(x).max()))
        for got in both(lambda: ops.log_softmax(x, axis=axis)):
            assert got.dtype == x.dtype
            rtol = {2: 1e-3, 4: 1e-6, 8: 1e-12}[x.dtype.itemsize]
            np.testing.assert_allclose(got, _log_softmax_ref(x, axis), rtol=rtol, atol=atol)

    def test_default_axis_is_the_last(self) -> None:
        """softmax(x) normalises over the last axis, like torch's dim=-1."""
        x = rand((4, 6), np.float32, 3)
        check(lambda: ops.softmax(x), _softmax_ref(x, -1))
        check(lambda: ops.log_softmax(x), _log_softmax_ref(x, -1))

    def test_rows_sum_to_one(self) -> None:
        """Each softmax slice sums to 1 and exp(log_softmax) is softmax."""
        x = rand((7, 9), np.float64, 4) * 10
        s = ops.softmax(x).result()
        np.testing.assert_allclose(s.sum(axis=-1), 1.0, rtol=1e-12)
        np.testing.assert_allclose(np.exp(ops.log_softmax(x).result()), s, rtol=1e-12)

    def test_matches_scipy(self) -> None:
        """Equal to scipy.special.softmax and log_softmax."""
        special = pytest.importorskip("scipy.special")
        x = rand((5, 8), np.float64, 5) * 5
        check(lambda: ops.softmax(x, axis=0), special.softmax(x, axis=0))
        check(lambda: ops.log_softmax(x, axis=None), special.log_softmax(x, axis=None))

    def test_pending_input(self) -> None:
        """softmax of a pending Tensor in a runtime."""
        x = rand((4, 4), np.float32, 6)
        check(lambda: ops.softmax(ops.tanh(x) * 2), _softmax_ref(np.tanh(x) * 2, -1))


class TestStability:
    def test_large_inputs_do_not_overflow(self) -> None:
        """softmax([1000, 1000]) is [0.5, 0.5] (the naive formula gives NaN)."""
        x = np.array([[1000.0, 1000.0, -1000.0], [-1e30, 0.0, 1e30]])
        check(lambda: ops.softmax(x), np.array([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]))

    def test_log_softmax_of_very_negative_entries_is_finite(self) -> None:
        """log_softmax keeps -2000.69 where log(softmax) would give -inf."""
        x = np.array([1000.0, 1000.0, -1000.0], np.float32)
        got = ops.log_softmax(x).result()
        np.testing.assert_allclose(got, [-np.log(2), -np.log(2), -2000 - np.log(2)], rtol=1e-6)

    def test_float16_is_computed_in_float32(self) -> None:
        """float16 input: float16 output within one float16 rounding of the float64 answer."""
        x = (rand((6, 50), np.float32, 7) * 4).astype(np.float16)
        for got in both(lambda: ops.softmax(x)):
            assert got.dtype == np.float16
            np.testing.assert_allclose(got, _softmax_ref(x, -1), rtol=1e-3, atol=1e-4)

    def test_special_values_follow_torch(self) -> None:
        """-inf entries get 0; an all -inf, +inf or NaN slice is NaN (torch's results)."""
        inf, nan = np.inf, np.nan
        x = np.array([[-inf, 0.0, 1.0], [-inf, -inf, -inf], [1.0, inf, 2.0], [1.0, nan, 2.0]])
        soft = ops.softmax(x).result()
        np.testing.assert_allclose(soft[0], _softmax_ref(np.array([-inf, 0.0, 1.0]), -1))
        assert np.isnan(soft[1:]).all()
        log = ops.log_softmax(x).result()
        assert log[0, 0] == -inf and np.isnan(log[1:]).all()

    def test_empty_and_0d(self) -> None:
        """An empty input gives an empty output; a 0-d input is one element (1.0, log 0.0)."""
        check(lambda: ops.softmax(np.ones((2, 0), np.float32)), np.ones((2, 0), np.float32))
        check(lambda: ops.softmax(np.ones((0, 3))), np.ones((0, 3)))
        check(lambda: ops.softmax(np.float32(3.0)), np.array(1.0, np.float32))
        check(lambda: ops.log_softmax(2.0, axis=0), np.array(0.0))


class TestErrors:
    @pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_, np.complex128])
    def test_non_floating_dtypes_refused(self, dtype: Any) -> None:
        """Integer, bool and complex inputs are refused at the call with the conversion to do."""
        with pytest.raises(OpTypeError, match=r"softmax: argument 1 has dtype .*astype\(np"):
            ops.softmax(np.zeros(3, dtype))
        with pytest.raises(OpTypeError, match=r"log_softmax: argument 1 has dtype"):
            ops.log_softmax(np.zeros(3, dtype))

    def test_axis_out_of_bounds(self) -> None:
        """An axis past the input's dimensions names the op and the valid axes."""
        with pytest.raises(OpInputError, match=r"softmax: axis 2 is out of bounds .* 2"):
            ops.softmax(np.ones((2, 3)), axis=2)

    def test_axis_type(self) -> None:
        """A float axis is refused."""
        with pytest.raises(OpTypeError, match=r"log_softmax: axis must be None, an int"):
            ops.log_softmax(np.ones(3), axis=1.0)

    def test_errors_raise_at_the_call_in_a_runtime(self) -> None:
        """Refused where called, inside a runtime too."""

        async def main() -> str:
            with pytest.raises(OpTypeError, match="softmax"):
                ops.softmax(np.arange(3))
            return "ok"

        assert dataflow.run(main) == "ok"


class TestCost:
    def test_cost(self) -> None:
        """About 8 flops per element; bytes are input plus output."""
        assert ops.softmax.cost is not None
        assert ops.softmax.cost(np.ones((10, 10), np.float32)) == dataflow.Cost(800.0, 800.0)


class TestTorch:
    @pytest.mark.parametrize("dim", [-1, 0])
    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_match_torch(self, dtype: Any, dim: int) -> None:
        """softmax and log_softmax equal torch's, large inputs included."""
        torch = pytest.importorskip("torch")
        x = rand((6, 10), dtype, 8) * np.asarray(50, dtype)
        tx = torch.from_numpy(x)
        for op, ref in ((ops.softmax, torch.softmax), (ops.log_softmax, torch.log_softmax)):
            expected = ref(tx, dim).numpy()
            for got in both(functools.partial(op, x, dim)):
                assert_like(got, expected)

    def test_special_values_match_torch(self) -> None:
        """-inf, +inf and NaN rows give torch's values exactly (NaN where torch has NaN)."""
        torch = pytest.importorskip("torch")
        inf, nan = np.inf, np.nan
        x = np.array([[-inf, 0.0, 1.0], [-inf, -inf, -inf], [1.0, inf, 2.0], [1.0, nan, 2.0]])
        tx = torch.from_numpy(x)
        for op, ref in ((ops.softmax, torch.softmax), (ops.log_softmax, torch.log_softmax)):
            for got in both(functools.partial(op, x)):
                np.testing.assert_allclose(got, ref(tx, -1).numpy(), equal_nan=True)
