"""Cross-request batching for compiled forwards (``dataflow.compile(..., batch_axis=)``).

The middle layer of :class:`~dataflow.Compiled` (see :mod:`dataflow._compile`), over its plans
(:mod:`dataflow._plans`): :class:`Batching` decides when calls are gathered and launched.

**Cross-request batching** (opt-in, ``batch_axis=``): calls that arrive while an earlier batch
of the same compiled model is running are gathered, concatenated along ``batch_axis``, run as
one launch (every op then runs once for all of them, with larger, faster kernels: the
on-the-fly batching of DyNet, at the granularity of the whole program), and the outputs split
back along ``batch_axis``. A call never waits for others when nothing of this model runs, and
otherwise until the running batch ends, at most ``max_wait`` seconds: the calls gathered
meanwhile launch as soon as the model is free. The batch is padded to a power of two (so at most a
few sizes are traced), the padding rows being copies of the first input's. Every array input
and output must have the batch axis, and rows must be independent (no op may mix the batch's
rows: reductions over the batch axis, batch norm ...): the results are then those of running
each call alone, within float rounding. A batch that fails (a kernel raised on some call's
rows) runs its calls again one at a time, so each caller gets its own result or its own error,
as unbatched. A call's arrays are protected from its caller's writes while it waits, as an
op's arguments are (:class:`Held`: small ones copied, big ones read-only until the batch has
read them, or the caller stopped waiting).

The pieces it gathers them with: a :class:`Batch` (the calls gathered for one launch, their
rows, and a way back to each caller, who may stop waiting: see :meth:`Batch.leave`), the
:class:`Timer` that closes a batch after ``max_wait``, and :func:`slice_rows`, which cuts a
batched output back into each call's rows.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, cast

import anyio
import numpy as np

from ._errors import DataflowValueError
from ._lookup import get_runtime
from ._plans import ARRAY_SLOT, Plans, with_arrays
from ._protect import protect, thaw
from ._task import Pending
from ._walk import leaves, replace

if TYPE_CHECKING:
    from ._runtime import Runtime
    from ._task import Task

__all__ = ["Batch", "Batching", "Timer", "check_rows", "slice_rows"]

_ndarray = np.ndarray


def slice_rows(out: Any, axis: int, lo: int, hi: int) -> Any:
    """One call's rows ``lo:hi`` along ``axis`` of every array in a batched output."""

    def cut(v: Any) -> Any:
        if type(v) is _ndarray and v.ndim:
            index = [slice(None)] * v.ndim
            index[axis] = slice(lo, hi)
            return np.ascontiguousarray(v[tuple(index)])
        return v

    return replace(out, cut)


def check_rows(out: Any, axis: int, rows: int, name: str) -> None:
    """Refuse a batched output without the batch axis: cut along ``axis`` anyway, each
    caller would get other rows of some other array (a sum over the batch, say), silently."""
    for v in leaves(out):
        if type(v) is _ndarray and not (-v.ndim <= axis < v.ndim and v.shape[axis] == rows):
            raise DataflowValueError(
                f"{name}: an output of shape {v.shape} has no batch axis {axis} of the "
                f"batch's {rows} rows, so it cannot be split back into the calls' rows: "
                "with batch_axis, every array output must keep the inputs' batch axis (no "
                "reduction over it); compile without batch_axis to return it"
            )


class Held:
    """A batched call's arrays, held for its batch: protected from the caller's writes until
    the batch has read them, as an op's arguments are (``dataflow._protect``: small ones
    copied, big ones read-only). ``protect`` and ``thaw`` take it as they take a task."""

    __slots__ = ("args", "frozen", "kwargs", "owner")

    def __init__(self, arrays: list[Any], owner: object) -> None:
        self.args: tuple[Any, ...] = tuple(arrays)
        self.kwargs: dict[str, Any] | None = None
        self.frozen: list[Any] | None = None
        self.owner = owner
        protect(cast("Task", self))

    @property
    def name(self) -> str:
        """What ``dataflow.frozen_by`` names."""
        return f"a batched call of {self.owner!r}"

    def release(self) -> None:
        """The batch will not read these arrays again: the caller may write them."""
        if self.frozen:
            thaw(cast("Task", self))


