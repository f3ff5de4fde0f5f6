"""The top layer: dispatch (``submit``, with the inline hot path) and closing
(:mod:`dataflow._scheduler`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from threading import get_ident
from typing import TYPE_CHECKING, Any

from .. import _graphstate as gs
from .._args import own_inputs, record_ids, resolve, resolve_kwargs
from .._errors import (
    DataflowError,
    task_failed,
)
from .._instrument import ACTIVE, GENERATION, HOOKED
from .._pool import GRAPH_LOCK
from .._protect import protect
from .._record import HERE, name_signature, native_here
from .._signature import Signature
from .._task import (
    DONE,
    LIGHT,
    READY,
    RUNNING,
    Task,
    _next_id,
)
from .._timeout import TimedKernel
from ._placement import (
    AWAITED_AT_ONCE,
    FIRST_RUNS,
    PROBE,
    QUIET_SECONDS,
    SAMPLE,
    runs_inline,
)

if TYPE_CHECKING:
    pass
from ._base import stops_here
from ._execution import running_task
from ._limits import Limits
from ._requests import AGING_TASKS

__all__ = ["Scheduler"]

_now = time.perf_counter_ns

QUIET_NS = int(QUIET_SECONDS * 1e9)


class Scheduler(Limits):
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
        light: bool = False,
    ) -> Any:
        """Add a task: run it inline, queue it, or park it on its inputs (``dataflow._scheduler``).

        ``inputs`` are the tasks of the pending handles among the arguments, ``ready``
        whether all are done, and ``values`` (when the caller has them) the arguments with
        every handle replaced by its value (given only when ``kwargs`` holds no handle).
        ``priority`` orders the task among ready tasks (smaller first; default: issue
        order). ``timeout`` bounds its kernel's run time.

        Returns the task, or with ``light`` a 1-tuple of the value when the kernel ran here
        and nothing observes (no task record made: the op's handle carries the value,
        ``_task.Pending``).
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
                        if inputs:
                            inputs = own_inputs(args, kwargs, inputs)
                        return self._run_inline(Task(sig, fn, args, kwargs, self.rt, inputs))
                    start = _now()  # recorders only: timed, one span record
                # The hot path of small ops: no task record until the value exists.
                # (Values given by the caller come with plain keywords: ``Op.__call__``
                # gives them only when every keyword is a scalar.)
                if values is None:
                    values = resolve(args) if inputs else args  # type: ignore[assignment]
                    if kwargs and inputs:
                        kwargs = resolve_kwargs(kwargs)
                try:
                    n = sig.calls = sig.calls + 1
                    if n > FIRST_RUNS and n % SAMPLE and not sig.serial:
                        value = fn(*values, **kwargs) if kwargs else fn(*values)  # type: ignore[misc]
                    elif sig.serial and self.pool is not None:
                        value = self._serial_here(sig, fn, values, kwargs, n)
                    else:
                        value = self._timed(sig, fn, values, kwargs)
                    check = sig.check
                    if check is not None:
                        spec = sig.spec
                        if type(spec) is tuple or check(spec, value) is not None:
                            sig.check_value(value)
                except BaseException:
                    # Fail it the slow way, with a full task (which re-runs nothing).
                    if start and inputs:
                        inputs = own_inputs(args, kwargs, inputs)
                    task = Task(sig, fn, args, kwargs, self.rt, inputs)
                    if start:
                        self.record(task, start, time.perf_counter_ns(), True)
                    return self._inline_failed(task)
                self.inline_run += 1
                if not start:
                    return (value,) if light else Task.done(sig, value, self.rt)
                # The span record, as Recorder.task would write it, built once and appended
                # to every plain recorder (no Python call per recorder): the price of leaving
                # a profile on, so every step counts here. A light handle again (no task
                # record): its id, in the list returned, is the one its span record has.
                end = _now()
                if GENERATION[0] != self._fast_gen:  # recorders changed, or not plain ones
                    if GENERATION[0] != self._sinks_gen:
                        self.sinks()
                    if GENERATION[0] != self._fast_gen:
                        task = Task.done(sig, value, self.rt)
                        if inputs:
                            inputs = own_inputs(args, kwargs, inputs)
                        self._record_inline(task, inputs, start, end)
                        return task
                try:
                    native = HERE.native
                except AttributeError:  # the thread's first record
                    native = native_here()
                if not inputs:
                    ins: Any = ()
                elif len(inputs) == 1:
                    ins = inputs[0]
                    if ins.value is not LIGHT:
                        ins = ins.id
                    else:  # a light handle: most often the first argument, recorded
                        try:
                            a = args[0]
                            ins = a._id if a._t is ins else record_ids(args, kwargs, inputs)
                        except (IndexError, AttributeError):
                            ins = record_ids(args, kwargs, inputs)
                else:
                    ins = record_ids(args, kwargs, inputs)
                tid = _next_id()
                record = (
                    tid,
                    sig.rid or name_signature(sig),
                    ins,
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
                if light:
                    return [value, tid]
                task = Task.done(sig, value, self.rt)
                task.id = tid
                return task
        if self.closed:
            raise DataflowError(f"{sig.name}: this runtime is closed; start a new one")
        on_loop = get_ident() == self.host.thread_id
        # (Runtime._join: its block ended, the graph drains.) A coroutine on the loop may no
        # longer add work; a kernel the loop's thread runs may (a forked plain function the
        # loop runs helping another runtime under backpressure), as it may on a worker.
        if self.draining and on_loop and running_task() is None:
            raise DataflowError(
                f"{sig.name}: this runtime is closing (its `async with` block ended and it "
                "waits for its work to finish): dispatch from a task that outlives the block "
                "to a runtime that does, or end that task inside the block"
            )
        if not ready and on_loop:
            # The loop dispatches work that waits: small tasks workers make ready meanwhile
            # are handed back to it (HANDBACK_SECONDS). Run those first; if that finished
            # this task's inputs, it takes the inline path after all.
            self._loop_pending_ns = _now()
            if self._handback:
                self.drain()
                if all(t.state == DONE for t in inputs):
                    return self.submit(sig, fn, args, kwargs, inputs, True, priority, timeout)
        watched = ACTIVE or self.watching
        if watched and inputs:  # its record names its inputs: light handles' own tasks
            inputs = own_inputs(args, kwargs, inputs)
        task = Task(sig, fn, args, kwargs, self.rt, inputs)
        if priority is not None:
            task.priority = priority
        if timeout is not None:
            task.fn = TimedKernel(fn, task, timeout)
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
        owner = self._owner() if on_loop else None
        # A small task dispatched by the loop wakes no worker before the loop's callback ends
        # (or QUIET_SECONDS after the first such task): the loop may await it at once and run
        # it itself (``completion``), and workers woken meanwhile would wait for the GIL the
        # loop holds as it dispatches (``_placement.QUIET_SECONDS``).
        quiet = on_loop and sig.inline is None and sig.seconds < self.await_here
        post = False
        if owner is not None and priority is None:
            # The request's age, aged (AGING_TASKS): the later of its start and this task's
            # id less the window.
            base = owner.base
            aged = task.id - AGING_TASKS
            task.priority = base if base > aged else aged
        with GRAPH_LOCK:
            self.inflight += 1
            failed = gs.add(task) if inputs else None
            if failed is not None:
                # An input already failed: this task fails with the same error, unrun.
                self._fail_locked(task, failed.error)
                return task
            if owner is not None:
                owner.add(task)
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
                    self.pool.push_quietly_locked(task)
                    if not self._wake_posted:
                        self._wake_posted = post = True
                        self._quiet_since = _now()
                    elif _now() - self._quiet_since > QUIET_NS:
                        self.pool.wake_locked()  # a long dispatch: the workers start now
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
        try:
            native = HERE.native
        except AttributeError:  # the thread's first record
            native = native_here()
        sig = task.sig
        record = (task.id, sig.rid or name_signature(sig), ins, native, start, start, end, False)
        for append in self._appends:
            append(record)
        for scope, rec in self._overriding:
            try:
                rec.task(task, start, start, end, False, inputs)
            except BaseException as exc:  # no observer may break a run
                self._switch_off(scope, rec, "task", exc)
        if self._windowed:
            self._recorded += 1
            if not self._recorded & 255:
                for rec in self._windowed:
                    rec.trim(end)

    def _serial_here(
        self,
        sig: Signature,
        fn: Callable[..., Any],
        values: Any,
        kwargs: dict[str, Any] | None,
        n: int,
    ) -> Any:
        """A GIL-bound (serial) kernel run here on the lean path, counted among the pool's
        running kernels while it runs (the busy integral), as a pool run is.

        The pool's runs of a serial signature are its probes (one call in PROBE), which
        measure the GIL again. Every other run is short enough to run on the thread that
        needs it (``_placement.runs_inline``), so beside a probe there is most often such a
        run here and nothing on the pool: uncounted, the probe read no overlap, measured
        nothing, and the mark could never be lifted (the numba engine's directions at
        (50, 1, 128), once marked in a process, ran one after another on the loop for
        good)."""
        pool = self.pool
        assert pool is not None
        with GRAPH_LOCK:
            if pool.measuring:
                pool.tick_locked()
            pool.busy += 1
        try:
            if n > FIRST_RUNS and n % SAMPLE:
                return fn(*values, **kwargs) if kwargs else fn(*values)
            return self._timed(sig, fn, values, kwargs)
        finally:
            with GRAPH_LOCK:
                if pool.measuring:
                    pool.tick_locked()
                pool.busy -= 1

    def _inline_failed(self, task: Task) -> Task:
        """The inline kernel (or its value check) raised: fail a task record with that error."""
        exc = sys.exc_info()[1]
        assert exc is not None
        task.state = RUNNING
        err = task_failed(task.name, task.op, exc)
        with GRAPH_LOCK:
            self.failures.append(err)
            self._fail_locked(task, err, counted=False)
        if stops_here(exc, err):
            raise exc
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
            if stops_here(exc, err):
                raise
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

    # -- closing -------------------------------------------------------------------------

    def cancel_everything(self) -> None:
        """The body failed: queued kernels are dropped unrun (running ones finish)."""
        self.cancelling = True
        self._inline_ok = False

    def close(self) -> None:
        """Stop taking tasks; stop the watchdog."""
        self.closed = True
        self._inline_ok = False
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None
