"""The library's logger. dataflow never configures logging: the application (or our CLI) does.

Until the application configures structlog, structlog's default logger prints to standard
output, where a program's own output goes (a script whose stdout is piped into another
program, JSON written for a caller): the same events then go to standard error instead,
rendered by structlog's defaults. Once configured (``structlog.configure``, as ``dataflow
run`` and ``structlog.testing.capture_logs`` do), ``structlog.get_logger("dataflow")`` is used
as configured. Every call site is on an error path, so the check per call costs nothing that
matters.
"""

from __future__ import annotations

import sys
from typing import Any

import structlog

__all__ = ["logger"]


class _Logger:
    """``structlog.get_logger("dataflow")`` once structlog is configured, else the same
    events on standard error (module docstring)."""

    __slots__ = ("_configured",)

    def __init__(self) -> None:
        self._configured: Any = structlog.get_logger("dataflow")

    def __getattr__(self, name: str) -> Any:
        if structlog.is_configured():
            return getattr(self._configured, name)
        # (sys.stderr read at the call: a program or a test may have replaced it since)
        return getattr(structlog.wrap_logger(structlog.PrintLogger(sys.stderr)), name)


logger: Any = _Logger()
