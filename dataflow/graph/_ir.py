"""The graph IR: references, nodes and the immutable :class:`Graph`.

A graph is what tracing records, what the passes rewrite and what a graph file stores:

* **inputs**: the positional arguments, each with the shape and dtype it was traced with;
* **constants**: arrays by name: module parameters under their dotted names
  (``models.0.cell_f.weight_ih_l0``), any other array the program used as ``c0``, ``c1`` ...;
* **nodes**: op calls in a topological order (a node's arguments only refer to inputs,
  constants and earlier nodes): the op, its arguments with a reference in place of each value
  (:class:`InputRef`, :class:`ConstRef`, :class:`NodeRef`), the spec its meta rule returned,
  its cost and the source line that called it. A node is named by its position: ``%3``;
* **outputs**: what the program returned (nested tuples, lists and dicts), with references.

Graphs never change: each pass builds a new one (see :class:`Builder`, in ``_builder``). The
value of a node is what its op's kernel returns for its arguments, so two nodes with the same op
and arguments have the same value, and a node nothing reads is dead: the passes rely on op
kernels being pure functions of their arguments, as every ``ops`` kernel is.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from .._errors import DataflowTypeError, DataflowValueError
from .._task import Cost, Task

if TYPE_CHECKING:
    from ._execute import Plan

__all__ = [
    "ConstRef",
    "Graph",
    "GraphInput",
    "InputRef",
    "Node",
    "NodeRef",
    "OpLike",
    "Ref",
    "UnresolvedOp",
    "ValueType",
    "display_name",
    "iter_refs",
    "map_refs",
    "type_of",
]


# -- references ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InputRef:
    """The graph's ``index``-th input."""

    index: int


@dataclass(frozen=True, slots=True)
class ConstRef:
    """A constant (a parameter or another array) by name."""

    name: str


@dataclass(frozen=True, slots=True)
class NodeRef:
    """Output ``index`` of node ``node`` (``index`` None: the node has a single output)."""

    node: int
    index: int | None = None


Ref = InputRef | ConstRef | NodeRef
_REF_TYPES = (InputRef, ConstRef, NodeRef)


def map_refs(value: Any, f: Callable[[Any], Any]) -> Any:
    """``value`` with every reference ``r`` inside (tuples, lists, dicts) replaced by ``f(r)``."""
    t = type(value)
    if t is NodeRef or t is InputRef or t is ConstRef:
        return f(value)
    if t is tuple or t is list:
        return t(map_refs(v, f) for v in value)
    if t is dict:
        return {k: map_refs(v, f) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(t, "_fields"):  # a NamedTuple (a spec, a Cost)
        return t(*(map_refs(v, f) for v in value))
    return value


def iter_refs(value: Any) -> Iterator[Ref]:
    """Every reference inside ``value``, in order."""
    t = type(value)
    if t is NodeRef or t is InputRef or t is ConstRef:
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from iter_refs(v)
    elif t is dict:
        for v in value.values():
            yield from iter_refs(v)


# -- value types and ops -------------------------------------------------------------------


class ValueType(NamedTuple):
    """The shape and dtype of a value, as the IR prints them: ``float32[50, 4096]``."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


def type_of(spec: Any) -> ValueType | None:
    """The ValueType of a spec (or an array) with ``shape`` and ``dtype``; None otherwise."""
    shape = getattr(spec, "shape", None)
    dtype = getattr(spec, "dtype", None)
    if shape is None or dtype is None:
        return None
    try:
        return ValueType(tuple(int(d) for d in shape), np.dtype(dtype))
    except (TypeError, ValueError):
        return None


class OpLike(Protocol):
    """What a node needs of its op: a :class:`dataflow.Op`, a fused op, or an unresolved one."""

    @property
    def name(self) -> str: ...
    @property
    def qualname(self) -> str: ...
    @property
    def kernel(self) -> Callable[..., Any]: ...
    @property
    def meta(self) -> Callable[..., Any]: ...
    @property
    def cost(self) -> Callable[..., Cost] | None: ...
    @property
    def handle(self) -> Callable[[Task, int | None, Any], Any]: ...
    @property
    def inline(self) -> bool | None: ...


def _unresolved(*args: Any, **kwargs: Any) -> Any:
    raise DataflowTypeError(
        "this graph was read for inspection (dataflow.graph.read): its ops are not resolved; "
        "load it with dataflow.load(path, trust=[...]) to run it"
    )


class UnresolvedOp:
    """An op known only by its qualified name (a graph file read with ``dataflow.graph.read``)."""

    __slots__ = ("name", "qualname")

    kernel = staticmethod(_unresolved)
    meta = staticmethod(_unresolved)
    handle = staticmethod(_unresolved)
    cost = None
    inline = None

    def __init__(self, qualname: str) -> None:
        self.qualname = qualname
        self.name = qualname.rpartition(":")[2]

    def __repr__(self) -> str:
        return f"<unresolved op {self.qualname}>"


def display_name(qualname: str) -> str:
    """How the IR names an op: its top-level package and name (``ops.matmul``)."""
    module, _, name = qualname.rpartition(":")
    if module in ("", "__main__"):
        return name
    return f"{module.split('.')[0]}.{name}"


# -- nodes and graphs ------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, slots=True)
class Node:
    """One op call. Its outputs are ``NodeRef(i)`` (``NodeRef(i, k)`` when ``multi``).

    Attributes:
        op: the op (``op.kernel`` computes the value).
        args: positional arguments, references in place of values.
        kwargs: keyword arguments, likewise.
        spec: what the op's meta rule returned (a tuple of specs when ``multi``).
        types: each output's shape and dtype (None for a spec without them).
        multi: the op returns several outputs (its spec was a tuple).
        cost: the cost rule's estimate.
        location: ``file:line`` of the call that created the node, when traced.
    """

    op: OpLike
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    spec: Any
    types: tuple[ValueType | None, ...]
    multi: bool = False
    cost: Cost | None = None
    location: str | None = None

    def outputs(self, index: int) -> list[NodeRef]:
        """References to this node's outputs, given its position ``index`` in the graph."""
        if self.multi:
            return [NodeRef(index, k) for k in range(len(self.types))]
        return [NodeRef(index)]

    def refs(self) -> Iterator[Ref]:
        """Every reference among the arguments."""
        yield from iter_refs(self.args)
        yield from iter_refs(self.kwargs)


class GraphInput(NamedTuple):
    """A graph input: its name (from the traced function's signature) and type."""

    name: str
    type: ValueType


class Graph:
    """A captured program: run it (``await graph(x)``), print it, optimise it, save it.

    Made by :func:`dataflow.trace` or :func:`dataflow.load`. ``print(graph)`` shows the IR,
    ``graph.code`` equivalent Python source. Calling the graph inside a runtime dispatches every
    node at once with critical-path priorities and returns pending values, like the program
    would; ``graph.run(x)`` does that in a new runtime and returns arrays.

    Example:
        >>> graph = dataflow.trace(model, x).optimize()
        >>> print(graph)
        >>> y = graph.run(x)             # or: y = await graph(x) inside a runtime
        >>> graph.save("model.dfg")      # dataflow.load("model.dfg", trust=["ops"]) later

    Attributes:
        inputs: the inputs, with the shape and dtype each must have.
        nodes: the op calls, in a topological order.
        constants: arrays by name (read-only mapping).
        parameters: the names among ``constants`` that are module parameters.
        outputs: what the program returns, with references (``NodeRef`` ...) in place of values.
        name: the traced function's name.
    """

    __slots__ = ("_plan", "constants", "inputs", "name", "nodes", "outputs", "parameters")

    def __init__(
        self,
        inputs: Sequence[GraphInput],
        nodes: Sequence[Node],
        constants: Mapping[str, np.ndarray[Any, Any]],
        outputs: Any,
        *,
        parameters: Iterable[str] = (),
        name: str = "forward",
    ) -> None:
        self.inputs = tuple(inputs)
        self.nodes = tuple(nodes)
        self.constants: Mapping[str, np.ndarray[Any, Any]] = MappingProxyType(dict(constants))
        self.parameters = frozenset(p for p in parameters if p in self.constants)
        self.outputs = outputs
        self.name = name
        self._plan: Plan | None = None
        self._check()

    def _check(self) -> None:
        """Every reference points at an input, a constant or an earlier node's output."""

        def check(ref: Ref, where: str, limit: int) -> None:
            if type(ref) is InputRef:
                ok = 0 <= ref.index < len(self.inputs)
            elif type(ref) is ConstRef:
                ok = ref.name in self.constants
            else:
                assert type(ref) is NodeRef
                ok = 0 <= ref.node < limit
                if ok:
                    node = self.nodes[ref.node]
                    ok = (
                        (ref.index is None)
                        if not node.multi
                        else (ref.index is not None and 0 <= ref.index < len(node.types))
                    )
            if not ok:
                raise DataflowValueError(
                    f"{where} refers to {format_ref(ref)}, which does not exist"
                )

        for i, node in enumerate(self.nodes):
            for ref in node.refs():
                check(ref, f"node %{i}", i)
        for ref in iter_refs(self.outputs):
            check(ref, "the outputs", len(self.nodes))

    # -- looking at it -------------------------------------------------------------------

    def __repr__(self) -> str:
        return (
            f"<Graph {self.name} inputs={len(self.inputs)} nodes={len(self.nodes)} "
            f"constants={len(self.constants)} parameters={len(self.parameters)}>"
        )

    def __str__(self) -> str:
        from ._printer import format_ir

        return format_ir(self)

    @property
    def code(self) -> str:
        """Python source equivalent to the graph: an ``async def`` calling the ops."""
        from ._printer import format_code

        return format_code(self)

    @property
    def resolved(self) -> bool:
        """Whether every op is known to this process (False for ``dataflow.graph.read``)."""
        return not any(_has_unresolved(node.op) for node in self.nodes)

    def op_counts(self) -> dict[str, int]:
        """How many nodes call each op, by display name (``{"ops.lstm_step": 100, ...}``)."""
        counts: dict[str, int] = {}
        for node in self.nodes:
            name = display_name(node.op.qualname)
            counts[name] = counts.get(name, 0) + 1
        return counts

    # -- running it ----------------------------------------------------------------------

    @property
    def plan(self) -> Plan:
        """The static schedule: dispatch order, critical-path priorities, last uses."""
        if self._plan is None:
            from ._execute import make_plan

            self._plan = make_plan(self)
        return self._plan

    async def __call__(self, *inputs: Any) -> Any:
        """Dispatch the whole graph in the current runtime; returns pending outputs at once.

        Raises:
            OpInputError, OpTypeError: an input's shape, dtype or count differs from the trace.
            NoRuntimeError: called outside a runtime (use :meth:`run`).
        """
        from ._execute import dispatch

        return dispatch(self, inputs)

    def run(self, *inputs: Any, **run_options: Any) -> Any:
        """Run the graph in a new runtime (``dataflow.run(graph, *inputs, ...)``): arrays back."""
        from .._api import run

        return run(self, *inputs, **run_options)

    # -- transforming and saving ----------------------------------------------------------

    def optimize(self, *, engine: str = "numpy") -> Graph:
        """The graph after every pass (see :func:`dataflow.graph.optimize`)."""
        from ._passes import optimize

        return optimize(self, engine=engine)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the graph and its constants to ``path`` (see ``docs/graph.md`` for the format)."""
        from ._format import save

        save(self, path)


def _has_unresolved(op: OpLike) -> bool:
    if isinstance(op, UnresolvedOp):
        return True
    steps = getattr(op, "steps", None)  # a fused op: look inside
    return steps is not None and any(_has_unresolved(s.op) for s in steps)


def format_ref(ref: Ref, input_names: Sequence[str] | None = None) -> str:
    """``%3``, ``%3[1]``, ``%x`` or ``%name``: how the IR writes a reference."""
    if type(ref) is NodeRef:
        return f"%{ref.node}" if ref.index is None else f"%{ref.node}[{ref.index}]"
    if type(ref) is InputRef:
        if input_names is not None and ref.index < len(input_names):
            return f"%{input_names[ref.index]}"
        return f"%input{ref.index}"
    assert type(ref) is ConstRef
    return f"%{ref.name}"
