"""The LSTM's whole-sequence kernels, one direction of one layer with the time loop inside
one call, in every form :func:`ops._rnn_sequence.lstm_sequence_kernel` chooses among.

Each form computes the same values, torch's (gates i, f, g, o; see :mod:`ops._recurrent`),
with nothing allocated per step: the gate pre-activations go into one preallocated buffer
(``out=``), the gate math (:mod:`ops._rnn_gates`) runs in place on it, the cell state is
updated in place, and each step's h is written straight into its row of the output, where the
next step's GEMM reads it: nothing is copied between steps. The input projection runs in
time chunks (:mod:`ops._rnn_projection`), except in the fused form. The forms differ in how
the step's GEMM runs:

* **Plain** (:func:`_lstm_sequence_plain`): ``h @ W_hh.T`` (batch x gates), the weight in
  either memory order (:func:`ops._rnn_layout.lay_out` stores it in Fortran order where
  this form wins with it).
* **Transposed** (:func:`_lstm_sequence_transposed`): with OpenBLAS's AVX-512 kernels the
  recurrent product is about 25% faster as ``W @ h.T`` (gates x batch) than as ``h @ W.T``
  (batch x gates): 2.4 against 3.1-3.4 ms at (50, 1024) x (1024, 4096) on one thread of an
  AMD EPYC (AVX2 kernels: equal). Where the transposed form wins (with ``W`` row-major:
  ``lay_out`` keeps it so there) the kernel keeps its gates, cell and hidden state
  transposed (features x batch) for the whole sequence, computes the input projection
  transposed too (``W_ih @ x.T``), and writes each step's h into its output row with one
  small transposing copy. Its gate math then works on contiguous row blocks rather than
  strided column blocks, which pays even where the GEMMs tie.
* **In column blocks** (:func:`_lstm_sequence_blocked`). At most sizes below the
  tutorial's, both of those GEMMs lose to 16 or 32 small ones: ``h @ Wb[k]`` for each block
  of 32, 64 or 128 gate columns, with ``W_hh`` copied for the call into ``(blocks, H,
  width)`` (row-major blocks of ``W.T``) and run as one stacked ``np.matmul`` (numpy loops
  over the blocks in C). One step's GEMM at (B, H) = (50, 256): 105 us against 136
  transposed and 197 plain; (8, 512): 70 against 197. The blocked kernel keeps its gates,
  cell and hidden state in that block layout (blocks x batch x width: each gate is whole
  blocks, contiguous; :mod:`ops._rnn_buffers`) and writes each step's h into its output row
  with one small transposing copy. Whole directions on one thread: 0.89x the best of the
  other two forms at (50, 50, 256), 0.62x at (50, 8, 512), 0.56x at (50, 4, 256),
  0.86-0.96x from H = 64 to 512; none better at the tutorial's (50, 50, 1024), where the
  per-call copy (16 MiB) is not tried (``ops._rnn_forms.BLOCK_COPY_BYTES_MAX``). The GRU
  kernel has the same blocked form (:mod:`ops._rnn_gru`).
* **In narrow blocks read in place** (the blocked kernel with ``view``). ``W_hh`` is not
  copied: block ``k`` is ``h @ W[k*w : (k+1)*w].T``, a row-major weight's row block that BLAS
  reads as a transposed operand (``("view", w)``, ``ops._rnn_forms.VIEW_WIDTHS``), so no
  size bound applies. Blocks of 8 or 16 gate columns keep each product within OpenBLAS's
  small-matrix kernels: at the tutorial's (50, 1024) one step ran at 94 GFLOP/s against 76
  transposed, and a whole direction in 456 ms against 512.
* **With the projection inside the step** (:func:`_lstm_sequence_fused`). Both weights are
  copied for the call into column blocks of ``[W_ih, W_hh].T`` and each step's gates are one
  stacked ``np.matmul([x_t, h], wb)``: no projection of the sequence and no buffer for it.
  Each block's product is then small enough for OpenBLAS's small-matrix kernels, which skip
  packing the operands: one thread at (T, B, C) = (50, 50, 256), 116 GFLOP/s against 95-102
  for the projection as one big GEMM and 115 for the recurrent product alone in blocks; a
  whole direction 27.5 ms against 30.5 blocked, 33.6 transposed and 38.8 plain; 108 against
  112 blocked at (50, 50, 512). Up to ``ops._rnn_forms.FUSED_COPY_BYTES_MAX`` of weights
  (not at the tutorial's size).

A small model takes numpy's small kernel instead (:mod:`ops._rnn_small`) or numba's loop.
Where the engine is numba (:func:`ops._rnn_engine._numba_gates`), the blocked and fused
forms run each step's gate math as one compiled pass; the GEMMs stay BLAS's. Every kernel
takes ``lstm_sequence_kernel``'s arguments (the blocked and fused ones a block width too)
and returns (output, h_n, c_n). What a kernel calls per step or per chunk is imported by
name: no attribute lookup in its loops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import numpy as np

from ._rnn_buffers import _output, _output_blocks, _scratch, _weight_blocks
from ._rnn_engine import _numba_gates
from ._rnn_gates import _LSTM_GATES, _gemm_into, _lstm_gates, _tanh_into
from ._rnn_numba import NO_BIAS as _NO_BIAS
from ._rnn_projection import _chunks, _project_chunk, _rows, chunk_steps

__all__: list[str] = []

Array: TypeAlias = "np.ndarray[Any, Any]"

_NO_COL = np.zeros((0, 0), dtype=np.float32)  # (the gate steps' "no projected input")


def _lstm_sequence_plain(
    x: Array,
    w_ih: Array,
    bias: Array | None,
    w_hh: Array,
    h0: Array | None,
    c0: Array | None,
    reverse: bool,
    batch_first: bool,
) -> tuple[Array, Array, Array]:
    """:func:`lstm_sequence_kernel` with the recurrent GEMM as ``h @ W_hh.T`` (batch x
    features per step; the weight in either memory order)."""
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    hidden = w_hh.shape[1]
    width = _LSTM_GATES * hidden
    dtype = w_hh.dtype
    out = _output(steps, batch, hidden, dtype, batch_first)
    seq = out.swapaxes(0, 1) if batch_first else out  # (T, B, H) view either way
    size = chunk_steps(steps, batch, width, dtype.itemsize)
    buf = _scratch("chunk", (size * batch, width), dtype)
    gates = _scratch("gates", (batch, width), dtype)
    c = np.zeros((batch, hidden), dtype=dtype) if c0 is None else np.array(c0, dtype=dtype)
    i = gates[:, :hidden]
    f = gates[:, hidden : 2 * hidden]
    g = gates[:, 2 * hidden : 3 * hidden]
    o = gates[:, 3 * hidden :]
    nonlinear = _lstm_gates(gates, hidden, False)
    w_hh_t = w_hh.T
    h: Array | None = h0
    with np.errstate(over="ignore"):  # exp(-x) -> inf for x << 0: sigmoid's right limit, 0
        for t0, t1 in _chunks(steps, size, reverse):
            xp = _project_chunk(x, t0, t1, w_ih, bias, batch_first, buf)
            for t in range(t1 - 1, t0 - 1, -1) if reverse else range(t0, t1):
                if h is None:
                    np.copyto(gates, xp[t - t0])
                else:
                    _gemm_into(h, w_hh_t, gates)
                    np.add(gates, xp[t - t0], out=gates)
                nonlinear(gates)
                np.multiply(i, g, out=i)
                np.multiply(c, f, out=c)
                np.add(c, i, out=c)
                h = seq[t]
                _tanh_into(c, h)
                np.multiply(h, o, out=h)
    h_n = np.array(seq[0] if reverse else seq[steps - 1])
    return out, h_n, c


def _lstm_sequence_transposed(
    x: Array,
    w_ih: Array,
    bias: Array | None,
    w_hh: Array,
    h0: Array | None,
    c0: Array | None,
    reverse: bool,
    batch_first: bool,
) -> tuple[Array, Array, Array]:
    """:func:`lstm_sequence_kernel` with every per-step array transposed (features x batch):
    the recurrent GEMM as ``W_hh @ h.T`` (see the module docstring). Same results."""
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    hidden = w_hh.shape[1]
    width = _LSTM_GATES * hidden
    dtype = w_hh.dtype
    out = _output(steps, batch, hidden, dtype, batch_first)
    seq = out.swapaxes(0, 1) if batch_first else out  # (T, B, H) view either way
    size = chunk_steps(steps, batch, width, dtype.itemsize)
    buf = _scratch("chunk", (width * size * batch,), dtype)  # one chunk's projection, transposed
    gates = _scratch("gates", (width, batch), dtype)
    c = np.zeros((hidden, batch), dtype=dtype)
    if c0 is not None:
        c[...] = np.asarray(c0).T
    h = _scratch("h", (hidden, batch), dtype)  # this step's h, transposed
    started = h0 is not None
    if started:
        h[...] = np.asarray(h0).T
    bias_col = None if bias is None else np.asarray(bias, dtype=dtype)[:, None]
    i = gates[:hidden]
    f = gates[hidden : 2 * hidden]
    g = gates[2 * hidden : 3 * hidden]
    o = gates[3 * hidden :]
    nonlinear = _lstm_gates(gates, hidden, True)
    with np.errstate(over="ignore"):  # exp(-x) -> inf for x << 0: sigmoid's right limit, 0
        for t0, t1 in _chunks(steps, size, reverse):
            part = x[:, t0:t1].swapaxes(0, 1) if batch_first else x[t0:t1]
            n = t1 - t0
            rows = _rows(part)
            proj = buf[: width * n * batch].reshape(width, n * batch)
            np.matmul(w_ih, rows.T, out=proj)
            if bias_col is not None:
                proj += bias_col
            for t in range(t1 - 1, t0 - 1, -1) if reverse else range(t0, t1):
                col = proj[:, (t - t0) * batch : (t - t0 + 1) * batch]
                if started:
                    np.dot(w_hh, h, out=gates)
                    np.add(gates, col, out=gates)
                else:
                    np.copyto(gates, col)
                    started = True
                nonlinear(gates)
                np.multiply(i, g, out=i)
                np.multiply(c, f, out=c)
                np.add(c, i, out=c)
                _tanh_into(c, h)
                np.multiply(h, o, out=h)
                np.copyto(seq[t], h.T)
    h_n = np.array(seq[0] if reverse else seq[steps - 1])
    return out, h_n, np.ascontiguousarray(c.T)


def _lstm_block_state(
    batch: int, hidden: int, block: int, c0: Array | None, dtype: np.dtype[Any]
) -> tuple[Array, Array, Array, Array, tuple[Array, Array, Array, Array], Callable[[Array], None]]:
    """The blocked LSTM kernels' state for a call, in the block layout (blocks x batch x
    width; gate ``q`` is blocks ``q*H/block`` to ``(q+1)*H/block``, contiguous): the gates
    buffer, its flat view for the gate math, the cell state (from ``c0`` or zeros), this
    step's h buffer, the i, f, g, o views of the gates, and their nonlinearity."""
    blocks, per_gate = _LSTM_GATES * hidden // block, hidden // block
    gates = _scratch("gates", (blocks, batch, block), dtype)
    flat = gates.reshape(blocks, batch * block)  # the gate math's view: gate q = row blocks q
    c = np.zeros((per_gate, batch, block), dtype=dtype)
    if c0 is not None:
        c[...] = np.asarray(c0, dtype=dtype).reshape(batch, per_gate, block).transpose(1, 0, 2)
    hb = _scratch("h", (per_gate, batch, block), dtype)  # this step's h, in blocks
    views = (
        gates[:per_gate],
        gates[per_gate : 2 * per_gate],
        gates[2 * per_gate : 3 * per_gate],
        gates[3 * per_gate :],
    )
    return gates, flat, c, hb, views, _lstm_gates(flat, per_gate, True)


