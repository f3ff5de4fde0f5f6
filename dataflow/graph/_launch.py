"""Launching a whole graph at once: what a compiled forward does per call.

Eager dispatch (and ``graph.run``) submits one op at a time from the calling thread, each
paying for argument scans, signature lookups and handles: some microseconds an op, all on the
event loop. A :class:`Program` is a graph prepared once for repeated launches:

* per node: its kernel, its arguments as a template with the constants already in place and a
  list of the slots to fill from the graph's inputs and from other nodes' values, the nodes it
  reads and the nodes that read it (deduplicated), and its static critical-path rank;
* the structure of the outputs.

A launch (:func:`launch`) costs the calling thread O(1): it creates two tasks and queues
one; the *gather* task's value is the outputs, and awaiting it gives the arrays. (A short
plan of small or GIL-bound kernels, under :data:`PLAN_HERE_SECONDS` in all, is run whole on
the launching thread instead: ``Program.runs_here``; unobserved and called with arrays, a
compiled forward runs such a plan without a launch at all, ``_here.run_here``.) How the
nodes run depends on whether anything observes the runtime:

* **Unobserved or recorded** (the usual case): the queued task is a *runner* of the lean plan
  executor (``_lean``): a few runners run the nodes from per-run lists, well under a
  microsecond of scheduling a node, and the last one finishes the gather task.
  Recorders (a profile, a server's rolling timeline) get one span record per node from it.
* **Observed by an instrument with hooks** (events per task, or a recorder that overrides
  ``Recorder.task``): the queued task is a *launch* task
  (``_planrun.PlanRun``) that creates every node's task on a pool thread, links them with the
  static structure (no argument scans, no meta or cost rules, no handles), and queues those
  with no inputs; from there the scheduler runs them like any task (placement, continuation,
  the GIL lane, value checks, failures), so the trace sees every node. The gather task waits
  for the output nodes and builds the outputs.
* **Timed** (a node's op has a ``timeout``, or the runtime an ``op_timeout``; not in the
  synchronous mode): a launch task too, each timed node's kernel a ``TimedKernel``
  (``dataflow._timeout``): a runner of the lean executor runs many kernels, which no
  per-node deadline can time.

Either way a node's value is dropped as soon as its last reader has run (unless it is an
output).

The graph's inputs are protected once, at launch (``dataflow._protect``): small writeable
arrays are copied, large ones stay read-only until the gather has run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._instrument import ACTIVE, GENERATION, HOOKED
from .._pool import GRAPH_LOCK
from .._protect import protect
from .._scheduler._placement import SPAWN_CPU_SHARE
from .._scheduler._requests import AGING_TASKS
from .._signature import Signature
from .._task import PENDING, READY, Task, _next_id
from ._ir import ConstRef, NodeRef, iter_refs
from ._lean import LeanRun
from ._planrun import PlanRun
from ._slots import flat_slots

if TYPE_CHECKING:
    from .._runtime import Runtime
    from ._ir import Graph

__all__ = ["PLAN_HERE_EVERY", "PLAN_HERE_SECONDS", "Program", "launch"]

#: A plan whose kernels add up to less than this, none of them able to use a second thread,
#: runs on the launching thread (``Program.runs_here``): blocking the event loop this long
#: costs a server less than the hand-offs it saves, and eager ops run GIL-bound kernels
#: of up to a GIL switch interval (5 ms) on the dispatching thread.
PLAN_HERE_SECONDS = 1e-3
#: How often (in launches) a program works out again whether it runs on the launching thread.
PLAN_HERE_EVERY = 16


class Program:
    """A graph prepared for launches (see the module docstring)."""

    def __init__(self, graph: Graph) -> None:
        plan = graph.plan
        nodes = graph.nodes
        constants = graph.constants
        n = len(nodes)
        self.graph = graph
        self.size = n
        self.sigs: tuple[Signature, ...] = plan.sigs
        self.rank = plan.rank
        self.kernels: list[Callable[..., Any]] = [node.op.kernel for node in nodes]
        # Per node, its op's own timeout (None: the runtime's op_timeout, if any), and
        # whether any node has one: a timed launch runs a task per node (``launch``).
        self.timeouts: tuple[float | None, ...] = tuple(
            getattr(node.op, "timeout", None) for node in nodes
        )
        self.timed = any(t is not None for t in self.timeouts)
        self.args: list[tuple[Any, ...]] = []
        self.slots: list[tuple[tuple[int, int, int, int | None], ...] | None] = []
        self.kwargs: list[dict[str, Any] | None] = []
        self.inputs: list[tuple[int, ...]] = []
        self.readers: list[list[int]] = [[] for _ in range(n)]
        for i, node in enumerate(nodes):
            read = sorted({r.node for r in node.refs() if type(r) is NodeRef})
            self.inputs.append(tuple(read))
            for j in read:
                self.readers[j].append(i)
            flat = flat_slots(node.args)
            if flat is None or node.kwargs:
                # Nested references (a list of values to stack): bound by the generic walk.
                self.args.append(node.args)
                self.slots.append(None)
                self.kwargs.append(dict(node.kwargs) if node.kwargs else None)
            else:
                template = tuple(constants[a.name] if type(a) is ConstRef else a for a in node.args)
                self.args.append(template)
                self.slots.append(flat)
                self.kwargs.append(None)
        self.constants = constants
        self.outputs = graph.outputs
        self.output_nodes = tuple(
            sorted({r.node for r in iter_refs(graph.outputs) if type(r) is NodeRef})
        )
        self.is_output = [False] * n
        for j in self.output_nodes:
            self.is_output[j] = True
        self.roots = tuple(i for i in range(n) if not self.inputs[i])
        # For the lean executor (_lean): the nodes by rank (ranks are 0..n-1, the heap's
        # keys), per node how many nodes it reads and how many read it; the roots' ranks,
        # sorted (a heap).
        self.by_rank = [0] * n
        for i in range(n):
            self.by_rank[self.rank[i]] = i
        self.waits = [len(r) for r in self.inputs]
        self.nreaders = [len(r) for r in self.readers]
        self.root_keys = sorted(self.rank[i] for i in self.roots)
        self.locations = [node.location for node in nodes]
        self.runner_sig = Signature(f"run {graph.name}", inline=False)
        self.runner_sig.runner = True  # it runs many kernels: no GIL measurement, no span
        # One (i,) per node, made once: a node task's arguments (see PlanRun.call).
        self.calls = tuple((i,) for i in range(n))
        self.launch_sig = Signature(f"launch {graph.name}", inline=False)
        self.gather_sig = Signature(f"{graph.name}", None)
        self.gather_sig.seconds = 0.0  # building the outputs: small, runs where they finish
        # runs_here's last answer, and the launches so far (it is worked out every few).
        self._here = False
        self._launches = 0
        # Whether every node reads only nodes before it (a traced graph's order): then a
        # plan run here goes node after node (``_here.run_here``).
        self.ordered = all(j < i for i, read in enumerate(self.inputs) for j in read)

    def runs_here(self, inline_threshold: float) -> bool:
        """Whether a launch runs the whole plan on the launching thread, now.

        So it does when the plan is short (its nodes' kernel times, measured as the
        scheduler measures them, add up to under :data:`PLAN_HERE_SECONDS`) and no node
        could use a second thread (each is small, under the inline threshold, or GIL-bound:
        serial, or off the CPU beside others, the lean executor's rule for another runner)
        or must not run on the launching thread (an op declared ``inline=False``: a kernel
        that blocks, which would block the event loop and could wait on it).
        Such a plan would run on one pool thread anyway, taking turns on the GIL with the
        launching one; run here it saves the two hand-offs, the pool's wake-up and the
        loop's, 30-60 us on 2 vCPUs, 5-20% of a 0.5 ms plan. The answer is worked out again
        every :data:`PLAN_HERE_EVERY` launches, as the kernel times are learnt.
        """
        n = self._launches
        self._launches = n + 1
        if n % PLAN_HERE_EVERY:
            return self._here
        total = 0.0
        here = not self.timed  # (a timed op never runs on the launching thread)
        for sig in self.sigs:
            seconds = sig.seconds
            total += seconds
            if sig.inline is False or (
                seconds >= inline_threshold and not sig.serial and sig.cpu_share >= SPAWN_CPU_SHARE
            ):
                here = False  # a kernel that may block (``inline=False``), or big and free
                break
        self._here = here = here and total < PLAN_HERE_SECONDS
        return here

    def __repr__(self) -> str:
        return f"<Program {self.graph.name} nodes={self.size} outputs={len(self.output_nodes)}>"

    def node_name(self, i: int) -> str:
        """How errors name node ``i``: its op, its index, the graph, where it was traced."""
        where = self.locations[i]
        at = f", traced at {where}" if where else ""
        return f"{self.sigs[i].name} (node %{i} of {self.graph.name}{at})"


def launch(
    rt: Runtime,
    prog: Program,
    inputs: Sequence[Any],
    priority: float | None = None,
    waiter: Any = None,
    here: bool = True,
) -> Task:
    """Launch ``prog`` on ``rt``'s scheduler; the gather task, whose value is the outputs.

    The calling thread creates two tasks and queues one (see the module docstring). The run
    belongs to the request running on the loop, if any (``dataflow._scheduler``: its work is
    dropped when it is cancelled). ``priority``: where the run's work goes among ready
    tasks (default: the request's age, or now, in issue order). ``waiter`` (the host loop's
    ``waiter()``), when given, is woken when the gather task ends, as if it awaited it.
    ``here``: a short plan of small or GIL-bound kernels may run whole on the calling thread
    (``Program.runs_here``); a batching caller passes False, since calls can only gather
    into the next batch while this one runs elsewhere.

    Unobserved, or observed by recorders only (a profile), the nodes run on the lean executor
    (``_lean``, writing a span record per node for the recorders); while an instrument with
    hooks observes the runtime, as one task each (``_planrun.PlanRun``), so it sees every event.
    """
    sched = rt._sched
    owner = sched.request()
    if priority is None:
        now = _next_id()
        # The request's age, aged as a dispatched task's (_scheduler._requests.AGING_TASKS).
        priority = float(now) if owner is None else max(owner.base, float(now - AGING_TASKS))
    default = rt.op_timeout
    timed = (prog.timed or default is not None) and sched.pool is not None
    if not timed:
        if not (ACTIVE or sched.watching):
            return _launch_lean(rt, prog, inputs, priority, waiter, owner, False, here)
        if not (HOOKED or sched.hooked):  # only recorders: the lean executor writes spans
            if GENERATION[0] != sched._sinks_gen:
                sched.sinks()
            if not sched._overriding:
                return _launch_lean(rt, prog, inputs, priority, waiter, owner, True, here)
    run = PlanRun(prog, rt, inputs)
    if timed:
        # Op timeouts (as eager ops have them; not in the synchronous mode): the lean
        # executor's runners cannot be timed per node, a task per node can (``_timeout``).
        run.timeouts = [default if t is None else t for t in prog.timeouts]
    run.base = priority
    gather = Task(prog.gather_sig, run.finish, tuple(inputs), None, rt)
    protect(gather)  # small inputs copied, big ones read-only until the outputs are built
    run.inputs = gather.args  # type: ignore[assignment]
    run.gather = gather
    gather.waiting = len(prog.output_nodes)
    gather.priority = run.base + prog.size
    starter = Task(prog.launch_sig, _start, (run,), None, rt)
    starter.priority = run.base - 1
    run.owner = owner
    # (The nodes' tasks are reported created as the launch makes them, and the gather task
    # then, holding its inputs, the output nodes' tasks: here only when it has none.)
    sched.emit("task_created", starter)
    if not gather.waiting:
        sched.emit("task_created", gather)
    if waiter is not None:
        gather.waiters = [waiter]  # nobody else sees the task yet: no lock needed
    with GRAPH_LOCK:
        if owner is not None:
            owner.add(starter)
            owner.add(gather)
        sched.inflight += 2
        if gather.waiting == 0:
            gather.state = READY
        starter.state = READY
        if sched.pool is not None:
            sched.pool.push_locked(starter)
            if gather.state == READY:
                sched.pool.push_locked(gather)
    if sched.pool is None:
        sched.execute_now(starter)
        if gather.state == READY:
            sched.execute_now(gather)
    assert gather.state >= PENDING
    return gather


def _launch_lean(
    rt: Runtime,
    prog: Program,
    inputs: Sequence[Any],
    priority: float,
    waiter: Any,
    owner: Any,
    record: bool,
    here: bool = True,
) -> Task:
    """``launch`` on the lean executor: a gather task that its runners finish, and a runner
    (``record``: each node's span record goes to the runtime's recorders; ``here``: a short
    GIL-bound plan may run whole on this thread)."""
    sched = rt._sched
    gather = Task(prog.gather_sig, None, tuple(inputs), None, rt)
    protect(gather)  # small inputs copied, big ones read-only until the outputs are built
    # Finished by a runner, never made ready by its inputs: a runner task that fails (the
    # runtime closing, an internal error) fails it through its dependents.
    gather.waiting = _NEVER
    gather.priority = priority + prog.size
    if waiter is not None:
        gather.waiters = [waiter]  # nobody else sees the task yet: no lock needed
    run = LeanRun(prog, rt, gather, priority, record)
    pool = sched.pool
    here = pool is None or (here and prog.runs_here(sched.inline_threshold))
    with GRAPH_LOCK:
        if owner is not None:
            owner.add(gather)
        sched.inflight += 1
        runner = run.runner_locked()
        if here:
            sched.begin_locked(runner)
        else:
            pool.push_locked(runner)  # type: ignore[union-attr]
    if here:  # the synchronous mode, or a short GIL-bound plan: the whole run, here and now
        sched.execute(runner, go_on=False)
    return gather


# A count of inputs no task reaches (a lean run's gather task is finished by its runners).
_NEVER = 1 << 62


def _start(run: PlanRun) -> None:
    run.start()
