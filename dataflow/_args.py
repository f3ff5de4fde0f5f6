"""An op call's arguments: the tasks of the pending handles among them, and their values.

Containers are walked as :mod:`dataflow._walk` says (lists, tuples, NamedTuples, dicts).
"""

from __future__ import annotations

from typing import Any

from ._task import DONE, Pending, Task
from ._walk import is_container, leaves, replace

__all__ = ["resolve", "resolve_kwargs", "scan"]


def _leaf_value(v: Any) -> Any:
    return v.result() if isinstance(v, Pending) else v


def resolve(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with every pending handle (also inside containers) replaced by its value."""
    out = []
    for a in args:
        if isinstance(a, Pending):
            out.append(a.result())
        elif is_container(a):
            out.append(replace(a, _leaf_value))
        else:
            out.append(a)
    return tuple(out)


def resolve_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: _leaf_value(v) if not is_container(v) else replace(v, _leaf_value)
            for k, v in kwargs.items()}  # fmt: skip


def scan(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> tuple[tuple[Task, ...], bool]:
    """The tasks of the pending handles in ``args``/``kwargs`` (containers walked), and
    whether all of them are done."""
    inputs: list[Task] = []
    for a in args if not kwargs else (*args, *kwargs.values()):
        if isinstance(a, Pending):
            inputs.append(a._t)
        elif is_container(a):
            inputs.extend(v._t for v in leaves(a) if isinstance(v, Pending))
    return tuple(inputs), all(t.state == DONE for t in inputs)
