"""ops elementwise: arithmetic, activations, comparisons and where, against numpy (and torch)."""

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

# -- the ops -----------------------------------------------------------------------------------

BINARY: list[tuple[Any, Any]] = [
    (ops.add, np.add),
    (ops.subtract, np.subtract),
    (ops.multiply, np.multiply),
    (ops.divide, np.divide),
    (ops.maximum, np.maximum),
    (ops.minimum, np.minimum),
]
COMPARE: list[tuple[Any, Any]] = [
    (ops.greater, np.greater),
    (ops.less, np.less),
    (ops.equal, np.equal),
    (ops.not_equal, np.not_equal),
    (ops.greater_equal, np.greater_equal),
    (ops.less_equal, np.less_equal),
]
SHAPES = [
    ((3, 4), (3, 4)),
    ((3, 4), (4,)),
    ((2, 1, 4), (3, 1)),
    ((5,), ()),
    ((), (2, 3)),
    ((0, 4), (4,)),
    ((3, 0), (1, 0)),
]
DTYPES = [np.float32, np.float64, np.int32]


def _ids(pairs: list[tuple[Any, Any]]) -> list[str]:
    return [op.name for op, _ in pairs]


class TestBinary:
    @pytest.mark.parametrize("shapes", SHAPES, ids=str)
    @pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
    @pytest.mark.parametrize(("op", "ref"), BINARY, ids=_ids(BINARY))
    def test_matches_numpy(self, op: Any, ref: Any, dtype: Any, shapes: Any) -> None:
        """Each arithmetic op equals numpy's ufunc, broadcasting and zero-size included."""
        x, y = rand(shapes[0], dtype, 1), rand(shapes[1], dtype, 2)
        if op is ops.divide:
            y = np.where(y == 0, 3, y).astype(dtype)
        check(lambda: op(x, y), ref(x, y))

    @pytest.mark.parametrize("shapes", SHAPES[:4], ids=str)
    @pytest.mark.parametrize(("op", "ref"), COMPARE, ids=_ids(COMPARE))
    def test_comparisons_match_numpy(self, op: Any, ref: Any, shapes: Any) -> None:
        """Comparisons give numpy's bool arrays."""
        x = rand(shapes[0], np.int64, 3)
        y = rand(shapes[1], np.int64, 4)
        check(lambda: op(x, y), ref(x, y))

    @pytest.mark.parametrize(("op", "ref"), BINARY + COMPARE, ids=_ids(BINARY + COMPARE))
    def test_mixed_dtypes_promote_like_numpy(self, op: Any, ref: Any) -> None:
        """float32 with int16, float64 and uint8 gives numpy's result dtype."""
        x = rand((4,), np.float32, 5)
        for other in (np.int16, np.float64, np.uint8):
            y = np.abs(rand((4,), other, 6)) + other(1)

            def build(y: np.ndarray = y) -> Any:
                return op(x, y)

            check(build, ref(x, y))

    @pytest.mark.parametrize(("op", "ref"), BINARY, ids=_ids(BINARY))
    def test_python_scalars_on_either_side(self, op: Any, ref: Any) -> None:
        """Python scalars are weak (NEP 50): float32 stays float32, int8 stays int8."""
        x = rand((3, 2), np.float32, 7)
        check(lambda: op(x, 2.5), ref(x, 2.5))
        check(lambda: op(-1.5, x), ref(-1.5, x))
        i = rand((5,), np.int8, 8)
        if op is not ops.divide:
            check(lambda: op(i, 3), ref(i, 3))
        check(lambda: op(np.float64(2.0), x), ref(np.float64(2.0), x))

    def test_integer_division_is_float64(self) -> None:
        """int / int is float64, like numpy's true division."""
        a, b = rand((6,), np.int32, 1), rand((6,), np.int32, 2) + 20
        check(lambda: ops.divide(a, b), np.divide(a, b))

    def test_lists_are_operands(self) -> None:
        """A nested list is converted like np.asarray would."""
        x = rand((2, 3), np.float64, 9)
        check(lambda: ops.multiply([[1.0, 2.0, 3.0]], x), np.multiply([[1.0, 2.0, 3.0]], x))

    def test_complex_operands(self) -> None:
        """Complex arrays work where numpy allows them."""
        z = rand((4,), np.float64, 1) + 1j * rand((4,), np.float64, 2)
        check(lambda: ops.multiply(z, 2j), np.multiply(z, 2j))


