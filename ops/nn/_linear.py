"""``Linear``: ``y = x @ weight.T + bias`` (the ``ops.linear`` op), torch's names and init."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dataflow import OpInputError, OpTypeError

from .._checks import operand
from .._linalg import linear
from .._tensor import Tensor, spec_of
from ._module import Module, check_flag, check_positive, float_dtype, make_rng, uniform

__all__ = ["Linear"]

Array = np.ndarray[Any, Any]


class Linear(Module):
    """``y = x @ weight.T + bias`` (like ``torch.nn.Linear``).

    Parameters ``weight`` (out_features, in_features) and ``bias`` (out_features,), drawn from
    U(-1/sqrt(in_features), 1/sqrt(in_features)) as torch does.

    Args:
        in_features: size of x's last axis.
        out_features: size of y's last axis.
        bias: whether to add a bias (a bool).
        dtype: parameter dtype, floating (float32 by default).
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
        in_features = check_positive("nn.Linear", "in_features", in_features)
        out_features = check_positive("nn.Linear", "out_features", out_features)
        with_bias = check_flag("nn.Linear", "bias", bias)
        dt = float_dtype("nn.Linear", dtype)
        self.in_features = in_features
        self.out_features = out_features
        gen = make_rng(seed, rng, "nn.Linear")
        bound = 1.0 / math.sqrt(in_features)
        self.weight = uniform(gen, bound, (out_features, in_features), dt)
        self.bias: Array | None = uniform(gen, bound, (out_features,), dt) if with_bias else None

    async def forward(self, x: Tensor | Array) -> Tensor:
        """``x @ weight.T + bias`` for x of shape (..., in_features)."""
        operand("nn.Linear", "x", x)  # not an array, or an ndarray subclass: named here
        if not isinstance(x, Tensor | np.ndarray):
            x = np.asarray(x)
        s = spec_of(x)
        if not s.shape or s.shape[-1] != self.in_features:
            raise OpInputError(
                f"nn.Linear: x must have shape (..., in_features={self.in_features}), got {s!r}"
            )
        if s.dtype != self.weight.dtype:
            # Not promoted: a float64 input would silently make the whole model float64.
            raise OpTypeError(
                f"nn.Linear: x has dtype {s.dtype} but the weight is {self.weight.dtype}; "
                f"convert x with .astype(np.{self.weight.dtype})"
            )
        y: Tensor = linear(x, self.weight, self.bias)
        return y

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )
