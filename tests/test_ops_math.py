"""sqrt, abs, sin, cos, clip (and log, maximum, minimum, where) against numpy and torch."""

from __future__ import annotations

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

UNARY: list[tuple[Any, Any]] = [
    (ops.sqrt, np.sqrt),
    (ops.abs, np.abs),
    (ops.sin, np.sin),
    (ops.cos, np.cos),
    (ops.log, np.log),
]
DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int32, np.uint8, np.bool_, np.complex128]


def _data(shape: tuple[int, ...], dtype: Any, seed: int) -> np.ndarray:
    x = rand(shape, dtype, seed)
    if np.dtype(dtype).kind == "f":
        x = x * np.asarray(5, dtype)  # several periods of sin/cos, and negative sqrt/log inputs
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rand(shape, np.float64, seed + 1)
    return x


class TestUnary:
    @pytest.mark.parametrize("shape", [(3, 4), (), (0, 5), (2, 3, 4)], ids=str)
    @pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
    @pytest.mark.parametrize(("op", "ref"), UNARY, ids=[op.name for op, _ in UNARY])
    def test_matches_numpy(self, op: Any, ref: Any, dtype: Any, shape: Any) -> None:
        """Values, dtype and shape equal numpy's ufunc (NaN for sqrt/log of negatives)."""
        x = _data(shape, dtype, 1)
        with np.errstate(all="ignore"):
            expected = ref(x)
        check(lambda: op(x), expected)

    @pytest.mark.parametrize(("op", "ref"), UNARY, ids=[op.name for op, _ in UNARY])
    def test_special_values_match_numpy(self, op: Any, ref: Any) -> None:
        """inf, -inf, NaN, -0.0 and 0 give numpy's values, without failing the task."""
        x = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, -1.0, 1e308], np.float64)
        with np.errstate(all="ignore"):
            expected = ref(x)
        check(lambda: op(x), expected)

    def test_abs_of_complex_is_real(self) -> None:
        """abs of complex64 is float32, the modulus."""
        z = (rand((5,), np.float32, 2) + 1j * rand((5,), np.float32, 3)).astype(np.complex64)
        check(lambda: ops.abs(z), np.abs(z))

    def test_abs_of_the_smallest_int_wraps_like_numpy(self) -> None:
        """abs(int8 -128) is -128 in numpy (two's complement): the same here."""
        x = np.array([-128, -1, 127], np.int8)
        check(lambda: ops.abs(x), np.abs(x))

    @pytest.mark.parametrize(("op", "ref"), UNARY, ids=[op.name for op, _ in UNARY])
    def test_python_scalars(self, op: Any, ref: Any) -> None:
        """A Python scalar gives numpy's float64 0-d result."""
        check(lambda: op(2.25), ref(np.float64(2.25)))
        check(lambda: op(3), ref(np.int64(3)))

    def test_sqrt_and_abs_compose_on_pending_tensors(self) -> None:
        """sqrt(abs(x) + 1) chains in a runtime like numpy."""
        x = rand((16,), np.float32, 4)
        check(lambda: ops.sqrt(ops.abs(x) + 1), np.sqrt(np.abs(x) + 1))

    @pytest.mark.parametrize("name", ["sqrt", "abs", "sin", "cos"])
    def test_string_dtype_refused_at_the_call(self, name: str) -> None:
        """A string array is refused at the call, naming the op."""
        with pytest.raises(OpTypeError, match=rf"{name}: argument 1 has dtype <U1"):
            getattr(ops, name)(np.array(["a"]))

    def test_cost_rules(self) -> None:
        """sin/cos cost more flops than sqrt, which costs more than abs; bytes are in + out."""
        x = np.ones((10, 10), np.float32)
        assert ops.abs.cost is not None and ops.sin.cost is not None
        assert ops.sqrt.cost is not None
        assert ops.abs.cost(x) == dataflow.Cost(100.0, 800.0)
        assert ops.sin.cost(x).flops > ops.sqrt.cost(x).flops > ops.abs.cost(x).flops


