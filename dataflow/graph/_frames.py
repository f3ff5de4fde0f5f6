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


# Packages whose frames drive coroutines (event loops, their adapters): a traced program's
# outermost frame is called from one of them, so none of their lines is ever the user's.
_LOOP_PACKAGES = frozenset({"asyncio", "uvloop", "anyio", "trio", "sniffio", "outcome"})


def _is_loop_or_stdlib(top: str) -> bool:
    """Whether a frame of top-level package ``top`` belongs to an event loop or the standard
    library (``__main__`` is the user's, though its name is no package)."""
    return top in _LOOP_PACKAGES or (top in sys.stdlib_module_names and top != "__main__")


def user_location(
    skip_packages: set[str], start: int = 2, declared_in: str | None = None
) -> tuple[str, int, dict[str, Any]] | None:
    """(filename, line, globals) of the user's frame that called into the library, or None.

    Walking out from the caller, dataflow's own frames are skipped, and so are the frames of
    ``skip_packages``: the package that declared the op (``ops``), whose methods and modules
    call ops on the user's behalf, so the line worth showing is the user's call of them. The
    first frame outside both is the answer. But the walk stops at the event loop (asyncio,
    uvloop, trio, or any standard-library frame), which drives the traced coroutine: beyond
    it are the loop's lines and the code that started the trace, never the op's call site.

    When every frame before the loop is in ``skip_packages`` (the op was declared in the
    user's own module, ``__main__`` in a script; or a library's module is traced directly,
    its forward the program), the innermost of them outside ``declared_in`` (the op's
    declaring module, whose wrappers only pass the call on) is the call site, else the
    innermost. A loop or standard-library frame is never the answer: None when nothing else
    is on the stack.
    """
    frame: Any = sys._getframe(start)
    innermost = caller = None  # frames in skip_packages since the last loop frame
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        top = package(module) if isinstance(module, str) else ""
        if top == "dataflow":
            pass
        elif _is_loop_or_stdlib(top):
            if innermost is not None:
                break
        elif top not in skip_packages or not top:
            return frame.f_code.co_filename, frame.f_lineno, frame.f_globals
        else:
            if innermost is None:
                innermost = frame
            if caller is None and module != declared_in:
                caller = frame
        frame = frame.f_back
    found = caller or innermost
    if found is None:
        return None
    return found.f_code.co_filename, found.f_lineno, found.f_globals
