"""The GRU's whole-sequence kernels, one direction of one layer with the time loop inside one
call, in every form :func:`ops._rnn_sequence.gru_sequence_kernel` chooses among.

Each form computes torch's values (gates r, z, n; see :mod:`ops._recurrent`) as the LSTM's
kernels do (:mod:`ops._rnn_lstm`): the input projection in time chunks
(:mod:`ops._rnn_projection`), the step's ``h @ W_hh.T`` into one preallocated buffer, the
gate math in place on it (:func:`ops._rnn_gates._gru_gates`), each step's h written straight
into its row of the output. ``b_hh`` stays in the step: r multiplies ``W_hn h + b_hn``, so
it cannot be folded into the projection as the LSTM's bias can. The forms:

* **Plain** (:func:`_gru_sequence_plain`): ``h @ W_hh.T``, the weight in either memory order.
* **Blocked** (:func:`_gru_sequence_blocked`): the recurrent GEMM in column blocks of
  ``block`` gate columns, ``W_hh`` copied for the call into blocks or, with ``view``, its
  row blocks read in place, the gates and state in the block layout, as the LSTM's blocked
  kernel. One direction on one thread, blocked against plain with its weight laid out:
  0.69x at (50, 50, 256), 0.33x at (50, 8, 512), 0.38x at (50, 4, 128), 0.48x at
  (50, 16, 256), even at (50, 50, 1024).

There is no transposed form (the GRU's gate math suits none) and no fused one. A small model
takes numpy's small kernel instead (:mod:`ops._rnn_small`) or numba's loop. Where the engine
is numba (:func:`ops._rnn_engine._numba_gates`), the blocked form runs each step's gate math
as one compiled pass; the GEMMs stay BLAS's. Every kernel takes ``gru_sequence_kernel``'s
arguments (the blocked one a block width too) and returns (output, h_n). What a kernel calls
per step or per chunk is imported by name: no attribute lookup in its loops.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np

from ._rnn_buffers import _output, _output_blocks, _scratch, _weight_blocks
from ._rnn_engine import _numba_gates
from ._rnn_gates import _GRU_GATES, _gemm_into, _gru_gates
from ._rnn_numba import NO_BIAS as _NO_BIAS
from ._rnn_projection import _chunks, _project_chunk, chunk_steps

__all__: list[str] = []

Array: TypeAlias = "np.ndarray[Any, Any]"


def _gru_sequence_plain(
    x: Array,
    w_ih: Array,
    b_ih: Array | None,
    w_hh: Array,
    b_hh: Array | None,
    h0: Array | None,
    reverse: bool,
    batch_first: bool,
) -> tuple[Array, Array]:
    """:func:`gru_sequence_kernel` with the recurrent GEMM as ``h @ W_hh.T`` (the weight in
    either memory order)."""
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    hidden = w_hh.shape[1]
    width = _GRU_GATES * hidden
    dtype = w_hh.dtype
    out = _output(steps, batch, hidden, dtype, batch_first)
    seq = out.swapaxes(0, 1) if batch_first else out
    size = chunk_steps(steps, batch, width, dtype.itemsize)
    buf = _scratch("chunk", (size * batch, width), dtype)
    gh = _scratch("gh", (batch, width), dtype)
    rz = gh[:, : 2 * hidden]
    r = gh[:, :hidden]
    z = gh[:, hidden : 2 * hidden]
    n = gh[:, 2 * hidden :]
    w_hh_t = w_hh.T
    one = dtype.type(1.0)
    h: Array = np.zeros((batch, hidden), dtype=dtype) if h0 is None else h0
    for t0, t1 in _chunks(steps, size, reverse):
        xp = _project_chunk(x, t0, t1, w_ih, b_ih, batch_first, buf)
        for t in range(t1 - 1, t0 - 1, -1) if reverse else range(t0, t1):
            gi = xp[t - t0]
            _gemm_into(h, w_hh_t, gh)
            if b_hh is not None:
                gh += b_hh
            _gru_gates(rz, r, n, gi[:, : 2 * hidden], gi[:, 2 * hidden :], one)
            # h' = (1 - z) * n + z * h = n + z * (h - n), written into the output's row.
            h_new = seq[t]
            np.subtract(h, n, out=h_new)
            h_new *= z
            h_new += n
            h = h_new
    return out, np.array(h)


def _gru_sequence_blocked(
    x: Array,
    w_ih: Array,
    b_ih: Array | None,
    w_hh: Array,
    b_hh: Array | None,
    h0: Array | None,
    reverse: bool,
    batch_first: bool,
    block: int,
    view: bool = False,
) -> tuple[Array, Array]:
    """:func:`gru_sequence_kernel` with the recurrent GEMM in column blocks of ``block`` gate
    columns, as :func:`ops._rnn_lstm._lstm_sequence_blocked` (``block`` divides H; ``view``:
    ``W_hh`` read in place). Same results."""
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    hidden = w_hh.shape[1]
    width = _GRU_GATES * hidden
    dtype = w_hh.dtype
    blocks, per_gate = width // block, hidden // block
    out = _output(steps, batch, hidden, dtype, batch_first)
    seq = out.swapaxes(0, 1) if batch_first else out
    seq_blocks = _output_blocks(out, block, batch_first)
    wb = _weight_blocks(w_hh, block, view)
    size = chunk_steps(steps, batch, width, dtype.itemsize)
    buf = _scratch("chunk", (size * batch, width), dtype)
    gh = _scratch("gh", (blocks, batch, block), dtype)
    rz = gh[: 2 * per_gate]
    r = gh[:per_gate]
    z = gh[per_gate : 2 * per_gate]
    n = gh[2 * per_gate :]
    hb = np.zeros((per_gate, batch, block), dtype=dtype)  # h, in blocks
    if h0 is not None:
        hb[...] = np.asarray(h0, dtype=dtype).reshape(batch, per_gate, block).transpose(1, 0, 2)
    h: Array = np.zeros((batch, hidden), dtype=dtype) if h0 is None else h0
    step = _numba_gates(dtype, gru=True)
    if step is not None:
        b_i = _NO_BIAS if b_ih is None else np.ascontiguousarray(b_ih, dtype=dtype)
        b_h = _NO_BIAS if b_hh is None else np.ascontiguousarray(b_hh, dtype=dtype)
        for t0, t1 in _chunks(steps, size, reverse):
            xp = _project_chunk(x, t0, t1, w_ih, None, batch_first, buf)
            for t in range(t1 - 1, t0 - 1, -1) if reverse else range(t0, t1):
                np.matmul(h, wb, out=gh)
                h = seq[t]
                step(gh, xp[t - t0], b_i, b_h, hb, h)
        return out, np.array(h)
    one = dtype.type(1.0)
    bias_blocks = None if b_hh is None else np.asarray(b_hh).reshape(blocks, 1, block)
    for t0, t1 in _chunks(steps, size, reverse):
        xp = _project_chunk(x, t0, t1, w_ih, b_ih, batch_first, buf)
        for t in range(t1 - 1, t0 - 1, -1) if reverse else range(t0, t1):
            gi = xp[t - t0].reshape(batch, blocks, block).transpose(1, 0, 2)
            np.matmul(h, wb, out=gh)
            if bias_blocks is not None:
                gh += bias_blocks
            _gru_gates(rz, r, n, gi[: 2 * per_gate], gi[2 * per_gate :], one)
            # h' = n + z * (h - n), in blocks, then into the output's row.
            np.subtract(hb, n, out=hb)
            hb *= z
            hb += n
            np.copyto(seq_blocks[t], hb.transpose(1, 0, 2))
            h = seq[t]
    return out, np.array(h)
