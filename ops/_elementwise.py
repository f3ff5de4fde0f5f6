"""Elementwise ops: arithmetic, activations, comparisons and ``where``, with numpy broadcasting.

Every op here is a numpy ufunc (or a short chain of them) applied to broadcast operands. The
output dtype is the one numpy's ufunc picks (``ufunc.resolve_dtypes``, cached per dtype
combination), so ``int / int`` is float64, ``exp(int8)`` is float16 and ``float32 * 2.0`` stays
float32 (NEP 50: Python scalars are weak). The output shape is the operands' shape when they
agree (the common case, with no broadcasting work) and their broadcast shape otherwise.

Cost: ``flops = output size x a per-element factor`` (1 for arithmetic, more for
transcendental functions), ``bytes = input bytes + output bytes``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from dataflow import Cost, Op, OpInputError, OpTypeError

from ._checks import (
    WEAK_VALUE,
    DtypeKey,
    broadcast_shapes,
    check_int_scalar,
    check_lone_int,
    check_output_size,
    dtype_of,
    int_bounds,
    operand,
    quiet,
    shape_of,
    size_of,
    ufunc_dtypes,
    weak_result_type,
)
from ._tensor import Tensor, TensorSpec, declare

__all__ = [
    "abs",
    "add",
    "clip",
    "cos",
    "divide",
    "equal",
    "exp",
    "greater",
    "greater_equal",
    "less",
    "less_equal",
    "log",
    "maximum",
    "minimum",
    "multiply",
    "negative",
    "not_equal",
    "power",
    "relu",
    "sigmoid",
    "sin",
    "sqrt",
    "square",
    "subtract",
    "tanh",
    "where",
]


_SCALARS = (int, float, complex, bool)


def _info(x: Any) -> tuple[tuple[int, ...], int, int]:
    """(shape, bytes, itemsize) of an operand the meta rule accepted (scalars cost nothing)."""
    if isinstance(x, (Tensor, np.ndarray)):
        itemsize = x.dtype.itemsize
        return x.shape, size_of(x.shape) * itemsize, itemsize
    if type(x) in _SCALARS:
        return (), 0, 8
    return shape_of(x), 0, 8


def _out_size(sx: tuple[int, ...], sy: tuple[int, ...]) -> int:
    if sx == sy or not sy:
        return size_of(sx)
    if not sx:
        return size_of(sy)
    return size_of(broadcast_shapes("", sx, sy))


# -- binary ------------------------------------------------------------------------------


def _binary(
    name: str, ufunc: np.ufunc, doc: str, *, compare: bool = False, factor: float = 1.0
) -> Op[..., Tensor]:
    """Declare ``name(x, y)``: the ufunc with broadcasting and numpy's dtype rules
    (``factor``: flops per output element)."""

    # Positional-only, like the ufunc: ops.add(x, y=1) fails here, at the call (the kernel,
    # the ufunc itself, would refuse the keyword only when it runs).
    def meta(x: Any, y: Any, /) -> TensorSpec:
        sx, kx = operand(name, 1, x)
        sy, ky = operand(name, 2, y)
        dtypes = ufunc_dtypes(name, ufunc, (kx, ky))
        if not compare:
            # numpy raises OverflowError for int8_array + 1000; say so here, at the call.
            if kx is int:
                check_int_scalar(name, 1, x, dtypes[0])
            if ky is int:
                check_int_scalar(name, 2, y, dtypes[1])
        out = dtypes[-1]
        # Equal shapes or a scalar operand: no broadcasting work, and no bigger output.
        if sx == sy or not sy:
            shape = sx
        elif not sx:
            shape = sy
        else:
            shape = broadcast_shapes(name, sx, sy)
            check_output_size(name, shape, out)
        if ufunc is np.power and out.kind in "iu" and 0 not in shape:
            _check_int_exponent(y)  # (numpy refuses in the loop: an empty output never runs it)
        return TensorSpec(shape, out)

    def cost(x: Any, y: Any, /) -> Cost:
        sx, bx, ix = _info(x)
        sy, by, iy = _info(y)
        n = _out_size(sx, sy)
        itemsize = 1 if compare else (ix if ix > iy else iy)
        return Cost(factor * n, float(bx + by + n * itemsize))

    kernel = ufunc if compare else quiet(ufunc)
    op = declare(name, kernel, meta, cost)
    op.__doc__ = doc
    return op


add: Op[..., Tensor] = _binary(
    "add", np.add, "``x + y`` elementwise, with broadcasting (``np.add``)."
)
subtract: Op[..., Tensor] = _binary(
    "subtract", np.subtract, "``x - y`` elementwise (``np.subtract``)."
)
multiply: Op[..., Tensor] = _binary(
    "multiply", np.multiply, "``x * y`` elementwise (``np.multiply``)."
)
divide: Op[..., Tensor] = _binary(
    "divide", np.true_divide, "``x / y`` elementwise; integers divide to float64 (``np.divide``)."
)
power: Op[..., Tensor] = _binary(
    "power",
    np.power,
    "``x ** y`` elementwise (``np.power``). Integers to a negative integer power are refused "
    "as numpy refuses them: at the call for a Python int exponent, when the kernel runs for "
    "an array's entries.",
    factor=8.0,
)


def _check_int_exponent(y: Any) -> None:
    """An integer power's Python int exponent must not be negative (numpy raises ValueError
    in the kernel). An array's entries are data: a negative one fails the kernel, as in numpy
    (the meta rule runs once per signature, which keys arrays by shape and dtype alone)."""
    if type(y) is int and y < 0:
        raise OpInputError(
            f"power: integers to negative integer powers are not allowed (as in numpy); got "
            f"exponent {y}: make the base a float (ops.astype(x, np.float64)) for negative "
            "powers"
        )


maximum: Op[..., Tensor] = _binary(
    "maximum", np.maximum, "Elementwise maximum; NaN wins (``np.maximum``)."
)
minimum: Op[..., Tensor] = _binary(
    "minimum", np.minimum, "Elementwise minimum; NaN wins (``np.minimum``)."
)
greater: Op[..., Tensor] = _binary(
    "greater", np.greater, "``x > y`` as a bool Tensor.", compare=True
)
less: Op[..., Tensor] = _binary("less", np.less, "``x < y`` as a bool Tensor.", compare=True)
equal: Op[..., Tensor] = _binary("equal", np.equal, "``x == y`` as a bool Tensor.", compare=True)
not_equal: Op[..., Tensor] = _binary(
    "not_equal", np.not_equal, "``x != y`` as a bool Tensor.", compare=True
)
greater_equal: Op[..., Tensor] = _binary(
    "greater_equal", np.greater_equal, "``x >= y`` as a bool Tensor.", compare=True
)
less_equal: Op[..., Tensor] = _binary(
    "less_equal", np.less_equal, "``x <= y`` as a bool Tensor.", compare=True
)


# -- unary -------------------------------------------------------------------------------


def _unary_meta(name: str, ufunc: np.ufunc) -> Any:
    def meta(x: Any, /) -> TensorSpec:  # positional-only, like the ufunc (see _binary)
        shape, key = operand(name, 1, x)
        check_lone_int(name, 1, x, key)
        return TensorSpec(shape, ufunc_dtypes(name, ufunc, (key,))[-1])

    return meta


def _unary_cost(factor: float) -> Any:
    def cost(x: Any) -> Cost:
        shape, nbytes, _ = _info(x)
        return Cost(float(factor * size_of(shape)), float(2 * nbytes))

    return cost


def _unary(name: str, ufunc: np.ufunc, factor: float, doc: str) -> Op[..., Tensor]:
    op = declare(name, quiet(ufunc), _unary_meta(name, ufunc), _unary_cost(factor))
    op.__doc__ = doc
    return op


negative: Op[..., Tensor] = _unary(
    "negative", np.negative, 1, "``-x`` elementwise (not for bool: numpy refuses)."
)
exp: Op[..., Tensor] = _unary(
    "exp", np.exp, 4, "``e**x`` elementwise; overflow gives inf like numpy."
)
log: Op[..., Tensor] = _unary(
    "log", np.log, 4, "Natural log; ``log(0) = -inf``, negative -> NaN, like numpy."
)
tanh: Op[..., Tensor] = _unary("tanh", np.tanh, 6, "Hyperbolic tangent elementwise.")
square: Op[..., Tensor] = _unary(
    "square", np.square, 1, "``x * x`` elementwise, dtype kept (``np.square``)."
)
sqrt: Op[..., Tensor] = _unary(
    "sqrt", np.sqrt, 2, "Square root; negative -> NaN, like numpy (``np.sqrt``)."
)
abs: Op[..., Tensor] = _unary(  # numpy's name; this module must not use the builtin below
    "abs", np.absolute, 1, "``|x|``; complex gives the real modulus (``np.abs``)."
)
sin: Op[..., Tensor] = _unary("sin", np.sin, 8, "Sine elementwise, in radians (``np.sin``).")
cos: Op[..., Tensor] = _unary("cos", np.cos, 8, "Cosine elementwise, in radians (``np.cos``).")


@functools.cache
def _float_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    return np.exp.resolve_dtypes((dtype, None))[-1]


def _sigmoid_kernel(x: Any) -> np.ndarray:
    a = np.asarray(x)
    dtype = _float_dtype(a.dtype)
    # One buffer, updated in place: -x, exp, +1, 1/ (four passes, no temporaries).
    out: np.ndarray = a.astype(dtype) if a.dtype != dtype else np.empty(a.shape, dtype)
    np.negative(out if a.dtype != dtype else a, out=out)
    # exp(-x) overflows to inf for very negative x, and 1 / inf = 0 is the right answer.
    with np.errstate(over="ignore"):
        np.exp(out, out=out)
    out += 1
    np.reciprocal(out, out=out)
    return out


def _sigmoid_meta(x: Any) -> TensorSpec:
    shape, key = operand("sigmoid", 1, x)
    check_lone_int("sigmoid", 1, x, key)
    return TensorSpec(shape, ufunc_dtypes("sigmoid", np.exp, (key,))[-1])


sigmoid: Op[..., Tensor] = declare("sigmoid", quiet(_sigmoid_kernel), _sigmoid_meta, _unary_cost(6))
sigmoid.__doc__ = "``1 / (1 + exp(-x))`` elementwise, in the dtype ``exp`` would give."


def _relu_kernel(x: Any) -> Any:
    return np.maximum(x, 0)


def _relu_meta(x: Any) -> TensorSpec:
    shape, key = operand("relu", 1, x)
    check_lone_int("relu", 1, x, key)
    dtype = dtype_of(key)
    if dtype.kind not in "iuf":
        raise OpTypeError(
            f"relu: argument 1 has dtype {dtype}: expected an integer or floating dtype"
        )
    return TensorSpec(shape, dtype)


relu: Op[..., Tensor] = declare("relu", _relu_kernel, _relu_meta, _unary_cost(1))
relu.__doc__ = "``max(x, 0)`` elementwise; NaN stays NaN (like ``torch.relu``)."


# -- where -------------------------------------------------------------------------------

# Python scalars enter np.result_type as values (weak, NEP 50); any value of the type will do.


@functools.cache
def _where_dtype(keys: tuple[DtypeKey, DtypeKey]) -> np.dtype[Any]:
    kx, ky = keys
    vx = WEAK_VALUE[kx] if isinstance(kx, type) else kx
    vy = WEAK_VALUE[ky] if isinstance(ky, type) else ky
    return np.result_type(vx, vy)


def _where_meta(condition: Any, x: Any, y: Any) -> TensorSpec:
    sc, _ = operand("where", 1, condition)
    sx, kx = operand("where", 2, x)
    sy, ky = operand("where", 3, y)
    dtype = _where_dtype((kx, ky))
    if dtype.kind in "iu":  # (numpy wraps a Python int into the integer result, up to uint64)
        check_lone_int("where", 2, x, kx, uint64=True)
        check_lone_int("where", 3, y, ky, uint64=True)
    if sc == sx == sy:
        return TensorSpec(sc, dtype)
    shape = broadcast_shapes("where", sc, sx, sy)
    check_output_size("where", shape, dtype)
    return TensorSpec(shape, dtype)


def _where_cost(condition: Any, x: Any, y: Any) -> Cost:
    sc, bc, _ = _info(condition)
    sx, bx, ix = _info(x)
    sy, by, iy = _info(y)
    n = size_of(sc) if sc == sx == sy else size_of(broadcast_shapes("", sc, sx, sy))
    return Cost(float(n), float(bc + bx + by + n * (ix if ix > iy else iy)))


def _where_kernel(condition: Any, x: Any, y: Any) -> Any:
    try:
        return np.where(condition, x, y)
    except RuntimeWarning:
        # quiet()'s rule, inline (no extra call): numpy's warning made an error, here a Python
        # int cast to float16 that overflows (where(c, 2**40, float16) is inf, as numpy's).
        with np.errstate(all="ignore"):
            return np.where(condition, x, y)


where: Op[..., Tensor] = declare("where", _where_kernel, _where_meta, _where_cost)
where.__doc__ = (
    "Elementwise ``x if condition else y`` with broadcasting (the three-argument "
    "``np.where``; the one-argument form has a data-dependent shape and is not an op)."
)


# -- clip --------------------------------------------------------------------------------


@functools.cache
def _clip_dtype(keys: tuple[DtypeKey, DtypeKey, DtypeKey]) -> np.dtype[Any]:
    # np.clip's ufunc promotes its three operands to one dtype, weak Python scalars included.
    return weak_result_type(keys)


def _clip_meta(x: Any, a_min: Any = None, a_max: Any = None) -> TensorSpec:
    sx, kx = operand("clip", 1, x)
    check_lone_int("clip", 1, x, kx)
    dx = dtype_of(kx)  # np.clip converts x first: a Python scalar x has its default dtype
    lo, hi = a_min, a_max
    if dx.kind in "iu":
        # numpy's rule (np.clip under NEP 50): a Python int bound beyond the integer dtype's
        # range clips nothing and is dropped.
        low, high = int_bounds(dx)
        if type(lo) is int and lo <= low:
            lo = None
        if type(hi) is int and hi >= high:
            hi = None
    if lo is None and hi is None:
        # numpy returns np.positive(x), a copy (and refuses bool: positive has no bool loop).
        return TensorSpec(sx, ufunc_dtypes("clip", np.positive, (dx,))[-1])
    shapes = [sx]
    keys: list[DtypeKey] = [dx]
    for label, bound in (("a_min", lo), ("a_max", hi)):
        if bound is not None:
            sb, kb = operand("clip", label, bound)
            shapes.append(sb)
            keys.append(kb)
    if len(keys) == 2:  # one-sided: numpy calls np.maximum(x, a_min) or np.minimum(x, a_max)
        ufunc = np.maximum if hi is None else np.minimum
        dtype = ufunc_dtypes("clip", ufunc, (dx, keys[1]))[-1]
    else:
        ufunc_dtypes("clip", np.maximum, (dx, keys[1]))  # refuses what has no loop (bool - ...)
        dtype = _clip_dtype((dx, keys[1], keys[2]))
    for label, bound in (("a_min", lo), ("a_max", hi)):
        if type(bound) is int:
            check_int_scalar("clip", label, bound, dtype)
    if shapes.count(sx) == len(shapes):
        return TensorSpec(sx, dtype)
    shape = broadcast_shapes("clip", *shapes)
    check_output_size("clip", shape, dtype)
    return TensorSpec(shape, dtype)


def _clip_cost(x: Any, a_min: Any = None, a_max: Any = None) -> Cost:
    sx, nbytes, itemsize = _info(x)
    shapes = [sx]
    for bound in (a_min, a_max):
        if bound is not None:
            sb, bb, _ = _info(bound)
            shapes.append(sb)
            nbytes += bb
    n = size_of(sx) if shapes.count(sx) == len(shapes) else size_of(broadcast_shapes("", *shapes))
    return Cost(2.0 * n, float(nbytes + n * itemsize))


def _clip_kernel(x: Any, a_min: Any = None, a_max: Any = None) -> Any:
    if a_min is None and a_max is None:
        return np.positive(x)  # what np.clip does (numpy < 2.1 refuses two None bounds)
    return np.clip(x, a_min, a_max)


clip: Op[..., Tensor] = declare("clip", quiet(_clip_kernel), _clip_meta, _clip_cost)
clip.__doc__ = (
    "``clip(x, a_min=None, a_max=None)``: ``x`` limited to ``[a_min, a_max]`` (``np.clip``); "
    "the bounds broadcast, either may be None, a NaN bound gives NaN."
)
