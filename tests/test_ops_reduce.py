"""ops reductions: sum, mean, var, max, min, argmax, argmin, against numpy and torch."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dataflow
import ops
from dataflow import OpInputError, OpTypeError
from tests._ops_helpers import assert_like, both, check, rand

# -- reductions --------------------------------------------------------------------------------

REDUCTIONS: list[tuple[Any, Any]] = [
    (ops.sum, np.sum),
    (ops.mean, np.mean),
    (ops.var, np.var),
    (ops.max, np.max),
    (ops.min, np.min),
]
AXES: list[Any] = [None, 0, 1, -1, (0, 2), (2, 0), (), (0, 1, 2)]


def _ids(pairs: list[tuple[Any, Any]]) -> list[str]:
    return [op.name for op, _ in pairs]


class TestAgainstNumpy:
    @pytest.mark.parametrize("keepdims", [False, True])
    @pytest.mark.parametrize("axis", AXES, ids=str)
    @pytest.mark.parametrize(("op", "ref"), REDUCTIONS, ids=_ids(REDUCTIONS))
    def test_float64_axes(self, op: Any, ref: Any, axis: Any, keepdims: bool) -> None:
        """Every axis form and keepdims give numpy's shape and values."""
        x = rand((3, 4, 5), np.float64, 1)
        check(lambda: op(x, axis, keepdims), ref(x, axis=axis, keepdims=keepdims))

    @pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8, np.bool_, np.uint16])
    @pytest.mark.parametrize(("op", "ref"), REDUCTIONS, ids=_ids(REDUCTIONS))
    def test_dtypes_follow_numpy(self, op: Any, ref: Any, dtype: Any) -> None:
        """sum of int8/bool widens, mean/var of ints are float64, max keeps the dtype."""
        x = rand((6, 7), dtype, 2)
        check(lambda: op(x, axis=1), ref(x, axis=1))
        check(lambda: op(x), ref(x))

    @pytest.mark.parametrize(("op", "ref"), REDUCTIONS, ids=_ids(REDUCTIONS))
    def test_keyword_arguments(self, op: Any, ref: Any) -> None:
        """axis= and keepdims= work as keywords."""
        x = rand((2, 3), np.float32, 3)
        check(lambda: op(x, axis=0, keepdims=True), ref(x, axis=0, keepdims=True))

    @pytest.mark.parametrize("ddof", [0, 1, 2])
    def test_var_ddof(self, ddof: int) -> None:
        """var's ddof divides by n - ddof like numpy."""
        x = rand((5, 6), np.float64, 4)
        check(lambda: ops.var(x, 0, False, ddof), np.var(x, axis=0, ddof=ddof))
        check(lambda: ops.var(x, axis=1, ddof=ddof), np.var(x, axis=1, ddof=ddof))

    def test_complex_var_is_real(self) -> None:
        """var of complex data is real, as numpy's."""
        z = rand((4, 3), np.float32, 5) + 1j * rand((4, 3), np.float32, 6)
        check(lambda: ops.var(z, axis=0), np.var(z, axis=0))

    def test_python_list_and_scalar(self) -> None:
        """Lists and scalars reduce like np.asarray of them."""
        check(lambda: ops.sum([[1, 2], [3, 4]], axis=0), np.sum([[1, 2], [3, 4]], axis=0))
        check(lambda: ops.mean(2.5), np.asarray(np.mean(2.5)))

    def test_reduce_a_pending_tensor(self) -> None:
        """A reduction of another op's output (pending in a runtime) matches numpy."""
        x = rand((8, 3), np.float64, 7)
        check(lambda: ops.mean(ops.exp(x), axis=0), np.mean(np.exp(x), axis=0))

    def test_nan_propagates(self) -> None:
        """NaN propagates through sum, mean, max and min."""
        x = np.array([[1.0, np.nan], [2.0, 3.0]])
        for op, ref in REDUCTIONS:
            check(functools.partial(op, x, axis=0), ref(x, axis=0))


class TestZeroSize:
    @pytest.mark.parametrize("axis", [None, 0, 1])
    def test_sum_of_empty_is_zero(self, axis: Any) -> None:
        """sum over an empty axis is 0, with numpy's shape."""
        x = np.empty((0, 3), np.float32)
        check(lambda: ops.sum(x, axis), np.sum(x, axis=axis))

    def test_mean_of_empty_is_nan_without_warning(self) -> None:
        """mean over an empty axis is NaN (numpy's value), without failing on numpy's warning."""
        x = np.empty((0, 3), np.float32)
        check(lambda: ops.mean(x, axis=0), np.full(3, np.nan, np.float32))
        check(lambda: ops.mean(x), np.asarray(np.nan, np.float32))

    def test_var_without_degrees_of_freedom_is_nan(self) -> None:
        """var with n <= ddof is NaN, as numpy returns."""
        x = rand((1, 3), np.float64, 8)
        check(lambda: ops.var(x, axis=0, ddof=1), np.full(3, np.nan))
        check(lambda: ops.var(np.empty((0, 2)), axis=0), np.full(2, np.nan))

    def test_reduce_non_empty_axis_of_empty_array(self) -> None:
        """Reducing a non-empty axis of a zero-size array is fine (an empty result)."""
        x = np.empty((0, 3))
        for op, ref in REDUCTIONS:
            check(functools.partial(op, x, axis=1), ref(x, axis=1))

    @pytest.mark.parametrize("op", [ops.max, ops.min], ids=["max", "min"])
    def test_extremum_over_empty_axis_refused(self, op: Any) -> None:
        """max/min over a length-0 axis raise at the call: there is no identity."""
        expected = rf"{op.name}: cannot take the .* over axis 0 of length 0"
        with pytest.raises(OpInputError, match=expected):
            op(np.empty((0, 3)), axis=0)


