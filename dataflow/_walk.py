"""The one walker over nested arguments and results.

Which containers dataflow looks inside, everywhere (dispatch finding an op's pending inputs,
kernels getting their values, graph tracing, the Dask wire encoding, ``materialize``):

* ``list`` and ``tuple`` (exactly those types), rebuilt as the same type;
* NamedTuples (a ``tuple`` subclass with ``_fields``), rebuilt as the same class;
* ``dict`` (exactly), its values (keys are left alone), rebuilt with the same keys in order.

Anything else is a leaf and is passed through as it is: sets, subclasses of ``list``/``dict``,
dataclasses and other objects are not looked into, so a pending value hidden in one is not an
input of the op it is passed to (and its kernel gets the handle, not the array). The walks are
iterative, so arbitrarily deep nesting does not hit Python's recursion limit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ._errors import DataflowTypeError

__all__ = ["ATOMS", "is_container", "items", "leaves", "rebuild", "replace"]

#: Types that are always leaves, never pending, never copied: the arguments the walks over a
#: call's arguments skip at once (``scan``, ``protect``), and that an op's signature key holds
#: by value (``_op``). Classes (``np.float32``, ``float``) and numpy's dtypes (each of its own
#: class in numpy 2) are among them: ``astype(x, np.float32)`` took the general scan, which
#: keys neither, and ran its meta rule at every call (8.9 us against 2.6 with ``"float32"``).
ATOMS = frozenset(
    {int, float, complex, bool, str, bytes, type(None), slice, type(Ellipsis), type}
    | {type(np.dtype(code)) for code in np.typecodes["All"]}
)

# Containers by kind: 0 list, 1 tuple, 2 NamedTuple, 3 dict; None for a leaf.
_LIST, _TUPLE, _NAMED, _DICT = range(4)


def _kind(value: Any) -> int | None:
    t = type(value)
    if t is list:
        return _LIST
    if t is tuple:
        return _TUPLE
    if t is dict:
        return _DICT
    if isinstance(value, tuple) and hasattr(t, "_fields"):
        return _NAMED
    return None


def is_container(value: Any) -> bool:
    """Whether dataflow walks into ``value`` (see the module docstring)."""
    return _kind(value) is not None


def items(value: Any) -> list[Any]:
    """A container's items (a dict's values), in order."""
    return list(value.values()) if type(value) is dict else list(value)


def rebuild(value: Any, children: list[Any]) -> Any:
    """A container of ``value``'s kind (and keys) holding ``children`` instead."""
    kind = _kind(value)
    if kind == _LIST:
        return children
    if kind == _TUPLE:
        return tuple(children)
    if kind == _NAMED:
        return type(value)(*children)
    if kind == _DICT:
        return dict(zip(value.keys(), children, strict=True))
    raise DataflowTypeError(
        f"rebuild(): {type(value).__name__} is not a container (list, tuple, NamedTuple or dict)"
    )


def leaves(value: Any) -> Iterator[Any]:
    """Every leaf inside ``value`` (``value`` itself when it is a leaf), depth first, in order."""
    stack = [value]
    while stack:
        v = stack.pop()
        if _kind(v) is None:
            yield v
        else:
            children = items(v)
            children.reverse()
            stack.extend(children)


def replace(value: Any, fn: Callable[[Any], Any]) -> Any:
    """``value`` with every leaf ``x`` replaced by ``fn(x)``; containers rebuilt (iteratively).

    A container whose leaves are all returned unchanged is still rebuilt (a new object);
    callers that want to keep the original test for that themselves.
    """
    if _kind(value) is None:
        return fn(value)
    # Frames: [container, its items, the next item's index, the replaced items so far].
    root: list[Any] = [value, items(value), 0, []]
    stack = [root]
    while True:
        frame = stack[-1]
        container, children, i, done = frame
        if i == len(children):
            stack.pop()
            built = rebuild(container, done)
            if not stack:
                return built
            stack[-1][3].append(built)
            continue
        frame[2] = i + 1
        child = children[i]
        if _kind(child) is None:
            done.append(fn(child))
        else:
            stack.append([child, items(child), 0, []])
