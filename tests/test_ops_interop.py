"""numpy code on Tensors: ufuncs and array functions dispatch to the ops, or refuse clearly.

Every ufunc and function that has an op returns a Tensor equal to numpy's result, with its
keyword forms; what is not covered raises an OpTypeError that says what to do, at the call,
and nothing ever waits for a pending value.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow import NotReadyError, OpInputError, OpTypeError
from tests._ops_helpers import assert_like, blocked, rand

A = rand((3, 4), np.float32, 1)
B = rand((3, 4), np.float32, 2)
S = rand((4, 2), np.float32, 3)
POS = np.abs(A) + np.float32(0.5)

UNARY = [np.negative, np.abs, np.absolute, np.sqrt, np.exp, np.log, np.sin, np.cos, np.tanh]
BINARY = [
    np.add,
    np.subtract,
    np.multiply,
    np.divide,
    np.true_divide,
    np.maximum,
    np.minimum,
    np.greater,
    np.less,
    np.equal,
    np.not_equal,
    np.greater_equal,
    np.less_equal,
]


def _name(v: Any) -> str:
    return str(getattr(v, "__name__", v))


def _in_runtime(build: Callable[[], Any]) -> Any:
    """build()'s value, computed in a runtime (every op on the pool), checked to be a Tensor."""

    async def main() -> Any:
        out = build()
        assert isinstance(out, ops.Tensor)
        return await out

    old = dataflow.get_inline_threshold()
    dataflow.set_inline_threshold(0.0)
    try:
        return dataflow.run(main, interop_threads=2)
    finally:
        dataflow.set_inline_threshold(old)


class TestUfuncs:
    @pytest.mark.parametrize("ufunc", UNARY, ids=_name)
    def test_unary_ufuncs_route_to_ops(self, ufunc: np.ufunc) -> None:
        """np.sin(t), np.sqrt(t), np.abs(t) ... are Tensors equal to numpy's, eager and pooled."""
        out = ufunc(ops.asarray(POS))
        assert isinstance(out, ops.Tensor)
        assert_like(out.result(), ufunc(POS))
        assert_like(_in_runtime(lambda: ufunc(ops.asarray(POS))), ufunc(POS))

    @pytest.mark.parametrize("ufunc", BINARY, ids=_name)
    def test_binary_ufuncs_route_to_ops(self, ufunc: np.ufunc) -> None:
        """np.add(t, a) and np.add(a, t) are Tensors equal to numpy's."""
        assert_like(ufunc(ops.asarray(POS), B).result(), ufunc(POS, B))
        assert_like(ufunc(B, ops.asarray(POS)).result(), ufunc(B, POS))
        assert_like(_in_runtime(lambda: ufunc(B, ops.asarray(POS))), ufunc(B, POS))

    def test_np_matmul_and_operators_from_the_left(self) -> None:
        """np.matmul(ndarray, t) and ndarray @ t are Tensors."""
        assert_like(np.matmul(A, ops.asarray(S)).result(), A @ S)
        out: Any = A @ ops.asarray(S)
        assert_like(out.result(), A @ S)

    @pytest.mark.parametrize(
        "kwargs",
        [{"casting": "same_kind"}, {"order": "K"}, {"subok": True}, {"where": True}, {}],
        ids=str,
    )
    def test_default_keywords_are_accepted(self, kwargs: dict[str, Any]) -> None:
        """Keywords at numpy's default values change nothing and are accepted."""
        assert_like(np.add(ops.asarray(A), B, **kwargs).result(), np.add(A, B))
        assert_like(np.add(ops.asarray(A), B, dtype=None).result(), np.add(A, B))

    @pytest.mark.parametrize(
        ("kwargs", "says"),
        [
            ({"out": np.empty((3, 4), np.float32)}, r"out=<ndarray>.*use the Tensor the call"),
            ({"where": A > 0}, r"where=<ndarray>.*ops\.where"),
            ({"dtype": np.float64}, r"dtype=float64.*astype"),
            ({"casting": "unsafe"}, r"casting='unsafe'"),
            ({"order": "F"}, r"order='F'.*C-ordered"),
        ],
        ids=["out", "where", "dtype", "casting", "order"],
    )
    def test_unsupported_keywords_say_what_to_do(self, kwargs: dict[str, Any], says: str) -> None:
        """out=, where=, dtype= ... raise an OpTypeError naming the keyword and the fix."""
        with pytest.raises(OpTypeError, match=rf"np\.add\(\.\.\., {says}"):
            np.add(ops.asarray(A), B, **kwargs)

    def test_ufunc_without_an_op_says_so(self) -> None:
        """np.floor(t) has no op: OpTypeError naming it and saying to await first."""
        with pytest.raises(OpTypeError, match=r"np\.floor has no op.*np\.floor\(await t\)"):
            np.floor(ops.asarray(A))

    @pytest.mark.parametrize(
        ("call", "says"),
        [
            (lambda t: np.add.reduce(t), r"np\.add\.reduce .*np\.sum\(t, axis=0\)"),
            (lambda t: np.maximum.reduce(t), r"np\.maximum\.reduce .*np\.max"),
            (lambda t: np.add.accumulate(t), r"np\.add\.accumulate .*await"),
            (lambda t: np.multiply.outer(t, t), r"np\.multiply\.outer"),
        ],
        ids=["add.reduce", "maximum.reduce", "accumulate", "outer"],
    )
    def test_ufunc_methods_say_what_to_do(self, call: Callable[[Any], Any], says: str) -> None:
        """np.add.reduce(t) and other ufunc methods are refused with the op to use."""
        with pytest.raises(OpTypeError, match=says):
            call(ops.asarray(A))

    def test_refusals_never_wait_for_a_pending_value(self) -> None:
        """np.floor(pending), np.add(pending, 1, out=...) raise at once in a runtime."""

        async def main() -> str:
            gate = threading.Event()
            t = blocked(gate, A)
            try:
                with pytest.raises(OpTypeError, match="floor"):
                    np.floor(t)
                with pytest.raises(OpTypeError, match="out="):
                    np.add(t, 1, out=np.empty((3, 4), np.float32))
                with pytest.raises(OpTypeError, match="cumsum"):
                    np.cumsum(t)
                assert not t.done()
            finally:
                gate.set()
            await t
            return "ok"

        assert dataflow.run(main, interop_threads=2) == "ok"

    def test_pending_inputs_give_pending_tensors(self) -> None:
        """np.sin(pending) and np.clip(pending, ...) return pending Tensors at once."""

        async def main() -> str:
            gate = threading.Event()
            t = blocked(gate, A)
            outs = [np.sin(t), np.clip(t, 0, 1), np.argmax(t, axis=1), np.sqrt(np.abs(t))]
            assert all(isinstance(o, ops.Tensor) and not o.done() for o in outs)
            gate.set()
            assert_like(await outs[1], np.clip(A, 0, 1))
            assert_like(await outs[2], np.argmax(A, axis=1))
            return "ok"

        assert dataflow.run(main, interop_threads=2) == "ok"


