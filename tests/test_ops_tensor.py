"""ops.Tensor: operators, identity, methods, numpy's dispatch protocols and the public API."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow import OpInputError
from tests._ops_helpers import check, rand

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

    def test_clip_method(self) -> None:
        """t.clip(min, max) takes ndarray.clip's names; either bound may be left out."""
        check(lambda: ops.asarray(A).clip(-0.5, 0.5), A.clip(-0.5, 0.5))
        check(lambda: ops.asarray(A).clip(max=0.0), A.clip(max=0.0))
        check(lambda: ops.asarray(A).clip(min=B), A.clip(min=B))

    def test_argmax_argmin_methods(self) -> None:
        """t.argmax/argmin take numpy's axis and keepdims."""
        check(lambda: ops.asarray(A).argmax(), A.argmax())
        check(lambda: ops.asarray(A).argmax(axis=1, keepdims=True), A.argmax(1, keepdims=True))
        check(lambda: ops.asarray(A).argmin(0), A.argmin(0))

    def test_abs_builtin(self) -> None:
        """abs(t) is ops.abs, like abs(ndarray)."""
        check(lambda: abs(ops.asarray(A)), abs(A))


NOPE: Any = "nope"  # (not a dtype: what a meta rule should not return)


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

    @pytest.mark.parametrize(
        "spec",
        [ops.TensorSpec((3,), np.float32), ops.TensorSpec([3], "float32")],  # type: ignore[arg-type]
        ids=["scalar-type", "list-and-string"],
    )
    def test_define_normalises_a_dtype_like_and_a_list_shape(self, spec: Any) -> None:
        """A meta rule's np.float32 or "float32" becomes a np.dtype, a list shape a tuple:
        the Tensor's dtype was the scalar type itself (ops downstream failed on .kind) and
        the kernel's float32[3] was refused as not matching "float32[3]"."""
        twice = ops.define("twice_spec", lambda x: x * 2, lambda x: spec)
        x = np.ones(3, np.float32)
        t = twice(x)
        assert t.shape == (3,) and t.dtype == np.dtype(np.float32)
        assert isinstance(t.dtype, np.dtype)
        check(lambda: ops.add(twice(x), 1), x * 2 + 1)

    @pytest.mark.parametrize(
        ("meta", "message"),
        [
            (lambda x: None, r"returned NoneType None, not an ops.TensorSpec"),
            (lambda x: (3,), r"returned as output 0 int 3, not an ops.TensorSpec"),
            (lambda x: ops.TensorSpec((-1,), np.dtype("f4")), r"shape must be a tuple of non-neg"),
            (lambda x: ops.TensorSpec((3,), NOPE), r"TensorSpec\(shape=\(3,\), dtype='nope'\)"),
        ],
        ids=["none", "plain-tuple", "negative", "bad-dtype"],
    )
    def test_define_refuses_what_is_not_a_spec_at_the_call(self, meta: Any, message: str) -> None:
        """Refused when the op is called (it surfaced only when the kernel ran, as an
        OpOutputError or an AttributeError), naming the op."""
        bad = ops.define("bad_spec", lambda x: x * 2, meta)
        with pytest.raises(dataflow.DataflowTypeError, match=rf"^op 'bad_spec': .*{message}"):
            bad(np.ones(3, np.float32))


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
