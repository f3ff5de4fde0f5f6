"""Random-input sweeps of the ops against numpy, eagerly and in one runtime.

Each sweep draws its cases from a seeded generator: operands of every numeric dtype, shapes
that broadcast (0-d, empty, length 1), NaN and inf among floats, Python scalars (weak, NEP
50), nested lists, Fortran-order, transposed and negative-stride arrays. For each case numpy
either raises, and the op must raise a DataflowError at the call, or returns, and the op must
give the same dtype, shape and values (NaN equal to NaN), the Tensor's declared spec equal to
its value's. In the runtime every array argument arrives as a pending Tensor (from a kernel
that hands back its input, a numpy scalar for a 0-d one), so the meta rules see Tensors and
the kernels whatever upstream kernels return. The few places where ops refuse what numpy
accepts on purpose (docs/ops.md) are left out of the draws.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest

import dataflow
import ops
from dataflow import DataflowError

DTYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int16,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
]
SHAPES = [(), (1,), (3,), (0,), (2, 3), (1, 3), (2, 1), (0, 3), (2, 1, 3), (4, 2, 3)]
SCALARS = [3, -2, 2.5, 1j, True, np.float32(1.5), np.int8(3), np.float64(-0.5), 300]


class Case(NamedTuple):
    """One draw: the op, numpy's function, and the arguments both get."""

    name: str
    op: Callable[..., Any]
    ref: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = {}  # noqa: RUF012 - never changed