class TestUnary:
    @pytest.mark.parametrize("shape", [(3, 4), (), (0, 5), (2, 3, 4)], ids=str)
    @pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
    @pytest.mark.parametrize(
        ("op", "ref"),
        [(ops.negative, np.negative), (ops.exp, np.exp), (ops.tanh, np.tanh)],
        ids=["negative", "exp", "tanh"],
    )
    def test_matches_numpy(self, op: Any, ref: Any, dtype: Any, shape: Any) -> None:
        """negative, exp and tanh equal numpy's ufuncs."""
        x = rand(shape, dtype, 11)
        check(lambda: op(x), ref(x))

    @pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
    def test_log_matches_numpy(self, dtype: Any) -> None:
        """log of positive random data equals np.log."""
        x = np.abs(rand((4, 5), dtype, 12)) + np.asarray(0.1, dtype)
        check(lambda: ops.log(x), np.log(x))

    @pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int64, np.bool_])
    def test_integer_inputs_give_numpys_float(self, dtype: Any) -> None:
        """exp of int8 is float16, of int16 float32, of int64 float64, as numpy picks."""
        x = rand((6,), dtype, 13)
        check(lambda: ops.exp(x), np.exp(x))
        check(lambda: ops.sigmoid(x), (1 / (1 + np.exp(-x.astype(np.exp(x).dtype)))))

    @pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
    def test_sigmoid_matches_formula(self, dtype: Any) -> None:
        """sigmoid(x) = 1 / (1 + exp(-x)) in the input's float dtype."""
        x = rand((5, 7), dtype, 14) * np.asarray(4, dtype)
        check(lambda: ops.sigmoid(x), (1 / (1 + np.exp(-x))).astype(dtype))

    @pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
    def test_relu_matches_maximum(self, dtype: Any) -> None:
        """relu(x) = max(x, 0), dtype kept."""
        x = rand((4, 6), dtype, 15)
        check(lambda: ops.relu(x), np.maximum(x, 0).astype(dtype))

    def test_unary_on_python_scalar(self) -> None:
        """A Python scalar input gives numpy's 0-d float64 result."""
        check(lambda: ops.exp(1.5), np.exp(np.float64(1.5)))
        check(lambda: ops.negative(3), np.negative(np.int64(3)))


class TestWhere:
    @pytest.mark.parametrize(
        "shapes", [((3, 4), (3, 4), (3, 4)), ((3, 1), (4,), ()), ((0, 2), (2,), (0, 1))], ids=str
    )
    def test_matches_numpy(self, shapes: Any) -> None:
        """where broadcasts condition, x and y together."""
        c = rand(shapes[0], np.bool_, 1)
        x, y = rand(shapes[1], np.float32, 2), rand(shapes[2], np.float32, 3)
        check(lambda: ops.where(c, x, y), np.where(c, x, y))

    def test_scalar_branch_keeps_float32(self) -> None:
        """A Python float branch does not widen float32 (NEP 50)."""
        c = rand((5,), np.bool_, 4)
        x = rand((5,), np.float32, 5)
        check(lambda: ops.where(c, x, 0.0), np.where(c, x, 0.0))

    def test_numeric_condition_uses_truthiness(self) -> None:
        """A non-bool condition selects where it is non-zero, like numpy."""
        c = rand((6,), np.int32, 6)
        x, y = rand((6,), np.float64, 7), rand((6,), np.float64, 8)
        check(lambda: ops.where(c, x, y), np.where(c, x, y))

    def test_condition_from_a_comparison(self) -> None:
        """A comparison Tensor feeds where (a pending condition in a runtime)."""
        x = rand((3, 3), np.float64, 9)
        check(lambda: ops.where(ops.greater(x, 0), x, 0.0), np.where(x > 0, x, 0.0))


