"""Running a graph: a static plan made once, then every node dispatched at once per call.

The plan (:func:`make_plan`, pure, no runtime) uses what eager dispatch cannot know, the
whole graph:

* **Critical path first.** Each node's *longest path to the exit* is its own estimated time
  (:func:`dataflow.estimate_seconds` of its cost, plus a per-task overhead so cheap ops still
  count) plus the longest path of its slowest reader. Nodes are ranked by it, longest first;
  the runtime's ready heap takes the smallest ``priority`` first, so the priority of a node in
  a run is ``base + rank``, where ``base`` is the task id counter when the run starts. Within
  a run the critical path goes first; between runs (several requests sharing the pool) older
  runs and eager tasks keep their place, as with issue order.
* **Dispatch order.** A topological order that takes, among the nodes whose inputs are
  dispatched, the most critical first: ops that run inline at dispatch (tiny ones) then also
  follow the critical path.
* **Memory.** For each value, its last reader in dispatch order. The dispatcher drops its
  reference to a value as soon as that reader is dispatched; from then on only the readers'
  tasks hold it, and a task lets go of its inputs when it has run. So a buffer is freed when
  its last reader has run (unless the caller holds it: graph outputs and inputs).

Dispatch (:func:`dispatch`) checks the inputs against the traced shapes and dtypes (the graph
is specialised to them: the trace unrolled the program's loops), then submits each node with
the spec and cost recorded at trace time: no meta or cost rule runs per call.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import DataflowTypeError, OpInputError, OpTypeError
from .._lookup import get_runtime
from .._scheduler import scan
from .._signature import Signature
from .._task import Pending, _next_id, estimate_seconds
from ._fused import FusedOp
from ._ir import ConstRef, InputRef, NodeRef, Ref, iter_refs, type_of

if TYPE_CHECKING:
    from ._ir import Graph

__all__ = ["TASK_OVERHEAD_S", "Plan", "dispatch", "make_plan"]

# What a task costs beyond its kernel (dispatch, hand-off to a worker), in seconds: enough
# that a long chain of cheap ops outranks one short op.
TASK_OVERHEAD_S = 5e-6


@dataclass(frozen=True)
class Plan:
    """A graph's static schedule.

    Attributes:
        order: node indices in dispatch order (topological, most critical first).
        rank: ``rank[i]``: node i's position by longest path to the exit (0: most critical).
        longest_path_s: ``longest_path_s[i]``: estimated seconds from node i's start to the end.
        frees: ``frees[k]``: the values whose last reader is ``order[k]``.
        sigs: ``sigs[i]``: node i's signature (spec and cost as recorded; its measured
            kernel time carries over from run to run).
    """

    order: tuple[int, ...]
    rank: tuple[int, ...]
    longest_path_s: tuple[float, ...]
    frees: tuple[tuple[NodeRef, ...], ...]
    sigs: tuple[Signature, ...] = ()

    @property
    def critical_path_s(self) -> float:
        """The estimated length of the longest chain through the graph, in seconds."""
        return max(self.longest_path_s, default=0.0)


def make_plan(graph: Graph) -> Plan:
    """The static schedule of ``graph`` (see the module docstring)."""
    nodes = graph.nodes
    n = len(nodes)
    readers: list[set[int]] = [set() for _ in range(n)]
    for i, node in enumerate(nodes):
        for r in node.refs():
            if type(r) is NodeRef:
                readers[r.node].add(i)
    longest = [0.0] * n
    for i in range(n - 1, -1, -1):  # nodes are in topological order: readers come later
        own = estimate_seconds(nodes[i].cost) + TASK_OVERHEAD_S
        longest[i] = own + max((longest[j] for j in readers[i]), default=0.0)
    by_rank = sorted(range(n), key=lambda i: (-longest[i], i))
    rank = [0] * n
    for k, i in enumerate(by_rank):
        rank[i] = k

    # List scheduling: a node becomes available once every node it reads is dispatched.
    missing = [len({r.node for r in node.refs() if type(r) is NodeRef}) for node in nodes]
    ready = [(rank[i], i) for i in range(n) if missing[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for j in readers[i]:
            missing[j] -= 1
            if missing[j] == 0:
                heapq.heappush(ready, (rank[j], j))
    assert len(order) == n, "a graph's nodes always form a DAG"

    where = {i: k for k, i in enumerate(order)}
    outputs = {r for r in iter_refs(graph.outputs) if type(r) is NodeRef}
    last: dict[NodeRef, int] = {}
    for i, node in enumerate(nodes):
        for ref in node.outputs(i):  # a value nobody reads is dropped right after its node
            last[ref] = where[i]
        for r in node.refs():
            if type(r) is NodeRef:
                last[r] = max(last[r], where[i])
    frees: list[list[NodeRef]] = [[] for _ in range(n)]
    for ref, k in last.items():
        if ref not in outputs:
            frees[k].append(ref)
    # Nodes of one op with the same output spec and cost share a signature, as the calls of
    # an op with the same argument specs do when dispatched: what the scheduler learns of a
    # kernel (its time, whether it is GIL-bound) then comes from every such node's runs, so
    # the eight LSTM directions of the seed ensemble learn it eight times as fast.
    sigs = []
    shared: dict[Any, Signature] = {}
    for node in nodes:
        op = node.op
        inline = op.inline
        if inline is None and type(op) is FusedOp:
            inline = op.runs_inline()
        key: Any = (op, node.spec, node.cost, inline)
        try:
            sig = shared.get(key)
        except TypeError:  # an unhashable spec: a signature of its own
            key, sig = None, None
        if sig is None:
            sig = Signature(op.name, node.spec, node.cost, inline, op)
            if key is not None:
                shared[key] = sig
        sigs.append(sig)
    return Plan(
        tuple(order), tuple(rank), tuple(longest), tuple(tuple(f) for f in frees), tuple(sigs)
    )


def check_inputs(graph: Graph, inputs: Sequence[Any]) -> list[Any]:
    """The inputs, checked against the traced types (numbers and lists become arrays)."""
    import numpy as np

    expected = graph.inputs
    if len(inputs) != len(expected):
        names = ", ".join(i.name for i in expected)
        raise DataflowTypeError(
            f"graph {graph.name}({names}) takes {len(expected)} input(s), got {len(inputs)}"
        )
    checked: list[Any] = []
    for value, want in zip(inputs, expected, strict=True):
        if not isinstance(value, (np.ndarray, Pending)):
            try:
                value = np.asarray(value)
            except Exception as exc:
                raise OpTypeError(
                    f"graph {graph.name}: input {want.name} must be an array, got "
                    f"{type(value).__name__} ({exc})"
                ) from exc
        got = type_of(value)
        if got is None:
            raise OpTypeError(
                f"graph {graph.name}: input {want.name} must be an array or a pending value "
                f"with a shape and dtype, got {type(value).__name__}"
            )
        if got.shape != want.type.shape:
            raise OpInputError(
                f"graph {graph.name}: input {want.name} has shape {list(got.shape)}, but the "
                f"graph was traced with {list(want.type.shape)}: a trace records the program "
                "for its example shapes (loops unrolled); trace again for this one"
            )
        if got.dtype != want.type.dtype:
            raise OpTypeError(
                f"graph {graph.name}: input {want.name} has dtype {got.dtype}, but the graph "
                f"was traced with {want.type.dtype}; convert it with "
                f".astype({_dtype_source(want.type.dtype)})"
            )
        checked.append(value)
    return checked


def _dtype_source(dtype: Any) -> str:
    """How to write ``dtype`` in Python: ``np.float32``, or ``np.dtype('>f4')`` for one numpy
    has no such name for (another byte order, a string length)."""
    import numpy as np

    name = dtype.name
    if dtype.isnative and name.isidentifier() and getattr(np, name, None) is dtype.type:
        return f"np.{name}"
    return f"np.dtype({dtype.str!r})"


def _bind(value: Any, env: dict[Ref, Any]) -> Any:
    """``value`` with every reference replaced by what ``env`` holds for it."""
    t = type(value)
    if t is NodeRef or t is InputRef or t is ConstRef:
        return env[value]
    if t is tuple or t is list:
        return t(_bind(v, env) for v in value)
    if t is dict:
        return {k: _bind(v, env) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(t, "_fields"):
        return t(*(_bind(v, env) for v in value))
    return value


def dispatch(graph: Graph, inputs: Sequence[Any]) -> Any:
    """Submit every node of ``graph`` to the current runtime; the outputs, pending."""
    from ._capture import Tracer

    if not graph.resolved:
        raise DataflowTypeError(
            f"graph {graph.name} was read for inspection (dataflow.graph.read): load it with "
            "dataflow.load(path, trust=[...]) to run it"
        )
    rt = get_runtime(f"running graph {graph.name}")
    values = check_inputs(graph, inputs)
    plan = graph.plan
    nodes = graph.nodes
    env: dict[Ref, Any] = {InputRef(i): v for i, v in enumerate(values)}
    for name, array in graph.constants.items():
        env[ConstRef(name)] = array
    tracer = rt.backend
    if isinstance(tracer, Tracer):
        # Tracing a program that runs a graph: record the graph's nodes into the new trace.
        for i in plan.order:
            node = nodes[i]
            args = _bind(node.args, env)
            kwargs = _bind(dict(node.kwargs), env) if node.kwargs else None
            task = tracer.record(node.op, args, kwargs, node.spec, node.cost)
            _publish(env, node, i, task)
        return _bind(graph.outputs, env)
    base = float(_next_id())
    rank = plan.rank
    sigs = plan.sigs
    dispatch_one = rt.dispatch
    default_timeout = getattr(rt, "op_timeout", None)
    for k, i in enumerate(plan.order):
        node = nodes[i]
        op = node.op
        args = _bind(node.args, env)
        kwargs = _bind(dict(node.kwargs), env) if node.kwargs else None
        timeout = getattr(op, "timeout", None)
        if timeout is None:  # as Op.__call__ does: an op's timeout, else the runtime's default
            timeout = default_timeout
        inputs, ready = scan(args, kwargs)
        task = dispatch_one(
            sigs[i], op.kernel, args, kwargs, inputs, ready, base + rank[i], timeout
        )
        _publish(env, node, i, task)
        for ref in plan.frees[k]:
            del env[ref]
    for out in iter_refs(graph.outputs):
        if type(out) is ConstRef:  # a fresh array per run, as the eager program made (_slots)
            env[out] = env[out].copy()
    return _bind(graph.outputs, env)


def _publish(env: dict[Ref, Any], node: Any, i: int, task: Any) -> None:
    make = node.op.handle
    if node.multi:
        for k, spec in enumerate(node.spec):
            env[NodeRef(i, k)] = make(task, k, spec)
    else:
        env[NodeRef(i)] = make(task, None, node.spec)
