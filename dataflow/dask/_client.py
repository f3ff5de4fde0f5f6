"""The ``distributed`` client as the backend uses it: importing it, naming a key in a graph,
and closing a connection quietly.

Dask is an optional extra: :func:`import_distributed` imports it where the backend needs it
and, when it is missing, raises a DataflowError naming the command that installs it (on the
client and on every worker). :func:`key_ref` is the one difference between Dask versions the
backend meets: how a task's graph names another key (``dask.task_spec.Alias``; older Dask
takes a future made early, see ``_ship``). :class:`HangUpQuietly` closes a client the
runtime connected itself without the traceback Dask logs for its own hang-up. None of it
reads the backend's state, so it sits apart from the backend's layers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .._errors import DataflowError

__all__ = ["INSTALL_HINT", "HangUpQuietly", "import_distributed", "key_ref"]

INSTALL_HINT = "pip install 'dask[distributed]>=2024.1'"


def import_distributed() -> Any:
    """``distributed``, or a DataflowError naming the extra that installs it."""
    try:
        import distributed
    except ImportError as exc:
        raise DataflowError(
            f"backend='dask' needs dask.distributed, which is not installed ({exc}): "
            f"`{INSTALL_HINT}` (on the client and on every worker)"
        ) from None
    return distributed


def key_ref() -> Any:
    """``dask.task_spec.Alias``, which names a key in a graph; None before Dask had it."""
    try:
        from dask.task_spec import Alias
    except ImportError:
        return None
    return Alias


class HangUpQuietly(logging.Filter):
    """Close a client without the ``CommClosedError`` traceback of its own hang-up.

    ``Client.close`` tells the scheduler it leaves, and the scheduler closes the connection.
    Messages the client queued meanwhile (releases of futures garbage-collected while it
    closes, which Dask sends two loop turns later) then fail to send, and
    ``distributed.batched`` logs that failure with its traceback, during the close or (when
    the scheduler hung up first) at the next message, after it. Nothing is lost: the
    scheduler releases everything a departing client held. So, for this client's own
    connection only: the log is dropped while it closes, and its sender is stopped with what
    it still holds before the filter goes.
    """

    def __init__(self, client: Any) -> None:
        super().__init__()
        self.sender = getattr(client, "scheduler_comm", None)  # a BatchedSend
        self.comm = getattr(self.sender, "comm", None)
        self.logger = logging.getLogger("distributed.batched")

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (
            record.msg == "Batched Comm Closed %r"
            and isinstance(args, tuple)
            and bool(args)
            and args[0] is self.comm
        )

    async def __aenter__(self) -> None:
        self.logger.addFilter(self)

    async def __aexit__(self, *exc: object) -> None:
        try:
            sender = self.sender
            if sender is not None and self.comm is not None:
                sender.abort()  # drop what is still queued; its send loop ends
                await asyncio.wait_for(asyncio.ensure_future(sender.stopped.wait()), 1.0)
        except Exception:  # only the log is at stake
            pass
        finally:
            self.logger.removeFilter(self)