def _array(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        a: np.ndarray = rng.random(shape) < 0.5
    elif dt.kind in "iu":
        a = rng.integers(0 if dt.kind == "u" else -9, 10, shape).astype(dt)
    elif dt.kind == "c":
        a = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    else:
        a = rng.standard_normal(shape).astype(dt)
        if a.size and rng.random() < 0.3:
            a.flat[rng.integers(a.size)] = rng.choice([np.nan, np.inf, -np.inf])
    if a.ndim >= 2 and rng.random() < 0.3:
        a = np.asfortranarray(a)
    if a.ndim and rng.random() < 0.3:
        a = a[::-1]
    return a


def _operand(rng: np.random.Generator, scalars: float = 0.2, lists: float = 0.05) -> Any:
    r = rng.random()
    if r < scalars:
        return SCALARS[rng.integers(len(SCALARS))]
    a = _array(rng, SHAPES[rng.integers(len(SHAPES))], DTYPES[rng.integers(len(DTYPES))])
    return a.tolist() if r < scalars + lists else a


def _axis(rng: np.random.Generator, ndim: int) -> Any:
    r = rng.random()
    if r < 0.25 or not ndim:
        return None
    if r < 0.4 and ndim >= 2:
        return tuple(int(a) for a in rng.choice(np.arange(-ndim, ndim), 2, replace=False))
    return int(rng.integers(-ndim - 1, ndim + 1))


def _sigmoid(x: Any) -> Any:
    a = np.asarray(x)
    dtype = np.exp.resolve_dtypes((a.dtype, None))[-1]
    return 1 / (1 + np.exp(-a.astype(dtype)))


def _clip(x: Any, lo: Any, hi: Any) -> Any:
    return np.positive(x) if lo is None and hi is None else np.clip(x, lo, hi)


def _split(x: Any, ios: Any, axis: int) -> tuple[Any, ...]:
    return tuple(np.split(np.asarray(x), ios, axis))


BINARY = [
    "add",
    "subtract",
    "multiply",
    "divide",
    "maximum",
    "minimum",
    "greater",
    "less",
    "equal",
    "not_equal",
    "greater_equal",
    "less_equal",
]
# Left out for complex operands: these kernels are numpy's raw ufuncs (no quiet() wrapper, for
# speed), and an ordering comparison of complex values with a NaN warns, which fails the task
# under filterwarnings = error.
_ORDERING = ("greater", "less", "greater_equal", "less_equal")
UNARY = ["negative", "abs", "sqrt", "exp", "log", "sin", "cos", "tanh"]


def elementwise_cases(seed: int, n: int) -> list[Case]:
    """Binary and unary ufuncs, sigmoid, relu, where and clip on random operands."""
    rng = np.random.default_rng(seed)
    cases: list[Case] = []
    for _ in range(n):
        name = BINARY[rng.integers(len(BINARY))]
        pair = (_operand(rng), _operand(rng))
        complex_ = any(np.asarray(v).dtype.kind == "c" for v in pair)
        if not (complex_ and name in _ORDERING):
            cases.append(Case(name, getattr(ops, name), getattr(np, name), pair))
        name = UNARY[rng.integers(len(UNARY))]
        cases.append(Case(name, getattr(ops, name), getattr(np, name), (_operand(rng),)))
        x = _operand(rng, scalars=0.1)
        cases.append(Case("sigmoid", ops.sigmoid, _sigmoid, (x,)))
        if np.asarray(x).dtype.kind in "iuf":  # (relu refuses bool and complex on purpose)
            cases.append(Case("relu", ops.relu, lambda v: np.maximum(v, 0), (x,)))
        where_args = (_operand(rng), _operand(rng), _operand(rng))
        cases.append(Case("where", ops.where, np.where, where_args))
        lo = _operand(rng) if rng.random() < 0.7 else None
        hi = _operand(rng) if rng.random() < 0.7 else None
        cases.append(Case("clip", ops.clip, _clip, (_operand(rng, scalars=0.1), lo, hi)))
    return cases


def reduction_and_shape_cases(seed: int, n: int) -> list[Case]:
    """Reductions, softmax, flip, transpose, reshape, split, astype, concatenate, stack."""
    rng = np.random.default_rng(seed)
    cases: list[Case] = []
    for _ in range(n):
        x = _operand(rng, scalars=0.0, lists=0.1)
        ndim = np.ndim(x)
        axis = _axis(rng, ndim)
        keepdims = bool(rng.random() < 0.3)
        for name in ("sum", "mean", "max", "min"):
            kw = {"axis": axis, "keepdims": keepdims}
            cases.append(Case(name, getattr(ops, name), getattr(np, name), (x,), kw))
        kw = {"axis": axis, "keepdims": keepdims, "ddof": int(rng.integers(0, 3))}
        cases.append(Case("var", ops.var, np.var, (x,), kw))
        one = None if isinstance(axis, tuple) else axis
        for name in ("argmax", "argmin"):
            kw = {"axis": one, "keepdims": keepdims}
            cases.append(Case(name, getattr(ops, name), getattr(np, name), (x,), kw))
        if ndim:
            cases.append(Case("flip", ops.flip, np.flip, (x, axis)))
            a = int(rng.integers(-ndim, ndim))
            ios: Any = int(rng.integers(1, 4)) if rng.random() < 0.5 else [1]
            cases.append(Case("split", ops.split, _split, (x, ios, a)))
            if np.asarray(x).size:  # (an empty slice: ops gives an empty softmax on purpose)
                for name in ("softmax", "log_softmax"):
                    cases.append(Case(name, getattr(ops, name), _softmax(name), (x, one)))
        perm = tuple(int(a) for a in rng.permutation(ndim)) if rng.random() < 0.7 else None
        cases.append(Case("transpose", ops.transpose, np.transpose, (x, perm)))
        size = int(np.size(x))
        shapes: list[Any] = [(size,), (-1,), (1, size), (size, 1, -1), (2, -1), (0, -1), size]
        new = shapes[rng.integers(len(shapes))]
        cases.append(Case("reshape", ops.reshape, np.reshape, (x, new)))
        dtype = DTYPES[rng.integers(len(DTYPES))]
        cases.append(Case("astype", ops.astype, lambda v, d: np.asarray(v).astype(d), (x, dtype)))
        items = [x, _array(rng, np.shape(x), DTYPES[rng.integers(len(DTYPES))])]
        join = None if rng.random() < 0.2 else int(rng.integers(-ndim - 1, ndim + 1))
        kw = {"axis": join}
        cases.append(Case("concatenate", ops.concatenate, np.concatenate, (items,), kw))
        cases.append(Case("stack", ops.stack, np.stack, (items,), {"axis": join or 0}))
    return cases


def _softmax(name: str) -> Callable[..., Any]:
    def ref(x: Any, axis: Any) -> Any:
        a = np.asarray(x)
        if a.dtype.kind != "f":
            raise TypeError("not floating")
        axis = tuple(range(a.ndim)) if axis is None else axis  # (None: all axes, like scipy)
        w = a.astype(np.float32) if a.dtype.itemsize < 4 else a
        shifted = w - np.max(w, axis=axis, keepdims=True)
        total = np.sum(np.exp(shifted), axis=axis, keepdims=True)
        out = np.exp(shifted) / total if name == "softmax" else shifted - np.log(total)
        return np.asarray(out).astype(a.dtype)

    return ref


def _known_deviation(case: Case) -> bool:
    """The refusal docs/ops.md states: a reduction of a 0-d input along an axis."""
    reduction = case.name in ("sum", "mean", "max", "min", "var")
    return reduction and not np.ndim(case.args[0]) and case.kwargs["axis"] is not None


def _numpy(case: Case) -> tuple[Any, BaseException | None]:
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return case.ref(*case.args, **case.kwargs), None
    except Exception as exc:
        return None, exc


def _compare(case: Case, got: Any, expected: Any, spec: Any) -> None:
    if isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected), case
        for g, e, s in zip(got, expected, spec, strict=True):
            _compare(case, g, e, s)
        return
    g, e = np.asarray(got), np.asarray(expected)
    assert (g.shape, g.dtype) == (spec.shape, spec.dtype), (case, spec)
    assert (g.shape, g.dtype) == (e.shape, e.dtype), (case, g.dtype, e.dtype, g.shape, e.shape)
    if e.dtype.kind in "fc":
        bits = e.dtype.itemsize // (2 if e.dtype.kind == "c" else 1)
        tol = {2: 1e-2, 4: 1e-5, 8: 1e-12}[bits]
        close = np.isclose(g, e, rtol=tol, atol=tol, equal_nan=True)
        # (NaN+infj and inf+NaNj are the same complex infinity to different loops)
        ok = close | (np.isnan(g) & np.isnan(e)) | (np.isinf(g) & np.isinf(e))
        assert ok.all(), f"{case.name}{case.args!r}: {g} != {e}"
    else:
        np.testing.assert_array_equal(g, e, err_msg=f"{case.name}{case.args!r}")