FUNCTIONS: list[tuple[str, Callable[[Any], Any]]] = [
    ("concatenate", lambda t: np.concatenate([t, B], axis=1)),
    ("concatenate_none", lambda t: np.concatenate((t, B), axis=None)),
    ("stack", lambda t: np.stack([t, B], axis=-1)),
    ("sum", lambda t: np.sum(t, axis=0, keepdims=True)),
    ("sum_positional", lambda t: np.sum(t, 1, None, None, True)),
    ("mean", lambda t: np.mean(t, keepdims=True)),
    ("var", lambda t: np.var(t, axis=1, ddof=1)),
    ("var_correction", lambda t: np.var(t, axis=0, correction=1)),
    ("max", lambda t: np.max(t, axis=1)),
    ("amax", lambda t: np.amax(t, axis=(0, 1), keepdims=True)),
    ("min", lambda t: np.min(t)),
    ("amin", lambda t: np.amin(t, 0)),
    ("argmax", lambda t: np.argmax(t)),
    ("argmax_axis", lambda t: np.argmax(t, axis=1, keepdims=True)),
    ("argmin", lambda t: np.argmin(t, 0)),
    ("clip", lambda t: np.clip(t, -0.5, 0.5)),
    ("clip_keywords", lambda t: np.clip(t, a_min=-0.5, a_max=0.5)),
    ("clip_min_max", lambda t: np.clip(t, min=-0.5, max=0.5)),
    ("clip_one_sided", lambda t: np.clip(t, None, 0.1)),
    ("clip_array_bounds", lambda t: np.clip(t, B, B + 1)),
    ("reshape", lambda t: np.reshape(t, (4, 3))),
    ("reshape_keyword", lambda t: np.reshape(t, shape=-1)),
    ("transpose", lambda t: np.transpose(t, (1, 0))),
    ("where", lambda t: np.where(t > 0, t, B)),
    ("flip", lambda t: np.flip(t, 0)),
    ("dot", lambda t: np.dot(t, S)),
    ("dot_vector", lambda t: np.dot(t[0], t[1])),
    ("dot_scalar", lambda t: np.dot(2, t)),
]
if hasattr(np, "concat"):  # numpy 2's array-API names
    FUNCTIONS += [
        ("concat", lambda t: np.concat([t, B], axis=0)),
        ("permute_dims", lambda t: np.permute_dims(t, (1, 0))),
        ("linalg.matmul", lambda t: np.linalg.matmul(t, S)),
    ]


