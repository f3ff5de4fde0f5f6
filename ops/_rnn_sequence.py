"""Whole-sequence recurrent kernels: one direction of one layer, the time loop inside one call.

The per-step decomposition (``rnn_projection`` then one ``lstm_step`` op per step) exposes
parallelism to the scheduler, but each op costs a hand-off, and at small sizes a step's numpy
work (a few microseconds) is smaller than that. These kernels run a direction in one call, so
an LSTM costs one op per layer and direction, and they do less work per step than plain numpy
code written the obvious way:

* **Projection in time chunks.** ``x @ w_ih.T + bias`` is computed a chunk of steps at a
  time into one buffer reused for every chunk, each chunk's GEMM in the form measured
  fastest for its shape (:mod:`ops._rnn_projection`).
* **No allocation per step.** The gate pre-activations go into one preallocated buffer, the
  gate math runs in place on it, the cell state is updated in place, and each step's h is
  written straight into its row of the output, where the next step's GEMM reads it. Nothing
  is copied between steps; temporaries are kept per thread between calls
  (:mod:`ops._rnn_buffers`).
* **Fewest passes for the size, in the faster transcendental.** All four LSTM gates in one
  ``exp`` or ``tanh`` pass, whichever measures faster (:mod:`ops._rnn_gates`).
* **The step GEMM in the form BLAS likes**, measured per shape (:mod:`ops._rnn_forms`):
  plain, transposed, in column blocks (copied or read in place) or with the projection
  inside the step (the LSTM's kernels: :mod:`ops._rnn_lstm`; the GRU's: :mod:`ops._rnn_gru`).
* **Fewest calls for a small model.** A model whose steps are mostly numpy's per-call
  overhead runs kernels that make the fewest calls (:mod:`ops._rnn_small`), or numba's
  compiled loops without the GIL (:mod:`ops._rnn_numba`).

:func:`lstm_sequence_kernel` and :func:`gru_sequence_kernel` choose what runs a direction,
per call: the engine's choice for a small model (:func:`ops._rnn_engine._small_engine`:
numba's loop or numpy's small kernel), else numpy's kernel in the form measured fastest for
the shape, dtype, BLAS thread count and weight order (:func:`ops._rnn_forms._kernel_form`).

The modules, one concern each, in import order (each imports only modules listed before
it; no cycles):

* :mod:`ops._rnn_buffers` (scratch buffers, outputs, block views), :mod:`ops._rnn_gates`
  (the gate math), :mod:`ops._rnn_measure` (timing alternatives; the BLAS thread count);
* :mod:`ops._rnn_projection` (the input projection in time chunks);
* :mod:`ops._rnn_numba` (numba's compiled loops), :mod:`ops._rnn_engine` (the engine
  setting and the per-call choice of engine);
* the numpy kernels: :mod:`ops._rnn_small` (small models), :mod:`ops._rnn_lstm`,
  :mod:`ops._rnn_gru` (every form);
* :mod:`ops._rnn_forms` (measuring the forms), :mod:`ops._rnn_layout` (the weights' memory
  order, the step ops' product), and this module.

The kernels import what their loops call by name (no attribute lookup per step). The
modules that choose (this one, :mod:`ops._rnn_forms`, :mod:`ops._rnn_layout`) call the
kernels, the choosers and the timing through their modules (``_rnn_forms._kernel_form``,
``_rnn_lstm._lstm_sequence_plain``), once per call or measurement: each has one binding,
which a monkeypatch of its module replaces for every caller; and mutable state (the engine
setting, the measured forms and layouts, the BLAS library's controller, the scratch
buffers) lives in one module and is read through it.

Gate order and equations are torch's (see :mod:`ops._recurrent`); outputs match torch's
``nn.LSTM`` / ``nn.GRU`` within float32 rounding.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np

from . import _rnn_engine, _rnn_forms, _rnn_gru, _rnn_lstm, _rnn_measure, _rnn_numba, _rnn_small
from ._rnn_gates import _GRU_GATES, _LSTM_GATES

__all__ = ["gru_sequence_kernel", "lstm_sequence_kernel"]

Array: TypeAlias = "np.ndarray[Any, Any]"


def lstm_sequence_kernel(
    x: Array,
    w_ih: Array,
    bias: Array | None,
    w_hh: Array,
    h0: Array | None,
    c0: Array | None,
    reverse: bool,
    batch_first: bool,
) -> tuple[Array, Array, Array]:
    """One LSTM direction over the whole sequence: (output, h_n, c_n).

    ``x`` is (T, B, I) (or (B, T, I) with ``batch_first``, and the output then too); ``bias``
    is ``b_ih + b_hh`` (or None); ``h0``/``c0`` (B, H) or None for zeros. With ``reverse``
    the steps run from T-1 down to 0 and h_n is the state after step 0; the output stays in
    time order either way.
    """
    batch = x.shape[0] if batch_first else x.shape[1]
    hidden = w_hh.shape[1]
    small = _rnn_engine._small_engine(x, w_ih, w_hh, _LSTM_GATES, batch_first)
    if small == "numba":
        return _rnn_numba.lstm_sequence(x, w_ih, bias, w_hh, h0, c0, reverse, batch_first)
    if small == "numpy":
        return _rnn_small._lstm_sequence_small(x, w_ih, bias, w_hh, h0, c0, reverse, batch_first)
    fortran = not w_hh.flags.c_contiguous
    form = _rnn_forms._kernel_form(
        batch, hidden, _LSTM_GATES, w_hh.dtype, _rnn_measure._blas_threads(), fortran, w_ih.shape[1]
    )
    if type(form) is int:  # (any layout of w_hh: the call copies it into blocks)
        return _rnn_lstm._lstm_sequence_blocked(
            x, w_ih, bias, w_hh, h0, c0, reverse, batch_first, form
        )
    if type(form) is tuple:
        kind, block = form
        if kind == "view":  # (W_hh row-major: a Fortran-ordered one is measured without it)
            return _rnn_lstm._lstm_sequence_blocked(
                x, w_ih, bias, w_hh, h0, c0, reverse, batch_first, block, True
            )
        # (any layout of either weight: the call copies both into blocks)
        return _rnn_lstm._lstm_sequence_fused(
            x, w_ih, bias, w_hh, h0, c0, reverse, batch_first, block
        )
    if form == "transposed" and not fortran:
        return _rnn_lstm._lstm_sequence_transposed(
            x, w_ih, bias, w_hh, h0, c0, reverse, batch_first
        )
    return _rnn_lstm._lstm_sequence_plain(x, w_ih, bias, w_hh, h0, c0, reverse, batch_first)


def gru_sequence_kernel(
    x: Array,
    w_ih: Array,
    b_ih: Array | None,
    w_hh: Array,
    b_hh: Array | None,
    h0: Array | None,
    reverse: bool,
    batch_first: bool,
) -> tuple[Array, Array]:
    """One GRU direction over the whole sequence: (output, h_n); arguments as for the LSTM.

    ``b_hh`` stays in the step (r multiplies ``W_hn h + b_hn``, so it cannot be folded into
    the projection as the LSTM's can).
    """
    batch = x.shape[0] if batch_first else x.shape[1]
    hidden = w_hh.shape[1]
    small = _rnn_engine._small_engine(x, w_ih, w_hh, _GRU_GATES, batch_first)
    if small == "numba":
        return _rnn_numba.gru_sequence(x, w_ih, b_ih, w_hh, b_hh, h0, reverse, batch_first)
    if small == "numpy":
        return _rnn_small._gru_sequence_small(x, w_ih, b_ih, w_hh, b_hh, h0, reverse, batch_first)
    fortran = not w_hh.flags.c_contiguous
    form = _rnn_forms._kernel_form(
        batch, hidden, _GRU_GATES, w_hh.dtype, _rnn_measure._blas_threads(), fortran
    )
    if type(form) is int:  # (any layout of w_hh: the call copies it into blocks)
        return _rnn_gru._gru_sequence_blocked(
            x, w_ih, b_ih, w_hh, b_hh, h0, reverse, batch_first, form
        )
    if type(form) is tuple:  # ("view", width): W_hh row-major, read in place
        return _rnn_gru._gru_sequence_blocked(
            x, w_ih, b_ih, w_hh, b_hh, h0, reverse, batch_first, form[1], True
        )
    return _rnn_gru._gru_sequence_plain(x, w_ih, b_ih, w_hh, b_hh, h0, reverse, batch_first)
