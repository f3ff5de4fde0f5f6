"""The Dask backend's state and its lowest layer: the coroutines it owns, the calls it posts to
the loop, and the kernel spans workers report (see :mod:`dataflow.dask._backend` for the
policy and the layers).

Every coroutine the backend starts (flushes, watchers, fetches, cancels) goes through
:meth:`BackendBase._spawn`, which keeps it until it ends, so that ``close`` awaits them all
and an exception is logged, not lost.
"""

from __future__ import annotations

import asyncio
import os
import uuid
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._backend import DASK_ADDRESS_ENV
from .._errors import DataflowError, DataflowTypeError, DataflowValueError, TaskError
from .._log import logger
from .._scheduler import Scheduler
from .._task import Task
from ._client import import_distributed
from ._scatter import Scattered
from ._timing import Relay

if TYPE_CHECKING:
    from .._runtime import Runtime

__all__ = ["BackendBase"]


class BackendBase:
    """A Dask backend's state, and what every layer uses: owned coroutines, calls posted to
    the loop, cancels sent to Dask, kernel spans received (see :class:`DaskBackend`, whose
    constructor this is).
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        address: Any = None,
        client: Any = None,
        local_threshold: float = 1e-3,
        scatter_bytes: int = 16384,
        connect_timeout: float = 10.0,
    ) -> None:
        if runtime.simulate is not None:
            raise DataflowError("simulate= is for the local backend; it cannot run on Dask")
        import_distributed()
        if address is not None and client is not None:
            raise DataflowValueError("give the Dask backend address= or client=, not both")
        if address is None and client is None:
            address = os.environ.get(DASK_ADDRESS_ENV) or None
            if address is None:
                raise DataflowError(
                    "backend='dask' needs the scheduler: address='tcp://host:8786', "
                    "client=<an asynchronous distributed.Client>, or "
                    f"${DASK_ADDRESS_ENV} (which `dataflow run --dask ADDRESS` sets)"
                )
        for what, value in (("local_threshold", local_threshold), ("scatter_bytes", scatter_bytes)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise DataflowTypeError(
                    f"Runtime(backend='dask', {what}=) must be a number, got "
                    f"{type(value).__name__}: {value!r}"
                )
        if not local_threshold >= 0:
            raise DataflowValueError(
                f"local_threshold must be >= 0 seconds, got {local_threshold!r}"
            )
        if scatter_bytes < 0:
            raise DataflowValueError(f"scatter_bytes must be >= 0, got {scatter_bytes!r}")
        self.runtime = runtime
        self.address: Any = address
        self.client: Any = client
        self._own_client = client is None
        self.local_threshold = float(local_threshold)
        self.scatter_bytes = int(scatter_bytes)
        self.connect_timeout = connect_timeout
        self.token = uuid.uuid4().hex[:8]
        self._topic = f"dataflow-timing-{self.token}"
        self._subscribed = False
        self._sched: Scheduler = None  # type: ignore[assignment]  # on open
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        # Tasks queued for the next flush, and whether a flush is scheduled or running.
        self._outbox: list[Task] = []
        self._flush_scheduled = False
        # Sent and not settled: task id -> task (to cancel them all when the body fails).
        self._remote: dict[int, Task] = {}
        # Every task sent, held weakly: those alive at close whose value is still on the
        # cluster are failed with an error that says so (``_release_unfetched``).
        self._sent_tasks: weakref.WeakSet[Task] = weakref.WeakSet()
        # Futures of sent tasks dropped with their cancelled request, to cancel on Dask.
        self._dropping: list[Any] = []
        self._scattered = Scattered()
        # Failures by the name of the task whose kernel raised: one TaskError for all of them.
        self._errors: dict[str, TaskError] = {}
        self._reviving = asyncio.Lock()  # one _revive at a time (made again on open)
        # Tasks sent while an instrument was attached, waiting for their timing event.
        self._timed: dict[int, Task] = {}
        self._timed_drained: asyncio.Future[None] | None = None
        self._relay = Relay()
        self._clock = 0
        # Coroutines the backend started (flushes, watchers, fetches): awaited on exit.
        self._bg: set[asyncio.Task[Any]] = set()
        self.sent = 0
        self.remote_done = 0
        self.fetched = 0
        self.local_ops = 0
        self.resent = 0

    def __repr__(self) -> str:
        address = getattr(self.address, "scheduler_address", self.address)
        if address is None and self.client is not None:
            address = getattr(getattr(self.client, "scheduler", None), "address", "client")
        return (
            f"<DaskBackend address={address} sent={self.sent} remote={len(self._remote)} "
            f"queued={len(self._outbox)} fetched={self.fetched} local={self.local_ops}>"
        )

    @property
    def scattered(self) -> int:
        """How many arrays were scattered to the cluster (each once)."""
        return self._scattered.sent

    # -- the loop -----------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        """Run a coroutine on the runtime's loop, owned: awaited before the runtime closes."""
        task = self._loop.create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg_done)

    def _bg_done(self, task: asyncio.Task[Any]) -> None:
        self._bg.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            logger.error("dask backend coroutine failed", error=repr(exc), exc_info=exc)

    def _call_on_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        host = self.runtime.host
        assert host is not None
        host.call_soon(fn, *args)

    async def _cancel_futures(self, futures: list[Any]) -> None:
        if self.client is not None:
            await self.client.cancel(futures)

    # -- timings ------------------------------------------------------------------------------

    def _on_timing(self, event: tuple[float, Any]) -> None:
        """A worker reported a kernel's span (subscribe_topic handler, on the loop)."""
        task_id, start, end, failed, worker, thread_name, native_id = event[1]
        task = self._timed.pop(task_id, None)
        if task is not None:
            clock = self._clock
            self._relay.put(
                (worker, native_id),
                f"dask {worker} {thread_name}",
                self._sched,
                task,
                start - clock,
                end - clock,
                bool(failed),
            )
        drained = self._timed_drained
        if not self._timed and drained is not None and not drained.done():
            drained.set_result(None)