class TestFunctions:
    @pytest.mark.parametrize(("name", "call"), FUNCTIONS, ids=[n for n, _ in FUNCTIONS])
    def test_route_to_ops_with_numpys_keywords(self, name: str, call: Callable[[Any], Any]) -> None:
        """Each function with an op gives a Tensor equal to numpy's (eager and pooled)."""
        out = call(ops.asarray(A))
        assert isinstance(out, ops.Tensor)
        expected = call(A)
        assert_like(out.result(), expected)
        assert_like(_in_runtime(lambda: call(ops.asarray(A))), expected)

    def test_split_returns_a_tuple_of_tensors(self) -> None:
        """np.split(t, ...) is a tuple of Tensors."""
        pieces = np.split(ops.asarray(A), [1, 3], axis=1)
        assert isinstance(pieces, tuple) and len(pieces) == 3
        for got, expected in zip(pieces, np.split(A, [1, 3], axis=1), strict=True):
            assert_like(got.result(), expected)

    @pytest.mark.skipif(not hasattr(np, "astype"), reason="np.astype is numpy >= 2.1")
    def test_astype(self) -> None:
        """np.astype(t, dtype) is ops.astype."""
        out: Any = np.astype(ops.asarray(A), np.float64)  # type: ignore[call-overload]
        assert_like(out.result(), A.astype(np.float64))

    def test_shape_queries_answer_from_the_spec(self) -> None:
        """np.shape, np.ndim and np.size answer from the spec, without the value."""
        t = ops.asarray(A)
        assert (np.shape(t), np.ndim(t), np.size(t), np.size(t, 1)) == ((3, 4), 2, 12, 4)

    def test_keepdims_must_be_a_bool(self) -> None:
        """np.sum(t, keepdims='no') is refused by the op, not read as True."""
        keepdims: Any = "no"
        with pytest.raises(OpTypeError, match="keepdims must be a bool"):
            np.sum(ops.asarray(A), keepdims=keepdims)

    @pytest.mark.parametrize(
        ("call", "says"),
        [
            (lambda t: np.sum(t, dtype=np.float64), r"np\.sum\(\.\.\., dtype=float64\)"),
            (lambda t: np.mean(t, out=np.empty(())), r"np\.mean\(\.\.\., out=<ndarray>\)"),
            (lambda t: np.max(t, initial=0.0), r"np\.max\(\.\.\., initial=0\.0\)"),
            (lambda t: np.sum(t, where=A > 0), r"np\.sum\(\.\.\., where=<ndarray>\).*ops\.where"),
            (lambda t: np.var(t, mean=np.zeros((1, 4))), r"np\.var\(\.\.\., mean="),
            (lambda t: np.argmax(t, out=np.empty((), np.intp)), r"np\.argmax\(\.\.\., out="),
            (lambda t: np.clip(t, 0, 1, dtype=np.float64), r"np\.clip\(\.\.\., dtype=float64"),
            (lambda t: np.reshape(t, -1, order="F"), r"np\.reshape\(\.\.\., order='F'\)"),
            (lambda t: np.concatenate([t, t], dtype=np.float64), r"np\.concatenate.*dtype="),
            (lambda t: np.stack([t, t], out=np.empty((2, 3, 4))), r"np\.stack\(\.\.\., out="),
        ],
        ids=["sum-dtype", "mean-out", "max-initial", "sum-where", "var-mean", "argmax-out",
             "clip-dtype", "reshape-order", "concatenate-dtype", "stack-out"],
    )  # fmt: skip
    def test_unsupported_keywords_say_what_to_do(
        self, call: Callable[[Any], Any], says: str
    ) -> None:
        """A keyword the op cannot honour raises an OpTypeError naming it (never ignored)."""
        with pytest.raises(OpTypeError, match=says):
            call(ops.asarray(A))

    def test_aliases_given_twice_are_refused(self) -> None:
        """np.clip(t, a_min=0, min=0) and np.var(t, ddof=1, correction=1) name the clash."""
        t = ops.asarray(A)
        with pytest.raises(OpInputError, match="a_min and min"):
            np.clip(t, a_min=0, min=0)
        with pytest.raises(OpInputError, match="ddof and correction"):
            np.var(t, ddof=1, correction=1)

    def test_function_without_an_op_says_so(self) -> None:
        """np.cumsum(t) and np.linalg.norm(t) name themselves and say to await first."""
        with pytest.raises(OpTypeError, match=r"np\.cumsum has no op.*await"):
            np.cumsum(ops.asarray(A))
        with pytest.raises(OpTypeError, match=r"np\.linalg\.norm has no op"):
            np.linalg.norm(ops.asarray(A))

    def test_dot_beyond_2d_is_refused(self) -> None:
        """np.dot of 3-D operands (not matmul's batching) is refused, pointing at matmul."""
        with pytest.raises(OpTypeError, match=r"np\.dot of arrays of shapes .*ops\.matmul"):
            np.dot(ops.asarray(np.ones((2, 3, 4))), np.ones((4, 2)))

    def test_one_argument_where_is_refused(self) -> None:
        """np.where(t) has a data-dependent shape: refused, pointing at the 3-argument form."""
        with pytest.raises(OpTypeError, match=r"np\.where\(condition, x, y\)"):
            np.where(ops.asarray(A) > 0)

    def test_foreign_array_types_are_left_to_them(self) -> None:
        """A function that also sees a foreign __array_function__ type defers (NotImplemented)."""

        class Foreign:
            def __array_function__(self, func: Any, types: Any, args: Any, kw: Any) -> Any:
                return "foreign"

        assert np.concatenate([ops.asarray(A), Foreign()]) == "foreign"


