"""The recurrent weights' memory order, and the step ops' recurrent product: how a weight is
stored, and multiplied outside the sequence kernels.

* **Weights in the layout BLAS likes.** :func:`lay_out` stores a recurrent weight in the
  memory order whose GEMM measured fastest on this machine for its shape (Fortran order
  makes ``w.T`` a plain row-major operand: 22% faster at (50, 1024) x (1024, 4096) with
  OpenBLAS on one thread). It is the parameter's own memory, not a cached copy, so in-place
  writes and ``load_state_dict`` can never leave a stale copy behind; the kernels take
  either layout. Only the sequence kernels' plain form gains from Fortran order (the others
  want the weight row-major), so it is kept only where the plain kernel with it beats every
  form a row-major weight takes by the margin, at one BLAS thread and at the process's
  count (:func:`_layout_fortran`, :func:`_layout_is_fortran`); that measurement's answer for
  a row-major weight becomes the kernels' own, so the first forward does not measure again.
  A module whose forwards run per step (``ops.lstm_step``) is laid out for the step op's one
  GEMM instead (``steps``: :func:`_fortran_is_faster`).
* **The step product in the form BLAS likes.** A step op has one GEMM, ``h @ w.T``:
  :func:`recurrent_product` computes it as ``(w @ h.T).T`` where that measured faster for
  the shape (:func:`_product_is_transposed`; OpenBLAS's AVX-512 kernels: about 20% faster
  at (50, 1024) x (1024, 4096) on one thread).

State kept here alone: ``_layouts`` (each shape's answer) and ``_products`` (each step
product's). The kernel forms' answers (``_forms``) and the lock under which one thread at a
time measures are :mod:`ops._rnn_forms`'s, read through that module, as are the form
measurement's functions: a monkeypatch there reaches this module too.
"""

from __future__ import annotations

import functools
import time
from typing import Any, TypeAlias

import numpy as np

from . import _rnn_forms, _rnn_measure
from ._rnn_forms import _FORM_BUDGET, _FORM_MIN_BATCH, _FORM_REPEATS
from ._rnn_measure import _FORM_MARGIN

__all__ = ["LAYOUT_BATCH", "STEP_PRODUCT_MEASURED_MIN", "lay_out", "recurrent_product"]

Array: TypeAlias = "np.ndarray[Any, Any]"

#: The batch :func:`lay_out` measures at (the tutorial's).
LAYOUT_BATCH = 50
_LAYOUT_REPEATS = 5


@functools.lru_cache(maxsize=64)
def _fortran_is_faster(rows: int, cols: int, dtype: np.dtype[Any]) -> bool:
    """Whether ``h @ w.T`` is faster with ``w`` (rows, cols) in Fortran order, measured once.

    Times both layouts back to back, best of a few repeats each, on random data of the real
    shape; small weights (where either form takes microseconds and the difference is noise)
    keep the row-major layout.
    """
    if rows * cols < 256 * 1024:
        return False
    rng = np.random.default_rng(0)
    w_c = rng.standard_normal((rows, cols)).astype(dtype)
    w_f = np.asfortranarray(w_c)
    h = rng.standard_normal((LAYOUT_BATCH, cols)).astype(dtype)
    out = np.empty((LAYOUT_BATCH, rows), dtype=dtype)
    best = {"C": float("inf"), "F": float("inf")}
    for _ in range(_LAYOUT_REPEATS):
        for name, w in (("C", w_c), ("F", w_f)):
            t0 = time.perf_counter()
            np.matmul(h, w.T, out=out)
            best[name] = min(best[name], time.perf_counter() - t0)
    # Only switch for a clear gain: a tie keeps the layout torch and numpy users expect.
    return best["F"] < 0.95 * best["C"]


