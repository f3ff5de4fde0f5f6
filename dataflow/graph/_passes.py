"""Graph passes: each a pure function ``Graph -> Graph`` that keeps the graph's results.

* :func:`fold_constants`: a node that reads only constants (not parameters) is computed now;
  its value becomes a constant.
* :func:`eliminate_common_subexpressions`: equal constants (not parameters) are merged, then
  a node with the
  same op and arguments as an earlier one is replaced by it (``flip(x)`` issued by each of four
  ensemble members becomes one node).
* :func:`eliminate_dead_code`: nodes whose values no output depends on are dropped (an LSTM's
  final states when only its output sequence is used).
* :func:`fold_stack_reductions`: a reduction along the new axis of a stack becomes a chain of
  the reduction's binary op over the stacked values: ``sum(stack([a, b, c, d]), axis=0)`` is
  ``((a + b) + c) + d``, bit for bit (numpy reduces an outer axis in that order), without the
  stacked array (80 MB at the tutorial's size, on the critical path) and with the first
  additions running while later members still compute. ``dataflow`` knows no op library, so
  ops declare it: ``op.stacks = True`` on a stack (a list of equal arrays, then the new axis),
  and ``op.stack_fold = binary_op`` on a reduction called as ``(x, axis, keepdims=False)``
  (``ops`` declares ``sum``/``add``, ``max``/``maximum``, ``min``/``minimum``), with,
  optionally, ``op.stack_finish = binary_op`` applied last as ``finish(folded, count)`` and
  ``op.stack_fold_dtypes``, the only dtypes folded (``ops`` declares ``mean``: ``add``, then
  ``divide`` by the count, float32 and float64). Only floating values of one dtype are
  rewritten, where the stacked array has no other reader.
* :func:`~dataflow.graph.fuse_elementwise`: trees of elementwise ops become one task.
* :func:`optimize`: all of them, in that order (the stack folding after CSE), then dead code
  again.

All rely on op kernels being pure functions of their arguments (true of every ``ops`` op): a
kernel that reads a clock, a random generator or global state must not be traced and optimised.
A pass that has nothing to do returns a graph equal to its input.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from .._errors import DataflowTypeError, DataflowValueError
from .._fold import foldable
from .._task import Cost
from ._builder import Builder
from ._fused import ENGINES, FusedOp
from ._fusion import fuse_elementwise
from ._ir import (
    ConstRef,
    Graph,
    InputRef,
    Node,
    NodeRef,
    UnresolvedOp,
    iter_refs,
    map_refs,
)

__all__ = [
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "fold_constants",
    "fold_stack_reductions",
    "optimize",
]


def _require_resolved(graph: Graph, what: str) -> None:
    if not graph.resolved:
        raise DataflowTypeError(
            f"{what} needs the graph's ops: load it with dataflow.load(path, trust=...)"
        )


# -- constant folding ----------------------------------------------------------------------


def fold_constants(graph: Graph) -> Graph:
    """Compute every node whose arguments are all constants; use its value as a constant.

    Folded values are new constants ``c<k>``. A node whose kernel raises, or returns something
    that is not an array or numpy scalar, is left as it is (it will fail or run as before). A
    module's parameters are not constants: a node that reads one is kept, so a parameter
    written in place takes effect at the next run (as the unoptimised graph and a compiled
    forward promise).
    """
    _require_resolved(graph, "fold_constants")
    b = Builder(graph)

    def value_of(ref: Any) -> Any:
        return b.constants[ref.name]

    changed = False
    parameters = graph.parameters
    for i, node in enumerate(graph.nodes):
        args = b.remap(node.args)
        kwargs = b.remap(dict(node.kwargs))
        refs = [*iter_refs(args), *iter_refs(kwargs)]
        # (A parameter is no constant: written in place, it must be read at the next run.)
        if any(type(r) is not ConstRef or r.name in parameters for r in refs):
            b.keep(i)
            continue
        try:
            value = node.op.kernel(*map_refs(args, value_of), **map_refs(kwargs, value_of))
        except Exception:
            b.keep(i)
            continue
        parts = value if node.multi else (value,)
        if node.multi and (not isinstance(value, (tuple, list)) or len(value) != len(node.types)):
            b.keep(i)
            continue
        arrays = [_as_constant(v) for v in parts]
        if any(a is None for a in arrays):
            b.keep(i)
            continue
        for ref, array in zip(node.outputs(i), arrays, strict=True):
            assert array is not None
            b.replace(ref, b.add_constant(array))
        changed = True
    return b.finish() if changed else graph


def _as_constant(value: Any) -> np.ndarray[Any, Any] | None:
    if isinstance(value, np.ndarray) and value.dtype != object:
        return value
    if isinstance(value, np.generic) and not isinstance(value, np.object_):
        return np.asarray(value)
    return None


# -- common subexpressions -------------------------------------------------------------------


class _Unique:
    """A key part for an argument that cannot be compared: equal only to itself."""

    __slots__ = ()


def _key(value: Any) -> Any:
    """A hashable key: equal keys mean equal arguments (never merely ``==`` ones: 0.0 vs -0.0)."""
    t = type(value)
    if t is NodeRef or t is InputRef or t is ConstRef:
        return value
    if t is float or t is complex:
        return (t, repr(value))
    if t is int or t is bool or t is str or value is None or value is Ellipsis:
        return (t, value)
    if t is list or t is tuple:
        return (t, tuple(_key(v) for v in value))
    if t is dict:
        return (t, tuple((k, _key(v)) for k, v in value.items()))
    if isinstance(value, tuple) and hasattr(t, "_fields"):
        return (t, tuple(_key(v) for v in value))
    if isinstance(value, np.generic):
        return ("scalar", value.dtype.str, value.tobytes())
    if isinstance(value, np.dtype):
        return ("dtype", value.str)
    if t is slice:
        return (t, _key(value.start), _key(value.stop), _key(value.step))
    try:
        hash(value)
    except TypeError:
        return _Unique()
    return ("object", t, value)  # np.float64 (a type), enums ...: their own equality


def _op_key(op: Any) -> Any:
    if isinstance(op, FusedOp):
        steps = tuple((_op_key(s.op), _key(s.args)) for s in op.steps)
        return ("fused", op.engine, steps)
    return id(op)


def _fingerprint(array: np.ndarray[Any, Any]) -> tuple[Any, ...]:
    data: Any = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return (array.shape, array.dtype.str, hashlib.blake2b(memoryview(data)).digest())


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """Merge equal constants, then nodes with the same op and the same arguments.

    Constants are equal when shape, dtype and bytes are. Parameters are never merged, with
    each other or with a constant: equal now (two zero-initialised biases), they may differ
    once one is written in place. Nodes are equal when they call the same op with arguments
    that are the same references and equal literals; the later one is replaced by the
    earlier, unless both give outputs of the graph: the caller would get one array twice
    where the program returned two (writing into one would change the other).
    """
    b = Builder(graph)
    changed = False
    by_content: dict[tuple[Any, ...], str] = {}
    for name in sorted(graph.constants):
        array = graph.constants[name]
        if array.dtype == object or name in graph.parameters:
            continue
        kept = by_content.setdefault(_fingerprint(array), name)
        if kept != name:
            b.replace(ConstRef(name), ConstRef(kept))
            changed = True
    returned = {r for r in iter_refs(graph.outputs) if type(r) is NodeRef}
    seen: dict[Any, tuple[int, int]] = {}  # (the node kept, as built; its index in graph)
    for i, node in enumerate(graph.nodes):
        key = (_op_key(node.op), _key(b.remap(node.args)), _key(b.remap(dict(node.kwargs))))
        found = seen.get(key)
        if (
            found is None
            or isinstance(node.op, UnresolvedOp)
            or any(
                mine in returned and theirs in returned
                for mine, theirs in zip(
                    node.outputs(i), graph.nodes[found[1]].outputs(found[1]), strict=True
                )
            )
        ):
            if found is None:
                seen[key] = (b.keep(i), i)
            else:
                b.keep(i)
            continue
        earlier = found[0]
        for old, new in zip(node.outputs(i), b.nodes[earlier].outputs(earlier), strict=True):
            b.replace(old, new)
        changed = True
    return b.finish() if changed else graph


# -- dead code -------------------------------------------------------------------------------


def eliminate_dead_code(graph: Graph) -> Graph:
    """Drop the nodes no output depends on, and the constants only they read."""
    live: set[int] = set()
    stack = [r.node for r in iter_refs(graph.outputs) if type(r) is NodeRef]
    while stack:
        i = stack.pop()
        if i in live:
            continue
        live.add(i)
        stack.extend(r.node for r in graph.nodes[i].refs() if type(r) is NodeRef)
    if len(live) == len(graph.nodes):
        return graph
    b = Builder(graph)
    for i in range(len(graph.nodes)):
        if i in live:
            b.keep(i)
    return b.finish()


# -- reductions of a stack ----------------------------------------------------------------------


def _argument(node: Node, pos: int, name: str, default: Any) -> Any:
    if len(node.args) > pos:
        return node.args[pos]
    return node.kwargs.get(name, default)


def _stack_fold(graph: Graph, i: int, readers: list[int]) -> tuple[Any, list[Any], Any] | None:
    """(binary op, stacked values, finishing op or None) when node ``i`` reduces a stack along
    its new axis and can be rewritten as a fold (see the module docstring); else None."""
    node = graph.nodes[i]
    fold = getattr(node.op, "stack_fold", None)
    if fold is None or set(node.kwargs) - {"axis", "keepdims"} or len(node.args) > 3:
        return None
    x = node.args[0] if node.args else None
    if type(x) is not NodeRef or x.index is not None or readers[x.node] != 1:
        return None
    stack = graph.nodes[x.node]
    if getattr(stack.op, "stacks", False) is not True or set(stack.kwargs) - {"axis"}:
        return None
    items: Any = stack.args[0] if stack.args else None
    if type(items) not in (list, tuple) or len(items) < 2:
        return None
    if not all(type(v) in (NodeRef, InputRef, ConstRef) for v in items):
        return None
    st, out = stack.types[0] if stack.types else None, node.types[0] if node.types else None
    if st is None or out is None or st.dtype != out.dtype:
        return None
    if not foldable(
        node.op,
        st.dtype,
        (_dtype_of(graph, v) for v in items),
        len(st.shape),
        _argument(node, 1, "axis", None),
        _argument(stack, 1, "axis", 0),
        _argument(node, 2, "keepdims", False),
    ):
        return None
    return fold, list(items), getattr(node.op, "stack_finish", None)


def _dtype_of(graph: Graph, ref: Any) -> Any:
    """The dtype of the value ``ref`` names (None when unknown)."""
    t = type(ref)
    if t is NodeRef:
        types = graph.nodes[ref.node].types
        vt = types[ref.index or 0] if types else None
        return None if vt is None else vt.dtype
    if t is InputRef:
        return graph.inputs[ref.index].type.dtype
    if t is ConstRef:
        return graph.constants[ref.name].dtype
    return None


def fold_stack_reductions(graph: Graph) -> Graph:
    """Rewrite a reduction along a stack's new axis as a fold of its binary op (see the module
    docstring); the stack, now unread, goes with the next dead code elimination."""
    _require_resolved(graph, "fold_stack_reductions")
    readers = [0] * len(graph.nodes)
    for node in graph.nodes:
        for j in {r.node for r in node.refs() if type(r) is NodeRef}:
            readers[j] += 1
    for ref in iter_refs(graph.outputs):
        if type(ref) is NodeRef:
            readers[ref.node] += 1  # an output is read by the caller
    folds = {}
    for i in range(len(graph.nodes)):
        found = _stack_fold(graph, i, readers)
        if found is not None:
            folds[i] = found
    if not folds:
        return graph
    b = Builder(graph)
    for i, node in enumerate(graph.nodes):
        if i not in folds:
            b.keep(i)
            continue
        fold, items, finish = folds[i]
        out = node.types[0]
        assert out is not None
        size = int(np.prod(out.shape))
        cost = Cost(float(size), 3.0 * size * out.dtype.itemsize)
        acc: Any = b.remap(items[0])
        for k, item in enumerate(items[1:], start=2):
            last = k == len(items) and finish is None
            step = Node(fold, (acc, b.remap(item)), {}, node.spec, node.types, False, cost,
                        node.location)  # fmt: skip
            acc = NodeRef(b.add(step, replaces=i if last else None))
        if finish is not None:
            step = Node(finish, (acc, len(items)), {}, node.spec, node.types, False, cost,
                        node.location)  # fmt: skip
            b.add(step, replaces=i)
    return b.finish()


# -- all of them -----------------------------------------------------------------------------


def optimize(graph: Graph, *, engine: str = "numpy") -> Graph:
    """Constant folding, CSE, stack-reduction folding, dead code elimination and elementwise
    fusion, in that order.

    Args:
        graph: the graph (its ops must be resolved).
        engine: the fused kernels' engine: "numpy" (exact) or "numexpr".
    """
    if engine not in ENGINES:
        raise DataflowValueError(f"optimize(engine=...) must be one of {ENGINES}, got {engine!r}")
    _require_resolved(graph, "optimize")
    graph = fold_constants(graph)
    graph = eliminate_common_subexpressions(graph)
    graph = fold_stack_reductions(graph)
    graph = eliminate_dead_code(graph)
    graph = fuse_elementwise(graph, engine=engine)
    return eliminate_dead_code(graph)
