"""What a runtime and a run start with unless told otherwise.

The default bound on tasks in flight (``Runtime(max_pending=)``, ``dataflow.run``), the
environment variable that points a script's runtimes at a Dask scheduler, and the choice of
event loop for a new run (:func:`resolve_loop_factory`: ``$DATAFLOW_LOOP``, else uvloop when
installed). They are read before any runtime exists (``dataflow.run`` picks its loop first,
``parallel_info`` reports the loop new runs would get), so they live apart from the
:class:`~dataflow.Runtime`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from ._errors import DataflowError, DataflowValueError

__all__ = ["DEFAULT_MAX_PENDING", "resolve_loop_factory"]

#: Tasks in flight (queued, waiting or running) past which dispatch is held back.
DEFAULT_MAX_PENDING = 100_000


def resolve_loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event-loop factory for ``loop`` = "auto" | "asyncio" | "uvloop" (None: asyncio's)."""
    if loop == "auto":
        # The CLI's --loop (and users) can set the process default through the environment.
        loop = os.environ.get("DATAFLOW_LOOP", "auto") or "auto"
    if loop == "asyncio":
        return None
    if loop not in ("auto", "uvloop"):
        raise DataflowValueError(
            f"loop must be 'auto', 'asyncio' or 'uvloop' (also in $DATAFLOW_LOOP), got {loop!r}"
        )
    try:
        import uvloop
    except ImportError:
        if loop == "uvloop":
            raise DataflowError(
                "loop='uvloop' was asked for but uvloop is not installed: "
                "`pip install uvloop` (not available on Windows), or use loop='asyncio'"
            ) from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
