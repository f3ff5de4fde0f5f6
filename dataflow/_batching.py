"""Cross-request batching for compiled forwards (``dataflow.compile(..., batch_axis=)``).

:class:`~dataflow._compile.Compiled` decides when calls are gathered and launched (its
module docstring, "Cross-request batching"); this module holds the pieces it gathers them
with: a :class:`Batch` (the calls gathered for one launch, their rows, and a way back to each
caller, who may stop waiting: see :meth:`Batch.leave`), the :class:`Timer` that closes a batch
after ``max_wait``, and the helpers that put a call's arrays among its static arguments and
cut a batched output back into each call's rows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from ._walk import replace

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ["ARRAY_SLOT", "Batch", "Timer", "slice_rows", "with_arrays"]

_ndarray = np.ndarray

#: Marks an array argument's place among a call's static arguments (``Compiled._split``).
ARRAY_SLOT = object()


def with_arrays(statics: list[Any], arrays: list[Any]) -> list[Any]:
    """The call's arguments again: ``arrays`` put back in the places ``ARRAY_SLOT`` marks."""
    it = iter(arrays)
    return [next(it) if s is ARRAY_SLOT else s for s in statics]


def slice_rows(out: Any, axis: int, lo: int, hi: int) -> Any:
    """One call's rows ``lo:hi`` along ``axis`` of every array in a batched output."""

    def cut(v: Any) -> Any:
        if type(v) is _ndarray and v.ndim:
            index = [slice(None)] * v.ndim
            index[axis] = slice(lo, hi)
            return np.ascontiguousarray(v[tuple(index)])
        return v

    return replace(out, cut)


class Batch:
    """Calls gathered for one launch."""

    def __init__(self, key: Hashable, forget: Callable[[Hashable, Batch], None]) -> None:
        self.key = key
        self.calls: list[list[Any]] = []
        self.rows: list[int] = []
        self.done: list[Callable[[Any, BaseException | None], None]] = []
        # Per call: whether its caller stopped waiting (see leave); how many still wait.
        self.left: list[bool] = []
        self.live = 0
        self.size = 0
        self.closed = False
        self.timer: Timer | None = None
        self.rt: Runtime | None = None
        # The running batch's task (to cancel when every caller has left), and what takes an
        # unstarted batch out of its model's open batches (``Compiled._forget``).
        self.task: Any = None
        self.forget = forget

    def join(self, arrays: list[Any], rows: int, rt: Runtime) -> Awaitable[Any]:
        assert rt.host is not None
        self.rt = rt
        waiter = rt.host.waiter()
        box: list[Any] = []
        index = len(self.calls)

        def done(value: Any, exc: BaseException | None) -> None:
            box.append((value, exc))
            assert rt.host is not None
            rt.host.wake([waiter])

        self.calls.append(arrays)
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
        self.live -= 1
        if self.live:
            return
        if not self.closed:
            self.closed = True
            if self.timer is not None:
                self.timer.cancel()
            self.forget(self.key, self)
        elif self.task is not None and self.rt is not None and self.rt.host is not None:
            self.rt.host.cancel(self.task)


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