def _lstm_sequence_blocked(
    x: Array,
    w_ih: Array,
    bias: Array | None,
    w_hh: Array,
    h0: Array | None,
    c0: Array | None,
    reverse: bool,
    batch_first: bool,
    block: int,
    view: bool = False,
) -> tuple[Array, Array, Array]:
    """:func:`lstm_sequence_kernel` with the recurrent GEMM in column blocks of ``block`` gate
    columns (``block`` divides H; see the module docstring). Same results. With ``view``,
    ``W_hh`` (row-major) is read in place instead of copied (:data:`VIEW_WIDTHS`).

    ``W_hh`` is copied for the call into ``wb`` (blocks, H, block), ``wb[k] = W[k*block :
    (k+1)*block].T``, and each step's GEMM is one stacked ``np.matmul(h, wb)`` into the gates
    (blocks, B, block). Gates, cell and hidden state stay in that layout; gate ``q``'s
    columns are blocks ``q*H/block`` to ``(q+1)*H/block``, contiguous. Each step's h is
    written into its output row (B, H) with one transposing copy, and read from there by the
    next step's GEMM, as in the plain form.
    """
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    hidden = w_hh.shape[1]
    width = _LSTM_GATES * hidden
    dtype = w_hh.dtype
    blocks = width // block
    out = _output(steps, batch, hidden, dtype, batch_first)
    seq = out.swapaxes(0, 1) if batch_first else out  # (T, B, H) view either way
    seq_blocks = _output_blocks(out, block, batch_first)
    wb = _weight_blocks(w_hh, block, view)
    size = chunk_steps(steps, batch, width, dtype.itemsize)
    buf = _scratch("chunk", (size * batch, width), dtype)
    gates, flat, c, hb, (i, f, g, o), nonlinear = _lstm_block_state(batch, hidden, block, c0, dtype)
    h: Array | None = h0
    step = _numba_gates(dtype)
    if step is not None:
        b = _NO_BIAS if bias is None else np.ascontiguousarray(bias, dtype=dtype)
        for t0, t1 in _chunks(steps, size, reverse):
            xp = _project_chunk(x, t0, t1, w_ih, None, batch_first, buf)
            for t in range(t1 - 1, t0 - 1, -1) if reverse else range(t0, t1):
                if h is None:
                    gates.fill(0)
                else:
                    np.matmul(h, wb, out=gates)
                h = seq[t]
                step(gates, xp[t - t0], b, c, h)
    else:
        with np.errstate(over="ignore"):  # exp(-x) -> inf for x << 0: sigmoid's limit, 0
            for t0, t1 in _chunks(steps, size, reverse):
                xp = _project_chunk(x, t0, t1, w_ih, bias, batch_first, buf)
                for t in range(t1 - 1, t0 - 1, -1) if reverse else range(t0, t1):
                    col = xp[t - t0].reshape(batch, blocks, block).transpose(1, 0, 2)
                    if h is None:
                        np.copyto(gates, col)
                    else:
                        np.matmul(h, wb, out=gates)
                        np.add(gates, col, out=gates)
                    nonlinear(flat)
                    np.multiply(i, g, out=i)
                    np.multiply(c, f, out=c)
                    np.add(c, i, out=c)
                    _tanh_into(c, hb)
                    np.multiply(hb, o, out=hb)
                    np.copyto(seq_blocks[t], hb.transpose(1, 0, 2))
                    h = seq[t]
    h_n = np.array(seq[0] if reverse else seq[steps - 1])
    return out, h_n, np.ascontiguousarray(c.transpose(1, 0, 2)).reshape(batch, hidden)


