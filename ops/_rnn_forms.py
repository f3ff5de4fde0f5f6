"""Which form of numpy's whole-sequence kernel runs a direction: measured, not guessed.

The LSTM's kernels (:mod:`ops._rnn_lstm`) come in five forms: plain (``h @ W.T``),
transposed (``W @ h.T``, every per-step array features x batch), blocked with ``W_hh``
copied into column blocks (a width from :data:`BLOCK_WIDTHS`, up to
:data:`BLOCK_COPY_BYTES_MAX` of weight), blocked with ``W_hh``'s row blocks read in place
(``("view", width)``, :data:`VIEW_WIDTHS`: no copy, no bound) and fused (``("fused",
width)``, :data:`FUSED_WIDTHS`: the input projection inside the step's blocked GEMM, up to
:data:`FUSED_COPY_BYTES_MAX` of both weights). The GRU's (:mod:`ops._rnn_gru`) have the
plain and blocked forms. Which is fastest depends on the shape, the BLAS library's kernels
(AVX-512 or AVX2), the BLAS thread count and the weight's memory order, so
:func:`_kernel_form` times the whole kernels (:func:`_form_runs`) on a short sequence of
:data:`_FORM_STEPS` steps, interleaved (:func:`ops._rnn_measure._best_times`), once per
(batch's bucket, hidden, gates, dtype, BLAS threads, weight order, input size) in a
process, each with the weight in the order the call has: the fastest form that copies no
weight wins, or one
that copies them where it is faster than that by :data:`ops._rnn_measure._FORM_MARGIN`
(:func:`_pick_form`). Timing the GEMMs alone was not enough (:func:`_measure_form` says
why). Hidden sizes under :data:`_FORM_MIN_HIDDEN` and batches under :data:`_FORM_MIN_BATCH`
keep the plain form without measuring (:func:`_candidate_forms`).

State kept here alone: ``_forms`` (each key's answer), ``_buckets`` (the answers by the
batch's bucket, :func:`ops._rnn_measure._size_bucket`: a batch first seen in a bucket that
has one takes it without measuring) and ``_forms_lock``, under which one
thread at a time measures (the first calls of an ensemble's directions come on several
threads at once; the others wait for the answer). :mod:`ops._rnn_layout` reads and fills
them through this module: its measurement of a weight's memory order runs the same forms
(:func:`_form_runs`) and keeps its answer for a row-major weight here, so the first forward
does not measure again. The kernels are called through their modules
(``_rnn_lstm._lstm_sequence_plain``): a monkeypatch there reaches the measurement too.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import Any, TypeAlias

import numpy as np

from . import _rnn_gru, _rnn_lstm, _rnn_measure
from ._rnn_gates import _GRU_GATES, _LSTM_GATES
from ._rnn_measure import _FORM_MARGIN

__all__ = [
    "BLOCK_COPY_BYTES_MAX",
    "BLOCK_WIDTHS",
    "FUSED_COPY_BYTES_MAX",
    "FUSED_WIDTHS",
    "VIEW_WIDTHS",
]

Array: TypeAlias = "np.ndarray[Any, Any]"

#: The short sequence :func:`_kernel_form` runs each kernel form on: its steps (fewer let
#: the input projection, the same work in every form, weigh too much: at 4 steps the seed
#: size's 10% gain measured 3-13%); runs of each form (the best counts): at least the first
#: figure, then more until each form has run for ``_FORM_BUDGET`` seconds in all (small
#: kernels are noisy), at most the second. Two at least: a form's first run pays one-time
#: costs (its buffers, measuring its gates' transcendental), which at the tutorial's size,
#: where one run is all the budget allows, made the plain GRU kernel win against a blocked
#: one 15% faster. About 0.8 s once per shape at (50, 50, 1024), 0.1 s at (50, 8, 256).
_FORM_STEPS = 8
_FORM_REPEATS = (2, 40)
_FORM_BUDGET = 0.02
#: Hidden sizes under this keep the plain form without measuring (a step's GEMM is a few
#: microseconds; the forms differ by less than the noise of measuring them).
_FORM_MIN_HIDDEN = 64
#: Batches under this keep the plain form without measuring. At batch 1 a step is a few
#: small numpy calls, mostly interpreter time under the GIL, and the transposed form makes a
#: few more per step (views, a transposing copy): measured alone it was 10% faster at
#: (20, 1, 256), yet a served ensemble of 8 such directions on 2 threads ran 15% slower with
#: it. (At batch 2 it is 16-25% faster, served too: OpenBLAS's plain GEMM is slow there.)
_FORM_MIN_BATCH = 2


#: The block widths (gate columns per block) the blocked kernels are measured with
#: (:func:`_kernel_form`): those that divide the hidden size.
BLOCK_WIDTHS = (32, 64, 128)
#: The blocked forms copy ``W_hh`` at every call; past this many bytes they are not tried.
#: At the tutorial's size (16 MiB) they were no faster than the transposed form (0.97-1.04x
#: its time), and two directions' copies running at once raised the forward's peak memory
#: from 1.16x to 1.21x numpy's.
BLOCK_COPY_BYTES_MAX = 4 << 20

#: The block widths the fused LSTM kernel (:func:`ops._rnn_lstm._lstm_sequence_fused`) is
#: measured with: those that divide the hidden size. Its step GEMM, ``[x_t, h] (B, I + H) @
#: Wb[k]`` per block, is fastest where each block's product is small enough for OpenBLAS's
#: small-matrix kernels (no packing of either operand): at (B, I + H) = (50, 512), blocks of
#: 32 ran at 116 GFLOP/s on one thread, 16 at 112 and 64 at 89, against 95-102 for the input
#: projection as one GEMM of all T * B rows.
FUSED_WIDTHS = (16, 32)
#: The fused form copies both weights (``G*H x (I + H)``) at every call; past this many bytes
#: it is not tried. At the tutorial's size (32 MiB) it measured 2% faster at best, for a copy
#: as big as the projection buffer it saves.
FUSED_COPY_BYTES_MAX = 8 << 20

#: The block widths the blocked kernels are also measured with reading ``W_hh`` in place
#: (``("view", width)``: no copy, so no bound on the weight's size): block ``k`` of the
#: product is ``h @ W[k*width : (k+1)*width].T``, a transposed operand BLAS reads as it is.
#: Narrow blocks keep each product within OpenBLAS's small-matrix kernels: at the tutorial's
#: (B, H) = (50, 1024), one thread, blocks of 16 read in place ran at 94 GFLOP/s and 8 at
#: 93, against 76 for ``W @ h.T`` and 61 for ``h @ W.T``; a whole direction took 456 ms
#: against 512 transposed.
VIEW_WIDTHS = (8, 16)

#: The forms of the LSTM kernel (:func:`_kernel_form`): "plain", "transposed", a block width
#: (int), ``("view", width)`` (blocked, ``W_hh`` read in place) or ``("fused", width)``.
Form: TypeAlias = "str | int | tuple[str, int]"


_forms: dict[tuple[int, int, int, Any, int, bool, int], Form] = {}
# The same answers by the batch's bucket (``ops._rnn_measure._size_bucket``): a batch first
# seen in a bucket that has one takes it without measuring.
_buckets: dict[tuple[int, int, int, Any, int, bool, int], Form] = {}
_forms_lock = threading.Lock()
if hasattr(os, "register_at_fork"):  # a child made by os.fork(): a measuring thread is gone
    os.register_at_fork(after_in_child=_forms_lock._at_fork_reinit)  # type: ignore[attr-defined]


def _kernel_form(
    batch: int,
    hidden: int,
    gates: int,
    dtype: np.dtype[Any],
    blas_threads: int = 1,
    fortran: bool = False,
    inputs: int | None = None,
) -> Form:
    """:func:`_measure_form`'s answer for this shape (``inputs``: the input size, None for
    ``hidden``), measured once per process: by one thread at a time, so that the first calls
    of a model's directions on several threads (an ensemble's, all at once) do not time their
    kernels against each other; the others wait for the answer."""
    key = (batch, hidden, gates, dtype, blas_threads, fortran, hidden if inputs is None else inputs)
    form = _forms.get(key)
    if form is None:
        with _forms_lock:
            form = _forms.get(key)
            if form is None:
                bucket = (_rnn_measure._size_bucket(batch), *key[1:])
                form = _buckets.get(bucket)
                if form is None:  # the first batch of its bucket: measured as it is
                    form = _buckets[bucket] = _measure_form(*key)
                _forms[key] = form
    return form


def _remember(key: tuple[int, int, int, Any, int, bool, int], form: Form) -> None:
    """Keep ``form`` as the answer for ``key`` and, if its bucket has none yet, for the
    bucket (a measurement made elsewhere: :mod:`ops._rnn_layout`). Holds ``_forms_lock``."""
    _forms.setdefault(key, form)
    _buckets.setdefault((_rnn_measure._size_bucket(key[0]), *key[1:]), form)


def _measure_form(
    batch: int,
    hidden: int,
    gates: int,
    dtype: np.dtype[Any],
    blas_threads: int = 1,
    fortran: bool = False,
    inputs: int | None = None,
) -> Form:
    """Which form of the LSTM kernel (``gates`` 4) or the GRU kernel (3) is fastest for this
    shape (``inputs``: the input size, None for ``hidden``), BLAS thread count
    (:func:`ops._rnn_measure._blas_threads`, which the caller passes; the measurement runs
    under it) and weight order: ``"plain"`` (``h @ W.T``), ``"transposed"`` (``W @ h.T``,
    every per-step array features x batch: the LSTM only), a block width from
    :data:`BLOCK_WIDTHS` (``h @ Wb[k]`` per block of gate columns,
    :func:`ops._rnn_lstm._lstm_sequence_blocked`, :func:`ops._rnn_gru._gru_sequence_blocked`),
    ``("view", width)`` (the same with ``W_hh``'s row blocks read in place) or ``("fused",
    width)`` with a width from :data:`FUSED_WIDTHS` (the input projection inside the step's
    blocked GEMM, :func:`ops._rnn_lstm._lstm_sequence_fused`: the LSTM only).

    The whole kernels run a short sequence (:data:`_FORM_STEPS` steps) on random data of the
    real batch, width and dtype, interleaved, best of a few runs each (more for small
    kernels), each with the weight in the order the call has (``fortran``): a form that
    copies nothing (plain, transposed, in place) wins by being fastest, one that copies the
    weights for the call (blocked, fused: memory and time for the copy) must beat those by
    :data:`_FORM_MARGIN` (:func:`_pick_form`). Timing the GEMMs alone was not enough: the
    forms also differ in the gate math (contiguous row blocks against strided column
    blocks), and with AVX2 kernels, where the two GEMMs tie, the transposed kernel was still
    7% faster at (50, 50, 256); and a GEMM-only decision from five ~3 ms runs flipped
    between processes at the tutorial's size, costing 10% when it went wrong. Weights too
    small to matter (hidden under :data:`_FORM_MIN_HIDDEN`) and batches under
    :data:`_FORM_MIN_BATCH` keep the plain form without measuring; so does any gate count
    other than the LSTM's four and the GRU's three.

    Called once per bucket of batches (:func:`_kernel_form`), with the first batch seen in it.

    ``fortran``: the weight is stored in Fortran order (:func:`lay_out` found the plain form
    fastest with it when the model was built, perhaps under another BLAS thread count). The
    transposed and in-place forms, which want it row-major, are then not candidates (a
    row-major copy of the tutorial size's weight takes 16 ms a call, a Fortran-ordered
    operand costs its GEMM 12%). A row-major weight's plain form is measured row-major, as it
    will run (it once was measured in Fortran order where that GEMM is faster, and a noisy
    win there ran the tutorial's size 20% slower than measured).
    """
    forms = _candidate_forms(batch, hidden, gates, dtype, fortran, inputs)
    if len(forms) == 1:  # nothing to choose from (a large GRU, or a Fortran-ordered LSTM)
        return forms[0]
    runs = _form_runs(batch, hidden, gates, dtype, inputs, [(f, fortran) for f in forms])
    return _pick_form(forms, _rnn_measure._best_times(runs, *_FORM_REPEATS, _FORM_BUDGET))


def _candidate_forms(
    batch: int, hidden: int, gates: int, dtype: np.dtype[Any], fortran: bool, inputs: int | None
) -> list[Form]:
    """The kernel forms :func:`_measure_form` weighs for this shape and weight order (the
    plain one first; alone where there is nothing to choose)."""
    lstm = gates == _LSTM_GATES
    if not (lstm or gates == _GRU_GATES) or hidden < _FORM_MIN_HIDDEN or batch < _FORM_MIN_BATCH:
        return ["plain"]
    inputs = hidden if inputs is None else inputs
    width = gates * hidden
    forms: list[Form] = ["plain", "transposed"] if lstm and not fortran else ["plain"]
    if width * hidden * dtype.itemsize <= BLOCK_COPY_BYTES_MAX:
        forms += [b for b in BLOCK_WIDTHS if hidden % b == 0]
    if not fortran:  # (in place, the blocks are row blocks of a row-major W_hh)
        forms += [("view", b) for b in VIEW_WIDTHS if hidden % b == 0]
    if lstm and width * (inputs + hidden) * dtype.itemsize <= FUSED_COPY_BYTES_MAX:
        forms += [("fused", b) for b in FUSED_WIDTHS if hidden % b == 0]
    return forms


def _copies(form: Form) -> bool:
    """Whether ``form`` copies the weights at every call (a block width, or fused)."""
    return type(form) is int or (type(form) is tuple and form[0] == "fused")


def _pick_form(forms: list[Form], times: list[float]) -> Form:
    """The fastest of ``forms`` (measured ``times``; the plain form, first, copies nothing)
    that copies no weight; a form that copies them (:func:`_copies`) where it beats that one
    by :data:`_FORM_MARGIN`."""
    best = min((i for i, f in enumerate(forms) if not _copies(f)), key=times.__getitem__)
    copying = (i for i, f in enumerate(forms) if _copies(f))
    fastest = min(copying, key=times.__getitem__, default=best)
    return forms[fastest] if times[fastest] < _FORM_MARGIN * times[best] else forms[best]


def _form_runs(
    batch: int,
    hidden: int,
    gates: int,
    dtype: np.dtype[Any],
    inputs: int | None,
    forms: list[tuple[Form, bool]],
) -> tuple[Callable[[], object], ...]:
    """A run of each kernel form on a short sequence (:data:`_FORM_STEPS` steps) of random
    data of this shape, with ``W_hh`` in Fortran order where the pair says so (the other
    operands as a call has them)."""
    lstm = gates == _LSTM_GATES
    inputs = hidden if inputs is None else inputs
    width = gates * hidden
    rng = np.random.default_rng(0)

    def weight(cols: int) -> Array:
        w: Array = (rng.random((width, cols), dtype=np.float32) - 0.5).astype(dtype, copy=False)
        w *= dtype.type(1.0 / math.sqrt(cols))
        return w

    x: Array = rng.random((_FORM_STEPS, batch, inputs), dtype=np.float32).astype(dtype, copy=False)
    w_ih, w_c = weight(inputs), weight(hidden)
    w_f = np.asfortranarray(w_c) if any(f for _, f in forms) else w_c
    bias = np.zeros(width, dtype=dtype)

    def run(form: Form, fortran: bool) -> Callable[[], object]:
        w_hh = w_f if fortran else w_c
        if not lstm:
            if form == "plain":
                return lambda: _rnn_gru._gru_sequence_plain(
                    x, w_ih, bias, w_hh, bias, None, False, False
                )
            if isinstance(form, tuple):
                return lambda: _rnn_gru._gru_sequence_blocked(
                    x, w_ih, bias, w_hh, bias, None, False, False, form[1], True
                )
            assert isinstance(form, int)
            return lambda: _rnn_gru._gru_sequence_blocked(
                x, w_ih, bias, w_hh, bias, None, False, False, form
            )
        if form == "plain":
            return lambda: _rnn_lstm._lstm_sequence_plain(
                x, w_ih, bias, w_hh, None, None, False, False
            )
        if form == "transposed":
            return lambda: _rnn_lstm._lstm_sequence_transposed(
                x, w_ih, bias, w_hh, None, None, False, False
            )
        if isinstance(form, tuple) and form[0] == "view":
            return lambda: _rnn_lstm._lstm_sequence_blocked(
                x, w_ih, bias, w_hh, None, None, False, False, form[1], True
            )
        if isinstance(form, tuple):
            return lambda: _rnn_lstm._lstm_sequence_fused(
                x, w_ih, bias, w_hh, None, None, False, False, form[1]
            )
        assert isinstance(form, int)
        return lambda: _rnn_lstm._lstm_sequence_blocked(
            x, w_ih, bias, w_hh, None, None, False, False, form
        )

    return tuple(run(form, fortran) for form, fortran in forms)
