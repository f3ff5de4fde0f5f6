"""ops linear algebra: matmul (batched, 1-D, zero-size) and linear, against numpy and torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis.extra import numpy as hnp

import dataflow
import ops
from dataflow import OpInputError, OpTypeError
from tests._ops_helpers import assert_like, both, check, rand

# -- matmul ------------------------------------------------------------------------------------

MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 3, 4), (4, 5)),
    ((3, 4), (2, 4, 5)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((0, 4), (4, 5)),
    ((3, 0), (0, 5)),
    ((2, 0, 3), (3, 1)),
]


class TestMatmul:
    @pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
    @pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64], ids=str)
    def test_matches_numpy(self, dtype: Any, shapes: Any) -> None:
        """matmul equals np.matmul for 1-D, 2-D, batched, broadcast and zero-size shapes."""
        a, b = rand(shapes[0], dtype, 1), rand(shapes[1], dtype, 2)
        check(lambda: ops.matmul(a, b), np.matmul(a, b))

    def test_mixed_dtypes_promote(self) -> None:
        """float32 @ float64 is float64, int32 @ float32 is float64, like numpy."""
        a32, a64 = rand((3, 4), np.float32, 3), rand((4, 2), np.float64, 4)
        check(lambda: ops.matmul(a32, a64), np.matmul(a32, a64))
        i = rand((3, 4), np.int32, 5)
        check(lambda: ops.matmul(i, a32.T), np.matmul(i, a32.T))

    def test_bool_matmul(self) -> None:
        """bool @ bool is bool (numpy's logical matrix product)."""
        a, b = rand((3, 4), np.bool_, 6), rand((4, 2), np.bool_, 7)
        check(lambda: ops.matmul(a, b), np.matmul(a, b))

    def test_chained_with_pending_inputs(self) -> None:
        """A matmul of two pending results (in a runtime) matches numpy."""
        a, b = rand((5, 6), np.float64, 8), rand((6, 3), np.float64, 9)
        check(
            lambda: ops.matmul(ops.tanh(a), ops.exp(b)),
            np.matmul(np.tanh(a), np.exp(b)),
        )

    def test_list_operand(self) -> None:
        """A nested list is an operand."""
        a = rand((2, 2), np.float64, 10)
        check(lambda: ops.matmul([[1.0, 2.0]], a), np.matmul([[1.0, 2.0]], a))


class TestMatmulErrors:
    def test_not_aligned_message(self) -> None:
        """Inner dimensions that differ give numpy's 'not aligned' message, then the fix."""
        expected = r"^matmul: shapes \(50, 1024\) and \(512, 4096\) are not aligned: 1024 != 512 "
        with pytest.raises(OpInputError, match=expected):
            ops.matmul(np.ones((50, 1024), np.float32), np.ones((512, 4096), np.float32))

    def test_not_aligned_vectors(self) -> None:
        """Two vectors of different length are not aligned."""
        with pytest.raises(OpInputError, match=r"shapes \(3,\) and \(4,\) are not aligned: 3 != 4"):
            ops.matmul(np.ones(3), np.ones(4))

    def test_zero_d_refused(self) -> None:
        """A 0-d operand is refused, pointing at multiply."""
        with pytest.raises(OpInputError, match=r"matmul: the second operand .* is 0-d.*multiply"):
            ops.matmul(np.ones(3), 2.0)

    def test_batch_mismatch(self) -> None:
        """Batch dimensions that do not broadcast are named."""
        expected = r"matmul: the batch dimensions \(2,\) and \(3,\) .* cannot be broadcast"
        with pytest.raises(OpInputError, match=expected):
            ops.matmul(np.ones((2, 3, 4)), np.ones((3, 4, 5)))

    def test_string_dtype(self) -> None:
        """A string array is an OpTypeError naming the argument."""
        with pytest.raises(OpTypeError, match=r"matmul: argument 2 has dtype <U1"):
            ops.matmul(np.ones((2, 2)), np.array([["a", "b"], ["c", "d"]]))

    def test_huge_batched_output(self) -> None:
        """A broadcast batch whose output exceeds physical memory is refused."""
        big = np.broadcast_to(np.ones(()), (1, 100_000, 1, 100_000))  # no memory behind it
        with pytest.raises(OpInputError, match=r"matmul: the output of shape .* GiB"):
            ops.matmul(np.ones((100_000, 1, 1, 1)), big)

    def test_operator_error_is_the_same(self) -> None:
        """t @ x raises the same error at the operator."""
        t = ops.asarray(np.ones((2, 3)))
        with pytest.raises(OpInputError, match=r"shapes \(2, 3\) and \(2, 3\) are not aligned"):
            t @ np.ones((2, 3))


class TestLinear:
    @pytest.mark.parametrize("xshape", [(4,), (3, 4), (2, 3, 4), (0, 4)], ids=str)
    @pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=str)
    def test_with_and_without_bias(self, dtype: Any, xshape: Any) -> None:
        """linear(x, w, b) = x @ w.T + b for any number of leading axes."""
        x, w, b = rand(xshape, dtype, 1), rand((5, 4), dtype, 2), rand((5,), dtype, 3)
        check(lambda: ops.linear(x, w), np.matmul(x, w.T))
        check(lambda: ops.linear(x, w, b), np.matmul(x, w.T) + b)

    def test_bias_of_wider_dtype(self) -> None:
        """A float64 bias on float32 data gives float64, like x @ w.T + b in numpy."""
        x, w = rand((3, 4), np.float32, 4), rand((2, 4), np.float32, 5)
        b = rand((2,), np.float64, 6)
        check(lambda: ops.linear(x, w, b), np.matmul(x, w.T) + b)

    def test_scalar_and_list_bias(self) -> None:
        """A Python float or a list bias broadcasts like numpy."""
        x, w = rand((3, 4), np.float32, 7), rand((2, 4), np.float32, 8)
        check(lambda: ops.linear(x, w, 0.5), np.matmul(x, w.T) + 0.5)
        check(lambda: ops.linear(x, w, [1.0, 2.0]), np.add(np.matmul(x, w.T), [1.0, 2.0]))

    def test_a_python_int_bias_must_fit_an_integer_product(self) -> None:
        """As ops.add(int8, 1000) does, at the call (numpy would raise later, in the kernel)."""
        x, w = np.ones((1, 2), np.int8), rand((3, 2), np.int8, 9)
        with pytest.raises(OpInputError, match=r"linear: Python integer 1000 \(argument 3\)"):
            ops.linear(x, w, 1000)
        check(lambda: ops.linear(x, w, -7), np.matmul(x, w.T) + np.int8(-7))

    def test_weight_not_2d(self) -> None:
        """A weight that is not 2-D is refused with its shape."""
        with pytest.raises(
            OpInputError, match=r"linear: weight .* must be 2-D .* got shape \(4,\)"
        ):
            ops.linear(np.ones((3, 4)), np.ones(4))

    def test_not_aligned(self) -> None:
        """in_features must match the weight's second axis."""
        expected = r"linear: input shape \(3, 4\) and weight shape \(4, 5\) are not aligned: 4 != 5"
        with pytest.raises(OpInputError, match=expected):
            ops.linear(np.ones((3, 4)), np.ones((4, 5)))

    def test_bad_bias(self) -> None:
        """A bias of the wrong length is refused, naming the expected shape."""
        with pytest.raises(OpInputError, match=r"linear: bias shape \(3,\) .* expected \(5,\)"):
            ops.linear(np.ones((2, 4)), np.ones((5, 4)), np.ones(3))

    def test_bias_may_not_grow_the_output(self) -> None:
        """A bias that would broadcast the output to a bigger shape is refused."""
        with pytest.raises(OpInputError, match=r"linear: bias shape \(7, 5\)"):
            ops.linear(np.ones((2, 4)), np.ones((5, 4)), np.ones((7, 5)))


