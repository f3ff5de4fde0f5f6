"""Printing a graph: the IR (``print(graph)``) and equivalent Python source (``graph.code``).

The IR has one line per node, ``%<node> : <type> = <op>(<arguments>)  # <file>:<line>``::

    graph(%x : float32[3, 2, 4]):
      %cell.weight_hh_l0 : float32[16, 4] = parameter
      %0 : float32[3, 2, 16] = ops.rnn_projection(%x, %cell.weight_ih_l0, %c0, False)  # m.py:9
      %1 : (float32[2, 4], float32[2, 4]) = ops.lstm_step(%0, 0, None, None, %cell.weight_hh_l0)
      return %1[0]

``%x`` are inputs, ``%name`` constants (module parameters keep their dotted names), ``%3`` the
output of node 3 and ``%3[1]`` the second output of a node with several. A fused node shows
its whole expression: ``fused[ops.tanh(ops.add(%2, %b))]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._fused import Arg, FusedOp, Tmp
from ._ir import ConstRef, Graph, InputRef, Node, NodeRef, display_name, format_ref, iter_refs

__all__ = ["format_code", "format_ir", "format_literal"]


def format_literal(value: Any, ref: Callable[[Any], str]) -> str:
    """Python-like text for an argument; ``ref`` writes the references inside it."""
    t = type(value)
    if t is NodeRef or t is InputRef or t is ConstRef or t is Arg or t is Tmp:
        return ref(value)
    if t is list:
        return "[" + ", ".join(format_literal(v, ref) for v in value) + "]"
    if t is tuple:
        items = [format_literal(v, ref) for v in value]
        return "(" + items[0] + ",)" if len(items) == 1 else "(" + ", ".join(items) + ")"
    if t is dict:
        inner = ", ".join(f"{k!r}: {format_literal(v, ref)}" for k, v in value.items())
        return "{" + inner + "}"
    if isinstance(value, tuple) and hasattr(t, "_fields"):
        if not any(True for _ in iter_refs(value)):
            return repr(value)
        return f"{t.__name__}(" + ", ".join(format_literal(v, ref) for v in value) + ")"
    if isinstance(value, np.dtype):
        return f"np.{value.name}" if value.isbuiltin and hasattr(np, value.name) else repr(value)
    if isinstance(value, type):
        name: str = value.__name__
        if issubclass(value, np.generic) and getattr(np, name, None) is value:
            return f"np.{name}"
        return name if value in (bool, int, float, complex) else repr(value)
    if value is Ellipsis:
        return "..."
    return repr(value)


def _call(name: str, node_args: Sequence[Any], kwargs: Any, ref: Callable[[Any], str]) -> str:
    parts = [format_literal(a, ref) for a in node_args]
    parts += [f"{k}={format_literal(v, ref)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _fused_expression(op: FusedOp, node_args: Sequence[Any], ref: Callable[[Any], str]) -> str:
    """The fused steps as one nested call, the node's arguments in place of ``Arg(i)``."""
    done: list[str] = []

    def inner(v: Any) -> str:
        if type(v) is Arg:
            return format_literal(node_args[v.index], ref)
        if type(v) is Tmp:
            return done[v.index]
        return ref(v)

    for step in op.steps:
        done.append(_call(display_name(step.op.qualname), step.args, {}, inner))
    return done[-1]


def _type_text(node: Node) -> str:
    specs = node.spec if node.multi and isinstance(node.spec, tuple) else (node.spec,)
    texts = []
    for k, t in enumerate(node.types):
        if t is not None:
            texts.append(str(t))
        else:
            texts.append(repr(specs[k]) if k < len(specs) and specs[k] is not None else "?")
    return "(" + ", ".join(texts) + ")" if node.multi else texts[0]


def format_ir(graph: Graph) -> str:
    """The IR text of ``graph`` (what ``print(graph)`` shows)."""
    names = [i.name for i in graph.inputs]

    def ref(r: Any) -> str:
        return format_ref(r, names)

    head = ", ".join(f"%{i.name} : {i.type}" for i in graph.inputs)
    lines = [f"graph({head}):"]
    for name, value in graph.constants.items():
        kind = "parameter" if name in graph.parameters else "constant"
        lines.append(f"  %{name} : {value.dtype}[{', '.join(map(str, value.shape))}] = {kind}")
    for i, node in enumerate(graph.nodes):
        op = node.op
        if isinstance(op, FusedOp):
            call = f"fused[{_fused_expression(op, node.args, ref)}]"
        else:
            call = _call(display_name(op.qualname), node.args, node.kwargs, ref)
        line = f"  %{i} : {_type_text(node)} = {call}"
        if node.location:
            line += f"  # {node.location}"
        lines.append(line)
    lines.append(f"  return {format_literal(graph.outputs, ref)}")
    return "\n".join(lines)


def _attribute_path(name: str) -> str:
    """``models.0.cell_f.weight`` -> ``self.models[0].cell_f.weight``."""
    out = "self"
    for part in name.split("."):
        if part.isdigit():
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}"
        else:
            out += f"[{part!r}]"
    return out


def format_code(graph: Graph) -> str:
    """Python source equivalent to ``graph``: an ``async def`` that calls the ops in order.

    ``self`` stands for the object holding the constants by name (a module's attributes for
    its parameters); fused nodes are written as the nested calls they replace.
    """
    names = [i.name if i.name.isidentifier() else f"input{k}" for k, i in enumerate(graph.inputs)]

    def ref(r: Any) -> str:
        if type(r) is NodeRef:
            return f"_{r.node}" if r.index is None else f"_{r.node}_{r.index}"
        if type(r) is InputRef:
            return names[r.index]
        assert type(r) is ConstRef
        return _attribute_path(r.name)

    lines = [f"async def {graph.name}(self{''.join(', ' + n for n in names)}):"]
    for i, node in enumerate(graph.nodes):
        op = node.op
        if isinstance(op, FusedOp):
            call = _fused_expression(op, node.args, ref)
        else:
            call = _call(display_name(op.qualname), node.args, node.kwargs, ref)
        outs = node.outputs(i)
        target = ", ".join(ref(o) for o in outs) + ("," if node.multi and len(outs) == 1 else "")
        lines.append(f"    {target} = {call}")
    lines.append(f"    return {format_literal(graph.outputs, ref)}")
    return "\n".join(lines)