class Batch:
    """Calls gathered for one launch."""

    def __init__(self, key: tuple[Any, ...], statics: list[Any], model: Batching) -> None:
        self.key = key
        self.statics = statics  # (the calls' other arguments, ARRAY_SLOT where their arrays go)
        self.calls: list[tuple[Any, ...]] = []
        self.held: list[Held] = []
        self.rows: list[int] = []
        self.done: list[Callable[[Any, BaseException | None], None]] = []
        # Per call: whether its caller stopped waiting (see leave); how many still wait.
        self.left: list[bool] = []
        self.live = 0
        self.size = 0
        self.closed = False
        self.timer: Timer | None = None
        self.rt: Runtime | None = None
        # The running batch's task (to cancel when every caller has left), whether it took
        # its first step (``Batching._run_batch``), and the compiled forward it belongs to.
        self.task: Any = None
        self.started = False
        self.model = model

    def join(self, arrays: list[Any], rows: int, rt: Runtime, owner: object) -> Awaitable[Any]:
        assert rt.host is not None
        self.rt = rt
        waiter = rt.host.waiter()
        box: list[Any] = []
        index = len(self.calls)
        # The batch reads the arrays later (when it launches, or runs the call again alone):
        # a write by the caller meanwhile must not change its result.
        held = Held(arrays, owner)

        def done(value: Any, exc: BaseException | None) -> None:
            held.release()
            box.append((value, exc))
            assert rt.host is not None
            rt.host.wake([waiter])

        self.calls.append(held.args)
        self.held.append(held)
        self.rows.append(rows)
        self.done.append(done)
        self.left.append(False)
        self.size += rows
        self.live += 1

        async def result() -> Any:
            try:
                await waiter
            except BaseException:
                if not box:  # the caller stopped waiting (cancelled) before its rows came
                    self.leave(index)
                raise
            value, exc = box[0]
            if exc is not None:
                raise exc
            return value

        return result()

    def leave(self, index: int) -> None:
        """Call ``index`` no longer waits: its rows are left out if the batch has not started;
        the last caller to leave a batch stops it (unstarted: never launched; running: its
        task cancelled, which drops the plan's queued work like any cancelled request's)."""
        if self.left[index]:
            return
        self.left[index] = True
        # Never read again: left out of the batch if it has not started (its inputs are
        # concatenated as it starts), and not run again alone if it fails.
        self.held[index].release()
        self.live -= 1
        if self.live:
            return
        if not self.closed:
            self.closed = True
            if self.timer is not None:
                self.timer.cancel()
            self.model._forget(self.key, self)
        elif self.task is not None and self.rt is not None and self.rt.host is not None:
            self.rt.host.cancel(self.task)
            self.model._unstarted(self)  # (if it had not started, it never will)


class Timer:
    """Calls ``fn`` after ``seconds`` on the runtime's loop, unless cancelled first."""

    def __init__(self, rt: Runtime, seconds: float, fn: Callable[[], None]) -> None:
        self.cancelled = False
        host = rt.host
        assert host is not None
        self.host = host

        async def wait() -> None:
            await anyio.sleep(seconds)
            if not self.cancelled:
                self.cancelled = True  # fired: cancel() must not cancel the batch it started
                fn()

        self.handle = host.spawn(wait(), "batch timer")

    def cancel(self) -> None:
        """Stop the timer's task (so closing the runtime does not wait out its sleep)."""
        if not self.cancelled:
            self.cancelled = True
            self.host.cancel(self.handle)


