"""``getitem``: numpy indexing on a Tensor (``t[0, 1:3, ..., None, idx]``).

The meta rule works out numpy's output shape from the index alone, without the data:

* **basic** items (ints, slices, ``...``, ``None``) give a view: cost 0, run inline;
* **advanced** items (integer arrays, lists, integer Tensors, concrete boolean masks)
  broadcast together; their dimensions replace the indexed axes in place when the advanced
  items are adjacent, and go first otherwise (numpy's rule; an int among them counts as a
  0-d array). The kernel copies, and the cost is the bytes it moves.

Out-of-range ints and concrete index arrays are refused at the call. The values of an index
*Tensor* are not known yet, so its bounds are checked by numpy in the kernel. A boolean mask
Tensor is refused: the output's length would depend on its values.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from dataflow import Cost, Op, OpIndexError, OpInputError, OpTypeError

from ._checks import Shape, broadcast_shapes, check_output_size, shape_nbytes, size_of
from ._tensor import Tensor, TensorSpec, declare

__all__ = ["getitem"]

_VALID = "ints, slices, ..., None, integer arrays or lists, integer Tensors and boolean numpy masks"


class _Adv(NamedTuple):
    """An advanced index item: the shape it broadcasts with, how many axes it consumes."""

    shape: Shape
    consumes: int


def _slice_len(op: str, s: slice, n: int) -> int:
    for bound in (s.start, s.stop, s.step):
        if bound is not None and not isinstance(bound, (int, np.integer)):
            raise OpTypeError(
                f"{op}: slice bounds must be ints or None, got {type(bound).__name__} "
                f"in {s!r}" + (" (await the Tensor first)" if isinstance(bound, Tensor) else "")
            )
    if s.step == 0:
        raise OpInputError(f"{op}: slice step cannot be zero")
    return len(range(*s.indices(n)))


def _array_item(op: str, item: Any, pos: int) -> tuple[Any, _Adv]:
    """Classify an array-like index item; returns the item to index with and its _Adv."""
    if isinstance(item, Tensor):
        kind = item.dtype.kind
        if kind == "b":
            raise OpTypeError(
                f"{op}: a boolean mask Tensor (index item {pos}) gives a shape that depends "
                "on its values: await the mask first, or use ops.where(mask, x, 0)"
            )
        if kind not in "iu":
            raise OpTypeError(
                f"{op}: index Tensor (item {pos}) has dtype {item.dtype}: index arrays must "
                "be integers"
            )
        return item, _Adv(item.shape, 1)
    a = np.asarray(item)
    if a.dtype.kind == "f" and a.size == 0 and not isinstance(item, np.ndarray):
        a = a.astype(np.intp)  # numpy treats an empty list as an empty integer index
    if a.dtype.kind == "b":
        return a, _Adv((int(np.count_nonzero(a)),), a.ndim)
    if a.dtype.kind not in "iu":
        raise OpTypeError(
            f"{op}: index item {pos} has dtype {a.dtype}: only {_VALID} are valid indices"
        )
    return a, _Adv(a.shape, 1)


def _classify(op: str, key: Any) -> list[Any]:
    """The index as a list of items: int, slice, None, Ellipsis, or (array, _Adv)."""
    items = list(key) if type(key) is tuple else [key]
    out: list[Any] = []
    for pos, item in enumerate(items):
        if item is None or item is Ellipsis or isinstance(item, slice):
            out.append(item)
        elif isinstance(item, (bool, np.bool_)):
            raise OpTypeError(
                f"{op}: a boolean scalar index (item {pos}) is not supported: use None to add "
                "an axis"
            )
        elif isinstance(item, (int, np.integer)):
            out.append(int(item))
        elif isinstance(item, (Tensor, np.ndarray, list, tuple)):
            out.append(_array_item(op, item, pos))
        else:
            raise OpTypeError(
                f"{op}: index item {pos} has type {type(item).__name__}: only {_VALID} are "
                "valid indices"
            )
    if sum(1 for it in out if it is Ellipsis) > 1:
        raise OpIndexError(f"{op}: an index can only have a single ellipsis ('...')")
    return out


def _consumed(item: Any) -> int:
    if item is None or item is Ellipsis:
        return 0
    if isinstance(item, tuple):
        return int(item[1].consumes)
    return 1


def _check_bounds(op: str, item: Any, axis: int, shape: Shape) -> None:
    """Refuse out-of-range ints and concrete index arrays; check boolean mask shapes."""
    if isinstance(item, int):
        n = shape[axis]
        if not -n <= item < n:
            raise OpIndexError(
                f"{op}: index {item} is out of bounds for axis {axis} with size {n} "
                f"(valid indices are {-n}..{n - 1})"
            )
        return
    arr = item[0]
    if isinstance(arr, Tensor) or arr.size == 0:
        return
    if arr.dtype.kind == "b":
        covered = shape[axis : axis + arr.ndim]
        if arr.shape != covered:
            raise OpIndexError(
                f"{op}: boolean index of shape {arr.shape} does not match the indexed axes "
                f"{covered} of shape {shape} (from axis {axis})"
            )
        return
    n = shape[axis]
    lo, hi = int(arr.min()), int(arr.max())
    bad = lo if lo < -n else hi if hi >= n else None
    if bad is not None:
        raise OpIndexError(
            f"{op}: index {bad} is out of bounds for axis {axis} with size {n} "
            f"(valid indices are {-n}..{n - 1})"
        )


_GAP: Any = object()  # where an ellipsis that stands for no axis was (index_spec)


def index_spec(shape: Shape, key: Any) -> tuple[Shape, tuple[Any, ...], bool]:
    """(output shape, the key to index with, whether it is a view) for ``x[key]``."""
    op = "getitem"
    items = _classify(op, key)
    norm = tuple(it[0] if isinstance(it, tuple) else it for it in items)
    used = sum(_consumed(it) for it in items)
    if used > len(shape):
        raise OpIndexError(
            f"{op}: too many indices for an array of shape {shape}: it is "
            f"{len(shape)}-dimensional, but {used} were indexed"
        )
    if Ellipsis in items:
        at = items.index(Ellipsis)
        # An ellipsis that stands for no axis still parts the advanced items around it, as
        # in numpy (x[:, [1], ..., 3] on 3 axes puts their dimension first): a gap is kept.
        items[at : at + 1] = [slice(None)] * (len(shape) - used) or [_GAP]
    else:
        items += [slice(None)] * (len(shape) - used)
    advanced = any(isinstance(it, tuple) for it in items)
    out: list[int] = []
    adv_shapes: list[Shape] = []
    adv_at: list[int] = []  # positions (in items) of advanced items, ints included
    arrays: list[tuple[Any, int]] = []  # integer index arrays and their axes, checked last
    insert = 0
    axis = 0
    for i, it in enumerate(items):
        if it is _GAP:
            continue
        if it is None:
            out.append(1)
        elif isinstance(it, slice):
            out.append(_slice_len(op, it, shape[axis]))
            axis += 1
        else:
            if isinstance(it, int) or it[0].dtype.kind == "b":
                _check_bounds(op, it, axis, shape)
            else:
                arrays.append((it, axis))
            if isinstance(it, int) and not advanced:
                axis += 1
                continue
            if not adv_at:
                insert = len(out)
            adv_at.append(i)
            adv_shapes.append(() if isinstance(it, int) else it[1].shape)
            axis += _consumed(it)
    view = not adv_at
    if not view:
        try:
            bshape = broadcast_shapes(op, *adv_shapes)
        except OpInputError:
            listed = " ".join(str(s) for s in adv_shapes if s)
            raise OpIndexError(
                f"{op}: shape mismatch: the index arrays of shapes {listed} cannot be "
                "broadcast together"
            ) from None
        if size_of(bshape):  # (numpy checks no index array's bounds for an empty result)
            for it, at in arrays:
                _check_bounds(op, it, at, shape)
        adjacent = adv_at[-1] - adv_at[0] == len(adv_at) - 1
        at = insert if adjacent else 0
        out[at:at] = bshape
    return tuple(out), norm, view


def _take(x: Any, key: Any, spec: Any = None, cost: Any = None) -> Any:
    return x[key]


_NO_COST = Cost(0.0, 0.0)
# The index items that select a view (numpy's basic indexing), by exact type.
_BASIC = frozenset({int, slice, type(None), type(Ellipsis)})


# Basic indexes' output shapes by (shape, index), slices as tuples: Python 3.11's slices are
# unhashable, so the op's signature cache misses a call with one and runs the meta rule.
_SHAPES: dict[tuple[Any, ...], Shape] = {}
_BOUNDS = frozenset({int, type(None)})  # (other bounds are checked by index_spec, every time)


def _getitem_spec(x: Any, key: Any, spec: Any = None, cost: Any = None) -> TensorSpec:
    if spec is not None:  # worked out by getitem (an advanced index)
        return spec  # type: ignore[no-any-return]
    memo: list[Any] = [x.shape]
    for k in key if type(key) is tuple else (key,):
        if type(k) is slice:
            a, b, c = k.start, k.stop, k.step
            if type(a) not in _BOUNDS or type(b) not in _BOUNDS or type(c) not in _BOUNDS:
                return TensorSpec(index_spec(x.shape, key)[0], x.dtype)
            k = (a, b, c)
        memo.append(k)
    full = tuple(memo)
    shape = _SHAPES.get(full)
    if shape is None:
        shape = index_spec(x.shape, key)[0]
        if len(_SHAPES) >= 4096:
            _SHAPES.clear()
        _SHAPES[full] = shape
    return TensorSpec(shape, x.dtype)


def _getitem_cost(x: Any, key: Any, spec: Any = None, cost: Any = None) -> Cost:
    return _NO_COST if cost is None else cost  # (a basic index: a view, no bytes moved)


# A basic index (``t[3]``, ``t[:, 1:5]``) is the op's own arguments, so the op's signature cache
# keys it (the meta rule runs once per shape and index); an advanced one is worked out once by
# ``getitem`` (converting its arrays) and hands the op its spec and cost as well.
_getitem: Op[..., Tensor] = declare("getitem", _take, _getitem_spec, _getitem_cost)


def _rows_shape(x: Any, idx: Any) -> Shape:
    """``x[idx]``'s shape for one integer index array (or Tensor) ``idx``."""
    return tuple(idx.shape) + tuple(x.shape[1:])