def _spec(out: Any) -> Any:
    return tuple(t.spec for t in out) if isinstance(out, tuple) else out.spec


def _value(out: Any) -> Any:
    return tuple(t.result() for t in out) if isinstance(out, tuple) else out.result()


def check_eagerly(cases: list[Case]) -> None:
    """Each case outside a runtime: numpy's error as a DataflowError, or numpy's value."""
    for case in cases:
        if _known_deviation(case):
            continue
        expected, error = _numpy(case)
        if error is not None:
            with pytest.raises(DataflowError):
                case.op(*case.args, **case.kwargs)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
            out = case.op(*case.args, **case.kwargs)
        _compare(case, _value(out), expected, _spec(out))


def _late_kernel(x: Any) -> Any:
    time.sleep(0.0002)
    return x[()] if type(x) is np.ndarray and x.ndim == 0 else x


_late = ops.define(
    "late_copy",
    _late_kernel,
    ops.spec_of,
    cost=lambda x: dataflow.Cost(1e12, 0),
    inline=False,  # on the pool, so the op that reads it is called while it is pending
)


def _pending(arg: Any) -> Any:
    if type(arg) is np.ndarray:
        return _late(arg)
    if type(arg) is list and arg and all(type(a) is np.ndarray for a in arg):
        return [_late(a) for a in arg]
    return arg


def check_in_a_runtime(cases: list[Case]) -> None:
    """Each case in one runtime with its arrays as pending Tensors: numpy's error at the
    call (never at await), or numpy's value."""

    async def main() -> None:
        for case in cases:
            if _known_deviation(case):
                continue
            expected, error = _numpy(case)
            args = tuple(_pending(a) for a in case.args)
            if error is not None:
                with pytest.raises(DataflowError):
                    case.op(*args, **case.kwargs)
                continue
            out = case.op(*args, **case.kwargs)
            got = tuple([await t for t in out]) if isinstance(out, tuple) else await out
            _compare(case, got, expected, _spec(out))

    # (astype from complex to real warns, numpy's ComplexWarning: not an error here.)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
        dataflow.run(main, interop_threads=2)


class TestElementwise:
    @pytest.mark.parametrize("seed", [0, 1])
    def test_eagerly(self, seed: int) -> None:
        """Random operands: numpy's values and dtypes, or a DataflowError where numpy raises."""
        check_eagerly(elementwise_cases(seed, 300))

    def test_in_a_runtime_with_pending_inputs(self) -> None:
        """The same with every array argument a pending Tensor (0-d ones numpy scalars)."""
        check_in_a_runtime(elementwise_cases(2, 150))