class TestSpecialValues:
    def test_inf_minus_inf_is_nan_without_failing(self) -> None:
        """inf - inf gives NaN (numpy's value) and no task failure, even with warnings as errors."""
        x = np.array([np.inf, 1.0, np.nan], np.float32)
        expected = np.array([np.nan, -np.inf, np.nan], np.float32)
        check(lambda: ops.subtract(x, np.float32(np.inf)), expected)

    def test_exp_overflow_is_inf(self) -> None:
        """exp of a large value is inf, as in numpy."""
        x = np.array([1000.0, -1000.0, 0.0])
        check(lambda: ops.exp(x), np.array([np.inf, 0.0, 1.0]))

    def test_log_of_zero_and_negative(self) -> None:
        """log(0) is -inf, log(-1) is NaN."""
        x = np.array([0.0, -1.0, 1.0], np.float32)
        check(lambda: ops.log(x), np.array([-np.inf, np.nan, 0.0], np.float32))

    def test_divide_by_zero(self) -> None:
        """1/0 = inf, 0/0 = NaN."""
        x = np.array([1.0, 0.0, -2.0])
        check(lambda: ops.divide(x, 0.0), np.array([np.inf, np.nan, -np.inf]))

    def test_sigmoid_saturates(self) -> None:
        """sigmoid of +-1000 is 1 and 0 without overflow trouble; NaN stays NaN."""
        x = np.array([-1000.0, 1000.0, np.nan], np.float32)
        check(lambda: ops.sigmoid(x), np.array([0.0, 1.0, np.nan], np.float32))

    def test_nan_propagates_through_maximum_and_relu(self) -> None:
        """maximum and relu keep NaN, like np.maximum."""
        x = np.array([np.nan, -1.0, 2.0])
        check(lambda: ops.maximum(x, 0.5), np.maximum(x, 0.5))
        check(lambda: ops.relu(x), np.array([np.nan, 0.0, 2.0]))

    def test_where_of_a_python_int_past_float16_is_inf(self) -> None:
        """where(c, 2**40, float16) is numpy's inf, not a task failed by numpy's cast warning
        under warnings-as-errors (the kernel ran np.where bare)."""
        c = np.array([True, False])
        y = np.ones(2, np.float16)
        check(lambda: ops.where(c, 2**40, y), np.array([np.inf, 1.0], np.float16))

    def test_float_overflow_in_multiply(self) -> None:
        """float32 overflow in multiply gives inf, not an error."""
        x = np.array([3e38], np.float32)
        check(lambda: ops.multiply(x, x), np.array([np.inf], np.float32))


