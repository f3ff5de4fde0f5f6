"""Every op's value has exactly the shape and dtype its meta rule declared (issue #18.1).

Each op runs on random inputs of many dtypes and shapes (0-d, empty, Python scalars
included), eagerly and in a runtime with every op on the pool. Its value must be an ndarray
(or a numpy scalar, for a 0-d spec) whose shape and dtype are the Tensor's, and equal to
numpy's own result. Where an op refuses a dtype, it refuses at the call, naming the op.

Also here: the rules that hold for all ops at once: a call that the meta rule accepts is one
the kernel accepts (keywords included), and numpy subclasses are refused by every op.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow import OpInputError, OpTypeError
from tests._ops_helpers import assert_like, rand

DTYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int32,
    np.int64,
    np.float16,
    np.float32,
    np.float64,
    np.complex128,
]
SHAPES = [(3, 4), (), (0, 4)]

Case = tuple[Callable[[Any], Any], Callable[[Any], Any] | None]


def _other(x: np.ndarray) -> np.ndarray:
    """A second operand of x's shape and dtype."""
    return rand(x.shape, x.dtype, 7) if x.dtype != np.complex128 else x * (1 - 2j)


def _positive(x: np.ndarray) -> np.ndarray:
    return np.abs(x) + 1 if x.dtype.kind in "fc" else x


def _exponent(x: np.ndarray) -> np.ndarray:
    """A second operand of x's shape and dtype that numpy's power takes (integers: 0-3)."""
    other = _other(x)
    return np.abs(other) % 4 if x.dtype.kind in "iu" else _positive(other)


def _mask(x: np.ndarray) -> np.ndarray:
    return rand(x.shape, np.bool_, 3)


def _ndim2(x: np.ndarray) -> np.ndarray:
    return x.reshape(x.shape + (1,) * (2 - x.ndim)) if x.ndim < 2 else x


