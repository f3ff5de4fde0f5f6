"""The Dask backend: the same program, its ops run as tasks on a ``distributed`` cluster.

``dataflow.Runtime(backend="dask", address="tcp://host:8786")`` (or ``client=`` an asynchronous
``distributed.Client``, or ``dataflow run --dask ADDRESS``) returns a :class:`DaskRuntime`. User
code does not change: ops return pending handles at once and meta rules run at the call site,
so bad input raises there, as on the local backend. What differs is where kernels run.

Placement policy (decided per op, at dispatch, on the calling thread):

* **Small ops stay on the client.** An op runs on the client, exactly as the local backend
  would run it, when every input is already on the client (numpy arrays, scalars, values that
  were awaited or computed on the client) and its estimated time (:func:`estimate_seconds` of
  its cost rule) is under ``local_threshold`` (default 1 ms, about Dask's per-task floor), or
  the op is declared ``inline=True``. Shipping it would cost more than running it.
* **Forked plain functions run on the client** (on the inter-op pool), because they run user
  code with the caller's context variables; the ops they call are placed like any other.
  So does an op with an input still being computed on the client (a forked plain function's
  result): its cluster inputs are fetched for it.
* **Everything else runs on the cluster.** Its handle is backed by a Dask future whose key is
  ``"{op}-{runtime token}-{task id}"``. Inputs computed on the cluster are passed by key, so a
  chain of ops never ships intermediates back through the client; a value is fetched only when
  the program awaits it (or a client-side task needs it).

Shipping, per flush: submissions are queued and sent by one coroutine on the runtime's loop
when the program next suspends, as a single ``client.map`` of the whole batch (one graph
message instead of one per op). numpy arrays of at least ``scatter_bytes`` (default 16 KiB)
among the arguments (module weights, inputs, client-side results) are scattered once per
runtime and cached by identity (a weakref checks the array is still the same object), so a
weight passed to every step of a recurrence is sent once; smaller values travel inside the
task. An array is treated as immutable once passed to an op: pass a new array to change it.

State of a cluster task, from the client's point of view: READY while queued for the next
flush, RUNNING once sent (its :class:`_Remote` is in ``task.value``), DONE once fetched;
FAILED or CANCELLED as on the local backend. ``Pending.done()`` means the value is on the
client. One watcher coroutine per sent task turns the future's final status into the
runtime's accounting: the task no longer holds up closing, its failure is recorded (a kernel's
exception becomes a :class:`~dataflow.TaskError` naming the op, with the original chained; every
task that depends on it fails with that same error), and it is fetched if someone waits.

Timeline: when an instrument is attached at dispatch, the worker records the kernel's start
and end and publishes them (``Worker.log_event``); the client emits ``task_started`` and
``task_finished``/``task_failed`` with those timestamps from a relay thread named after the
worker thread, so a profiler draws one track per worker thread. The clock is the worker's
``time.time_ns()`` mapped onto the client's ``perf_counter_ns``: exact on one machine, off by
the clock skew between machines otherwise.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import os
import pickle
import queue
import threading
import time
import traceback
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ._errors import CancelledTaskError, DataflowError, TaskError
from ._instrument import ACTIVE, _disable, _methods, emit
from ._op import lookup_op, op_for_kernel
from ._runtime import (
    DASK_ADDRESS_ENV,
    Runtime,
    _collect,
    _ready_dependents_locked,
    estimate_seconds,
)
from ._task import CANCELLED, DONE, FAILED, READY, RUNNING, Cost, Pending, Task

__all__ = ["DASK_ADDRESS_ENV", "DaskRuntime", "KernelFailed", "run_op"]


_INSTALL_HINT = "pip install 'dask[distributed]>=2024.1'"
_FINAL = ("finished", "error", "cancelled")


def import_distributed() -> Any:
    """``distributed``, or a DataflowError naming the extra that installs it."""
    try:
        import distributed
    except ImportError as exc:
        raise DataflowError(
            f"backend='dask' needs dask.distributed, which is not installed ({exc}): "
            f"`{_INSTALL_HINT}` (on the client and on every worker)"
        ) from None
    return distributed


def _key_ref() -> Any:
    """``dask.task_spec.Alias``, which names a key in a graph; None before Dask had it."""
    try:
        from dask.task_spec import Alias
    except ImportError:
        return None
    return Alias


# -- the worker side -------------------------------------------------------------------------
# Everything here is pickled by reference and runs on the workers, so the workers need
# dataflow (and the ops' modules) installed, like the client.


class _Ref:
    """Placeholder for the ``slot``-th dependency (an input's value, or a scattered array)."""

    __slots__ = ("index", "slot")

    def __init__(self, slot: int, index: int | None) -> None:
        self.slot = slot
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Ref, (self.slot, self.index))