class TestErrors:
    def test_broadcast_error_names_op_and_shapes(self) -> None:
        """Incompatible shapes raise OpInputError naming the op and both shapes."""
        expected = (
            r"^add: shapes \(3, 4\) and \(5,\) cannot be broadcast together \(each trailing "
            r"dimension must be equal or 1\): reshape or transpose an operand$"
        )
        with pytest.raises(OpInputError, match=expected):
            ops.add(np.ones((3, 4)), np.ones(5))

    def test_broadcast_error_is_a_value_error(self) -> None:
        """OpInputError is a ValueError, so numpy-style handlers still work."""
        with pytest.raises(ValueError, match="multiply: shapes"):
            ops.multiply(np.ones((2, 3)), np.ones((4, 3)))

    def test_where_error_lists_three_shapes(self) -> None:
        """where's broadcast error lists the three shapes."""
        with pytest.raises(OpInputError, match=r"where: shapes \(2,\), \(3,\) and \(\) cannot"):
            ops.where(np.ones(2, bool), np.ones(3), 0.0)

    @pytest.mark.parametrize("bad", [{}, None, "abc", object()], ids=["dict", "None", "str", "obj"])
    def test_non_array_argument(self, bad: Any) -> None:
        """A non-array raises OpTypeError naming op, position, type and what is accepted."""
        name = type(bad).__name__
        with pytest.raises(OpTypeError, match=rf"^add: argument 2 has type {name}, .*numpy array"):
            ops.add(np.ones(3), bad)

    def test_object_array(self) -> None:
        """An object array is refused with its dtype named."""
        with pytest.raises(OpTypeError, match=r"exp: argument 1 has dtype object"):
            ops.exp(np.array([1, None]))

    def test_string_array(self) -> None:
        """A string array is refused with its dtype named."""
        with pytest.raises(OpTypeError, match=r"subtract: argument 1 has dtype <U1 .*numeric"):
            ops.subtract(np.array(["a"]), 1)

    def test_bool_subtract_refused(self) -> None:
        """bool - bool is refused at the call, with numpy's advice."""
        with pytest.raises(OpTypeError, match=r"subtract: not supported for dtypes bool and bool"):
            ops.subtract(np.ones(2, bool), np.zeros(2, bool))

    def test_bool_negative_refused(self) -> None:
        """-bool is refused at the call."""
        with pytest.raises(OpTypeError, match=r"negative: not supported for dtype bool"):
            ops.negative(np.ones(2, bool))

    def test_relu_of_complex_refused(self) -> None:
        """relu needs a real dtype."""
        with pytest.raises(OpTypeError, match=r"relu: argument 1 has dtype complex128"):
            ops.relu(np.ones(2, complex))

    @pytest.mark.parametrize(
        "call",
        [
            lambda m: m.add(np.ones(2, np.int8), 1000),
            lambda m: m.minimum(2**40, np.ones(2, np.int32)),
            lambda m: m.clip(np.ones(2, np.int8), 1000, None),
        ],
        ids=["add", "minimum", "clip"],
    )
    def test_python_int_out_of_range_is_an_overflow_error_like_numpy(self, call: Any) -> None:
        """numpy raises OverflowError; the op raises an OpOverflowError (still an
        OpInputError) at the call: it was an OpInputError alone, a ValueError."""
        with pytest.raises(OverflowError):
            call(np)
        with pytest.raises(dataflow.OpOverflowError) as info:
            call(ops)
        assert isinstance(info.value, OpInputError)

    def test_python_int_out_of_range(self) -> None:
        """int8 + 1000 is refused (numpy raises OverflowError in the kernel)."""
        with pytest.raises(
            OpInputError, match=r"add: Python integer 1000 .* out of bounds for int8"
        ):
            ops.add(np.ones(2, np.int8), 1000)

    @pytest.mark.parametrize(
        ("dtype", "value", "fix"),
        [
            (np.int8, 1000, r"dtype=np.int64\)"),
            (np.uint8, -1, r"dtype=np.int64\)"),
            (np.int64, 2**63, r"no integer dtype holds both: use a float dtype"),
            (np.uint64, -1, r"no integer dtype holds both"),
        ],
    )
    def test_the_fix_for_an_int_out_of_range_is_one_that_works(
        self, dtype: Any, value: int, fix: str
    ) -> None:
        """The hint names a dtype that holds the array's values and the scalar, or says there
        is none (an int64 array is not told to become int64)."""
        with pytest.raises(OpInputError, match=fix):
            ops.add(np.ones(2, dtype), value)

    @pytest.mark.parametrize(
        ("name", "call"),
        [
            ("negative", lambda v: ops.negative(v)),
            ("exp", lambda v: ops.exp(v)),
            ("sigmoid", lambda v: ops.sigmoid(v)),
            ("relu", lambda v: ops.relu(v)),
            ("clip", lambda v: ops.clip(v, 0, 1)),
            ("sum", lambda v: ops.sum(v)),
            ("max", lambda v: ops.max(v)),
            ("reshape", lambda v: ops.reshape(v, (1,))),
            ("flip", lambda v: ops.flip(v)),
            ("stack", lambda v: ops.stack([np.array(1), v])),
        ],
        ids=lambda v: v if isinstance(v, str) else "",
    )
    @pytest.mark.parametrize("value", [2**63, 2**70, -(2**63) - 1], ids=str)
    def test_lone_python_int_past_int64_refused_at_the_call(
        self, name: str, call: Any, value: int
    ) -> None:
        """A Python int with no array operand is int64 to the meta rule: one past int64 is
        refused at the call (numpy made it uint64, or an object array: an OpOutputError, or
        the kernel failing, at await)."""
        with pytest.raises(OpInputError, match=rf"^{name}: Python integer {value} .*int64"):
            call(value)

    def test_lone_python_int_within_int64_works(self) -> None:
        """The largest int64 is still an int64 operand."""
        check(lambda: ops.negative(2**63 - 1), np.negative(2**63 - 1))
        check(lambda: ops.sum(-(2**63)), np.sum(-(2**63)))

    def test_where_python_int_past_uint64_refused_at_the_call(self) -> None:
        """where into an integer result converts a Python int as numpy does up to uint64;
        past it numpy raised OverflowError in the kernel, now the call does."""
        cond = np.array([True, False])
        check(lambda: ops.where(cond, np.ones(2, np.uint64), 2**63), np.array([1, 2**63], "u8"))
        with pytest.raises(OpInputError, match=r"where: Python integer \d+ \(argument 3\)"):
            ops.where(cond, np.ones(2, np.uint8), 2**70)
        check(lambda: ops.where(cond, 2**70, np.ones(2, np.float32)), np.array([2.0**70, 1], "f4"))

    def test_ragged_list(self) -> None:
        """A ragged nested list is an OpInputError."""
        with pytest.raises(OpInputError, match=r"add: argument 1 is a list that does not form"):
            ops.add([[1.0], [1.0, 2.0]], 1.0)

    def test_output_larger_than_memory(self) -> None:
        """A broadcast whose output exceeds physical memory is refused with its size in GiB."""
        with pytest.raises(
            OpInputError, match=r"add: the output of shape \(1000000, 1000000\) and dtype float64 "
            r"would take 7450\.6 GiB"
        ):  # fmt: skip
            ops.add(np.ones((1_000_000, 1)), np.ones((1, 1_000_000)))

    def test_errors_raise_at_the_call_in_a_runtime(self) -> None:
        """Inside a runtime the meta rule raises at the call, before any task exists."""

        async def main() -> str:
            with pytest.raises(OpInputError, match="add: shapes"):
                ops.add(np.ones(2), np.ones(3))
            return "ok"

        assert dataflow.run(main, interop_threads=2) == "ok"


