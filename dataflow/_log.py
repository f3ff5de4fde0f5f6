"""The library's logger. dataflow never configures logging: the application (or our CLI) does."""

from __future__ import annotations

from typing import Any

import structlog

__all__ = ["logger"]

logger: Any = structlog.get_logger("dataflow")