class _Call:
    """One op call as shipped: the kernel, its arguments with placeholders, and its name.

    Opaque to Dask on purpose: Dask only looks for dependencies in the ``deps`` list next to
    it, never inside the user's arguments (where a tuple or a string could be mistaken for
    a task or a key).
    """

    __slots__ = ("args", "fn", "kwargs", "name", "op", "refs", "task_id", "topic")

    def __init__(
        self,
        fn: Callable[..., Any] | str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        name: str,
        op: str,
        task_id: int,
        topic: str | None,
        refs: bool,
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.name = name
        self.op = op
        self.task_id = task_id
        self.topic = topic
        self.refs = refs

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _Call,
            (
                self.fn,
                self.args,
                self.kwargs,
                self.name,
                self.op,
                self.task_id,
                self.topic,
                self.refs,
            ),
        )


class KernelFailed(Exception):
    """A kernel raised on a worker (internal: becomes a TaskError on the client).

    Dask hands the same exception to every task downstream of the failed one, so ``task``
    names the origin, and the client gives all of them the origin's one TaskError.
    """

    def __init__(self, task: str, op: str, worker: str, exc: BaseException) -> None:
        super().__init__(task, op, worker, exc)
        self.task = task
        self.op = op
        self.worker = worker
        self.exc = exc

    def __str__(self) -> str:
        return f"{self.task} failed on {self.worker}: {type(self.exc).__name__}: {self.exc}"


# Arrays that arrive over the network (scattered, moved between workers, or inside a task)
# are often not aligned in memory, and numpy's matmul then skips BLAS for a loop 5-10x
# slower. Kernels get an aligned copy instead, made once per array and per worker process:
# this cache maps id(array) -> (weakref to it, its copy), and drops an entry with its array.
_realigned: dict[int, tuple[weakref.ref[Any], np.ndarray[Any, Any]]] = {}


def _aligned(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    key = id(a)
    hit = _realigned.get(key)
    if hit is not None and hit[0]() is a:
        return hit[1]
    copy = np.array(a)

    def forget(_: Any, key: int = key) -> None:
        entry = _realigned.get(key)
        if entry is not None and entry[0]() is None:
            del _realigned[key]

    _realigned[key] = (weakref.ref(a, forget), copy)
    return copy


def _fill(value: Any, deps: list[Any]) -> Any:
    t = type(value)
    if t is _Ref:
        dep = deps[value.slot]
        if value.index is not None:
            dep = dep[value.index]
        if type(dep) is np.ndarray and not dep.flags.aligned:
            return _aligned(dep)
        return dep
    if t is list:
        return [_fill(v, deps) for v in value]
    if t is tuple:
        return tuple(_fill(v, deps) for v in value)
    if t is dict:
        return {k: _fill(v, deps) for k, v in value.items()}
    if t is np.ndarray and not value.flags.aligned:  # came inside the task: copy it
        return np.array(value)
    return value


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc} (the original could not be pickled)")
    return exc


@functools.lru_cache(maxsize=1024)
def _kernel(qualname: str) -> Callable[..., Any]:
    """The kernel of the op registered as ``module:name``, importing its module (cached)."""
    module = qualname.split(":", 1)[0]
    importlib.import_module(module)
    op = lookup_op(qualname)
    if op is None:
        raise LookupError(f"no op {qualname!r} is declared by module {module!r} on this worker")
    return op.kernel


