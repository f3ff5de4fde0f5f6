"""The recurrent kernels' arrays: scratch buffers kept per thread, the output each call
returns, and the block views the blocked kernels work in.

**Scratch buffers.** A kernel's temporaries (what a call writes before it reads and does not
return: the projection's chunk, the gates, the small kernels' reordered weight copies, a
block copy of ``W_hh``) come from :func:`_scratch`, kept by the calling thread between calls:
at most :data:`SCRATCH_MAX` a thread, none over :data:`SCRATCH_BYTES_MAX`. Allocated per
call, they made the kernels bimodal (glibc handed blocks back to the system in some
processes and the next call faulted their pages in again: about 1,000 faults a forward of
the (50, 1, 128) ensemble, 4.7-5.5 ms against 3.3). Kernels run one at a time on a thread,
so one set a thread serves them all, and a pool thread's go with it when the pool closes.
Measurements that run kernels on shapes of their own drop the calling thread's set
afterwards (:func:`_drop_scratch`).

**Outputs.** Each call returns a fresh output (:func:`_output`, never a scratch buffer: a
result never shares memory with a later call's). The kernels write each step's h straight
into its row of it, where the next step's GEMM reads it: nothing is copied between steps.

**Block views.** The blocked kernels keep their gates and state as (blocks, batch, width),
each gate whole blocks, contiguous. :func:`_weight_blocks` gives ``W_hh`` (G*H, H) as
(blocks, H, width), block ``k`` being ``W[k*width : (k+1)*width].T``: copied into a scratch
buffer, or the row-major weight itself seen that way (each block then a Fortran-ordered
operand, which BLAS reads transposed without a copy). :func:`_output_blocks` sees the output
as (T, B, H / width, width), where each step's h goes from the block layout with one
transposing copy.
"""

from __future__ import annotations

import threading
from typing import Any, TypeAlias

import numpy as np

__all__ = ["SCRATCH_BYTES_MAX", "SCRATCH_MAX"]

Array: TypeAlias = "np.ndarray[Any, Any]"

#: A thread keeps at most this many scratch buffers (``_scratch``); past it they start over.
#: One small kernel uses up to six (its weights' copies, the chunk, the gates, the rows, the
#: projection's), so a thread running an LSTM's and a GRU's alternately needs twelve: at 8,
#: whenever both projections measured fastest in a form with a buffer of its own, every
#: call started over and faulted its pages in again.
SCRATCH_MAX = 16
#: Temporaries larger than this are allocated per call, as numpy would: kept, they stay
#: allocated beside the outputs until the pool closes. Measured at the tutorial's size, where
#: a direction's projection chunk is 8 MiB and its input rows 2 MiB: keeping every buffer
#: raised the forward's peak from 575-585 to 590-606 MiB (1.16x to 1.20x numpy's), for page
#: faults worth about 1% of a kernel that long. Small models, where faults cost most (a
#: third of the (50, 1, 128) ensemble's time), have temporaries of a few hundred KiB.
SCRATCH_BYTES_MAX = 1 << 20
_scratch_local = threading.local()


def _scratch(name: str, shape: tuple[int, ...], dtype: Any) -> Array:
    """A buffer for a kernel's temporaries, kept by the calling thread between calls.

    Only what a call writes before it reads and does not return goes here (the projection's
    chunk, the gates, the small kernel's reordered weight copies): its contents are garbage
    on entry. Allocating them at every call made the recurrent kernels bimodal. glibc
    returns a freed block of that size to the system when it ends up at the top of the heap
    or was mapped on its own, and the next call then faults every page in again: measured,
    about 1,000 page faults a forward of the (50, 1, 128) ensemble (3.3 against 4.7-5.5 ms a
    forward, in whichever processes the heap's layout did it). Kernels run one at a time on
    a thread, so one set a thread serves them all; each pool thread's go with it when the
    pool closes. Buffers over :data:`SCRATCH_BYTES_MAX` are not kept (a new array each
    call): at bigger sizes the faults weigh little against the kernel, and kept buffers
    would add to the peak memory.
    """
    cache: dict[tuple[str, tuple[int, ...], Any], Array] | None = getattr(
        _scratch_local, "buffers", None
    )
    if cache is None:
        cache = _scratch_local.buffers = {}
    key = (name, shape, dtype)
    found = cache.get(key)
    if found is None:
        found = np.empty(shape, dtype=dtype)
        if found.nbytes <= SCRATCH_BYTES_MAX:
            if len(cache) >= SCRATCH_MAX:
                cache.clear()
            cache[key] = found
    return found


def _drop_scratch() -> None:
    """Forget the calling thread's scratch buffers (a kernel running on it keeps the ones it
    holds; later calls allocate new ones)."""
    _scratch_local.__dict__.pop("buffers", None)


def _output(steps: int, batch: int, hidden: int, dtype: Any, batch_first: bool) -> Array:
    shape = (batch, steps, hidden) if batch_first else (steps, batch, hidden)
    return np.empty(shape, dtype=dtype)


def _weight_blocks(w_hh: Array, block: int, view: bool = False) -> Array:
    """``W_hh`` (G*H, H) as ``(G*H / block, H, block)``: block ``k`` is ``W[k*block :
    (k+1)*block].T`` (the blocked kernels' step GEMM is ``h @ blocks``). Copied, row-major;
    or with ``view``, ``W_hh`` itself seen that way (it must be row-major: each block is then
    a Fortran-ordered operand, which BLAS reads transposed without a copy)."""
    rows, hidden = w_hh.shape
    blocks = rows // block
    if view:
        seen: Array = np.asarray(w_hh).reshape(blocks, block, hidden).transpose(0, 2, 1)
        return seen
    wb = _scratch("w_hh_blocks", (blocks, hidden, block), w_hh.dtype)
    np.copyto(wb, np.asarray(w_hh).reshape(blocks, block, hidden).transpose(0, 2, 1))
    return wb


def _output_blocks(out: Array, block: int, batch_first: bool) -> Array:
    """A (T, B, H / block, block) view of the output (T, B, H) (or (B, T, H) with
    ``batch_first``): where each step's h goes from the blocked kernels' block layout."""
    if batch_first:
        batch, steps, hidden = out.shape
        view: Array = out.reshape(batch, steps, hidden // block, block).swapaxes(0, 1)
        return view
    steps, batch, hidden = out.shape
    flat: Array = out.reshape(steps, batch, hidden // block, block)
    return flat