class TestReductionsAndShapes:
    @pytest.mark.parametrize("seed", [0, 1])
    def test_eagerly(self, seed: int) -> None:
        """Random axes, keepdims, ddof, permutations, shapes, dtypes and joins."""
        check_eagerly(reduction_and_shape_cases(seed, 150))

    def test_in_a_runtime_with_pending_inputs(self) -> None:
        """The same with every array argument a pending Tensor."""
        check_in_a_runtime(reduction_and_shape_cases(2, 80))


class TestRecurrentAgainstTorch:
    def test_random_configurations(self) -> None:
        """LSTM, GRU and Linear with torch's weights give torch's outputs and final states for
        random sizes (hidden 1, 3, 7; batch 1; one step), layers, directions, layouts,
        granularities and dtypes, with strided inputs, given or zero initial states, as
        arrays or pending Tensors."""
        torch = pytest.importorskip("torch")
        rng = np.random.default_rng(0)

        def strided(a: np.ndarray) -> np.ndarray:
            kind = rng.integers(3)
            if kind == 0:
                return np.asfortranarray(a)
            if kind == 1:
                return np.ascontiguousarray(a[::-1])[::-1]  # negative strides
            return a

        async def main() -> None:
            for _ in range(30):
                mode = str(rng.choice(["LSTM", "GRU"]))
                layers, bidir, first = (
                    int(rng.integers(1, 4)),
                    bool(rng.random() < 0.5),
                    bool(rng.random() < 0.5),
                )
                hidden, batch = int(rng.choice([1, 3, 7, 20])), int(rng.choice([1, 2, 5]))
                steps, inputs = int(rng.choice([1, 2, 5])), int(rng.choice([1, 4]))
                dt = np.float64 if rng.random() < 0.4 else np.float32
                granularity = str(rng.choice(["auto", "sequence", "step"]))
                theirs = getattr(torch.nn, mode)(
                    inputs, hidden, layers, batch_first=first, bidirectional=bidir,
                    dtype=torch.float64 if dt == np.float64 else torch.float32,
                )  # fmt: skip
                ours = getattr(ops.nn, mode)(
                    inputs, hidden, layers, batch_first=first, bidirectional=bidir, dtype=dt,
                    granularity=granularity,
                )  # fmt: skip
                ours.load_state_dict(
                    {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
                )
                x = rng.standard_normal((batch, steps, inputs) if first else (steps, batch, inputs))
                x = x.astype(dt)
                states = (layers * (2 if bidir else 1), batch, hidden)
                h0 = rng.standard_normal(states).astype(dt) if rng.random() < 0.5 else None
                c0 = None if h0 is None else rng.standard_normal(states).astype(dt)
                with torch.no_grad():
                    tx = torch.from_numpy(x)
                    if h0 is None:
                        expected = theirs(tx)
                    elif mode == "LSTM":
                        expected = theirs(tx, (torch.from_numpy(h0), torch.from_numpy(c0)))
                    else:
                        expected = theirs(tx, torch.from_numpy(h0))
                xi: Any = strided(x) if rng.random() < 0.5 else ops.multiply(x, 1.0)
                hi: Any = None if h0 is None else ops.add(strided(h0), 0.0)
                ci: Any = None if c0 is None else strided(c0)
                if mode == "LSTM":
                    out, (h_n, c_n) = await ours(xi, None if h0 is None else (hi, ci))
                    pairs = [(out, expected[0]), (h_n, expected[1][0]), (c_n, expected[1][1])]
                else:
                    out, h_n = await ours(xi, hi)
                    pairs = [(out, expected[0]), (h_n, expected[1])]
                tol = 1e-5 if dt == np.float32 else 1e-10
                for got, want in pairs:
                    assert got.dtype == dt and got.shape == tuple(want.shape)
                    np.testing.assert_allclose(got, want.numpy(), rtol=tol, atol=tol)
                linear = torch.nn.Linear(inputs, hidden, bias=bool(rng.random() < 0.7))
                fc = ops.nn.Linear(inputs, hidden, bias=linear.bias is not None)
                fc.load_state_dict({k: v.numpy() for k, v in linear.state_dict().items()})
                x32 = strided(x.astype(np.float32))
                with torch.no_grad():
                    want_fc = linear(torch.from_numpy(np.ascontiguousarray(x32))).numpy()
                np.testing.assert_allclose(await fc(x32), want_fc, rtol=1e-5, atol=1e-6)

        dataflow.run(main, interop_threads=2)
