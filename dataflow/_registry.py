"""The op registry: every declared op, by qualified name and by kernel, and the handle type
that stands for an ndarray input where a program is traced (``set_array_handle``).

``Op.__init__`` registers each op here; the graph tracer (``graph._capture``), graph files
(``graph._format`` writing them, ``graph._decoder`` reading) and Dask workers (``dask``) look ops
up.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._errors import DataflowTypeError

if TYPE_CHECKING:
    from ._op import Op

__all__ = [
    "array_handle",
    "declaring_module",
    "declaring_modules",
    "lookup_op",
    "op_for_kernel",
    "register",
    "set_array_handle",
]

# Weak, so an op declared in a function (a test, a notebook cell) goes away with its last user.
# The graph tracer finds the op behind a submitted kernel here, and `dataflow.load` resolves
# the ops a saved graph names: it never imports anything a file names, only looks ops up.

_by_qualname: weakref.WeakValueDictionary[str, Op[..., Any]] = weakref.WeakValueDictionary()
_by_kernel: weakref.WeakValueDictionary[tuple[int, str], Op[..., Any]] = (
    weakref.WeakValueDictionary()
)


_array_handle: tuple[Callable[..., Any], Callable[[Any], Any]] | None = None


def set_array_handle(handle: Callable[..., Any], spec: Callable[[Any], Any]) -> None:
    """Declare the handle type that stands for an ndarray input where a program is traced.

    ``dataflow`` knows no op library; the one in use (``ops`` does this on import) names its
    pending-array type and its spec rule, so that :func:`dataflow.trace` hands the program a
    pending placeholder of that type for each ndarray example input: numpy code applied to
    the input (``x @ w``, ``np.tanh(x)``) then dispatches to ops and is recorded, as
    ``torch.jit.trace`` records tensor ops, instead of running once at trace time.

    Args:
        handle: the handle type, called as ``handle(task, None, spec)``.
        spec: ``spec(array)``: the output spec of an array (its shape and dtype).
    """
    global _array_handle
    if not callable(handle) or not callable(spec):
        raise DataflowTypeError(
            f"set_array_handle(handle, spec): both must be callable, got "
            f"{type(handle).__name__} and {type(spec).__name__}"
        )
    _array_handle = (handle, spec)


def array_handle() -> tuple[Callable[..., Any], Callable[[Any], Any]] | None:
    """The (handle type, spec rule) declared by :func:`set_array_handle`, or None."""
    return _array_handle


def declaring_module() -> str:
    """The module whose top-level code is running: the innermost ``<module>`` frame."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_name != "<module>":
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "__main__"
    return str(frame.f_globals.get("__name__", "__main__"))


def register(op: Op[..., Any]) -> None:
    """Register a newly declared op (the latest declared under a name wins)."""
    _by_qualname[op.qualname] = op
    _by_kernel[id(op.kernel), op.name] = op


def declaring_modules() -> set[str]:
    """The modules that declared the ops now registered (each took part in dataflow on purpose)."""
    return {op.module for op in list(_by_qualname.values())}


def lookup_op(qualname: str) -> Op[..., Any] | None:
    """The live op registered under ``module:name`` (the latest declared), or None."""
    return _by_qualname.get(qualname)


def op_for_kernel(kernel: Callable[..., Any], name: str) -> Op[..., Any] | None:
    """The op whose kernel is ``kernel`` and whose name is ``name`` (as ``submit`` sees it)."""
    found = _by_kernel.get((id(kernel), name))
    return found if found is not None and found.kernel is kernel else None
