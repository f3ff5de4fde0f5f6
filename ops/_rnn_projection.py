"""The sequence kernels' input projection: ``x @ w_ih.T + bias`` in time chunks, each chunk's
GEMM in the form measured fastest for its shape.

* **Time chunks.** The projection is computed for a chunk of steps at a time (one GEMM of
  ``chunk * batch`` rows, about :data:`CHUNK_BYTES` of output: :func:`chunk_steps`) into one
  buffer reused for every chunk (:func:`_project_chunk`, visiting the chunks in the
  direction's order: :func:`_chunks`), so a direction never holds its whole (T, B, G*H)
  projection: at the tutorial's size that is 8 MiB instead of 39 MiB per direction. An
  input that is not contiguous (a time-flipped view, a batch-first transpose) is copied into
  scratch rows first (:func:`_rows`).
* **The GEMM in the form BLAS likes for few rows.** OpenBLAS's AVX-512 GEMM is slow for few
  rows in the plain form, so a small projection (at most :data:`PROJECTION_MEASURED_MAX`
  multiply-adds) runs in whichever form :func:`_projection_form` measures fastest, once per
  shape: :data:`PLAIN` ``x @ w.T``; :data:`TRANSPOSED`, the transpose of ``w @ x.T``; or in
  blocks of :data:`PROJECTION_VIEW_WIDTHS` rows of ``w`` read in place (products small
  enough for OpenBLAS's small-matrix kernels) and copied back (:func:`_project`). At (20,
  256) x (256, 1024), one thread: 250 us plain, 159 transposed, 119 in blocks of 16.
  :func:`project_rows` is the entry point, used by numba's engine too (``ops._rnn_numba``).

The LSTM's transposed kernel computes its projection transposed itself (``W_ih @ x.T``), and
its fused kernel has none (the projection runs inside each step's GEMM).
"""

from __future__ import annotations

import functools
from typing import Any, TypeAlias

import numpy as np

from . import _rnn_measure
from ._rnn_buffers import _scratch, _weight_blocks
from ._rnn_measure import _FORM_MARGIN

__all__ = [
    "CHUNK_BYTES",
    "PLAIN",
    "PROJECTION_MEASURED_MAX",
    "PROJECTION_VIEW_WIDTHS",
    "TRANSPOSED",
    "chunk_steps",
    "project_rows",
]

Array: TypeAlias = "np.ndarray[Any, Any]"

#: Target size of one chunk of the input projection (bytes). Large enough that the chunk's GEMM
#: runs at full rate (at the tutorial's size a chunk is 10 steps: a (500, 1024) x (1024, 4096)
#: product), small enough that it stays in the last-level cache's neighbourhood.
CHUNK_BYTES = 8 << 20