class TestErrors:
    def test_axis_out_of_bounds(self) -> None:
        """An axis past ndim names the axis and the dimension."""
        expected = r"sum: axis 2 is out of bounds for an array of dimension 2"
        with pytest.raises(OpInputError, match=expected):
            ops.sum(np.ones((2, 3)), axis=2)

    def test_negative_axis_out_of_bounds(self) -> None:
        """A negative axis below -ndim is refused."""
        with pytest.raises(OpInputError, match=r"mean: axis -3 is out of bounds"):
            ops.mean(np.ones((2, 3)), axis=-3)

    def test_duplicate_axis(self) -> None:
        """The same axis twice is refused."""
        with pytest.raises(OpInputError, match=r"var: axis \(0, -2\) names the same axis"):
            ops.var(np.ones((2, 3)), axis=(0, -2))

    @pytest.mark.parametrize("axis", [1.0, "0", [0, 1]], ids=["float", "str", "list"])
    def test_axis_type(self, axis: Any) -> None:
        """An axis that is not an int/tuple is an OpTypeError."""
        expected = r"max: axis must be None, an int or a tuple of ints"
        with pytest.raises(OpTypeError, match=expected):
            ops.max(np.ones((2, 3)), axis=axis)

    def test_keepdims_type(self) -> None:
        """keepdims must be a bool."""
        with pytest.raises(OpTypeError, match=r"sum: keepdims must be a bool, got str"):
            ops.sum(np.ones(3), keepdims="yes")

    def test_ddof_type(self) -> None:
        """ddof must be an int."""
        with pytest.raises(OpTypeError, match=r"var: ddof must be an int, got float"):
            ops.var(np.ones(3), ddof=1.0)

    def test_non_array(self) -> None:
        """A dict is not reducible."""
        with pytest.raises(OpTypeError, match=r"sum: argument 1 has type dict"):
            ops.sum({"a": 1})


class TestCost:
    def test_sum_cost(self) -> None:
        """A reduction reads its input once and writes the output."""
        x = np.ones((10, 20), np.float32)
        assert ops.sum.cost is not None
        assert ops.sum.cost(x, 1) == dataflow.Cost(200.0, (200 + 10) * 4.0)
        assert ops.sum.cost(x) == dataflow.Cost(200.0, (200 + 1) * 4.0)

    def test_var_costs_more(self) -> None:
        """var makes more passes than sum."""
        x = np.ones(100)
        assert ops.var.cost is not None and ops.sum.cost is not None
        assert ops.var.cost(x).flops > ops.sum.cost(x).flops


class TestHypothesis:
    @settings(max_examples=60, deadline=None)
    @given(
        x=hnp.arrays(
            np.float64,
            hnp.array_shapes(min_dims=1, max_dims=4, min_side=1),
            elements=st.floats(-100, 100),
        ),
        data=st.data(),
    )
    def test_sum_and_max_over_any_axes(self, x: np.ndarray, data: st.DataObject) -> None:
        """Any valid axis tuple gives numpy's result for sum and max (eagerly)."""
        axis = data.draw(hnp.valid_tuple_axes(x.ndim))
        keepdims = data.draw(st.booleans())
        for op, ref in ((ops.sum, np.sum), (ops.max, np.max)):
            t = op(x, axis, keepdims)
            assert_like(t.result(), ref(x, axis=axis, keepdims=keepdims))


class TestTorch:
    def test_mean_var_max_match_torch(self) -> None:
        """mean, var (biased) and max over an axis agree with torch."""
        torch = pytest.importorskip("torch")
        x = rand((6, 5, 4), np.float32, 9)
        tx = torch.from_numpy(x)
        pairs = [
            (lambda: ops.mean(x, axis=1), tx.mean(dim=1)),
            (lambda: ops.var(x, axis=(0, 2)), tx.var(dim=(0, 2), unbiased=False)),
            (lambda: ops.max(x, axis=-1), tx.amax(dim=-1)),
            (lambda: ops.sum(x, axis=0, keepdims=True), tx.sum(dim=0, keepdim=True)),
        ]
        for build, expected in pairs:
            for got in both(build):
                np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-6)


# -- argmax / argmin ---------------------------------------------------------------------------

ARG: list[tuple[Any, Any]] = [(ops.argmax, np.argmax), (ops.argmin, np.argmin)]


