"""Validation shared by the meta rules: operands, dtypes, broadcasting, axes and output size.

Meta rules run on every op call, in the caller's frame, so everything here is cheap on the
common path (a Tensor or an ndarray, shapes equal) and raises a message that names the op,
the argument, the shapes and dtypes involved and what was expected:

* :class:`~dataflow.OpTypeError` (a ``TypeError``) for an argument of the wrong type or dtype;
* :class:`~dataflow.OpInputError` (a ``ValueError``) for shapes, axes and values.

A Python ``int``, ``float`` or ``complex`` is a *weak* scalar (NEP 50): its dtype key is the
Python type itself, so ``float32 + 1.0`` stays float32. Every other operand has a strong
``np.dtype``. :func:`quiet` is the one helper for kernels: it keeps numpy's floating-point
warnings from failing a task.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn, TypeAlias, TypeVar

import numpy as np

from dataflow import Future, NotReadyError, OpInputError, OpOverflowError, OpTypeError

from ._tensor import Tensor

__all__ = [
    "ACCEPTED",
    "WEAK_VALUE",
    "DtypeKey",
    "Shape",
    "array_kernel",
    "broadcast_shapes",
    "check_int_scalar",
    "check_lone_int",
    "check_output_size",
    "dtype_of",
    "int_bounds",
    "normalize_axes",
    "normalize_axis",
    "operand",
    "quiet",
    "refuse_subclass",
    "shape_nbytes",
    "shape_of",
    "size_of",
    "ufunc_dtypes",
    "weak_result_type",
]

Shape: TypeAlias = tuple[int, ...]
#: An operand's dtype, or ``int``/``float``/``complex`` for a weak Python scalar.
DtypeKey: TypeAlias = "np.dtype[Any] | type[int] | type[float] | type[complex]"

F = TypeVar("F", bound=Callable[..., Any])

ACCEPTED = "an ops.Tensor, a numpy array, a Python or numpy scalar, or a (nested) list of numbers"
_NUMERIC = "biufc"
_KIND_NAMES = {
    "O": "object",
    "U": "unicode string",
    "S": "byte string",
    "V": "structured/void",
    "M": "datetime",
    "m": "timedelta",
    "T": "string",
}
_BOOL = np.dtype(bool)
_WEAK_DEFAULT: dict[type, np.dtype[Any]] = {
    int: np.dtype(np.int64),
    float: np.dtype(np.float64),
    complex: np.dtype(np.complex128),
}


#: A Python scalar's stand-in for numpy's promotion as a weak scalar (NEP 50): its value
#: (not its type, which numpy would take as the strong default dtype) in ``np.result_type``.
WEAK_VALUE: dict[type, Any] = {int: 0, float: 0.0, complex: 0j}


def weak_result_type(keys: Iterable[DtypeKey]) -> np.dtype[Any]:
    """numpy's result dtype of operands with these dtype keys, Python scalars weak."""
    return np.result_type(*(WEAK_VALUE[k] if isinstance(k, type) else k for k in keys))


def _label(pos: int | str) -> str:
    return f"argument {pos}" if isinstance(pos, int) else pos


def _check_dtype(op: str, pos: int | str, dtype: np.dtype[Any]) -> None:
    if dtype.kind not in _NUMERIC:
        kind = _KIND_NAMES.get(dtype.kind, dtype.kind)
        raise OpTypeError(
            f"{op}: {_label(pos)} has dtype {dtype} ({kind}), which ops do not compute on: "
            "expected a numeric dtype (bool, integer, floating or complex); convert it first, "
            "e.g. np.asarray(x, dtype=np.float64)"
        )


def _from_sequence(op: str, pos: int | str, x: Sequence[Any]) -> np.ndarray:
    """Convert a list/tuple operand, turning numpy's errors into ones that name the op."""
    try:
        return np.asarray(x)
    except NotReadyError:
        raise OpTypeError(
            f"{op}: {_label(pos)} is a {type(x).__name__} holding pending Tensors; "
            "combine Tensors with ops.stack(...) or ops.concatenate(...) instead"
        ) from None
    except (ValueError, TypeError) as exc:
        raise OpInputError(
            f"{op}: {_label(pos)} is a {type(x).__name__} that does not form an array: {exc}; "
            "pass a numpy array (nested lists need rows of equal length)"
        ) from exc


