"""A cluster task's client-side state (:class:`Remote`), and the pure questions the layers ask
of a task: what it reads, whether one of its inputs failed, whether Dask dropped it.

A task placed on the cluster keeps a ``Remote`` in ``task.value`` from dispatch until its
value is on the client: READY while queued for the next flush, RUNNING once sent (the
``Remote`` holds its Dask future), DONE once fetched (see :mod:`dataflow.dask._backend`).
Every layer reads it, and :func:`~dataflow.dask._backend.place` tells a cluster input by it,
so it sits below them all: plain data, no asyncio, no client.
"""

from __future__ import annotations

from typing import Any

from .._scheduler import scan
from .._task import DONE, Task
from ._lost import dropped

__all__ = ["Remote", "failed_input", "task_inputs", "was_lost"]


class Remote:
    """A cluster task's client-side state, kept in ``task.value`` until the value is fetched."""

    __slots__ = ("fetching", "future", "key", "sends", "settled", "timed", "timeout", "wanted")

    def __init__(self, key: str, timed: bool, timeout: float | None = None) -> None:
        self.key = key
        self.timed = timed  # sent while an instrument was attached: the worker reports its span
        self.timeout = timeout  # the op's timeout: its kernel runs under it on the worker
        self.future: Any = None  # once sent
        self.settled = False  # it ended there (finished, failed or cancelled) and was counted
        self.wanted = False  # someone waits for its value on the client
        self.fetching = False
        self.sends = 0  # times sent again after Dask dropped it (a worker was lost; _lost)

    def __repr__(self) -> str:
        return f"<remote {self.key}>"


def task_inputs(task: Task) -> tuple[Task, ...]:
    """The tasks a task reads (its ``inputs`` are dropped once it settled; its arguments are
    kept until its value is on the client, so it can be sent again)."""
    if task.inputs or task.args is None:
        return task.inputs
    return scan(task.args, task.kwargs)[0]


def failed_input(task: Task) -> Task | None:
    return next((t for t in task_inputs(task) if t.state > DONE), None)


def was_lost(task: Task) -> bool:
    """A task sent to the cluster and not finished on the client that Dask dropped because
    data it needs was lost with a worker (see ``_lost``)."""
    rem = task.value
    return (
        type(rem) is Remote
        and task.state < DONE
        and rem.future is not None
        and dropped(rem.future) in ("lost", "unsaid")
    )