def _lstm_sequence_fused(
    x: Array,
    w_ih: Array,
    bias: Array | None,
    w_hh: Array,
    h0: Array | None,
    c0: Array | None,
    reverse: bool,
    batch_first: bool,
    block: int,
) -> tuple[Array, Array, Array]:
    """:func:`lstm_sequence_kernel` with the input projection inside each step's GEMM, in
    column blocks of ``block`` gate columns (``block`` divides H; see :data:`FUSED_WIDTHS`).
    Same results.

    Both weights are copied for the call into ``wb`` (blocks, I + H, block), ``wb[k] =
    [W_ih, W_hh][k*block : (k+1)*block].T``, and each step's gates are one stacked
    ``np.matmul([x_t, h], wb)`` (blocks, B, block), plus the bias: no projection of the whole
    sequence, so no projection buffer either. ``[x_t, h]`` is one (B, I + H) buffer: the step
    copies ``x_t`` into its left part, and its h, after the transposing copy into its output
    row, into the right part for the next step. Gates, cell and hidden state stay in the block
    layout of :func:`_lstm_sequence_blocked`.
    """
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    hidden, inputs = w_hh.shape[1], w_ih.shape[1]
    width = _LSTM_GATES * hidden
    dtype = w_hh.dtype
    blocks = width // block
    out = _output(steps, batch, hidden, dtype, batch_first)
    seq = out.swapaxes(0, 1) if batch_first else out  # (T, B, H) view either way
    seq_blocks = _output_blocks(out, block, batch_first)
    xseq = x.swapaxes(0, 1) if batch_first else x  # (T, B, I) view either way
    wb = _scratch("w_cat_blocks", (blocks, inputs + hidden, block), dtype)
    np.copyto(wb[:, :inputs], np.asarray(w_ih).reshape(blocks, block, inputs).transpose(0, 2, 1))
    np.copyto(wb[:, inputs:], np.asarray(w_hh).reshape(blocks, block, hidden).transpose(0, 2, 1))
    bias_b = None if bias is None else np.asarray(bias, dtype=dtype).reshape(blocks, 1, block)
    xh = _scratch("xh", (batch, inputs + hidden), dtype)
    x_part, h_part = xh[:, :inputs], xh[:, inputs:]
    if h0 is None:
        h_part.fill(0)
    else:
        np.copyto(h_part, h0)
    gates, flat, c, hb, (i, f, g, o), nonlinear = _lstm_block_state(batch, hidden, block, c0, dtype)
    step = _numba_gates(dtype)
    if step is not None:
        b = _NO_BIAS if bias is None else np.ascontiguousarray(bias, dtype=dtype)
        for t in range(steps - 1, -1, -1) if reverse else range(steps):
            np.copyto(x_part, xseq[t])
            np.matmul(xh, wb, out=gates)
            step(gates, _NO_COL, b, c, seq[t])
            np.copyto(h_part, seq[t])
    else:
        with np.errstate(over="ignore"):  # exp(-x) -> inf for x << 0: sigmoid's limit, 0
            for t in range(steps - 1, -1, -1) if reverse else range(steps):
                np.copyto(x_part, xseq[t])
                np.matmul(xh, wb, out=gates)
                if bias_b is not None:
                    np.add(gates, bias_b, out=gates)
                nonlinear(flat)
                np.multiply(i, g, out=i)
                np.multiply(c, f, out=c)
                np.add(c, i, out=c)
                _tanh_into(c, hb)
                np.multiply(hb, o, out=hb)
                np.copyto(seq_blocks[t], hb.transpose(1, 0, 2))
                np.copyto(h_part, seq[t])
    h_n = np.array(seq[0] if reverse else seq[steps - 1])
    return out, h_n, np.ascontiguousarray(c.transpose(1, 0, 2)).reshape(batch, hidden)