class TestCost:
    def test_elementwise_cost(self) -> None:
        """flops = output size, bytes = inputs + output."""
        x, y = np.ones((10, 20), np.float32), np.ones((20,), np.float32)
        assert ops.add.cost is not None
        cost = ops.add.cost(x, y)
        assert cost == dataflow.Cost(200.0, 800.0 + 80.0 + 800.0)

    def test_transcendental_cost_is_higher(self) -> None:
        """exp, tanh and sigmoid cost a few flops per element."""
        x = np.ones(100)
        for op in (ops.exp, ops.tanh, ops.sigmoid):
            assert op.cost is not None and op.cost(x).flops > 100

    def test_comparison_output_is_one_byte(self) -> None:
        """A comparison writes one byte per element."""
        x = np.ones(8)
        assert ops.less.cost is not None
        assert ops.less.cost(x, x).bytes == 64 + 64 + 8


class TestHypothesis:
    @settings(max_examples=60, deadline=None)
    @given(
        shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4),
        dtype=st.sampled_from([np.float32, np.float64, np.int16]),
    )
    def test_add_and_maximum_broadcast_like_numpy(self, shapes: Any, dtype: Any) -> None:
        """For any broadcastable pair of shapes, add and maximum equal numpy (eagerly)."""
        x, y = rand(shapes.input_shapes[0], dtype, 1), rand(shapes.input_shapes[1], dtype, 2)
        for op, ref in ((ops.add, np.add), (ops.maximum, np.maximum)):
            t = op(x, y)
            assert t.shape == shapes.result_shape
            assert_like(t.result(), ref(x, y))

    @settings(max_examples=40, deadline=None)
    @given(a=hnp.array_shapes(min_dims=1, max_dims=3), b=hnp.array_shapes(min_dims=1, max_dims=3))
    def test_meta_agrees_with_numpy_on_success_or_failure(
        self, a: tuple[int, ...], b: tuple[int, ...]
    ) -> None:
        """The meta rule accepts exactly the shape pairs numpy can broadcast."""
        try:
            expected: tuple[int, ...] | None = np.broadcast_shapes(a, b)
        except ValueError:
            expected = None
        if expected is None:
            with pytest.raises(OpInputError, match="cannot be broadcast together"):
                ops.multiply(np.ones(a), np.ones(b))
        else:
            assert ops.multiply(np.ones(a), np.ones(b)).shape == expected

    @settings(max_examples=10, deadline=None)
    @given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3))
    def test_where_in_a_runtime(self, shapes: Any) -> None:
        """where over three broadcast shapes matches numpy in a runtime too."""
        c = rand(shapes.input_shapes[0], np.bool_, 1)
        x = rand(shapes.input_shapes[1], np.float64, 2)
        y = rand(shapes.input_shapes[2], np.float64, 3)
        check(lambda: ops.where(c, x, y), np.where(c, x, y))


