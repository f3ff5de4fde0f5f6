"""Eager stack folding: a reduction along a pending stack's new axis runs as a fold.

``ops.sum(ops.stack(outs), axis=0)`` (the TorchScript tutorial's ``torch.stack(results)
.sum(dim=0)``) materializes the stacked array, 80 MB at the tutorial's size, then reduces it,
both after the last member ends and on one thread: 100 ms of the seed forward's 1.1 s in a
profile on 2 cores, mostly page faults on the fresh 80 MB. Called while the stack is still
pending, the reduction is dispatched instead as a chain of its binary op over the stacked
values, ``((a + b) + c) + d``: bit for bit the same (numpy reduces an outer axis in that order),
with no stacked array, and the first additions run while later members still compute. The
graph pass :func:`dataflow.graph.fold_stack_reductions` does the same to a traced graph, and
the same declarations drive both: ``op.stacks = True`` on a stack (a list of equal arrays,
then the new axis) and ``op.stack_fold = binary_op`` on a reduction called as ``(x, axis,
keepdims=False)``, with, optionally, ``op.stack_finish = binary_op`` applied last as
``finish(folded, count)`` (a mean: the sum's fold divided by the count) and
``op.stack_fold_dtypes`` naming the only dtypes folded; only floating values are folded.

The stack task itself is left alone while anyone may read it: when its handle dies (the
``ops.stack(...)`` temporary, right after the reduction call) and no other task reads it, it
is dropped unrun, as a cancelled request's unwanted work is (``_scheduler._requests``). A
program that keeps the stacked handle gets it computed as before.

Only the local backend folds (a traced program records what it called; Dask runs its graph
as given). The check costs dispatch one attribute read, on calls with pending inputs of ops
that declare ``stack_fold``.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from ._pool import GRAPH_LOCK
from ._task import READY, Pending

if TYPE_CHECKING:
    from ._op import Op
    from ._signature import Signature
    from ._task import Task

__all__ = ["fold_stack", "foldable"]


def fold_stack(
    op: Op[..., Any], sig: Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``op(*args, **kwargs)`` as a fold of ``op.stack_fold`` when it reduces a pending stack
    along its new axis (see the module docstring); None when it does not apply."""
    if len(args) > 3 or not args or (kwargs and set(kwargs) - {"axis", "keepdims"}):
        return None
    x = args[0]
    if not isinstance(x, Pending) or x._index is not None:
        return None
    stack = x._t
    if stack.state > READY:
        return None
    sop = stack.sig.op
    if sop is None or getattr(sop, "stacks", False) is not True:
        return None
    skw = stack.kwargs or {}
    sargs = stack.args or ()
    if set(skw) - {"axis"} or len(sargs) > 2:
        return None
    items: Any = sargs[0] if sargs else None
    if type(items) not in (list, tuple) or len(items) < 2:
        return None
    stack_axis = sargs[1] if len(sargs) > 1 else skw.get("axis", 0)
    axis = args[1] if len(args) > 1 else kwargs.get("axis")
    keepdims = args[2] if len(args) > 2 else kwargs.get("keepdims", False)
    stacked, out = stack.sig.spec, sig.spec
    dtype, shape = getattr(stacked, "dtype", None), getattr(stacked, "shape", None)
    if dtype is None or type(shape) is not tuple or getattr(out, "dtype", None) != dtype:
        return None
    item_dtypes = [getattr(item, "dtype", None) for item in items]
    if not foldable(op, dtype, item_dtypes, len(shape), axis, stack_axis, keepdims):
        return None
    fold: Any = op.stack_fold  # type: ignore[attr-defined]
    acc: Any = items[0]
    for item in items[1:]:
        acc = fold(acc, item)
    finish: Any = getattr(op, "stack_finish", None)
    if finish is not None:
        acc = finish(acc, len(items))
    # The stack: dropped unrun once its handle is gone, unless something else reads it.
    stack.handles = weakref.ref(x, functools.partial(_unwanted, stack))
    return acc


def foldable(
    op: Any,
    dtype: Any,
    item_dtypes: Iterable[Any],
    ndim: int,
    axis: Any,
    stack_axis: Any,
    keepdims: Any,
) -> bool:
    """Whether the reduction ``op`` of a stack (``ndim`` dimensions, ``dtype``, the reduction's
    output's too) of values of ``item_dtypes``, called with ``axis`` and ``keepdims`` on a
    stack along ``stack_axis``, may run as a fold: the rules the eager fold and the graph pass
    (``graph.fold_stack_reductions``) share."""
    if keepdims is not False or type(axis) is not int or type(stack_axis) is not int:
        return False
    if np.dtype(dtype).kind != "f":
        return False
    if not -ndim <= axis < ndim or axis % ndim != stack_axis % ndim:
        return False
    if axis % ndim == ndim - 1:
        # numpy reduces the innermost axis pairwise (and in SIMD lanes), not left to right:
        # a chain of binary ops would round differently (and max/min pick another signed 0).
        return False
    if any(d != dtype for d in item_dtypes):
        return False  # the stack promotes mixed dtypes first: a fold would round differently
    only = getattr(op, "stack_fold_dtypes", None)
    return only is None or np.dtype(dtype).name in only


def _unwanted(stack: Task, _ref: object = None) -> None:
    """The stack's handle died, in any thread (perhaps one that holds the graph lock): drop
    it now if the lock is free, else on the loop thread soon, if nothing else wants it."""
    if stack.state > READY:
        return
    if GRAPH_LOCK.acquire(blocking=False):  # (never waits: this thread may hold it)
        try:
            _drop_locked(stack)
        finally:
            GRAPH_LOCK.release()
        return
    rt = stack.runtime
    if rt is None or rt.host is None:
        return
    with contextlib.suppress(RuntimeError):  # the loop is closed: the run is over
        rt.host.later(lambda: _drop(stack))


def _drop(stack: Task) -> None:
    with GRAPH_LOCK:
        _drop_locked(stack)


def _drop_locked(stack: Task) -> None:
    rt = stack.runtime
    sched = None if rt is None else rt._sched
    if sched is not None:
        sched.drop_locked_tasks(
            [stack], "its value was folded into a reduction and nothing else reads it"
        )