class TestClip:
    @pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int64, np.uint8])
    @pytest.mark.parametrize(
        "bounds", [(-1, 2), (0, None), (None, 1), (-0.5, 0.5), (3, 1)], ids=str
    )
    def test_scalar_bounds_match_numpy(self, bounds: Any, dtype: Any) -> None:
        """Python bounds (either may be None; lo > hi gives hi) follow np.clip's dtype rules."""
        x = _data((4, 5), dtype, 5)
        check(lambda: ops.clip(x, *bounds), np.clip(x, *bounds))

    def test_array_bounds_broadcast(self) -> None:
        """Array and Tensor bounds broadcast with x, the output may be larger than x."""
        x = rand((4, 1), np.float32, 6)
        lo = rand((3,), np.float32, 7) - np.float32(1)
        hi = rand((1, 3), np.float64, 8) + 1
        check(lambda: ops.clip(x, lo, hi), np.clip(x, lo, hi))
        check(lambda: ops.clip(x, ops.asarray(lo), None), np.clip(x, lo, None))

    def test_no_bounds_is_a_copy(self) -> None:
        """clip(x) with no bounds is x (numpy >= 2.1 gives np.positive(x))."""
        x = rand((3,), np.int16, 9)
        check(lambda: ops.clip(x), np.positive(x))

    @pytest.mark.parametrize(("lo", "hi"), [(-1000, 5), (-5, 1000), (-1000, 1000)])
    def test_int_bounds_beyond_the_dtype_are_dropped(self, lo: int, hi: int) -> None:
        """clip(int8, -1000, 5) clips only at 5, like numpy (NEP 50)."""
        x = np.array([-128, -6, 0, 6, 127], np.int8)
        check(lambda: ops.clip(x, lo, hi), np.clip(x, lo, hi))

    @pytest.mark.parametrize(("lo", "hi"), [(1000, None), (None, -1000), (0, -1000)])
    def test_int_bound_that_cannot_be_represented_is_refused(self, lo: Any, hi: Any) -> None:
        """clip(int8, 1000, None) raises at the call (numpy raises OverflowError)."""
        x = np.arange(4, dtype=np.int8)
        with pytest.raises(OverflowError):
            np.clip(x, lo, hi)
        with pytest.raises(OpInputError, match=r"clip: Python integer -?1000 \(a_m..\) is out"):
            ops.clip(x, lo, hi)

    def test_nan_in_x_or_bounds_propagates(self) -> None:
        """NaN in x stays NaN; a NaN bound gives NaN, as numpy and torch do."""
        x = np.array([np.nan, -2.0, 0.5, 3.0])
        check(lambda: ops.clip(x, -1.0, 1.0), np.clip(x, -1.0, 1.0))
        check(lambda: ops.clip(x, np.nan, 1.0), np.clip(x, np.nan, 1.0))

    def test_python_scalar_x(self) -> None:
        """clip(2.5, 0, 1) is numpy's float64 scalar 1.0."""
        check(lambda: ops.clip(2.5, 0, 1), np.clip(2.5, 0, 1))

    def test_bool_without_bounds_refused(self) -> None:
        """clip(bool) with no bound has no numpy loop: refused at the call."""
        with pytest.raises(OpTypeError, match=r"clip: not supported for dtype bool"):
            ops.clip(np.array([True]))

    def test_bounds_that_do_not_broadcast(self) -> None:
        """Bounds of another shape are refused, naming all three shapes."""
        with pytest.raises(OpInputError, match=r"clip: shapes \(3, 4\), \(2,\) and \(\) cannot"):
            ops.clip(np.ones((3, 4)), np.zeros(2), 1.0)

    def test_bad_bound_type(self) -> None:
        """A bound that is not an array is refused, naming it."""
        with pytest.raises(OpTypeError, match=r"clip: a_max has type dict"):
            ops.clip(np.ones(3), 0, {})

    def test_cost(self) -> None:
        """Two comparisons per output element; bytes are inputs plus output."""
        assert ops.clip.cost is not None
        x = np.ones((10,), np.float64)
        assert ops.clip.cost(x, 0.0, np.ones(10)) == dataflow.Cost(20.0, 240.0)


class TestHypothesis:
    @settings(max_examples=60, deadline=None)
    @given(
        x=hnp.arrays(
            st.sampled_from([np.int8, np.int32, np.float32, np.float64]),
            hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
        ),
        lo=st.one_of(st.none(), st.integers(-300, 300), st.floats(-5, 5)),
        hi=st.one_of(st.none(), st.integers(-300, 300), st.floats(-5, 5)),
    )
    def test_clip_agrees_with_numpy_on_success_or_failure(self, x: Any, lo: Any, hi: Any) -> None:
        """For any bounds, ops.clip gives numpy's result, or refuses where numpy raises."""
        try:
            with np.errstate(all="ignore"):
                expected = np.clip(x, lo, hi) if (lo, hi) != (None, None) else np.positive(x)
        except (OverflowError, TypeError):
            with pytest.raises((OpInputError, OpTypeError)):
                ops.clip(x, lo, hi)
            return
        assert_like(ops.clip(x, lo, hi).result(), expected)


class TestTorch:
    @pytest.mark.parametrize("name", ["sqrt", "abs", "sin", "cos", "log"])
    def test_unary_match_torch(self, name: str) -> None:
        """sqrt, abs, sin, cos and log agree with torch on float32 (NaN where torch has NaN)."""
        torch = pytest.importorskip("torch")
        x = rand((8, 16), np.float32, 21) * np.float32(3)
        expected = getattr(torch, name)(torch.from_numpy(x)).numpy()
        for got in both(lambda: getattr(ops, name)(x)):
            np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6, equal_nan=True)

    def test_clip_matches_clamp(self) -> None:
        """clip equals torch.clamp, with scalar and tensor bounds and NaN inputs."""
        torch = pytest.importorskip("torch")
        x = rand((6, 7), np.float32, 22) * np.float32(2)
        x[0, 0] = np.nan
        lo, hi = rand((7,), np.float32, 23) - 1, rand((7,), np.float32, 24) + 1
        tx = torch.from_numpy(x)
        tlo, thi = torch.from_numpy(lo), torch.from_numpy(hi)
        pairs = [
            (lambda: ops.clip(x, -0.5, 0.5), torch.clamp(tx, -0.5, 0.5)),
            (lambda: ops.clip(x, None, 0.0), torch.clamp(tx, max=0.0)),
            (lambda: ops.clip(x, lo, hi), torch.clamp(tx, tlo, thi)),
        ]
        for build, expected in pairs:
            for got in both(build):
                assert_like(got, expected.numpy())

    def test_maximum_minimum_where_match_torch(self) -> None:
        """maximum/minimum propagate NaN like torch; where selects like torch.where."""
        torch = pytest.importorskip("torch")
        x, y = rand((5, 6), np.float64, 25), rand((5, 6), np.float64, 26)
        x[1, 2] = np.nan
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        pairs = [
            (lambda: ops.maximum(x, y), torch.maximum(tx, ty)),
            (lambda: ops.minimum(x, y), torch.minimum(tx, ty)),
            (lambda: ops.where(x > y, x, y), torch.where(tx > ty, tx, ty)),
        ]
        for build, expected in pairs:
            for got in both(build):
                assert_like(got, expected.numpy())
