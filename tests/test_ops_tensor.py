"""ops.Tensor: operators, identity, methods, numpy's dispatch protocols and the public API."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow import NotReadyError, OpInputError
from tests._ops_helpers import assert_like, check, rand

# -- Tensor ------------------------------------------------------------------------------------

A = rand((3, 4), np.float32, 1)
B = rand((3, 4), np.float32, 2)
S = rand((4, 2), np.float32, 3)


class TestOperators:
    @pytest.mark.parametrize(
        "expr",
        [
            lambda x, y: x + y,
            lambda x, y: x - y,
            lambda x, y: x * y,
            lambda x, y: x / y,
            lambda x, y: x < y,
            lambda x, y: x <= y,
            lambda x, y: x > y,
            lambda x, y: x >= y,
            lambda x, y: x == y,
            lambda x, y: x != y,
        ],
        ids=["add", "sub", "mul", "div", "lt", "le", "gt", "ge", "eq", "ne"],
    )
    def test_binary_operators(self, expr: Callable[[Any, Any], Any]) -> None:
        """Each operator with a Tensor on the left, the right, or both, equals numpy's."""
        expected = expr(A, B)
        check(lambda: expr(ops.asarray(A), B), expected)
        check(lambda: expr(A, ops.asarray(B)), expected)
        check(lambda: expr(ops.exp(A), ops.asarray(B)), expr(np.exp(A), B))

    @pytest.mark.parametrize("scalar", [2, 0.5, np.float32(1.5), np.float64(-2.0)], ids=repr)
    def test_scalars_on_either_side(self, scalar: Any) -> None:
        """1 - t, t * 0.5, np.float32(1.5) / t: scalars mix in on both sides."""
        t = ops.asarray(A)
        for got, expected in [
            (lambda: scalar - t, scalar - A),
            (lambda: t - scalar, A - scalar),
            (lambda: scalar * t, scalar * A),
            (lambda: scalar / t, scalar / A),
            (lambda: t + scalar, A + scalar),
        ]:
            check(got, expected)

    def test_matmul_both_sides(self) -> None:
        """t @ ndarray, ndarray @ t and t @ t equal numpy's."""
        check(lambda: ops.asarray(A) @ S, A @ S)
        check(lambda: A @ ops.asarray(S), A @ S)
        check(lambda: ops.asarray(A) @ ops.asarray(A).T, A @ A.T)

    def test_unary(self) -> None:
        """-t and +t."""
        check(lambda: -ops.asarray(A), -A)
        check(lambda: +ops.exp(A), np.exp(A))

    def test_ndarray_on_the_left_returns_a_tensor(self) -> None:
        """ndarray + t defers to the Tensor and returns a pending Tensor, never blocking."""

        async def main() -> bool:
            gate = threading.Event()
            t = _blocked(gate, A)
            # ndarray on the left: each must defer to the Tensor's reflected operator.
            results = [B + t, B @ t.T, 1 - t, np.float32(2) * t, B < t]  # noqa: SIM300
            pending = all(isinstance(r, ops.Tensor) and not r.done() for r in results)
            gate.set()
            for r in results:
                await r
            return pending

        assert dataflow.run(main, interop_threads=2) is True

    def test_unsupported_operand_gives_python_type_error(self) -> None:
        """t + None is Python's TypeError (NotImplemented both ways)."""
        t = ops.asarray(A)
        with pytest.raises(TypeError, match="unsupported operand"):
            t + None
        with pytest.raises(TypeError, match="unsupported operand"):
            {} * t

    def test_operator_errors_come_from_the_meta_rule(self) -> None:
        """A shape mismatch through an operator names the op."""
        with pytest.raises(OpInputError, match=r"add: shapes \(3, 4\) and \(3,\) cannot"):
            ops.asarray(A) + np.ones(3)


