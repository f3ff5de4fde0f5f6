"""Adaptive intra-op threads: BLAS gets one thread while a crowd of kernels runs side by side.

OpenBLAS's pthreads build (the one numpy's wheels bundle) runs one multithreaded call at a
time: GEMMs issued from several inter-op threads with BLAS's default thread count (the cores)
wait for each other. Measured on this project's 2-vCPU VM, the seed ensemble's forward took
1.45-1.92 s with the defaults (2 inter-op x 2 BLAS threads) against 1.05-1.51 s with one BLAS
thread, and plain numpy 1.26-1.51 s; on 16 cores, 2.1-2.7 s against 0.89 s. One BLAS thread
everywhere is no answer either: a single chain of large GEMMs then loses the intra-op level.

So while a runtime with the default intra-op setting runs, the *long* kernels running (those
whose signature measures at least :data:`LONG_SECONDS`) and the kernels of ops that call BLAS
(an op declares it: ``op.intraop = True``, as ``ops``' matmul, linear and recurrent ops do),
every pool's, counted under the graph lock, process-wide like OpenBLAS's own setting, steer
the count. A *crowd* is as many of them side by side as half BLAS's own count, at least 2
(2 on 2-5 cores, 8 on 16): k
kernels on one thread each keep k cores busy, one multithreaded call at a time keeps all of
them busy at the efficiency of BLAS's threading, about half on 16 cores (there, 8 inter-op
threads at one BLAS thread each ran the seed ensemble in 0.76-0.89 s against 0.83 s for
plain numpy at 16 BLAS threads, tenth session). Short kernels that call no BLAS do not
count: one LSTM layer at the tutorial's size beside a stream of small ops on the pool took
139-462 ms a forward when they did, against 142-166 ms with BLAS's 2 threads kept. Short
BLAS kernels do: two small recurrent directions on numba's loops, whose one BLAS call (the
input projection) ran on BLAS's 2 threads, left OpenBLAS's helper threads spinning beside
the other direction (the ensemble at (50, 1, 64) with nothing set: 0.52x numpy's time
against 0.26x at one BLAS thread).

* a kernel that starts and makes a crowd sets BLAS to one thread;
* a kernel that starts without one gives BLAS its own count back, once no crowd has run for
  :data:`HOLD_SECONDS` (a program that is one chain of GEMMs keeps BLAS's threads throughout;
  one with parallel branches keeps one thread between its branches, and between one
  forward's last branches and the next forward's first).

OpenBLAS reads its count when a call starts, so a running kernel follows from its next BLAS
call (an LSTM's next time step). A change costs about 0.2 us (one C call) and happens only at
those transitions; a short kernel pays a comparison at its start and a test at its end.

The governor is off (BLAS keeps one count) when the program chose the count itself
(``intraop_threads=``, :func:`dataflow.set_num_threads` or a thread environment variable; a
count set otherwise while a governed runtime runs, with threadpoolctl say, is found at the
governor's next change, and it steps aside; a count put back since, the governor's again,
is restored at the last close: :data:`_aside`), when the pool has one thread,
and for BLAS builds without the serialization (OpenMP builds, MKL): see
:func:`dataflow.parallel_info`; nor while a runtime that chose its count is open
(``_intraop``). A child made by ``os.fork()`` starts ungoverned, with BLAS's own count (no
runtime is open there).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "GOVERNOR",
    "HOLD_SECONDS",
    "LONG_SECONDS",
    "BlasGovernor",
    "acquire",
    "crowd",
    "governed",
    "release",
    "resume",
    "stop",
]

#: A kernel that starts without a crowd gets BLAS's own count back only once no crowd has run
#: for this long. After a multithreaded call, OpenBLAS's helper threads spin
#: for about 0.1 s (2**28 cycles, ``$OPENBLAS_THREAD_TIMEOUT``) waiting for the next one:
#: each burns a core. Measured at (50, 50, 256), giving the first kernel of each forward
#: (alone for microseconds, until the dispatch queued the next) its own 2 threads made the
#: forward 100-120 ms against 70-80 at one thread: one worker's kernels ran 2-3x slower
#: beside the spinning helper. A pause longer than the spin pays for it.
HOLD_SECONDS = 0.25

#: Kernels whose signature measures at least this long count toward a crowd (kernels of ops
#: that call BLAS, ``Op.intraop``, count whatever their time). Below it a kernel that calls
#: no BLAS has no BLAS threads to spare, while counting it would take them from a long
#: kernel beside it.
LONG_SECONDS = 1e-3


def crowd(own: int) -> int:
    """How many kernels side by side run one BLAS thread each, for BLAS's own count ``own``:
    half of it, at least 2 (see the module docstring)."""
    return max(2, own // 2)


class BlasGovernor:
    """The intra-op count of one serializing OpenBLAS, set from the long and BLAS-calling
    kernels running (every pool's: the scheduler calls :meth:`start_locked` and
    :meth:`end_locked` under the graph lock)."""

    __slots__ = ("_get", "_set", "counted", "crowd", "current", "own", "paired")

    def __init__(
        self,
        set_threads: Callable[[int], Any],
        own: int,
        get_threads: Callable[[], int] | None = None,
    ) -> None:
        self._set = set_threads
        self._get = get_threads
        self.own = own  # BLAS's own count: what a lone kernel gets
        self.current = own  # the count set now
        # The kernels running now that count toward a crowd, long or BLAS-calling (task ids,
        # every pool's): decided at each one's start, as its signature then stood, so that its
        # end takes off what its start added. Kernels that started before this governor
        # existed are not in it.
        self.counted: set[int] = set()
        self.paired = -math.inf  # when a crowd last ran (perf_counter)
        self.crowd = crowd(own)

    def start_locked(self, task_id: int) -> None:
        """A kernel that counts (long, or one that calls BLAS) starts: if it makes a crowd,
        BLAS gets one thread; else BLAS's own count, once no crowd has run for
        :data:`HOLD_SECONDS`. Holds the graph lock."""
        now = time.perf_counter()
        running = self.counted
        if len(running) >= self.crowd - 1:
            self.paired = now
            if self.current != 1:
                self.change(1)
        elif self.current == 1 and now - self.paired > HOLD_SECONDS:
            self.change(self.own)
        running.add(task_id)

    def end_locked(self, task_id: int) -> None:
        """A kernel ends: if it counted and was in a crowd, the crowd ran until now. Holds the
        graph lock."""
        running = self.counted
        if task_id in running:
            if len(running) >= self.crowd:
                self.paired = time.perf_counter()
            running.discard(task_id)

    def change(self, n: int) -> None:
        """Set BLAS's count to ``n``. Holds the graph lock.

        If BLAS's count is not the one this governor set (someone set it meanwhile:
        threadpoolctl, another library), that count stays and the governor steps aside for
        good: it stops governing, and restores nothing at the end.
        """
        get = self._get
        if get is not None and get() != self.current:
            _step_aside(self)
            return
        self.current = n
        self._set(n)

    def restore(self) -> None:
        """Put BLAS's own count back (the last governed runtime closed)."""
        if self.current != self.own:
            self.change(self.own)


