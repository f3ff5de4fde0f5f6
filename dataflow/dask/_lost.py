"""Lost workers: what Dask recovers by itself, what the client must send again, and the error
when neither can.

When a worker dies, Dask's scheduler (``Scheduler.remove_worker``):

* **reschedules the tasks it was running** on other workers, and gives up on a task only
  after ``distributed.scheduler.allowed-failures`` workers died running it (the task then
  errs with ``KilledWorker``: its kernel probably crashes its worker process);
* **recomputes the results it held** when they can be computed again, from the task's spec
  and its inputs;
* **forgets data that was scattered** to it (``client.scatter``: the scheduler has no spec to
  recompute it from), and with it, transitively, every task that depends on it and was not
  computed yet. The client's futures of those tasks are cancelled with the reason ``"already
  forgotten"``; a new graph that names a forgotten key is cancelled as a whole, with the
  reason ``"lost dependencies"``; a fetch of a value that was lost that way is cancelled with
  no reason (then the scheduler's event log, which lists the keys each removed worker held,
  tells a loss from a cancel).

The backend (``_revive``) repairs the third case from the client, which still has
everything that was lost: each task's kernel and arguments, and the arrays it scattered. It
scatters again what was lost, and sends again, under new keys and in dispatch order, every
task Dask dropped, its dropped inputs first (:meth:`DaskBackend._revive`). A task is sent
again at most :data:`MAX_RESENDS` times; past that, or for a ``KilledWorker``, the task fails
with :class:`WorkerLostError` naming the workers lost, never as a cancellation.

This module holds the pure part: telling a loss from a cancellation, finding which workers
were lost from the scheduler's event log, and the errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .._errors import TaskError, describe

__all__ = [
    "MAX_RESENDS",
    "WorkerLostError",
    "cancel_reason",
    "dropped",
    "killed_worker_error",
    "lost_workers",
    "resend_failed_error",
    "resend_limit_error",
]

#: How many times one task is sent again after losses before it fails with WorkerLostError.
MAX_RESENDS = 5

# The reasons the scheduler gives when it drops a key because data it needs was lost.
_LOSS_REASONS = frozenset({"already forgotten", "lost dependencies"})
_EVENT_KEYS = ("processing-tasks", "lost-computed-tasks", "lost-scattered-tasks")


class WorkerLostError(TaskError):
    """A task could not be computed because Dask workers were lost (their processes died).

    Raised where Dask and the backend cannot recover: a task whose workers keep dying while
    running it (Dask's ``KilledWorker``), a task sent again too many times, or lost data that
    cannot be sent again.

    Attributes:
        workers: the addresses of the workers that were lost (may be empty when the scheduler
            did not say).
    """

    def __init__(self, message: str, *, task: str, op: str, workers: list[str]) -> None:
        super().__init__(message, task=task, op=op)
        self.workers = workers


def dropped(future: Any) -> str | None:
    """Why Dask gave up on ``future``, or None while it has not.

    ``"lost"``: data it needs was lost with a worker (the scheduler said so). ``"unsaid"``:
    cancelled without a reason, which is also how the scheduler answers a client asking
    about a key it forgot (a fetch that found the value gone); the caller tells a loss from
    a cancel by the event log (:func:`lost_workers`). ``"cancelled"``: cancelled for another
    reason (a scheduler restart, a cancel that gave one).
    """
    if future.status != "cancelled":
        return None
    reason = getattr(getattr(future._state, "exception", None), "reason", None)
    if reason in _LOSS_REASONS:
        return "lost"
    if reason is None or reason == "unknown":
        return "unsaid"
    return "cancelled"


def cancel_reason(future: Any) -> str:
    """The reason Dask gave for cancelling ``future``, for an error message."""
    exc = getattr(future._state, "exception", None)
    reason = getattr(exc, "reason", None)
    return reason if isinstance(reason, str) and reason != "unknown" else ""


def lost_workers(events: Iterable[Any], mine: Callable[[Any], bool]) -> list[str]:
    """The workers whose removal lost keys for which ``mine(key)`` is true, oldest first.

    ``events`` is the scheduler's ``"all"`` event log (``client.get_events("all")``): pairs
    ``(timestamp, message)``; a removed worker logs ``{"action": "remove-worker", "worker":
    address, "processing-tasks": keys, "lost-computed-tasks": keys, "lost-scattered-tasks":
    keys, ...}``. Entries of another shape are skipped.
    """
    out: list[str] = []
    for event in events:
        try:
            _, msg = event
        except (TypeError, ValueError):
            continue
        if not isinstance(msg, dict) or msg.get("action") != "remove-worker":
            continue
        worker = msg.get("worker")
        if not isinstance(worker, str) or worker in out:
            continue
        if any(mine(k) for field in _EVENT_KEYS for k in msg.get(field) or ()):
            out.append(worker)
    return out


def killed_worker_error(name: str, op: str, exc: BaseException) -> WorkerLostError:
    """The error of task ``name`` whose workers all died running it (``KilledWorker``)."""
    worker = getattr(getattr(exc, "last_worker", None), "address", None)
    failures = getattr(exc, "allowed_failures", None)
    deaths = f"{failures + 1} workers" if isinstance(failures, int) else "every worker"
    err = WorkerLostError(
        f"{name} failed: its Dask worker {worker or '(unknown)'} was lost while running it, "
        f"and {deaths} that ran it died (Dask then gives up: "
        "`distributed.scheduler.allowed-failures`). The kernel probably crashes its worker "
        "process (a segfault, or running out of memory); the workers' logs say why",
        task=name,
        op=op,
        workers=[worker] if worker else [],
    )
    err.__cause__ = exc
    return err


def resend_limit_error(name: str, op: str, workers: list[str], sends: int) -> WorkerLostError:
    """The error of task ``name``, dropped by Dask after worker losses ``sends`` times."""
    lost = ", ".join(workers) if workers else "(the scheduler's event log does not say which)"
    return WorkerLostError(
        f"{name} could not be computed: Dask workers were lost with data it needs ({lost}), "
        f"and it was sent again {sends} times; the cluster keeps losing workers (the workers' "
        "logs say why: out of memory?)",
        task=name,
        op=op,
        workers=workers,
    )


def resend_failed_error(
    name: str, op: str, workers: list[str], exc: BaseException
) -> WorkerLostError:
    """The error of task ``name`` when what a lost worker held could not be sent again."""
    lost = ", ".join(workers) if workers else "a Dask worker"
    err = WorkerLostError(
        f"{name} could not be computed: {lost} was lost with data it needs, and sending that "
        f"data again failed: {describe(exc)}",
        task=name,
        op=op,
        workers=workers,
    )
    err.__cause__ = exc
    return err
