"""Sending again what Dask dropped because a worker was lost: the client's side of ``_lost``.

``_lost`` says what Dask recovers by itself and holds the pure part (telling a loss from a
cancellation, finding the workers lost, the errors); this layer acts on it. It gathers every
sent task Dask dropped, with its dropped inputs, scatters again the arrays lost, and sends
the tasks again under new keys, through the same ``_scatter`` and ``_map`` as a first send
(hence its place above ``_ship``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from .._log import logger
from .._task import Task
from ._lost import (
    MAX_RESENDS,
    dropped,
    lost_workers,
    resend_failed_error,
    resend_limit_error,
)
from ._remote import Remote, task_inputs, was_lost
from ._ship import Shipping

__all__ = ["Revival"]


class Revival(Shipping):
    """Tasks Dask dropped with a lost worker, sent again (see the module docstring)."""

    # -- lost workers (see _lost) -------------------------------------------------------------

    async def _revive(self, tasks: list[Task]) -> None:
        """Send again what Dask dropped because a worker was lost (see ``_lost``).

        ``tasks`` were dropped; with them go every other sent task Dask dropped, and their
        dropped inputs, transitively: tasks already computed whose values were lost and that
        Dask cannot recompute (they read scattered data that was lost). The arrays lost are
        scattered again; the tasks are sent in dispatch order (inputs first) under new keys.
        """
        async with self._reviving:
            found: dict[int, Task] = {}
            stack = [*tasks, *self._remote.values()]
            while stack:
                t = stack.pop()
                if t.id in found or not was_lost(t):
                    continue
                found[t.id] = t
                stack.extend(task_inputs(t))
            if not found or self._sched.cancelling:
                return
            again = sorted(found.values(), key=lambda t: t.id)
            workers = await self._lost_workers()
            for t in list(again):
                rem: Remote = t.value
                if not workers and dropped(rem.future) == "unsaid":
                    # Cancelled with no reason, and no worker holding our keys was lost:
                    # a cancel after all (another client's, with our key).
                    self._cancelled(t, rem)
                    again.remove(t)
                    continue
                rem.sends += 1
                if rem.sends > MAX_RESENDS:
                    err = resend_limit_error(t.name, t.op, workers, MAX_RESENDS)
                    self._sched.failures.append(err)
                    self._finish_failed(t, rem, err, ran=False)
                    again.remove(t)
            if not again:
                return
            try:
                scattered = await self._scatter(again)
            except Exception as exc:
                for t in again:
                    if was_lost(t):
                        err = resend_failed_error(t.name, t.op, workers, exc)
                        self._sched.failures.append(err)
                        self._finish_failed(t, t.value, err, ran=False)
                return
            # While it scattered, a task may have been cancelled, or the runtime be closing.
            again = [t for t in again if was_lost(t)]
            if not again or self._sched.cancelling:
                return
            logger.warning(
                "a Dask worker was lost: sending again what it held",
                workers=workers,
                tasks=len(again),
                arrays=scattered,
            )
            for t in again:
                rem = t.value
                rem.key = f"{t.sig.name}-{self.token}-{t.id}-{rem.sends}"
            for t, fut in self._map(again, self._fail_resent):
                t.value.future = fut
                self.resent += 1

    async def _lost_workers(self) -> list[str]:
        """The workers whose loss cost this runtime keys (the scheduler's event log)."""
        token = f"-{self.token}-"
        scattered = self._scattered.keys

        def mine(key: Any) -> bool:
            return isinstance(key, str) and (token in key or key in scattered)

        try:
            events = await asyncio.wait_for(self.client.get_events("all"), 5.0)
        except Exception:  # the log only names the workers in messages
            return []
        return lost_workers(events, mine)

    def _fail_resent(self, task: Task, err: BaseException) -> None:
        """Fail a task that was sent before and could not be sent again (``_map``'s ``fail``)."""
        self._finish_failed(task, task.value, err, ran=False)