#: The governor while a governed runtime is open (read by the scheduler at every kernel's
#: start and end); None otherwise.
GOVERNOR: BlasGovernor | None = None

_users = 0
_lock = threading.Lock()
# When a crowd last ran under a governor that has since been released: the next runtime (a
# loop of short runs) starts at one thread if that was under HOLD_SECONDS ago, rather than
# give its first kernel the threads that then spin beside the second.
_paired = -math.inf
# The serializing OpenBLAS's (set, get) functions, found once: [] where there is none.
_found: list[tuple[Callable[[int], Any], Callable[[], int]]] | None = None


def numpy_blas(libs: Sequence[Any]) -> Any | None:
    """Of threadpoolctl's BLAS controllers, numpy's own BLAS: the one loaded from numpy's
    package (its wheels bundle OpenBLAS in ``numpy.libs``), else the first loaded (numpy loads
    its BLAS when imported, before a library that depends on numpy loads its own); None for
    none. Measured: with scipy's OpenBLAS loaded too (numba imports scipy), reading the
    highest count of all took scipy's ungoverned 2 for numpy's governed 1, and the recurrent
    kernels picked their two-thread forms while running on one."""
    import numpy

    own = os.path.join(os.path.dirname(os.path.dirname(numpy.__file__)), "numpy")
    for lib in libs:  # (numpy/ or numpy.libs/)
        if (getattr(lib, "filepath", None) or "").startswith(own):
            return lib
    return libs[0] if libs else None


def _openblas() -> tuple[Callable[[int], Any], Callable[[], int]] | None:
    """The C setter and getter of numpy's BLAS where it is an OpenBLAS whose pthreads build
    serializes multithreaded calls; None otherwise (looked up once per process)."""
    global _found
    if _found is None:
        _found = []
        try:
            from threadpoolctl import ThreadpoolController

            libs = ThreadpoolController().select(user_api="blas").lib_controllers
        except Exception:  # pragma: no cover - threadpoolctl failing: govern nothing
            libs = []
        # numpy's own BLAS only: another library's (scipy brings its own OpenBLAS, and numba
        # imports scipy) runs none of numpy's products.
        found = _setter_getter(numpy_blas(libs))
        if found is not None:
            _found.append(found)
    return _found[0] if _found else None


def _setter_getter(lib: Any) -> tuple[Callable[[int], Any], Callable[[], int]] | None:
    """``lib``'s C count setter and getter where it is an OpenBLAS whose pthreads build
    serializes multithreaded calls (an OpenMP build's threads are per caller); else None."""
    from ._threads import _serial_blas

    if lib is None or lib.internal_api != "openblas" or not _serial_blas(lib.info()):
        return None
    prefix = getattr(lib, "_symbol_prefix", "") or ""
    suffix = getattr(lib, "_symbol_suffix", "") or ""
    try:
        setter = getattr(lib.dynlib, f"{prefix}openblas_set_num_threads{suffix}")
        getter = getattr(lib.dynlib, f"{prefix}openblas_get_num_threads{suffix}")
    except AttributeError:  # pragma: no cover - an OpenBLAS without them
        return None
    setter.argtypes = [ctypes.c_int]
    setter.restype = None
    getter.argtypes = []
    getter.restype = ctypes.c_int
    return setter, getter


