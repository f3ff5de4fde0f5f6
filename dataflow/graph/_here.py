"""A short plan run whole on the calling thread, now, without a launch (:func:`run_here`).

A compiled forward whose plan runs on the launching thread anyway (``Program.runs_here``: a
short plan of small or GIL-bound kernels) while nothing observes the runtime calls this
instead of launching it: node after node, in graph order, with none of the lean executor's
shared state (``_lean``: gather and runner tasks, run lists, a heap and a lock, which are
there so that several runners can share a run). Kernel times are sampled and values checked
as the lean executor's are, with the scheduler's sampling constants (``_scheduler._placement``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._errors import TaskError, task_failed
from .._pool import GRAPH_LOCK
from .._scheduler._base import stops_here
from .._scheduler._placement import FIRST_RUNS, SAMPLE
from ._ir import map_refs
from ._slots import NODE, NODE_OUT, output_value, ref_value

if TYPE_CHECKING:
    from .._runtime import Runtime
    from ._launch import Program

__all__ = ["run_here"]


def run_here(prog: Program, rt: Runtime, inputs: Sequence[Any]) -> Any:
    """Run a whole plan on the calling thread, now, node after node, and return its outputs.

    For a launch that runs here anyway (``Program.runs_here``: a short plan of small or
    GIL-bound kernels) while nothing observes the runtime, so ``launch``'s bookkeeping buys
    nothing: no gather or runner task, no run lists, heap or lock, no trip through the
    graph lock, no waiter. That bookkeeping cost about 7 us a call (a 3-layer MLP at batch 1,
    five nodes of about 1 us each, took 19.8 us a call compiled, against numpy's 5.7 us).
    The nodes run in graph order (a node reads only nodes before it: ``Program.ordered``),
    their kernel times sampled and values checked as the lean executor's are. Nothing is
    protected: no caller code runs until the plan is done. A kernel that raises fails the
    call with the TaskError awaiting the launched run would raise (recorded in the runtime's
    failures, as observed).
    """
    sched = rt._sched
    n = prog.size
    values: list[Any] = [None] * n
    kernels = prog.kernels
    sigs = prog.sigs
    slots_of = prog.slots
    args_of = prog.args
    timed = sched._timed

    def value_of(ref: Any) -> Any:
        return ref_value(ref, inputs, prog.constants, values.__getitem__)

    for i in range(n):
        # A node's arguments are bound here as ``LeanRun``'s runner binds them (``_lean``),
        # inline in both: a shared helper would cost a call per node on both hot paths.
        slots = slots_of[i]
        if slots is None:
            args = map_refs(args_of[i], value_of)
            kwargs = prog.kwargs[i]
            if kwargs:
                kwargs = map_refs(kwargs, value_of)
        else:
            args = list(args_of[i])
            for pos, kind, src, index in slots:
                if kind == NODE:
                    args[pos] = values[src]
                elif kind == NODE_OUT:
                    args[pos] = values[src][index]
                else:
                    args[pos] = inputs[src]
            kwargs = None
        sig = sigs[i]
        fn = kernels[i]
        calls = sig.calls = sig.calls + 1
        try:
            if calls <= FIRST_RUNS or not calls % SAMPLE:
                value = timed(sig, fn, args, kwargs)
                if sig.check is not None:
                    sig.check_value(value)
            else:
                value = fn(*args, **kwargs) if kwargs else fn(*args)
        except BaseException as exc:
            err: TaskError = task_failed(prog.node_name(i), sig.name, exc)
            err.observed = True
            with GRAPH_LOCK:
                sched.failures.append(err)
            sched.inline_run += i
            if stops_here(exc, err):  # Ctrl-C in a kernel on this (the loop's) thread
                raise
            raise err from exc
        values[i] = value
    sched.inline_run += n
    return map_refs(
        prog.outputs, lambda ref: output_value(ref, inputs, prog.constants, values.__getitem__)
    )
