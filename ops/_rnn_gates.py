"""The recurrent kernels' gate math: in place on a step's gate buffer, in the fewest passes
for the size, through the faster transcendental.

* **One transcendental pass for the four LSTM gates.** Either ``exp`` (sigmoid as
  ``1 / (1 + exp(-x))``, and ``tanh(g) = 2 sigmoid(2g) - 1`` for the cell gate) or ``tanh``
  (``tanh(g)`` directly, and ``sigmoid(x) = (tanh(x / 2) + 1) / 2``), whichever
  :func:`_tanh_form_is_faster` measures faster for the gates' shape (:func:`_lstm_gates`
  builds the step's nonlinearity once per call): numpy's float32 ``tanh`` was ~3x slower
  than its ``exp`` on the first development machines (294 vs 106 us at (50, 1024)) and is
  2-4x faster on an AVX-512 CPU (8 vs 34 us for the state's tanh at (1024, 50); the gates'
  nonlinearity 54 vs 132 us at (4096, 50)). Below :data:`TANH_DIRECT_MAX` elements the
  ``exp`` form is kept for the gates and ``np.tanh`` used for the state (one call; call
  overhead dominates there): :func:`_tanh_into`.
* **The GRU's gates** (:func:`_gru_gates`): ``r, z = sigmoid(gi_rz + rz)`` in one ``exp``
  pass, then ``n = tanh(gi_n + r * n)``, in place on views of the step's buffer.
* **No allocation.** Everything here writes into the arrays it is given (``out=``); the
  step's GEMM goes straight into the gate buffer (:func:`_gemm_into`).

The kernels import these by name (they run every step: no attribute lookup in the loop).
Gate order and equations are torch's (see :mod:`ops._recurrent`): i, f, g, o for the LSTM,
r, z, n for the GRU.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeAlias

import numpy as np

__all__ = ["TANH_DIRECT_MAX"]

Array: TypeAlias = "np.ndarray[Any, Any]"

#: Largest state (batch * hidden elements) whose tanh uses ``np.tanh`` (one ufunc call) rather
#: than the six-call ``exp`` form: below it call overhead dominates, above it ``exp`` is faster.
TANH_DIRECT_MAX = 8192

_LSTM_GATES = 4  # i, f, g, o
_GRU_GATES = 3  # r, z, n
#: Runs of each form :func:`_tanh_form_is_faster` times (the best counts).
_TANH_REPEATS = 5


@functools.lru_cache(maxsize=64)
def _lstm_exp_scale(hidden: int, dtype: np.dtype[Any]) -> Array:
    """Per-column factors -1 (i, f, o) and -2 (g) for the one ``exp`` over all four gates."""
    scale = np.full(4 * hidden, -1.0, dtype=dtype)
    scale[2 * hidden : 3 * hidden] = -2.0
    scale.setflags(write=False)
    return scale


@functools.lru_cache(maxsize=64)
def _lstm_tanh_scale(hidden: int, dtype: np.dtype[Any]) -> Array:
    """Per-column factors 0.5 (i, f, o: sigmoid(x) = (tanh(x / 2) + 1) / 2) and 1 (g)."""
    scale = np.full(4 * hidden, 0.5, dtype=dtype)
    scale[2 * hidden : 3 * hidden] = 1.0
    scale.setflags(write=False)
    return scale


@functools.lru_cache(maxsize=64)
def _tanh_form_is_faster(shape: tuple[int, ...], dtype: np.dtype[Any]) -> bool:
    """Whether the gates' nonlinearity is faster through ``np.tanh`` than through ``np.exp``,
    measured once per gate-array shape and dtype (numpy's SIMD ``tanh`` is 2-4x faster than its
    ``exp`` on some CPUs, 3x slower on others). Small arrays keep the ``exp`` form. The same
    answer picks how a large cell state's ``tanh`` is computed (:func:`_tanh_into`)."""
    if int(np.prod(shape)) <= TANH_DIRECT_MAX:
        return False
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape).astype(dtype)
    one = dtype.type(1.0)
    half = dtype.type(0.5)
    exp_form = tanh_form = float("inf")
    with np.errstate(over="ignore"):
        for _ in range(_TANH_REPEATS):
            t0 = time.perf_counter()
            np.negative(a, out=a)
            np.exp(a, out=a)
            np.add(a, one, out=a)
            np.reciprocal(a, out=a)
            exp_form = min(exp_form, time.perf_counter() - t0)
            t0 = time.perf_counter()
            np.multiply(a, half, out=a)
            np.tanh(a, out=a)
            np.multiply(a, half, out=a)
            np.add(a, half, out=a)
            tanh_form = min(tanh_form, time.perf_counter() - t0)
    return tanh_form < 0.9 * exp_form


