"""Finding the user's line: the innermost frame outside the library code that called us."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["package", "short_path", "user_location"]


def package(module: str) -> str:
    """The top-level package of a module name."""
    return module.split(".", 1)[0]


def short_path(filename: str) -> str:
    """``filename`` relative to the working directory when under it, else its base name."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # another drive (Windows)
        return os.path.basename(filename)
    return os.path.basename(filename) if rel.startswith("..") else rel


def user_location(
    skip_packages: set[str], start: int = 2
) -> tuple[str, int, dict[str, Any]] | None:
    """(filename, line, globals) of the innermost frame outside ``skip_packages``."""
    frame = sys._getframe(start)
    first = None
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not isinstance(module, str) or package(module) != "dataflow":
            if first is None:
                first = frame
            if not isinstance(module, str) or package(module) not in skip_packages:
                return frame.f_code.co_filename, frame.f_lineno, frame.f_globals
        frame = frame.f_back  # type: ignore[assignment]
    if first is None:
        return None
    return first.f_code.co_filename, first.f_lineno, first.f_globals
