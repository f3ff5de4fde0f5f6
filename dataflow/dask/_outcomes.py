"""How a sent task ends on the client: settled, failed, cancelled, or its value fetched (see
:mod:`dataflow.dask._backend`, "State of a cluster task").

One watcher coroutine per sent batch (:meth:`Outcomes._watch`) waits for each future's final
status, in dispatch order, and turns it into the scheduler's accounting: the task no longer
holds up closing (``_settle_locked``, once, whichever of the watcher and a fetch sees the end
first), and a failure becomes the error of the task and of every task that depends on it
(``_failed``, ``_cancelled``, ``_finish_failed``). A task Dask dropped because a worker was
lost is sent again (``_revive``, a layer up) and waited for again. A value comes back to the
client (``_want``, ``_fetch``) only when someone there waits for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _graphstate as gs
from .._errors import CancelledTaskError, TaskError, describe, task_error
from .._instrument import ACTIVE
from .._pool import GRAPH_LOCK
from .._scheduler import Scheduler
from .._task import CANCELLED, DONE, FAILED, Task
from ._base import BackendBase
from ._lost import cancel_reason, killed_worker_error
from ._remote import Remote, task_inputs, was_lost
from ._worker import KernelFailed

__all__ = ["Outcomes"]

_FINAL = ("finished", "error", "cancelled")
_PACKAGES_HINT = (
    " (the workers need the same packages as the client: dataflow, the ops' modules and the "
    "code defining the kernels)"
)


class Outcomes(BackendBase):
    """The end of each sent task: accounted for, failed with its dependents, or fetched."""

    #: How many failures' errors are kept to share with their dependents (``_remember``).
    ERRORS_KEPT = 256

    if TYPE_CHECKING:
        # A layer up (``_revive``): it sends again through ``_ship``, which hands what it
        # sent to the watchers here; this declaration closes that loop for the type checker.
        async def _revive(self, tasks: list[Task]) -> None: ...

    # -- outcomes -----------------------------------------------------------------------------

    async def _watch(self, watched: list[tuple[Task, Remote]]) -> None:
        """Settle a batch's tasks as they end: account for them, record failures."""
        for task, rem in watched:
            if await self._outcome(task, rem):
                with GRAPH_LOCK:
                    self._settle_locked(task, rem)
                    if task.state < DONE and not rem.timed:
                        task.inputs = ()
                self.remote_done += 1

    async def _outcome(self, task: Task, rem: Remote) -> bool:
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
                if not isinstance(exc, KernelFailed) and type(exc).__name__ != "KilledWorker":
                    await self._inputs_ended(task)  # one of them may be the origin
                self._failed(task, rem, exc, tb)
                return False
            if was_lost(task) and not self._sched.cancelling:
                await self._revive([task])
                if rem.future is not fut and task.state < DONE:
                    continue
            self._cancelled(task, rem)
            return False

    async def _inputs_ended(self, task: Task) -> None:
        """Wait until the task's inputs on the cluster, and those of the inputs that erred,
        ended: Dask fails a task and its dependents with one exception, but reports them in
        no particular order, and ``_failed`` blames the first of the chain."""
        for t in task_inputs(task):
            rem = t.value
            if type(rem) is not Remote or rem.future is None:
                continue
            fut = rem.future
            while t.state < DONE and fut.status not in _FINAL:
                await fut._state.wait()
            if fut.status == "error":
                await self._inputs_ended(t)

    def _settle_locked(self, task: Task, rem: Remote) -> None:
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

    def _failed(self, task: Task, rem: Remote, exc: BaseException, tb: Any) -> None:
        if task.state >= DONE:  # the watcher and a fetch both saw it
            return
        if isinstance(exc, KernelFailed):
            err = self._errors.get(exc.task)
            if err is None:
                orig = exc.exc
                hint = _PACKAGES_HINT if getattr(exc, "loading", False) else ""
                err = task_error(
                    orig,
                    f"{exc.task} failed on the {exc.worker}: {describe(orig)}{hint}",
                    task=exc.task,
                    op=exc.op,
                )
                self._remember(exc.task, err)
                self._sched.failures.append(err)
            ran = exc.task == task.name
        elif type(exc).__name__ == "KilledWorker":
            # Workers kept dying while running it (or a task it depends on): Dask gave up.
            origin = str(getattr(exc, "task", rem.key))
            err = self._errors.get(origin)
            if err is None:
                name, op = (task.name, task.op) if origin == rem.key else self._named(origin)
                err = killed_worker_error(name, op, exc)
                self._remember(origin, err)
                self._sched.failures.append(err)
            ran = False
        else:
            # Not the kernel: the task could not run there (e.g. a batch whose graph the
            # scheduler could not unpickle). Dask gives the task the exception of the input
            # that failed first: if an input failed with it too, its error is this task's.
            shared = self._input_error(task, exc, tb)
            if shared is not None:
                self._finish_failed(task, rem, shared, ran=False)
                return
            hint = _PACKAGES_HINT if isinstance(exc, ImportError) else ""
            err = TaskError(
                f"{task.name} failed on the Dask cluster: {describe(exc)}{hint}",
                task=task.name,
                op=task.op,
            )
            err.__cause__ = exc.with_traceback(tb) if tb is not None else exc
            self._sched.failures.append(err)
            ran = False
        self._finish_failed(task, rem, err, ran)

    def _remember(self, origin: str, err: TaskError) -> None:
        """Keep ``err`` as the one error of the tasks that fail with ``origin``'s failure.

        Dask reports those tasks soon after one another, so only the last
        :attr:`ERRORS_KEPT` origins are kept: a long-lived runtime (a server whose requests
        fail on the cluster) kept every failure, with its traceback and the arrays its
        frames held, until it closed."""
        errors = self._errors
        if len(errors) >= self.ERRORS_KEPT:
            del errors[next(iter(errors))]  # the oldest
        errors[origin] = err

    def _input_error(self, task: Task, exc: BaseException, tb: Any) -> BaseException | None:
        """The error of an input of ``task`` that failed on the cluster with ``exc`` too (its
        origin's: ``_inputs_ended`` waited for them to end), or None."""
        said = (type(exc), describe(exc))
        for t in task_inputs(task):
            rem = t.value
            erred = type(rem) is Remote and rem.future is not None and rem.future.status == "error"
            if erred and t.state < DONE:  # not handled yet: the origin first
                self._failed(t, rem, exc, tb)
            err = t.error if t.state == FAILED else None
            cause = getattr(err, "__cause__", None)
            if cause is not None and (type(cause), describe(cause)) == said:
                return err
        return None

    def _named(self, key: str) -> tuple[str, str]:
        """(task name, op) of the task this runtime sent as Dask key ``key``."""
        op, sep, rest = key.partition(f"-{self.token}-")
        if not sep:
            return key, key
        return f"{op}#{rest.split('-', 1)[0]}", op

    def _cancelled(self, task: Task, rem: Remote) -> None:
        err: BaseException | None = next(
            (t.error for t in task_inputs(task) if t.state == CANCELLED and t.error is not None),
            None,
        )
        if err is None:
            if self._sched.cancelling:
                why = "its runtime was closing"
            elif getattr(self.client, "status", None) in ("closing", "closed"):
                # (Dask cancels every future of a client that closes, and gives no reason.)
                why = "its Dask client was closed while the runtime used it"
            else:
                reason = cancel_reason(rem.future) if rem.future is not None else ""
                why = "it was cancelled on Dask" + (f" ({reason})" if reason else "")
            err = CancelledTaskError(f"{task.name} was not run: {why}")
        self._finish_failed(task, rem, err, ran=False)

    def _finish_failed(self, task: Task, rem: Remote, err: BaseException, ran: bool) -> None:
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
            self._end_locked(task, err, cancelled, keep_inputs=reports)
        if (ACTIVE or sched.watching) and not reports:
            sched.record_unrun(cancelled)
            sched.emit("task_cancelled" if cancelled else "task_failed", task)

    def _end_locked(
        self, task: Task, err: BaseException, cancelled: bool, keep_inputs: bool
    ) -> None:
        """A sent task ends here with ``err`` (CANCELLED or FAILED): its waiters are woken and
        what depends on it fails with the same error. ``keep_inputs``: its span is still to
        be reported (by the relay), which names them. Holds the lock."""
        task.state = CANCELLED if cancelled else FAILED
        task.error = err
        task.value = None
        task.fn = task.args = task.kwargs = None
        if not keep_inputs:
            task.inputs = ()
        waiters = gs.take_waiters(task)
        if waiters is not None:
            self._sched.host.wake(waiters)
        deps, task.dependents = task.dependents, None
        for d in deps or ():
            d.runtime._sched._fail_locked(d, err)  # type: ignore[union-attr]

    def _drop_sent_locked(self, task: Task, err: BaseException) -> bool:
        """Drop a task sent to the cluster that its cancelled request dispatched and nobody
        else wants (the scheduler's ``drop_sent``, called holding the lock): failed here
        with ``err``, with what depends on it, and cancelled on the cluster. False when it
        is not such a task, or has ended there."""
        rem = task.value
        if type(rem) is not Remote or rem.future is None or rem.future.status != "pending":
            return False
        sched = self._sched
        self._timed.pop(task.id, None)
        self._settle_locked(task, rem)
        self._end_locked(task, err, True, keep_inputs=False)
        if ACTIVE or sched.watching:
            sched.record_unrun(True)
            sched.emit("task_cancelled", task)
        if not self._dropping:  # (later: this holds the lock, _cancel_dropped takes it)
            sched.host.later(self._cancel_dropped)
        self._dropping.append(rem.future)
        return True

    def _cancel_dropped(self) -> None:
        """Cancel on the cluster the futures of the tasks dropped since the last call."""
        with GRAPH_LOCK:
            futures, self._dropping = self._dropping, []
        self._spawn(self._cancel_futures(futures))

    def _release_unfetched(self) -> None:
        """Fail the tasks whose values are still on the cluster as the runtime closes.

        Values come back only when awaited; the runtime's exit waits for the cluster to
        compute them, but they go with its client. A handle awaited after the exit (a
        pending tensor the ``async with`` block returned) said "was not run: it was
        cancelled on Dask", from a fetch started after the runtime closed; it now says what
        happened and what to do, and the futures are released before the client closes.
        """
        for task in list(self._sent_tasks):
            rem = task.value
            if type(rem) is not Remote or task.state >= DONE:
                continue
            err = CancelledTaskError(
                f"{task.name}: its value was left on the Dask cluster when its runtime closed "
                "(a value comes back to the client only when awaited): await it, or "
                "`await dataflow.materialize(...)` what the block returns, inside the "
                "`async with dataflow.Runtime(...)` block"
            )
            with GRAPH_LOCK:
                if task.state < DONE:
                    self._settle_locked(task, rem)
                    self._end_locked(task, err, True, keep_inputs=False)
        self._sent_tasks.clear()

    # -- values back to the client ------------------------------------------------------------

    def _want(self, task: Task) -> None:
        """Bring the task's value to the client once computed (call on the loop thread)."""
        rem = task.value
        if type(rem) is not Remote or task.state >= DONE or rem.wanted:
            return
        rem.wanted = True
        if rem.future is not None:  # else _sent starts the fetch
            self._spawn(self._fetch(task, rem))

    async def _fetch(self, task: Task, rem: Remote) -> None:
        rem.fetching = True
        while True:
            if not await self._outcome(task, rem):
                return
            fut = rem.future
            try:
                value = await self.client.gather(fut)
            except Exception as exc:
                if rem.future is not fut or was_lost(task):
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
