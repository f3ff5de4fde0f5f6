"""``softmax`` and ``log_softmax`` over ``axis`` (default -1, like torch), numerically stable.

Both subtract the maximum along the axis before ``exp`` (``softmax(x) = softmax(x - max)``), so
large inputs never overflow: ``softmax([1000, 1000])`` is ``[0.5, 0.5]``, not NaN. They take
floating inputs only (float16, float32, float64), like ``torch.softmax``: an integer input has
no natural output dtype, so it is refused with the conversion to write. float16 is computed in
float32 and rounded once at the end (as torch does on the CPU).

``axis`` is an int, a tuple of ints (the softmax runs over those axes together) or None (all
axes, scipy's ``softmax(x, axis=None)``). An empty input gives an empty output. Special values
follow torch: a ``-inf`` entry gets probability 0, a slice of only ``-inf`` (or with ``+inf`` or
NaN) gives NaN.

Cost: about 8 flops per element (max, subtract, exp, sum, divide), ``bytes = input + output``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dataflow import Cost, Op, OpTypeError

from ._checks import dtype_of, normalize_axes, operand, quiet, shape_of, size_of
from ._tensor import Tensor, TensorSpec, declare

__all__ = ["log_softmax", "softmax"]

_FLOAT32 = np.dtype(np.float32)


def _meta(name: str) -> Any:
    def meta(x: Any, axis: Any = -1) -> TensorSpec:
        shape, key = operand(name, 1, x)
        dtype = dtype_of(key)
        if dtype.kind != "f":
            raise OpTypeError(
                f"{name}: argument 1 has dtype {dtype}: expected a floating dtype (float16, "
                "float32 or float64); convert it first, e.g. x.astype(np.float32)"
            )
        # A 0-d input is one element (torch's rule): axis 0 and -1 name it.
        normalize_axes(name, axis, len(shape) or 1)
        return TensorSpec(shape, dtype)

    return meta


def _cost(x: Any, axis: Any = -1) -> Cost:
    n = size_of(shape_of(x))
    itemsize = x.dtype.itemsize if isinstance(x, (Tensor, np.ndarray)) else 8
    return Cost(8.0 * n, 2.0 * n * itemsize)


def _shifted(a: np.ndarray, axis: Any) -> tuple[np.ndarray, np.dtype[Any]]:
    """(a - max(a, axis), the dtype to return), in float32 for float16 input."""
    dtype = a.dtype
    if dtype.itemsize < 4:
        a = a.astype(_FLOAT32)
    # A slice of only -inf has max -inf, and -inf - -inf is NaN: the NaN torch gives too.
    out: np.ndarray = np.subtract(a, a.max(axis=axis, keepdims=True))
    return out, dtype


def _softmax_kernel(x: Any, axis: Any = -1) -> Any:
    a = np.asarray(x)
    if not a.ndim:  # one element; numpy's ufuncs would give scalars, not 0-d arrays
        return _softmax_kernel(a.reshape(1), 0).reshape(())
    if not a.size:
        return np.empty(a.shape, a.dtype)
    out, dtype = _shifted(a, axis)
    np.exp(out, out=out)
    out /= out.sum(axis=axis, keepdims=True)
    return out if out.dtype == dtype else out.astype(dtype)


def _log_softmax_kernel(x: Any, axis: Any = -1) -> Any:
    a = np.asarray(x)
    if not a.ndim:  # one element; numpy's ufuncs would give scalars, not 0-d arrays
        return _log_softmax_kernel(a.reshape(1), 0).reshape(())
    if not a.size:
        return np.empty(a.shape, a.dtype)
    out, dtype = _shifted(a, axis)
    out -= np.log(np.exp(out).sum(axis=axis, keepdims=True))
    return out if out.dtype == dtype else out.astype(dtype)


softmax: Op[..., Tensor] = declare("softmax", quiet(_softmax_kernel), _meta("softmax"), _cost)
softmax.__doc__ = (
    "``softmax(x, axis=-1)``: ``exp(x) / sum(exp(x), axis)``, computed stably (the maximum "
    "is subtracted first); floating input only, like ``torch.softmax``."
)
log_softmax: Op[..., Tensor] = declare(
    "log_softmax", quiet(_log_softmax_kernel), _meta("log_softmax"), _cost
)
log_softmax.__doc__ = (
    "``log_softmax(x, axis=-1)``: ``x - logsumexp(x, axis)``, computed stably; more accurate "
    "than ``log(softmax(x))`` for very negative entries (like ``torch.log_softmax``)."
)
