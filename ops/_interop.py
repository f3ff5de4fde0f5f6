"""numpy's dispatch protocols for Tensors: which ufunc or function becomes which op.

``Tensor.__array_ufunc__`` looks ufuncs up in :data:`UFUNCS`, ``Tensor.__array_function__``
looks functions up in :data:`FUNCTIONS`. Each adapter takes numpy's signature and returns
NotImplemented for what the op does not do (``out=``, ``dtype=``, ``where=``, ``order="F"``),
so numpy raises its usual TypeError instead of blocking on a pending value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dataflow import Op

from . import _elementwise as e
from . import _linalg, _reduce, _shape
from ._tensor import Tensor

__all__ = ["FUNCTIONS", "UFUNCS"]

UFUNCS: dict[np.ufunc, Op[..., Tensor]] = {
    np.add: e.add,
    np.subtract: e.subtract,
    np.multiply: e.multiply,
    np.true_divide: e.divide,
    np.negative: e.negative,
    np.exp: e.exp,
    np.log: e.log,
    np.tanh: e.tanh,
    np.maximum: e.maximum,
    np.minimum: e.minimum,
    np.matmul: _linalg.matmul,
    np.greater: e.greater,
    np.less: e.less,
    np.equal: e.equal,
    np.not_equal: e.not_equal,
    np.greater_equal: e.greater_equal,
    np.less_equal: e.less_equal,
}


def _concatenate(
    arrays: Any, axis: Any = 0, out: Any = None, *, dtype: Any = None, casting: Any = None
) -> Any:
    if out is not None or dtype is not None or casting not in (None, "same_kind"):
        return NotImplemented
    return _shape.concatenate(arrays, axis)


def _stack(
    arrays: Any, axis: Any = 0, out: Any = None, *, dtype: Any = None, casting: Any = None
) -> Any:
    if out is not None or dtype is not None or casting not in (None, "same_kind"):
        return NotImplemented
    return _shape.stack(arrays, axis)


def _reduction(op: Op[..., Tensor]) -> Any:
    def adapter(
        a: Any, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: Any = False,
        **unsupported: Any,
    ) -> Any:  # fmt: skip
        if dtype is not None or out is not None or unsupported:
            return NotImplemented
        return op(a, axis, bool(keepdims))

    return adapter


def _extremum(op: Op[..., Tensor]) -> Any:
    def adapter(
        a: Any, axis: Any = None, out: Any = None, keepdims: Any = False, **unsupported: Any
    ) -> Any:
        if out is not None or unsupported:
            return NotImplemented
        return op(a, axis, bool(keepdims))

    return adapter


def _var(
    a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: Any = 0,
    keepdims: Any = False, **unsupported: Any,
) -> Any:  # fmt: skip
    if dtype is not None or out is not None or unsupported:
        return NotImplemented
    return _reduce.var(a, axis, bool(keepdims), ddof)


def _reshape(
    a: Any, shape: Any = None, order: str = "C", *, newshape: Any = None, copy: Any = None
) -> Any:
    if order != "C" or copy is not None:
        return NotImplemented
    return _shape.reshape(a, newshape if shape is None else shape)


def _transpose(a: Any, axes: Any = None) -> Any:
    return _shape.transpose(a, axes)


def _where(condition: Any, *xy: Any) -> Any:
    if len(xy) != 2:
        return NotImplemented  # np.where(cond) alone: a data-dependent shape
    return e.where(condition, *xy)


def _flip(m: Any, axis: Any = None) -> Any:
    return _shape.flip(m, axis)


def _split(ary: Any, indices_or_sections: Any, axis: Any = 0) -> Any:
    return _shape.split(ary, indices_or_sections, axis)


def _np_shape(a: Any) -> Any:
    return a.shape if isinstance(a, Tensor) else np.shape(a)


def _np_ndim(a: Any) -> Any:
    return a.ndim if isinstance(a, Tensor) else np.ndim(a)


def _np_size(a: Any, axis: Any = None) -> Any:
    if not isinstance(a, Tensor):
        return np.size(a, axis)
    return a.size if axis is None else a.shape[axis]


FUNCTIONS: dict[Any, Any] = {
    np.concatenate: _concatenate,
    np.stack: _stack,
    np.sum: _reduction(_reduce.sum),
    np.mean: _reduction(_reduce.mean),
    np.var: _var,
    np.max: _extremum(_reduce.max),
    np.amax: _extremum(_reduce.max),
    np.min: _extremum(_reduce.min),
    np.amin: _extremum(_reduce.min),
    np.reshape: _reshape,
    np.transpose: _transpose,
    np.where: _where,
    np.flip: _flip,
    np.split: _split,
    np.shape: _np_shape,
    np.ndim: _np_ndim,
    np.size: _np_size,
}