# "op" or "op:variant": (the op call on x, the numpy reference or None where numpy has none).
CASES: dict[str, Case] = {
    "add": (lambda x: ops.add(x, _other(x)), lambda x: np.add(x, _other(x))),
    "add:weak_int": (lambda x: ops.add(x, 3), lambda x: np.add(x, 3)),
    "add:weak_float": (lambda x: ops.add(2.5, x), lambda x: np.add(2.5, x)),
    "subtract": (lambda x: ops.subtract(x, _other(x)), lambda x: np.subtract(x, _other(x))),
    "multiply": (lambda x: ops.multiply(x, 2), lambda x: np.multiply(x, 2)),
    "divide": (lambda x: ops.divide(x, _positive(x)), lambda x: np.divide(x, _positive(x))),
    "maximum": (lambda x: ops.maximum(x, _other(x)), lambda x: np.maximum(x, _other(x))),
    "minimum": (lambda x: ops.minimum(_other(x), x), lambda x: np.minimum(_other(x), x)),
    "greater": (lambda x: ops.greater(x, 0), lambda x: np.greater(x, 0)),
    "less": (lambda x: ops.less(x, _other(x)), lambda x: np.less(x, _other(x))),
    "equal": (lambda x: ops.equal(x, _other(x)), lambda x: np.equal(x, _other(x))),
    "not_equal": (lambda x: ops.not_equal(x, 1), lambda x: np.not_equal(x, 1)),
    "greater_equal": (lambda x: ops.greater_equal(x, 1), lambda x: np.greater_equal(x, 1)),
    "less_equal": (lambda x: ops.less_equal(x, 1), lambda x: np.less_equal(x, 1)),
    "power": (lambda x: ops.power(_positive(x), 2), lambda x: np.power(_positive(x), 2)),
    "power:arrays": (
        lambda x: ops.power(_positive(x), _exponent(x)),
        lambda x: np.power(_positive(x), _exponent(x)),
    ),
    "square": (ops.square, np.square),
    "negative": (ops.negative, np.negative),
    "abs": (ops.abs, np.abs),
    "sqrt": (lambda x: ops.sqrt(_positive(x)), lambda x: np.sqrt(_positive(x))),
    "exp": (ops.exp, np.exp),
    "log": (lambda x: ops.log(_positive(x)), lambda x: np.log(_positive(x))),
    "sin": (ops.sin, np.sin),
    "cos": (ops.cos, np.cos),
    "tanh": (ops.tanh, np.tanh),
    "sigmoid": (ops.sigmoid, lambda x: 1 / (1 + np.exp(-x.astype(np.exp(x).dtype)))),
    "relu": (ops.relu, lambda x: np.maximum(x, 0)),
    "clip": (lambda x: ops.clip(x, 0, 5), lambda x: np.clip(x, 0, 5)),
    "clip:arrays": (
        lambda x: ops.clip(x, np.minimum(x, _other(x)), np.maximum(x, _other(x))),
        lambda x: np.clip(x, np.minimum(x, _other(x)), np.maximum(x, _other(x))),
    ),
    "clip:upper": (lambda x: ops.clip(x, None, 1.5), lambda x: np.clip(x, None, 1.5)),
    "where": (
        lambda x: ops.where(_mask(x), x, _other(x)),
        lambda x: np.where(_mask(x), x, _other(x)),
    ),
    "where:scalar": (lambda x: ops.where(_mask(x), x, 0), lambda x: np.where(_mask(x), x, 0)),
    "sum": (ops.sum, np.sum),
    "sum:axis": (
        lambda x: ops.sum(x, -1, keepdims=True),
        lambda x: np.sum(x, -1, keepdims=True),
    ),
    "mean": (lambda x: ops.mean(x, axis=0), lambda x: np.mean(x, axis=0)),
    "var": (lambda x: ops.var(x, ddof=0), lambda x: np.var(x, ddof=0)),
    "max": (lambda x: ops.max(x, axis=-1), lambda x: np.max(x, axis=-1)),
    "min": (ops.min, np.min),
    "argmax": (ops.argmax, np.argmax),
    "argmax:axis": (
        lambda x: ops.argmax(x, axis=-1, keepdims=True),
        lambda x: np.argmax(x, axis=-1, keepdims=True),
    ),
    "argmin": (lambda x: ops.argmin(x, axis=0), lambda x: np.argmin(x, axis=0)),
    "softmax": (ops.softmax, None),
    "log_softmax": (lambda x: ops.log_softmax(x, axis=None), None),
    "matmul": (lambda x: ops.matmul(_ndim2(x), _ndim2(x).T), lambda x: _ndim2(x) @ _ndim2(x).T),
    "linear": (
        lambda x: ops.linear(_ndim2(x), _ndim2(x), _ndim2(x)[:, 0]),
        lambda x: _ndim2(x) @ _ndim2(x).T + _ndim2(x)[:, 0],
    ),
    "reshape": (lambda x: ops.reshape(x, -1), lambda x: np.reshape(x, -1)),
    "transpose": (ops.transpose, np.transpose),
    "flip": (ops.flip, np.flip),
    "split": (lambda x: ops.split(_ndim2(x), [1], axis=1), lambda x: np.split(_ndim2(x), [1], 1)),
    "concatenate": (
        lambda x: ops.concatenate([x, x], axis=None),
        lambda x: np.concatenate([x, x], axis=None),
    ),
    "stack": (lambda x: ops.stack([x, _other(x)]), lambda x: np.stack([x, _other(x)])),
    "getitem": (lambda x: ops.getitem(x, (Ellipsis, None)), lambda x: x[..., None]),
    "getitem:advanced": (lambda x: ops.getitem(_ndim2(x), [0, 0]), lambda x: _ndim2(x)[[0, 0]]),
    "asarray": (ops.asarray, np.asarray),
    "astype": (lambda x: ops.astype(x, np.complex64), lambda x: x.astype(np.complex64)),
}

# Ops the table above does not cover (they belong to the recurrent work, tested there).
NOT_HERE = {"lstm_cell", "gru_cell", "lstm_sequence", "gru_sequence"}  # tests/test_rnn_sequence.py


def _refused(build: Callable[[], Any]) -> bool:
    """Whether the meta rule refuses the call (at the call, as it must)."""
    try:
        build()
    except (OpTypeError, OpInputError):
        return True
    return False


def _check_value(t: ops.Tensor, value: Any) -> None:
    assert type(value) is np.ndarray or isinstance(value, np.generic), (t, type(value))
    assert (value.shape, value.dtype) == (t.shape, t.dtype), (t, value.dtype, value.shape)


def _outputs(out: Any) -> list[ops.Tensor]:
    return list(out) if isinstance(out, tuple) else [out]


def _run_both(build: Callable[[], Any]) -> tuple[list[Any], list[Any]]:
    """Values of build()'s Tensors eagerly and in a runtime (all on the pool), each checked."""
    eager = []
    for t in _outputs(build()):
        _check_value(t, t.result())
        eager.append(t.result())

    async def main() -> list[Any]:
        values = []
        for t in _outputs(build()):
            v = await t
            _check_value(t, v)
            values.append(v)
        return values

    old = dataflow.get_inline_threshold()
    dataflow.set_inline_threshold(0.0)
    try:
        pooled: list[Any] = dataflow.run(main, interop_threads=2)
    finally:
        dataflow.set_inline_threshold(old)
    return eager, pooled