def _subclass_name(t: type) -> str:
    # The subclasses users meet most, by the name they write them with. (np.ma is imported
    # here, on this error path only: numpy does not import it by itself.)
    known_names = (
        (np.ma.MaskedArray, "np.ma.MaskedArray"),
        (np.matrix, "np.matrix"),
        (np.memmap, "np.memmap"),
    )
    for known, name in known_names:
        if issubclass(t, known):
            return name if t is known else f"{t.__module__}.{t.__qualname__} (a {name})"
    return f"{t.__module__}.{t.__qualname__}"


def refuse_subclass(op: str, pos: int | str, x: np.ndarray) -> NoReturn:
    """Refuse an ndarray subclass: ops compute on plain ndarrays only (docs/ops.md).

    numpy gives subclasses their own semantics (a masked array's mask, ``np.matrix``'s 2-D
    results and ``*``, a memmap's file, units ...), which a plain-ndarray kernel would silently
    drop or return with another shape than the meta rule declared.
    """
    t = type(x)
    name = _subclass_name(t)
    if isinstance(x, np.ma.MaskedArray):
        fix = (
            "x.filled(value) to replace the masked entries first, or np.asarray(x) to compute "
            "on the data ignoring the mask"
        )
    elif isinstance(x, np.matrix):
        fix = "np.asarray(x), the same data as a 2-D ndarray (no copy)"
    else:
        fix = "np.asarray(x), the same data as a plain ndarray (no copy)"
    where = f"{op}: " if op else ""
    raise OpTypeError(
        f"{where}{_label(pos)} is a {name}, a numpy.ndarray subclass: ops compute on plain "
        f"ndarrays only, and would silently lose what the subclass adds; pass {fix}"
    )


def operand(op: str, pos: int | str, x: Any) -> tuple[Shape, DtypeKey]:
    """The shape and dtype key of one array operand, or an OpTypeError saying what is accepted.

    ``pos`` is the 1-based argument position (or a label such as ``"item 2 of argument 1"``).
    ndarray subclasses are refused (:func:`refuse_subclass`).
    """
    if isinstance(x, Tensor):
        dtype: np.dtype[Any] = x.dtype
        if dtype.kind not in _NUMERIC:
            _check_dtype(op, pos, dtype)
        return x.shape, dtype
    t = type(x)
    if t is np.ndarray:
        dtype = x.dtype
        if dtype.kind not in _NUMERIC:
            _check_dtype(op, pos, dtype)
        return x.shape, dtype
    if t is float or t is int or t is complex:
        return (), t
    if t is bool:
        return (), _BOOL
    if isinstance(x, np.generic):
        _check_dtype(op, pos, x.dtype)
        return (), x.dtype
    if isinstance(x, np.ndarray):
        refuse_subclass(op, pos, x)
    if t is list or t is tuple:
        a = _from_sequence(op, pos, x)
        _check_dtype(op, pos, a.dtype)
        return a.shape, a.dtype
    # Subclasses of the Python number types (IntEnum, ...) act like their base.
    for base in (bool, int, float, complex):
        if isinstance(x, base):
            return (), (_BOOL if base is bool else base)
    if isinstance(x, Future):
        name = getattr(x, "name", None) or getattr(getattr(x, "task", None), "name", "?")
        raise OpTypeError(
            f"{op}: {_label(pos)} is a dataflow future ({name}), not a Tensor: await it first "
            "(`value = await fut`) and pass the value, or return an ops Tensor from the task"
        )
    raise OpTypeError(
        f"{op}: {_label(pos)} has type {t.__name__}, which is not an array: expected {ACCEPTED}"
    )


def shape_of(x: Any) -> Shape:
    """An operand's shape without validation (for cost rules, after the meta rule passed)."""
    shape = getattr(x, "shape", None)
    if isinstance(shape, tuple):
        return shape
    return np.shape(x)


def dtype_of(key: DtypeKey) -> np.dtype[Any]:
    """The concrete dtype of a dtype key (a weak scalar gets numpy's default for its kind)."""
    if isinstance(key, np.dtype):
        return key
    return _WEAK_DEFAULT[key]


