"""numpy's dispatch protocols for Tensors: which ufunc or function becomes which op.

``Tensor.__array_ufunc__`` looks plain ufunc calls up in :data:`UFUNCS`, and hands everything
else (keywords, ufunc methods, ufuncs without an op) to :func:`ufunc_fallback`.
``Tensor.__array_function__`` looks functions up in :data:`FUNCTIONS`; each adapter takes
numpy's own signature and maps it onto the op's.

Nothing here may block on a pending value, and nothing may silently drop what it was asked:
what the ops cannot do (``out=``, ``where=``, ``dtype=``, ``order="F"``, a function with no op)
raises an :class:`~dataflow.OpTypeError` (a TypeError) saying what is not supported and what
to write instead, in the caller's frame.
"""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np

from dataflow import Op, OpInputError, OpTypeError

from . import _elementwise as e
from . import _linalg, _reduce, _shape
from ._checks import normalize_axes
from ._tensor import Tensor

__all__ = ["FUNCTIONS", "UFUNCS", "function_fallback", "ufunc_fallback"]

UFUNCS: dict[np.ufunc, Op[..., Tensor]] = {
    np.add: e.add,
    np.subtract: e.subtract,
    np.multiply: e.multiply,
    np.true_divide: e.divide,  # np.divide is np.true_divide
    np.negative: e.negative,
    np.absolute: e.abs,  # np.abs is np.absolute
    np.sqrt: e.sqrt,
    np.square: e.square,
    np.power: e.power,
    np.exp: e.exp,
    np.log: e.log,
    np.sin: e.sin,
    np.cos: e.cos,
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

# "Not given": numpy passes on only the keywords the caller wrote.
_MISSING: Any = object()

# A keyword a ufunc call may carry with numpy's default value: dropped, the call goes ahead.
_UFUNC_DEFAULTS: dict[str, Any] = {
    "casting": "same_kind",
    "order": "K",
    "subok": True,
    "dtype": None,
    "signature": None,
}

# Why a keyword is refused, and what to write instead ({f} is the function's name).
_ADVICE = {
    "out": (
        "a Tensor's value is computed later, so nothing can be written into `out`: use the "
        "Tensor the call returns (`y = {f}(...)`)"
    ),
    "where": (
        "compute the whole result and select with ops.where(mask, result, other) (for a "
        "reduction, mask its input: ops.where(mask, t, 0))"
    ),
    "dtype": "convert the input first (`t.astype(np.float64)`) or the result",
    "signature": "convert the input first (`t.astype(np.float64)`) or the result",
    "initial": "combine the result with the initial value yourself (ops.maximum(r, initial))",
    "casting": "only numpy's default casting is supported: convert the input first",
    "order": "Tensors are C-ordered: leave `order` out",
    "subok": "ops compute on plain ndarrays only: leave `subok` out",
    "mean": "leave `mean` out (ops.var computes the mean itself)",
    "copy": "leave `copy` out",
    "device": 'Tensors live on the CPU: leave `device` out (or pass "cpu")',
}


def _fname(func: Any) -> str:
    module = getattr(func, "__module__", None) or "numpy"
    name = getattr(func, "__name__", repr(func))
    if module == "numpy" or module.startswith("numpy._"):
        return f"np.{name}"
    return f"{module.replace('numpy', 'np', 1)}.{name}"


def _show(value: Any) -> str:
    """A keyword's value, short: arrays by type, dtypes by name."""
    if type(value) is tuple and len(value) == 1:  # numpy passes out= as a tuple
        value = value[0]
    if isinstance(value, (str, bool, int, float, type(None))):
        return repr(value)
    if isinstance(value, (type, np.dtype)):
        try:
            return str(np.dtype(value))
        except TypeError:
            pass
    return f"<{type(value).__name__}>"


def _refuse(f: str, keyword: str, value: Any) -> NoReturn:
    advice = _ADVICE.get(keyword, "leave it out").format(f=f)
    raise OpTypeError(
        f"{f}(..., {keyword}={_show(value)}) is not supported on an ops.Tensor: {advice}"
    )


def _no_op(f: str, what: str) -> NoReturn:
    raise OpTypeError(
        f"{f} {what}, so it cannot run on an ops.Tensor (it would have to wait for the value): "
        f"`await` the Tensor first and call it on the array ({f}(await t)), use the ops "
        "listed in docs/ops.md, or declare an op with ops.define"
    )


# -- ufuncs ------------------------------------------------------------------------------------


def ufunc_fallback(
    ufunc: np.ufunc, method: str, inputs: tuple[Any, ...], kwargs: dict[str, Any]
) -> Tensor:
    """``__array_ufunc__`` beyond a plain call: default-valued keywords, or a clear refusal."""
    f = f"np.{ufunc.__name__}"
    if method != "__call__":
        hint = {
            "add": "np.sum(t, axis=0) or ops.sum",
            "maximum": "np.max(t, axis=0) or ops.max",
            "minimum": "np.min(t, axis=0) or ops.min",
        }.get(ufunc.__name__)
        raise OpTypeError(
            f"{f}.{method} is not supported on an ops.Tensor (ufunc methods have no ops)"
            + (f": use {hint}" if hint and method == "reduce" else ": `await` the Tensor first")
        )
    op = UFUNCS.get(ufunc)
    if op is None:
        _no_op(f, "has no op in ops")
    for key, value in kwargs.items():
        if key == "where" and value is True:
            continue
        default = _UFUNC_DEFAULTS.get(key, _MISSING)
        if default is _MISSING or (value is not default and value != default):
            _refuse(f, key, value)
    return op(*inputs)


# -- array functions ---------------------------------------------------------------------------


def _check_keywords(f: str, **given: Any) -> None:
    """Refuse each keyword that was given a value other than its harmless default."""
    for key, value in given.items():
        if value is _MISSING or value is None:
            continue
        if key == "casting" and value == "same_kind":
            continue
        if key == "where" and value is True:
            continue
        if key == "copy" and value is True:
            continue
        if key == "device" and value == "cpu":
            continue
        _refuse(f, key, value)


def _keepdims(value: Any) -> Any:
    return False if value is _MISSING else value


def _concatenate(
    arrays: Any, axis: Any = 0, out: Any = None, *, dtype: Any = None, casting: Any = None
) -> Tensor:
    _check_keywords("np.concatenate", out=out, dtype=dtype, casting=casting)
    return _shape.concatenate(arrays, axis)


def _stack(
    arrays: Any, axis: Any = 0, out: Any = None, *, dtype: Any = None, casting: Any = None
) -> Tensor:
    _check_keywords("np.stack", out=out, dtype=dtype, casting=casting)
    return _shape.stack(arrays, axis)


def _sum_or_mean(op: Op[..., Tensor]) -> Any:
    f = f"np.{op.name}"

    def adapter(
        a: Any, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: Any = _MISSING,
        initial: Any = _MISSING, where: Any = _MISSING,
    ) -> Tensor:  # fmt: skip
        _check_keywords(f, dtype=dtype, out=out, initial=initial, where=where)
        return op(a, axis, _keepdims(keepdims))

    return adapter


def _extremum(op: Op[..., Tensor]) -> Any:
    f = f"np.{op.name}"

    def adapter(
        a: Any, axis: Any = None, out: Any = None, keepdims: Any = _MISSING,
        initial: Any = _MISSING, where: Any = _MISSING,
    ) -> Tensor:  # fmt: skip
        _check_keywords(f, out=out, initial=initial, where=where)
        return op(a, axis, _keepdims(keepdims))

    return adapter


def _var(
    a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: Any = 0,
    keepdims: Any = _MISSING, *, where: Any = _MISSING, mean: Any = _MISSING,
    correction: Any = _MISSING,
) -> Tensor:  # fmt: skip
    _check_keywords("np.var", dtype=dtype, out=out, where=where, mean=mean)
    if correction is not _MISSING:
        if ddof != 0:
            raise OpInputError("np.var: ddof and correction are the same argument: give one")
        ddof = correction
    return _reduce.var(a, axis, _keepdims(keepdims), ddof)


def _arg(op: Op[..., Tensor]) -> Any:
    f = f"np.{op.name}"

    def adapter(a: Any, axis: Any = None, out: Any = None, *, keepdims: Any = _MISSING) -> Tensor:
        _check_keywords(f, out=out)
        return op(a, axis, _keepdims(keepdims))

    return adapter


def _clip(
    a: Any, a_min: Any = _MISSING, a_max: Any = _MISSING, out: Any = None, *,
    min: Any = _MISSING, max: Any = _MISSING, **kwargs: Any,
) -> Tensor:  # fmt: skip
    _check_keywords("np.clip", out=out, **kwargs)
    # numpy 2.1 added min=/max= as aliases of a_min=/a_max=; one of each pair at most.
    for alias, name, value in (("a_min", "min", min), ("a_max", "max", max)):
        given = a_min if alias == "a_min" else a_max
        if value is not _MISSING and given is not _MISSING:
            raise OpInputError(f"np.clip: {alias} and {name} are the same bound: give one")
    lo = min if a_min is _MISSING else a_min
    hi = max if a_max is _MISSING else a_max
    return e.clip(a, None if lo is _MISSING else lo, None if hi is _MISSING else hi)


def _reshape(
    a: Any, shape: Any = None, order: str = "C", *, newshape: Any = None, copy: Any = None
) -> Tensor:
    if order != "C":
        _refuse("np.reshape", "order", order)
    _check_keywords("np.reshape", copy=copy)
    if shape is not None and newshape is not None:
        raise OpInputError("np.reshape: shape and newshape are the same argument: give one")
    return _shape.reshape(a, newshape if shape is None else shape)


def _astype(x: Any, dtype: Any, /, *, copy: Any = True, device: Any = None) -> Tensor:
    _check_keywords("np.astype", copy=copy, device=device)
    return _shape.asarray(x, dtype)


def _transpose(a: Any, axes: Any = None) -> Tensor:
    return _shape.transpose(a, axes)


def _matmul(x1: Any, x2: Any, /) -> Tensor:  # np.linalg.matmul
    return _linalg.matmul(x1, x2)


def _dot(a: Any, b: Any, out: Any = None) -> Tensor:
    _check_keywords("np.dot", out=out)
    # np.dot converts its operands first (a Python scalar is a strong int64/float64 array).
    a = a if isinstance(a, Tensor) else np.asarray(a)
    b = b if isinstance(b, Tensor) else np.asarray(b)
    if not a.ndim or not b.ndim:
        return e.multiply(a, b)
    if a.ndim <= 2 and b.ndim <= 2:
        return _linalg.matmul(a, b)
    raise OpTypeError(
        f"np.dot of arrays of shapes {a.shape} and {b.shape} has no op (for more than 2 "
        "dimensions it sums over the last axis of a and the second-to-last of b, pairing "
        "every batch with every batch): use ops.matmul (np.matmul's batching), or await "
        "the Tensor first"
    )


def _where(condition: Any, *xy: Any) -> Tensor:
    if len(xy) != 2:
        raise OpTypeError(
            "np.where(condition) with one argument gives indices whose number depends on the "
            "values, so it cannot run on a pending ops.Tensor: await the condition first, or "
            "use the three-argument form np.where(condition, x, y)"
        )
    return e.where(condition, *xy)


def _flip(m: Any, axis: Any = None) -> Tensor:
    return _shape.flip(m, axis)


def _split(ary: Any, indices_or_sections: Any, axis: Any = 0) -> tuple[Tensor, ...]:
    return _shape.split(ary, indices_or_sections, axis)


def _np_shape(a: Any) -> Any:
    return a.shape if isinstance(a, Tensor) else np.shape(a)


def _np_ndim(a: Any) -> Any:
    return a.ndim if isinstance(a, Tensor) else np.ndim(a)


def _np_size(a: Any, axis: Any = None) -> Any:
    if not isinstance(a, Tensor):
        return np.size(a, axis)
    if axis is None:
        return a.size
    size = 1
    for ax in normalize_axes("np.size", axis, a.ndim):  # (numpy takes an int or a tuple)
        size *= a.shape[ax]
    return size


def function_fallback(func: Any) -> NoReturn:
    """``__array_function__`` for a function with no op: a refusal that says what to do."""
    _no_op(_fname(func), "has no op in ops")


FUNCTIONS: dict[Any, Any] = {
    np.concatenate: _concatenate,
    np.stack: _stack,
    np.sum: _sum_or_mean(_reduce.sum),
    np.mean: _sum_or_mean(_reduce.mean),
    np.var: _var,
    np.max: _extremum(_reduce.max),
    np.amax: _extremum(_reduce.max),
    np.min: _extremum(_reduce.min),
    np.amin: _extremum(_reduce.min),
    np.argmax: _arg(_reduce.argmax),
    np.argmin: _arg(_reduce.argmin),
    np.clip: _clip,
    np.reshape: _reshape,
    np.transpose: _transpose,
    np.where: _where,
    np.flip: _flip,
    np.split: _split,
    np.shape: _np_shape,
    np.ndim: _np_ndim,
    np.size: _np_size,
}
FUNCTIONS[np.dot] = _dot
# numpy 2's array-API names for the same functions.
for _name, _impl in (("concat", _concatenate), ("permute_dims", _transpose), ("astype", _astype)):
    if hasattr(np, _name):
        FUNCTIONS[getattr(np, _name)] = _impl
del _name, _impl
if hasattr(np.linalg, "matmul"):
    FUNCTIONS[np.linalg.matmul] = _matmul
