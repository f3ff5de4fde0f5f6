"""The runtime: binds an event loop to an inter-op pool and owns every task it starts.

Scheduling policy (the contract the rest of the library relies on):

* **Dispatch returns at once.** Calling an op (or forking a plain function) creates a
  :class:`~dataflow._task.Task` and returns a pending handle. If every input is done and the
  op's estimated time is under the inline threshold, the kernel runs right there on the calling
  thread (a hand-off to a worker would cost more than the work); otherwise the task is queued,
  or parked until its inputs are done.
* **Workers continue the graph themselves.** A worker that finishes a kernel marks dependents
  whose inputs are now all done as ready and pops the next task, all under the pool's lock, so
  a chain of ops never bounces through the event loop. The loop is only woken (in a batch) for
  coroutines awaiting a value.
* **Ready order: critical path first.** Among ready tasks, the one that starts the longest
  chain of known remaining work runs first. Each task's *height* (its estimated time from the
  cost rule plus the largest height of its dependents) is raised, as dependents are dispatched,
  through the unfinished tasks they wait for (a bounded walk). Ties go to issue order, or to
  the static longest-path rank a captured graph run passes as ``priority``.
* **Failures propagate, never hang.** A kernel that raises fails its task with a
  :class:`~dataflow.TaskError` chained to the original exception, and every task that depends
  on it fails with that same error; independent tasks are not affected. A failure that nobody
  observed is raised (or logged, if the body already raised) when the runtime closes.
* **Everything is owned.** Forked coroutines are tracked; closing the runtime waits for them
  and for the graph to drain. If the body raised or was cancelled, forked tasks are cancelled
  and queued kernels are dropped without running (a running kernel cannot be interrupted and
  is allowed to finish). The pool's threads are joined when the last runtime using it closes.
* **Timeouts.** An op with a timeout (``dataflow.op(timeout=)``, ``Runtime(op_timeout=)``)
  always runs on the pool; if its kernel outlives the timeout, a watchdog thread fails the
  task and its dependents with :class:`~dataflow.OpTimeoutError`, the stuck worker is replaced,
  and the kernel's late outcome is discarded (see ``_timeout``).
* **Backpressure.** Dispatch is synchronous, so the dispatcher is slowed down where it
  dispatches: past ``max_pending`` tasks in flight, ``submit`` makes the calling thread help,
  running queued tasks itself (never one with a timeout), until the count is 10% under the
  limit; with nothing to run it waits for the pool, unless all that is in flight waits on
  dispatching threads themselves (then it lets the dispatch through rather than deadlock).
  On the loop thread, a cancelled dispatching task stops at its next op (CancelledError).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ._errors import (
    CancelledTaskError,
    DataflowError,
    NoRuntimeError,
    OpTimeoutError,
    TaskError,
    task_failed,
)
from ._instrument import ACTIVE, emit
from ._pool import (
    InteropPool,
    acquire_shared_pool,
    on_shared_pool_thread,
    release_shared_pool,
)
from ._task import CANCELLED, DONE, FAILED, PENDING, READY, RUNNING, Cost, Pending, Task
from ._threads import _check_count, default_interop_threads
from ._timeout import TimedKernel, Watchdog, check_timeout

__all__ = [
    "Runtime",
    "current_runtime",
    "estimate_seconds",
    "get_runtime",
    "loop_runtime",
    "resolve_loop_factory",
    "set_inline_threshold",
]

_current: contextvars.ContextVar[Runtime | None] = contextvars.ContextVar(
    "dataflow_runtime", default=None
)

#: Tasks in flight (queued, waiting or running) past which dispatch is held back.
DEFAULT_MAX_PENDING = 100_000
# Set on a thread while it helps run tasks for backpressure (helping never nests).
_helping = threading.local()

# Rates used to turn an op's Cost into seconds for the inline decision. Deliberately
# conservative (small numpy ops run far below peak), so only really small ops run inline.
FLOP_RATE = 2e10
BYTE_RATE = 1e10
_inline_threshold = 20e-6
# How far up a new task's height is propagated through unfinished tasks (see _raise_heights).
_HEIGHT_DEPTH = 16


def set_inline_threshold(seconds: float) -> None:
    """Ops estimated to take less than this run inline on the calling thread (default 20 us).

    The estimate is ``flops / 2e10 + bytes / 1e10`` from the op's cost rule. 0 sends every op
    to the pool; a large value runs everything inline (sequentially, on the loop thread).
    """
    global _inline_threshold
    if not seconds >= 0:
        raise ValueError(f"set_inline_threshold(seconds): must be >= 0, got {seconds!r}")
    _inline_threshold = float(seconds)


def get_inline_threshold() -> float:
    """The inline threshold in seconds (see :func:`set_inline_threshold`)."""
    return _inline_threshold


def estimate_seconds(cost: Cost | None) -> float:
    """The time the scheduler assumes an op with this cost takes (0 without a cost rule)."""
    if cost is None:
        return 0.0
    return cost.flops / FLOP_RATE + cost.bytes / BYTE_RATE


# The runtimes open on each event loop, oldest first. Code on the loop that did not inherit the
# context a Runtime was entered in (the handler tasks of a server started elsewhere) still
# finds the loop's runtime through this; the context variable wins where it is set.
_by_loop: dict[asyncio.AbstractEventLoop, list[Runtime]] = {}


def loop_runtime() -> Runtime | None:
    """The oldest runtime open on the running event loop, if any (None off the loop)."""
    loop = asyncio._get_running_loop()
    if loop is None:
        return None
    rts = _by_loop.get(loop)
    return rts[0] if rts else None


def current_runtime() -> Runtime | None:
    """The runtime of the calling context, or None outside of one.

    That is the innermost ``Runtime`` entered in this context (inherited by the tasks and
    threads it starts) or, failing that, the oldest one open on the running event loop.
    """
    return _current.get() or loop_runtime()


def get_runtime(what: str) -> Runtime:
    """The current runtime, or a NoRuntimeError that says how to start one."""
    rt = _current.get() or loop_runtime()
    if rt is None:
        raise NoRuntimeError(
            f"{what} needs a running dataflow runtime. Start one with "
            "`dataflow.run(main)` in a script, or `async with dataflow.Runtime(): ...` "
            "inside an application whose event loop is already running."
        )
    return rt


def resolve_loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event-loop factory for ``loop`` = "auto" | "asyncio" | "uvloop" (None: asyncio's)."""
    if loop == "auto":
        # The CLI's --loop (and users) can set the process default through the environment.
        loop = os.environ.get("DATAFLOW_LOOP", "auto") or "auto"
    if loop == "asyncio":
        return None
    if loop not in ("auto", "uvloop"):
        raise ValueError(
            f"loop must be 'auto', 'asyncio' or 'uvloop' (also in $DATAFLOW_LOOP), got {loop!r}"
        )
    try:
        import uvloop
    except ImportError:
        if loop == "uvloop":
            raise DataflowError(
                "loop='uvloop' was asked for but uvloop is not installed: "
                "`pip install uvloop` (not available on Windows), or use loop='asyncio'"
            ) from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