def run_op(call: _Call, deps: list[Any]) -> Any:
    """Run one op's kernel on a worker (the function every dataflow Dask task calls)."""
    args = _fill(call.args, deps)
    kwargs = _fill(call.kwargs, deps) if call.kwargs else None
    fn = _kernel(call.fn) if isinstance(call.fn, str) else call.fn
    start = time.time_ns() if call.topic is not None else 0
    try:
        value = fn(*args, **kwargs) if kwargs else fn(*args)
    except Exception as exc:
        from distributed import get_worker

        worker = get_worker()
        if call.topic is not None:
            _log_timing(worker, call, start, failed=True)
        where = f"dask worker {worker.address}"
        tb = "".join(traceback.format_tb(exc.__traceback__))
        exc.add_note(f"Traceback of {call.name} on the {where} (most recent call last):\n{tb}")
        raise KernelFailed(call.name, call.op, where, _picklable(exc)) from None
    if call.topic is not None:
        from distributed import get_worker

        _log_timing(get_worker(), call, start, failed=False)
    return value


def _log_timing(worker: Any, call: _Call, start: int, failed: bool) -> None:
    thread = threading.current_thread()
    msg = [call.task_id, start, time.time_ns(), failed, worker.address, thread.name]
    msg.append(threading.get_native_id())
    worker.log_event(call.topic, msg)


# -- the client side -------------------------------------------------------------------------


class _Remote:
    """A cluster task's client-side state, kept in ``task.value`` until the value is fetched."""

    __slots__ = ("fetching", "future", "key", "settled", "timed", "wanted")

    def __init__(self, key: str, timed: bool) -> None:
        self.key = key
        self.timed = timed  # sent while an instrument was attached: the worker reports its span
        self.future: Any = None  # once sent
        self.settled = False  # it ended there (finished, failed or cancelled) and was counted
        self.wanted = False  # someone waits for its value on the client
        self.fetching = False

    def __repr__(self) -> str:
        return f"<remote {self.key}>"


