"""Shipping tasks to the cluster: queued at dispatch, sent per flush (see
:mod:`dataflow.dask._backend`, "Shipping").

``_submit_remote`` queues a task placed on the cluster and, for the first of a batch, posts
one flush to the loop. The flush (``_flush``, ``_send``) runs when the program next suspends:
it sends again the inputs Dask dropped meanwhile (``_revive``), scatters the batch's new
arrays (``_scatter``) and sends its tasks as one ``client.map`` (``_map``), each encoded as a
:class:`~dataflow.dask._worker.Call` whose cluster inputs are passed by key (``_encode``).
``_sent`` hands what was sent to the watchers of ``_outcomes``. A task that cannot be sent
(an argument that does not pickle) fails alone, with what depends on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np

from .._errors import CancelledTaskError, TaskError, describe
from .._instrument import ACTIVE
from .._pool import GRAPH_LOCK
from .._registry import op_for_kernel
from .._signature import Signature
from .._task import DONE, READY, RUNNING, Pending, Task
from .._walk import replace
from ._client import import_distributed, key_ref
from ._outcomes import Outcomes
from ._remote import Remote, failed_input, was_lost
from ._scatter import scattered_arrays
from ._worker import Call, Ref, run_op

__all__ = ["Shipping"]

_SCATTER_TRIES = 3  # a scatter that meets a dying worker is tried again (0.1 s, then 0.2 s)


class Shipping(Outcomes):
    """Tasks placed on the cluster: queued, then sent a batch at a time."""

    # -- dispatch -----------------------------------------------------------------------------

    def _submit_remote(
        self,
        sig: Signature,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        inputs: tuple[Task, ...],
        timeout: float | None = None,
    ) -> Task:
        task = Task(sig, fn, args, kwargs, self.runtime, inputs)
        timed = bool(ACTIVE) or self._sched.watching
        if timed:
            self._sched.emit("task_created", task)
            self._timed[task.id] = task
        task.value = Remote(f"{sig.name}-{self.token}-{task.id}", timed, timeout)
        sched = self._sched
        # The request dispatching it (a coroutine on the loop): if it is cancelled, what it
        # sent that nobody else wants is cancelled on the cluster (``_drop_sent_locked``).
        owner = sched.request()
        with GRAPH_LOCK:
            sched.inflight += 1
            for t in inputs:
                if t.state > DONE:  # an input already failed: fail unrun, with its error
                    sched._fail_locked(task, t.error)
                    self._timed.pop(task.id, None)
                    return task
            if owner is not None:
                owner.add(task)
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
        lost = [t for task in batch if task.state == READY for t in task.inputs if was_lost(t)]
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
            rem: Remote = task.value
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
            for a in scattered_arrays(task.args, task.kwargs, self.scatter_bytes):
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
        ``Remote.key``; returns (task, future) pairs. A task that cannot be sent (an argument
        that does not pickle) or whose input failed is given to ``fail`` with its error."""
        ref = key_ref()
        keys: list[str] = []
        calls: list[Call] = []
        deps: list[list[Any]] = []
        sent: list[Task] = []
        for task in tasks:
            failed = failed_input(task)
            if failed is not None:
                fail(task, failed.error)  # type: ignore[arg-type]
                continue
            rem: Remote = task.value
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
                failed = failed_input(task)
                if failed is not None:
                    fail(task, failed.error)  # type: ignore[arg-type]
                    continue
                try:
                    (fut,) = self.client.map(
                        run_op, [call], [slots], key=[task.value.key], pure=False
                    )
                except Exception as exc:
                    hint = " (an op's arguments must pickle to travel to the workers)"
                    fail(task, self._unsendable(task, _pickling_error(call, exc), hint))
                    continue
                pairs.append((task, fut))
            return pairs
        return list(zip(sent, futures, strict=True))

    def _unsendable(self, task: Task, exc: BaseException, hint: str = "") -> TaskError:
        """The error of a task that could not be sent (``exc``: why)."""
        err = TaskError(
            f"{task.name} could not be sent to the Dask cluster: {describe(exc)}{hint}",
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

    def _sent(self, pairs: list[tuple[Task, Any]]) -> None:
        watched: list[tuple[Task, Remote]] = []
        dropped: list[Any] = []
        with GRAPH_LOCK:
            for task, fut in pairs:
                rem: Remote = task.value
                rem.future = fut
                if task.state == READY:
                    task.state = RUNNING
                    self._remote[task.id] = task
                    self._sent_tasks.add(task)
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
                assert type(rem) is Remote, (t, rem)
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
        rem: Remote = task.value
        topic = self._topic if rem.timed else None
        call = Call(
            fn, args, kwargs, task.name, sig.name, task.id, topic, bool(slots), sig.spec, check,
            rem.timeout,
        )  # fmt: skip
        return call, slots

    def _fail_unsent(self, task: Task, exc: BaseException) -> None:
        self._fail_queued(task, self._unsendable(task, exc))

    def _cancel_unsent(self, task: Task) -> None:
        err = CancelledTaskError(f"{task.name} was not run: its runtime was closing")
        with GRAPH_LOCK:
            self._timed.pop(task.id, None)
            self._sched._fail_locked(task, err)


def _pickling_error(call: Call, exc: BaseException) -> BaseException:
    """Why ``call`` cannot be sent: the error pickling it alone raises (cloudpickle, Dask's
    last resort), which names what does not pickle (``cannot pickle '_thread.lock'
    object``); ``exc`` when it pickles. Dask's own error names its graph expression instead
    (``Could not serialize object of type _MapExpr``), with the cause two exceptions down."""
    try:
        import cloudpickle

        cloudpickle.dumps(call)
    except Exception as own:
        return own
    return exc
