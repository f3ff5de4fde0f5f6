"""The top layer: dispatch (``submit``, with the inline hot path), waiting, timeouts and
backpressure (:mod:`dataflow._scheduler`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from threading import get_ident, get_native_id
from typing import TYPE_CHECKING, Any

from .. import _graphstate as gs
from .._args import resolve, resolve_kwargs
from .._errors import (
    DataflowError,
    OpTimeoutError,
    task_failed,
)
from .._instrument import ACTIVE, GENERATION, HOOKED
from .._pool import GRAPH_LOCK
from .._protect import protect
from .._record import name_signature
from .._task import (
    DONE,
    PENDING,
    READY,
    RUNNING,
    Signature,
    Task,
)
from .._timeout import TimedKernel, Watchdog
from ._placement import (
    AWAITED_AT_ONCE,
    FIRST_RUNS,
    HELP_WALK,
    PROBE,
    SAMPLE,
    runs_inline,
)

if TYPE_CHECKING:
    pass
from ._execution import Execution

__all__ = ["Scheduler"]

_now = time.perf_counter_ns

# Set on a thread while it helps run tasks for backpressure (helping never nests).
_helping = threading.local()


class Scheduler(Execution):
    """The local execution engine of one runtime (see :mod:`dataflow._scheduler`)."""

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
        """Add a task: run it inline, queue it, or park it on its inputs (``dataflow._scheduler``).

        ``inputs`` are the tasks of the pending handles among the arguments, ``ready``
        whether all are done, and ``values`` (when the caller has them) the arguments with
        every handle replaced by its value. ``priority`` orders the task among ready tasks
        (smaller first; default: issue order). ``timeout`` bounds its kernel's run time.
        """
        if ready and timeout is None and self._inline_ok:
            inline = sig.inline
            if inline is None:
                # Tiny, or GIL-bound and short with the pool's GIL lane free (no serial
                # kernel running on a worker): either way the kernel runs here, now, on the
                # lean path below (a GIL-bound one finding the lane taken waits for it).
                # Also a kernel under AWAIT_HERE_SECONDS with one worker (it could only start
                # it once this thread lets go of the GIL, at its next wait: after this
                # thread's Python, not beside it, plus two wake-ups), or one the program
                # awaits at once (the loop ran the last AWAITED_AT_ONCE itself, awaiting
                # them). One call in PROBE takes the usual way, to measure and notice.
                inline = (
                    sig.seconds < self.inline_threshold
                    or self.pool is None
                    or (
                        sig.serial
                        and self.pool.lane_task is None
                        and runs_inline(sig, self.inline_threshold)
                    )
                    or (
                        sig.seconds < self.await_here
                        and (self.pool.num_threads == 1 or sig.awaited >= AWAITED_AT_ONCE)
                        and bool((sig.calls + 1) % PROBE)
                    )
                )
            if inline:
                start = 0  # nonzero: recorders observe, and this is when the kernel began
                if ACTIVE or self.watching:
                    if HOOKED or self.hooked:  # instruments: a full task, its events
                        return self._run_inline(Task(sig, fn, args, kwargs, self.rt, inputs))
                    start = _now()  # recorders only: timed, one span record
                # The hot path of small ops: no task record until the value exists.
                if values is None:
                    values = resolve(args) if inputs else args  # type: ignore[assignment]
                try:
                    if kwargs and inputs:
                        kwargs = resolve_kwargs(kwargs)
                    n = sig.calls = sig.calls + 1
                    if n > FIRST_RUNS and n % SAMPLE:
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
                    task = Task(sig, fn, args, kwargs, self.rt, inputs)
                    if start:
                        self.record(task, start, time.perf_counter_ns(), True)
                    return self._inline_failed(task)
                self.inline_run += 1
                task = Task.done(sig, value, self.rt)
                if start:
                    # The span record, as Recorder.task would write it, built once and
                    # appended to every plain recorder (no Python call per recorder): the
                    # price of leaving a profile on, so every step counts here.
                    end = _now()
                    if GENERATION[0] != self._fast_gen:  # recorders changed, or not plain ones
                        self._record_inline(task, inputs, start, end)
                        return task
                    native = self._natives.get(get_ident())
                    if native is None:
                        native = self._native()
                    record = (
                        task.id,
                        sig.rid or name_signature(sig),
                        (inputs[0].id if len(inputs) == 1 else tuple([t.id for t in inputs]))
                        if inputs
                        else (),
                        native,
                        start,
                        start,
                        end,
                        False,
                    )
                    append1 = self._append1
                    if append1 is not None:
                        append1(record)
                    else:
                        for append in self._appends:
                            append(record)
                return task
        if self.closed:
            raise DataflowError(f"{sig.name}: this runtime is closed; start a new one")
        if not ready and get_ident() == self.host.thread_id:
            # The loop dispatches work that waits: small tasks workers make ready meanwhile
            # are handed back to it (HANDBACK_SECONDS). Run those first; if that finished
            # this task's inputs, it takes the inline path after all.
            self._loop_pending_ns = _now()
            if self._handback:
                self.drain()
                if all(t.state == DONE for t in inputs):
                    return self.submit(sig, fn, args, kwargs, inputs, True, priority, timeout)
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
        # A ready GIL-bound kernel shorter than a GIL switch interval that found the pool's
        # GIL lane taken above (``_placement.runs_inline``) runs here if the lane is free by
        # now, else waits for it; anything else is queued.
        here = (
            ready
            and sig.serial
            and timeout is None
            and sig.inline is None
            and self._inline_ok
            and runs_inline(sig, self.inline_threshold)
        )
        if not here:
            protect(task)  # it runs later: the caller may change its arrays meanwhile
        on_loop = threading.get_ident() == self.host.thread_id
        owner = self._owner() if on_loop else None
        # A small task dispatched by the loop wakes no worker before the loop's callback ends:
        # the loop may await it at once and run it itself (``completion``).
        quiet = on_loop and sig.inline is None and sig.seconds < self.await_here
        post = False
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
            run_here = False
            if task.state == READY:
                if here:
                    run_here = self.start_locked(task, self.pool)
                    if not run_here:
                        # It waits for the GIL lane, so it runs later after all. Nobody can
                        # start it before this lock is released.
                        protect(task)
                elif quiet:
                    if self.pool.push_quietly_locked(task) and not self._wake_posted:
                        self._wake_posted = post = True
                else:
                    self.pool.push_locked(task)
        if post:
            self._post_wake()
        if run_here:
            self.execute(task)  # and the small work it makes ready
            return task
        if watched and task.state == READY:
            task.ready = time.perf_counter_ns()
            self.emit("task_ready", task)
        if self.inflight > self._limit:
            self._throttle()
        return task

    def hand_back_locked(self, task: Task) -> bool:
        """A worker made the small READY ``task`` ready while the loop dispatches work that
        waits (``_place_ready_locked``): leave it to the loop, which runs it at its next such
        dispatch or in a drain posted now. False (the worker goes on with it) if the loop is
        closed. Holds the lock."""
        if not self._drain_posted:
            try:
                self.host.later(self.drain)
            except RuntimeError:  # the loop is closed
                return False
            self._drain_posted = True
        self._handback.append(task)
        return True

    def drain(self) -> None:
        """Run, on the loop's thread, the small tasks workers handed back to it, and the
        tiny ones they make ready (the others are queued)."""
        while True:
            with GRAPH_LOCK:
                tasks = self._handback
                if not tasks:
                    self._drain_posted = False
                    return
                self._handback = []
            for t in tasks:
                if self._take(t):
                    self.execute(t, go_on=False, small_here=True)

    def _post_wake(self) -> None:
        """Wake a worker for a quietly queued task once the loop's current callback ends."""
        try:
            self.host.later(self._wake)
        except RuntimeError:  # the loop is closed: wake one now
            self._wake()

    def _wake(self) -> None:
        pool = self.pool
        with GRAPH_LOCK:
            self._wake_posted = False
            if pool is not None:
                pool.wake_locked()

    def _native(self) -> int:
        """The calling thread's native id (cached: ``get_native_id()`` is a system call)."""
        native = self._natives[get_ident()] = get_native_id()
        return native

    def _record_inline(self, task: Task, inputs: tuple[Task, ...], start: int, end: int) -> None:
        """An inline kernel ran from ``start`` to ``end``: its span record, for the recorders
        observing this runtime (only recorders: instruments take ``_run_inline``). The general
        case of ``submit``'s own: the recorders changed, or one is windowed or overrides
        ``Recorder.task``."""
        if GENERATION[0] != self._sinks_gen:
            self.sinks()
        if inputs:
            ins = inputs[0].id if len(inputs) == 1 else tuple([t.id for t in inputs])
        else:
            ins = ()
        native = self._natives.get(get_ident())
        if native is None:
            native = self._native()
        sig = task.sig
        record = (task.id, sig.rid or name_signature(sig), ins, native, start, start, end, False)
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

    # -- waiting and closing -------------------------------------------------------------------

    def cancel_everything(self) -> None:
        """The body failed: queued kernels are dropped unrun (running ones finish)."""
        self.cancelling = True
        self._inline_ok = False

    def completion(self, task: Task) -> Any:
        """An awaitable that completes when ``task`` is done (``await handle``).

        A small task that is queued and not started is run right here instead (see
        ``dataflow._scheduler``).
        """
        host = self.host
        if threading.get_ident() != host.thread_id:
            raise DataflowError(
                f"{task.name} belongs to a runtime on another event loop; await it there "
                "(pending values cannot move between event loops or threads)"
            )
        if self.pool is not None and self._inline_ok:
            # Helping (running ancestors) only while one request at most has deferred work:
            # in a server the loop helping one request delays all the others (loop lag
            # max 159 ms at 32 clients against 21 ms without it: benchmarks.serving).
            spent = self._help(task) if task.state == PENDING and len(self._owners) <= 1 else 0.0
            if (
                task.state == READY
                and type(task.fn) is not TimedKernel
                and self._runs_here(task.sig, spent)
                and self._take(task)
            ):
                task.sig.awaited += 1
                self.execute(task, go_on=False)
        return self.waiter(task)

    def _runs_here(self, sig: Signature, spent: float) -> bool:
        """Whether the loop, awaiting, runs a queued task of ``sig`` itself, having run
        ``spent`` seconds of others for this await already: small or GIL-bound-and-short
        as at dispatch, or short enough to hold the loop for (it would only wait here
        meanwhile), within AWAIT_HERE_SECONDS for the whole await."""
        inline = sig.inline
        if inline is not None:
            return inline
        seconds = sig.seconds
        return spent + seconds < self.await_here or (
            not spent and runs_inline(sig, self.inline_threshold)
        )

    def _take(self, task: Task) -> bool:
        """Start a READY task on this thread (a GIL-bound one through the GIL lane)."""
        with GRAPH_LOCK:
            if task.state != READY:
                return False
            if task.sig.serial and task.sig.inline is None:
                return self.start_locked(task, self.pool)  # type: ignore[arg-type]
            self.begin_locked(task)
            return True

    def _help(self, task: Task) -> float:
        """The loop awaits ``task``, which waits for its inputs: run the queued, not yet
        started tasks it waits for (its ancestors; the first issued first) here while they
        fit in AWAIT_HERE_SECONDS together, rather than wait for a worker to start them.

        Code that awaits each module's output as it goes (``await lstm(x)`` at the top
        level, whose directions and their concatenation are dispatched and then awaited at
        once) otherwise waited for a worker woken for small GIL-bound kernels, which then
        ran them one after the other on that worker while the loop idled: never side by
        side, so never measured GIL-bound either, and 2.3x numpy's time at (10, 1, 32).
        Only while at most one request (a task on the loop: the program, or one server
        request) has deferred work in flight (``completion``).

        Returns the seconds (as estimated) of the tasks it ran.
        """
        spent = 0.0
        while task.state == PENDING:
            found = self._ready_ancestor(task)
            if found is None or not self._runs_here(found.sig, spent) or not self._take(found):
                break
            spent += found.sig.seconds
            self.execute(found, go_on=False)
        return spent

    def _ready_ancestor(self, task: Task) -> Task | None:
        """The first issued of the queued (READY) tasks of this runtime that ``task`` waits
        for, directly or through pending ones (a bounded walk: HELP_WALK pending tasks)."""
        best: Task | None = None
        stack = list(task.inputs)
        seen: set[int] = set()
        rt = self.rt
        while stack:
            t = stack.pop()
            state = t.state
            if state == READY:
                if (
                    t.runtime is rt
                    and type(t.fn) is not TimedKernel
                    and (best is None or t.priority < best.priority)
                ):
                    best = t
            elif state == PENDING and id(t) not in seen:
                if len(seen) >= HELP_WALK:
                    break
                seen.add(id(t))
                stack.extend(t.inputs)
        return best

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
        """Over ``max_pending``: help run queued tasks until 10% under it (see
        ``dataflow._scheduler``, "Backpressure")."""
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
                if on_loop and self._handback:
                    self.drain()  # small work handed back to the loop: it is the one to run it
                    continue
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