class _Scattered:
    """numpy arrays scattered to the cluster, by identity: each is sent once per runtime."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[Any], Any]] = {}
        self.sent = 0
        self.bytes_sent = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, arr: np.ndarray[Any, Any]) -> Any:
        entry = self._entries.get(id(arr))
        if entry is not None and entry[0]() is arr:
            return entry[1]
        return None

    def put(self, arr: np.ndarray[Any, Any], future: Any) -> None:
        key = id(arr)
        entries = self._entries

        def forget(_: Any, key: int = key) -> None:
            entry = entries.get(key)
            if entry is not None and entry[0]() is None:
                del entries[key]

        self._entries[key] = (weakref.ref(arr, forget), future)
        self.sent += 1
        self.bytes_sent += arr.nbytes

    def clear(self) -> None:
        self._entries.clear()


class _Relay:
    """Emits worker-side kernel spans to the instruments, one relay thread per worker thread.

    Instruments attribute an event to the thread that emits it (``threading.get_native_id``),
    so each remote thread gets a local stand-in named after it; see the module docstring.
    """

    def __init__(self) -> None:
        self._threads: dict[tuple[str, int], tuple[threading.Thread, queue.SimpleQueue[Any]]] = {}

    def put(self, where: tuple[str, int], name: str, events: list[tuple[str, int, Task]]) -> None:
        entry = self._threads.get(where)
        if entry is None:
            q: queue.SimpleQueue[Any] = queue.SimpleQueue()
            t = threading.Thread(target=self._run, args=(q,), name=name, daemon=True)
            t.start()
            entry = self._threads[where] = (t, q)
        entry[1].put(events)

    @staticmethod
    def _run(q: queue.SimpleQueue[Any]) -> None:
        while True:
            events = q.get()
            if events is None:
                return
            for hook, ts, task in events:
                _emit_at(ts, hook, task)
            events[0][2].inputs = ()  # the profiler has read them: release the input values

    def close(self) -> None:
        for _, q in self._threads.values():
            q.put(None)
        for t, _ in self._threads.values():
            t.join()
        self._threads.clear()


def _emit_at(ts: int, hook: str, *args: Any) -> None:
    """``emit`` with a given timestamp (an event that happened elsewhere, reported late)."""
    for inst, method in _methods(hook):
        try:
            method(ts, *args)
        except Exception as exc:
            _disable(inst, hook, exc)


class DaskRuntime(Runtime):
    """A runtime whose ops run on a Dask cluster; create it as ``Runtime(backend="dask")``.

    Args:
        address: the scheduler's address (``"tcp://host:8786"``) or a cluster object;
            default ``$DATAFLOW_DASK_ADDRESS``. The runtime connects its own asynchronous
            client on entry and closes it on exit.
        client: an asynchronous ``distributed.Client`` running on this event loop, to use
            instead of connecting (it is left open).
        local_threshold: ops whose inputs are all on the client and whose estimated time is
            under this many seconds run on the client (default 1e-3; 0 ships every op).
        scatter_bytes: numpy arguments of at least this size are scattered once per runtime
            and reused by identity (default 16 KiB); smaller ones travel with each task.
        connect_timeout: seconds to wait for the scheduler (default 10).
        **local: the local runtime's options (``interop_threads``, ``intraop_threads``,
            ``private_pool``, ...); they apply to the work that stays on the client.

    Counters (for tests and ``repr``): ``sent`` ops shipped, ``remote_done`` computed there,
    ``fetched`` values brought back, ``local_ops`` ops kept on the client.
    """

    def __init__(
        self,
        *,
        backend: str | None = None,
        address: Any = None,
        client: Any = None,
        local_threshold: float = 1e-3,
        scatter_bytes: int = 16384,
        connect_timeout: float = 10.0,
        simulate: Callable[[Task], Any] | None = None,
        **local: Any,
    ) -> None:
        if simulate is not None:
            raise DataflowError("simulate= is for the local backend; it cannot run on Dask")
        if backend not in (None, "dask"):
            raise ValueError(f"DaskRuntime is the 'dask' backend, got backend={backend!r}")
        import_distributed()
        # interop_threads, intraop_threads, private_pool, ...: the client side's, as local.
        super().__init__(**local)
        if address is not None and client is not None:
            raise ValueError("give the Dask backend address= or client=, not both")
        if address is None and client is None:
            address = os.environ.get(DASK_ADDRESS_ENV) or None
            if address is None:
                raise DataflowError(
                    "backend='dask' needs the scheduler: address='tcp://host:8786', "
                    f"client=<an asynchronous distributed.Client>, or ${DASK_ADDRESS_ENV} "
                    "(which `dataflow run --dask ADDRESS` sets)"
                )
        if not local_threshold >= 0:
            raise ValueError(f"local_threshold must be >= 0 seconds, got {local_threshold!r}")
        if scatter_bytes < 0:
            raise ValueError(f"scatter_bytes must be >= 0, got {scatter_bytes!r}")
        self.address: Any = address
        self.client: Any = client
        self._own_client = client is None
        self.local_threshold = float(local_threshold)
        self.scatter_bytes = int(scatter_bytes)
        self.connect_timeout = connect_timeout
        self.token = uuid.uuid4().hex[:8]
        self._topic = f"dataflow-timing-{self.token}"
        self._subscribed = False
        # Tasks queued for the next flush, and whether a flush is scheduled or running.
        self._outbox: list[Task] = []
        self._flush_scheduled = False
        # Sent and not settled: task id -> task (to cancel them all when the body fails).
        self._remote: dict[int, Task] = {}
        self._scattered = _Scattered()
        # Failures by the name of the task whose kernel raised: one TaskError for all of them.
        self._errors: dict[str, TaskError] = {}
        # Tasks sent while an instrument was attached, waiting for their timing event.
        self._timed: dict[int, Task] = {}
        self._timed_drained: asyncio.Future[None] | None = None
        self._relay = _Relay()
        self._clock = 0
        # Coroutines the runtime started (flushes, watchers, fetches): awaited on exit.
        self._bg: set[asyncio.Task[Any]] = set()
        self.sent = 0
        self.remote_done = 0
        self.fetched = 0
        self.local_ops = 0

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self.loop else "new")
        address = getattr(self.address, "scheduler_address", self.address)
        if address is None and self.client is not None:
            address = getattr(getattr(self.client, "scheduler", None), "address", "client")
        return (
            f"<Runtime dask {state} address={address} sent={self.sent} "
            f"remote={len(self._remote)} queued={len(self._outbox)} fetched={self.fetched} "
            f"local={self.local_ops} inflight={self._inflight} forks={len(self._forks)}>"
        )

    @property
    def scattered(self) -> int:
        """How many arrays were scattered to the cluster (each once)."""
        return self._scattered.sent

    # -- lifetime -----------------------------------------------------------------------------

    async def __aenter__(self) -> DaskRuntime:
        await super().__aenter__()
        try:
            await self._connect()
        except BaseException:
            self._close()
            raise
        self._clock = time.time_ns() - time.perf_counter_ns()
        return self

    async def _connect(self) -> None:
        distributed = import_distributed()
        if self.client is not None:
            client = self.client
            loop = getattr(getattr(client, "loop", None), "asyncio_loop", None)
            if not getattr(client, "asynchronous", False) or loop is not self.loop:
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
                f"cannot connect to the Dask scheduler at {self.address!r}: "
                f"{type(exc).__name__}: {exc}. Is `dask scheduler` running there, and "
                "reachable from this machine?"
            ) from exc

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        import anyio

        try:
            await super().__aexit__(exc_type, exc, tb)
        finally:
            with anyio.CancelScope(shield=True):
                await self._shutdown()

    def _cancel_everything(self) -> None:
        super()._cancel_everything()
        futures = [t.value.future for t in self._remote.values() if type(t.value) is _Remote]
        if futures and self.client is not None:
            self._spawn(self._cancel_futures(futures))

    async def _cancel_futures(self, futures: list[Any]) -> None:
        if self.client is not None:
            await self.client.cancel(futures)

    async def _shutdown(self) -> None:
        """After the graph drained: settle the coroutines, timings and the client."""
        while self._bg:
            await asyncio.wait(set(self._bg))
        if self._timed:
            # Timing events travel worker -> scheduler -> client next to the results; give
            # the stragglers a moment, then drop what did not come (a worker died).
            self._timed_drained = self.loop.create_future()  # type: ignore[union-attr]
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
                await client.close()
        except Exception as exc:  # the scheduler went away: nothing is left to release
            from ._log import logger

            logger.warning("closing the Dask client failed", error=repr(exc))

    def _spawn(self, coro: Any) -> None:
        """Run a coroutine on the runtime's loop, owned: awaited before the runtime closes."""
        task = self.loop.create_task(coro)  # type: ignore[union-attr]
        self._bg.add(task)
        task.add_done_callback(self._bg_done)

    def _bg_done(self, task: asyncio.Task[Any]) -> None:
        self._bg.discard(task)
        if not task.cancelled() and task.exception() is not None:
            from ._log import logger

            exc = task.exception()
            logger.error("dask backend coroutine failed", error=repr(exc), exc_info=exc)

    def _call_on_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        if threading.get_ident() == self._loop_tid:
            fn(*args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)  # type: ignore[union-attr]

    # -- dispatch -----------------------------------------------------------------------------

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
        """Place the task (see the module docstring): on the client, or queue it for Dask.

        ``priority`` and ``timeout`` apply when the task stays on the client: Dask orders the
        tasks it runs itself, and a kernel running on a worker is not timed out.
        """
        if self._closed:
            raise DataflowError(f"{op}: this runtime is closed; start a new one")
        inputs: list[Task] = []
        for a in args:
            _collect(a, inputs)
        if kwargs:
            for a in kwargs.values():
                _collect(a, inputs)
        remote_inputs = False
        local_pending = False
        for t in inputs:
            if t.state < DONE:
                if type(t.value) is _Remote:
                    remote_inputs = True
                else:
                    local_pending = True
        if ctx is not None or local_pending:
            return self._submit_local(
                fn, args, kwargs, op, spec, cost, inline, ctx, priority, timeout, inputs
            )
        if not remote_inputs and (
            inline is True
            or (
                inline is None
                and cost is not None
                and estimate_seconds(cost) < self.local_threshold
            )
        ):
            return self._submit_local(
                fn, args, kwargs, op, spec, cost, None, None, priority, timeout, ()
            )
        return self._submit_remote(fn, args, kwargs, op, spec, cost, inputs)

    def _submit_local(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        op: str,
        spec: Any,
        cost: Cost | None,
        inline: bool | None,
        ctx: contextvars.Context | None,
        priority: float | None,
        timeout: float | None,
        inputs: Any,
    ) -> Task:
        # Inputs still on the cluster are fetched; the local graph parks the task on them.
        for t in inputs:
            rem = t.value
            if type(rem) is _Remote and t.state < DONE:
                self._call_on_loop(self._want, t)
        self.local_ops += 1
        return super().submit(fn, args, kwargs, op, spec, cost, inline, ctx, priority, timeout)

    def _submit_remote(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        op: str,
        spec: Any,
        cost: Cost | None,
        inputs: list[Task],
    ) -> Task:
        task = Task(fn, args, kwargs, op, self, spec, cost, None)
        if inputs:
            task.inputs = tuple(inputs)
        timed = bool(ACTIVE)
        if timed:
            emit("task_created", task)
            self._timed[task.id] = task
        task.value = _Remote(f"{op}-{self.token}-{task.id}", timed)
        with self._lock:
            self._inflight += 1
            for t in inputs:
                if t.state > DONE:  # an input already failed: fail unrun, with its error
                    self._fail_locked(task, t.error)
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
            with self._lock:
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
        threshold = self.scatter_bytes
        cache = self._scattered
        new: dict[int, np.ndarray[Any, Any]] = {}
        for task in batch:
            if task.state == READY:
                for a in _arrays(task.args, task.kwargs, threshold):
                    if cache.get(a) is None:
                        new[id(a)] = a
        if new:
            arrays = list(new.values())
            futures = await self.client.scatter(arrays, hash=False)
            for a, f in zip(arrays, futures, strict=True):
                cache.put(a, f)
        ref = _key_ref()
        keys: list[str] = []
        calls: list[_Call] = []
        deps: list[list[Any]] = []
        sent: list[Task] = []
        for task in batch:
            if task.state != READY:  # cancelled, or an input failed, while queued
                continue
            if self._cancelling:
                self._cancel_unsent(task)
                continue
            if self._input_failed(task):
                continue
            rem: _Remote = task.value
            if rem.timed and not self._subscribed:
                self.client.subscribe_topic(self._topic, self._on_timing)
                self._subscribed = True
            try:
                call, slots = self._encode(task, ref)
            except Exception as exc:
                self._fail_unsent(task, exc)
                continue
            if ref is None:  # older Dask: name tasks of this batch by a future made early
                rem.future = import_distributed().Future(rem.key, self.client)
            keys.append(rem.key)
            calls.append(call)
            deps.append(slots)
            sent.append(task)
        if not sent:
            return
        try:
            futures = self.client.map(run_op, calls, deps, key=keys, pure=False)
        except Exception:
            # One of them cannot be sent (an argument that does not pickle): send them one
            # by one, so only that one (and what depends on it) fails.
            ok = []
            for task, call, slots in zip(sent, calls, deps, strict=True):
                if self._input_failed(task):
                    continue
                try:
                    (fut,) = self.client.map(
                        run_op, [call], [slots], key=[task.value.key], pure=False
                    )
                except Exception as exc:
                    self._fail_unsent(task, exc)
                    continue
                ok.append((task, fut))
            pairs = ok
        else:
            pairs = list(zip(sent, futures, strict=True))
        self._sent(pairs)

    def _input_failed(self, task: Task) -> bool:
        failed = next((t for t in task.inputs if t.state > DONE), None)
        if failed is None:
            return False
        with self._lock:
            self._timed.pop(task.id, None)
            self._fail_locked(task, failed.error)
        return True

    def _sent(self, pairs: list[tuple[Task, Any]]) -> None:
        watched: list[tuple[Task, _Remote]] = []
        dropped: list[Any] = []
        with self._lock:
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
            if ACTIVE and not rem.timed:
                emit("task_ready", task)
            if rem.wanted and not rem.fetching:
                self._spawn(self._fetch(task, rem))
        # One watcher per batch (a coroutine per task would cost more than it saves): it
        # settles the tasks in dispatch order; a fetch settles an awaited one earlier.
        self._spawn(self._watch(watched))

    def _encode(self, task: Task, ref: Any) -> tuple[_Call, list[Any]]:
        """The task as a _Call, and its dependencies: cluster inputs and scattered arrays."""
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

        def enc(v: Any) -> Any:
            if isinstance(v, Pending):
                t = v._task
                if t.state == DONE:  # on the client: ship the value
                    return enc(v.result())
                rem = t.value
                assert type(rem) is _Remote, (t, rem)
                return _Ref(slot(rem.key, rem.future), v._index)
            tv = type(v)
            if tv is list:
                return [enc(x) for x in v]
            if tv is tuple:
                return tuple(enc(x) for x in v)
            if tv is dict:
                return {k: enc(x) for k, x in v.items()}
            if isinstance(v, np.ndarray) and v.nbytes >= threshold:
                fut = cache.get(v)
                if fut is not None:
                    return _Ref(slot(fut.key, fut), None)
            return v

        args = tuple(enc(a) for a in task.args)  # type: ignore[union-attr]
        kwargs = {k: enc(v) for k, v in task.kwargs.items()} if task.kwargs else None
        fn: Any = task.fn
        assert fn is not None
        # A declared op's kernel travels as its registry name: it may not pickle by reference
        # (a closure made by a factory), and by value it costs kilobytes on every task.
        op = op_for_kernel(fn, task.op)
        if op is not None and op.module != "__main__":
            fn = op.qualname
        topic = self._topic if task.value.timed else None
        call = _Call(fn, args, kwargs, task.name, task.op, task.id, topic, bool(slots))
        return call, slots

    # -- outcomes -----------------------------------------------------------------------------

    async def _watch(self, watched: list[tuple[Task, _Remote]]) -> None:
        """Settle a batch's tasks as they end: account for them, record failures."""
        for task, rem in watched:
            if await self._outcome(task, rem):
                with self._lock:
                    self._settle_locked(task, rem)
                    if task.state < DONE and not rem.timed:
                        task.inputs = ()
                self.remote_done += 1

    async def _outcome(self, task: Task, rem: _Remote) -> bool:
        """Wait until the task's future ends; True when it finished, else fail the task."""
        fut = rem.future
        while fut.status not in _FINAL:
            await fut._state.wait()  # what distributed.wait itself waits on
        status = fut.status
        if status == "finished":
            return True
        if status == "error":
            exc = await fut.exception()
            tb = await fut.traceback()
            self._failed(task, rem, exc, tb)
        else:
            self._cancelled(task, rem)
        return False

    def _settle_locked(self, task: Task, rem: _Remote) -> None:
        """A sent task ended (once): it no longer holds up the runtime's closing."""
        if rem.settled:
            return
        rem.settled = True
        self._remote.pop(task.id, None)
        self._inflight -= 1
        if self._inflight == 0 and self._drained is not None:
            self._wake_locked([self._drained])

    def _failed(self, task: Task, rem: _Remote, exc: BaseException, tb: Any) -> None:
        if task.state >= DONE:  # the watcher and a fetch both saw it
            return
        if isinstance(exc, KernelFailed):
            err = self._errors.get(exc.task)
            if err is None:
                orig = exc.exc
                err = TaskError(
                    f"{exc.task} failed on the {exc.worker}: {type(orig).__name__}: {orig}",
                    task=exc.task,
                    op=exc.op,
                )
                err.__cause__ = orig
                self._errors[exc.task] = err
                self._failures.append(err)
            ran = exc.task == task.name
        else:
            # Not the kernel: the task could not run there (e.g. a module the workers lack).
            hint = ""
            if isinstance(exc, ImportError):
                hint = (
                    " (the workers need the same packages as the client: dataflow, the ops' "
                    "modules and the code defining the kernels)"
                )
            err = TaskError(
                f"{task.name} failed on the Dask cluster: {type(exc).__name__}: {exc}{hint}",
                task=task.name,
                op=task.op,
            )
            err.__cause__ = exc.with_traceback(tb) if tb is not None else exc
            self._failures.append(err)
            ran = False
        self._finish_failed(task, rem, err, ran)

    def _cancelled(self, task: Task, rem: _Remote) -> None:
        err: BaseException | None = next(
            (t.error for t in task.inputs if t.state == CANCELLED and t.error is not None), None
        )
        if err is None:
            why = "its runtime was closing" if self._cancelling else "it was cancelled on Dask"
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
        with self._lock:
            self._settle_locked(task, rem)
            if task.state >= DONE:
                return
            task.state = CANCELLED if cancelled else FAILED
            task.error = err
            task.value = None
            task.fn = task.args = task.kwargs = None
            if not reports:
                task.inputs = ()
            if task.waiters is not None:
                self._wake_locked(task.waiters)
                task.waiters = None
            deps, task.dependents = task.dependents, None
            for d in deps or ():
                self._fail_locked(d, err)
        if ACTIVE and not reports:
            emit("task_cancelled" if cancelled else "task_failed", task)

    def _fail_unsent(self, task: Task, exc: BaseException) -> None:
        err = TaskError(
            f"{task.name} could not be sent to the Dask cluster: {type(exc).__name__}: {exc}",
            task=task.name,
            op=task.op,
        )
        err.__cause__ = exc
        with self._lock:
            self._timed.pop(task.id, None)
            self._failures.append(err)
            self._fail_locked(task, err)

    def _cancel_unsent(self, task: Task) -> None:
        err = CancelledTaskError(f"{task.name} was not run: its runtime was closing")
        with self._lock:
            self._timed.pop(task.id, None)
            self._fail_locked(task, err)

    def cancel_task(self, task: Task) -> bool:
        """Cancel a task not yet computed; on the cluster, its dependents are cancelled too."""
        rem = task.value
        if type(rem) is not _Remote:
            return super().cancel_task(task)
        err = CancelledTaskError(f"{task.name} was cancelled before it ran")
        with self._lock:
            if task.state == READY:  # still queued here: it is never sent
                self._timed.pop(task.id, None)
                self._fail_locked(task, err)
                return True
            if task.state != RUNNING or rem.future.status != "pending":
                return False
        self._finish_failed(task, rem, err, ran=False)
        self._call_on_loop(self._spawn, self._cancel_futures([rem.future]))
        return True

    # -- values back to the client ------------------------------------------------------------

    def completion(self, task: Task) -> asyncio.Future[None]:
        fut = super().completion(task)
        if not fut.done() and type(task.value) is _Remote:
            self._want(task)
        return fut

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
        if not await self._outcome(task, rem):
            return
        try:
            value = await self.client.gather(rem.future)
        except Exception as exc:  # computed, then lost (its worker died) and not recomputed
            err = TaskError(
                f"{task.name}: its value could not be fetched from the Dask cluster: "
                f"{type(exc).__name__}: {exc}",
                task=task.name,
                op=task.op,
            )
            err.__cause__ = exc
            self._failures.append(err)
            self._finish_failed(task, rem, err, ran=False)
            return
        self.fetched += 1
        with self._lock:
            self._settle_locked(task, rem)
            if task.state >= DONE:
                return
            task.value = value
            task.state = DONE
            task.fn = task.args = task.kwargs = None
            if not rem.timed:
                task.inputs = ()
            deps, task.dependents = task.dependents, None
            if deps is not None:
                _ready_dependents_locked(deps)
            if task.waiters is not None:
                self._wake_locked(task.waiters)
                task.waiters = None

    # -- timings ------------------------------------------------------------------------------

    def _on_timing(self, event: tuple[float, Any]) -> None:
        """A worker reported a kernel's span (subscribe_topic handler, on the loop)."""
        task_id, start, end, failed, worker, thread_name, native_id = event[1]
        task = self._timed.pop(task_id, None)
        if task is not None:
            clock = self._clock
            done = "task_failed" if failed else "task_finished"
            self._relay.put(
                (worker, native_id),
                f"dask {worker} {thread_name}",
                [("task_started", start - clock, task), (done, end - clock, task)],
            )
        drained = self._timed_drained
        if not self._timed and drained is not None and not drained.done():
            drained.set_result(None)


def _arrays(args: Any, kwargs: Any, threshold: int) -> list[np.ndarray[Any, Any]]:
    """The numpy arrays to scatter among a task's arguments (client-side values included)."""
    out: list[np.ndarray[Any, Any]] = []

    def walk(v: Any) -> None:
        if isinstance(v, Pending):
            if v._task.state == DONE:
                walk(v.result())
            return
        tv = type(v)
        if tv is list or tv is tuple:
            for x in v:
                walk(x)
        elif tv is dict:
            for x in v.values():
                walk(x)
        elif isinstance(v, np.ndarray) and v.nbytes >= threshold:
            out.append(v)

    walk(args)
    if kwargs:
        walk(kwargs)
    return out