class TestTorch:
    @pytest.mark.parametrize("name", ["sigmoid", "tanh", "relu", "exp"])
    def test_activations_match_torch(self, name: str) -> None:
        """sigmoid, tanh, relu and exp agree with torch on float32."""
        torch = pytest.importorskip("torch")
        x = rand((8, 16), np.float32, 21) * np.float32(3)
        expected = getattr(torch, name)(torch.from_numpy(x)).numpy()
        for got in both(lambda: getattr(ops, name)(x)):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)

    def test_broadcast_add_matches_torch(self) -> None:
        """Broadcast arithmetic agrees with torch."""
        torch = pytest.importorskip("torch")
        x, y = rand((4, 1, 3), np.float32, 22), rand((5, 1), np.float32, 23)
        expected = (torch.from_numpy(x) * torch.from_numpy(y) - 1.5).numpy()
        for got in both(lambda: ops.subtract(ops.multiply(x, y), 1.5)):
            assert_like(got, expected)


class TestPower:
    """power (``**``) and square, against numpy and torch."""

    @pytest.mark.parametrize("shapes", SHAPES, ids=str)
    @pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
    def test_matches_numpy(self, dtype: Any, shapes: Any) -> None:
        """Positive bases to random real exponents, broadcasting and zero-size included."""
        x = np.abs(rand(shapes[0], dtype, 1)) + dtype(0.1)
        y = rand(shapes[1], dtype, 2)
        check(lambda: ops.power(x, y), np.power(x, y))

    def test_scalars_operators_and_ufuncs(self) -> None:
        """``t ** 2``, ``2.0 ** t``, ``np.power(t, 3)`` and ``np.square(t)`` are the ops,
        dtype kept (NEP 50: a Python scalar is weak)."""
        x = rand((3, 5), np.float32, 3)
        t = ops.asarray(x)
        check(lambda: t**2, x**2)
        check(lambda: 2.0**t, 2.0**x)
        check(lambda: np.power(t, 3), np.power(x, 3))
        check(lambda: np.square(t), np.square(x))
        check(lambda: ops.square(x), np.square(x))
        i = rand((6,), np.int8, 4)
        check(lambda: ops.power(i, 2), np.power(i, 2))
        check(lambda: ops.square(i), np.square(i))

    @pytest.mark.parametrize(("xshape", "y"), [((0,), -3), ((2, 0), -1), ((1,), np.full(0, -3))])
    def test_an_empty_integer_power_of_a_negative_int_is_empty(self, xshape: Any, y: Any) -> None:
        """numpy refuses integers to negative powers in its loop, which an empty output never
        runs: an empty array, as numpy gives (it was refused at the call)."""
        x = np.ones(xshape, np.int64)
        check(lambda: ops.power(x, y), np.power(x, y))

    def test_integers_to_a_negative_python_int_are_refused_at_the_call(self) -> None:
        """numpy raises ValueError in the kernel; a Python int exponent is known at the call."""
        i = ops.asarray(np.arange(1, 5))
        with pytest.raises(OpInputError, match=r"power: integers to negative integer powers"):
            i**-1
        with pytest.raises(OpInputError, match="exponent -2"):
            ops.power(np.arange(3, dtype=np.int16), -2)

        async def main() -> Any:
            ok = await ops.power(np.arange(1.0, 4.0), -1)  # a float base may
            return ok, await ops.power(np.arange(3), np.array([1, -1, 2]))

        with pytest.raises(dataflow.TaskError, match="negative integer powers"):
            dataflow.run(main)  # an array's entries are data: the kernel fails, as numpy

    def test_special_values_like_numpy(self) -> None:
        x = np.array([0.0, -0.0, -2.0, np.inf, np.nan, 1.0], dtype=np.float64)
        y = np.array([-1.0, 0.5, 0.5, -np.inf, 0.0, np.nan], dtype=np.float64)
        with np.errstate(all="ignore"):
            want = np.power(x, y)
        check(lambda: ops.power(x, y), want)

    def test_matches_torch(self) -> None:
        torch = pytest.importorskip("torch")
        x = np.abs(rand((4, 6), np.float32, 5)) + np.float32(0.5)
        y = rand((6,), np.float32, 6)
        expected = torch.pow(torch.from_numpy(x), torch.from_numpy(y)).numpy()
        for got in both(lambda: ops.power(x, y)):
            np.testing.assert_allclose(got, expected, rtol=1e-6)
        expected = torch.square(torch.from_numpy(x)).numpy()
        for got in both(lambda: ops.square(x)):
            np.testing.assert_allclose(got, expected, rtol=1e-6)
