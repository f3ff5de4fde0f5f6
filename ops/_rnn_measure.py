"""How the recurrent kernels time their alternatives, and the BLAS thread count they key the
answers by.

The kernels choose among forms that compute the same values (a sequence kernel's GEMM
orientation or blocks, the input projection's form, a weight's memory order, a step op's
product) by timing them on this machine, once per shape; the callers keep the answers.
:func:`_best_times` runs the candidates in turn, interleaved, so that a slow moment of a
shared machine hits them alike, and keeps each one's best time: at least a few rounds, then
more until each has run a time budget (small kernels are noisy). Another form must beat the
default one by :data:`_FORM_MARGIN` to be taken: a close call keeps the default.

A form's speed changes slowly with the batch (or the projection's rows): neighbouring sizes
choose the same form, and a close call between two forms costs little either way. So an
answer is also kept for the size's *bucket* (:func:`_size_bucket`: sizes within a factor of
about 1.4 of a power of two share one), and a size first seen in a bucket that already has
an answer takes it without measuring: a server whose batches come in every size from 1 to
32 measured 31 times (0.2-0.9 s each at hidden 256 on 2 cores, stalling the request that
met the size) and now measures 6 times. The first size of a bucket is measured as it is,
so a program of one shape (the benchmarks) measures exactly what it runs.

A form's speed depends on the BLAS thread count (bigger products gain more from BLAS's
threads), and a runtime sets that count for the whole process, so the answers are keyed by
:func:`_blas_threads`: numpy's own BLAS's count of the moment (``_blas_libs``, the
library's controller, is found once and kept here alone).

The modules that choose a form call these functions through this module
(``_rnn_measure._best_times``): once per measurement or call, and each has one binding,
which a monkeypatch here replaces for every caller.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ._rnn_buffers import _drop_scratch

__all__: list[str] = []

#: Another form must be this much faster than the plain one to be taken: a close call
#: (batch 1, where they measure within a few percent of each other) keeps the plain form,
#: which is the faster one there in a real workload (12% on a served (20, 1, 256) ensemble).
_FORM_MARGIN = 0.95


def _best_times(
    runs: tuple[Callable[[], object], ...], fewest: int, most: int, budget: float
) -> list[float]:
    """The best time of each of ``runs``, timed in turn (interleaved, so a slow moment of a
    shared machine hits them alike): at least ``fewest`` rounds, then more until they have
    run ``budget`` seconds each on average (small kernels are noisy), at most ``most``.

    The calling thread's scratch buffers are dropped afterwards (:func:`_drop_scratch`): the
    runs fill them for shapes of their own (a short sequence), which would otherwise stay
    allocated on the thread that built the model (30 MiB at the tutorial's size)."""
    best = [float("inf")] * len(runs)
    spent = 0.0
    for repeat in range(most):
        if repeat >= fewest and spent >= budget * len(runs):
            break
        for i, run in enumerate(runs):
            t0 = time.perf_counter()
            run()
            dt = time.perf_counter() - t0
            spent += dt
            best[i] = min(best[i], dt)
    _drop_scratch()
    return best


def _size_bucket(n: int) -> int:
    """The bucket of a batch (or row count) ``n`` whose measured answers it may share
    (module docstring): ``n`` itself up to 4 (the smallest sizes differ most), else the
    power of two nearest to it on a log scale (6-11 -> 8, 12-22 -> 16, 23-45 -> 32)."""
    if n <= 4:
        return n
    lower = 1 << (n.bit_length() - 1)
    return lower << 1 if n * n >= 2 * lower * lower else lower


_blas_libs: list[Any] = []  # threadpoolctl's controller of numpy's BLAS, or None (found once)


def _blas_threads() -> int:
    """numpy's BLAS thread count now (about a microsecond: asks the library itself). The
    forms' speeds depend on it (bigger products gain more from BLAS's threads), and a runtime
    sets it for the whole process (BLAS 1 on inter-op threads), so kernel forms are measured
    per count: a model built outside the runtime measures its weight layout under the
    process's default.

    numpy's own BLAS only (:func:`_numpy_blas`): with scipy's OpenBLAS loaded too (numba
    imports scipy), the highest count of the two read scipy's ungoverned 2 while numpy's ran
    on 1, and the tutorial's directions took the two-thread forms: 3.0-3.4 s a forward
    against 1.9-2.1 (the defaults, one process in two)."""
    if not _blas_libs:
        from threadpoolctl import ThreadpoolController

        found = ThreadpoolController().select(user_api="blas").lib_controllers
        _blas_libs.append(_numpy_blas(found))
    lib = _blas_libs[0]
    return 1 if lib is None else int(lib.get_num_threads())


def _numpy_blas(libs: list[Any]) -> Any:
    """Of threadpoolctl's BLAS controllers, the one numpy's products call: loaded from numpy's
    package (its wheels bundle OpenBLAS in ``numpy.libs``), else the first loaded (numpy loads
    its BLAS when imported, before a library that depends on numpy loads its own); None for
    none."""
    own = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy")
    for lib in libs:  # (numpy/ or numpy.libs/)
        if (getattr(lib, "filepath", None) or "").startswith(own):
            return lib
    return libs[0] if libs else None