class Batching(Plans):
    """The calls of a compiled forward with ``batch_axis``: gathered into batches, each
    launched once (the module docstring; :class:`~dataflow.Compiled` sets this state)."""

    batch_axis: int | None
    max_batch: int
    max_wait: float
    _batches: dict[Hashable, Batch]
    _running: dict[Hashable, int]

    if TYPE_CHECKING:
        # A layer up (``_compile``): launching a prepared plan, batched or not.
        async def _launch(self, prog: Any, arrays: Sequence[Any]) -> Any: ...

    def _rows(self, arrays: list[Any]) -> int:
        """The call's rows: every array input's size along the batch axis (the same), or
        a DataflowValueError naming the shapes."""
        axis = self.batch_axis
        assert axis is not None
        rows = []
        for a in arrays:
            shape = tuple(a.shape)
            if not -len(shape) <= axis < len(shape):
                raise DataflowValueError(
                    f"{self!r}: batch_axis {axis} is out of range for an input of shape {shape}"
                )
            rows.append(shape[axis])
        if len(set(rows)) != 1:
            raise DataflowValueError(
                f"{self!r}: every array input needs the same size along batch_axis {axis}, "
                f"got {rows}"
            )
        return int(rows[0])

    async def _batched(self, arrays: list[Any], statics: list[Any], key: list[Any]) -> Any:
        axis = self.batch_axis
        assert axis is not None
        rows = self._rows(arrays)
        # The group of calls that may share a batch: the signature less the batch axis, in
        # one runtime. A batch runs on its runtime's loop; calls from another runtime (another
        # thread's dataflow.run) batch among themselves (a shared batch hung them all).
        rt = get_runtime("a compiled forward")
        group: list[Any] = [rt]
        for s, part in zip(statics, key, strict=True):
            if s is ARRAY_SLOT:
                shape, dtype = part
                a = axis % len(shape)
                part = (shape[:a] + shape[a + 1 :], dtype)
            group.append(part)
        gk = tuple(group)
        batch = self._batches.get(gk)
        if batch is None or batch.closed or len(batch.calls) >= self.max_batch:
            batch = self._batches[gk] = Batch(gk, statics, self)
        call = batch.join(arrays, rows, rt, self)
        if not self._running.get(gk) or len(batch.calls) >= self.max_batch:
            self._flush(gk, batch)  # nothing of this model runs: no reason to wait
        elif len(batch.calls) == 1:
            # At most max_wait: the batch launches sooner if the running one ends first
            # (``_done_running``).
            batch.timer = Timer(rt, self.max_wait, lambda: self._flush(gk, batch))
        return await call

    def _forget(self, gk: Hashable, batch: Batch) -> None:
        """Take ``batch`` out of the open batches (it is launched, or every caller left)."""
        if self._batches.get(gk) is batch:
            del self._batches[gk]

    def _flush(self, gk: tuple[Any, ...], batch: Batch) -> None:
        """Launch ``batch`` (in a task of its runtime's: ``_run_batch``)."""
        if batch.closed:
            return
        batch.closed = True
        self._forget(gk, batch)
        if batch.timer is not None:
            batch.timer.cancel()
        rt = batch.rt
        assert rt is not None and rt.host is not None
        self._running[gk] = self._running.get(gk, 0) + 1
        batch.task = rt.host.spawn(
            self._run_batch(gk, batch),
            f"batch {gk[1:]!r:.40}",
            functools.partial(self._unstarted, batch),
        )

    def _unstarted(self, batch: Batch) -> None:
        """``batch``'s task was cancelled: if before its first step, it never runs (an
        asyncio task; trio's bridge closes it unrun and calls this), nor the cleanup that
        ends its run, so this ends it (the model stayed marked running: every later call
        waited ``max_wait`` for nothing)."""
        if not batch.started:
            batch.started = True
            self._done_running(batch.key)

    async def _run_batch(self, gk: Hashable, batch: Batch) -> None:
        batch.started = True
        axis = self.batch_axis
        assert axis is not None
        statics = batch.statics
        running = True
        delivered = 0
        # The calls whose callers still wait (a cancelled caller's rows are left out).
        calls = [k for k, left in enumerate(batch.left) if not left]
        try:
            if not calls:
                return
            total = sum(batch.rows[k] for k in calls)
            padded = 1 << (total - 1).bit_length() if total else 0  # (calls of no rows: none)
            inputs = []
            for j in range(len(batch.calls[0])):
                parts = [np.asarray(c[j].result()) if isinstance(c[j], Pending) else c[j]
                         for c in (batch.calls[k] for k in calls)]  # fmt: skip
                if padded > total:  # copies of a row (the first call may have none)
                    rows = next(p for p in parts if p.shape[axis])
                    parts.append(
                        np.repeat(np.take(rows, [0], axis=axis), padded - total, axis=axis)
                    )
                inputs.append(np.concatenate(parts, axis=axis))
            _, _, key = self._split(tuple(with_arrays(statics, inputs)))
            try:
                prog = await self._program(tuple(key), inputs, statics)
                out = await self._launch(prog, inputs)
            except Exception:
                if len(calls) == 1 and padded == total:
                    raise
                # A kernel raised on some call's rows: one caller's bad input must not fail
                # the others (nor show them its error). Each call runs again alone, and gets
                # its own result or its own error, as it would unbatched. So does a trace
                # that failed: its error named the batch's shapes, not the caller's (a meta
                # rule's "got float32[4, 5]" for a call of one row).
                for i, k in enumerate(calls):
                    if not batch.left[k]:
                        value, error = await self._alone(batch.calls[k], statics)
                        batch.done[k](value, error)
                    delivered = i + 1
                return
            self._done_running(gk)  # the model is free: the next batch need not wait for us
            running = False
            check_rows(out, axis, padded, repr(self))
            bounds = np.cumsum([0, *(batch.rows[k] for k in calls)])
            for i, k in enumerate(calls):
                if i:
                    # One caller resumed per loop iteration: woken all at once, a batch's
                    # callers would run back to back (each answering its client) and hold
                    # the loop for all of them; this way other work runs in between.
                    await anyio.sleep(0)
                lo, hi = int(bounds[i]), int(bounds[i + 1])
                batch.done[k](slice_rows(out, axis, lo, hi), None)
                delivered = i + 1
        except BaseException as exc:
            for k in calls[delivered:]:
                batch.done[k](None, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            for held in batch.held:  # (each caller's already, unless the batch failed early)
                held.release()
            if running:
                self._done_running(gk)

    def _done_running(self, gk: Hashable) -> None:
        """A batch of group ``gk`` no longer runs (the last one's entry goes: it holds its
        runtime). If none runs now, the calls that gathered meanwhile launch: they waited
        for the model, and it is free (they waited out ``max_wait`` with nothing running,
        and closing the runtime waited for their timer)."""
        left = self._running[gk] - 1
        if left:
            self._running[gk] = left
            return
        del self._running[gk]
        batch = self._batches.get(gk)
        if batch is not None and batch.live:
            self._flush(batch.key, batch)

    async def _alone(
        self, arrays: Sequence[Any], statics: list[Any]
    ) -> tuple[Any, Exception | None]:
        """One call of a failed batch, run by itself: (its outputs, None) or (None, its error)."""
        try:
            values = [np.asarray(a.result()) if isinstance(a, Pending) else a for a in arrays]
            _, _, key = self._split(tuple(with_arrays(statics, values)))
            prog = await self._program(tuple(key), values, statics)
            return await self._launch(prog, values), None
        except Exception as exc:
            return None, exc