def acquire(interop_threads: int) -> bool:
    """A runtime with the default intra-op setting opens on ``interop_threads`` threads:
    govern BLAS's count while it runs, where that helps. True: call :func:`release` at its
    close."""
    global _users
    if interop_threads < 2:
        return False
    from . import _threads

    if _threads.intraop_chosen():
        return False
    fns = _openblas()
    if fns is None:
        return False
    from . import _intraop

    with _lock:
        if _intraop.held():  # an open runtime chose the count
            return False
        if GOVERNOR is None and not _govern_locked(fns):
            return False
        _users += 1
    return True


def _govern_locked(fns: tuple[Callable[[int], Any], Callable[[], int]]) -> bool:
    """Start a governor of BLAS's count now (``acquire``, ``resume``); False where that count
    is 1 (nothing to adapt). Holds ``_lock``."""
    global GOVERNOR, _aside
    own = int(fns[1]())
    if own < 2:
        return False
    gov = BlasGovernor(fns[0], own, fns[1])
    _aside = None  # (its own count is the count now)
    gov.paired = _paired
    if time.perf_counter() - _paired <= HOLD_SECONDS:
        gov.change(1)
    GOVERNOR = gov
    return True


def resume() -> None:
    """The last runtime that chose the intra-op count closed (``_intraop.unhold``), having
    stopped the governor, while governed runtimes are still open: govern again, as
    :func:`acquire` would (they ran ungoverned to their end: two kernels side by side on
    BLAS's own count each). Not where BLAS's count is then 1, or the program chose one."""
    from . import _threads

    if _users <= 0 or GOVERNOR is not None or _threads.intraop_chosen():
        return
    fns = _openblas()
    if fns is None:
        return
    with _lock:
        if _users > 0 and GOVERNOR is None:
            _govern_locked(fns)


def _step_aside(gov: BlasGovernor) -> None:
    """``gov`` found a count it did not set: leave it, govern no more (this process's
    runtimes open from now on find that count and govern again only if it is above 1).
    The last governed runtime's release puts BLAS's own count back only if the count is
    again the one ``gov`` set (:data:`_aside`)."""
    global GOVERNOR, _aside
    if GOVERNOR is gov:
        GOVERNOR = None
        _aside = gov


#: The governor that stepped aside while governed runtimes are still open. A count someone
#: else sets stays, but one put back since (a ``with threadpool_limits()`` block restores the
#: count it found at its end: the governor's 1) is the governor's again: the last release
#: restores BLAS's own count where the count is the one it set (``BlasGovernor.change``
#: steps aside again otherwise). BLAS stayed at 1 for good after such a block.
_aside: BlasGovernor | None = None


def release() -> None:
    """The runtime that acquired the governor closed; the last one restores BLAS's count."""
    global GOVERNOR, _aside, _paired, _users
    from ._pool import GRAPH_LOCK

    with _lock:
        _users -= 1
        if _users > 0:
            return
        if GOVERNOR is None:
            aside, _aside = _aside, None
            if aside is not None:
                with GRAPH_LOCK:
                    aside.restore()
            return
        with GRAPH_LOCK:
            gov, GOVERNOR = GOVERNOR, None
            _paired = gov.paired
            gov.restore()


def stop(restore: bool = False) -> None:
    """The program is choosing the intra-op count (``set_num_threads``, which sets it right
    after): stop governing, and restore nothing, so that the count it sets stays; or, with
    ``restore``, BLAS's own count first (``_intraop.hold``: the count it finds is the one
    it puts back)."""
    global GOVERNOR, _aside
    from ._pool import GRAPH_LOCK

    with _lock, GRAPH_LOCK:
        gov, GOVERNOR, _aside = GOVERNOR or _aside, None, None
        if restore and gov is not None:
            gov.restore()


def _after_fork_in_child() -> None:
    """In a child made by ``os.fork()``: no runtime is open here (the parent's are the
    parent's), so none governs BLAS: its own count back, the lock free (the child kept
    the governor, and BLAS's governed count of 1, for good)."""
    global GOVERNOR, _aside, _users
    _lock._at_fork_reinit()  # type: ignore[attr-defined]
    gov, GOVERNOR, _aside, _users = GOVERNOR or _aside, None, None, 0
    if gov is not None:
        with contextlib.suppress(Exception):  # a BLAS that cannot be set: leave it
            gov.restore()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def governed() -> int | None:
    """BLAS's own count while the governor is on (for parallel_info); None when off."""
    gov = GOVERNOR
    return None if gov is None else gov.own