class TestValuesMatchSpecs:
    def test_every_op_is_covered(self) -> None:
        """Each exported op appears in the table (or is listed as tested elsewhere)."""
        exported = {n for n in ops.__all__ if callable(getattr(ops, n)) and n.islower()}
        exported -= {"define", "spec_of", "nn", "set_recurrent_engine", "get_recurrent_engine"}
        covered = {name.split(":")[0] for name in CASES} | NOT_HERE
        assert exported <= covered, exported - covered

    @pytest.mark.parametrize("shape", SHAPES, ids=str)
    @pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
    @pytest.mark.parametrize("case", list(CASES), ids=str)
    def test_value_has_the_declared_shape_and_dtype(
        self, case: str, dtype: Any, shape: tuple[int, ...]
    ) -> None:
        """Eager and pooled values are ndarrays of exactly the declared shape and dtype."""
        build_op, ref = CASES[case]
        x = rand(shape, dtype, 1)
        if _refused(lambda: build_op(x)):
            return  # refused at the call: nothing ran (what is refused is tested per op)
        eager, pooled = _run_both(lambda: build_op(x))
        if ref is None:
            return
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "Mean of empty slice"
            expected = ref(x)
        expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
        for got in (eager, pooled):
            for g, e in zip(got, expected, strict=True):
                assert_like(g, e)

    @pytest.mark.parametrize("case", ["add:weak_float", "exp", "sum", "clip", "softmax", "abs"])
    @pytest.mark.parametrize("scalar", [2.5, 3, True, np.float32(1.5)], ids=repr)
    def test_scalar_inputs_give_declared_specs(self, case: str, scalar: Any) -> None:
        """Python and numpy scalars in: 0-d values of the declared dtype out."""
        build_op, _ = CASES[case]
        if not _refused(lambda: build_op(scalar)):
            _run_both(lambda: build_op(scalar))


def _kernel_parameters(op: dataflow.Op[..., Any]) -> list[inspect.Parameter] | None:
    kernel = inspect.unwrap(op.kernel)
    try:
        return list(inspect.signature(kernel).parameters.values())
    except ValueError:  # a ufunc: positional-only inputs
        return None


def _ops() -> list[tuple[str, dataflow.Op[..., Any]]]:
    found = []
    for module in (
        ops._elementwise,
        ops._reduce,
        ops._shape,
        ops._linalg,
        ops._softmax,
        ops._indexing,
    ):
        for name, value in vars(module).items():
            if isinstance(value, dataflow.Op):
                found.append((f"{module.__name__}.{name}", value))
    return found


class TestKeywords:
    @pytest.mark.parametrize(("name", "op"), _ops(), ids=[n for n, _ in _ops()])
    def test_kernel_accepts_what_the_meta_rule_accepts(
        self, name: str, op: dataflow.Op[..., Any]
    ) -> None:
        """A keyword the meta rule binds is one the kernel binds: no failure at await."""
        meta = list(inspect.signature(op.meta).parameters.values())
        kernel = _kernel_parameters(op)
        by_keyword = [p.name for p in meta if p.kind is p.POSITIONAL_OR_KEYWORD]
        if kernel is None:
            assert not by_keyword, f"{name}: a ufunc kernel takes no keywords, meta {by_keyword}"
            return
        kernel_names = {p.name for p in kernel}
        assert set(by_keyword) <= kernel_names, (name, by_keyword, kernel_names)

    @pytest.mark.parametrize("op", [ops.add, ops.maximum, ops.less, ops.matmul, ops.exp])
    def test_ufunc_ops_refuse_keywords_at_the_call(self, op: Any) -> None:
        """ops.add(x, y=x) raises at the call, naming the op and the keyword (numpy's rule)."""
        x = rand((2, 2), np.float32)
        names = list(inspect.signature(op.meta).parameters)
        args, kwargs = ((), {names[0]: x}) if len(names) == 1 else ((x,), {names[1]: x})
        with pytest.raises(TypeError, match=rf"{op.name}\(\) got some positional-only"):
            op(*args, **kwargs)

    def test_missing_argument_names_the_op(self) -> None:
        """ops.add(x) says add() is missing y, not meta()."""
        with pytest.raises(TypeError, match=r"add\(\) missing 1 required positional argument"):
            ops.add(1.0)

    def test_keyword_calls_work_where_accepted(self) -> None:
        """ops.where/clip/sum/softmax with keywords equal their positional calls."""
        x = rand((3, 4), np.float64, 2)
        m = x > 0
        pairs = [
            (ops.where(condition=m, x=x, y=-x), np.where(m, x, -x)),
            (ops.clip(x, a_max=0.5, a_min=-0.5), np.clip(x, -0.5, 0.5)),
            (ops.sum(x=x, keepdims=True, axis=1), np.sum(x, axis=1, keepdims=True)),
            (ops.softmax(x=x, axis=0), ops.softmax(x, 0).result()),
            (ops.linear(x, w=x, b=None), x @ x.T),
        ]
        for got, expected in pairs:
            assert_like(got.result(), expected)


