"""The LSTM ensemble in plain numpy: the reference every contender's output is checked against.

The seed tutorial's model: 4 members, each a bidirectional LSTM (one LSTM over the sequence,
one over the time-flipped sequence, its output flipped back, the two concatenated on the
channel axis); the members' outputs are stacked and summed. float32 throughout.

An LSTM direction is computed the usual efficient way: one GEMM projects the input of every
time step at once (``(T*B, C) @ (C, 4H)``), then the recurrence does one ``(B, H) @ (H, 4H)``
GEMM and the gate arithmetic per step. Gates are in torch's order (input, forget, cell,
output) and the weights use torch's names and shapes, so they load into ``torch.nn.LSTM``
and ``ops.nn.LSTM`` unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "EnsembleWeights",
    "LSTMWeights",
    "MemberWeights",
    "allclose",
    "bilstm_forward",
    "ensemble_forward",
    "gemm_flops",
    "input_projection",
    "lstm_forward",
    "lstm_step",
    "make_input",
    "make_weights",
    "project",
]

F32 = npt.NDArray[np.float32]

# Outputs must agree this closely (np.allclose); the absolute part covers entries near 0,
# where different BLAS libraries' float32 rounding after 50 steps is ~1e-6 in absolute terms.
RTOL = 1e-4
ATOL = 1e-5


@dataclass(frozen=True)
class LSTMWeights:
    """One LSTM direction, torch's layout: ``w_ih`` (4H, C), ``w_hh`` (4H, H), biases (4H,)."""

    w_ih: F32
    w_hh: F32
    b_ih: F32
    b_hh: F32

    @property
    def hidden(self) -> int:
        return int(self.w_hh.shape[1])


@dataclass(frozen=True)
class MemberWeights:
    """One bidirectional member: the forward-in-time and the backward-in-time LSTM."""

    forward: LSTMWeights
    backward: LSTMWeights


@dataclass(frozen=True)
class EnsembleWeights:
    """All members' weights."""

    channels: int
    models: tuple[MemberWeights, ...]

    def directions(self) -> list[LSTMWeights]:
        return [d for m in self.models for d in (m.forward, m.backward)]


def _uniform(rng: np.random.Generator, shape: tuple[int, ...], k: float) -> F32:
    a = rng.random(shape, dtype=np.float32)
    a *= np.float32(2 * k)
    a -= np.float32(k)
    return a


def make_weights(channels: int, n_models: int = 4, seed: int = 0) -> EnsembleWeights:
    """Random weights initialised like torch's (uniform in +-1/sqrt(H))."""
    rng = np.random.default_rng(seed)
    c = channels
    k = 1.0 / np.sqrt(c)

    def direction() -> LSTMWeights:
        return LSTMWeights(
            _uniform(rng, (4 * c, c), k),
            _uniform(rng, (4 * c, c), k),
            _uniform(rng, (4 * c,), k),
            _uniform(rng, (4 * c,), k),
        )

    return EnsembleWeights(
        c, tuple(MemberWeights(direction(), direction()) for _ in range(n_models))
    )


def make_input(t: int, b: int, c: int, seed: int = 1) -> F32:
    """The input sequence, uniform in [0, 1) like the tutorial's ``torch.rand``."""
    return np.random.default_rng(seed).random((t, b, c), dtype=np.float32)


def gemm_flops(t: int, b: int, c: int, n_models: int = 4) -> float:
    """Matmul FLOPs of one ensemble forward (hidden size = channels): 335.5e9 at the seed size."""
    per_direction = 2.0 * t * b * c * 4 * c + 2.0 * t * b * c * 4 * c
    return 2 * n_models * per_direction


def input_projection(x: F32, w: LSTMWeights) -> F32:
    """The input's contribution to every step's gates: ``x @ w_ih.T + b_ih + b_hh``, (T, B, 4H)."""
    return project(x, w.w_ih, w.b_ih + w.b_hh)


def project(x: F32, w_ih: F32, bias: F32) -> F32:
    """``x @ w_ih.T + bias`` for every step at once: one (T*B, C) x (C, 4H) GEMM."""
    t, b, c = x.shape
    gx: F32 = np.ascontiguousarray(x).reshape(t * b, c) @ w_ih.T
    gx += bias
    return gx.reshape(t, b, -1)


def lstm_step(gx_t: F32, h: F32 | None, c: F32 | None, w_hh: F32) -> tuple[F32, F32]:
    """One recurrence step from the step's input gates and the previous state (None at t=0).

    Lean on purpose (it is the baseline): one exp over all four gates, using
    ``tanh(x) = 2 * sigmoid(2x) - 1`` for the cell gate, since numpy's float32 ``exp`` is much
    faster than its ``tanh``. Pre-activations stay far from exp's float32 overflow (|x| < 88)
    with these weights (|w| <= 1/sqrt(H)) and inputs (|x|, |h| <= 1).
    """
    hidden = w_hh.shape[1]
    g = gx_t.copy() if h is None else gx_t + h @ w_hh.T
    cell_gate = g[:, 2 * hidden : 3 * hidden]
    cell_gate *= np.float32(2.0)
    np.negative(g, out=g)
    np.exp(g, out=g)
    g += np.float32(1.0)
    np.reciprocal(g, out=g)  # sigmoid of every gate (of twice the cell gate)
    i = g[:, :hidden]
    f = g[:, hidden : 2 * hidden]
    o = g[:, 3 * hidden :]
    cell_gate *= np.float32(2.0)
    cell_gate -= np.float32(1.0)  # tanh of the cell gate
    cell_gate *= i
    if c is None:
        c_new: F32 = cell_gate.copy()
    else:
        c_new = f * c
        c_new += cell_gate
    h_new: F32 = np.tanh(c_new)
    h_new *= o
    return h_new, c_new


def lstm_forward(x: F32, w: LSTMWeights) -> F32:
    """One LSTM direction over the whole sequence, from a zero state: the outputs (T, B, H)."""
    gx = input_projection(x, w)
    t_steps, b, _ = x.shape
    out: F32 = np.empty((t_steps, b, w.hidden), dtype=np.float32)
    h: F32 | None = None
    c: F32 | None = None
    for t in range(t_steps):
        h, c = lstm_step(gx[t], h, c, w.w_hh)
        out[t] = h
    return out


def bilstm_forward(x: F32, m: MemberWeights) -> F32:
    """One member: forward LSTM and flipped backward LSTM, concatenated on channels."""
    out_f = lstm_forward(x, m.forward)
    out_b = lstm_forward(np.ascontiguousarray(x[::-1]), m.backward)
    return np.concatenate([out_f, out_b[::-1]], axis=2)


def ensemble_forward(x: F32, weights: EnsembleWeights) -> F32:
    """The whole ensemble, sequentially: the plain-numpy contender and the reference."""
    results = [bilstm_forward(x, m) for m in weights.models]
    out: F32 = np.stack(results).sum(axis=0)
    return out


def allclose(actual: Any, expected: F32) -> tuple[bool, float]:
    """Whether ``actual`` matches the reference (RTOL, ATOL), and the largest abs difference."""
    a = np.asarray(actual, dtype=np.float32)
    if a.shape != expected.shape:
        return False, float("inf")
    return bool(np.allclose(a, expected, rtol=RTOL, atol=ATOL)), float(np.max(np.abs(a - expected)))
