"""The local scheduler: where each task runs, and when. Its policy:

* **Dispatch returns at once.** Calling an op (or forking a plain function) creates a task
  and returns a pending handle; the meta and cost rules ran once for the call's signature
  (``_op``), so a repeated call costs a dictionary lookup plus what follows.
* **Small work runs where it is needed; big work goes to the pool.** Each op signature's
  kernel time is estimated from its cost rule, then measured (a running average of sampled
  runs, ``Signature.seconds``), as TensorFlow's executor splits inexpensive from expensive
  kernels. A kernel faster than the *inline threshold* (default 50 us, about what handing a
  task to another thread and back costs on a 2-vCPU VM) is not worth a hand-off, and in
  CPython it would hold the GIL anyway (numpy releases the GIL only in BLAS calls and in
  loops over large arrays), so running it elsewhere buys no parallelism:

  - a small task whose inputs are ready runs inline on the dispatching thread;
  - a small task that waits for inputs runs on the thread that finishes its last input,
    right after it: chains of small ops run back to back on one thread, with no wake-up;
  - an awaited small task that is queued and not started is run by the awaiting thread
    itself instead of waiting for a worker;
  - a big task goes to the pool. A worker that finishes a task goes on with the first big
    task it made ready (and with every small one), and queues the others for idle workers.

  So more inter-op threads only ever add parallelism for kernels that can use it, and a
  program of small ops runs like the same numpy code run plainly.
* **The GIL lane.** A big kernel can still be GIL-bound: a Python loop of small numpy calls
  (a whole LSTM direction at batch 1) holds the GIL nearly all the time, and two of them on
  two threads only take turns, slower than one after the other. The scheduler measures it:
  each pool integrates the number of kernels running over time, so every pool run knows how
  many others overlapped it on average (``o``) and, against the signature's best time
  ``b``, how much they slowed it: ``g = (w / b - 1) / o``, near 0 for BLAS and large ufuncs
  (they release the GIL) on free cores, 1 or more for a kernel that holds it. Two such
  kernels side by side give ``2 / (1 + g)`` times the throughput of one after the other;
  once the median over its last 12 to 16 overlapped runs passes 1.5 (under 0.8x the
  throughput: the noise of a shared machine blurs the break-even) a signature is *serial*:
  its kernels take the pool's GIL lane, one at a time (the thread holding the lane runs the
  next waiting one when it ends), while GIL-free kernels keep running in parallel beside it.
  One run in 256 of a serial signature skips the lane to measure again; under 1.0 the mark
  is lifted.
* **Ready order, and requests.** Work dispatched from a coroutine on the loop belongs to
  that coroutine's task (a request, in a server): its tasks take the request's age as their
  priority, so the oldest request's ready work runs first and a burst of new requests cannot
  starve an old one (a captured graph run adds its static critical-path rank). Otherwise the
  queue is FIFO by issue order. The continuation above keeps a worker on the chain it is on
  (its data is in cache, and a chain's intermediate arrays die young).
* **Work belongs to whoever still wants it.** When a request's task is cancelled (the client
  went away, a timeout), every task it dispatched that has not started is dropped, unless
  someone still wants its value: a live coroutine awaiting it, a handle on it held anywhere
  but in the cancelled coroutine's own variables, or an unfinished task of someone else that
  reads it. (The cancelled coroutine's frames are released for that: its CancelledError's
  traceback would keep its variables alive.) Awaiting a dropped value raises
  :class:`~dataflow.CancelledTaskError`. (asyncio; under trio a cancelled request's work runs
  to completion.)
* **Failures propagate, never hang.** A kernel that raises fails its task with a
  :class:`~dataflow.TaskError` chained to the original exception, and every task that depends
  on it fails with that same error, whatever runtime owns it; independent tasks are not
  affected. Every transition is accounted to the runtime that owns the task.
* **Timeouts.** A task with a timeout (``dataflow.op(timeout=)``, ``Runtime(op_timeout=)``)
  never runs inline on the loop; if its kernel outlives the timeout a watchdog thread fails
  it and its dependents with :class:`~dataflow.OpTimeoutError` and the stuck worker is
  replaced (see ``_timeout``).
* **Backpressure.** Past ``max_pending`` tasks in flight, ``submit`` makes the dispatching
  thread help run queued tasks until the count is 10% under the limit; with nothing to run it
  waits for the pool, unless all that is in flight waits on dispatching threads themselves
  (then it lets the dispatch through rather than deadlock). On the loop thread, a cancelled
  dispatching task stops at its next op.

The graph's rules are the pure transitions of ``_graphstate``; this module makes them under
:data:`~dataflow._pool.GRAPH_LOCK` and acts on what they return. The executor is injected: an
:class:`~dataflow._pool.InteropPool`, or none (``interop_threads=0``, the synchronous mode:
every task runs inline at dispatch, in program order, on the calling thread, like dask's
``get_sync``, for debugging).
"""

from __future__ import annotations

import heapq
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from threading import get_ident, get_native_id
from typing import TYPE_CHECKING, Any

from . import _graphstate as gs
from ._errors import (
    CancelledTaskError,
    DataflowError,
    DataflowTypeError,
    DataflowValueError,
    OpTimeoutError,
    task_failed,
)
from ._instrument import ACTIVE, GENERATION, HOOKED, Scope
from ._pool import GRAPH_LOCK, InteropPool, current_pool
from ._protect import protect, thaw
from ._record import Recorder
from ._task import (
    CANCELLED,
    DONE,
    PENDING,
    READY,
    RUNNING,
    Pending,
    Signature,
    Task,
    _next_id,
)
from ._timeout import TimedKernel, Watchdog
from ._walk import is_container, leaves, replace