def lay_out(w: Array, steps: bool = False) -> Array:
    """``w`` (gates*hidden, hidden) in the memory order its recurrent GEMM runs fastest in.

    Returns ``w`` itself when it already is, else a copy in the other order (same values,
    shape and dtype). Measured once per shape and dtype on this machine.

    ``steps``: the weight's forwards run as per-step ops (``ops.lstm_step``: a module whose
    granularity is "step" at the layout's batch), whose one GEMM is ``h @ w.T`` with the gate
    math on its (B, G*H) result: Fortran order where that GEMM measures faster
    (:func:`_fortran_is_faster`), whatever the sequence kernels' forms. (Row-major, the step
    kernel's product runs transposed, :func:`recurrent_product`, and its gate math then
    reads a transposed array: 1.61 against 1.60 ms a step at (50, 512), but a 2-layer
    (50, 50, 512) stack ran 273-285 ms a forward against 251-261 in Fortran order.)

    Otherwise Fortran order is kept only where the plain kernel with it beats every form a
    row-major weight takes (:func:`_layout_is_fortran`), at one BLAS thread and then at the
    process's count of the moment (:func:`_layout_fortran`): inside a runtime, recurrent
    kernels that run side by side run on one BLAS thread each, while a model is usually
    built outside it, under the process's default count. (Measured at the current count
    alone, the tutorial's weight was stored in Fortran order, where the plain form wins on 2
    BLAS threads, and its directions then ran on one thread in the plain form, 7-17% slower
    than the form a row-major weight takes there. And while a tie went to the plain form,
    one process in several stored it in Fortran order at one thread too: the plain kernel is
    about 9% slower there than the in-place blocked one, close to the margin.)
    """
    if w.ndim != 2 or w.dtype.kind != "f":
        return w
    rows, cols = w.shape
    if steps or rows % cols:  # (the step op's GEMM, or not a recurrent weight's shape)
        fortran = _fortran_is_faster(rows, cols, w.dtype)
    else:  # the LSTM's 4 gates, the GRU's 3
        fortran = _layout_fortran(cols, rows // cols, w.dtype)
    if fortran and not w.flags.f_contiguous:
        return np.asfortranarray(w)
    if not fortran and not w.flags.c_contiguous:
        return np.ascontiguousarray(w)
    return w


def _layout_fortran(hidden: int, gates: int, dtype: np.dtype[Any]) -> bool:
    """Whether :func:`lay_out` stores a recurrent weight of this shape in Fortran order: where
    the plain kernel with it wins at one BLAS thread (measured under a one-thread limit where
    the process has more, which lasts the measurement: a model is built before its runs, not
    during them) and, only then, at the process's count now. Row-major at one thread already
    settles it, so building a model measures once, not twice (1.3 s at the tutorial's size)."""
    threads = _rnn_measure._blas_threads()
    if threads == 1:
        return _layout_is_fortran(hidden, gates, dtype, 1)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        at_one = _layout_is_fortran(hidden, gates, dtype, 1)
    return at_one and _layout_is_fortran(hidden, gates, dtype, threads)


_layouts: dict[tuple[int, int, Any, int], bool] = {}


def _layout_is_fortran(hidden: int, gates: int, dtype: np.dtype[Any], threads: int) -> bool:
    """Whether the plain kernel with its weight in Fortran order (where its GEMM is faster
    so: :func:`_fortran_is_faster`) beats every kernel form a row-major weight can take
    (plain, transposed, blocked, fused: :func:`ops._rnn_forms._measure_form`'s candidates) by
    :data:`_FORM_MARGIN`, at ``threads`` BLAS threads (the count in force; the caller sets
    it), measured once per process and key, all forms in one interleaved measurement. A tie
    keeps the row-major layout torch and numpy users expect. The answer for a row-major
    weight of this shape is kept as :func:`ops._rnn_forms._kernel_form`'s, so the first
    forward does not measure the same forms again."""
    if not _fortran_is_faster(gates * hidden, hidden, dtype):
        return False
    forms = _rnn_forms._candidate_forms(LAYOUT_BATCH, hidden, gates, dtype, False, hidden)
    if len(forms) == 1:  # no other form to weigh: the plain GEMM decides
        return True
    key = (hidden, gates, dtype, threads)
    with _rnn_forms._forms_lock:
        fortran = _layouts.get(key)
        if fortran is None:
            candidates = [("plain", True), *((f, False) for f in forms)]
            runs = _rnn_forms._form_runs(LAYOUT_BATCH, hidden, gates, dtype, hidden, candidates)
            times = _rnn_measure._best_times(runs, *_FORM_REPEATS, _FORM_BUDGET)
            form = (LAYOUT_BATCH, hidden, gates, dtype, threads, False, hidden)
            _rnn_forms._remember(form, _rnn_forms._pick_form(forms, times[1:]))
            fortran = _layouts[key] = times[0] < _FORM_MARGIN * min(times[1:])
    return fortran


#: Per-step recurrent products (``h @ w.T``, :func:`recurrent_product`) of at least this many
#: multiply-adds (batch x rows x cols) have their form measured; smaller ones run as written
#: (a step that small is mostly call overhead, and the forms measure within noise).
STEP_PRODUCT_MEASURED_MIN = 1 << 18

_products: dict[tuple[int, int, int, Any, int], bool] = {}
# The same answers by the batch's bucket (``ops._rnn_measure._size_bucket``).
_product_buckets: dict[tuple[int, int, int, Any, int], bool] = {}


def recurrent_product(h: Array, w: Array) -> Array:
    """``h @ w.T`` for a per-step kernel (``ops.lstm_step``, ``gru_step``, the cells): computed
    as ``(w @ h.T).T`` where that measured faster for the shape, which returns a transposed
    (Fortran-ordered) array of the same values.

    The sequence kernels choose among whole-kernel forms
    (:func:`ops._rnn_forms._kernel_form`); a step op has one GEMM, whose form is measured
    alone here, once per (batch's bucket, rows, cols, dtype, BLAS threads), for a row-major ``w``
    (:func:`lay_out` keeps it so where the sequence kernels' other forms win): OpenBLAS's
    AVX-512 kernels compute ``W @ h.T`` about 20% faster than ``h @ W.T`` at (50, 1024) x
    (1024, 4096) on one thread (5.5 against 6.9 ms) and at (50, 256) x (256, 1024). A
    Fortran-ordered ``w`` (laid out for the plain form) and a batch of one run as written.
    """
    batch = h.shape[0] if h.ndim == 2 else 0
    if (
        batch >= _FORM_MIN_BATCH
        and batch * w.size >= STEP_PRODUCT_MEASURED_MIN  # (before the flags: a small call
        and w.flags.c_contiguous  # pays the two cheapest tests only)
        and _product_is_transposed(
            batch, w.shape[0], w.shape[1], w.dtype, _rnn_measure._blas_threads()
        )
    ):
        product: Array = np.matmul(w, h.T)
        return product.T
    plain: Array = np.matmul(h, w.T)
    return plain


def _product_is_transposed(
    batch: int, rows: int, cols: int, dtype: np.dtype[Any], blas_threads: int
) -> bool:
    """Whether ``(w @ h.T).T`` beats ``h @ w.T`` for this shape (``w`` row-major), measured once
    per process and key, by one thread at a time (as :func:`ops._rnn_forms._kernel_form`);
    the transposed product must be clearly faster (:data:`_FORM_MARGIN`)."""
    key = (batch, rows, cols, dtype, blas_threads)
    found = _products.get(key)
    if found is None:
        with _rnn_forms._forms_lock:
            found = _products.get(key)
            if found is None:  # the first batch of its bucket is measured (_size_bucket)
                bucket = (_rnn_measure._size_bucket(batch), rows, cols, dtype, blas_threads)
                found = _product_buckets.get(bucket)
                if found is None:
                    rng = np.random.default_rng(0)
                    h = rng.random((batch, cols), dtype=np.float32).astype(dtype, copy=False)
                    w = rng.random((rows, cols), dtype=np.float32).astype(dtype, copy=False)
                    plain, transposed = _rnn_measure._best_times(
                        (lambda: np.matmul(h, w.T), lambda: np.matmul(w, h.T)), 5, 200, 0.005
                    )
                    found = _product_buckets[bucket] = transposed < _FORM_MARGIN * plain
                _products[key] = found
    return found
