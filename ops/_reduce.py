"""Reductions: ``sum``, ``mean``, ``var``, ``max``, ``min`` over ``axis=None | int | tuple``, and
``argmax``/``argmin`` over ``axis=None | int``.

Shapes and dtypes follow numpy: ``axis=None`` reduces every axis, ``keepdims=True`` keeps the
reduced axes with length 1, ``sum`` of bool/small ints accumulates in the platform integer,
``mean``/``var`` of integers are float64 and ``var`` of complex is real. ``max``/``min`` over an
axis of length 0 has no identity and is refused at the call (numpy raises in the kernel), and
so is ``argmax``/``argmin`` of an empty axis. ``argmax``/``argmin`` give ``np.intp`` indices
(flat indices for ``axis=None``); the first of equal values wins, and NaN counts as the largest
and the smallest value (numpy's rule, and torch's).

Zero-size means: where numpy warns ("Mean of empty slice", "Degrees of freedom <= 0") and
returns NaN or inf, these kernels return the same values without the warning, so an empty
slice does not fail the task when warnings are errors.

Cost: ``flops`` about the input size (3x for ``var``), ``bytes = input + output``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from dataflow import Cost, Op, OpInputError, OpTypeError

from ._checks import (
    check_lone_int,
    dtype_of,
    normalize_axes,
    normalize_axis,
    operand,
    quiet,
    shape_of,
    size_of,
)
from ._tensor import Tensor, TensorSpec, declare

__all__ = ["argmax", "argmin", "max", "mean", "min", "sum", "var"]

_NAMES = {"max": "maximum", "min": "minimum"}


@functools.cache
def _result_dtype(kind: str, dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype numpy's reduction gives for this input dtype (probed once per dtype)."""
    probe = np.zeros(2, dtype)
    fn: Callable[..., Any] = getattr(np, kind)  # np.sum, np.mean, np.var, np.max, np.min
    return np.asarray(fn(probe)).dtype