# The Dask scheduler address `dataflow run --dask ADDRESS` sets for the script's runtimes.
DASK_ADDRESS_ENV = "DATAFLOW_DASK_ADDRESS"


def _backend(kwargs: dict[str, Any]) -> str:
    """The backend ``Runtime(**kwargs)`` asks for: "local" or "dask" (see Runtime)."""
    backend = kwargs.get("backend")
    if backend is None:
        if kwargs.get("address") is not None or kwargs.get("client") is not None:
            return "dask"
        # `dataflow run --dask ADDRESS` makes Dask the process default this way.
        return "dask" if os.environ.get(DASK_ADDRESS_ENV) else "local"
    if backend not in ("local", "dask"):
        raise ValueError(f"Runtime(backend=...) must be 'local' or 'dask', got {backend!r}")
    return str(backend)


def _collect(value: Any, out: list[Task]) -> None:
    """Append the task of every pending handle in ``value`` (lists, tuples, dicts nest)."""
    if isinstance(value, Pending):
        out.append(value._task)
    elif type(value) in (list, tuple):
        for v in value:
            _collect(v, out)
    elif type(value) is dict:
        for v in value.values():
            _collect(v, out)


def _resolve(value: Any) -> Any:
    """``value`` with every pending handle replaced by its (ready) value."""
    if isinstance(value, Pending):
        return value.result()
    t = type(value)
    if t is list:
        return [_resolve(v) for v in value]
    if t is tuple:
        return tuple(_resolve(v) for v in value)
    if t is dict:
        return {k: _resolve(v) for k, v in value.items()}
    return value