def _describe(keys: Sequence[DtypeKey]) -> str:
    names = [f"Python {k.__name__}" if isinstance(k, type) else str(k) for k in keys]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


@functools.cache
def _resolve(ufunc: np.ufunc, keys: tuple[DtypeKey, ...]) -> tuple[np.dtype[Any], ...] | str:
    try:
        return ufunc.resolve_dtypes((*keys, *([None] * ufunc.nout)))
    except TypeError as exc:  # numpy's no-loop errors are TypeErrors; keep the text
        return str(exc)


def ufunc_dtypes(op: str, ufunc: np.ufunc, keys: tuple[DtypeKey, ...]) -> tuple[np.dtype[Any], ...]:
    """The loop dtypes (inputs then output) numpy picks for ``ufunc`` on these operands."""
    out = _resolve(ufunc, keys)
    if isinstance(out, str):
        s = "" if len(keys) == 1 else "s"
        raise OpTypeError(f"{op}: not supported for dtype{s} {_describe(keys)}: {out}")
    return out


@functools.cache
def int_bounds(dtype: np.dtype[Any]) -> tuple[int, int]:
    """The smallest and largest value of an integer dtype."""
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def check_int_scalar(op: str, pos: int | str, value: int, dtype: np.dtype[Any]) -> None:
    """A Python int mixed with an integer array must fit its dtype (numpy raises otherwise)."""
    if dtype.kind not in "iu":
        return
    lo, hi = int_bounds(dtype)
    if not lo <= value <= hi:
        fits = next(
            (
                t
                for t in ("int64", "uint64")
                if _fits(value, np.dtype(t)) and _fits(lo, np.dtype(t)) and _fits(hi, np.dtype(t))
            ),
            None,
        )
        fix = (
            f"cast the array to a wider dtype first (ops.asarray(x, dtype=np.{fits}))"
            if fits is not None and np.dtype(fits) != dtype
            else "no integer dtype holds both: use a float dtype "
            "(ops.asarray(x, dtype=np.float64)) or a value in range"
        )
        raise OpOverflowError(
            f"{op}: Python integer {value} ({_label(pos)}) is out of bounds for {dtype} "
            f"[{lo}, {hi}]: {fix}"
        )


def check_lone_int(
    op: str, pos: int | str, value: Any, key: DtypeKey, *, uint64: bool = False
) -> None:
    """A Python int that takes its default dtype (no array operand decides the result's
    dtype: a unary op, a reduction, a shape op, a stack item) must fit int64, that dtype
    (``uint64``: int64 or uint64, where the kernel converts it and numpy's value is right).

    numpy would make one past int64 uint64 (below 2**64) or an object array: values of
    another dtype than the meta rule declares, or a kernel that fails later. Refused here.
    """
    if key is int and not _INT64_MIN <= value <= (_UINT64_MAX if uint64 else _INT64_MAX):
        fits = "int64 or uint64" if uint64 else "int64, the dtype a Python int has on its own"
        raise OpInputError(
            f"{op}: Python integer {value} ({_label(pos)}) does not fit {fits}: pass it as a "
            "float, as np.uint64(...) if it fits uint64, or as an array of the dtype you want"
        )


_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


def _fits(value: int, dtype: np.dtype[Any]) -> bool:
    lo, hi = int_bounds(dtype)
    return lo <= value <= hi


def broadcast_shapes(op: str, *shapes: Shape) -> Shape:
    """numpy's broadcasting of ``shapes``, or an OpInputError naming all of them."""
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for s in shapes:
        offset = ndim - len(s)
        for i, d in enumerate(s):
            j = offset + i
            o = out[j]
            if d != o:
                if o == 1:
                    out[j] = d
                elif d != 1:
                    listed = ", ".join(str(x) for x in shapes[:-1]) + f" and {shapes[-1]}"
                    raise OpInputError(
                        f"{op}: shapes {listed} cannot be broadcast together (each trailing "
                        "dimension must be equal or 1): reshape or transpose an operand"
                    )
    return tuple(out)


def size_of(shape: Shape) -> int:
    """Number of elements of an array of this shape."""
    return math.prod(shape)


def shape_nbytes(shape: Shape, dtype: np.dtype[Any]) -> int:
    """Bytes of an array of this shape and dtype."""
    return math.prod(shape) * dtype.itemsize


