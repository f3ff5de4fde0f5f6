"""The host-loop bridge: the one place that knows which event loop dataflow runs on.

A runtime lives on the event loop of the code that opened it: asyncio (uvloop included) or
trio, detected with ``sniffio`` as anyio does. Everything the runtime needs from the loop goes
through a :class:`HostLoop`:

* **waiters**: ``waiter()`` makes the object a coroutine awaits until a task is done (an
  asyncio future, a ``trio.Event``), and ``wake(waiters)`` completes them from any thread. A
  worker thread's wake-ups are batched: the first posts one callback to the loop
  (``call_soon_threadsafe`` / ``TrioToken.run_sync_soon``), later ones join its batch, so a
  burst of finishing kernels costs the loop one wake-up, not one each.
* **forked coroutines**: ``spawn`` starts one as a task the runtime owns: an asyncio task or
  a trio system task in a cancel scope of its own; either is tracked, cancelled if the body
  fails, and awaited before the runtime closes. An anyio task group would do both, but its
  ``start_soon`` measured ~30 us per task against ~4 us for ``loop.create_task`` (``fork`` is
  a hot path).
* ``cancel_requested()``: whether the running task is being cancelled (checked by a dispatcher
  held back by backpressure, which runs no checkpoint of its own).

``current()`` makes the bridge for the running loop; ``loop_key()`` names the running loop
(to find the runtimes open on it) at the cost of one attribute lookup under asyncio. The
asyncio bridge is here; trio's is in ``_trio`` (imported only under trio).

A trio task is asked about first (sniffio's answer, as anyio's): in a trio *guest run* on an
asyncio loop (``trio.lowlevel.start_guest_run``) trio's tasks run inside that loop's
callbacks, so a running asyncio loop does not make the calling code asyncio's. Once a
runtime was entered in such a run, ``loop_key`` asks too (``_guests``).
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
import traceback
import types
from collections.abc import Callable, Coroutine
from typing import Any

from ._errors import DataflowError

__all__ = ["AsyncioLoop", "HostLoop", "current", "loop_key", "running_library"]

# Whether a runtime was entered in a trio guest run on an asyncio loop (module docstring):
# from then on ``loop_key`` asks whether a trio task runs before it names the asyncio loop.
_guests = False


def _in_trio() -> bool:
    """Whether a trio task of a run on this thread is the caller (what sniffio says first)."""
    if "trio" not in sys.modules:
        return False
    import sniffio

    lib = sniffio.thread_local.name or sniffio.current_async_library_cvar.get()
    if lib != "trio":
        return False
    import trio

    try:
        trio.lowlevel.current_task()
    except RuntimeError:  # the variable was copied out of a run: no trio task is the caller
        return False
    return True


def running_library() -> str | None:
    """``"asyncio"`` or ``"trio"`` when called from a coroutine of that library, else None."""
    if _in_trio():
        return "trio"
    if asyncio._get_running_loop() is not None:
        return "asyncio"
    return None


def loop_key() -> object | None:
    """An identity of the running event loop (None off any loop): asyncio's loop, trio's token."""
    loop = asyncio._get_running_loop()
    if loop is not None and not _guests:
        return loop
    if _in_trio():
        import trio

        token: object = trio.lowlevel.current_trio_token()
        return token
    return loop


class HostLoop:
    """What the runtime needs from its event loop (see the module docstring)."""

    library = ""
    #: A KeyboardInterrupt or SystemExit a forked coroutine raised that the loop could not let
    #: through itself (trio's system tasks may not raise): the runtime's exit raises it.
    interrupt: BaseException | None = None

    def __init__(self, key: object) -> None:
        self.key = key
        self.thread_id = threading.get_ident()
        self._batch: list[Any] = []
        self._posted = False
        self._mutex = threading.Lock()

    def waiter(self) -> Any:
        """A fresh awaitable that :meth:`wake` completes."""
        raise NotImplementedError

    def done_waiter(self) -> Any:
        """An awaitable that is already complete."""
        raise NotImplementedError

    def _complete(self, waiter: Any) -> None:
        raise NotImplementedError

    def _post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop thread soon (from another thread)."""
        raise NotImplementedError

    def wake(self, waiters: list[Any]) -> None:
        """Complete ``waiters``; from another thread, batched into one loop callback."""
        if threading.get_ident() == self.thread_id:
            for w in waiters:
                self._complete(w)
            return
        with self._mutex:
            self._batch.extend(waiters)
            if self._posted:
                return
            self._posted = True
        try:
            self._post(self._flush)
        except RuntimeError:  # the loop is closed: nobody is left to wake
            with self._mutex:
                self._batch.clear()
                self._posted = False

    def _flush(self) -> None:
        with self._mutex:
            batch, self._batch = self._batch, []
            self._posted = False
        for w in batch:
            self._complete(w)

    def later(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop thread after the current callback (called there), or soon
        (called from another thread)."""
        self._post(fn)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop thread: now if called there, else soon."""
        if threading.get_ident() == self.thread_id:
            fn(*args)
        else:
            self._post(lambda: fn(*args))

    def spawn(
        self,
        coro: Coroutine[Any, Any, Any],
        name: str,
        unstarted: Callable[[], None] | None = None,
    ) -> Any:
        """Start ``coro`` as a task owned by the runtime; returns a handle for :meth:`cancel`.

        ``unstarted`` (trio's bridge): cancelled before it started, the task never runs its
        coroutine (closed unrun) and calls ``unstarted()`` instead. An asyncio task does not
        run either; its done callback tells (``task.cancelled()``), so asyncio ignores it.
        """
        raise NotImplementedError

    def current_task(self) -> Any:
        """The running task (the request that dispatches), or None where it is not tracked."""
        return None

    def current_task_getter(self) -> Callable[[], Any]:
        """:meth:`current_task` as a function of no arguments, as cheap as the loop allows
        (the scheduler calls it on every deferred dispatch from the loop)."""
        return self.current_task

    def on_task_done(self, task: Any, fn: Callable[[Any, bool], None]) -> None:
        """Call ``fn(task, cancelled)`` on the loop when ``task`` ends."""

    def release_frames(self, task: Any) -> None:
        """Let go of the local variables of a finished, cancelled task's frames."""

    def finished_code(self, task: Any) -> Any:
        """The code object of ``task``'s coroutine once the task has finished; None while it
        runs (or where the loop cannot tell)."""
        return None

    def cancel(self, handle: Any) -> bool:
        """Cancel a spawned task (True if it was still running)."""
        raise NotImplementedError

    def cancel_requested(self) -> bool:
        """Whether the running task is being cancelled."""
        raise NotImplementedError

    def raise_cancelled(self) -> None:
        """Raise the library's cancellation here if it can be raised outside a checkpoint."""

    def cancel_all(self) -> None:
        """Cancel every spawned task that is still running."""

    async def open(self) -> None:
        """Prepare to spawn (trio: open the nursery). Called from the runtime's entering task."""

    async def close(self) -> None:
        """Wait for the spawned tasks to end (after they were cancelled or finished)."""

    def release(self) -> None:
        """The runtime closed: let go of what tasks that outlive it hold of it (their end
        callbacks, ``on_task_done``)."""


class AsyncioLoop(HostLoop):
    """The bridge to an asyncio (or uvloop) event loop."""

    library = "asyncio"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.loop = loop
        self.tasks: set[asyncio.Task[Any]] = set()
        self._discard = self.tasks.discard  # (bound once: a bound method a spawn is an object)
        # The end callbacks given to tasks that outlive the runtime maybe (``on_task_done``):
        # taken back at its close, or the task (the code that entered the runtime, a server's
        # long-lived task) held the closed runtime through them, and its context, for good.
        self._watched: dict[asyncio.Task[Any], Callable[[Any], None]] = {}

    def waiter(self) -> asyncio.Future[None]:
        return self.loop.create_future()

    def done_waiter(self) -> asyncio.Future[None]:
        fut = self.loop.create_future()
        fut.set_result(None)
        return fut

    def _complete(self, waiter: Any) -> None:
        if not waiter.done():
            waiter.set_result(None)

    def _post(self, fn: Callable[[], None]) -> None:
        self.loop.call_soon_threadsafe(fn)

    def later(self, fn: Callable[[], None]) -> None:
        if threading.get_ident() == self.thread_id:
            self.loop.call_soon(fn)  # no self-pipe write from the loop's own thread
        else:
            self.loop.call_soon_threadsafe(fn)

    def spawn(
        self,
        coro: Coroutine[Any, Any, Any],
        name: str,
        unstarted: Callable[[], None] | None = None,
    ) -> asyncio.Task[Any]:
        task = self.loop.create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._discard)
        return task

    def cancel(self, handle: Any) -> bool:
        return bool(handle.cancel())

    def current_task(self) -> Any:
        return asyncio.current_task(self.loop)

    def current_task_getter(self) -> Callable[[], Any]:
        # asyncio.current_task is C from Python 3.12; on 3.11 it is a Python function over
        # the C module's dict of current tasks: bound to this loop, either is a C call.
        current = asyncio.current_task
        if not isinstance(current, types.BuiltinFunctionType):
            tasks = getattr(asyncio.tasks, "_current_tasks", None)
            if type(tasks) is dict:
                return functools.partial(tasks.get, self.loop)
        return functools.partial(current, self.loop)

    def on_task_done(self, task: Any, fn: Callable[[Any, bool], None]) -> None:
        watched = self._watched

        def ended(t: Any) -> None:
            watched.pop(t, None)
            fn(t, t.cancelled())

        watched[task] = ended
        task.add_done_callback(ended)

    def release_frames(self, task: Any) -> None:
        # result() of a cancelled task raises the CancelledError it stored (and forgets it);
        # clearing its traceback's frames releases their locals (traceback.clear_frames).
        try:
            task.result()
        except asyncio.CancelledError as exc:
            traceback.clear_frames(exc.__traceback__)
        except BaseException:
            pass

    def finished_code(self, task: Any) -> Any:
        return getattr(task.get_coro(), "cr_code", None) if task.done() else None

    def cancel_requested(self) -> bool:
        current = asyncio.current_task()
        return current is not None and current.cancelling() > 0

    def raise_cancelled(self) -> None:
        raise asyncio.CancelledError

    def cancel_all(self) -> None:
        """Cancel every spawned task that is still running."""
        for t in list(self.tasks):
            t.cancel()

    async def close(self) -> None:
        while self.tasks:
            await asyncio.wait(set(self.tasks))

    def release(self) -> None:
        for task, ended in self._watched.items():
            task.remove_done_callback(ended)
        self._watched.clear()


def current(what: str) -> HostLoop:
    """The bridge for the running event loop, or a DataflowError saying where to call from."""
    if _in_trio():
        import trio

        from ._trio import TrioLoop

        if asyncio._get_running_loop() is not None:  # a guest run (module docstring)
            global _guests
            _guests = True
        return TrioLoop(trio.lowlevel.current_trio_token())
    loop = asyncio._get_running_loop()
    if loop is not None:
        return AsyncioLoop(loop)
    raise DataflowError(
        f"{what} must run inside a coroutine on an asyncio (or uvloop) or trio event loop: "
        "use `dataflow.run(main)` in a script, or `async with dataflow.Runtime(): ...` inside "
        "async code"
    )