class TestIdentity:
    def test_hashable_by_identity(self) -> None:
        """Tensors are dict keys and set members by identity, though == builds an op."""
        t, u = ops.asarray(A), ops.asarray(A)
        assert len({t, u, t}) == 2
        assert {t: 1}[t] == 1
        assert isinstance(t == u, ops.Tensor)

    def test_eq_with_non_array_falls_back_to_identity(self) -> None:
        """t == None is False and t != None is True (NotImplemented, then identity)."""
        t: Any = ops.asarray(A)
        assert (t == None) is False  # noqa: E711 - the point of the test
        assert (t != None) is True  # noqa: E711

    def test_truth_value_refused(self) -> None:
        """bool(t) raises: control flow cannot depend on a pending value."""
        with pytest.raises(TypeError, match="truth value"):
            bool(ops.asarray(A))

    def test_attributes_and_repr(self) -> None:
        """shape, dtype, ndim, size, spec, len and repr."""
        t = ops.exp(A)
        f32 = np.dtype(np.float32)
        assert (t.shape, t.dtype, t.ndim, t.size, len(t)) == ((3, 4), f32, 2, 12, 3)
        assert t.spec == ops.TensorSpec((3, 4), np.dtype(np.float32))
        assert repr(t).startswith("<Tensor exp#") and repr(t).endswith("float32[3, 4] done>")
        assert repr(t.spec) == "float32[3, 4]"


class TestMethods:
    def test_reduction_methods(self) -> None:
        """t.sum/mean/var/max/min take numpy's axis and keepdims."""

        def t() -> Any:
            return ops.asarray(A)

        check(lambda: t().sum(), A.sum())
        check(lambda: t().mean(axis=0), A.mean(axis=0))
        check(lambda: t().var(1, True), A.var(1, keepdims=True))
        check(lambda: t().var(ddof=1), A.var(ddof=1))
        check(lambda: t().max(axis=(0, 1)), A.max(axis=(0, 1)))
        check(lambda: t().min(-1), A.min(-1))

    def test_shape_methods(self) -> None:
        """t.T, t.reshape, t.transpose and t.astype."""
        check(lambda: ops.asarray(A).T.reshape(2, 6), A.T.reshape(2, 6))
        check(lambda: ops.asarray(A).astype(np.float64), A.astype(np.float64))


class TestNumpyProtocols:
    @pytest.mark.parametrize(
        ("ufunc", "arity"),
        [
            (np.add, 2),
            (np.subtract, 2),
            (np.multiply, 2),
            (np.divide, 2),
            (np.true_divide, 2),
            (np.maximum, 2),
            (np.minimum, 2),
            (np.greater, 2),
            (np.less_equal, 2),
            (np.equal, 2),
            (np.negative, 1),
            (np.exp, 1),
            (np.log, 1),
            (np.tanh, 1),
        ],
        ids=lambda v: getattr(v, "__name__", str(v)),
    )
    def test_ufuncs_route_to_ops(self, ufunc: np.ufunc, arity: int) -> None:
        """np.add(a, t), np.exp(t), ... return Tensors equal to numpy's result."""
        x = np.abs(A) + np.float32(0.5)
        args = (ops.asarray(x), B)[:arity]
        out = ufunc(*args)
        assert isinstance(out, ops.Tensor)
        assert_like(out.result(), ufunc(*(x, B)[:arity]))
        if arity == 2:
            assert_like(ufunc(B, ops.asarray(x)).result(), ufunc(B, x))

    def test_np_matmul(self) -> None:
        """np.matmul(ndarray, t) is a Tensor."""
        out = np.matmul(A, ops.asarray(S))
        assert isinstance(out, ops.Tensor)
        assert_like(out.result(), A @ S)

    def test_unsupported_ufunc_raises(self) -> None:
        """np.sin(t) has no op: numpy raises TypeError instead of blocking."""
        with pytest.raises(TypeError, match="sin"):
            np.sin(ops.asarray(A))

    def test_ufunc_keywords_are_not_supported(self) -> None:
        """np.add(t, 1, out=...) is refused rather than silently ignored."""
        with pytest.raises(TypeError):
            np.add(ops.asarray(A), 1, out=np.empty((3, 4), np.float32))

    def test_ufunc_methods_are_not_supported(self) -> None:
        """np.add.reduce(t) is refused (use ops.sum)."""
        with pytest.raises(TypeError):
            np.add.reduce(ops.asarray(A))

    def test_array_functions_route_to_ops(self) -> None:
        """np.concatenate, stack, sum, mean, var, max, min, reshape, transpose, where, flip,
        split work on Tensors and return Tensors."""
        t = ops.asarray(A)
        pairs: list[tuple[Any, Any]] = [
            (np.concatenate([t, B], axis=1), np.concatenate([A, B], axis=1)),
            (np.stack([t, B]), np.stack([A, B])),
            (np.sum(t, axis=0), np.sum(A, axis=0)),
            (np.mean(t, keepdims=True), np.mean(A, keepdims=True)),
            (np.var(t, axis=1, ddof=1), np.var(A, axis=1, ddof=1)),
            (np.max(t, axis=1), np.max(A, axis=1)),
            (np.amin(t), np.amin(A)),
            (np.reshape(t, (4, 3)), np.reshape(A, (4, 3))),
            (np.transpose(t), np.transpose(A)),
            (np.where(t > 0, t, B), np.where(A > 0, A, B)),
            (np.flip(t, 0), np.flip(A, 0)),
        ]
        for got, expected in pairs:
            assert isinstance(got, ops.Tensor)
            assert_like(got.result(), expected)
        pieces = np.split(t, 2, axis=1)
        assert isinstance(pieces, tuple) and len(pieces) == 2
        assert_like(pieces[1].result(), np.split(A, 2, axis=1)[1])

    def test_shape_queries(self) -> None:
        """np.shape, np.ndim and np.size answer from the spec, without the value."""
        t = ops.asarray(A)
        assert (np.shape(t), np.ndim(t), np.size(t), np.size(t, 1)) == ((3, 4), 2, 12, 4)

    def test_unsupported_function_raises(self) -> None:
        """np.cumsum(t) has no op: TypeError, not a blocking conversion."""
        with pytest.raises(TypeError, match="cumsum"):
            np.cumsum(ops.asarray(A))

    def test_unsupported_keywords_raise(self) -> None:
        """np.sum(t, dtype=...) and np.where(cond) are refused."""
        t = ops.asarray(A)
        with pytest.raises(TypeError):
            np.sum(t, dtype=np.float64)
        with pytest.raises(TypeError):
            np.where(t)

    def test_asarray_of_done_tensor(self) -> None:
        """np.asarray of a done Tensor is its array."""
        assert_like(np.asarray(ops.exp(A)), np.exp(A))

    def test_asarray_of_pending_tensor_raises(self) -> None:
        """np.asarray(t) on a pending Tensor in a running loop raises NotReadyError."""

        async def main() -> str:
            gate = threading.Event()
            t = ops.exp(_blocked(gate, A))
            try:
                with pytest.raises(NotReadyError, match=r"would block: write `await t`"):
                    np.asarray(t)
            finally:
                gate.set()
            assert_like(await t, np.exp(A))
            return "ok"

        assert dataflow.run(main, interop_threads=2) == "ok"