@functools.cache
def _physical_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # not a POSIX system: no limit to check
        return math.inf


def check_output_size(op: str, shape: Shape, dtype: np.dtype[Any]) -> None:
    """Refuse an output larger than the machine's physical memory, before allocating it."""
    nbytes = shape_nbytes(shape, dtype)
    limit = _physical_memory()
    if nbytes > limit:
        gib = 2.0**30
        raise OpInputError(
            f"{op}: the output of shape {shape} and dtype {dtype} would take "
            f"{nbytes / gib:.1f} GiB, more than this machine's {limit / gib:.1f} GiB of "
            "physical memory; check the shapes (an unintended broadcast?)"
        )


def _axis_int(op: str, axis: Any) -> int:
    if isinstance(axis, (int, np.integer)) and not isinstance(axis, (bool, np.bool_)):
        return int(axis)
    raise OpTypeError(
        f"{op}: axis must be None, an int or a tuple of ints, got {type(axis).__name__}: {axis!r}"
    )


def normalize_axis(op: str, axis: Any, ndim: int) -> int:
    """One axis in ``[-ndim, ndim)`` as a non-negative int."""
    a = _axis_int(op, axis)
    if not -ndim <= a < ndim:
        valid = f"valid axes are {-ndim}..{ndim - 1}" if ndim else "a 0-d array has no axes"
        raise OpInputError(
            f"{op}: axis {a} is out of bounds for an array of dimension {ndim} ({valid})"
        )
    return a + ndim if a < 0 else a


def normalize_axes(op: str, axis: Any, ndim: int) -> tuple[int, ...]:
    """``None`` (all axes), an int or a tuple of distinct ints, as sorted non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    if type(axis) is tuple:
        axes = tuple(normalize_axis(op, a, ndim) for a in axis)
        if len(set(axes)) != len(axes):
            raise OpInputError(f"{op}: axis {axis} names the same axis more than once")
        return tuple(sorted(axes))
    return (normalize_axis(op, axis, ndim),)


def quiet(kernel: F) -> F:
    """Keep numpy's floating-point warnings (overflow, 0/0, inf - inf) from failing the task.

    The kernel runs as is: its values are numpy's, and with the default warning filters numpy
    warns as usual. Only when the filters turn the ``RuntimeWarning`` into an exception (as
    ``-W error`` or pytest's ``filterwarnings = error`` do, process-wide, so also in the pool's
    threads) it runs again under ``np.errstate(all="ignore")``, so inf and NaN propagate like
    numpy instead of failing the task. The common path costs one ``try``.
    """

    @functools.wraps(kernel)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return kernel(*args, **kwargs)
        except RuntimeWarning:
            with np.errstate(all="ignore"):
                return kernel(*args, **kwargs)

    if isinstance(kernel, np.ufunc):  # it calls the ufunc unchanged: fusion may call it too
        run.dataflow_ufunc = kernel  # type: ignore[attr-defined]
    return run  # type: ignore[return-value]


def array_kernel(kernel: F) -> F:
    """:func:`quiet`, for kernels that use array attributes (``x.shape``, ``w.T``) rather than
    numpy functions that convert their arguments: a call given lists or tuples (which every
    op takes, docs/ops.md; the meta rule converts them the same way to check them) that
    fails runs again with them converted to arrays. Only a failing call looks at the
    arguments' types: the common call pays one ``try`` and this wrapper's call (a check of
    every argument at each call cost the recurrent kernels 0.3-0.5 us each).
    """

    @functools.wraps(kernel)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return kernel(*args, **kwargs)
        except RuntimeWarning:
            warned = True  # (numpy's warning made an error: numpy's values, as quiet gives)
        except Exception:
            if _SEQUENCES.isdisjoint(map(type, args)):
                raise
            warned = False
        converted = tuple(
            [np.asarray(v) if type(v) is list or type(v) is tuple else v for v in args]
        )
        if not warned:
            try:
                return kernel(*converted, **kwargs)
            except RuntimeWarning:
                pass
        with np.errstate(all="ignore"):
            return kernel(*converted, **kwargs)

    return run  # type: ignore[return-value]


_SEQUENCES = frozenset((list, tuple))
