"""Which runtime the calling code belongs to: the context variable, and the runtimes by loop.

Every op call asks this (``_op``: ``_current.get() or loop_runtime()``), so the lookups are
kept to a context-variable read and, off a runtime's context, a dictionary lookup by the
running loop's key. The :class:`~dataflow.Runtime` sets both when it is entered and clears
them when it closes (``_runtime``). Nothing here imports ``_runtime`` (only its type, for
the annotations), so a module that only looks the runtime up (``_op``) needs no import of it.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

from . import _loop
from ._errors import NoRuntimeError

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ["current_runtime", "get_runtime", "loop_runtime"]

_current: contextvars.ContextVar[Runtime | None] = contextvars.ContextVar(
    "dataflow_runtime", default=None
)

# The runtimes open on each event loop, oldest first. Code on the loop that did not inherit the
# context a Runtime was entered in (the handler tasks of a server started elsewhere) still
# finds the loop's runtime through this; the context variable wins where it is set.
_by_loop: dict[object, list[Runtime]] = {}


def loop_runtime() -> Runtime | None:
    """The oldest runtime open on the running event loop, if any (None off the loop)."""
    if not _by_loop:
        return None
    key = _loop.loop_key()
    rts = _by_loop.get(key) if key is not None else None
    return rts[0] if rts else None


def current_runtime() -> Runtime | None:
    """The runtime of the calling context, or None outside of one.

    That is the innermost ``Runtime`` entered in this context (inherited by the tasks and
    threads it starts) or, failing that, the oldest one open on the running event loop.
    """
    return _current.get() or loop_runtime()


def get_runtime(what: str) -> Runtime:
    """The current runtime, or a NoRuntimeError that says how to start one."""
    rt = _current.get() or loop_runtime()
    if rt is None:
        raise NoRuntimeError(
            f"{what} needs a running dataflow runtime. Start one with "
            "`dataflow.run(main)` in a script, or `async with dataflow.Runtime(): ...` "
            "inside an application whose event loop is already running."
        )
    return rt