if TYPE_CHECKING:
    from ._loop import HostLoop
    from ._runtime import Runtime

__all__ = [
    "DEFAULT_INLINE_THRESHOLD",
    "Scheduler",
    "note_overlap",
    "running_task",
    "get_inline_threshold",
    "resolve",
    "scan",
    "set_inline_threshold",
]

#: Kernels measured (or estimated) faster than this run inline; see the module docstring.
DEFAULT_INLINE_THRESHOLD = 50e-6
_inline_threshold = DEFAULT_INLINE_THRESHOLD

# Kernel timing is sampled: the first runs of a signature, then one in _SAMPLE.
_FIRST_RUNS = 4
_SAMPLE = 32
_EWMA = 0.25
# The GIL lane (module docstring): a signature is serial once its GIL fraction, the median
# over its last _GIL_WINDOW overlapped runs (at least _GIL_DECIDE), is over the first figure;
# free again under the second. Two kernels that overlap each take (1 + g) times their best,
# so running them side by side gives 2 / (1 + g) times the throughput of one after the
# other: parallel pays while g < 1. (Measured pairs of LSTM direction kernels, 2 vCPUs:
# batch 1 x 128 channels, each 2.4x slower paired, 0.83x the throughput; batch 4 x 256,
# 1.8x slower, 1.26x the throughput; batch 16 x 256, 1.5x the throughput.) The same
# workload measured g = 0.42 in one run and 1.81 in another on a shared VM, so the lane
# only takes kernels that clearly lose (g over 1.5: under 0.8x the throughput paired).
_SERIAL_ABOVE = 1.5
_FREE_BELOW = 1.0
_GIL_DECIDE = 12
_GIL_WINDOW = 16
# Pool runs of a signature not measured for the GIL: caches, allocator and BLAS warm up.
_WARM_UP = 8
# One run in this many of a serial signature skips the GIL lane, to measure again.
_PROBE = 256
# Runs shorter than this say nothing about the GIL (clock resolution, start-up).
_MIN_MEASURED = 50e-6

# Set on a thread while it helps run tasks for backpressure (helping never nests).
_helping = threading.local()
# The task whose kernel the thread is running (off the dispatching thread's inline path).
_running = threading.local()


def running_task() -> Task | None:
    """The task whose kernel the calling thread is running on the pool (or None).

    Inline kernels (run at dispatch) are not recorded: that is the hot path.
    """
    return getattr(_running, "task", None)


def set_inline_threshold(seconds: float) -> None:
    """The process default: kernels faster than this run inline (default 50 us).

    A runtime takes the default when it is created (``Runtime(inline_threshold=)`` sets its
    own). 0 sends every op with a kernel time to the pool; a large value runs everything
    inline (sequentially, on the thread that dispatches or finishes its inputs).
    """
    global _inline_threshold
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise DataflowTypeError(
            f"set_inline_threshold(seconds): must be a number of seconds, got "
            f"{type(seconds).__name__}: {seconds!r}"
        )
    if not seconds >= 0:
        raise DataflowValueError(f"set_inline_threshold(seconds): must be >= 0, got {seconds!r}")
    _inline_threshold = float(seconds)


def get_inline_threshold() -> float:
    """The process default inline threshold in seconds (see :func:`set_inline_threshold`)."""
    return _inline_threshold


def _leaf_value(v: Any) -> Any:
    return v.result() if isinstance(v, Pending) else v