class _Sub(np.ndarray):
    """A user's ndarray subclass."""


SUBCLASSES: list[Callable[[], np.ndarray]] = [
    lambda: np.ma.masked_array([[1.0, 2.0], [3.0, 1000.0]], mask=[[False, False], [False, True]]),
    lambda: np.matrix([[1.0, 2.0], [3.0, 4.0]]),
    lambda: np.arange(4.0).reshape(2, 2).view(_Sub),
]


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix's own warning
class TestSubclasses:
    @pytest.mark.parametrize("make", SUBCLASSES, ids=["masked", "matrix", "user"])
    @pytest.mark.parametrize(
        "call",
        [
            lambda a: ops.mean(a),
            lambda a: ops.var(a, axis=0),
            lambda a: ops.sigmoid(a),
            lambda a: ops.add(a, 1.0),
            lambda a: ops.add(np.ones((2, 2)), a),
            lambda a: ops.matmul(a, a),
            lambda a: ops.sum(a, axis=0),
            lambda a: ops.reshape(a, -1),
            lambda a: ops.concatenate([a, a]),
            lambda a: ops.linear(np.ones((2, 2)), a),
            lambda a: ops.softmax(a),
            lambda a: ops.asarray(a),
            lambda a: ops.getitem(a, 0),
        ],
        ids=[
            "mean",
            "var",
            "sigmoid",
            "add",
            "add_right",
            "matmul",
            "sum",
            "reshape",
            "concatenate",
            "linear",
            "softmax",
            "asarray",
            "getitem",
        ],
    )
    def test_refused_at_the_call_naming_the_type(
        self, call: Callable[[Any], Any], make: Callable[[], np.ndarray]
    ) -> None:
        """Every op refuses an ndarray subclass at the call, naming it and the fix."""
        a = make()
        with pytest.raises(OpTypeError, match=r"numpy.ndarray subclass.*np\.asarray\(x\)"):
            call(a)

    def test_masked_array_message(self) -> None:
        """The masked-array refusal names np.ma.MaskedArray and x.filled(...)."""
        a = SUBCLASSES[0]()
        with pytest.raises(OpTypeError, match=r"mean: argument 1 is a np\.ma\.MaskedArray.*filled"):
            ops.mean(a)

    def test_matrix_message(self) -> None:
        """The np.matrix refusal says np.asarray gives the 2-D array."""
        with pytest.raises(OpTypeError, match=r"np\.matrix.*2-D ndarray"):
            ops.sum(SUBCLASSES[1](), axis=0)

    def test_memmap_is_refused_and_asarray_is_the_fix(self, tmp_path: Any) -> None:
        """np.memmap is refused too; np.asarray(m) (no copy) works."""
        m = np.memmap(tmp_path / "m.bin", dtype=np.float32, mode="w+", shape=(3,))
        m[:] = [1.0, 2.0, 3.0]
        with pytest.raises(OpTypeError, match=r"np\.memmap"):
            ops.exp(m)
        assert_like(ops.exp(np.asarray(m)).result(), np.exp(np.array([1.0, 2.0, 3.0], np.float32)))
        del m

    def test_spec_of_refuses(self) -> None:
        """ops.spec_of (custom ops' meta rules) refuses a subclass too."""
        with pytest.raises(OpTypeError, match=r"np\.matrix"):
            ops.spec_of(SUBCLASSES[1]())

    def test_the_fix_gives_numpys_values(self) -> None:
        """The documented fixes compute numpy's values."""
        a = np.ma.masked_array([1.0, 2.0, 1000.0], mask=[False, False, True])
        assert_like(ops.mean(a.filled(0.0)).result(), np.mean(a.filled(0.0)))
        assert_like(ops.mean(np.asarray(a)).result(), np.mean(np.asarray(a)))

    def test_refused_inside_a_runtime(self) -> None:
        """Refused at the call in a runtime too (nothing fails later, at await)."""

        async def main() -> str:
            with pytest.raises(OpTypeError, match=r"np\.matrix"):
                ops.tanh(SUBCLASSES[1]())
            return "ok"

        assert dataflow.run(main) == "ok"