class TestArgExtremum:
    @pytest.mark.parametrize("keepdims", [False, True])
    @pytest.mark.parametrize("axis", [None, 0, 1, -1], ids=str)
    @pytest.mark.parametrize(
        "dtype", [np.float32, np.float64, np.int8, np.uint8, np.bool_, np.float16]
    )
    @pytest.mark.parametrize(("op", "ref"), ARG, ids=_ids(ARG))
    def test_matches_numpy(self, op: Any, ref: Any, dtype: Any, axis: Any, keepdims: bool) -> None:
        """Indices (np.intp), shapes with keepdims, flat index for axis=None: numpy's."""
        x = rand((4, 5, 3), dtype, 1)
        check(lambda: op(x, axis, keepdims), ref(x, axis=axis, keepdims=keepdims))

    @pytest.mark.parametrize(("op", "ref"), ARG, ids=_ids(ARG))
    def test_ties_give_the_first_index(self, op: Any, ref: Any) -> None:
        """Equal values: the first index wins."""
        x = np.array([[1, 3, 3, 1], [2, 2, 2, 2]], np.int32)
        check(lambda: op(x, 1), ref(x, 1))
        check(lambda: op(x), ref(x))

    @pytest.mark.parametrize(("op", "ref"), ARG, ids=_ids(ARG))
    def test_nan_wins(self, op: Any, ref: Any) -> None:
        """The first NaN is both the argmax and the argmin, like numpy and torch."""
        x = np.array([[1.0, np.nan, 3.0, np.nan], [np.inf, 0.0, -np.inf, 1.0]])
        check(lambda: op(x, axis=1), ref(x, axis=1))

    def test_complex_orders_lexicographically(self) -> None:
        """Complex input: numpy's order (real part, then imaginary)."""
        z = np.array([1 + 2j, 1 + 3j, 0 + 9j])
        check(lambda: ops.argmax(z), np.argmax(z))
        check(lambda: ops.argmin(z), np.argmin(z))

    def test_0d_and_python_scalar(self) -> None:
        """A 0-d input is one element: index 0 (axis None, 0 or -1)."""
        check(lambda: ops.argmax(np.float32(3.0)), np.argmax(np.float32(3.0)))
        check(lambda: ops.argmin(2.5, axis=0), np.argmin(np.array(2.5), axis=0))
        check(lambda: ops.argmax(np.array(1), -1, True), np.argmax(np.array(1), -1, keepdims=True))

    def test_empty_other_axis(self) -> None:
        """argmax over a non-empty axis of an empty array is an empty index array."""
        x = np.zeros((0, 3))
        check(lambda: ops.argmax(x, axis=1), np.argmax(x, axis=1))

    @pytest.mark.parametrize(("op", "ref"), ARG, ids=_ids(ARG))
    def test_empty_axis_refused_at_the_call(self, op: Any, ref: Any) -> None:
        """An empty axis (or empty input with axis=None) is refused where numpy raises."""
        x = np.zeros((0, 3))
        for axis in (None, 0):
            with pytest.raises(ValueError):
                ref(x, axis=axis)
            with pytest.raises(OpInputError, match=rf"{op.name}: .* (empty|length 0)"):
                op(x, axis=axis)

    def test_tuple_axis_refused(self) -> None:
        """argmax takes one axis (numpy's rule), with a hint."""
        with pytest.raises(OpTypeError, match=r"argmax: axis must be None or an int.*reshape"):
            ops.argmax(np.ones((2, 2)), axis=(0, 1))

    def test_axis_out_of_bounds(self) -> None:
        """An out-of-range axis names the op and the valid axes."""
        with pytest.raises(OpInputError, match=r"argmin: axis 2 is out of bounds"):
            ops.argmin(np.ones((2, 2)), axis=2)

    def test_keepdims_must_be_a_bool(self) -> None:
        """keepdims='no' is refused, not read as True."""
        with pytest.raises(OpTypeError, match=r"argmax: keepdims must be a bool"):
            ops.argmax(np.ones(3), keepdims="no")

    def test_index_a_tensor_with_the_result(self) -> None:
        """The indices of a pending argmax index another Tensor (advanced getitem)."""
        x = rand((4, 6), np.float32, 3)

        def build() -> Any:
            idx = ops.argmax(x, axis=1)
            return ops.asarray(x)[np.arange(4), idx]

        check(build, x[np.arange(4), np.argmax(x, axis=1)])

    def test_cost(self) -> None:
        """One comparison per input element; bytes: input plus intp output."""
        assert ops.argmax.cost is not None
        x = np.ones((4, 5), np.float32)
        assert ops.argmax.cost(x, 1) == dataflow.Cost(20.0, 80.0 + 4 * 8.0)

    def test_match_torch(self) -> None:
        """argmax/argmin over a dim equal torch's (int64 indices)."""
        torch = pytest.importorskip("torch")
        x = rand((6, 7), np.float32, 4)
        tx = torch.from_numpy(x)
        for got in both(lambda: ops.argmax(x, axis=1)):
            np.testing.assert_array_equal(got, torch.argmax(tx, dim=1).numpy())
        for got in both(lambda: ops.argmin(x, axis=0, keepdims=True)):
            np.testing.assert_array_equal(got, torch.argmin(tx, dim=0, keepdim=True).numpy())
