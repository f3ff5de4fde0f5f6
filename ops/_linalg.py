"""Linear algebra: ``matmul`` (numpy's ``@``, batched) and ``linear`` (``x @ w.T + b``).

``matmul`` follows ``np.matmul``: 1-D operands are promoted to a row/column vector and the
added axis dropped again, leading (batch) axes broadcast, 0-d operands are refused. The
kernel is the plain ``np.matmul`` call, so BLAS does the work (with its own intra-op threads,
see ``dataflow.set_num_threads``).

Cost: ``flops = 2 * M * N * K`` per matrix, times the broadcast batch size;
``bytes = input bytes + output bytes``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dataflow import Cost, Op, OpInputError

from ._checks import (
    Shape,
    broadcast_shapes,
    check_int_scalar,
    check_output_size,
    operand,
    quiet,
    shape_of,
    size_of,
    ufunc_dtypes,
)
from ._tensor import Tensor, TensorSpec, declare

__all__ = ["linear", "matmul"]


def _nbytes(x: Any) -> int:
    if isinstance(x, (Tensor, np.ndarray)):
        return size_of(x.shape) * x.dtype.itemsize
    return 0


def _matmul_shape(op: str, sa: Shape, sb: Shape, what: tuple[str, str]) -> Shape:
    """numpy's matmul output shape, or an error naming both shapes and the mismatch."""
    for pos, s in ((1, sa), (2, sb)):
        if not s:
            raise OpInputError(
                f"{op}: {what[pos - 1]} (argument {pos}) is 0-d; matmul needs at least one "
                "dimension on both sides (use ops.multiply to scale by a scalar)"
            )
    k1 = sa[-1]
    k2 = sb[-2] if len(sb) > 1 else sb[0]
    if k1 != k2:
        raise OpInputError(
            f"{op}: shapes {sa} and {sb} are not aligned: {k1} != {k2} (the last axis of the "
            "first operand must match the second-to-last of the second): transpose an operand "
            "(x.T) or check the shapes"
        )
    ba, bb = sa[:-2], sb[:-2]
    if ba == bb or not bb:
        batch = ba
    elif not ba:
        batch = bb
    else:
        try:
            batch = broadcast_shapes(op, ba, bb)
        except OpInputError:
            raise OpInputError(
                f"{op}: the batch dimensions {ba} and {bb} of shapes {sa} and {sb} "
                "cannot be broadcast together"
            ) from None
    return batch + sa[-2:-1] + sb[-1:] if len(sb) > 1 else batch + sa[-2:-1]


def _matmul_meta(a: Any, b: Any, /) -> TensorSpec:  # positional-only, like np.matmul
    sa, ka = operand("matmul", 1, a)
    sb, kb = operand("matmul", 2, b)
    dtype = ufunc_dtypes("matmul", np.matmul, (ka, kb))[-1]
    shape = _matmul_shape("matmul", sa, sb, ("the first operand", "the second operand"))
    check_output_size("matmul", shape, dtype)  # an outer product can be huge even in 2-D
    return TensorSpec(shape, dtype)


def _flops(sa: Shape, sb: Shape, out: Shape) -> float:
    # Every output element is a K-long dot product: 2*K flops each.
    return 2.0 * sa[-1] * size_of(out) if sa else 0.0


def _matmul_cost(a: Any, b: Any, /) -> Cost:
    sa, sb = shape_of(a), shape_of(b)
    out = _matmul_shape("matmul", sa, sb, ("", ""))
    itemsize = max(getattr(a, "dtype", np.dtype(float)).itemsize, 1)
    return Cost(_flops(sa, sb, out), float(_nbytes(a) + _nbytes(b) + size_of(out) * itemsize))


matmul: Op[..., Tensor] = declare("matmul", quiet(np.matmul), _matmul_meta, _matmul_cost)
matmul.__doc__ = (
    "``a @ b`` (``np.matmul``): batched over leading axes, 1-D operands promoted, "
    "``shapes (m, k) and (k2, n) are not aligned`` when ``k != k2``."
)


def _linear_kernel(x: Any, w: Any, b: Any = None) -> Any:
    y = np.matmul(x, np.asarray(w).T)
    if b is None:
        return y
    if type(b) is list or type(b) is tuple:
        b = np.asarray(b)
    if np.result_type(y, b) == y.dtype:
        # The bias broadcasts to y's shape (checked by the meta rule): add it in place.
        np.add(y, b, out=y)
        return y
    return np.add(y, b)


def _broadcasts_to(shape: Shape, target: Shape) -> bool:
    try:
        return broadcast_shapes("linear", target, shape) == target
    except OpInputError:
        return False


def _linear_meta(x: Any, w: Any, b: Any = None) -> TensorSpec:
    sx, kx = operand("linear", 1, x)
    sw, kw = operand("linear", 2, w)
    if len(sw) != 2:
        raise OpInputError(
            f"linear: weight (argument 2) must be 2-D (out_features, in_features), got shape {sw}"
        )
    if not sx:
        raise OpInputError("linear: input (argument 1) is 0-d; expected (..., in_features)")
    if sx[-1] != sw[1]:
        raise OpInputError(
            f"linear: input shape {sx} and weight shape {sw} are not aligned: "
            f"{sx[-1]} != {sw[1]} (the weight is (out_features, in_features))"
        )
    out = sx[:-1] + sw[:1]
    dtype = ufunc_dtypes("linear", np.matmul, (kx, kw))[-1]
    if b is not None:
        sb, kb = operand("linear", 3, b)
        if kb is int:  # a Python int bias must fit an integer product (numpy would raise later)
            check_int_scalar("linear", 3, int(b), dtype)
        dtype = ufunc_dtypes("linear", np.add, (dtype, kb))[-1]
        if sb != out and sb != out[-1:] and not _broadcasts_to(sb, out):
            raise OpInputError(
                f"linear: bias shape {sb} does not broadcast to the output shape {out}: "
                f"expected ({sw[0]},) for {sw[0]} out_features"
            )
    return TensorSpec(out, dtype)


def _linear_cost(x: Any, w: Any, b: Any = None) -> Cost:
    sx, sw = shape_of(x), shape_of(w)
    n_out = size_of(sx[:-1]) * sw[0]
    itemsize = getattr(x, "dtype", np.dtype(float)).itemsize
    flops = 2.0 * n_out * sw[1] + (n_out if b is not None else 0)
    return Cost(flops, float(_nbytes(x) + _nbytes(w) + _nbytes(b) + n_out * itemsize))


linear: Op[..., Tensor] = declare("linear", quiet(_linear_kernel), _linear_meta, _linear_cost)
# Both call BLAS: with the intra-op count left unset, two side by side make a crowd however
# short they are (one BLAS thread each: dataflow._blas).
matmul.intraop = True
linear.intraop = True
linear.__doc__ = (
    "``linear(x, w, b=None) = x @ w.T + b`` (torch's convention: ``w`` is "
    "``(out_features, in_features)``, ``b`` is ``(out_features,)``)."
)
