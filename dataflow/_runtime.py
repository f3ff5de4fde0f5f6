"""The runtime: its lifetime, and the ownership of everything started inside it.

A :class:`Runtime` ties the pieces together and owns what they start:

* the host-loop bridge (``_loop``) of the event loop it was opened on (asyncio or trio);
* a backend (``_backend``): the local :class:`~dataflow._scheduler.Scheduler` over an inter-op
  pool, or Dask, or the graph tracer; ``dispatch`` is the backend's ``submit``;
* the forked coroutines (spawned through the bridge), and every task it dispatched.

Ownership rules: closing the runtime waits for its forked coroutines and for its graph to
drain. If the body raised or was cancelled, forked coroutines are cancelled and queued
kernels are dropped without running (a running kernel cannot be interrupted and is allowed to
finish); the wait itself is shielded from cancellation (an anyio ``CancelScope``), because the
pool's threads must be joined. A failure that nobody observed is raised (or logged, if the body
already raised) when the runtime closes. The pool's threads are joined when the last runtime
using the pool closes.

Finding the runtime of the calling code (``current_runtime``, ``get_runtime``, the lookup every
op call makes) is ``_lookup``'s: this module sets and clears what it reads. The defaults a
runtime and a run start with, and the choice of event loop for a new run, are ``_defaults``'.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable
from typing import Any

from . import _blas, _intraop, _loop
from ._backend import Backend, make_backend
from ._defaults import DEFAULT_MAX_PENDING
from ._errors import DataflowError, DataflowTypeError, DataflowValueError, UnobservedTaskError
from ._instrument import check_observer
from ._lookup import _by_loop, _current
from ._pool import (
    RUN_HAS_NO_POOL,
    InteropPool,
    acquire_shared_pool,
    on_pool_thread,
    on_shared_pool_thread,
    release_shared_pool,
)
from ._scheduler import Scheduler, get_inline_threshold
from ._scheduler._placement import check_threshold
from ._task import Task
from ._threads import _check_count, default_interop_threads
from ._timeout import check_timeout

__all__ = ["Runtime"]


def _flag(value: object, what: str) -> bool:
    """A real bool, or a DataflowTypeError naming the argument (``'no'`` is not False)."""
    if type(value) is not bool:
        raise DataflowTypeError(f"{what} must be True or False, got {type(value).__name__}: "
                                f"{value!r}")  # fmt: skip
    return value


def _not_open(*args: Any, **kwargs: Any) -> Task:
    raise DataflowError(
        "this runtime is not open: use `async with dataflow.Runtime(): ...` (or "
        "dataflow.run) and call ops inside it"
    )


class Runtime:
    """Binds the running event loop to an inter-op pool; owns every task started inside.

    Use ``dataflow.run(main)`` in scripts; use this class directly to embed dataflow in an
    application whose loop is already running (a web server), on asyncio, uvloop or trio::

        async with dataflow.Runtime(interop_threads=4):
            fut = dataflow.fork(model, x)
            y = await fut

    Args:
        interop_threads: size of the inter-op pool; default :func:`get_num_interop_threads`.
            0 is the synchronous debugging mode: no pool, every task runs on the thread that
            dispatches it, in program order (like dask's ``get_sync``).
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
        inline_threshold: kernels measured (or estimated) faster than this many seconds run
            inline (see :func:`set_inline_threshold`); default: the process default.
        backend: ``"local"`` (this process's pool) or ``"dask"`` (ops run on a Dask cluster;
            see docs/dask.md; needs dask.distributed: ``pip install -e '.[dask]'`` in a
            checkout). Default: ``"dask"`` when ``address``/``client`` is given or
            ``$DATAFLOW_DASK_ADDRESS`` is set (as ``dataflow run --dask ADDRESS`` does), else
            ``"local"``.
        **options: the backend's own options (Dask: ``address``, ``client``,
            ``local_threshold``, ``scatter_bytes``, ``connect_timeout``).
    """

    def __init__(
        self,
        *,
        interop_threads: int | None = None,
        intraop_threads: int | None = None,
        private_pool: bool = False,
        simulate: Callable[[Task], Any] | None = None,
        max_pending: int | None = DEFAULT_MAX_PENDING,
        op_timeout: float | None = None,
        inline_threshold: float | None = None,
        backend: str | None = None,
        **options: Any,
    ) -> None:
        if interop_threads == 0 and type(interop_threads) is int:
            self.interop_threads = 0
        else:
            self.interop_threads = (
                default_interop_threads()
                if interop_threads is None
                else _check_count(interop_threads, "interop_threads")
            )
        self.intraop_threads = (
            None if intraop_threads is None else _check_count(intraop_threads, "intraop_threads")
        )
        self.private_pool = _flag(private_pool, "Runtime(private_pool=)")
        if simulate is not None and not callable(simulate):
            raise DataflowTypeError(
                f"Runtime(simulate=) must be a function of the task (or None), got "
                f"{type(simulate).__name__}: {simulate!r}"
            )
        self.simulate = simulate
        if max_pending is not None and type(max_pending) is not int:
            raise DataflowTypeError(
                f"max_pending must be a positive int or None, got {type(max_pending).__name__}: "
                f"{max_pending!r}"
            )
        if max_pending is not None and max_pending < 1:
            raise DataflowValueError(
                f"max_pending must be a positive int or None, got {max_pending!r}"
            )
        self.max_pending = max_pending
        self.op_timeout = check_timeout(op_timeout, "op_timeout")
        self._inline_threshold = (
            None
            if inline_threshold is None
            else check_threshold(inline_threshold, "Runtime(inline_threshold=)")
        )
        self._backend: Backend = make_backend(self, backend, options)
        # A reduction of a pending stack runs as a fold (``_fold``): local kernels only.
        self.folds = self._backend.name == "local"
        self.host: _loop.HostLoop | None = None
        self._sched: Scheduler = None  # type: ignore[assignment]  # set on entry
        self._pool: InteropPool | None = None
        self._token: contextvars.Token[Runtime | None] | None = None
        self._held = False  # holds its intra-op count (see _intraop.hold)
        self._governed = False  # holds the adaptive intra-op governor (see _blas)
        self._entered = False
        self._closed = False
        # Submit a task to the backend: the backend's own ``submit`` once the runtime is open.
        self.dispatch: Callable[..., Task] = _not_open
        self._observers: list[Any] = []  # this runtime's own instruments and recorders

    @property
    def backend(self) -> Backend:
        """The backend that runs this runtime's tasks."""
        return self._backend

    @property
    def loop(self) -> Any:
        """The event loop (asyncio) or trio token the runtime runs on; None before entry."""
        return None if self.host is None else self.host.key

    @property
    def running(self) -> int:
        """Kernels running on the pool now."""
        return 0 if self._sched is None else self._sched.running

    @property
    def peak_running(self) -> int:
        """The most kernels that ran on the pool at once."""
        return 0 if self._sched is None else self._sched.peak_running

    @property
    def tasks_run(self) -> int:
        """Kernels run off the dispatching thread."""
        return 0 if self._sched is None else self._sched.tasks_run

    @property
    def _inflight(self) -> int:
        return 0 if self._sched is None else self._sched.inflight

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._entered else "new")
        sched = self._sched
        pool = self._pool
        forks = len(getattr(self.host, "tasks", ())) if self.host is not None else 0
        return (
            f"<Runtime {self._backend.name} {state} interop={self.interop_threads} "
            f"intraop={self.intraop_threads or 'default'} "
            f"running={sched.running if sched else 0} "
            f"inflight={sched.inflight if sched else 0} "
            f"queued={pool.queued if pool else 0} forks={forks}>"
        )

    # -- lifetime ---------------------------------------------------------------------------

    async def __aenter__(self) -> Runtime:
        if self._entered:
            raise DataflowError("a Runtime can be entered only once; create a new one")
        host = _loop.current("async with dataflow.Runtime()")
        if (not self.private_pool and on_shared_pool_thread()) or (
            self.private_pool and on_pool_thread() and self.interop_threads == 0
        ):
            # (The way out named for what was asked: private_pool=True was named to a runtime
            # that had it, in the synchronous mode, and to dataflow.run, which has no option.)
            own = (
                "threads of its own: Runtime(private_pool=True) with interop_threads=1 or more "
                "(the synchronous mode, interop_threads=0, has none)"
                if self.interop_threads == 0
                else "a pool of its own: Runtime(private_pool=True)"
            )
            raise DataflowError(
                "a Runtime cannot run on an inter-op pool thread (inside a kernel or a forked "
                "plain function, e.g. dataflow.run() there): it would wait for the pool it is "
                "running on. Make the function `async def` and fork it (it runs on the event "
                f"loop and can await ops), or give the runtime {own}; {RUN_HAS_NO_POOL}."
            )
        self._entered = True
        self.host = host
        # From the pool on, whatever raises (Ctrl-C under trio, which lands anywhere) closes
        # what was started: the shared pool's user was never released, its threads ran on.
        try:
            if self.interop_threads == 0:
                self._pool = None
            elif self.private_pool:
                name = f"interop-p{id(self) & 0xFFFF:x}"
                self._pool = InteropPool(self.interop_threads, name=name)
            else:
                self._pool = acquire_shared_pool(self.interop_threads)
            threshold = self._inline_threshold
            self._sched = Scheduler(
                self,
                self._pool,
                host,
                inline_threshold=get_inline_threshold() if threshold is None else threshold,
                max_pending=self.max_pending,
                simulate=self.simulate,
            )
            for observer in self._observers:
                self._sched.observe(observer, True)
            if self.intraop_threads is not None:
                _intraop.hold(self, self.intraop_threads)
                self._held = True
            elif self._pool is not None and not self.simulate:
                self._governed = _blas.acquire(self._pool.num_threads)
            await host.open()
            await self._backend.open()
        except BaseException:
            await self._close()
            raise
        self.dispatch = self._backend.submit
        self._token = _current.set(self)
        _by_loop.setdefault(host.key, []).append(self)
        return self

    def __enter__(self) -> None:
        raise DataflowError(
            "a Runtime is an async context manager: use `async with dataflow.Runtime(): ...` "
            "inside async code (or dataflow.run(main) in a script)"
        )

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ always raises
        pass

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        import anyio

        try:
            if exc_type is not None:
                self._cancel_everything()
            # The clean-up must finish even if the surrounding scope is being cancelled:
            # running kernels cannot be interrupted, and their threads must be joined.
            await self._join_to_the_end(anyio)
        finally:
            with anyio.CancelScope(shield=True):
                await self._close()
        interrupt = self.host.interrupt if self.host is not None else None
        if interrupt is not None:
            # A forked coroutine stops the process (trio: its task could not raise it), as
            # asyncio's loop lets it through, whatever the body raised.
            raise interrupt
        unobserved = [e for e in self._sched.failures if not getattr(e, "observed", True)]
        if not unobserved:
            return
        if exc_type is None:
            raise UnobservedTaskError(unobserved) from unobserved[0]
        from ._log import logger

        # A broken log consumer must not replace the body's own error.
        with contextlib.suppress(Exception):
            for e in unobserved:
                logger.error("task failed and was never awaited", error=repr(e), exc_info=e)

    def _cancel_everything(self) -> None:
        self._sched.cancel_everything()
        assert self.host is not None
        self.host.cancel_all()
        self._backend.cancel_everything()

    async def _join_to_the_end(self, anyio: Any) -> None:
        """``_join``, shielded, and to the end even when a cancellation reaches it.

        anyio's shield keeps anyio's and trio's cancellations out, not asyncio's own
        ``Task.cancel()`` (an ``asyncio.timeout`` around the block expiring while the exit
        waits for the forks): that one stopped the wait, and the runtime closed with its
        forked coroutines still running. It now cancels what still runs, as a body that
        raised does, the wait goes on, and the cancellation is raised once all has ended.
        """
        interrupted: BaseException | None = None
        while True:
            try:
                with anyio.CancelScope(shield=True):
                    await self._join()
            except asyncio.CancelledError as exc:
                interrupted = interrupted or exc
                self._cancel_everything()
                continue
            break
        if interrupted is not None:
            raise interrupted

    async def _join(self) -> None:
        """Wait for the forked coroutines, then for the graph to drain.

        While it drains, the loop's other tasks (not forks of this runtime: a background task
        the block started, say) may no longer add work: each op they dispatched kept the
        graph from draining, and the exit waited for ever. They get a DataflowError saying
        the runtime is closing; kernels still running (a forked plain function calling ops
        on a worker) go on."""
        assert self.host is not None
        while True:
            await self.host.close()  # every forked coroutine ended
            await self._backend.join()
            if not getattr(self.host, "tasks", None):
                break
        self._sched.draining = True
        await self._sched.join()

    async def _close(self) -> None:
        self._closed = True
        host = self.host
        if host is not None:
            host.release()
            rts = _by_loop.get(host.key)
            if rts is not None and self in rts:
                rts.remove(self)
                if not rts:
                    del _by_loop[host.key]
        if self._sched is not None:
            self._sched.close()
        try:
            await self._backend.close()
        finally:
            if self._token is not None:
                try:
                    _current.reset(self._token)
                except ValueError:  # exited in another context than entered
                    _current.set(None)
                self._token = None
                restored = _current.get()
                if restored is not None and restored._closed:
                    # The runtime entered before this one exited first (out of order): not
                    # it, but whichever is open on the loop (``current_runtime``).
                    _current.set(None)
            if self._held:
                self._held = False
                _intraop.unhold(self)
            if self._governed:
                self._governed = False
                _blas.release()
            if self._pool is not None:
                if self.private_pool:
                    self._pool.close()
                else:
                    release_shared_pool()
                self._pool = None

    # -- what handles and forks call -----------------------------------------------------------

    def completion(self, task: Task) -> Any:
        """An awaitable that completes when ``task`` is done (used by ``await handle``)."""
        return self._backend.completion(task)

    def await_interrupted(self, exc: BaseException | None = None, task: Task | None = None) -> None:
        """``await handle`` (on ``task``) was interrupted (a cancellation ``exc`` reached it):
        see ``Requests.await_interrupted``."""
        self._sched.await_interrupted(exc, task)

    def cancel_task(self, task: Task) -> bool:
        """Cancel a task that has not started; its dependents fail with CancelledTaskError."""
        return self._backend.cancel(task)

    def add_instrument(self, observer: Any) -> None:
        """Attach an instrument or a :class:`~dataflow.Recorder` to this runtime only.

        Other runtimes of the process do not pay for it (``dataflow.add_instrument`` observes
        them all). It may be attached before the runtime is entered.
        """
        check_observer(observer)
        self._observers.append(observer)
        if self._sched is not None:
            self._sched.observe(observer, True)

    def remove_instrument(self, observer: Any) -> None:
        """Detach an observer from this runtime; a no-op when it is not attached."""
        if observer in self._observers:
            self._observers.remove(observer)
        if self._sched is not None:
            self._sched.observe(observer, False)

    @property
    def failures(self) -> list[BaseException]:
        """Task failures recorded so far (reported at exit unless observed)."""
        return [] if self._sched is None else self._sched.failures
