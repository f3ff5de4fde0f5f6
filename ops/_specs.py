"""A declared op's meta rule, checked: what ``ops.define`` makes of the specs it returns.

A meta rule written by a user may return a dtype-like that is not a ``np.dtype``
(``np.float32``, ``"float32"``) or a list for a shape: the Tensor it made would carry them as
they are (``t.dtype.kind`` failing in every op downstream), and the kernel's value, an
ndarray of that very dtype and shape, would be refused as not matching the spec. It may also
return something that is no spec at all (neither a TensorSpec nor a NamedTuple with ``shape``
and ``dtype`` fields), which showed only when the kernel ran. The wrapper here normalises the
first and refuses the second at the call, naming the op. It runs with the meta rule, once per
argument signature; the package's own ops (``declare``) skip it.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from dataflow import DataflowTypeError

from ._tensor import TensorSpec

__all__ = ["checked_meta"]


def _checked(op: str, spec: Any, label: str) -> TensorSpec:
    if type(spec) is TensorSpec:
        shape, dtype = spec
        if (
            type(shape) is tuple
            and isinstance(dtype, np.dtype)
            and all(type(d) is int and d >= 0 for d in shape)
        ):
            return spec
    elif isinstance(spec, tuple) and hasattr(spec, "shape") and hasattr(spec, "dtype"):
        shape, dtype = spec.shape, spec.dtype  # a NamedTuple of the same fields will do
    else:
        raise DataflowTypeError(
            f"op {op!r}: its meta rule returned {label}{type(spec).__name__} {spec!r}, not an "
            "ops.TensorSpec(shape, dtype) (or a plain tuple of them, one per output)"
        )
    try:
        dims = tuple(operator.index(d) for d in shape)
        dt: np.dtype[Any] = np.dtype(dtype)
        valid = all(d >= 0 for d in dims)
    except TypeError:  # not a sequence of ints, or not a dtype
        valid = False
    if not valid:
        raise DataflowTypeError(
            f"op {op!r}: its meta rule returned {label}TensorSpec(shape={shape!r}, "
            f"dtype={dtype!r}): the shape must be a tuple of non-negative ints and the dtype a "
            "numpy dtype"
        )
    return TensorSpec(dims, dt)


def checked_meta(op: str, meta: Callable[..., Any]) -> Callable[..., Any]:
    """``meta``, its specs normalised (a dtype-like to ``np.dtype``, a shape to a tuple of
    ints) or refused at the call with a DataflowTypeError naming ``op``."""

    @functools.wraps(meta)
    def checked(*args: Any, **kwargs: Any) -> Any:
        spec = meta(*args, **kwargs)
        if type(spec) is tuple:
            return tuple([_checked(op, s, f"as output {i} ") for i, s in enumerate(spec)])
        return _checked(op, spec, "")

    return checked