class TestPublicApi:
    def test_all_matches_exports(self) -> None:
        """ops.__all__ lists exactly the public names the package defines."""
        public = {n for n in vars(ops) if not n.startswith("_")} - {"annotations"}
        assert isinstance(ops.__all__, tuple)
        assert set(ops.__all__) == public
        assert len(ops.__all__) == len(set(ops.__all__))

    def test_every_op_is_documented(self) -> None:
        """Every exported name has a docstring."""
        for name in ops.__all__:
            assert getattr(ops, name).__doc__, name

    def test_every_op_has_a_cost_rule(self) -> None:
        """Every exported op declares a cost rule."""
        for name in ops.__all__:
            obj = getattr(ops, name)
            if isinstance(obj, dataflow.Op):
                assert obj.cost is not None, name

    def test_define_declares_an_op(self) -> None:
        """ops.define builds an op returning Tensors, with errors from its meta rule."""

        def meta(x: Any) -> ops.TensorSpec:
            if np.ndim(x) != 1:
                raise OpInputError(f"double: expected a 1-D array, got shape {np.shape(x)}")
            return ops.spec_of(x)

        double = ops.define("double", lambda x: x * 2, meta, lambda x: dataflow.Cost(1, 8))
        check(lambda: double(A[0]), A[0] * 2)
        with pytest.raises(OpInputError, match=r"double: expected a 1-D array"):
            double(A)


def _wait_kernel(x: Any, gate: threading.Event) -> Any:
    gate.wait(10)
    return x


_wait_op = ops.define(
    "wait_for_gate",
    _wait_kernel,
    meta=lambda x, gate: ops.spec_of(x),
    cost=lambda x, gate: dataflow.Cost(1e12, 0),
    inline=False,  # it blocks: never on the event loop, whatever time it was measured at
)


def _blocked(gate: threading.Event, x: np.ndarray) -> Any:
    """A Tensor of ``x`` that stays pending until ``gate`` is set."""
    return _wait_op(x, gate)
