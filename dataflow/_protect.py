"""Arrays passed to an op that runs later are protected from writes until it has run.

An op returns at once and its kernel may run later, so an array the caller passed and then
changed would silently change the result (numpy computes eagerly: ``y = x + 1; x[:] = 100``
leaves ``y`` alone). For a task that does not run at dispatch, each writeable ndarray among
its arguments (containers walked) is, at dispatch:

* **copied** when it is small (at most :data:`COPY_BYTES`, 64 KiB: a few microseconds), so
  the kernel sees the array as it was at the call, exactly numpy's answer: the copy keeps the
  memory order (``copy("K")``), since numpy's float sums add in memory order (a Fortran-order
  array's C-order copy summed to another float32); or
* **frozen** otherwise: the array and every array it is a view of are made read-only until
  every task reading them has run, then made writeable again. A write meanwhile raises
  numpy's ``ValueError: assignment destination is read-only`` at the write, instead of a
  silently different result; ``dataflow.frozen_by(array)`` names the tasks holding it.

Arrays that are already read-only are left alone (the caller cannot change them either). A
view made *before* the call keeps its own flag, so writing through such a view is not caught
(numpy keeps the writeable flag per view); module parameters and inputs are usually passed
as they are, which is what this protects. Kernels that run at dispatch on the calling thread
(tiny ones, and short GIL-bound ones through the pool's GIL lane) read their inputs right away
and need none of this.

In a child made by ``os.fork()`` no task of the parent ever runs, so every array frozen at the
fork is writeable again there (:func:`_thaw_all_in_child`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from ._walk import ATOMS, is_container, leaves, replace

if TYPE_CHECKING:
    from ._task import Task

__all__ = ["COPY_BYTES", "frozen_by", "protect", "thaw"]

#: Writeable arrays up to this size are copied at dispatch; larger ones are frozen.
COPY_BYTES = 64 * 1024

_ndarray = np.ndarray
_lock = threading.Lock()
# id(array) -> [array, freeze count, the tasks holding it]
_frozen: dict[int, list[Any]] = {}
# Views no task holds any more, waiting for a base still frozen for another task.
_waiting: dict[int, np.ndarray[Any, Any]] = {}


def _chain(a: np.ndarray[Any, Any]) -> list[np.ndarray[Any, Any]]:
    """``a`` and the arrays it is a view of, view first."""
    out = [a]
    b = a.base
    while isinstance(b, _ndarray):
        out.append(b)
        b = b.base
    return out


def _freeze(a: np.ndarray[Any, Any], task: Task) -> None:
    with _lock:
        arr = a
        while True:  # a and the arrays it is a view of
            entry = _frozen.get(id(arr))
            if entry is not None and entry[0] is arr:
                entry[1] += 1
                entry[2].append(task)
            elif arr.flags.writeable:
                arr.flags.writeable = False
                _frozen[id(arr)] = [arr, 1, [task]]
            base = arr.base
            if not isinstance(base, _ndarray):
                return
            arr = base


def _leaf(task: Task, frozen: list[np.ndarray[Any, Any]]) -> Any:
    def protect_leaf(v: Any) -> Any:
        if type(v) is _ndarray:
            if v.flags.writeable:
                if v.nbytes <= COPY_BYTES:
                    return v.copy("K")
            elif id(v) not in _frozen:  # read-only by the caller's choice: nothing to do
                return v
            _freeze(v, task)  # (or already frozen for another task: one more reader)
            frozen.append(v)
        return v

    return protect_leaf


def _needs_copy(v: Any) -> bool:
    return type(v) is _ndarray and v.flags.writeable and v.nbytes <= COPY_BYTES


def _protect_container(value: Any, leaf: Any) -> Any:
    """A container, rebuilt only if an array in it is copied (else the same object, its big
    arrays frozen): a kernel may rely on the identity of what it was passed."""
    if any(_needs_copy(v) for v in leaves(value)):
        return replace(value, leaf)
    for v in leaves(value):
        leaf(v)
    return value


def protect(task: Task) -> None:
    """Copy or freeze the writeable arrays among ``task``'s arguments (module docstring)."""
    args = task.args
    if args is None:
        return
    frozen: list[np.ndarray[Any, Any]] | None = None
    new: list[Any] | None = None
    i = -1
    for a in args:  # (no enumerate: an object for the garbage collector on every dispatch)
        i += 1
        # Arrays passed as they are (the common case, on every queued op's dispatch) are
        # handled here, without the closure that containers and keywords walk with.
        if type(a) is _ndarray:
            if a.flags.writeable:
                if a.nbytes <= COPY_BYTES:
                    if new is None:
                        new = list(args)
                    new[i] = a.copy("K")
                    continue
            elif id(a) not in _frozen:  # read-only by the caller's choice: nothing to do
                continue
            _freeze(a, task)  # (or already frozen for another task: one more reader)
            if frozen is None:
                frozen = [a]
            else:
                frozen.append(a)
        elif type(a) not in ATOMS and is_container(a):
            if frozen is None:
                frozen = []
            b = _protect_container(a, _leaf(task, frozen))
            if b is not a:
                if new is None:
                    new = list(args)
                new[i] = b
    if new is not None:
        task.args = tuple(new)
    kwargs = task.kwargs
    if kwargs and any(type(v) not in ATOMS for v in kwargs.values()):
        # (Keywords with plain values only, ``axis=0``, the common case: nothing to walk.)
        if frozen is None:
            frozen = []
        leaf = _leaf(task, frozen)
        task.kwargs = {k: _protect_container([v], leaf)[0] for k, v in kwargs.items()}
    if frozen:
        task.frozen = frozen