def resolve(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with every pending handle (also inside containers) replaced by its value."""
    out = []
    for a in args:
        if isinstance(a, Pending):
            out.append(a.result())
        elif is_container(a):
            out.append(replace(a, _leaf_value))
        else:
            out.append(a)
    return tuple(out)


def _resolve_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: _leaf_value(v) if not is_container(v) else replace(v, _leaf_value)
            for k, v in kwargs.items()}  # fmt: skip


def scan(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> tuple[tuple[Task, ...], bool]:
    """The tasks of the pending handles in ``args``/``kwargs`` (containers walked), and
    whether all of them are done."""
    inputs: list[Task] = []
    for a in args if not kwargs else (*args, *kwargs.values()):
        if isinstance(a, Pending):
            inputs.append(a._task)
        elif is_container(a):
            inputs.extend(v._task for v in leaves(a) if isinstance(v, Pending))
    return tuple(inputs), all(t.state == DONE for t in inputs)


def _done(waiter: Any) -> bool:
    done = getattr(waiter, "done", None)
    return bool(done()) if done is not None else False


def note_overlap(sig: Signature, wall: float, others: float) -> None:
    """Fold one pool run of ``wall`` seconds, overlapped by ``others`` kernels on average,
    into ``sig``'s GIL estimate, and mark it serial or not (module docstring, "the GIL lane").

    Against the best time ``b`` the run gives ``g = (wall / b - 1) / others``: 0 when the
    others cost this kernel nothing (GIL-free work on free cores), 1 when it only ran while
    they waited (all of it under the GIL).
    """
    if wall < _MIN_MEASURED:
        return
    if not sig.best or wall < sig.best:
        sig.best = wall
    # While serial, only a probe (a run that skipped the lane) measures sharing.
    if others <= 0.3 or (sig.serial and sig.calls % _PROBE):
        return
    seen = sig.overlaps
    seen.append((wall, others))
    if len(seen) > _GIL_WINDOW:
        del seen[0]
    if len(seen) < _GIL_DECIDE:
        return
    # The median is robust to a run a vCPU went missing in; the best time is today's, so
    # early slow runs do not count against the kernel.
    best = sig.best
    fractions = sorted((w / best - 1.0) / o for w, o in seen)
    sig.gil = fractions[len(fractions) // 2]
    if sig.gil > _SERIAL_ABOVE:
        sig.serial = True
    elif sig.gil < _FREE_BELOW:
        sig.serial = False


class _Owner:
    """What one request (a task on the event loop) dispatched: weak references, in order, so
    a finished task (and its value) is freed as usual while the request goes on."""

    __slots__ = ("base", "dropped", "limit", "refs")

    def __init__(self, base: float) -> None:
        self.base = base
        self.refs: list[weakref.ref[Task]] = []
        self.limit = 1024
        self.dropped = False

    def add(self, task: Task) -> None:
        refs = self.refs
        refs.append(weakref.ref(task))
        if len(refs) > self.limit:  # forget the finished and freed ones now and then
            self.refs = [r for r in refs if (t := r()) is not None and t.state < DONE]
            self.limit = max(1024, 2 * len(self.refs))

    def tasks(self) -> list[Task]:
        """The tasks still alive, in dispatch order."""
        return [t for r in self.refs if (t := r()) is not None]


class Scheduler:
    """The local execution engine of one runtime (see the module docstring).

    Counters (read by ``repr``, tests and benchmarks): ``inflight`` tasks submitted and not
    finished, ``running`` kernels running on the pool now and ``peak_running`` at most,
    ``tasks_run`` kernels run off the dispatching thread, ``inline_run`` kernels run inline,
    ``dropped`` tasks dropped unrun because their request was cancelled.
    """

    def __init__(
        self,
        runtime: Runtime,
        pool: InteropPool | None,
        host: HostLoop,
        *,
        inline_threshold: float,
        max_pending: int | None,
        simulate: Callable[[Task], Any] | None,
    ) -> None:
        self.rt = runtime
        self.pool = pool
        self.host = host
        self.inline_threshold = inline_threshold
        self.simulate = simulate
        limit = (1 << 62) if max_pending is None else max_pending
        self._limit = limit
        self._low_water = limit - limit // 10
        self._blocked = 0  # threads other than the loop's held back in _throttle
        self.failures: list[BaseException] = []
        self.inflight = 0
        self.running = 0
        self.peak_running = 0
        self.tasks_run = 0
        self.inline_run = 0
        self.dropped = 0
        self.cancelling = False
        self.closed = False
        # Inline at dispatch is allowed (not while cancelling, nor with simulated kernels).
        self._inline_ok = simulate is None
        self._drained: Any = None
        self._watchdog: Watchdog | None = None
        # Requests (tasks on the loop) that dispatched deferred work, by their loop task.
        self._owners: dict[Any, _Owner] = {}
        # This runtime's own observers (the process's are in ACTIVE); ``watching`` mirrors
        # whether it has any, for the hot path's one test.
        self.scope = Scope(f"runtime {id(runtime) & 0xFFFF:x}")
        self.watching = False
        self.hooked = False  # an instrument (not only recorders) observes this runtime
        # The recorders observing it, as (scope, record method) pairs, cached by GENERATION.
        self._sinks: tuple[tuple[Scope, Any], ...] = ()
        self._appends: tuple[Callable[[Any], None], ...] = ()
        self._windowed: tuple[Any, ...] = ()
        self._overriding: tuple[tuple[Scope, Any], ...] = ()
        self._sinks_gen = -1
        self._recorded = 0
        self._natives: dict[int, int] = {}  # threading.get_ident() -> native thread id

    # -- observation (only when something observes: `if ACTIVE or self.watching`) ----------

    def observe(self, observer: Any, attach: bool) -> None:
        """Attach (or detach) an instrument or recorder to this runtime only."""
        if attach:
            self.scope.add(observer)
        else:
            self.scope.remove(observer)
        self.watching = bool(self.scope)
        self.hooked = self.scope.hooked

    def _scopes(self) -> list[Scope]:
        if self.watching:
            if not self.scope:  # its last observer was switched off
                self.watching = self.hooked = False
                return list(ACTIVE)
            return [*ACTIVE, self.scope]
        return list(ACTIVE)

    def sinks(self) -> tuple[tuple[Scope, Any], ...]:
        """(scope, recorder) of each recorder observing this runtime (cached by GENERATION,
        with the recorders' append methods for the inline path, ``_inline_recorded``)."""
        gen = GENERATION[0]
        if gen != self._sinks_gen:
            pairs = tuple((sc, rec) for sc in self._scopes() for rec in sc.recorders)
            for _, rec in pairs:
                rec.thread()  # names the calling thread (the loop's, usually) in its trace
            self._sinks = pairs
            # A recorder that overrides ``task`` gets the call (``_inline_recorded``).
            self._appends = tuple(
                rec.tasks.append for _, rec in pairs if type(rec).task is Recorder.task
            )
            self._overriding = tuple(
                (sc, rec) for sc, rec in pairs if type(rec).task is not Recorder.task
            )
            self._windowed = tuple(rec for _, rec in pairs if rec.max_seconds is not None)
            self._sinks_gen = gen
        return self._sinks

    def emit(self, hook: str, *args: Any) -> None:
        """Call ``hook`` on the instruments observing this runtime."""
        if not (HOOKED or self.hooked):
            return
        ts = time.perf_counter_ns()
        for scope in self._scopes():
            scope.emit_at(ts, hook, *args)

    def emit_at(self, ts: int, hook: str, *args: Any) -> None:
        """``emit`` with a given timestamp (an event that happened elsewhere: Dask)."""
        for scope in self._scopes():
            scope.emit_at(ts, hook, *args)

    def record(self, task: Task, start: int, end: int, failed: bool) -> None:
        """One span record of a task that ran, for the recorders observing this runtime."""
        for scope in self._scopes():
            for rec in scope.recorders:
                try:
                    rec.task(task, task.ready, start, end, failed)
                except BaseException as exc:  # no observer may break a run
                    scope.disable(rec, "task", exc)

    def record_unrun(self, cancelled: bool) -> None:
        for scope in self._scopes():
            for rec in scope.recorders:
                rec.unrun(cancelled)

    def record_span(self, kind: str, name: str, start: int, end: int, parent: str | None) -> None:
        """A fork's or a wait's span ended (on the loop thread)."""
        for scope in self._scopes():
            for rec in scope.recorders:
                try:
                    rec.span(kind, name, start, end, parent)
                except BaseException as exc:  # no observer may break a run
                    scope.disable(rec, "span", exc)

    # -- dispatch (the hot path) ---------------------------------------------------------------

    def submit(
        self,
        sig: Signature,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        inputs: tuple[Task, ...],
        ready: bool,
        priority: float | None = None,
        timeout: float | None = None,
        values: list[Any] | None = None,
    ) -> Task:
        """Add a task: run it inline, queue it, or park it on its inputs (module docstring).

        ``inputs`` are the tasks of the pending handles among the arguments, ``ready``
        whether all are done, and ``values`` (when the caller has them) the arguments with
        every handle replaced by its value. ``priority`` orders the task among ready tasks
        (smaller first; default: issue order). ``timeout`` bounds its kernel's run time.
        """
        if ready and timeout is None and self._inline_ok:
            inline = sig.inline
            if inline is None:
                inline = sig.seconds < self.inline_threshold or self.pool is None
            if inline:
                if ACTIVE or self.watching:
                    if HOOKED or self.hooked:  # instruments: a full task, its events
                        return self._run_inline(Task(sig, fn, args, kwargs, self.rt, inputs))
                    # Recorders only: the lean path, timed, and one span record.
                    return self._inline_recorded(sig, fn, args, kwargs, inputs, values)
                # The hot path of small ops: no task record until the value exists.
                if values is None:
                    values = resolve(args) if inputs else args  # type: ignore[assignment]
                try:
                    if kwargs and inputs:
                        kwargs = _resolve_kwargs(kwargs)
                    n = sig.calls = sig.calls + 1
                    if n > _FIRST_RUNS and n % _SAMPLE:
                        value = fn(*values, **kwargs) if kwargs else fn(*values)  # type: ignore[misc]
                    else:
                        value = self._timed(sig, fn, values, kwargs)
                    check = sig.check
                    if check is not None:
                        spec = sig.spec
                        if type(spec) is tuple or check(spec, value) is not None:
                            sig.check_value(value)
                except BaseException:
                    # Fail it the slow way, with a full task (which re-runs nothing).
                    return self._inline_failed(Task(sig, fn, args, kwargs, self.rt, inputs))
                self.inline_run += 1
                return Task.done(sig, value, self.rt)
        if self.closed:
            raise DataflowError(f"{sig.name}: this runtime is closed; start a new one")
        task = Task(sig, fn, args, kwargs, self.rt, inputs)
        if priority is not None:
            task.priority = priority
        if timeout is not None:
            task.fn = TimedKernel(fn, task, timeout)
        watched = ACTIVE or self.watching
        if watched:
            self.emit("task_created", task)
        if self.pool is None:  # synchronous mode: a forked function or a timed op, run now
            return self._run_now(task)
        protect(task)  # it runs later: the caller may change its arrays meanwhile
        owner = self._owner() if threading.get_ident() == self.host.thread_id else None
        if owner is not None:
            if priority is None:
                task.priority = owner.base
            owner.add(task)
        with GRAPH_LOCK:
            self.inflight += 1
            failed = gs.add(task) if inputs else None
            if failed is not None:
                # An input already failed: this task fails with the same error, unrun.
                self._fail_locked(task, failed.error)
                return task
            if not inputs:
                task.state = READY
            if task.state == READY:
                self.pool.push_locked(task)
        if watched and task.state == READY:
            task.ready = time.perf_counter_ns()
            self.emit("task_ready", task)
        if self.inflight > self._limit:
            self._throttle()
        return task

    def _call(self, task: Task, pool_run: bool = False) -> Any:
        """Run ``task``'s kernel on this thread and return its value (sampling its time).

        ``pool_run``: it runs on a pool thread, so a sampled run also measures whether the
        kernel holds the GIL (module docstring, "the GIL lane").
        """
        fn = task.fn
        assert fn is not None
        if task.inputs:
            args = resolve(task.args)  # type: ignore[arg-type]
            kwargs = _resolve_kwargs(task.kwargs) if task.kwargs else None
        else:
            args = task.args  # type: ignore[assignment]
            kwargs = task.kwargs
        if self.simulate is not None:
            return self.simulate(task)
        sig = task.sig
        n = sig.calls = sig.calls + 1
        if pool_run and self.pool is not None:  # every pool run: they are >= 50 us each
            value = self._measured(sig, fn, args, kwargs)
        elif n > _FIRST_RUNS and n % _SAMPLE:
            value = fn(*args, **kwargs) if kwargs else fn(*args)
        else:
            value = self._timed(sig, fn, args, kwargs)
        if sig.check is not None:
            sig.check_value(value)
        return value

    @staticmethod
    def _timed(
        sig: Signature, fn: Callable[..., Any], args: Any, kwargs: dict[str, Any] | None
    ) -> Any:
        """``fn(*args, **kwargs)``, its time folded into ``sig.seconds`` (running average)."""
        t0 = time.perf_counter()
        value = fn(*args, **kwargs) if kwargs else fn(*args)
        dt = time.perf_counter() - t0
        sig.seconds = dt if not sig.runs else sig.seconds + (dt - sig.seconds) * _EWMA
        sig.runs += 1
        return value

    def _measured(
        self, sig: Signature, fn: Callable[..., Any], args: Any, kwargs: dict[str, Any] | None
    ) -> Any:
        """``_timed`` on a pool thread, also measuring how much other pool work overlapped
        the run (the pool's busy integral): see :func:`note_overlap`."""
        pool = self.pool
        assert pool is not None
        i0 = pool.busy_integral_now()
        t0 = time.perf_counter()
        value = fn(*args, **kwargs) if kwargs else fn(*args)
        t1 = time.perf_counter()
        i1 = pool.busy_integral_now()
        wall = t1 - t0
        sig.seconds = wall if not sig.runs else sig.seconds + (wall - sig.seconds) * _EWMA
        sig.runs += 1
        if sig.runs > _WARM_UP:  # the first runs pay first-call costs
            note_overlap(sig, wall, (i1 - i0) / wall - 1.0)
        return value

    def _inline_recorded(
        self,
        sig: Signature,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        inputs: tuple[Task, ...],
        values: list[Any] | None,
    ) -> Task:
        """The inline hot path of ``submit`` when only recorders observe: the same run, two
        clock reads and one span record (no task record is built before the value exists)."""
        if values is None:
            values = resolve(args) if inputs else args  # type: ignore[assignment]
        start = time.perf_counter_ns()
        try:
            if kwargs and inputs:
                kwargs = _resolve_kwargs(kwargs)
            n = sig.calls = sig.calls + 1
            if n > _FIRST_RUNS and n % _SAMPLE:
                value = fn(*values, **kwargs) if kwargs else fn(*values)  # type: ignore[misc]
            else:
                value = self._timed(sig, fn, values, kwargs)
            check = sig.check
            if check is not None:
                spec = sig.spec
                if type(spec) is tuple or check(spec, value) is not None:
                    sig.check_value(value)
        except BaseException:
            task = Task(sig, fn, args, kwargs, self.rt, inputs)
            self.record(task, start, time.perf_counter_ns(), True)
            return self._inline_failed(task)
        end = time.perf_counter_ns()
        self.inline_run += 1
        task = Task.done(sig, value, self.rt)
        if GENERATION[0] != self._sinks_gen:
            self.sinks()
        # The record Recorder.task would write, built once and appended to every recorder
        # (a deque append each: no Python call per recorder on the hottest path).
        if inputs:
            ins = (inputs[0].id,) if len(inputs) == 1 else tuple([t.id for t in inputs])
        else:
            ins = ()
        native = self._natives.get(get_ident())  # (get_native_id() is a system call)
        if native is None:
            native = self._natives[get_ident()] = get_native_id()
        record = (task.id, sig, ins, native, start, start, end, False)
        for append in self._appends:
            append(record)
        for scope, rec in self._overriding:
            try:
                rec.task(task, start, start, end, False, inputs)
            except BaseException as exc:  # no observer may break a run
                scope.disable(rec, "task", exc)
        if self._windowed:
            self._recorded += 1
            if not self._recorded & 255:
                for rec in self._windowed:
                    rec.trim(end)
        return task

    def _inline_failed(self, task: Task) -> Task:
        """The inline kernel (or its value check) raised: fail a task record with that error."""
        exc = sys.exc_info()[1]
        assert exc is not None
        task.state = RUNNING
        err = task_failed(task.name, task.op, exc)
        with GRAPH_LOCK:
            self.failures.append(err)
            self._fail_locked(task, err, counted=False)
        return task

    def _run_inline(self, task: Task) -> Task:
        """Run a just-created task whose inputs are done, here and now (observed: events and
        a span record; the unobserved hot path is in ``submit``).

        No lock is needed until it ends: until ``submit`` returns its handle, no other thread
        can see the task, so nobody can be waiting on it or depend on it.
        """
        task.state = RUNNING
        self.emit("task_created", task)
        self.emit("task_started", task)
        start = time.perf_counter_ns()
        try:
            value = self._call(task)
        except BaseException as exc:
            self.record(task, start, time.perf_counter_ns(), True)
            err = task_failed(task.name, task.op, exc)
            with GRAPH_LOCK:
                self.failures.append(err)
                self._fail_locked(task, err, counted=False)
            return task
        self.record(task, start, time.perf_counter_ns(), False)
        task.value = value
        self.emit("task_finished", task)
        self.inline_run += 1
        task.state = DONE
        task.fn = task.args = task.kwargs = None
        task.inputs = ()
        return task

    def _run_now(self, task: Task) -> Task:
        """Synchronous mode: run a task with a timeout or a plain fork at once, in order."""
        if not task.inputs or all(t.state == DONE for t in task.inputs):
            with GRAPH_LOCK:
                self.inflight += 1
                self.begin_locked(task)
            self.execute(task, go_on=False)
            return task
        with GRAPH_LOCK:
            self.inflight += 1
            failed = gs.add(task)
            if failed is not None:
                self._fail_locked(task, failed.error)
        return task

    # -- requests: fairness and ownership ------------------------------------------------------

    def _owner(self) -> _Owner | None:
        """The record of the request running on the loop (made on its first deferred task)."""
        current = self.host.current_task()
        if current is None:
            return None
        owner = self._owners.get(current)
        if owner is None:
            owner = self._owners[current] = _Owner(float(_next_id()))
            self.host.on_task_done(current, self._owner_done)
        return owner

    def owner_priority(self) -> float | None:
        """The priority of work the running request dispatches (its age), or None."""
        if threading.get_ident() != self.host.thread_id:
            return None
        owner = self._owner()
        return None if owner is None else owner.base

    def adopt(self, tasks: list[Task]) -> _Owner | None:
        """Tasks made elsewhere for the running request (a plan's nodes) belong to it too."""
        owner = self._owner() if threading.get_ident() == self.host.thread_id else None
        if owner is not None:
            for t in tasks:
                owner.add(t)
        return owner

    def _owner_done(self, current: Any, cancelled: bool) -> None:
        owner = self._owners.pop(current, None)
        if owner is not None and cancelled:
            # The cancelled coroutine's frames live on in its CancelledError's traceback,
            # holding its local variables (handles it never passed on). Release them, so a
            # handle still alive is one that someone else holds.
            self.host.release_frames(current)
            self.drop(owner)

    def drop(self, owner: _Owner) -> int:
        """A request was cancelled: drop what it dispatched that nobody else needs.

        Goes backwards through its tasks (dependents come after what they read), so a task
        whose only dependents were dropped is dropped too. Returns how many were dropped.
        """
        with GRAPH_LOCK:
            owner.dropped = True
            dropped = self.drop_locked_tasks(owner.tasks())
            owner.refs = []
        return dropped

    def drop_locked_tasks(self, tasks: list[Task]) -> int:
        """Drop the tasks of ``tasks`` that have not started and that nobody else needs,
        last first (see :meth:`drop`). Holds the lock; returns how many were dropped."""
        dropped = 0
        for t in reversed(tasks):
            if t.state > READY:
                continue
            waiters = t.waiters
            if waiters and any(not _done(w) for w in waiters):
                continue  # a live coroutine awaits it
            handles = t.handles
            if handles and any(h() is not None for h in handles):
                continue  # someone holds a handle on it
            deps = t.dependents
            if deps and any(d.state < DONE for d in deps):
                continue  # someone else's unfinished task reads it
            err = CancelledTaskError(
                f"{t.name} was dropped unrun: the request that dispatched it was cancelled "
                "and nothing else was waiting for its value"
            )
            t.runtime._sched._fail_locked(t, err)  # type: ignore[union-attr]
            dropped += 1
        if dropped:
            self.dropped += dropped
        return dropped

    def execute_now(self, task: Task) -> None:
        """Synchronous mode: run a READY task here and now."""
        with GRAPH_LOCK:
            self.begin_locked(task)
        self.execute(task, go_on=False)

    # -- running on the pool -----------------------------------------------------------------

    def begin_locked(self, task: Task) -> None:
        """``task`` starts running on some thread (state and counts). Holds the lock."""
        task.state = RUNNING
        self.running += 1
        if self.running > self.peak_running:
            self.peak_running = self.running
        if self.pool is not None:
            self.pool.busy_locked(1)

    def _end_locked(self) -> None:
        """A task that was running ended (its state already set). Holds the lock."""
        self.running -= 1
        if self.pool is not None:
            self.pool.busy_locked(-1)

    def start_locked(self, task: Task, pool: InteropPool) -> bool:
        """A worker of ``pool`` (or a helper) takes a READY task: RUNNING, or to the GIL lane.

        A serial (GIL-bound) task starts only if the pool's lane is free, and then holds it;
        otherwise it waits in the lane's queue (False). Every 256th run of a serial signature
        is a probe that skips the lane and measures again (module docstring). Holds the lock.
        """
        sig = task.sig
        if sig.serial and (sig.calls + 1) % _PROBE:
            if pool.lane_task is None:
                pool.lane_task = task
            else:
                heapq.heappush(pool.lane_queue, (task.priority, task.id, task))
                return False
        self.begin_locked(task)
        return True

    def _lane_after_locked(self, task: Task, here: InteropPool | None) -> Task | None:
        """``task`` ended: if it held its pool's GIL lane, pass the lane on. Holds the lock.

        On a thread of that pool the next waiting task is returned to run here, next; from
        any other thread the waiting tasks go back to the pool's queue.
        """
        pool = self.pool
        if pool is None or pool.lane_task is not task:
            return None
        queue = pool.lane_queue
        while queue:
            nxt = heapq.heappop(queue)[2]
            if nxt.state != READY:
                continue
            if here is not pool:
                pool.lane_task = None
                pool.push_locked(nxt)
                while queue:
                    pool.push_locked(heapq.heappop(queue)[2])
                return None
            pool.lane_task = nxt
            nxt.runtime._sched.begin_locked(nxt)  # type: ignore[union-attr]
            return nxt
        pool.lane_task = None
        return None

    def execute(self, task: Task, go_on: bool = True) -> None:
        """Run a RUNNING task's kernel here, publish it, and go on with what it made ready.

        ``go_on``: after the task, run the small dependents it made ready and the first big
        one on this thread (queue the rest); otherwise queue them all (the event loop's thread
        helping an awaiting coroutine must return to it).
        """
        local: deque[Task] | None = None
        here = current_pool()
        while True:
            sched = task.runtime._sched  # type: ignore[union-attr]
            mine = sched._execute_one(task, go_on, here)
            if mine is not None:
                if local is None:
                    local = deque(mine)
                else:
                    local.extend(mine)
            if not local:
                return
            task = local.popleft()

    def _execute_one(self, task: Task, go_on: bool, here: InteropPool | None) -> list[Task] | None:
        """Run one RUNNING task; returns the tasks this thread runs next (or None)."""
        if self.cancelling:
            thaw(task)
            cancelled = CancelledTaskError(f"{task.name} was not run: its runtime was closing")
            with GRAPH_LOCK:
                self._fail_locked(task, cancelled)
                nxt = self._lane_after_locked(task, here)
            return None if nxt is None else [nxt]
        watched = ACTIVE or self.watching
        if watched:
            self.emit("task_started", task)
            start = time.perf_counter_ns()
        _running.task = task
        try:
            value = self._call(task, here is not None)
        except BaseException as exc:
            _running.task = None
            thaw(task)
            if watched:
                self.record(task, start, time.perf_counter_ns(), True)
            err = task_failed(task.name, task.op, exc)
            with GRAPH_LOCK:
                if task.state == RUNNING:  # else it timed out while it ran: dropped
                    self.failures.append(err)
                    self._fail_locked(task, err)
                nxt = self._lane_after_locked(task, here)
            return None if nxt is None else [nxt]
        _running.task = None
        thaw(task)
        if watched:
            # Before the dependents are made ready, so events stay in causal order. The value
            # is readable by the instrument (its state is not DONE yet: nobody else reads it).
            end = time.perf_counter_ns()
            self.record(task, start, end, False)
            task.value = value
            self.emit("task_finished", task)
        mine = None
        with GRAPH_LOCK:
            nxt = self._lane_after_locked(task, here)
            if task.state != RUNNING:  # timed out while it ran: the result is dropped
                return None if nxt is None else [nxt]
            waiters = task.waiters
            task.waiters = None
            ready = gs.finish(task, value)
            self.inflight -= 1
            self._end_locked()
            self.tasks_run += 1
            if waiters is not None:
                self.host.wake(waiters)
            if self.inflight == 0 and self._drained is not None:
                self.host.wake([self._drained])
                self._drained = None
            if nxt is not None:
                mine = [nxt]
            if ready is not None:
                more = self._place_ready_locked(ready, go_on and here is not None, here)
                if more is not None:
                    if mine is None:
                        mine = more
                    else:
                        mine.extend(more)
        if watched and ready is not None:
            for d in ready:
                d.ready = end
                self.emit("task_ready", d)
        return mine

    @staticmethod
    def _place_ready_locked(
        ready: list[Task], go_on: bool, here: InteropPool | None
    ) -> list[Task] | None:
        """Decide where newly ready tasks run: on this thread next, or queued (module doc).

        ``here`` is the pool the current thread works for: a big task goes on here only if
        it belongs to that pool (so a private pool's size still bounds its runtime), and a
        GIL-bound one only through that pool's lane.
        """
        mine: list[Task] | None = None
        big_taken = False
        for d in ready:
            sched = d.runtime._sched  # type: ignore[union-attr]
            pool = sched.pool
            if pool is None:  # synchronous mode: run it now, here
                sched.begin_locked(d)
                if mine is None:
                    mine = [d]
                else:
                    mine.append(d)
                continue
            if go_on and type(d.fn) is not TimedKernel:
                inline = d.sig.inline
                small = (
                    d.sig.seconds < sched.inline_threshold if inline is None else inline
                ) and sched._inline_ok
                if small or (not big_taken and pool is here):
                    if not small:
                        big_taken = True
                        if not sched.start_locked(d, pool):
                            continue  # it waits for the GIL lane
                    else:
                        sched.begin_locked(d)
                    if mine is None:
                        mine = [d]
                    else:
                        mine.append(d)
                    continue
            pool.push_locked(d)
        return mine

    # -- failures ------------------------------------------------------------------------------

    def _fail_locked(self, task: Task, err: BaseException | None, counted: bool = True) -> None:
        """Fail ``task`` and, transitively, every task waiting on it. Holds the lock.

        A dependent may belong to another runtime (nested runtimes, or runtimes in two
        threads): each task is accounted to, and its waiters woken through, its own runtime.
        ``counted``: ``task`` was counted in flight (an inline task is not).
        """
        was_running = task.state == RUNNING
        owners: list[Scheduler] = []
        for t in gs.fail(task, err):
            if t.frozen is not None and not (t is task and was_running):
                thaw(t)  # it never runs (a running kernel thaws its own when it returns)
            sched = t.runtime._sched  # type: ignore[union-attr]
            if counted or t is not task:
                sched.inflight -= 1
                if t is task and was_running:
                    sched._end_locked()
                if sched not in owners:
                    owners.append(sched)
            waiters = t.waiters
            if waiters is not None:
                t.waiters = None
                sched.host.wake(waiters)
            if ACTIVE or sched.watching:
                cancelled = t.state == CANCELLED
                if not (t is task and was_running):  # (a kernel that ran records its span)
                    sched.record_unrun(cancelled)
                sched.emit("task_cancelled" if cancelled else "task_failed", t)
        for sched in owners:
            if sched.inflight == 0 and sched._drained is not None:
                sched.host.wake([sched._drained])
                sched._drained = None

    def cancel(self, task: Task) -> bool:
        """Cancel a task that has not started; its dependents fail with CancelledTaskError."""
        with GRAPH_LOCK:
            if task.state not in (PENDING, READY):
                return False
            self._fail_locked(task, CancelledTaskError(f"{task.name} was cancelled before it ran"))
        return True

    def cancel_everything(self) -> None:
        """The body failed: queued kernels are dropped unrun (running ones finish)."""
        self.cancelling = True
        self._inline_ok = False

    # -- waiting -------------------------------------------------------------------------------

    def completion(self, task: Task) -> Any:
        """An awaitable that completes when ``task`` is done (``await handle``).

        A small task that is queued and not started is run right here instead (module doc).
        """
        host = self.host
        if threading.get_ident() != host.thread_id:
            raise DataflowError(
                f"{task.name} belongs to a runtime on another event loop; await it there "
                "(pending values cannot move between event loops or threads)"
            )
        if task.state == READY and type(task.fn) is not TimedKernel and self.pool is not None:
            inline = task.sig.inline
            if (task.sig.seconds < self.inline_threshold if inline is None else inline) and (
                self._inline_ok
            ):
                with GRAPH_LOCK:
                    take = task.state == READY
                    if take:
                        self.begin_locked(task)
                if take:
                    self.execute(task, go_on=False)
        return self.waiter(task)

    def waiter(self, task: Task) -> Any:
        """An awaitable that completes when ``task`` is done (nothing is run to help)."""
        host = self.host
        if task.state >= DONE:
            return host.done_waiter()
        waiter = host.waiter()
        with GRAPH_LOCK:
            if task.state >= DONE:
                return host.done_waiter()
            if task.waiters is None:
                task.waiters = [waiter]
            else:
                task.waiters.append(waiter)
        return waiter

    async def join(self) -> None:
        """Wait until every task submitted here has finished."""
        while True:
            with GRAPH_LOCK:
                if self.inflight == 0:
                    return
                waiter = self._drained = self.host.waiter()
            await waiter

    def close(self) -> None:
        """Stop taking tasks; stop the watchdog."""
        self.closed = True
        self._inline_ok = False
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None

    # -- timeouts ------------------------------------------------------------------------------

    def watchdog_arm(self, task: Task, seconds: float) -> list[Any]:
        """Start ``task``'s deadline (called by its TimedKernel on the thread running it)."""
        wd = self._watchdog
        if wd is None:
            with GRAPH_LOCK:
                wd = self._watchdog
                if wd is None:
                    name = f"dataflow-watchdog-{id(self) & 0xFFFF:x}"
                    wd = self._watchdog = Watchdog(self._timed_out, name)
        return wd.arm(task, seconds)

    def _timed_out(self, task: Task, seconds: float, thread: threading.Thread) -> None:
        """``task``'s kernel outlived its timeout: fail it and its dependents (watchdog thread)."""
        with GRAPH_LOCK:
            if task.state != RUNNING:
                return  # it finished in the meantime
            err = OpTimeoutError(
                f"{task.name} timed out: its kernel ran longer than the {seconds:g} s timeout "
                f"of op {task.op!r}. A running kernel cannot be interrupted: its thread is "
                "left to finish in the background (the pool starts a replacement) and its "
                "result will be discarded. Raise the timeout (dataflow.op(..., timeout=) or "
                "Runtime(op_timeout=)) if the op is just slow, or find out why it hangs.",
                task=task.name,
                op=task.op,
            )
            self.failures.append(err)
            self._fail_locked(task, err)
            if self.pool is not None:
                self.pool.abandon_locked(thread)
                # The stuck kernel may hold the GIL lane: hand it on from here.
                self._lane_after_locked(task, None)

    # -- backpressure --------------------------------------------------------------------------

    def _throttle(self) -> None:
        """Over ``max_pending``: help run queued tasks until 10% under it (module docstring)."""
        if getattr(_helping, "active", False):
            return  # a task this thread runs as a helper dispatches: let it through
        _helping.active = True
        on_loop = threading.get_ident() == self.host.thread_id
        pool = self.pool
        assert pool is not None
        if not on_loop:
            with GRAPH_LOCK:
                self._blocked += 1
        try:
            while True:
                # Ctrl-C cancels the task that is dispatching (asyncio.Runner's handler runs
                # between any two bytecodes): stop here, as it would at its next await.
                if on_loop and self.host.cancel_requested():
                    self.host.raise_cancelled()
                    return
                with GRAPH_LOCK:
                    if self.inflight <= self._low_water or self.cancelling or self.closed:
                        return
                    task = pool.take_locked(TimedKernel)
                    # Waiting is only useful while a kernel runs that is not itself a
                    # dispatcher held back here (such as a plain fork dispatching ops).
                    stuck = task is None and self.running <= self._blocked
                if task is not None:
                    task.runtime._sched.execute(task)  # type: ignore[union-attr]
                    continue
                if stuck:
                    return
                time.sleep(0.0005)
        finally:
            _helping.active = False
            if not on_loop:
                with GRAPH_LOCK:
                    self._blocked -= 1
