"""Shape ops: ``reshape``, ``transpose``, ``flip``, ``split``, ``concatenate``, ``stack`` and
``asarray``/``astype``.

``reshape``, ``transpose``, ``flip`` and ``split`` return numpy views: they cost nothing (0
flops, 0 bytes), so once their input is done they run inline on the calling thread instead of
taking a trip through the pool. ``concatenate`` and ``stack`` copy: their cost is the bytes
they move. (``reshape`` of a non-contiguous array copies too, like numpy; the meta rule cannot
see strides, so it is still costed as a view.)

Argument conventions are numpy's (``axis=``, ``indices_or_sections``, ``axis=None`` for
flip/concatenate meaning "all axes"/"flattened").
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from dataflow import Cost, Op, OpInputError, OpTypeError

from ._checks import (
    DtypeKey,
    Shape,
    check_int_scalar,
    check_lone_int,
    check_output_size,
    dtype_of,
    normalize_axes,
    normalize_axis,
    operand,
    quiet,
    shape_nbytes,
    size_of,
    weak_result_type,
)
from ._tensor import Tensor, TensorSpec, declare, declare_multi

__all__ = [
    "asarray",
    "astype",
    "concatenate",
    "flip",
    "reshape",
    "split",
    "stack",
    "transpose",
]

_FREE = Cost(0.0, 0.0)


def _free(*args: Any, **kwargs: Any) -> Cost:
    """Views cost nothing: they run inline as soon as their input is done."""
    return _FREE


# -- reshape -----------------------------------------------------------------------------


def _new_shape(shape: Any, size: int, old: Shape) -> Shape:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        dims = [int(shape)]
    elif type(shape) in (tuple, list):
        dims = []
        for d in shape:
            try:
                dims.append(operator.index(d))
            except TypeError:
                raise OpTypeError(
                    f"reshape: shape entries must be ints, got {type(d).__name__} in {shape!r}"
                ) from None
    else:
        raise OpTypeError(
            f"reshape: shape must be an int or a tuple of ints, got {type(shape).__name__}"
        )
    unknown = [i for i, d in enumerate(dims) if d < 0]
    if len(unknown) > 1 or any(dims[i] != -1 for i in unknown):
        raise OpInputError(
            f"reshape: shape {tuple(dims)} may contain at most one -1 and no other negative size"
        )
    if unknown:
        known = size_of(tuple(d for d in dims if d >= 0))
        if known == 0 or size % known:
            raise OpInputError(
                f"reshape: cannot reshape array of size {size} (shape {old}) into shape "
                f"{tuple(dims)}; the new shape must hold the same number of elements (-1 "
                "infers one dimension)"
            )
        dims[unknown[0]] = size // known
    out = tuple(dims)
    if size_of(out) != size:
        raise OpInputError(
            f"reshape: cannot reshape array of size {size} (shape {old}) into shape {out}; "
            "the new shape must hold the same number of elements (-1 infers one dimension)"
        )
    return out


def _reshape_meta(x: Any, shape: Any) -> TensorSpec:
    s, key = operand("reshape", 1, x)
    check_lone_int("reshape", 1, x, key)
    return TensorSpec(_new_shape(shape, size_of(s), s), dtype_of(key))


def _reshape_kernel(x: Any, shape: Any) -> Any:
    return np.reshape(x, shape)


reshape: Op[..., Tensor] = declare("reshape", _reshape_kernel, _reshape_meta, _free)
reshape.__doc__ = "``reshape(x, shape)``: same data, new shape (one ``-1`` is inferred)."


# -- transpose / flip --------------------------------------------------------------------


def _transpose_meta(x: Any, axes: Any = None) -> TensorSpec:
    s, key = operand("transpose", 1, x)
    check_lone_int("transpose", 1, x, key)
    if axes is None:
        return TensorSpec(s[::-1], dtype_of(key))
    if type(axes) not in (tuple, list):
        raise OpTypeError(
            f"transpose: axes must be None or a tuple of ints, got {type(axes).__name__}"
        )
    perm = [normalize_axis("transpose", a, len(s)) for a in axes]
    if sorted(perm) != list(range(len(s))):
        raise OpInputError(
            f"transpose: axes {tuple(axes)} are not a permutation of the {len(s)} axes of shape {s}"
        )
    return TensorSpec(tuple(s[a] for a in perm), dtype_of(key))


def _transpose_kernel(x: Any, axes: Any = None) -> Any:
    return np.transpose(x, axes)


transpose: Op[..., Tensor] = declare("transpose", _transpose_kernel, _transpose_meta, _free)
transpose.__doc__ = "``transpose(x, axes=None)``: permute axes (reverse them by default)."


def _flip_meta(x: Any, axis: Any = None) -> TensorSpec:
    s, key = operand("flip", 1, x)
    check_lone_int("flip", 1, x, key)
    # (numpy takes a list of axes as a tuple; the kernel's np.flip does too)
    normalize_axes("flip", tuple(axis) if type(axis) is list else axis, len(s))
    return TensorSpec(s, dtype_of(key))


_ALL = slice(None)
_REVERSED = slice(None, None, -1)


def _flip_kernel(x: Any, axis: Any = None) -> Any:
    if type(axis) is int:  # one axis, checked by the meta rule: a plain slice (np.flip
        try:  # normalises: 4x the time)
            return x[(_ALL,) * (axis % x.ndim) + (_REVERSED,)]
        except AttributeError:  # a list or tuple operand (every op takes them): np.flip's
            pass
    return np.flip(x, axis)


flip: Op[..., Tensor] = declare("flip", _flip_kernel, _flip_meta, _free)
flip.__doc__ = "``flip(x, axis=None)``: reverse the order along ``axis`` (all axes if None)."


# -- split -------------------------------------------------------------------------------


def _split_meta(x: Any, indices_or_sections: Any, axis: Any = 0) -> tuple[TensorSpec, ...]:
    s, key = operand("split", 1, x)
    dtype = dtype_of(key)
    if not s:
        raise OpInputError("split: argument 1 is 0-d; there is no axis to split")
    ax = normalize_axis("split", axis, len(s))
    n = s[ax]
    ios = indices_or_sections
    if isinstance(ios, (int, np.integer)) and not isinstance(ios, bool):
        sections = int(ios)
        if sections <= 0:
            raise OpInputError(f"split: the number of sections must be > 0, got {sections}")
        if n % sections:
            raise OpInputError(
                f"split: array split does not result in an equal division: axis {ax} of "
                f"length {n} (shape {s}) into {sections} sections"
            )
        lengths = [n // sections] * sections
    elif type(ios) in (list, tuple) or (isinstance(ios, np.ndarray) and ios.ndim == 1):
        try:
            cuts = [operator.index(i) for i in ios]
        except TypeError:
            raise OpTypeError(
                f"split: indices must be ints, got {ios!r}; pending Tensors cannot set a "
                "shape (await them first)"
            ) from None
        bounds = [0, *cuts, n]
        whole = range(n)
        lengths = [len(whole[a:b]) for a, b in itertools.pairwise(bounds)]
    else:
        raise OpTypeError(
            f"split: indices_or_sections must be an int or a list of ints, got {type(ios).__name__}"
        )
    return tuple(TensorSpec((*s[:ax], m, *s[ax + 1 :]), dtype) for m in lengths)


def _split_kernel(x: Any, indices_or_sections: Any, axis: int = 0) -> Any:
    # np.split reads the length of a list operand as len(x), whatever the axis: a nested list
    # split along axis 1 gave pieces of other shapes than the meta rule's. Convert it first.
    return np.split(x if type(x) is np.ndarray else np.asarray(x), indices_or_sections, axis)


_split: Op[..., Any] = declare_multi("split", _split_kernel, _split_meta, _free)


def split(x: Any, indices_or_sections: Any, axis: Any = 0) -> tuple[Tensor, ...]:
    """``split(x, indices_or_sections, axis=0)``: a tuple of Tensors (views), like ``np.split``.

    ``indices_or_sections`` is a number of equal sections (an int, or a 0-d integer array) or
    the cut points (a list, tuple or 1-D integer array).

    Example:
        >>> head, tail = ops.split(x, [1], axis=0)
    """
    ios = indices_or_sections
    if isinstance(ios, np.ndarray) and ios.ndim <= 1 and ios.dtype.kind in "iu":
        # Cut points (1-D) or a number of sections (0-d, as numpy takes it) set the output
        # shapes, and the op's signature cache knows an array argument by its shape and dtype
        # only: pass them as values.
        ios = tuple(ios.tolist()) if ios.ndim else int(ios)
    # The call is recorded as written (a traced graph prints `ops.split(h, 2, axis=1)`).
    pieces: tuple[Tensor, ...] = (
        _split(x, ios) if type(axis) is int and axis == 0 else _split(x, ios, axis=axis)
    )
    return pieces


# -- concatenate / stack -----------------------------------------------------------------


def _items(op: str, arrays: Any) -> list[tuple[Shape, DtypeKey]]:
    if type(arrays) not in (list, tuple):
        raise OpTypeError(
            f"{op}: argument 1 must be a list or tuple of arrays, got {type(arrays).__name__}"
        )
    if not arrays:
        raise OpInputError(f"{op}: needs at least one array to {op}")
    return [operand(op, f"item {i} of argument 1", a) for i, a in enumerate(arrays)]


def _concatenate_dtype(arrays: Sequence[Any], keys: list[DtypeKey]) -> np.dtype[Any]:
    """np.concatenate's result dtype: Python scalars among the items are weak (NEP 50), as
    numpy takes them (``[float32 array, 1.0]`` stays float32); a Python int must fit an
    integer result (numpy would wrap it silently)."""
    dtype = weak_result_type(keys)
    if dtype.kind in "iu":
        for i, (a, k) in enumerate(zip(arrays, keys, strict=True)):
            if k is int:
                check_int_scalar("concatenate", f"item {i} of argument 1", int(a), dtype)
    return dtype


def _concatenate_meta(arrays: Sequence[Any], axis: Any = 0) -> TensorSpec:
    items = _items("concatenate", arrays)
    dtype = _concatenate_dtype(arrays, [k for _, k in items])
    if axis is None:
        shape: Shape = (sum(size_of(s) for s, _ in items),)
    else:
        first = items[0][0]
        if not first:
            raise OpInputError("concatenate: 0-d arrays cannot be concatenated (use stack)")
        ax = normalize_axis("concatenate", axis, len(first))
        total = 0
        for i, (s, _) in enumerate(items):
            if len(s) != len(first):
                raise OpInputError(
                    f"concatenate: all arrays must have the same number of dimensions, but "
                    f"item 0 has shape {first} ({len(first)}-d) and item {i} has shape {s} "
                    f"({len(s)}-d)"
                )
            for d in range(len(s)):
                if d != ax and s[d] != first[d]:
                    raise OpInputError(
                        f"concatenate: all dimensions except the concatenation axis {ax} must "
                        f"match, but along dimension {d} item 0 has size {first[d]} and item "
                        f"{i} has size {s[d]} (shapes {first} and {s}); make them agree, or "
                        "concatenate along another axis"
                    )
            total += s[ax]
        shape = (*first[:ax], total, *first[ax + 1 :])
    check_output_size("concatenate", shape, dtype)
    return TensorSpec(shape, dtype)


def _stack_meta(arrays: Sequence[Any], axis: Any = 0) -> TensorSpec:
    items = _items("stack", arrays)
    for i, (a, (_, k)) in enumerate(zip(arrays, items, strict=True)):
        check_lone_int("stack", f"item {i} of argument 1", a, k)
    # (np.stack converts every item to an array first: a Python scalar is not weak here.)
    dtype = np.result_type(*(dtype_of(k) for _, k in items))
    first = items[0][0]
    for i, (s, _) in enumerate(items):
        if s != first:
            raise OpInputError(
                f"stack: all arrays must have the same shape, but item 0 has shape {first} "
                f"and item {i} has shape {s}; reshape them, or use ops.concatenate to join "
                "along an existing axis"
            )
    ax = normalize_axis("stack", axis, len(first) + 1)
    shape = (*first[:ax], len(items), *first[ax:])
    check_output_size("stack", shape, dtype)
    return TensorSpec(shape, dtype)


def _copy_cost(arrays: Sequence[Any], axis: Any = 0) -> Cost:
    # Read everything once, write it once.
    total = 0
    for a in arrays:
        if isinstance(a, (Tensor, np.ndarray)):
            total += shape_nbytes(a.shape, a.dtype)
    return Cost(0.0, 2.0 * total)


def _concatenate_kernel(arrays: Sequence[Any], axis: Any = 0) -> Any:
    return np.concatenate(arrays, axis=axis)


def _stack_kernel(arrays: Sequence[Any], axis: Any = 0) -> Any:
    return np.stack(arrays, axis=axis)


concatenate: Op[..., Tensor] = declare(
    "concatenate", _concatenate_kernel, _concatenate_meta, _copy_cost
)
concatenate.__doc__ = "``concatenate(arrays, axis=0)``: join along an existing axis (a copy)."
stack: Op[..., Tensor] = declare("stack", _stack_kernel, _stack_meta, _copy_cost)
stack.stacks = True  # type: ignore[attr-defined]  # (graph passes: fold_stack_reductions)
stack.__doc__ = "``stack(arrays, axis=0)``: join same-shape arrays along a new axis (a copy)."


# -- asarray / astype --------------------------------------------------------------------


def _target_dtype(op: str, dtype: Any) -> np.dtype[Any]:
    try:
        dt: np.dtype[Any] = np.dtype(dtype)
    except TypeError as exc:
        raise OpTypeError(f"{op}: {dtype!r} is not a numpy dtype: {exc}") from exc
    if dt.kind not in "biufc":
        raise OpTypeError(
            f"{op}: dtype {dt} is not numeric: expected bool, integer, floating or complex"
        )
    return dt


def _astype_meta(x: Any, dtype: Any) -> TensorSpec:
    s, key = operand("astype", 1, x)
    check_lone_int("astype", 1, x, key, uint64=True)
    return TensorSpec(s, _target_dtype("astype", dtype))


def _astype_cost(x: Any, dtype: Any) -> Cost:
    n = size_of(x.shape) if isinstance(x, (Tensor, np.ndarray)) else 1
    return Cost(float(n), float(n * (getattr(x, "dtype", np.dtype(float)).itemsize + 8)))


def _astype_kernel(x: Any, dtype: Any) -> Any:
    return np.asarray(x).astype(dtype)


astype: Op[..., Tensor] = declare("astype", quiet(_astype_kernel), _astype_meta, _astype_cost)
astype.__doc__ = "``astype(x, dtype)``: a copy converted to ``dtype`` (numpy's unsafe casting)."


@quiet
def _quiet_asarray(x: Any, dtype: np.dtype[Any] | None) -> np.ndarray:
    return np.asarray(x, dtype=dtype)


def _identity(x: Any) -> Any:
    return x


def _constant_meta(x: Any) -> TensorSpec:
    return TensorSpec(x.shape, x.dtype)


# An already-converted array, wrapped as a done Tensor (inline: no inputs, nothing to run).
_constant: Op[..., Tensor] = declare("asarray", _identity, _constant_meta, _free, inline=True)


def asarray(x: Any, dtype: Any = None) -> Tensor:
    """A Tensor for ``x``: an ndarray, scalar or nested list becomes a done Tensor at once.

    A Tensor is returned as is, or converted (``astype``) when ``dtype`` differs. The
    conversion happens here, so a bad value raises at the call.

    Example:
        >>> w = ops.asarray(np.random.rand(4, 3), dtype=np.float32)
    """
    if isinstance(x, Tensor):
        if dtype is None or _target_dtype("asarray", dtype) == x.dtype:
            return x
        converted: Tensor = astype(x, dtype)
        return converted
    _, key = operand("asarray", 1, x)
    if dtype is None:  # (numpy would hold a Python int past uint64 as an object array)
        check_lone_int("asarray", 1, x, key, uint64=True)
    target = None if dtype is None else _target_dtype("asarray", dtype)
    try:
        # quiet: NaN or overflow cast to ``dtype`` gives numpy's values, as ops.astype does,
        # also where warnings are errors.
        a = _quiet_asarray(x, target)
    except (OverflowError, ValueError) as exc:
        raise OpInputError(f"asarray: cannot convert {x!r} to {target}: {exc}") from exc
    except TypeError as exc:  # complex to a real dtype
        raise OpTypeError(f"asarray: cannot convert {x!r} to {target}: {exc}") from exc
    result: Tensor = _constant(a)
    return result