class Runtime:
    """Binds the running event loop to an inter-op pool; owns every task started inside.

    Use ``dataflow.run(main)`` in scripts; use this class directly to embed dataflow in an
    application whose loop is already running (a web server)::

        async with dataflow.Runtime(interop_threads=4):
            fut = dataflow.fork(model, x)
            y = await fut

    Args:
        interop_threads: size of the inter-op pool; default :func:`get_num_interop_threads`.
        intraop_threads: BLAS threads inside each op, applied process-wide while the runtime
            is open and restored when it closes; default: leave BLAS as it is.
        private_pool: give this runtime a pool of its own instead of the process's shared one.
        simulate: for scheduling studies: ``simulate(task)`` replaces every graph task's kernel
            (e.g. a GIL-free ``time.sleep`` of the op's estimated time, see
            :func:`estimate_seconds`) and its return value stands for the result.
        max_pending: tasks in flight (queued, waiting for inputs or running) past which the
            dispatching thread is held back and helps run queued tasks (docs/hardening.md);
            default 100,000, about 100 MB of small tasks; None for no limit.
        op_timeout: the timeout in seconds of every op without one of its own
            (``dataflow.op(timeout=)``); default None, no timeout. A kernel past it fails its
            task with :class:`~dataflow.OpTimeoutError`; it cannot be interrupted, so it runs
            on (its thread replaced in the pool) and its late result is discarded.
        backend: ``"local"`` (this process's pool) or ``"dask"`` (ops run on a Dask cluster;
            needs ``pip install -e '.[dask]'``; see docs/dask.md). Default: ``"dask"`` when
            ``address``/``client`` is given or ``$DATAFLOW_DASK_ADDRESS`` is set (as
            ``dataflow run --dask ADDRESS`` does), else ``"local"``.
        address, client, **options: the Dask backend's scheduler address or asynchronous
            ``distributed.Client``, and its options (``local_threshold``, ``scatter_bytes``,
            ``connect_timeout``); see :class:`dataflow._dask.DaskRuntime`.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Runtime:
        # Runtime(backend="dask") is a DaskRuntime: the local hot path stays free of checks.
        if cls is Runtime and _backend(kwargs) == "dask":
            from ._dask import DaskRuntime

            return object.__new__(DaskRuntime)
        return object.__new__(cls)

    def __init__(
        self,
        *,
        interop_threads: int | None = None,
        intraop_threads: int | None = None,
        private_pool: bool = False,
        simulate: Callable[[Task], Any] | None = None,
        backend: str | None = None,
        address: Any = None,
        client: Any = None,
        max_pending: int | None = DEFAULT_MAX_PENDING,
        op_timeout: float | None = None,
        **options: Any,
    ) -> None:
        if address is not None or client is not None or options:
            given = ", ".join(
                [n for n, v in (("address", address), ("client", client)) if v is not None]
                + sorted(options)
            )
            raise TypeError(
                f"Runtime(): {given} are options of the Dask backend; the local backend "
                "takes interop_threads, intraop_threads, private_pool, simulate, max_pending "
                "and op_timeout"
            )
        self.simulate = simulate
        self.interop_threads = (
            default_interop_threads()
            if interop_threads is None
            else _check_count(interop_threads, "interop_threads")
        )
        self.intraop_threads = (
            None if intraop_threads is None else _check_count(intraop_threads, "intraop_threads")
        )
        self.private_pool = private_pool
        if max_pending is not None and (
            isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1
        ):
            raise ValueError(f"max_pending must be a positive int or None, got {max_pending!r}")
        self.max_pending = max_pending
        limit = sys.maxsize if max_pending is None else max_pending
        self._pending_limit = limit
        self._low_water = limit - limit // 10
        self._blocked = 0  # threads other than the loop's held back in _throttle
        self.op_timeout = check_timeout(op_timeout, "op_timeout")
        self._watchdog: Watchdog | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._pool: InteropPool | None = None
        self._lock: threading.Lock = threading.Lock()  # replaced by the pool's lock on entry
        self._loop_tid = 0
        self._token: contextvars.Token[Runtime | None] | None = None
        self._limits: Any = None
        self._closed = False
        self._cancelling = False
        # Graph tasks submitted and not finished; forked coroutines not finished.
        self._inflight = 0
        self._forks: set[asyncio.Task[Any]] = set()
        self._failures: list[BaseException] = []
        # Wake-ups posted from worker threads, flushed on the loop in batches.
        self._wakeups: list[asyncio.Future[None]] = []
        self._wake_posted = False
        self._drained: asyncio.Future[None] | None = None
        # Counters (read by tests and repr): kernels running in the pool now and at peak.
        self.running = 0
        self.peak_running = 0
        self.tasks_run = 0

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self.loop else "new")
        queued = self._pool.queued if self._pool else 0
        return (
            f"<Runtime {state} interop={self.interop_threads} "
            f"intraop={self.intraop_threads or 'default'} running={self.running} "
            f"inflight={self._inflight} queued={queued} forks={len(self._forks)}>"
        )

    # -- lifetime -------------------------------------------------------------------------

    async def __aenter__(self) -> Runtime:
        if self.loop is not None:
            raise DataflowError("a Runtime can be entered only once; create a new one")
        if not self.private_pool and on_shared_pool_thread():
            raise DataflowError(
                "a Runtime cannot run on an inter-op pool thread (inside a kernel or a forked "
                "plain function, e.g. dataflow.run() there): it would wait for the pool it is "
                "running on. Make the function `async def` and fork it (it runs on the event "
                "loop and can await ops), or give this Runtime private_pool=True."
            )
        self.loop = asyncio.get_running_loop()
        self._loop_tid = threading.get_ident()
        if self.private_pool:
            self._pool = InteropPool(self.interop_threads, name=f"interop-p{id(self) & 0xFFFF:x}")
        else:
            self._pool = acquire_shared_pool(self.interop_threads)
        self._lock = self._pool.lock
        if self.intraop_threads is not None:
            from threadpoolctl import threadpool_limits

            self._limits = threadpool_limits(limits=self.intraop_threads, user_api="blas")
        self._token = _current.set(self)
        _by_loop.setdefault(self.loop, []).append(self)
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        import anyio

        try:
            if exc_type is not None:
                self._cancel_everything()
            # The clean-up must finish even if the surrounding scope is being cancelled:
            # running kernels cannot be interrupted, and their threads must be joined.
            with anyio.CancelScope(shield=True):
                await self._join()
        finally:
            self._close()
        unobserved = [e for e in self._failures if not getattr(e, "observed", True)]
        if not unobserved:
            return
        if exc_type is None:
            err = _unobserved_error(unobserved)
            raise err from unobserved[0]
        from ._log import logger

        # A broken log consumer must not replace the body's own error.
        with contextlib.suppress(Exception):
            for e in unobserved:
                logger.error("task failed and was never awaited", error=repr(e), exc_info=e)

    def _cancel_everything(self) -> None:
        self._cancelling = True
        for t in list(self._forks):
            t.cancel()

    async def _join(self) -> None:
        while True:
            if self._forks:
                await asyncio.wait(set(self._forks))
                continue
            with self._lock:
                if self._inflight == 0:
                    break
                self._drained = self.loop.create_future()  # type: ignore[union-attr]
            await self._drained
            self._drained = None

    def _close(self) -> None:
        self._closed = True
        rts = _by_loop.get(self.loop)  # type: ignore[arg-type]
        if rts is not None and self in rts:
            rts.remove(self)
            if not rts:
                del _by_loop[self.loop]  # type: ignore[arg-type]
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None
        if self._token is not None:
            try:
                _current.reset(self._token)
            except ValueError:  # exited in another context than entered; nothing to reset
                _current.set(None)
            self._token = None
        if self._limits is not None:
            self._limits.restore_original_limits()
            self._limits = None
        if self._pool is not None:
            if self.private_pool:
                self._pool.close()
            else:
                release_shared_pool()

    # -- dispatch (the hot path) -------------------------------------------------------------

    def submit(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        op: str,
        spec: Any = None,
        cost: Cost | None = None,
        inline: bool | None = None,
        ctx: contextvars.Context | None = None,
        priority: float | None = None,
        timeout: float | None = None,
    ) -> Task:
        """Add a task to the graph; run it inline, queue it, or park it on its inputs.

        ``priority`` orders it among ready tasks (smaller first; default: its issue order).
        ``timeout`` (seconds) bounds its kernel's run time; such a task never runs inline.
        """
        if self._closed:
            raise DataflowError(f"{op}: this runtime is closed; start a new one")
        task = Task(fn, args, kwargs, op, self, spec, cost, ctx)
        if priority is not None:
            task.priority = priority
        inputs: list[Task] = []
        for a in args:
            if isinstance(a, Pending):
                inputs.append(a._task)
            elif type(a) is list or type(a) is tuple or type(a) is dict:
                _collect(a, inputs)
        if kwargs:
            for a in kwargs.values():
                _collect(a, inputs)
        if inputs:
            task.inputs = tuple(inputs)
        if ACTIVE:
            emit("task_created", task)
        if cost is not None:
            task.est = task.height = cost.flops / FLOP_RATE + cost.bytes / BYTE_RATE
            if inline is None:
                inline = task.est < _inline_threshold
        elif inline is None:
            inline = False
        if timeout is not None:
            task.fn = TimedKernel(fn, task, timeout)
            inline = False
        waiting = [t for t in inputs if t.state != DONE] if inputs else inputs
        if inline and not waiting and not self._cancelling and self.simulate is None:
            self._run_inline(task)
            return task
        with self._lock:
            self._inflight += 1
            n = 0
            failed: Task | None = None
            for t in waiting:
                st = t.state
                if st < DONE:
                    if t.dependents is None:
                        t.dependents = [task]
                    else:
                        t.dependents.append(task)
                    n += 1
                elif st != DONE and failed is None:
                    failed = t
            task.waiting = n
            if n and priority is None:
                self._raise_heights(task)
            if failed is not None:
                # An input already failed: this task fails with the same error, unrun.
                self._fail_locked(task, failed.error)
                return task
            if n == 0:
                task.state = READY
                self._pool.push_locked(task)  # type: ignore[union-attr]
        if ACTIVE and task.state == READY:
            emit("task_ready", task)
        if self._inflight > self._pending_limit:
            self._throttle()
        return task

    def _raise_heights(self, task: Task) -> None:
        """Propagate a new task's height to the unfinished tasks it waits for. Holds the lock.

        A task's height is its estimated time plus the largest height among its dependents:
        the longest chain of known work it starts. The walk stops at tasks already running or
        done, at heights that do not grow, and after a bounded depth (a chain dispatched step
        by step would otherwise cost quadratic time); queued tasks that grow are re-queued.
        """
        stack = [(t, task.height, 0) for t in task.inputs if t.state <= READY]
        while stack:
            t, below, depth = stack.pop()
            h = t.est + below
            if h <= t.height or t.state > READY:
                continue
            t.height = h
            if t.state == READY:
                self._pool.push_locked(t)  # type: ignore[union-attr]
            elif depth < _HEIGHT_DEPTH:
                stack.extend((i, h, depth + 1) for i in t.inputs if i.state <= READY)

    def _run_inline(self, task: Task) -> None:
        """Run a just-created task whose inputs are done, on this thread.

        No lock is needed: until ``submit`` returns its handle, no other thread can see the
        task, so nobody can be waiting on it or depend on it.
        """
        task.state = RUNNING
        fn = task.fn
        assert fn is not None
        traced = bool(ACTIVE)
        if traced:
            emit("task_started", task)
        try:
            if task.inputs:
                value = fn(*_resolve(task.args), **(_resolve(task.kwargs) or {}))
            elif task.kwargs:
                value = fn(*task.args, **task.kwargs)  # type: ignore[misc]
            else:
                value = fn(*task.args)  # type: ignore[misc]
        except BaseException as exc:
            err = task_failed(task.name, task.op, exc)
            with self._lock:
                self._failures.append(err)
                self._fail_locked(task, err, counted=False)
            return
        task.value = value
        if traced:
            emit("task_finished", task)
        task.state = DONE
        task.fn = task.args = task.kwargs = None
        task.inputs = ()

    def execute(self, task: Task, counted: bool = True) -> None:
        """Run a RUNNING task's kernel on this thread and publish the outcome."""
        if self._cancelling and counted:
            self._cancel_running(task)
            return
        if ACTIVE:
            emit("task_started", task)
        fn = task.fn
        assert fn is not None
        try:
            if task.inputs:
                args = _resolve(task.args)
                kwargs = _resolve(task.kwargs)
            else:
                args = task.args
                kwargs = task.kwargs
            if self.simulate is not None:
                value = self.simulate(task)
            elif task.ctx is not None:
                value = task.ctx.run(fn, *args, **(kwargs or {}))
            elif kwargs:
                value = fn(*args, **kwargs)
            else:
                value = fn(*args)
        except BaseException as exc:
            err = task_failed(task.name, task.op, exc)
            with self._lock:
                if task.state != RUNNING:  # timed out while it ran: the outcome is dropped
                    return
                self._failures.append(err)
                self._fail_locked(task, err, counted)
            return
        task.value = value  # read by others only once the state is DONE
        if ACTIVE:
            # Before the dependents are made ready, so events stay in causal order.
            emit("task_finished", task)
        with self._lock:
            if task.state != RUNNING:  # timed out while it ran: the result is dropped
                return
            task.state = DONE
            task.fn = task.args = task.kwargs = None
            task.inputs = ()
            self.tasks_run += 1
            if counted:
                self._inflight -= 1
                self.running -= 1
            deps = task.dependents
            if deps is not None:
                task.dependents = None
                _ready_dependents_locked(deps)
            if task.waiters is not None:
                self._wake_locked(task.waiters)
                task.waiters = None
            if self._inflight == 0 and self._drained is not None:
                self._wake_locked([self._drained])

    def _fail_locked(self, task: Task, err: BaseException | None, counted: bool = True) -> None:
        """Fail ``task`` and, transitively, every task waiting on it. Holds the lock.

        A dependent may belong to another runtime (nested runtimes, or runtimes in two
        threads): each task is accounted to, and its waiters woken through, its own runtime.
        """
        stack = [task]
        first = True
        owners: list[Runtime] = []
        while stack:
            t = stack.pop()
            if t.state >= DONE:
                continue
            rt = t.runtime
            assert rt is not None  # only runtime tasks are ever unfinished
            was_running = t.state == RUNNING
            t.state = CANCELLED if isinstance(err, CancelledTaskError) else FAILED
            t.error = err
            t.fn = t.args = t.kwargs = None
            t.inputs = ()
            if counted or not first:
                rt._inflight -= 1
                if was_running and counted:
                    rt.running -= 1
                if rt not in owners:
                    owners.append(rt)
            first = False
            if t.waiters is not None:
                rt._wake_locked(t.waiters)
                t.waiters = None
            if t.dependents is not None:
                stack.extend(t.dependents)
                t.dependents = None
            if ACTIVE:
                emit("task_failed" if t.state == FAILED else "task_cancelled", t)
        for rt in owners:
            if rt._inflight == 0 and rt._drained is not None:
                rt._wake_locked([rt._drained])

    def _cancel_running(self, task: Task) -> None:
        err = CancelledTaskError(f"{task.name} was not run: its runtime was closing")
        with self._lock:
            self._fail_locked(task, err)

    # -- timeouts and backpressure ------------------------------------------------------

    def _watchdog_arm(self, task: Task, seconds: float) -> list[Any]:
        """Start ``task``'s deadline (called by its TimedKernel on the thread running it)."""
        wd = self._watchdog
        if wd is None:
            with self._lock:
                wd = self._watchdog
                if wd is None:
                    name = f"dataflow-watchdog-{id(self) & 0xFFFF:x}"
                    wd = self._watchdog = Watchdog(self._timed_out, name)
        return wd.arm(task, seconds)

    def _timed_out(self, task: Task, seconds: float, thread: threading.Thread) -> None:
        """``task``'s kernel outlived its timeout: fail it and its dependents (watchdog thread)."""
        with self._lock:
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
            self._failures.append(err)
            self._fail_locked(task, err)
            self._pool.abandon_locked(thread)  # type: ignore[union-attr]

    def _throttle(self) -> None:
        """Over ``max_pending``: help run queued tasks until 10% under it (module docstring)."""
        if getattr(_helping, "active", False):
            return  # a task this thread runs as a helper dispatches: let it through
        _helping.active = True
        on_loop = threading.get_ident() == self._loop_tid
        lock = self._lock
        pool = self._pool
        assert pool is not None
        if not on_loop:
            with lock:
                self._blocked += 1
        try:
            while True:
                # Ctrl-C cancels the task that is dispatching (asyncio.Runner's handler runs
                # between any two bytecodes): stop here, as it would at its next await.
                if on_loop:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise asyncio.CancelledError
                with lock:
                    if self._inflight <= self._low_water or self._cancelling or self._closed:
                        return
                    task = pool.take_locked()
                    # Waiting is only useful while a kernel runs that is not itself a
                    # dispatcher held back here (such as a plain fork dispatching ops).
                    stuck = task is None and self.running <= self._blocked
                if task is not None:
                    task.runtime.execute(task)  # type: ignore[union-attr]
                    continue
                if stuck:
                    return
                time.sleep(0.0005)
        finally:
            _helping.active = False
            if not on_loop:
                with lock:
                    self._blocked -= 1

    def cancel_task(self, task: Task) -> bool:
        """Cancel a task that has not started; its dependents fail with CancelledTaskError."""
        with self._lock:
            if task.state not in (PENDING, READY):
                return False
            err = CancelledTaskError(f"{task.name} was cancelled before it ran")
            self._fail_locked(task, err)
        return True

    # -- wake-ups on the loop ---------------------------------------------------------------

    def _wake_locked(self, futs: list[asyncio.Future[None]]) -> None:
        if threading.get_ident() == self._loop_tid:
            for f in futs:
                if not f.done():
                    f.set_result(None)
            return
        self._wakeups.extend(futs)
        if not self._wake_posted:
            self._wake_posted = True
            self.loop.call_soon_threadsafe(self._flush_wakeups)  # type: ignore[union-attr]

    def _flush_wakeups(self) -> None:
        with self._lock:
            futs, self._wakeups = self._wakeups, []
            self._wake_posted = False
        for f in futs:
            if not f.done():
                f.set_result(None)

    def completion(self, task: Task) -> asyncio.Future[None]:
        """A loop future that completes when ``task`` is done (used by ``await handle``)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise DataflowError(
                f"{task.name} can only be awaited inside a coroutine running on its runtime's "
                "event loop"
            ) from None
        if loop is not self.loop:
            raise DataflowError(
                f"{task.name} belongs to a runtime on another event loop; await it there "
                "(pending values cannot move between event loops)"
            )
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if task.state >= DONE:
                fut.set_result(None)
            elif task.waiters is None:
                task.waiters = [fut]
            else:
                task.waiters.append(fut)
        return fut

    # -- forked coroutines ----------------------------------------------------------------

    def track_fork(self, task: asyncio.Task[Any]) -> None:
        """Own a forked coroutine's task: it is awaited (or cancelled) before the runtime closes."""
        self._forks.add(task)
        task.add_done_callback(self._fork_done)

    def _fork_done(self, task: asyncio.Task[Any]) -> None:
        self._forks.discard(task)
        if not task.cancelled():
            exc = task.exception()  # also marks it retrieved, so asyncio logs nothing
            if isinstance(exc, TaskError):
                self._failures.append(exc)


def _ready_dependents_locked(deps: list[Task]) -> None:
    """A task finished: queue each dependent that has no other input left, on its own pool.

    Holds the lock. A dependent may belong to another runtime than the finished task.
    """
    for d in deps:
        d.waiting -= 1
        if d.waiting == 0 and d.state == PENDING:
            d.state = READY
            d.runtime._pool.push_locked(d)  # type: ignore[union-attr]
            if ACTIVE:
                emit("task_ready", d)


def _unobserved_error(errors: list[BaseException]) -> BaseException:
    from ._errors import UnobservedTaskError

    return UnobservedTaskError(errors)
