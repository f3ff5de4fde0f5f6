"""``Linear``: ``y = x @ weight.T + bias``, torch's parameter names, shapes and init."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dataflow import Cost, OpInputError, OpTypeError

from .._tensor import Tensor, TensorSpec, define, spec_of
from ._module import Module, make_rng, uniform

__all__ = ["Linear"]

Array = np.ndarray[Any, Any]


def _linear_kernel(x: Array, weight: Array, bias: Array | None) -> Array:
    # One GEMM over all leading axes (numpy's matmul broadcasts x's batch axes), bias in place.
    out: Array = np.matmul(x, weight.T)
    if bias is not None:
        out += bias
    return out


def _linear_meta(x: Any, weight: Any, bias: Any) -> TensorSpec:
    xs, ws = spec_of(x), spec_of(weight)
    bs = None if bias is None else spec_of(bias)
    got = f"x {xs!r}, weight {ws!r}" + ("" if bs is None else f", bias {bs!r}")
    if xs.dtype != ws.dtype or (bs is not None and bs.dtype != ws.dtype) or ws.dtype.kind != "f":
        raise OpTypeError(
            f"nn.Linear: x, weight and bias must share one floating-point dtype (got {got}); "
            "convert x with .astype(np.float32)"
        )
    if len(ws.shape) != 2 or not xs.shape or xs.shape[-1] != ws.shape[1]:
        raise OpInputError(
            f"nn.Linear: x's last axis must be in_features = {ws.shape[-1]} (got {got})"
        )
    if bs is not None and bs.shape != (ws.shape[0],):
        raise OpInputError(f"nn.Linear: bias must have shape ({ws.shape[0]},) (got {got})")
    return TensorSpec((*xs.shape[:-1], ws.shape[0]), xs.dtype)


def _linear_cost(x: Any, weight: Any, bias: Any) -> Cost:
    xs, ws = spec_of(x), spec_of(weight)
    rows = math.prod(xs.shape[:-1])
    item = ws.dtype.itemsize
    return Cost(
        2.0 * rows * ws.shape[0] * ws.shape[1],
        float(item * (rows * ws.shape[1] + ws.shape[0] * ws.shape[1] + rows * ws.shape[0])),
    )


_linear = define("linear", _linear_kernel, _linear_meta, _linear_cost)


class Linear(Module):
    """``y = x @ weight.T + bias`` (like ``torch.nn.Linear``).

    Parameters ``weight`` (out_features, in_features) and ``bias`` (out_features,), drawn from
    U(-1/sqrt(in_features), 1/sqrt(in_features)) as torch does.

    Args:
        in_features: size of x's last axis.
        out_features: size of y's last axis.
        bias: whether to add a bias.
        dtype: parameter dtype (float32 by default).
        seed: seed for the initial weights (or pass ``rng``, a numpy Generator).

    Example:
        >>> fc = ops.nn.Linear(1024, 10, seed=0)
        >>> y = await fc(x)          # x: (..., 1024) -> y: (..., 10), a pending Tensor
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        dtype: Any = np.float32,
        seed: int | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"nn.Linear: {name} must be a positive int, got {v!r}")
        self.in_features = in_features
        self.out_features = out_features
        gen = make_rng(seed, rng, "nn.Linear")
        bound = 1.0 / math.sqrt(in_features)
        dt = np.dtype(dtype)
        self.weight = uniform(gen, bound, (out_features, in_features), dt)
        self.bias: Array | None = uniform(gen, bound, (out_features,), dt) if bias else None

    async def forward(self, x: Tensor | Array) -> Tensor:
        """``x @ weight.T + bias`` for x of shape (..., in_features)."""
        y: Tensor = _linear(x, self.weight, self.bias)
        return y

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )
