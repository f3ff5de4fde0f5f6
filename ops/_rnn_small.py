"""numpy's sequence kernels for small models (the ``"numpy"`` engine's small kernels): the
fewest numpy calls per step.

Where a step's arithmetic is a few microseconds, numpy's per-call overhead (about 0.4 us a
call) is most of it, so these kernels trade a copy of the weights made for each call (about
0.3 ns an element, a few microseconds at this size) for fewer calls per step (about 2 us a
step saved). The copy has the sigmoid gates' rows halved, so that one ``tanh`` gives every
gate at once, the sigmoids as ``(tanh(x / 2) + 1) / 2`` in one multiply-add:

* the LSTM (:func:`_lstm_sequence_small`) also reorders its gate rows i, f, o, g, so the
  three sigmoids sit side by side: 10 numpy calls a step instead of 13 (15-30% faster at
  (10, 1, 32) to (50, 1, 128));
* the GRU (:func:`_gru_sequence_small`) folds ``b_hh``'s r and z parts into the
  projection's bias (only ``b_hn`` stays in the step, inside ``r * (W_hn h + b_hn)``): 11
  numpy calls a step (10 without ``b_hh``) instead of 15 and two Python calls.

Nothing is cached: a parameter written in place is read at the next call. Which models are
small enough, and measured how, is :mod:`ops._rnn_engine`'s (``SMALL_WEIGHTS_PER_STEP``,
``SMALL_GATES_MAX``); the numba engine, where it runs, takes them before these kernels do.
Each takes the arguments of its direction's entry point (:mod:`ops._rnn_sequence`:
``lstm_sequence_kernel``, ``gru_sequence_kernel``) and gives the same values as the plain
kernels within float32 rounding.
"""

from __future__ import annotations

import functools
from typing import Any, TypeAlias

import numpy as np

from ._rnn_buffers import _output, _scratch
from ._rnn_gates import _GRU_GATES, _LSTM_GATES
from ._rnn_projection import _chunks, _project_chunk, chunk_steps

__all__: list[str] = []

Array: TypeAlias = "np.ndarray[Any, Any]"


@functools.lru_cache(maxsize=64)
def _small_order(hidden: int, dtype: np.dtype[Any]) -> tuple[Array, Array]:
    """The gate rows reordered i, f, o, g, and their factors: 0.5 for the sigmoid gates
    (``sigmoid(x) = (tanh(x / 2) + 1) / 2``), 1 for g."""
    h = hidden
    perm = np.concatenate([np.arange(0, 2 * h), np.arange(3 * h, 4 * h), np.arange(2 * h, 3 * h)])
    scale = np.ones(4 * h, dtype=dtype)
    scale[: 3 * h] = 0.5
    perm.setflags(write=False)
    scale.setflags(write=False)
    return perm, scale


def _lstm_sequence_small(
    x: Array,
    w_ih: Array,
    bias: Array | None,
    w_hh: Array,
    h0: Array | None,
    c0: Array | None,
    reverse: bool,
    batch_first: bool,
) -> tuple[Array, Array, Array]:
    """:func:`ops._rnn_sequence.lstm_sequence_kernel` for a small model (see
    ``SMALL_WEIGHTS_PER_STEP``): the fewest numpy calls per step, 10 instead of 13.

    It works on a copy of the weights made for this call (a few microseconds at this size:
    nothing is cached, so a parameter written in place is read at the next call) with the
    gate rows reordered i, f, o, g and the sigmoid gates' rows halved. One ``tanh`` then
    gives all four gates' nonlinearity at once, and the three sigmoids, now side by side,
    take one multiply-add: ``(t + 1) / 2``.
    """
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    hidden = w_hh.shape[1]
    width = _LSTM_GATES * hidden
    dtype = w_hh.dtype
    perm, scale = _small_order(hidden, dtype)
    column = scale[:, None]
    # (take and an in-place multiply: a third less than indexing and multiplying into a new
    # array, which is most of this kernel's fixed cost at the smallest sizes)
    w_ih_s = w_ih.take(perm, axis=0, out=_scratch("w_ih", w_ih.shape, w_ih.dtype), mode="clip")
    w_ih_s *= column
    w_hh_s = w_hh.take(perm, axis=0, out=_scratch("w_hh", w_hh.shape, dtype), mode="clip")
    w_hh_s *= column
    w_hh_t = w_hh_s.T
    bias_s = None
    if bias is not None:
        bias_s = bias.take(perm)
        bias_s *= scale
    out = _output(steps, batch, hidden, dtype, batch_first)
    seq = out.swapaxes(0, 1) if batch_first else out  # (T, B, H) view either way
    size = chunk_steps(steps, batch, width, dtype.itemsize)
    buf = _scratch("chunk", (size * batch, width), dtype)
    gates = _scratch("gates", (batch, width), dtype)
    c = np.zeros((batch, hidden), dtype=dtype) if c0 is None else np.array(c0, dtype=dtype)
    sig = gates[:, : 3 * hidden]
    i = gates[:, :hidden]
    f = gates[:, hidden : 2 * hidden]
    o = gates[:, 2 * hidden : 3 * hidden]
    g = gates[:, 3 * hidden :]
    half = dtype.type(0.5)
    dot, add, multiply, tanh = np.dot, np.add, np.multiply, np.tanh
    h: Array | None = h0
    for t0, t1 in _chunks(steps, size, reverse):
        xp = _project_chunk(x, t0, t1, w_ih_s, bias_s, batch_first, buf)
        for t in range(t1 - 1, t0 - 1, -1) if reverse else range(t0, t1):
            if h is None:
                np.copyto(gates, xp[t - t0])
            else:
                dot(h, w_hh_t, out=gates)
                add(gates, xp[t - t0], out=gates)
            tanh(gates, out=gates)
            multiply(sig, half, out=sig)
            add(sig, half, out=sig)
            multiply(i, g, out=i)
            multiply(c, f, out=c)
            add(c, i, out=c)
            h = seq[t]
            tanh(c, out=h)
            multiply(h, o, out=h)
    h_n = np.array(seq[0] if reverse else seq[steps - 1])
    return out, h_n, c


@functools.lru_cache(maxsize=64)
def _gru_small_scale(hidden: int, dtype: np.dtype[Any]) -> Array:
    """The GRU's gate factors for :func:`_gru_sequence_small`: 0.5 for r and z (``sigmoid(x) =
    (tanh(x / 2) + 1) / 2``), 1 for n."""
    scale = np.ones(_GRU_GATES * hidden, dtype=dtype)
    scale[: 2 * hidden] = 0.5
    scale.setflags(write=False)
    return scale


def _gru_sequence_small(
    x: Array,
    w_ih: Array,
    b_ih: Array | None,
    w_hh: Array,
    b_hh: Array | None,
    h0: Array | None,
    reverse: bool,
    batch_first: bool,
) -> tuple[Array, Array]:
    """:func:`ops._rnn_sequence.gru_sequence_kernel` for a small model (the LSTM's bounds,
    ``SMALL_WEIGHTS_PER_STEP`` and ``SMALL_GATES_MAX``): the fewest numpy calls per step, 11
    (10 without ``b_hh``) instead of 15 and two Python calls.

    As :func:`_lstm_sequence_small`, it works on a copy of the weights made for this call
    (nothing is cached) with the r and z rows halved, so one ``tanh`` and one multiply-add
    give both sigmoids; the r and z parts of ``b_hh`` are folded into the projection's bias
    (only ``b_hn`` stays in the step, inside ``r * (W_hn h + b_hn)``).
    """
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    hidden = w_hh.shape[1]
    width = _GRU_GATES * hidden
    dtype = w_hh.dtype
    scale = _gru_small_scale(hidden, dtype)
    column = scale[:, None]
    w_ih_s = np.multiply(
        w_ih, column, out=_scratch("w_ih", w_ih.shape, np.result_type(w_ih, column))
    )
    w_hh_t = np.multiply(w_hh, column, out=_scratch("w_hh", w_hh.shape, dtype)).T
    bias = None if b_ih is None else np.array(b_ih, dtype=dtype)
    b_hn = None
    if b_hh is not None:
        if bias is None:
            bias = np.zeros(width, dtype=dtype)
        bias[: 2 * hidden] += b_hh[: 2 * hidden]
        b_hn = b_hh[2 * hidden :]
    bias_s = None if bias is None else np.multiply(bias, scale)
    out = _output(steps, batch, hidden, dtype, batch_first)
    seq = out.swapaxes(0, 1) if batch_first else out  # (T, B, H) view either way
    size = chunk_steps(steps, batch, width, dtype.itemsize)
    buf = _scratch("chunk", (size * batch, width), dtype)
    gh = _scratch("gh", (batch, width), dtype)
    rz = gh[:, : 2 * hidden]
    r = gh[:, :hidden]
    z = gh[:, hidden : 2 * hidden]
    n = gh[:, 2 * hidden :]
    half = dtype.type(0.5)
    dot, add, subtract, multiply, tanh = np.dot, np.add, np.subtract, np.multiply, np.tanh
    h: Array = np.zeros((batch, hidden), dtype=dtype) if h0 is None else h0
    for t0, t1 in _chunks(steps, size, reverse):
        xp = _project_chunk(x, t0, t1, w_ih_s, bias_s, batch_first, buf)
        xp_rz = xp[:, :, : 2 * hidden]
        xp_n = xp[:, :, 2 * hidden :]
        for t in range(t1 - 1, t0 - 1, -1) if reverse else range(t0, t1):
            dot(h, w_hh_t, out=gh)
            if b_hn is not None:
                add(n, b_hn, out=n)
            add(rz, xp_rz[t - t0], out=rz)
            tanh(rz, out=rz)
            multiply(rz, half, out=rz)
            add(rz, half, out=rz)  # sigmoid(r), sigmoid(z)
            multiply(n, r, out=n)
            add(n, xp_n[t - t0], out=n)
            tanh(n, out=n)
            # h' = (1 - z) * n + z * h = n + z * (h - n), written into the output's row.
            h_new = seq[t]
            subtract(h, n, out=h_new)
            multiply(h_new, z, out=h_new)
            add(h_new, n, out=h_new)
            h = h_new
    return out, np.array(h)
