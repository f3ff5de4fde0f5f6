"""Fusion of elementwise chains into one task: the pass, :func:`fuse_elementwise`.

**Which ops are elementwise.** ``dataflow`` knows no op library, so it recognises them by what
they are: an op whose kernel is a numpy ufunc (or a wrapper that calls one unchanged and says
so: ``kernel.dataflow_ufunc = np.tanh``) with one output and no core dimensions (``np.add``,
``np.tanh``, ``np.greater`` ..., not ``np.matmul``),
called with one positional argument per ufunc input. An op whose kernel is something else can
declare itself with attributes: ``op.elementwise = True`` (same shapes in, broadcast shape
out, each element on its own) and, optionally, ``op.numexpr = "tanh({0})"``.

**What is fused.** Trees: a producer is merged into its consumer when both are elementwise and
the consumer is the producer's only reader (and the producer is not a graph output). So every
intermediate of a fused group is read exactly once, inside the group, and nothing outside it
ever sees it; values other nodes also read stay separate nodes.

A group becomes one node whose op is a :class:`~dataflow.graph.FusedOp`; that op, its steps and
its kernels (``engine="numpy"`` or ``"numexpr"``) are in ``_fused``, which a graph file's reader
and the executor use without this pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._errors import DataflowValueError
from .._task import Cost, estimate_seconds
from ._builder import Builder
from ._fused import ENGINES, Arg, FusedOp, FusedStep, Tmp, ufunc_of
from ._ir import (
    ConstRef,
    Graph,
    InputRef,
    Node,
    NodeRef,
    UnresolvedOp,
    iter_refs,
)

__all__ = ["fuse_elementwise"]


def is_elementwise(node: Node) -> bool:
    """Whether a node may join a fused group (see the module docstring)."""
    op = node.op
    if node.multi or node.kwargs or isinstance(op, (FusedOp, UnresolvedOp)):
        return False
    if getattr(op, "timeout", None) is not None:
        return False  # fused, its kernel would run under no deadline of its own
    for a in node.args:  # references and plain scalars only: no lists hiding references
        if type(a) in (list, tuple, dict) and any(True for _ in iter_refs(a)):
            return False
    ufunc = ufunc_of(op)
    if ufunc is not None:
        return ufunc.nin == len(node.args)
    return getattr(op, "elementwise", False) is True


# -- the pass --------------------------------------------------------------------------------


def fuse_elementwise(graph: Graph, *, engine: str = "numpy") -> Graph:
    """Merge trees of elementwise nodes into single fused nodes (one task each).

    See the module docstring for what is fused. Graphs without two adjacent elementwise nodes
    come back unchanged (an equal graph).

    Args:
        graph: the graph.
        engine: "numpy" (default, exact) or "numexpr" (one expression per group, when it can).
    """
    if engine not in ENGINES:
        raise DataflowValueError(f"fusion engine must be one of {ENGINES}, got {engine!r}")
    nodes = graph.nodes
    uses: dict[NodeRef, int] = {}
    for node in nodes:
        for r in node.refs():
            if type(r) is NodeRef:
                uses[r] = uses.get(r, 0) + 1
    outputs = {r for r in iter_refs(graph.outputs) if type(r) is NodeRef}
    elementwise = [is_elementwise(n) for n in nodes]
    # absorbed[p] = c: node p becomes a step of its only reader c.
    absorbed: dict[int, int] = {}
    for c, node in enumerate(nodes):
        if not elementwise[c]:
            continue
        for r in node.args:
            if type(r) is NodeRef and elementwise[r.node] and uses.get(r) == 1 and r not in outputs:
                absorbed[r.node] = c
    if not absorbed:
        return graph
    roots = set(absorbed.values()) - set(absorbed)
    b = Builder(graph)
    for i, node in enumerate(nodes):
        if i in absorbed:
            continue  # its only reader, later, carries it as a step
        if i not in roots:
            b.keep(i)
            continue
        steps, external, cost, slowest = _group(nodes, i, absorbed)
        fused = Node(
            FusedOp(steps, engine, slowest),
            tuple(b.remap(external)),
            {},
            node.spec,
            node.types,
            False,
            cost,
            node.location,
        )
        b.add(fused, replaces=i)
    return b.finish()


def _group(
    nodes: Sequence[Node], root: int, absorbed: dict[int, int]
) -> tuple[list[FusedStep], list[Any], Cost, float]:
    """The steps of the tree rooted at ``root`` (post-order), its external values, its cost and
    its slowest member's estimated seconds.

    A depth-first walk with an explicit stack (a chain of thousands of ops is one deep tree):
    each frame is a member, the index of its next argument and the arguments built so far; a
    member's step is written once all its arguments are, so steps come in post-order and
    external values are numbered in the order the walk meets them.
    """
    steps: list[FusedStep] = []
    external: list[Any] = []
    position: dict[Any, int] = {}
    flops = nbytes = slowest = 0.0
    stack: list[tuple[int, int, list[Any]]] = [(root, 0, [])]
    while stack:
        n, k, args = stack[-1]
        member = nodes[n]
        if k < len(member.args):
            stack[-1] = (n, k + 1, args)
            a = member.args[k]
            if type(a) is NodeRef and absorbed.get(a.node) == n:
                stack.append((a.node, 0, []))  # its Tmp joins `args` when it is done
            elif type(a) in (NodeRef, InputRef, ConstRef):
                if a not in position:
                    position[a] = len(external)
                    external.append(a)
                args.append(Arg(position[a]))
            else:
                args.append(a)
            continue
        stack.pop()
        if member.cost is not None:
            flops += member.cost.flops
            nbytes += member.cost.bytes
        slowest = max(slowest, estimate_seconds(member.cost))
        steps.append(FusedStep(member.op, tuple(args), member.types[0]))
        if stack:
            stack[-1][2].append(Tmp(len(steps) - 1))
    return steps, external, Cost(flops, nbytes), slowest