def _reduced_shape(
    name: str, shape: tuple[int, ...], axis: Any, keepdims: Any
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(output shape, reduced axes), validating ``axis`` and ``keepdims``."""
    if not isinstance(keepdims, (bool, np.bool_)):
        raise OpTypeError(f"{name}: keepdims must be a bool, got {type(keepdims).__name__}")
    axes = normalize_axes(name, axis, len(shape))
    if keepdims:
        out = tuple(1 if i in axes else d for i, d in enumerate(shape))
    else:
        out = tuple(d for i, d in enumerate(shape) if i not in axes)
    return out, axes


def _check(kind: str, x: Any, axis: Any, keepdims: Any) -> TensorSpec:
    shape, key = operand(kind, 1, x)
    check_lone_int(kind, 1, x, key)
    out, axes = _reduced_shape(kind, shape, axis, keepdims)
    if kind in _NAMES:
        empty = [a for a in axes if shape[a] == 0]
        if empty:
            raise OpInputError(
                f"{kind}: cannot take the {_NAMES[kind]} over axis {empty[0]} of length 0 "
                f"(input shape {shape}): a zero-size reduction has no identity; check why "
                "the input is empty (ops.sum accepts empty inputs)"
            )
    return TensorSpec(out, _result_dtype(kind, dtype_of(key)))


def _meta(kind: str) -> Any:
    def meta(x: Any, axis: Any = None, keepdims: Any = False) -> TensorSpec:
        return _check(kind, x, axis, keepdims)

    return meta


def _var_meta(x: Any, axis: Any = None, keepdims: Any = False, ddof: Any = 0) -> TensorSpec:
    if not isinstance(ddof, (int, np.integer)) or isinstance(ddof, (bool, np.bool_)):
        raise OpTypeError(f"var: ddof must be an int, got {type(ddof).__name__}")
    return _check("var", x, axis, keepdims)


def _cost(factor: float) -> Any:
    def cost(x: Any, axis: Any = None, keepdims: Any = False, ddof: Any = 0) -> Cost:
        shape = shape_of(x)
        n = size_of(shape)
        itemsize = x.dtype.itemsize if isinstance(x, (Tensor, np.ndarray)) else 8
        if axis is None:
            m = 1
        else:
            axes = axis if type(axis) is tuple else (axis,)
            m = n
            for a in axes:
                m = m // shape[a] if shape[a] else 0
        return Cost(float(factor * n), float((n + m) * itemsize))

    return cost


def _count(shape: tuple[int, ...], axis: Any) -> int:
    """How many elements each output element reduces over."""
    if axis is None:
        return size_of(shape)
    axes = axis if type(axis) is tuple else (axis,)
    n = 1
    for a in axes:
        n *= shape[a]
    return n


def _sum_kernel(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    return np.sum(x, axis=axis, keepdims=keepdims)


def _mean_kernel(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    x = np.asarray(x)
    if _count(x.shape, axis) == 0:
        # numpy warns "Mean of empty slice" and returns NaN: the same NaN, without the warning.
        dtype = _result_dtype("mean", x.dtype)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.true_divide(np.sum(x, axis=axis, keepdims=keepdims, dtype=dtype), 0)
    return np.mean(x, axis=axis, keepdims=keepdims)


def _var_kernel(x: Any, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Any:
    x = np.asarray(x)
    dof = _count(x.shape, axis) - ddof
    if dof > 0:
        return np.var(x, axis=axis, keepdims=keepdims, ddof=ddof)
    # numpy warns "Degrees of freedom <= 0" and divides by max(dof, 0): same values, no warning.
    dtype = _result_dtype("var", x.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.mean(x, axis=axis, keepdims=True) if x.size else np.sum(x, axis, keepdims=True)
        dev = np.abs(x - mean) ** 2
        total = np.sum(dev, axis=axis, keepdims=keepdims, dtype=dtype)
        return np.true_divide(total, dof if dof > 0 else 0)


def _max_kernel(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    return np.max(x, axis=axis, keepdims=keepdims)


def _min_kernel(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    return np.min(x, axis=axis, keepdims=keepdims)


def _declare(kind: str, kernel: Any, factor: float, doc: str) -> Op[..., Tensor]:
    meta = _var_meta if kind == "var" else _meta(kind)
    op = declare(kind, quiet(kernel), meta, _cost(factor))
    op.__doc__ = doc
    return op


sum: Op[..., Tensor] = _declare(  # numpy's names; this module must not use the builtins below
    "sum",
    _sum_kernel,
    1,
    "``sum(x, axis=None, keepdims=False)``: sum over the given axes (``np.sum``).",
)
mean: Op[..., Tensor] = _declare(
    "mean",
    _mean_kernel,
    1,
    "``mean(x, axis=None, keepdims=False)``: arithmetic mean; NaN for an empty slice.",
)
var: Op[..., Tensor] = _declare(
    "var",
    _var_kernel,
    3,
    "``var(x, axis=None, keepdims=False, ddof=0)``: variance (``np.var``).",
)
max: Op[..., Tensor] = _declare(
    "max",
    _max_kernel,
    1,
    "``max(x, axis=None, keepdims=False)``: maximum; NaN propagates (``np.max``).",
)
min: Op[..., Tensor] = _declare(
    "min",
    _min_kernel,
    1,
    "``min(x, axis=None, keepdims=False)``: minimum; NaN propagates (``np.min``).",
)


# -- argmax / argmin -------------------------------------------------------------------------

_INTP = np.dtype(np.intp)


def _arg_meta(kind: str) -> Any:
    def meta(x: Any, axis: Any = None, keepdims: Any = False) -> TensorSpec:
        shape, _ = operand(kind, 1, x)
        if not isinstance(keepdims, (bool, np.bool_)):
            raise OpTypeError(f"{kind}: keepdims must be a bool, got {type(keepdims).__name__}")
        if axis is None:
            if not size_of(shape):
                raise OpInputError(
                    f"{kind}: the input of shape {shape} is empty, so it has no {kind}: check "
                    "why it is empty"
                )
            return TensorSpec((1,) * len(shape) if keepdims else (), _INTP)
        if type(axis) is tuple:
            raise OpTypeError(
                f"{kind}: axis must be None or an int (one axis, like np.{kind}), got {axis!r}; "
                "reshape to merge axes first"
            )
        if not shape:
            # numpy reads a 0-d input as one element: axis 0 and -1 are valid.
            normalize_axis(kind, axis, 1)
            return TensorSpec((), _INTP)
        ax = normalize_axis(kind, axis, len(shape))
        if not shape[ax]:
            raise OpInputError(
                f"{kind}: axis {ax} of the input of shape {shape} has length 0, so it has no "
                f"{kind}: check why it is empty"
            )
        if keepdims:
            return TensorSpec((*shape[:ax], 1, *shape[ax + 1 :]), _INTP)
        return TensorSpec((*shape[:ax], *shape[ax + 1 :]), _INTP)

    return meta


def _arg_cost(x: Any, axis: Any = None, keepdims: Any = False) -> Cost:
    shape = shape_of(x)
    n = size_of(shape)
    itemsize = x.dtype.itemsize if isinstance(x, (Tensor, np.ndarray)) else 8
    m = 1 if axis is None or not shape else n // shape[axis]
    return Cost(float(n), float(n * itemsize + m * _INTP.itemsize))


def _argmax_kernel(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    return np.argmax(x, axis=axis, keepdims=bool(keepdims))


def _argmin_kernel(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    return np.argmin(x, axis=axis, keepdims=bool(keepdims))


argmax: Op[..., Tensor] = declare("argmax", _argmax_kernel, _arg_meta("argmax"), _arg_cost)
argmax.__doc__ = (
    "``argmax(x, axis=None, keepdims=False)``: index of the largest value (``np.argmax``); "
    "the first wins, NaN counts as largest; ``np.intp`` indices, flat for ``axis=None``."
)
argmin: Op[..., Tensor] = declare("argmin", _argmin_kernel, _arg_meta("argmin"), _arg_cost)
argmin.__doc__ = (
    "``argmin(x, axis=None, keepdims=False)``: index of the smallest value (``np.argmin``); "
    "the first wins, NaN counts as smallest; ``np.intp`` indices, flat for ``axis=None``."
)