def _rows_meta(x: Any, idx: Any) -> TensorSpec:
    # (only from getitem: x a Tensor of at least one axis, idx an integer array in bounds)
    return TensorSpec(_rows_shape(x, idx), x.dtype)


def _rows_cost(x: Any, idx: Any) -> Cost:
    return Cost(0.0, 2.0 * shape_nbytes(_rows_shape(x, idx), x.dtype))


def _rows(x: Any, idx: Any) -> Any:
    return x[idx]


# ``t[idx]`` with one integer array (an embedding's lookup, rows picked by a permutation):
# the index and the Tensor are the op's own arguments, so the signature cache keys them by
# shape and dtype and the meta rule runs once per shape, where the general path parsed the
# index at every call (20.7 against 1.0 us for numpy's own E[idx]). Its bounds are checked at
# every call all the same (``getitem``).
_getitem_rows: Op[..., Tensor] = declare("getitem_rows", _rows, _rows_meta, _rows_cost)


def getitem(x: Any, key: Any) -> Tensor:
    """``x[key]`` with numpy's indexing rules; also what ``Tensor.__getitem__`` calls.

    Example:
        >>> last = ops.getitem(h, (-1, slice(None)))     # same as h[-1, :]
    """
    if not isinstance(x, Tensor):
        from ._shape import asarray

        x = asarray(x)
    tk = type(key)
    if tk is int or tk is slice or (tk is tuple and all(type(k) in _BASIC for k in key)):
        basic: Tensor = _getitem(x, key)
        return basic
    if tk is list and key and type(key[0]) is int:  # t[[0, 2]]: numpy reads it as an array
        arr = np.asarray(key)
        if arr.dtype.kind == "i":  # (ints all: not bools, slices or nested lists)
            key, tk = arr, np.ndarray
    if (tk is np.ndarray or isinstance(key, Tensor)) and key.dtype.kind in "iu" and x.shape:
        shape = _rows_shape(x, key)
        # (numpy checks no index array's bounds for an empty result; an index Tensor's values
        # are not known yet: numpy checks them in the kernel, as on the general path)
        if tk is np.ndarray and size_of(shape):
            _check_bounds("getitem", (key, None), 0, x.shape)
        check_output_size("getitem", shape, x.dtype)
        rows: Tensor = _getitem_rows(x, key)
        return rows
    shape, norm, view = index_spec(x.shape, key)
    spec = TensorSpec(shape, x.dtype)
    if view:
        cost = _NO_COST
    else:
        check_output_size("getitem", shape, x.dtype)
        cost = Cost(0.0, 2.0 * shape_nbytes(shape, x.dtype))
    result: Tensor = _getitem(x, norm, spec, cost)
    return result