def thaw(task: Task) -> None:
    """``task``'s kernel has run (or never will): release the arrays it froze."""
    frozen = task.frozen
    if not frozen:
        return
    task.frozen = None
    with _lock:
        for a in frozen:
            # Bases first: a view can be made writeable only once its base is.
            for arr in (a,) if a.base is None else reversed(_chain(a)):
                entry = _frozen.get(id(arr))
                if entry is None or entry[0] is not arr:
                    continue
                entry[1] -= 1
                holders = entry[2]
                if task in holders:
                    holders.remove(task)
                if entry[1] == 0:
                    del _frozen[id(arr)]
                    _restore(arr)
        if _waiting:
            for arr in list(_waiting.values()):  # a base of theirs may be writeable now
                _restore(arr)


def _restore(arr: np.ndarray[Any, Any]) -> None:
    """Make ``arr`` writeable again, or once its base is (a view cannot be before)."""
    try:
        arr.flags.writeable = True
    except ValueError:  # its base is still frozen for another task
        _waiting[id(arr)] = arr
    else:
        _waiting.pop(id(arr), None)


def _thaw_all_in_child() -> None:
    """In a child made by ``os.fork()``: the tasks that froze arrays run in the parent only,
    so nothing would ever make those arrays writeable again here (the child's copy of a
    module's parameters stayed read-only). Bases first: a view can be made writeable only
    once its base is."""
    _lock._at_fork_reinit()  # type: ignore[attr-defined]
    arrays = [entry[0] for entry in _frozen.values()]
    arrays.extend(_waiting.values())
    _frozen.clear()
    _waiting.clear()
    for arr in sorted(arrays, key=lambda a: len(_chain(a))):  # (a view's chain is longer)
        # (ValueError: its base was read-only before the parent froze anything)
        with contextlib.suppress(ValueError):
            arr.flags.writeable = True


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_thaw_all_in_child)


def frozen_by(array: np.ndarray[Any, Any]) -> list[str]:
    """The names of the pending tasks that hold ``array`` read-only (empty if none).

    Example:
        >>> x[:] = 0          # ValueError: assignment destination is read-only
        >>> dataflow.frozen_by(x)
        ['matmul#12']
    """
    with _lock:
        names: list[str] = []
        for arr in _chain(array):
            entry = _frozen.get(id(arr))
            if entry is not None and entry[0] is arr:
                names.extend(t.name for t in entry[2] if t.name not in names)
        return names