def _lstm_gates(gates: Array, hidden: int, transposed: bool) -> Callable[[Array], None]:
    """The in-place nonlinearity of an LSTM step's gate pre-activations (i, f, g, o along the
    gate axis: columns, or rows when ``transposed``): sigmoid on i, f, o and tanh on g, in the
    form measured faster for this shape (:func:`_tanh_form_is_faster`)."""
    dtype = gates.dtype
    one, two, half = dtype.type(1.0), dtype.type(2.0), dtype.type(0.5)

    def part(lo: int, hi: int) -> Array:
        cols = slice(lo * hidden, hi * hidden)
        view: Array = gates[cols] if transposed else gates[:, cols]
        return view

    if_, g, o = part(0, 2), part(2, 3), part(3, 4)
    if _tanh_form_is_faster(gates.shape, dtype):
        scale = _lstm_tanh_scale(hidden, dtype)
        scale = scale[:, None] if transposed else scale

        def tanh_form(gates: Array) -> None:
            # tanh of every gate (of x / 2 for i, f, o), then sigmoid = (t + 1) / 2 for those.
            np.multiply(gates, scale, out=gates)
            np.tanh(gates, out=gates)
            for s in (if_, o):
                np.multiply(s, half, out=s)
                np.add(s, half, out=s)

        return tanh_form
    scale = _lstm_exp_scale(hidden, dtype)
    scale = scale[:, None] if transposed else scale

    def exp_form(gates: Array) -> None:
        # sigmoid of every gate (of 2g for the cell gate) in one exp pass, ...
        np.multiply(gates, scale, out=gates)
        np.exp(gates, out=gates)
        np.add(gates, one, out=gates)
        np.reciprocal(gates, out=gates)
        # ... then tanh(g) = 2 sigmoid(2g) - 1 on g's columns only.
        np.multiply(g, two, out=g)
        np.subtract(g, one, out=g)

    return exp_form


def _gemm_into(a: Array, b: Array, out: Array) -> None:
    """``out = a @ b``: ``np.dot`` (less call overhead than ``np.matmul``) where it can write
    ``out`` directly, which needs both operands' dtype to match ``out``'s."""
    np.dot(a, b, out=out)


def _tanh_into(src: Array, out: Array) -> None:
    """``out = tanh(src)``; src is left unchanged."""
    if src.size <= TANH_DIRECT_MAX or _tanh_form_is_faster(src.shape, out.dtype):
        np.tanh(src, out=out)
        return
    one, two = out.dtype.type(1.0), out.dtype.type(2.0)
    np.multiply(src, -two, out=out)
    with np.errstate(over="ignore"):  # exp(-2x) -> inf for x << 0 gives the right limit, -1
        np.exp(out, out=out)
    np.add(out, one, out=out)
    np.reciprocal(out, out=out)
    np.multiply(out, two, out=out)
    np.subtract(out, one, out=out)


def _gru_gates(rz: Array, r: Array, n: Array, gi_rz: Array, gi_n: Array, one: Any) -> None:
    """A GRU step's gates in place, ``rz``, ``r`` and ``n`` views of the step's ``h @ W_hh.T
    (+ b_hh)`` and ``gi_*`` of its input projection: ``r, z = sigmoid(gi_rz + rz)``, then ``n
    = tanh(gi_n + r * n)``."""
    rz += gi_rz
    np.negative(rz, out=rz)
    with np.errstate(over="ignore"):
        np.exp(rz, out=rz)
    np.add(rz, one, out=rz)
    np.reciprocal(rz, out=rz)  # sigmoid(r), sigmoid(z)
    n *= r
    n += gi_n
    _tanh_into(n, n)