def chunk_steps(steps: int, batch: int, width: int, itemsize: int) -> int:
    """How many time steps one chunk of the projection holds (at least 1, at most ``steps``)."""
    per_step = max(batch * width * itemsize, 1)
    return max(1, min(steps, CHUNK_BYTES // per_step))


#: Projections of at most this many multiply-adds (rows x inputs x outputs) have their GEMM
#: form measured (:func:`_projection_form`); larger ones run as ``x @ w.T``.
PROJECTION_MEASURED_MAX = 1 << 26
#: The block widths a small projection is also measured with, reading ``w`` in place
#: (:func:`_project`: form = the width).
PROJECTION_VIEW_WIDTHS = (16, 32)
#: :func:`_project`'s forms besides a block width: ``x @ w.T``, and the transpose of
#: ``w @ x.T``.
PLAIN, TRANSPOSED = 0, 1


# The measured forms by the rows' bucket (``ops._rnn_measure._size_bucket``), inputs,
# outputs and dtype: a row count first seen in a bucket that has one takes it unmeasured.
_buckets: dict[tuple[int, int, int, Any], int] = {}


@functools.lru_cache(maxsize=256)
def _projection_form(rows: int, inputs: int, outputs: int, dtype: Any) -> int:
    """The fastest form of a small input projection, ``x (rows, inputs) @ w.T`` with ``w``
    (outputs, inputs) row-major, measured once per bucket of row counts (the first count seen
    in it: :func:`ops._rnn_measure._size_bucket`), shape and dtype (:func:`_project`):
    :data:`PLAIN`; :data:`TRANSPOSED`, ``(w @ x.T).T`` (a transposed GEMM and a transposing
    copy); or a width from :data:`PROJECTION_VIEW_WIDTHS`, ``x @ w[k*width : (k+1)*width].T``
    for each block of ``w``'s rows read in place (one stacked GEMM: products small enough for
    OpenBLAS's small-matrix kernels) and a copy back into ``(rows, outputs)``.

    OpenBLAS's GEMM is slow for few rows in the plain form: one thread, AVX-512 kernels, at
    (20, 256) x (256, 1024) it took 250 us against 159 transposed and 119 in blocks of 16;
    (50, 128) x (128, 512), the numba engine's projection at (50, 1, 128): 114 against 101
    and 83. From a few hundred rows on the plain form wins. Interleaved runs, best of each,
    until each form has run 5 ms (at most 200 runs); another form must be 5% faster.
    """
    if rows * inputs * outputs > PROJECTION_MEASURED_MAX:
        return PLAIN
    bucket = (_rnn_measure._size_bucket(rows), inputs, outputs, dtype)
    form = _buckets.get(bucket)
    if form is None:
        form = _buckets[bucket] = _measure_projection(rows, inputs, outputs, dtype)
    return form


def _measure_projection(rows: int, inputs: int, outputs: int, dtype: Any) -> int:
    """:func:`_projection_form`'s measurement."""
    rng = np.random.default_rng(0)
    x = rng.random((rows, inputs), dtype=np.float32).astype(dtype, copy=False)
    w = rng.random((outputs, inputs), dtype=np.float32).astype(dtype, copy=False)
    out = np.empty((rows, outputs), dtype=dtype)
    forms = [PLAIN, TRANSPOSED, *(b for b in PROJECTION_VIEW_WIDTHS if outputs % b == 0)]
    runs = tuple(functools.partial(_project, x, w, out, form) for form in forms)
    times = _rnn_measure._best_times(runs, 5, 200, 0.005)
    best = min(range(1, len(forms)), key=times.__getitem__)
    return forms[best] if times[best] < _FORM_MARGIN * times[0] else PLAIN


def project_rows(rows: Array, w_ih: Array, out: Array) -> None:
    """``out = rows @ w_ih.T`` in the form measured fastest for the shape
    (:func:`_projection_form`; the plain one for a weight that is not row-major)."""
    form = PLAIN
    if w_ih.flags.c_contiguous:
        form = _projection_form(rows.shape[0], rows.shape[1], w_ih.shape[0], w_ih.dtype)
    _project(rows, w_ih, out, form)


def _rows(part: Array) -> Array:
    """A chunk of the input, (steps, batch, features), as contiguous (steps * batch, features)
    rows: itself reshaped, or copied into a scratch buffer (a time-flipped or batch-first
    input is not contiguous)."""
    steps, batch, features = part.shape
    if not part.flags.c_contiguous:
        copy = _scratch("rows", part.shape, part.dtype)
        np.copyto(copy, part)
        part = copy
    rows: Array = part.reshape(steps * batch, features)
    return rows


def _project(rows: Array, w_ih: Array, out: Array, form: int) -> None:
    """``out = rows @ w_ih.T`` in ``form`` (:func:`_projection_form`): directly, as the
    transpose of ``w_ih @ rows.T``, or in blocks of ``form`` rows of ``w_ih`` read in place
    (``w_ih`` row-major) and copied back."""
    if form == PLAIN:
        np.matmul(rows, w_ih.T, out=out)
    elif form == TRANSPOSED:
        product = _scratch("projection", (w_ih.shape[0], rows.shape[0]), out.dtype)
        np.matmul(w_ih, rows.T, out=product)
        np.copyto(out, product.T)
    else:
        n, outputs = rows.shape[0], w_ih.shape[0]
        blocks = _scratch("projection", (outputs // form, n, form), out.dtype)
        np.matmul(rows, _weight_blocks(w_ih, form, True), out=blocks)
        np.copyto(out.reshape(n, outputs // form, form), blocks.transpose(1, 0, 2))


def _project_chunk(
    x: Array, t0: int, t1: int, w_ih: Array, bias: Array | None, batch_first: bool, buf: Array
) -> Array:
    """``x[t0:t1] @ w_ih.T + bias`` into ``buf``'s first rows: a (t1 - t0, B, G) view."""
    part = x[:, t0:t1].swapaxes(0, 1) if batch_first else x[t0:t1]
    n, batch = part.shape[0], part.shape[1]
    rows = _rows(part)
    flat = buf[: n * batch]
    project_rows(rows, w_ih, flat)
    if bias is not None:
        flat += bias
    view: Array = flat.reshape(n, batch, buf.shape[1])
    return view


def _chunks(steps: int, size: int, reverse: bool) -> list[tuple[int, int]]:
    """[t0, t1) chunks covering the steps, in the order the direction visits them."""
    if size >= steps:
        return [(0, steps)]
    bounds = [(t0, min(t0 + size, steps)) for t0 in range(0, steps, size)]
    return bounds[::-1] if reverse else bounds
