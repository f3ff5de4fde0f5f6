"""The signature key of an op call's arguments (``Op.__call__``'s general pass).

An op caches one :class:`~dataflow._signature.Signature` per *argument signature* (``_op``'s
docstring, "Signatures"). ``Op.__call__`` keys the common calls itself (arrays, handles,
scalars, a flat list of them); every other call (keywords, nested containers, other types)
takes :func:`scan_arguments`, which walks the arguments once and returns the key, the pending
inputs, their values where all are ready, and whether they are. Both paths key an argument
the same way, so they share signatures (``tests/test_scheduler.py``, ``TestSignatureCache``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._task import DONE, Pending, Task
from ._walk import ATOMS as _ATOMS
from ._walk import is_container, items, leaves

__all__ = ["MAX_KEY_DEPTH", "nested_key", "scan_arguments"]

_ndarray = np.ndarray
# Nested arguments deeper than this are not keyed (the call is not cached).
MAX_KEY_DEPTH = 32


def nested_key(value: Any, inputs: list[Task], depth: int) -> tuple[Any, ...] | None:
    """The key of a container argument, collecting the pending inputs inside it.

    None when the container (or something in it) cannot be keyed; the inputs are then still
    all collected (by the iterative walk), so dispatch stays right.
    """
    if depth > MAX_KEY_DEPTH:
        inputs.extend(v._t for v in leaves(value) if isinstance(v, Pending))
        return None
    out: list[Any] = [type(value)]
    if type(value) is dict:
        out.extend(value.keys())
    ok = True
    for v in items(value):
        if isinstance(v, Pending):
            pt = v._t
            inputs.append(pt)
            k = pt.sig.keys[v._index or 0]
            if k is None:
                ok = False
            out.append(k)
            continue
        t = type(v)
        if t is _ndarray:
            out.append(v.shape)
            out.append(v.dtype)
        elif t in _ATOMS:
            out.append(t)
            out.append(v)
        elif is_container(v):
            sub = nested_key(v, inputs, depth + 1)
            if sub is None:
                ok = False
            out.append(sub)
        else:
            ok = False
    return tuple(out) if ok else None


def scan_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[list[Any] | None, list[Task], list[Any] | None, bool]:
    """``__call__``'s pass over any arguments (keywords, containers, other types):
    the signature key (None: not cacheable), the pending inputs, the values (None when
    the scheduler must resolve them) and whether every input is done."""
    key: list[Any] | None = []
    inputs: list[Task] = []
    values: list[Any] | None = []
    ready = True
    for a in args:
        if isinstance(a, Pending):
            t = a._t
            inputs.append(t)
            if t.state != DONE:
                ready = False
            elif values is not None:
                values.append(a.result())
            if key is not None:
                k = t.sig.keys[a._index or 0]
                if k is None:
                    key = None
                else:
                    key.append(k)
            continue
        if values is not None:
            values.append(a)
        ta = type(a)
        if ta is _ndarray:
            if key is not None:
                key.append(a.shape)
                key.append(a.dtype)
        elif ta in _ATOMS:
            if key is not None:
                key.append(ta)
                key.append(a)
        elif is_container(a):
            n = len(inputs)
            sub = nested_key(a, inputs, 0)
            if sub is None:
                key = None
            elif key is not None:
                key.append(sub)
            if len(inputs) > n:  # pending values inside: resolved by the scheduler
                values = None
                for t in inputs[n:]:
                    if t.state != DONE:
                        ready = False
        else:
            key = None
    if kwargs:
        values = None
        if key is not None:
            key.append(None)  # a marker: keywords follow
        for name, a in kwargs.items():
            if key is not None:
                key.append(name)
            n = len(inputs)
            sub = nested_key([a], inputs, 0)
            if sub is None:
                key = None
            elif key is not None:
                key.append(sub)
            for t in inputs[n:]:
                if t.state != DONE:
                    ready = False
    return key, inputs, values, ready
