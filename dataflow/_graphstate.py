"""The dependency state of the graph, and the transitions that change it: pure functions.

The state is plain data on the :class:`~dataflow._task.Task` records (as ``dask/local.py``
keeps it in dicts): ``state``, ``inputs`` (what a task reads), ``dependents`` (who reads it),
``waiting`` (how many inputs are unfinished) and ``waiters`` (coroutines awaiting its value).
The functions here change it and return what must happen next, and nothing else: they take no
lock, touch no event loop, thread or instrument, and keep no counts. The scheduler calls them
under its lock and acts on what they return (queue the ready tasks, wake the waiters, account
for each finished task with the runtime that owns it). So every rule of the graph can be
tested with a few Task records and no runtime at all (``tests/test_graphstate.py``).

Transitions::

    add:     a new task waits for its unfinished inputs (or fails with a failed one's error)
    start:   READY -> RUNNING (False when it was cancelled or failed meanwhile)
    finish:  RUNNING -> DONE; dependents whose last input this was become READY
    fail:    a task and, transitively, everything that depends on it -> FAILED (or CANCELLED)
"""

from __future__ import annotations

from ._errors import CancelledTaskError
from ._task import CANCELLED, DONE, FAILED, PENDING, READY, RUNNING, Task

__all__ = ["add", "fail", "finish", "start", "take_waiters"]


def add(task: Task) -> Task | None:
    """Make a new task wait for its unfinished inputs; READY if it waits for none.

    Returns the first input that already failed (or was cancelled), if any: the task must
    then fail with that input's error (see :func:`fail`), and is left waiting for nothing.
    A task listed twice as an input (two outputs of one op) is waited for once.
    """
    n = 0
    failed: Task | None = None
    for t in task.inputs:
        st = t.state
        if st < DONE:
            deps = t.dependents
            if deps is None:
                t.dependents = [task]
            elif deps[-1] is not task:  # else: listed before (two outputs of one op)
                deps.append(task)
            else:
                continue
            n += 1
        elif st != DONE and failed is None:
            failed = t
    task.waiting = n
    if failed is None and n == 0:
        task.state = READY
    return failed


def start(task: Task) -> bool:
    """READY -> RUNNING; False (and nothing changes) when the task is no longer READY."""
    if task.state != READY:
        return False
    task.state = RUNNING
    return True


def finish(task: Task, value: object, release: bool = True) -> list[Task] | None:
    """RUNNING -> DONE with ``value``; returns the dependents that became READY (or None).

    The task lets go of its kernel and arguments, and (``release``) of its inputs, so their
    values can be freed; an observer that still reads ``inputs`` later passes False.
    """
    task.value = value
    task.state = DONE
    task.fn = task.args = task.kwargs = task.handles = None
    if release:
        task.inputs = ()
    deps = task.dependents
    if deps is None:
        return None
    task.dependents = None
    ready: list[Task] | None = None
    for d in deps:
        d.waiting -= 1
        if d.waiting == 0 and d.state == PENDING:
            d.state = READY
            if ready is None:
                ready = [d]
            else:
                ready.append(d)
    return ready


def fail(task: Task, err: BaseException | None) -> list[Task]:
    """Fail ``task`` and, transitively, every unfinished task that depends on it.

    A :class:`~dataflow.CancelledTaskError` makes them CANCELLED, anything else FAILED; all
    share the one error. Returns every task that changed, ``task`` first (the only one that
    can have been RUNNING: the others were waiting for it). Finished tasks are skipped, so a
    task fails at most once.
    """
    changed: list[Task] = []
    final = CANCELLED if isinstance(err, CancelledTaskError) else FAILED
    stack = [task]
    while stack:
        t = stack.pop()
        if t.state >= DONE:
            continue
        t.state = final
        t.error = err
        t.fn = t.args = t.kwargs = t.handles = None
        t.inputs = ()
        changed.append(t)
        deps = t.dependents
        if deps is not None:
            t.dependents = None
            stack.extend(deps)
    return changed


def take_waiters(task: Task) -> list[object] | None:
    """The coroutines' waiters registered on ``task`` (now to be woken), and forget them."""
    waiters = task.waiters
    task.waiters = None
    return waiters
