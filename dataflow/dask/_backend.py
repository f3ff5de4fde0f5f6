"""The client side of the Dask backend: placement, shipping, outcomes.

``dataflow.Runtime(backend="dask", address="tcp://host:8786")`` (or ``client=`` an asynchronous
``distributed.Client``, or ``dataflow run --dask ADDRESS``) holds a :class:`DaskBackend`. User
code does not change: ops return pending handles at once and meta rules run at the call site,
so bad input raises there, as on the local backend. What differs is where kernels run.

Placement (decided per op, at dispatch, on the calling thread; :func:`place`, pure):

* **Small ops stay on the client.** An op runs on the client, exactly as the local backend
  would run it, when every input is already on the client (numpy arrays, scalars, values that
  were awaited or computed on the client) and its estimated time is under ``local_threshold``
  (default 1 ms, about Dask's per-task floor), or the op is declared ``inline=True``.
* **Forked plain functions run on the client** (on the inter-op pool), because they run user
  code with the caller's context variables; the ops they call are placed like any other. So
  does an op with an input still being computed on the client (a forked plain function's
  result): its cluster inputs are fetched for it.
* **Everything else runs on the cluster.** Its handle is backed by a Dask future whose key is
  ``"{op}-{runtime token}-{task id}"``. Inputs computed on the cluster are passed by key, so a
  chain of ops never ships intermediates back through the client; a value is fetched only when
  the program awaits it (or a client-side task needs it).

Shipping, per flush: submissions are queued and sent by one coroutine on the runtime's loop
when the program next suspends, as a single ``client.map`` of the whole batch. numpy arrays of
at least ``scatter_bytes`` (default 16 KiB) among the arguments (weights, inputs, client-side
results) are scattered once per runtime and cached by identity (a weakref checks the array is
still the same object), so a weight passed to every step of a recurrence is sent once; smaller
values travel inside the task. An array is treated as immutable once passed to an op.

State of a cluster task, from the client's point of view: READY while queued for the next
flush, RUNNING once sent (its :class:`_Remote` is in ``task.value``), DONE once fetched;
FAILED or CANCELLED as on the local backend. ``Pending.done()`` means the value is on the
client. One watcher coroutine per sent batch turns each future's final status into the
scheduler's accounting: the task no longer holds up closing, its failure is recorded (a
kernel's exception becomes a :class:`~dataflow.TaskError` naming the op, with the original
chained; every task that depends on it fails with that same error), and it is fetched if
someone waits. The Dask client is asyncio-only, so this backend runs on asyncio (or uvloop).

Lost workers (``_lost``): a task Dask dropped because data it needs was lost with a worker
is sent again, with its lost inputs and the arrays lost, by :meth:`DaskBackend._revive`;
where that cannot work it fails with ``WorkerLostError``, never as a cancellation.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _graphstate as gs
from .._backend import DASK_ADDRESS_ENV
from .._errors import (
    CancelledTaskError,
    DataflowError,
    DataflowTypeError,
    DataflowValueError,
    TaskError,
    describe,
    task_error_type,
)
from .._instrument import ACTIVE
from .._log import logger
from .._pool import GRAPH_LOCK
from .._registry import op_for_kernel
from .._scheduler import Scheduler
from .._task import CANCELLED, DONE, FAILED, READY, RUNNING, Pending, Signature, Task
from .._walk import replace
from ._client import _HangUpQuietly, _key_ref, import_distributed
from ._lost import (
    MAX_RESENDS,
    cancel_reason,
    dropped,
    killed_worker_error,
    lost_workers,
    resend_failed_error,
    resend_limit_error,
)
from ._remote import _failed_input, _inputs, _Remote, _was_lost
from ._scatter import _arrays, _Scattered
from ._timing import Relay
from ._worker import Call, KernelFailed, Ref, run_op

if TYPE_CHECKING:
    from .._runtime import Runtime

__all__ = ["DaskBackend", "place"]

_FINAL = ("finished", "error", "cancelled")
_SCATTER_TRIES = 3  # a scatter that meets a dying worker is tried again (0.1 s, then 0.2 s)


def place(sig: Signature, inputs: tuple[Task, ...], local_threshold: float, forked: bool) -> str:
    """Where a task runs: ``"local"`` (the client's scheduler) or ``"remote"`` (the cluster).

    See the module docstring. ``forked``: a forked plain function (it runs user code with the
    caller's context variables, so it stays on the client).
    """
    remote_inputs = local_pending = False
    for t in inputs:
        if t.state < DONE:
            if type(t.value) is _Remote:
                remote_inputs = True
            else:
                local_pending = True
    if forked or local_pending:
        return "local"
    if not remote_inputs and (
        sig.inline is True or (sig.inline is None and sig.seconds < local_threshold)
    ):
        return "local"
    return "remote"


class DaskBackend:
    """Ops run on a Dask cluster; see the module docstring.

    Args:
        runtime: the runtime holding this backend.
        address: the scheduler's address (``"tcp://host:8786"``) or a cluster object;
            default ``$DATAFLOW_DASK_ADDRESS``. The backend connects its own asynchronous
            client on entry and closes it on exit.
        client: an asynchronous ``distributed.Client`` running on this event loop, to use
            instead of connecting (it is left open).
        local_threshold: ops whose inputs are all on the client and whose estimated time is
            under this many seconds run on the client (default 1e-3; 0 ships every op).
        scatter_bytes: numpy arguments of at least this size are scattered once per runtime
            and reused by identity (default 16 KiB); smaller ones travel with each task.
        connect_timeout: seconds to wait for the scheduler (default 10).

    Counters (for tests and ``repr``): ``sent`` ops shipped, ``remote_done`` computed there,
    ``fetched`` values brought back, ``local_ops`` ops kept on the client, ``resent`` ops
    sent again because a worker was lost with data they needed.
    """

    name = "dask"

    def __init__(
        self,
        runtime: Runtime,
        *,
        address: Any = None,
        client: Any = None,
        local_threshold: float = 1e-3,
        scatter_bytes: int = 16384,
        connect_timeout: float = 10.0,
    ) -> None:
        if runtime.simulate is not None:
            raise DataflowError("simulate= is for the local backend; it cannot run on Dask")
        import_distributed()
        if address is not None and client is not None:
            raise DataflowValueError("give the Dask backend address= or client=, not both")
        if address is None and client is None:
            address = os.environ.get(DASK_ADDRESS_ENV) or None
            if address is None:
                raise DataflowError(
                    "backend='dask' needs the scheduler: address='tcp://host:8786', "
                    "client=<an asynchronous distributed.Client>, or "
                    f"${DASK_ADDRESS_ENV} (which `dataflow run --dask ADDRESS` sets)"
                )
        for what, value in (("local_threshold", local_threshold), ("scatter_bytes", scatter_bytes)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise DataflowTypeError(
                    f"Runtime(backend='dask', {what}=) must be a number, got "
                    f"{type(value).__name__}: {value!r}"
                )
        if not local_threshold >= 0:
            raise DataflowValueError(
                f"local_threshold must be >= 0 seconds, got {local_threshold!r}"
            )
        if scatter_bytes < 0:
            raise DataflowValueError(f"scatter_bytes must be >= 0, got {scatter_bytes!r}")
        self.runtime = runtime
        self.address: Any = address
        self.client: Any = client
        self._own_client = client is None
        self.local_threshold = float(local_threshold)
        self.scatter_bytes = int(scatter_bytes)
        self.connect_timeout = connect_timeout
        self.token = uuid.uuid4().hex[:8]
        self._topic = f"dataflow-timing-{self.token}"
        self._subscribed = False
        self._sched: Scheduler = None  # type: ignore[assignment]  # on open
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        # Tasks queued for the next flush, and whether a flush is scheduled or running.
        self._outbox: list[Task] = []
        self._flush_scheduled = False
        # Sent and not settled: task id -> task (to cancel them all when the body fails).
        self._remote: dict[int, Task] = {}
        self._scattered = _Scattered()
        # Failures by the name of the task whose kernel raised: one TaskError for all of them.
        self._errors: dict[str, TaskError] = {}
        self._reviving = asyncio.Lock()  # one _revive at a time (made again on open)
        # Tasks sent while an instrument was attached, waiting for their timing event.
        self._timed: dict[int, Task] = {}
        self._timed_drained: asyncio.Future[None] | None = None
        self._relay = Relay()
        self._clock = 0
        # Coroutines the backend started (flushes, watchers, fetches): awaited on exit.
        self._bg: set[asyncio.Task[Any]] = set()
        self.sent = 0
        self.remote_done = 0
        self.fetched = 0
        self.local_ops = 0
        self.resent = 0

    def __repr__(self) -> str:
        address = getattr(self.address, "scheduler_address", self.address)
        if address is None and self.client is not None:
            address = getattr(getattr(self.client, "scheduler", None), "address", "client")
        return (
            f"<DaskBackend address={address} sent={self.sent} remote={len(self._remote)} "
            f"queued={len(self._outbox)} fetched={self.fetched} local={self.local_ops}>"
        )

    @property
    def scattered(self) -> int:
        """How many arrays were scattered to the cluster (each once)."""
        return self._scattered.sent

    # -- lifetime -----------------------------------------------------------------------------

    async def open(self) -> None:
        host = self.runtime.host
        assert host is not None
        if host.library != "asyncio":
            raise DataflowError(
                "the Dask backend runs on asyncio (or uvloop): Dask's client is asyncio-only"
            )
        self._loop = host.key  # type: ignore[assignment]
        self._sched = self.runtime._sched
        self._reviving = asyncio.Lock()  # one _revive at a time
        await self._connect()
        self._clock = time.time_ns() - time.perf_counter_ns()

    async def _connect(self) -> None:
        distributed = import_distributed()
        if self.client is not None:
            client = self.client
            loop = getattr(getattr(client, "loop", None), "asyncio_loop", None)
            if not getattr(client, "asynchronous", False) or loop is not self._loop:
                raise DataflowError(
                    "client= must be an asynchronous distributed.Client started on this event "
                    "loop: `async with distributed.Client(address, asynchronous=True) as c: "
                    "async with dataflow.Runtime(backend='dask', client=c): ...`; or pass "
                    "address=c.scheduler.address and the runtime connects its own"
                )
            return
        try:
            self.client = await distributed.Client(
                self.address,
                asynchronous=True,
                set_as_default=False,
                timeout=self.connect_timeout,
            )
        except Exception as exc:
            raise DataflowError(
                f"cannot connect to the Dask scheduler at {self.address!r}: {describe(exc)}. "
                "Is `dask scheduler` running there, and reachable from this machine?"
            ) from exc

    def cancel_everything(self) -> None:
        futures = [t.value.future for t in self._remote.values() if type(t.value) is _Remote]
        if futures and self.client is not None:
            self._spawn(self._cancel_futures(futures))

    async def _cancel_futures(self, futures: list[Any]) -> None:
        if self.client is not None:
            await self.client.cancel(futures)

    async def join(self) -> None:
        pass  # remote tasks are counted in the scheduler's in-flight tasks: its join waits

    async def close(self) -> None:
        """After the graph drained: settle the coroutines, timings and the client."""
        while self._bg:
            await asyncio.wait(set(self._bg))
        if self._timed:
            # Timing events travel worker -> scheduler -> client next to the results; give
            # the stragglers a moment, then drop what did not come (a worker died).
            self._timed_drained = self._loop.create_future()
            try:
                await asyncio.wait_for(self._timed_drained, 5.0)
            except TimeoutError:
                self._timed.clear()
            self._timed_drained = None
        self._relay.close()
        self._scattered.clear()
        self._errors.clear()
        client, self.client = self.client, (None if self._own_client else self.client)
        if client is None:
            return
        try:
            if self._subscribed:
                client.unsubscribe_topic(self._topic)
            if self._own_client:
                async with _HangUpQuietly(client):
                    await client.close()
        except Exception as exc:  # the scheduler went away: nothing is left to release
            logger.warning("closing the Dask client failed", error=repr(exc))

    def _spawn(self, coro: Any) -> None:
        """Run a coroutine on the runtime's loop, owned: awaited before the runtime closes."""
        task = self._loop.create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg_done)

    def _bg_done(self, task: asyncio.Task[Any]) -> None:
        self._bg.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            logger.error("dask backend coroutine failed", error=repr(exc), exc_info=exc)

    def _call_on_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        host = self.runtime.host
        assert host is not None
        host.call_soon(fn, *args)

    # -- dispatch -----------------------------------------------------------------------------

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
        values: Any = None,
        light: bool = False,
    ) -> Any:
        """Place the task (see :func:`place`): on the client, or queue it for Dask.

        ``priority`` and ``timeout`` apply when the task stays on the client: Dask orders the
        tasks it runs itself, and a kernel running on a worker is not timed out.
        """
        sched = self._sched
        if sched.closed:
            raise DataflowError(f"{sig.name}: this runtime is closed; start a new one")
        if place(sig, inputs, self.local_threshold, sig.op is None) == "local":
            # Inputs still on the cluster are fetched; the local graph parks the task on them.
            for t in inputs:
                if type(t.value) is _Remote and t.state < DONE:
                    self._call_on_loop(self._want, t)
            self.local_ops += 1
            return sched.submit(
                sig, fn, args, kwargs, inputs, ready, priority, timeout, values, light
            )
        return self._submit_remote(sig, fn, args, kwargs, inputs)

    def _submit_remote(
        self,
        sig: Signature,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        inputs: tuple[Task, ...],
    ) -> Task:
        task = Task(sig, fn, args, kwargs, self.runtime, inputs)
        timed = bool(ACTIVE) or self._sched.watching
        if timed:
            self._sched.emit("task_created", task)
            self._timed[task.id] = task
        task.value = _Remote(f"{sig.name}-{self.token}-{task.id}", timed)
        sched = self._sched
        with GRAPH_LOCK:
            sched.inflight += 1
            for t in inputs:
                if t.state > DONE:  # an input already failed: fail unrun, with its error
                    sched._fail_locked(task, t.error)
                    self._timed.pop(task.id, None)
                    return task
            task.state = READY
            self._outbox.append(task)
            start = not self._flush_scheduled
            self._flush_scheduled = True
        if start:
            self._call_on_loop(self._spawn_flush)
        return task

    def _spawn_flush(self) -> None:
        self._spawn(self._flush())

    async def _flush(self) -> None:
        """Send queued tasks to the cluster, a batch at a time, in dispatch order."""
        while True:
            with GRAPH_LOCK:
                batch, self._outbox = self._outbox, []
                if not batch:
                    self._flush_scheduled = False
                    return
            try:
                await self._send(batch)
            except BaseException as exc:
                for task in batch:
                    if task.state == READY:
                        self._fail_unsent(task, exc)
                if not isinstance(exc, Exception):
                    raise

    async def _send(self, batch: list[Task]) -> None:
        """Scatter the batch's new arrays, then send its tasks as one ``client.map``."""
        # Inputs Dask dropped since they were sent (lost with a worker) go again first: a
        # graph naming a key Dask forgot is cancelled as a whole.
        lost = [t for task in batch if task.state == READY for t in task.inputs if _was_lost(t)]
        if lost:
            await self._revive(lost)
        await self._scatter([task for task in batch if task.state == READY])
        todo: list[Task] = []
        for task in batch:
            if task.state != READY:  # cancelled, or an input failed, while queued
                continue
            if self._sched.cancelling:
                self._cancel_unsent(task)
                continue
            rem: _Remote = task.value
            if rem.timed and not self._subscribed:
                self.client.subscribe_topic(self._topic, self._on_timing)
                self._subscribed = True
            todo.append(task)
        self._sent(self._map(todo, self._fail_queued))

    async def _scatter(self, tasks: list[Task]) -> int:
        """Scatter the arrays among the tasks' arguments that are not on the cluster (any
        more); returns how many were sent."""
        cache = self._scattered
        new: dict[int, np.ndarray[Any, Any]] = {}
        for task in tasks:
            for a in _arrays(task.args, task.kwargs, self.scatter_bytes):
                if cache.get(a) is None:
                    new[id(a)] = a
        if not new:
            return 0
        arrays = list(new.values())
        for attempt in range(_SCATTER_TRIES):
            try:
                futures = await self.client.scatter(arrays, hash=False)
                break
            except OSError:  # CommClosedError: a worker died under it; the scheduler drops it
                if attempt == _SCATTER_TRIES - 1:
                    raise
                await asyncio.sleep(0.1 * (attempt + 1))
        for a, f in zip(arrays, futures, strict=True):
            cache.put(a, f)
        return len(new)

    def _map(
        self, tasks: list[Task], fail: Callable[[Task, BaseException], None]
    ) -> list[tuple[Task, Any]]:
        """Send ``tasks`` (in dependency order) as one ``client.map``, each under its
        ``_Remote.key``; returns (task, future) pairs. A task that cannot be sent (an argument
        that does not pickle) or whose input failed is given to ``fail`` with its error."""
        ref = _key_ref()
        keys: list[str] = []
        calls: list[Call] = []
        deps: list[list[Any]] = []
        sent: list[Task] = []
        for task in tasks:
            failed = _failed_input(task)
            if failed is not None:
                fail(task, failed.error)  # type: ignore[arg-type]
                continue
            rem: _Remote = task.value
            try:
                call, slots = self._encode(task, ref)
            except Exception as exc:
                fail(task, self._unsendable(task, exc))
                continue
            if ref is None:  # older Dask: name tasks of this batch by a future made early
                rem.future = import_distributed().Future(rem.key, self.client)
            keys.append(rem.key)
            calls.append(call)
            deps.append(slots)
            sent.append(task)
        if not sent:
            return []
        try:
            futures = self.client.map(run_op, calls, deps, key=keys, pure=False)
        except Exception:
            # One of them cannot be sent (an argument that does not pickle): send them one
            # by one, so only that one (and what depends on it) fails.
            pairs = []
            for task, call, slots in zip(sent, calls, deps, strict=True):
                failed = _failed_input(task)
                if failed is not None:
                    fail(task, failed.error)  # type: ignore[arg-type]
                    continue
                try:
                    (fut,) = self.client.map(
                        run_op, [call], [slots], key=[task.value.key], pure=False
                    )
                except Exception as exc:
                    fail(task, self._unsendable(task, exc))
                    continue
                pairs.append((task, fut))
            return pairs
        return list(zip(sent, futures, strict=True))

    def _unsendable(self, task: Task, exc: BaseException) -> TaskError:
        err = TaskError(
            f"{task.name} could not be sent to the Dask cluster: {describe(exc)}",
            task=task.name,
            op=task.op,
        )
        err.__cause__ = exc
        self._sched.failures.append(err)
        return err

    def _fail_queued(self, task: Task, err: BaseException) -> None:
        """Fail a task that was queued and never sent (``_map``'s ``fail``)."""
        with GRAPH_LOCK:
            self._timed.pop(task.id, None)
            self._sched._fail_locked(task, err)

    def _fail_resent(self, task: Task, err: BaseException) -> None:
        """Fail a task that was sent before and could not be sent again (``_map``'s ``fail``)."""
        self._finish_failed(task, task.value, err, ran=False)

    # -- lost workers (see _lost) -------------------------------------------------------------

    async def _revive(self, tasks: list[Task]) -> None:
        """Send again what Dask dropped because a worker was lost (see ``_lost``).

        ``tasks`` were dropped; with them go every other sent task Dask dropped, and their
        dropped inputs, transitively: tasks already computed whose values were lost and that
        Dask cannot recompute (they read scattered data that was lost). The arrays lost are
        scattered again; the tasks are sent in dispatch order (inputs first) under new keys.
        """
        async with self._reviving:
            found: dict[int, Task] = {}
            stack = [*tasks, *self._remote.values()]
            while stack:
                t = stack.pop()
                if t.id in found or not _was_lost(t):
                    continue
                found[t.id] = t
                stack.extend(_inputs(t))
            if not found or self._sched.cancelling:
                return
            again = sorted(found.values(), key=lambda t: t.id)
            workers = await self._lost_workers()
            for t in list(again):
                rem: _Remote = t.value
                if not workers and dropped(rem.future) == "unsaid":
                    # Cancelled with no reason, and no worker holding our keys was lost:
                    # a cancel after all (another client's, with our key).
                    self._cancelled(t, rem)
                    again.remove(t)
                    continue
                rem.sends += 1
                if rem.sends > MAX_RESENDS:
                    err = resend_limit_error(t.name, t.op, workers, MAX_RESENDS)
                    self._sched.failures.append(err)
                    self._finish_failed(t, rem, err, ran=False)
                    again.remove(t)
            if not again:
                return
            try:
                scattered = await self._scatter(again)
            except Exception as exc:
                for t in again:
                    if _was_lost(t):
                        err = resend_failed_error(t.name, t.op, workers, exc)
                        self._sched.failures.append(err)
                        self._finish_failed(t, t.value, err, ran=False)
                return
            # While it scattered, a task may have been cancelled, or the runtime be closing.
            again = [t for t in again if _was_lost(t)]
            if not again or self._sched.cancelling:
                return
            logger.warning(
                "a Dask worker was lost: sending again what it held",
                workers=workers,
                tasks=len(again),
                arrays=scattered,
            )
            for t in again:
                rem = t.value
                rem.key = f"{t.sig.name}-{self.token}-{t.id}-{rem.sends}"
            for t, fut in self._map(again, self._fail_resent):
                t.value.future = fut
                self.resent += 1

    async def _lost_workers(self) -> list[str]:
        """The workers whose loss cost this runtime keys (the scheduler's event log)."""
        token = f"-{self.token}-"
        scattered = self._scattered.keys

        def mine(key: Any) -> bool:
            return isinstance(key, str) and (token in key or key in scattered)

        try:
            events = await asyncio.wait_for(self.client.get_events("all"), 5.0)
        except Exception:  # the log only names the workers in messages
            return []
        return lost_workers(events, mine)

    def _sent(self, pairs: list[tuple[Task, Any]]) -> None:
        watched: list[tuple[Task, _Remote]] = []
        dropped: list[Any] = []
        with GRAPH_LOCK:
            for task, fut in pairs:
                rem: _Remote = task.value
                rem.future = fut
                if task.state == READY:
                    task.state = RUNNING
                    self._remote[task.id] = task
                    watched.append((task, rem))
                else:  # cancelled (and counted) from another thread while being sent
                    rem.settled = True
                    dropped.append(fut)
        if dropped:
            self._spawn(self._cancel_futures(dropped))
        self.sent += len(watched)
        for task, rem in watched:
            if (ACTIVE or self._sched.watching) and not rem.timed:
                self._sched.emit("task_ready", task)
            if rem.wanted and not rem.fetching:
                self._spawn(self._fetch(task, rem))
        # One watcher per batch (a coroutine per task would cost more than it saves): it
        # settles the tasks in dispatch order; a fetch settles an awaited one earlier.
        self._spawn(self._watch(watched))

    def _encode(self, task: Task, ref: Any) -> tuple[Call, list[Any]]:
        """The task as a Call, and its dependencies: cluster inputs and scattered arrays."""
        slots: list[Any] = []
        index: dict[str, int] = {}
        cache = self._scattered
        threshold = self.scatter_bytes

        def slot(key: str, future: Any) -> int:
            i = index.get(key)
            if i is None:
                i = index[key] = len(slots)
                slots.append(future if ref is None else ref(key))
            return i

        def leaf(v: Any) -> Any:
            if isinstance(v, Pending):
                t = v._t
                if t.state == DONE:  # on the client: ship the value
                    return replace(v.result(), leaf)
                rem = t.value
                assert type(rem) is _Remote, (t, rem)
                return Ref(slot(rem.key, rem.future), v._index)
            if isinstance(v, np.ndarray) and v.nbytes >= threshold:
                fut = cache.get(v)
                if fut is not None:
                    return Ref(slot(fut.key, fut), None)
            return v

        args = replace(task.args, leaf)
        kwargs = replace(task.kwargs, leaf) if task.kwargs else None
        fn: Any = task.fn
        assert fn is not None
        sig = task.sig
        # A declared op's kernel travels as its registry name: it may not pickle by reference
        # (a closure made by a factory), and by value it costs kilobytes on every task.
        op = op_for_kernel(fn, sig.name)
        check = sig.check
        if op is not None and op.module != "__main__":
            fn = op.qualname
            check = None  # the worker's own op has it
        topic = self._topic if task.value.timed else None
        call = Call(
            fn, args, kwargs, task.name, sig.name, task.id, topic, bool(slots), sig.spec, check
        )
        return call, slots

    # -- outcomes -----------------------------------------------------------------------------

    async def _watch(self, watched: list[tuple[Task, _Remote]]) -> None:
        """Settle a batch's tasks as they end: account for them, record failures."""
        for task, rem in watched:
            if await self._outcome(task, rem):
                with GRAPH_LOCK:
                    self._settle_locked(task, rem)
                    if task.state < DONE and not rem.timed:
                        task.inputs = ()
                self.remote_done += 1

    async def _outcome(self, task: Task, rem: _Remote) -> bool:
        """Wait until the task's future ends; True when it finished, else fail the task.

        A task Dask dropped because a worker was lost is sent again (``_revive``), and
        waited for again.
        """
        while True:
            fut = rem.future
            while fut.status not in _FINAL:
                await fut._state.wait()  # what distributed.wait itself waits on
            if fut is not rem.future:  # sent again meanwhile
                continue
            status = fut.status
            if status == "finished":
                return True
            if status == "error":
                exc = await fut.exception()
                tb = await fut.traceback()
                self._failed(task, rem, exc, tb)
                return False
            if _was_lost(task) and not self._sched.cancelling:
                await self._revive([task])
                if rem.future is not fut and task.state < DONE:
                    continue
            self._cancelled(task, rem)
            return False

    def _settle_locked(self, task: Task, rem: _Remote) -> None:
        """A sent task ended (once): it no longer holds up the runtime's closing."""
        if rem.settled:
            return
        rem.settled = True
        self._remote.pop(task.id, None)
        sched = self._sched
        sched.inflight -= 1
        if sched.inflight == 0 and sched._drained is not None:
            sched.host.wake([sched._drained])
            sched._drained = None

    def _failed(self, task: Task, rem: _Remote, exc: BaseException, tb: Any) -> None:
        if task.state >= DONE:  # the watcher and a fetch both saw it
            return
        if isinstance(exc, KernelFailed):
            err = self._errors.get(exc.task)
            if err is None:
                orig = exc.exc
                err = task_error_type(type(orig))(
                    f"{exc.task} failed on the {exc.worker}: {describe(orig)}",
                    task=exc.task,
                    op=exc.op,
                )
                err.__cause__ = orig
                self._errors[exc.task] = err
                self._sched.failures.append(err)
            ran = exc.task == task.name
        elif type(exc).__name__ == "KilledWorker":
            # Workers kept dying while running it (or a task it depends on): Dask gave up.
            origin = str(getattr(exc, "task", rem.key))
            err = self._errors.get(origin)
            if err is None:
                name, op = (task.name, task.op) if origin == rem.key else self._named(origin)
                err = killed_worker_error(name, op, exc)
                self._errors[origin] = err
                self._sched.failures.append(err)
            ran = False
        else:
            # Not the kernel: the task could not run there (e.g. a module the workers lack).
            hint = ""
            if isinstance(exc, ImportError):
                hint = (
                    " (the workers need the same packages as the client: dataflow, the ops' "
                    "modules and the code defining the kernels)"
                )
            err = TaskError(
                f"{task.name} failed on the Dask cluster: {describe(exc)}{hint}",
                task=task.name,
                op=task.op,
            )
            err.__cause__ = exc.with_traceback(tb) if tb is not None else exc
            self._sched.failures.append(err)
            ran = False
        self._finish_failed(task, rem, err, ran)

    def _named(self, key: str) -> tuple[str, str]:
        """(task name, op) of the task this runtime sent as Dask key ``key``."""
        op, sep, rest = key.partition(f"-{self.token}-")
        if not sep:
            return key, key
        return f"{op}#{rest.split('-', 1)[0]}", op

    def _cancelled(self, task: Task, rem: _Remote) -> None:
        err: BaseException | None = next(
            (t.error for t in _inputs(task) if t.state == CANCELLED and t.error is not None),
            None,
        )
        if err is None:
            if self._sched.cancelling:
                why = "its runtime was closing"
            else:
                reason = cancel_reason(rem.future) if rem.future is not None else ""
                why = "it was cancelled on Dask" + (f" ({reason})" if reason else "")
            err = CancelledTaskError(f"{task.name} was not run: {why}")
        self._finish_failed(task, rem, err, ran=False)

    def _finish_failed(self, task: Task, rem: _Remote, err: BaseException, ran: bool) -> None:
        """Fail a sent task, and what waits for it on the client.

        A kernel that ran while timed reports its own span (ending in task_failed) through
        the relay, so no event is emitted here for it.
        """
        reports = ran and rem.timed
        if not reports:
            self._timed.pop(task.id, None)
        cancelled = isinstance(err, CancelledTaskError)
        sched = self._sched
        with GRAPH_LOCK:
            self._settle_locked(task, rem)
            if task.state >= DONE:
                return
            task.state = CANCELLED if cancelled else FAILED
            task.error = err
            task.value = None
            task.fn = task.args = task.kwargs = None
            if not reports:
                task.inputs = ()
            waiters = gs.take_waiters(task)
            if waiters is not None:
                sched.host.wake(waiters)
            deps, task.dependents = task.dependents, None
            for d in deps or ():
                d.runtime._sched._fail_locked(d, err)  # type: ignore[union-attr]
        if (ACTIVE or sched.watching) and not reports:
            sched.record_unrun(cancelled)
            sched.emit("task_cancelled" if cancelled else "task_failed", task)

    def _fail_unsent(self, task: Task, exc: BaseException) -> None:
        self._fail_queued(task, self._unsendable(task, exc))

    def _cancel_unsent(self, task: Task) -> None:
        err = CancelledTaskError(f"{task.name} was not run: its runtime was closing")
        with GRAPH_LOCK:
            self._timed.pop(task.id, None)
            self._sched._fail_locked(task, err)

    def cancel(self, task: Task) -> bool:
        """Cancel a task not yet computed; on the cluster, its dependents are cancelled too."""
        rem = task.value
        if type(rem) is not _Remote:
            return self._sched.cancel(task)
        err = CancelledTaskError(f"{task.name} was cancelled before it ran")
        with GRAPH_LOCK:
            if task.state == READY:  # still queued here: it is never sent
                self._timed.pop(task.id, None)
                self._sched._fail_locked(task, err)
                return True
            if task.state != RUNNING or rem.future.status != "pending":
                return False
        self._finish_failed(task, rem, err, ran=False)
        self._call_on_loop(self._spawn, self._cancel_futures([rem.future]))
        return True

    # -- values back to the client ------------------------------------------------------------

    def completion(self, task: Task) -> Any:
        if type(task.value) is not _Remote:
            return self._sched.completion(task)
        waiter = self._sched.waiter(task)  # never run here: it is the cluster's to run
        if task.state < DONE:
            self._want(task)
        return waiter

    def _want(self, task: Task) -> None:
        """Bring the task's value to the client once computed (call on the loop thread)."""
        rem = task.value
        if type(rem) is not _Remote or task.state >= DONE or rem.wanted:
            return
        rem.wanted = True
        if rem.future is not None:  # else _sent starts the fetch
            self._spawn(self._fetch(task, rem))

    async def _fetch(self, task: Task, rem: _Remote) -> None:
        rem.fetching = True
        while True:
            if not await self._outcome(task, rem):
                return
            fut = rem.future
            try:
                value = await self.client.gather(fut)
            except Exception as exc:
                if rem.future is not fut or _was_lost(task):
                    continue  # lost with its worker meanwhile: _outcome sends it again
                err = TaskError(
                    f"{task.name}: its value could not be fetched from the Dask cluster: "
                    f"{describe(exc)}",
                    task=task.name,
                    op=task.op,
                )
                err.__cause__ = exc
                self._sched.failures.append(err)
                self._finish_failed(task, rem, err, ran=False)
                return
            break
        self.fetched += 1
        run_here = None
        with GRAPH_LOCK:
            self._settle_locked(task, rem)
            if task.state >= DONE:
                return
            waiters = gs.take_waiters(task)
            ready = gs.finish(task, value, release=not rem.timed)
            if ready is not None:
                run_here = Scheduler._place_ready_locked(ready, False, None)
            if waiters is not None:
                self._sched.host.wake(waiters)
        if (ACTIVE or self._sched.watching) and ready is not None:
            for d in ready:
                self._sched.emit("task_ready", d)
        for t in run_here or ():  # synchronous mode (no pool): they run here
            t.runtime._sched.execute(t, go_on=False)  # type: ignore[union-attr]

    # -- timings ------------------------------------------------------------------------------

    def _on_timing(self, event: tuple[float, Any]) -> None:
        """A worker reported a kernel's span (subscribe_topic handler, on the loop)."""
        task_id, start, end, failed, worker, thread_name, native_id = event[1]
        task = self._timed.pop(task_id, None)
        if task is not None:
            clock = self._clock
            self._relay.put(
                (worker, native_id),
                f"dask {worker} {thread_name}",
                self._sched,
                task,
                start - clock,
                end - clock,
                bool(failed),
            )
        drained = self._timed_drained
        if not self._timed and drained is not None and not drained.done():
            drained.set_result(None)
