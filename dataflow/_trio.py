"""The bridge to a trio run (:class:`TrioLoop`), the :class:`~dataflow._loop.HostLoop` a
runtime entered under trio uses (``_loop.current``); trio is imported only here."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Callable, Coroutine
from typing import Any

from ._loop import HostLoop

__all__ = ["TrioLoop"]


class _TrioWait:
    """An awaitable over a ``trio.Event`` (which itself is not awaitable). Done once set, or
    once the coroutine awaiting it stopped (cancelled): nobody waits on it any more, as an
    asyncio future is done once cancelled."""

    __slots__ = ("event", "left")

    def __init__(self, event: Any) -> None:
        self.event = event
        self.left = False

    def __await__(self) -> Any:
        try:
            return (yield from self.event.wait().__await__())
        except BaseException:
            self.left = True
            raise

    def done(self) -> bool:
        return self.left or bool(self.event.is_set())


class TrioLoop(HostLoop):
    """The bridge to a trio run.

    Forked coroutines run as trio *system tasks*, each in a cancel scope of its own, counted
    by the runtime, which waits for them before it closes. (A nursery opened on entry could
    not be closed inside the runtime's shielded clean-up: trio requires scopes to nest.) A
    system task is given the forking code's context, as an asyncio task would be.

    Requests are trio tasks (``trio.lowlevel.current_task()``). trio has no callback for a
    task's end, so the first request the runtime tracks adds an instrument to the run whose
    ``task_exited`` hook reports the tracked ones (after the hook: trio calls it inside its
    scheduler); the runtime's close removes it. trio does not say how a task ended, so every
    end is reported as not cancelled: what a request dispatched is dropped when a
    cancellation interrupted one of its awaits on a pending value (``Pending.__await__``),
    not when it was cancelled while waiting for something else.
    """

    library = "trio"

    def __init__(self, token: Any) -> None:
        super().__init__(token)
        import trio

        self._trio = trio
        self.scopes: set[Any] = set()
        self._idle: Any = None
        # The tracked requests' end callbacks, and the instrument that reports their ends.
        self._ends: dict[Any, Callable[[Any, bool], None]] = {}
        self._instrument: Any = None

    def current_task(self) -> Any:
        try:
            return self._trio.lowlevel.current_task()
        except RuntimeError:  # on the run's thread but outside a task
            return None

    def on_task_done(self, task: Any, fn: Callable[[Any, bool], None]) -> None:
        self._ends[task] = fn
        if self._instrument is None:
            self._instrument = _task_ends(self._trio, self._task_exited)
            self._trio.lowlevel.add_instrument(self._instrument)

    def finished_code(self, task: Any) -> Any:
        coro = task.coro  # (a finished coroutine has no frame)
        return coro.cr_code if getattr(coro, "cr_frame", True) is None else None

    def _task_exited(self, task: Any) -> None:
        """The instrument's hook: a task of the run ended (called inside trio's scheduler).

        A tracked one's callback runs two scheduling rounds later: a task that ended with an
        exception (a cancellation) leaves it, with the traceback that holds the task's
        frames and their variables, to the nursery that started it, and the parent task
        takes it in the next round; only then does a handle held by nothing but those
        frames go away, so that the request's end can tell what is still wanted.
        """
        fn = self._ends.pop(task, None)
        if fn is not None:
            later = functools.partial(self._post_quietly, functools.partial(fn, task, False))
            self._post_quietly(later)

    def _post_quietly(self, fn: Callable[[], None]) -> None:
        """Post ``fn`` unless the run is finishing (then nothing is left to drop)."""
        with contextlib.suppress(RuntimeError):
            self._post(fn)

    def waiter(self) -> _TrioWait:
        return _TrioWait(self._trio.Event())

    def done_waiter(self) -> _TrioWait:
        w = _TrioWait(self._trio.Event())
        w.event.set()
        return w

    def _complete(self, waiter: Any) -> None:
        waiter.event.set()

    def _post(self, fn: Callable[[], None]) -> None:
        try:
            self.key.run_sync_soon(fn)  # type: ignore[attr-defined]
        except self._trio.RunFinishedError:
            raise RuntimeError("the trio run has finished") from None

    def spawn(
        self,
        coro: Coroutine[Any, Any, Any],
        name: str,
        unstarted: Callable[[], None] | None = None,
    ) -> Any:
        scope = self._trio.CancelScope()
        self.scopes.add(scope)

        async def owned() -> None:
            try:
                with scope:
                    if unstarted is not None and scope.cancel_called:
                        # Cancelled before it started: it never runs, as an asyncio task
                        # cancelled before its first step (trio would run it up to its
                        # first checkpoint, all of it if it has none).
                        coro.close()
                        unstarted()
                        return
                    await coro
            except (KeyboardInterrupt, SystemExit) as exc:
                # (a system task may not raise: trio would make it TrioInternalError)
                if self.interrupt is None:
                    self.interrupt = exc
            finally:
                self.scopes.discard(scope)
                if not self.scopes and self._idle is not None:
                    self._idle.set()

        self._trio.lowlevel.spawn_system_task(owned, name=name, context=contextvars.copy_context())
        return scope

    def cancel(self, handle: Any) -> bool:
        if handle.cancel_called:
            return False
        handle.cancel()
        return True

    def cancel_requested(self) -> bool:
        return bool(self._trio.current_effective_deadline() == -math.inf)

    def cancel_all(self) -> None:
        for scope in list(self.scopes):
            scope.cancel()

    @property
    def tasks(self) -> set[Any]:
        """The forked coroutines still running (their cancel scopes)."""
        return self.scopes

    async def close(self) -> None:
        while self.scopes:
            self._idle = self._trio.Event()
            await self._idle.wait()
        self._idle = None
        if self._instrument is not None:
            with contextlib.suppress(KeyError, RuntimeError):
                self._trio.lowlevel.remove_instrument(self._instrument)
            self._instrument = None
            self._ends.clear()


def _task_ends(trio: Any, exited: Callable[[Any], None]) -> Any:
    """A trio instrument whose ``task_exited`` hook calls ``exited(task)`` (built here: trio
    is imported only where a runtime runs under it)."""

    class TaskEnds(trio.abc.Instrument):  # type: ignore[misc]
        def task_exited(self, task: Any) -> None:
            exited(task)

    return TaskEnds()
