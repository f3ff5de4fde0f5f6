"""The task-per-node launch of a program (:class:`PlanRun`): every node a task of its own.

While an instrument with hooks observes the runtime (events per task, or a recorder that
overrides ``Recorder.task``), a launch (``_launch.launch``) does not take the lean executor
(``_lean``), whose nodes run without tasks: the instrument would see none of them. It queues
a *launch* task instead, whose kernel (:meth:`PlanRun.start`) creates every node's task on a
pool thread, links them with the program's static structure (no argument scans, no meta or
cost rules, no handles) and queues those with no inputs; from there the scheduler runs them
like any task, so the trace sees every node: each node's task is reported created (with its
input nodes' tasks as its ``inputs``, the dependency edges of the trace), then runs. A node
task's kernel (:meth:`PlanRun.call`) drops an input's value once its last reader has run; the
gather task's (:meth:`PlanRun.finish`) builds the outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._pool import GRAPH_LOCK
from .._task import READY, Task
from .._timeout import TimedKernel
from ._ir import map_refs
from ._slots import NODE, NODE_OUT, output_value, ref_value

if TYPE_CHECKING:
    from .._runtime import Runtime
    from ._launch import Program

__all__ = ["PlanRun"]


class PlanRun:
    """One launch of a program: its node tasks, and the values they read."""

    __slots__ = ("base", "gather", "inputs", "left", "owner", "prog", "rt", "tasks", "timeouts")

    def __init__(self, prog: Program, rt: Runtime, inputs: Sequence[Any]) -> None:
        self.prog = prog
        self.rt = rt
        self.inputs = inputs
        self.tasks: list[Task] = []
        # Per node, one token per reader still to run (list.pop is atomic under the GIL).
        self.left: list[list[None]] = []
        self.base = 0.0
        self.gather: Task | None = None
        self.owner: Any = None  # the request it was launched for (see _scheduler)
        # Per node, its timeout (None: none), when any node has one (``launch``).
        self.timeouts: list[float | None] | None = None

    def _value(self, ref: Any) -> Any:
        return ref_value(ref, self.inputs, self.prog.constants, self._node_value)

    def _node_value(self, i: int) -> Any:
        return self.tasks[i].value

    def call(self, i: int) -> Any:
        """Run node ``i``'s kernel on its inputs' values (a node task's kernel)."""
        prog = self.prog
        slots = prog.slots[i]
        if slots is None:
            args = map_refs(prog.args[i], self._value)
            kwargs = prog.kwargs[i]
            if kwargs:
                kwargs = map_refs(kwargs, self._value)
        else:
            args = list(prog.args[i])
            tasks = self.tasks
            for pos, kind, src, index in slots:
                if kind == NODE:
                    args[pos] = tasks[src].value
                elif kind == NODE_OUT:
                    args[pos] = tasks[src].value[index]
                else:
                    args[pos] = self.inputs[src]
            kwargs = None
        value = prog.kernels[i](*args, **kwargs) if kwargs else prog.kernels[i](*args)
        # This reader is done with its inputs: drop a value once its last reader is.
        is_output = prog.is_output
        for j in prog.inputs[i]:
            tokens = self.left[j]
            tokens.pop()
            if not tokens and not is_output[j]:
                self.tasks[j].value = None
        return value

    def start(self) -> None:
        """Create and link every node's task, and queue the roots (the launch task's kernel)."""
        prog = self.prog
        rt = self.rt
        sigs = prog.sigs
        rank = prog.rank
        base = self.base
        call = self.call
        calls = prog.calls
        tasks = [Task(sigs[i], call, calls[i], None, rt) for i in range(prog.size)]
        self.tasks = tasks
        if self.timeouts is not None:
            for t, seconds in zip(tasks, self.timeouts, strict=True):
                if seconds is not None:  # armed where it runs, never inline on the loop
                    t.fn = TimedKernel(call, t, seconds)
        self.left = [[None] * len(r) for r in prog.readers]
        node_inputs = prog.inputs
        for i, t in enumerate(tasks):
            # Its input nodes, as an op's task holds the tasks it reads: the instruments see
            # them (``task_created``), and the recorders' dependency edges come from them.
            if node_inputs[i]:
                t.inputs = tuple([tasks[j] for j in node_inputs[i]])
            t.priority = base + rank[i]
            readers = prog.readers[i]
            if readers:
                t.dependents = [tasks[k] for k in readers]
            t.waiting = len(prog.inputs[i])
        gather = self.gather
        assert gather is not None
        for j in prog.output_nodes:
            t = tasks[j]
            if t.dependents is None:
                t.dependents = [gather]
            else:
                t.dependents.append(gather)
        gather.inputs = tuple([tasks[j] for j in prog.output_nodes])
        sched = rt._sched
        for t in tasks:  # (created before any of them is queued, so before it starts)
            sched.emit("task_created", t)
        if gather.inputs:  # (else reported by ``launch``: it may be queued already)
            sched.emit("task_created", gather)
        owner = self.owner
        with GRAPH_LOCK:
            sched.inflight += len(tasks)
            pool = sched.pool
            for i in prog.roots:
                tasks[i].state = READY
            if owner is not None:
                for t in tasks:
                    owner.add(t)
                if owner.dropped:  # the request was cancelled while this started
                    gather.dependents = None
                    sched.drop_locked_tasks(tasks)
                    return
            if pool is not None:
                for i in prog.roots:
                    pool.push_locked(tasks[i])
        if pool is None:  # the synchronous mode: run them here, in order
            for i in prog.roots:
                sched.execute_now(tasks[i])

    def finish(self, *inputs: Any) -> Any:
        """The outputs, built from the output nodes' values (the gather task's kernel)."""
        out = map_refs(
            self.prog.outputs,
            lambda ref: output_value(ref, self.inputs, self.prog.constants, self._node_value),
        )
        self.tasks = []  # the run is over: let every value go
        return out
