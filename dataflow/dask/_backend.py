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
flush, RUNNING once sent (its :class:`Remote` is in ``task.value``), DONE once fetched;
FAILED or CANCELLED as on the local backend. ``Pending.done()`` means the value is on the
client. One watcher coroutine per sent batch turns each future's final status into the
scheduler's accounting: the task no longer holds up closing, its failure is recorded (a
kernel's exception becomes a :class:`~dataflow.TaskError` naming the op, with the original
chained; every task that depends on it fails with that same error), and it is fetched if
someone waits. The Dask client is asyncio-only, so this backend runs on asyncio (or uvloop).

Lost workers (``_lost``): a task Dask dropped because data it needs was lost with a worker
is sent again, with its lost inputs and the arrays lost, by :meth:`DaskBackend._revive`;
where that cannot work it fails with ``WorkerLostError``, never as a cancellation.

The layers, each a module and a class built on the one before (as the local scheduler's):

* ``_base``: :class:`~dataflow.dask._base.BackendBase`, the state (what the backend was given,
  the tasks queued and sent, the arrays scattered, the failures and the timings awaited),
  the coroutines it owns and the kernel spans workers report;
* ``_outcomes``: how a sent task ends on the client: settled, failed, cancelled, or its value
  fetched;
* ``_ship``: tasks queued for the next flush, their arrays scattered, a batch sent;
* ``_revive``: what Dask dropped with a lost worker, sent again;
* ``_backend`` (here): :func:`place` and :class:`DaskBackend`, the backend protocol
  (``open``, ``submit``, ``completion``, ``cancel``, ``join``, ``close``).

Beside them, plain data and pure functions: ``_remote`` (a cluster task's client-side state),
``_scatter`` (the arrays scattered, by identity), ``_client`` (importing ``distributed``,
closing a client quietly), ``_lost`` (a loss told from a cancellation), ``_timing`` (the
relay of worker spans) and ``_worker`` (the worker side).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

from .. import _backend as backends
from .._errors import CancelledTaskError, DataflowError, describe
from .._log import logger
from .._pool import GRAPH_LOCK
from .._signature import Signature
from .._task import DONE, READY, RUNNING, Task
from ._client import HangUpQuietly, import_distributed
from ._remote import Remote
from ._revive import Revival

__all__ = ["DaskBackend", "place"]


def place(sig: Signature, inputs: tuple[Task, ...], local_threshold: float, forked: bool) -> str:
    """Where a task runs: ``"local"`` (the client's scheduler) or ``"remote"`` (the cluster).

    See the module docstring. ``forked``: a forked plain function (it runs user code with the
    caller's context variables, so it stays on the client).
    """
    remote_inputs = local_pending = False
    for t in inputs:
        if t.state < DONE:
            if type(t.value) is Remote:
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


async def _close_quietly(client: Any) -> None:
    """Close a client that failed to connect (nothing to release: only its own tasks)."""
    with contextlib.suppress(Exception):  # the connection error is the one to report
        await client.close()


class DaskBackend(Revival):
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

    # -- lifetime -----------------------------------------------------------------------------

    async def open(self) -> None:
        """Start: connect the client (or check the one given) on the runtime's loop."""
        host = self.runtime.host
        assert host is not None
        if host.library != "asyncio":
            raise DataflowError(
                "the Dask backend runs on asyncio (or uvloop): Dask's client is asyncio-only"
            )
        self._loop = host.key  # type: ignore[assignment]
        self._sched = self.runtime._sched
        self._sched.drop_sent = self._drop_sent_locked  # a cancelled request's sent tasks
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
        # A cluster object (a LocalCluster, say) is connected to by its scheduler's address:
        # given the object, distributed's Client joins the cluster's own event loop (a thread
        # of its own for a cluster started synchronously), and so is not asynchronous on
        # this one: every fetch failed (a TypeError), or a run hung.
        address = self.address
        if not isinstance(address, str):
            address = getattr(address, "scheduler_address", address)
        client = None
        try:
            client = distributed.Client(
                address,
                asynchronous=True,
                set_as_default=False,
                timeout=self.connect_timeout,
            )
            self.client = await client
        except Exception as exc:
            if client is not None:  # half started: close it here, or its __del__ warns
                await _close_quietly(client)
            err = DataflowError(
                f"cannot connect to the Dask scheduler at {self.address!r}: {describe(exc)}. "
                "Is `dask scheduler` running there, and reachable from this machine?"
            )
            err.dask_address = self.address  # type: ignore[attr-defined]  # (dataflow run --dask)
            raise err from exc
        hook = backends.on_dask_connected
        if hook is not None and self.address == os.environ.get(backends.DASK_ADDRESS_ENV):
            hook(self.address)

    def cancel_everything(self) -> None:
        """The body failed: cancel every task sent to the cluster."""
        futures = [t.value.future for t in self._remote.values() if type(t.value) is Remote]
        if futures and self.client is not None:
            self._spawn(self._cancel_futures(futures))

    async def join(self) -> None:
        """Nothing of its own to wait for (the scheduler's join counts the remote tasks)."""

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
        self._release_unfetched()
        self._scattered.clear()
        self._errors.clear()
        client, self.client = self.client, (None if self._own_client else self.client)
        if client is None:
            return
        try:
            if self._subscribed:
                client.unsubscribe_topic(self._topic)
                # Dask's unsubscribe_topic tells the scheduler but keeps the handler, this
                # backend's bound method: a client given with client= (left open) held every
                # runtime that reported kernel spans through it until the client closed.
                handlers = getattr(client, "_event_handlers", None)
                if isinstance(handlers, dict):
                    handlers.pop(self._topic, None)
            if self._own_client:
                async with HangUpQuietly(client):
                    await client.close()
        except Exception as exc:  # the scheduler went away: nothing is left to release
            logger.warning("closing the Dask client failed", error=repr(exc))

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

        ``priority`` applies when the task stays on the client: Dask orders the tasks it runs
        itself. ``timeout`` applies on either side: a kernel on the cluster runs under it on
        its worker (``_worker.run_op``).
        """
        sched = self._sched
        if sched.closed:
            raise DataflowError(f"{sig.name}: this runtime is closed; start a new one")
        if place(sig, inputs, self.local_threshold, sig.op is None) == "local":
            # Inputs still on the cluster are fetched; the local graph parks the task on them.
            for t in inputs:
                if type(t.value) is Remote and t.state < DONE:
                    self._call_on_loop(self._want, t)
            self.local_ops += 1
            return sched.submit(
                sig, fn, args, kwargs, inputs, ready, priority, timeout, values, light
            )
        return self._submit_remote(sig, fn, args, kwargs, inputs, timeout)

    # -- cancel, completion -------------------------------------------------------------------

    def cancel(self, task: Task) -> bool:
        """Cancel a task not yet computed; on the cluster, its dependents are cancelled too."""
        rem = task.value
        if type(rem) is not Remote:
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

    def completion(self, task: Task) -> Any:
        """An awaitable that completes when ``task`` is done (a remote one's value fetched)."""
        if type(task.value) is not Remote:
            return self._sched.completion(task)
        waiter = self._sched.waiter(task)  # never run here: it is the cluster's to run
        if task.state < DONE:
            self._want(task)
        return waiter