class TestCost:
    def test_matmul_flops(self) -> None:
        """matmul costs 2*M*N*K flops, times the batch."""
        assert ops.matmul.cost is not None
        a, b = np.ones((50, 1024), np.float32), np.ones((1024, 4096), np.float32)
        cost = ops.matmul.cost(a, b)
        assert cost.flops == 2 * 50 * 1024 * 4096
        assert cost.bytes == (50 * 1024 + 1024 * 4096 + 50 * 4096) * 4
        batched = ops.matmul.cost(np.ones((8, 3, 4)), np.ones((4, 5)))
        assert batched.flops == 2 * 8 * 3 * 4 * 5

    def test_vector_flops(self) -> None:
        """A dot product of two k-vectors costs 2k flops."""
        assert ops.matmul.cost is not None
        assert ops.matmul.cost(np.ones(7), np.ones(7)).flops == 14

    def test_linear_flops(self) -> None:
        """linear costs the matmul plus one add per output element."""
        assert ops.linear.cost is not None
        x, w, b = np.ones((10, 4)), np.ones((3, 4)), np.ones(3)
        assert ops.linear.cost(x, w).flops == 2 * 10 * 3 * 4
        assert ops.linear.cost(x, w, b).flops == 2 * 10 * 3 * 4 + 30

    def test_big_matmul_goes_to_the_pool(self) -> None:
        """A large matmul is not run inline: it is still pending right after the call."""

        async def main() -> bool:
            a = np.ones((400, 400))
            t = ops.matmul(ops.asarray(a), a)
            inline: bool = t.done()
            await t
            return inline

        assert dataflow.run(main, interop_threads=2) is False


class TestHypothesis:
    @settings(max_examples=60, deadline=None)
    @given(
        shapes=hnp.mutually_broadcastable_shapes(signature="(m,n),(n,p)->(m,p)", max_dims=4),
    )
    def test_matmul_shapes_like_numpy(self, shapes: Any) -> None:
        """For any gufunc-compatible shapes, the meta shape and the values equal numpy's."""
        a, b = (
            rand(shapes.input_shapes[0], np.float64, 1),
            rand(shapes.input_shapes[1], np.float64, 2),
        )
        t = ops.matmul(a, b)
        assert t.shape == shapes.result_shape
        assert_like(t.result(), np.matmul(a, b))


class TestTorch:
    def test_linear_matches_torch(self) -> None:
        """linear agrees with torch.nn.functional.linear."""
        torch = pytest.importorskip("torch")
        x, w, b = (
            rand((6, 8), np.float32, 1),
            rand((3, 8), np.float32, 2),
            rand((3,), np.float32, 3),
        )
        expected = torch.nn.functional.linear(
            torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)
        ).numpy()
        for got in both(lambda: ops.linear(x, w, b)):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)

    def test_batched_matmul_matches_torch(self) -> None:
        """Broadcast batched matmul agrees with torch.matmul."""
        torch = pytest.importorskip("torch")
        a, b = rand((2, 1, 3, 4), np.float32, 4), rand((5, 4, 2), np.float32, 5)
        expected = torch.matmul(torch.from_numpy(a), torch.from_numpy(b)).numpy()
        for got in both(lambda: ops.matmul(a, b)):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