class TestConversion:
    def test_asarray_of_done_tensor(self) -> None:
        """np.asarray of a done Tensor is its array."""
        assert_like(np.asarray(ops.exp(A)), np.exp(A))

    def test_asarray_of_pending_tensor_raises(self) -> None:
        """np.asarray(t) on a pending Tensor in a running loop raises NotReadyError."""

        async def main() -> str:
            gate = threading.Event()
            t = ops.exp(blocked(gate, A))
            try:
                with pytest.raises(NotReadyError, match=r"would block: write `await t`"):
                    np.asarray(t)
            finally:
                gate.set()
            assert_like(await t, np.exp(A))
            return "ok"

        assert dataflow.run(main, interop_threads=2) == "ok"

    def test_np_array_copies_and_asarray_does_not(self) -> None:
        """np.array(t) is a copy (writing to it leaves the Tensor's value alone); np.asarray(t)
        and np.array(t, copy=False) hand out the value itself, as numpy does for an array."""
        t = ops.add(rand((2, 3), np.float64), 1.0)
        value = t.result()
        before = value.copy()
        copied = np.array(t)
        copied[0, 0] = 999.0
        np.testing.assert_array_equal(t.result(), before)
        assert np.asarray(t) is value and np.array(t, copy=False) is value
        assert np.array(t, dtype=value.dtype) is not value  # copy=True by default

    def test_a_dtype_change_copies_and_copy_false_refuses_it(self) -> None:
        t = ops.add(rand((4,), np.float64), 1.0)
        assert np.asarray(t, dtype=np.float32).dtype == np.float32
        with pytest.raises(ValueError, match=r"float64 values to float32 needs a copy"):
            np.array(t, dtype=np.float32, copy=False)

    def test_a_done_0d_tensor_converts(self) -> None:
        """A 0-d op's value may be a numpy scalar: np.asarray still gives a 0-d array."""
        x = rand((5,), np.float64)
        s = ops.sum(x)
        got = np.asarray(s)
        assert type(got) is np.ndarray and got.shape == () and got == np.sum(x)
        assert np.array(ops.exp(2.0)).shape == ()
        assert float(s) == float(np.sum(x)) and complex(s) == complex(np.sum(x))
        assert int(ops.sum(np.arange(5))) == 10

    def test_a_list_of_done_0d_tensors_is_an_operand(self) -> None:
        """numpy converts 0-d array-likes in a list through float(): ops.add([s, s], 1)."""
        x = rand((5,), np.float64).astype(np.float32)
        s = ops.sum(x)
        got = ops.add([s, s], 1).result()
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, np.sum(x) + 1, rtol=1e-6)

    def test_float_of_a_pending_or_nd_tensor_is_refused(self) -> None:
        with pytest.raises(TypeError, match=r"only 0-dimensional arrays"):
            float(ops.add(rand((3,), np.float64), 1.0))

        async def main() -> str:
            gate = threading.Event()
            t = ops.sum(blocked(gate, A))
            try:
                with pytest.raises(NotReadyError, match=r"float\(\) on pending .* would block"):
                    float(t)
            finally:
                gate.set()
            await t
            return "ok"

        assert dataflow.run(main, interop_threads=2) == "ok"

    @pytest.mark.parametrize("axis", [None, 0, -1, (0, 1), (1,), ()])
    def test_np_size_takes_numpys_axis_forms(self, axis: Any) -> None:
        x = rand((3, 4), np.float64)
        assert np.size(ops.add(x, 1.0), axis) == np.size(x, axis)

    def test_np_size_out_of_range_axis_is_an_axis_error(self) -> None:
        with pytest.raises(OpInputError, match=r"np.size: axis 5 is out of bounds .* dimension 2"):
            np.size(ops.add(rand((3, 4), np.float64), 1.0), 5)
