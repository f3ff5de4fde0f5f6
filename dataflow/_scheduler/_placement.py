"""Where a task runs: the inline threshold, sampled kernel timing, and the GIL lane.

The policy is in :mod:`dataflow._scheduler`'s docstring ("Small work runs where it is needed"
and "The GIL lane"); this module holds its settings and the GIL measurement, which is pure
arithmetic on a :class:`~dataflow._signature.Signature` (unit-tested without threads).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from .._errors import DataflowTypeError, DataflowValueError

if TYPE_CHECKING:
    from .._pool import InteropPool
    from .._signature import Signature

__all__ = [
    "AWAITED_AT_ONCE",
    "AWAIT_HERE_SECONDS",
    "BUSY_MIN",
    "DEFAULT_INLINE_THRESHOLD",
    "EWMA",
    "FIRST_RUNS",
    "OUTLIER",
    "HELP_WALK",
    "LEAVE_FREE_SECONDS",
    "PROBE",
    "QUIET_SECONDS",
    "SAMPLE",
    "SHARE_MIN",
    "SPAWN_CPU_SHARE",
    "WARM_UP",
    "dispatcher_overlap",
    "check_threshold",
    "get_inline_threshold",
    "leave_to_pool",
    "note_overlap",
    "note_seconds",
    "parallel_gil",
    "runs_inline",
    "set_inline_threshold",
]

#: Kernels measured (or estimated) faster than this run inline; see ``dataflow._scheduler``.
DEFAULT_INLINE_THRESHOLD = 50e-6
_inline_threshold = DEFAULT_INLINE_THRESHOLD

#: A ready task expected to take less than this is run by the event loop's thread when it
#: awaits the task before a worker has started it, and its dispatch from the loop wakes no
#: worker until the loop's current callback ends (``dataflow._scheduler``, "Small work runs
#: where it is needed"): the longest the loop is held by a kernel it could have handed off.
AWAIT_HERE_SECONDS = 1e-3

#: Small tasks the event loop dispatches (expected under AWAIT_HERE_SECONDS) wake no worker
#: until the loop's current callback ends, or until this long after the first of them, when
#: the loop dispatches for longer (``submit``). A worker woken while the loop dispatches waits
#: for the GIL the loop holds, at every step of its kernel that needs it: measured, the numba
#: engine's (50, 1, 128) ensemble on 2 cores (eight ~0.35 ms direction kernels dispatched in
#: one callback): woken at the second ready task, one worker's first kernel took 2.3 ms, the
#: loop took 0.9 ms to dispatch instead of 0.4, and the direction kernels, measured slower
#: side by side, were often run one after another on the loop; woken when the callback
#: ended, both workers ran four each back to back: 1.74-1.79 ms a forward against 2.32-2.35
#: on one inter-op thread (best of 200 forwards; medians 1.89-1.98 against 2.51-2.64).
#: (A loop that queues such tasks and then runs Python without dispatching more holds them
#: until it awaits: woken, a worker would mostly wait for the GIL it holds.)
QUIET_SECONDS = 1e-3

#: After this many tasks in a row of a signature that the loop ran itself on awaiting them,
#: its tasks under AWAIT_HERE_SECONDS run at dispatch, as small ones do (one in PROBE takes
#: the usual way, to notice a program that stops awaiting it at once).
AWAITED_AT_ONCE = 4

#: A small task a worker makes ready while the loop is dispatching tasks that wait for
#: inputs (the loop's last such dispatch under this long ago) is handed back to the loop
#: rather than run on the worker: a chain of small ops dispatched behind a big one, run on a
#: worker while the loop dispatches the rest of the chain, had the two threads take turns on
#: the GIL and the graph lock at every op, and the chain never caught up (``submit``).
HANDBACK_SECONDS = 50e-6

#: The loop awaiting a task that waits for inputs runs the queued tasks it waits for itself
#: (within AWAIT_HERE_SECONDS in all); it looks for them through at most this many pending
#: tasks above the awaited one.
HELP_WALK = 64

# Kernel timing is sampled: the first runs of a signature, then one in SAMPLE.
FIRST_RUNS = 4
SAMPLE = 32
EWMA = 0.25
# A timed run counts as at most this many times the signature's estimate (``note_seconds``).
OUTLIER = 4.0
# The GIL lane (``dataflow._scheduler``): a signature is serial once its GIL fraction, the median
# over its last GIL_WINDOW overlapped runs (at least GIL_DECIDE), is over the first figure;
# free again under the second. Two kernels that overlap each take (1 + g) times their best,
# so running them side by side gives 2 / (1 + g) times the throughput of one after the
# other: parallel pays while g < 1. (Measured pairs of LSTM direction kernels, 2 vCPUs:
# batch 1 x 128 channels, each 2.4x slower paired, 0.83x the throughput; batch 4 x 256,
# 1.8x slower, 1.26x the throughput; batch 16 x 256, 1.5x the throughput.) The same
# workload measured g = 0.42 in one run and 1.81 in another on a shared VM, so the lane
# only takes kernels that lose (g over 1.15: under 0.93x the throughput paired), and frees
# them once they gain (under 0.85: over 1.08x). It took kernels only past 1.5 (0.8x) until
# the LSTM's blocked kernel (2026-11-27, seventh session) made small directions faster and
# more GIL-bound: at (50, 4, 128) they measured g = 1.1-1.6 paired, were run side by side in
# some processes, and the ensemble on two inter-op threads took 1.07-1.22x one thread's
# time. With 1.15: 0.95x one thread there, 0.88x at (50, 16, 128); the sizes whose
# directions gain paired (g well under 1) are unchanged (fresh processes, best of 3-4
# rounds; the noise on a shared VM is as wide either side of the mark, so the mark sits
# where misplacing costs about as much either way).
SERIAL_ABOVE = 1.15
FREE_BELOW = 0.85
GIL_DECIDE = 12
GIL_WINDOW = 16
# Pool runs of a signature not measured for the GIL: caches, allocator and BLAS warm up.
WARM_UP = 8
# One run in this many of a serial signature skips the GIL lane, to measure again.
PROBE = 256
# Runs shorter than this say nothing about the GIL (clock resolution, start-up).
MIN_MEASURED = 50e-6
# Pool runs of a kernel estimated at least this long are all measured for the GIL (a few
# clock reads, ~1 us); shorter ones are sampled like any other run (``FIRST_RUNS``,
# ``SAMPLE``): their measurement would be thrown away (``MIN_MEASURED``), and for a kernel of
# a few microseconds forced to the pool (``inline=False``) it was a third of a worker's cost.
MEASURE_POOL_ABOVE = MIN_MEASURED / 2
# Many cores: a run beside at least PARALLEL_OTHERS others on a machine of at least
# PARALLEL_CORES cores also reads the process's CPU time (``parallel_gil``), which sees what
# ``g`` misses once every run is contended. Below SERIAL_PARALLEL of the extra cores it could
# have used, a run counts as GIL-bound (g past SERIAL_ABOVE, the serial mark). Measured on a 16-core
# VM (2026-11-27): seven or eight GIL-bound LSTM directions side by side kept the process on
# 1.4-2.3 cores (taking turns on the GIL costs CPU time there: futex wake-ups of idle
# vCPUs), 0.07-0.2 of the extra cores; GIL-free ones use nearly all. Three conditions keep
# other waits from counting as the GIL's, each read for the run's own thread where the OS
# tells (``blocked``: Linux's per-thread voluntary context switches):
# * the thread blocked at least once (a waiter for the GIL sleeps on it; a GIL-free thread
#   starved of cores by other processes, or a container's CPU quota, is preempted instead:
#   measured, 8 BLAS threads on 2 cores, 0.01 voluntary switches a ms against 0.24-15 for
#   GIL-bound ones); where that is not known, a run whose process used SERIAL_EXTRA cores or
#   more beyond one is left to ``g``;
# * the process was on a CPU at least BUSY_MIN of the run (someone held the GIL and ran; a
#   kernel that sleeps or waits for I/O beside idle ones is not GIL-bound);
# * the thread itself ran at least SHARE_MIN of an even share among the kernels side by side
#   (GIL-bound ones measured 1.5-3x an even share; a sleeping kernel ~0).
# What this cannot tell apart: GIL-free kernels that also block on the GIL (taking it back
# after each BLAS call) on a machine whose other processes leave them under a third of the
# cores they could use. They are marked serial while that lasts; probes (one run in PROBE)
# lift the mark once they use the cores again.
PARALLEL_OTHERS = 2.0
PARALLEL_CORES = 4
SERIAL_PARALLEL = 0.3
SERIAL_EXTRA = 0.5
BUSY_MIN = 0.5
SHARE_MIN = 0.25
# A plan's runner adds a runner for ready work only when that work's kernels keep at least
# this share of their wall time on a CPU while others run (``Signature.cpu_share``), and are
# not serial. Measured: GIL-free kernels (an LSTM direction at batch 50) 0.98-1.0 side by
# side; about 0.05 for GIL-bound ones sixteen at a time on 16 cores. In pairs on 2 vCPUs it
# tells nothing: 0.72 for the (10, 1, 32) ensemble's directions, which lose run side by side,
# and 0.76-0.77 at (20, 1, 256) and (50, 4, 128), which gain (compiled: 2.9 against 4.4 ms a
# forward, one runner against two). There ``Signature.serial`` (the GIL lane's estimate from
# the same overlapped runs) decides; the share stops what it misses: pure-Python kernels that
# were never measured alone (their best time is a contended one, so g reads low: 0.03, share
# 0.29 for two side by side) and the many-core pile-up.
SPAWN_CPU_SHARE = 0.5
# The loop, awaiting, leaves a measured GIL-free kernel of at least LEAVE_FREE_SECONDS to the
# pool while other work is queued or running there (``leave_to_pool``). Measured, the numba
# engine's (50, 1, 128) ensemble on 2 cores: awaiting the forward's output, the loop took 3 of
# the 8 direction kernels (~300 us each) while both workers ran theirs, three threads on two
# cores; its kernels took up to 2.5x as long. Left to the pool: 1.78-1.81 ms a forward against
# 2.05-2.28 (best of 7 x 50 forwards, 4 processes each, interleaved). "Measured GIL-free":
# not serial, a CPU share of at least FREE_CPU_SHARE side by side, over GIL_DECIDE or more
# overlapped runs. The share leaves out pool runs beside a kernel the loop ran itself
# (``note_overlap``'s ``share``): three threads on two cores read 0.7-0.75 for these GIL-free
# kernels (0.95-0.99 without the loop's), under FREE_CPU_SHARE, so the loop went on taking
# them, for 20-30 forwards of a fresh process in some (about 3 ms a forward against 2).
LEAVE_FREE_SECONDS = 100e-6
FREE_CPU_SHARE = 0.8


def leave_to_pool(sig: Signature, pool: InteropPool, running: int) -> bool:
    """Whether the loop, awaiting, leaves a queued task of ``sig`` to ``pool`` rather than run
    it itself: a GIL-free kernel (as measured) long enough to be worth a hand-off, while
    other tasks wait for the pool or ``running`` kernels run (the workers keep the cores
    busy; the loop would only add a thread to share them). A lone one (nothing else queued
    or running) the loop still runs: it saves the hand-off. (The signature's fields are
    read first: most awaited tasks are short, and this is on every await.)"""
    return (
        sig.seconds >= LEAVE_FREE_SECONDS
        and not sig.serial
        and sig.cpu_share >= FREE_CPU_SHARE
        and len(sig.overlaps) >= GIL_DECIDE
        and (running > 0 or pool.queued > 1)
    )


def runs_inline(sig: Signature, threshold: float) -> bool:
    """Whether a task of ``sig`` runs on the thread that needs it rather than on the pool.

    Below the inline threshold a hand-off costs more than the kernel. A GIL-bound (serial)
    kernel shorter than the interpreter's GIL switch interval (``sys.getswitchinterval()``,
    5 ms by default) runs there too: on a worker it would hold the GIL that long before the
    dispatching thread got it back, so the hand-off buys no parallelism and delays the
    dispatching thread as much as running it does. (Its probe runs, one in PROBE, still go
    to the pool to measure the GIL again.)
    """
    seconds = sig.seconds
    if seconds < threshold:
        return True
    return sig.serial and seconds < sys.getswitchinterval() and bool((sig.calls + 1) % PROBE)


def note_seconds(sig: Signature, wall: float) -> None:
    """Fold one timed run of ``wall`` seconds into ``sig.seconds``, the kernel's running
    average (:data:`EWMA`), and count it.

    The first run of a signature pays first-call costs that later runs do not (imports, a
    kernel's one-off calibration of its shapes, cold caches and allocator): measured, 2-3 ms
    for an LSTM sequence kernel whose runs then take 65 us. Averaged in, that first figure
    took hundreds of calls to decay (runs are sampled, one in :data:`SAMPLE` after the
    first :data:`FIRST_RUNS`), and a kernel well under a hand-off's cost was sent to the pool
    meanwhile. So the second run's time replaces the first's where it is smaller; the
    average starts from there.

    After that a run counts as at most :data:`OUTLIER` times the estimate. A sampled run of a
    1 us op that a 5 ms preemption (or a full garbage collection) fell into used to lift its
    estimate past the inline threshold at once; the next call then went to the pool, every
    later op of a chain waited for it, and a chain of tiny ops ran on a worker through the
    full task path, 10x slower, from then on (seen after ~94k ops of a 3M chain).
    """
    runs = sig.runs
    if runs > 1:
        seconds = sig.seconds
        # Noise only adds time: one run slowed by a preemption or a garbage collection
        # counts as at most OUTLIER times the estimate (a real change still shows within a
        # few samples: each moves the estimate up to 1.75x).
        if wall > seconds * OUTLIER:
            wall = seconds * OUTLIER
        sig.seconds = seconds + (wall - seconds) * EWMA
    elif runs == 1:
        if wall < sig.seconds:
            sig.seconds = wall
    else:
        sig.seconds = wall
    sig.runs = runs + 1


def set_inline_threshold(seconds: float) -> None:
    """The process default: kernels faster than this run inline (default 50 us).

    A runtime takes the default when it opens (``async with``; a change later reaches the
    runtimes opened after it, not one open already: ``Runtime(inline_threshold=)`` sets its
    own). 0 sends every op with a kernel time to the pool; a large value runs everything
    inline (sequentially, on the thread that dispatches or finishes its inputs).
    """
    global _inline_threshold
    _inline_threshold = check_threshold(seconds, "set_inline_threshold(seconds):")


def check_threshold(seconds: object, what: str) -> float:
    """``seconds`` as a float if it is a number >= 0 (numpy's too, as a ``Cost`` takes them:
    ``np.float32(1e-4)`` was refused as "not a number of seconds", ``np.float64`` taken); else
    a DataflowTypeError or DataflowValueError naming ``what``."""
    from .._task import _NUMBERS

    if type(seconds) is bool or not isinstance(seconds, _NUMBERS):
        raise DataflowTypeError(
            f"{what} must be a number of seconds, got {type(seconds).__name__}: {seconds!r}"
        )
    if not seconds >= 0:
        raise DataflowValueError(f"{what} must be >= 0, got {seconds!r}")
    return float(seconds)


def get_inline_threshold() -> float:
    """The process default inline threshold in seconds (see :func:`set_inline_threshold`)."""
    return _inline_threshold


def parallel_gil(
    wall: float,
    others: float,
    process: float,
    cores: int,
    cpu: float | None = None,
    blocked: bool | None = None,
) -> float:
    """The GIL fraction one run shows by the cores its process used (its CPU time over the
    run's wall time, ``process``), on the scale of ``g`` (:func:`note_overlap`); 0 where the
    run says nothing about the GIL.

    With ``others`` kernels beside it the process could have used ``min(1 + others, cores)``
    cores; GIL-bound kernels keep it near one, whatever their number (one holds the GIL, the
    rest wait off the CPU). The fraction of the extra cores it used maps to 0 (all: GIL-free)
    .. about 1.6 (none), crossing the serial mark :data:`SERIAL_ABOVE` at
    :data:`SERIAL_PARALLEL`.

    ``cpu`` (the run's thread CPU time) and ``blocked`` (whether the thread blocked in the
    run: voluntary context switches) tell a wait for the GIL from other waits (the
    constants' comment): a run whose process mostly idled, whose thread barely ran (it
    slept), or that never blocked (it was preempted: other processes had the cores) says
    nothing (0). Where ``blocked`` is not known, a run whose process used :data:`SERIAL_EXTRA`
    cores or more beyond one reads at most 1.0, the free mark.

    Measured on 16 cores: sixteen GIL-bound LSTM directions side by side each took 20x
    their time alone, yet read ``g`` = 0.1 (their best time was contended too); their
    thread's CPU share was 0.05. Seven or eight side by side on a 16-core VM kept the
    process on 1.4-2.3 cores with ``g`` reading 1.0 or less, and the forward ran at twice
    numpy's time until they were marked serial.
    """
    busy = process / wall
    if busy < BUSY_MIN or blocked is False:
        return 0.0
    if cpu is not None and cpu * (1.0 + others) < SHARE_MIN * wall:
        return 0.0
    possible = min(1.0 + others, float(cores)) - 1.0
    extra = max(0.0, busy - 1.0)
    g = SERIAL_ABOVE * (1.0 - min(1.0, extra / possible)) / (1.0 - SERIAL_PARALLEL)
    return g if blocked or extra < SERIAL_EXTRA else min(g, FREE_BELOW)


def dispatcher_overlap(wall: float, cpu: float, process: float) -> float:
    """How much of a run on a pool's only worker the dispatching thread overlapped it, on
    the scale of ``others`` (:func:`note_overlap`): the share of the run's wall time the
    process's other threads were on a CPU while this one was not, ``min(process - cpu,
    wall - cpu) / wall`` (``cpu``: the worker thread's CPU time in the run, ``process``: the
    process's).

    With one inter-op thread no kernel runs beside another, so the busy integral sees no
    overlap, yet the thread dispatching ops (the event loop) runs Python beside the worker.
    A GIL-bound kernel then waits for the GIL whenever the dispatcher holds it (measured at
    (20, 1, 64): the kernels that ran while the forward was being dispatched took 1.6-2.5x
    their time alone), off the CPU while the dispatcher is on it. A GIL-free kernel (BLAS)
    keeps its CPU. Fed to :func:`note_overlap` as the overlap, a GIL-bound kernel's run then
    reads ``g`` about ``wall / best``, over the serial mark once it took more than 1.15x its
    time alone; runs alone read under 0.3 and say nothing. Time the whole process lost to
    other processes (the worker and the dispatcher both off the CPU) does not count, so a
    loaded machine does not mark a kernel GIL-bound.
    """
    if wall <= 0:
        return 0.0
    return max(0.0, min(process - cpu, wall - cpu)) / wall


def note_overlap(
    sig: Signature,
    wall: float,
    others: float,
    cpu: float | None = None,
    process: float | None = None,
    cores: int = 1,
    blocked: bool | None = None,
    share: bool = True,
) -> None:
    """Fold one pool run of ``wall`` seconds, overlapped by ``others`` kernels on average,
    into ``sig``'s GIL estimate, and mark it serial or not (``dataflow._scheduler``, "the
    GIL lane").

    Against the best time ``b`` the run gives ``g = (wall / b - 1) / others``: 0 when the
    others cost this kernel nothing (GIL-free work on free cores), 1 when it only ran while
    they waited (all of it under the GIL).

    ``cpu``, the thread's CPU time during the run, also folds the run's CPU share into
    ``sig.cpu_share`` when others overlapped it: a thread waiting for the GIL is off the
    CPU, so a GIL-bound kernel beside others shows a low share whatever its best time
    (under constant contention the best time is itself a contended one, and ``g`` reads
    low: 16 GIL-bound kernels side by side on 16 cores measured g = 0.1 while each took 20x
    its time alone; their CPU share was 0.05).

    ``process``, the process's CPU time during the run, on a machine of ``cores`` cores (at
    least :data:`PARALLEL_CORES`) with at least :data:`PARALLEL_OTHERS` others beside the
    run, gives the run a second GIL estimate (:func:`parallel_gil`, with ``cpu`` and
    ``blocked``: whether the thread blocked in the run); the higher one counts.

    ``share`` False: the run's CPU share is not folded (the dispatching thread ran a kernel
    of its own beside it, a thread more than the pool's on the cores; the loop does that
    for kernels not yet measured GIL-free, ``leave_to_pool``, so counting those runs kept
    the share of GIL-free kernels under FREE_CPU_SHARE, and the loop on taking them).
    """
    if wall < MIN_MEASURED:
        return
    if cpu is not None and others > 0.3 and share:
        sig.cpu_share += (min(1.0, cpu / wall) - sig.cpu_share) * EWMA
    if not sig.best or wall < sig.best:
        sig.best = wall
    # While serial, only a probe (a run that skipped the lane) measures sharing.
    if others <= 0.3 or (sig.serial and sig.calls % PROBE):
        return
    by_cores = (
        parallel_gil(wall, others, process, cores, cpu, blocked)
        if process is not None and others >= PARALLEL_OTHERS and cores >= PARALLEL_CORES
        else 0.0
    )
    # Only time off the CPU can have been a wait for the GIL (a thread waiting for it
    # sleeps): what the thread ran beyond the kernel's best time is a slower CPU (a
    # neighbour on its core, caches, the clock), not the GIL, and is taken out of the run's
    # wall time for the estimate. (The numba engine's direction kernels at (50, 1, 128) ran
    # about twice their best beside each other in some processes, on a CPU 80-96% of the
    # run: g read 1.2-1.6, they were marked GIL-bound and run one after another on the
    # loop; timed on plain threads, side by side took 1.07-1.3x their time alone.)
    best = sig.best
    if cpu is not None and cpu > best:
        wall -= cpu - best
    seen = sig.overlaps
    seen.append((wall, others, by_cores))
    if len(seen) > GIL_WINDOW:
        del seen[0]
    if len(seen) < GIL_DECIDE:
        return
    # The median is robust to a run a vCPU went missing in; the best time is today's, so
    # early slow runs do not count against the kernel.
    fractions = sorted(max((w / best - 1.0) / o, p) for w, o, p in seen)
    sig.gil = fractions[len(fractions) // 2]
    if sig.gil > SERIAL_ABOVE:
        sig.serial = True
    elif sig.gil < FREE_BELOW:
        sig.serial = False
