"""Building a new graph from another one, for the passes: :class:`Builder`.

Graphs never change (see ``_ir``), so a pass makes a new one: it walks the old graph's nodes in
order and keeps, replaces or drops each, while the builder remaps the references of what it
keeps and drops the constants nobody reads any more. This is the passes' tool (``_passes``,
``_fusion``), not part of the IR itself, which tracing, loading and running use without it;
hence a module of its own, beside ``_ir``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._ir import ConstRef, Graph, Node, Ref, iter_refs, map_refs

__all__ = ["Builder"]


# -- building new graphs (for the passes) --------------------------------------------------


class Builder:
    """Builds a graph from another one: nodes are re-added in order, references remapped.

    A pass walks the old graph's nodes; for each it either ``keep``s it (re-added with its
    arguments remapped), ``add``s a replacement, or ``replace``s its outputs by other values
    (a constant, an earlier equal node). ``finish`` remaps the outputs and keeps only the
    constants still referenced.
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray[Any, Any]] = dict(graph.constants)
        self._subst: dict[Ref, Any] = {}

    def remap(self, value: Any) -> Any:
        """``value`` (old references) with the new graph's references."""
        subst = self._subst
        return map_refs(value, lambda r: subst.get(r, r))

    def add(self, node: Node, replaces: int | None = None) -> int:
        """Append ``node`` (already in new references); it stands for old node ``replaces``."""
        index = len(self.nodes)
        self.nodes.append(node)
        if replaces is not None:
            old = self.graph.nodes[replaces]
            for o, n in zip(old.outputs(replaces), node.outputs(index), strict=True):
                self._subst[o] = n
        return index

    def keep(self, index: int) -> int:
        """Re-add old node ``index`` with its arguments remapped."""
        node = self.graph.nodes[index]
        new = Node(
            node.op,
            self.remap(node.args),
            self.remap(dict(node.kwargs)),
            node.spec,
            node.types,
            node.multi,
            node.cost,
            node.location,
        )
        return self.add(new, replaces=index)

    def replace(self, old: Ref, new: Any) -> None:
        """From now on, the old graph's ``old`` means ``new`` (a new reference or a literal)."""
        self._subst[old] = new

    def add_constant(self, value: np.ndarray[Any, Any], stem: str = "c") -> ConstRef:
        """A new anonymous constant, named ``c<k>`` with the first free ``k``."""
        k = 0
        while f"{stem}{k}" in self.constants:
            k += 1
        name = f"{stem}{k}"
        self.constants[name] = value
        return ConstRef(name)

    def finish(self) -> Graph:
        """The new graph; constants nobody references are dropped."""
        old = self.graph
        outputs = self.remap(old.outputs)
        used: set[str] = set()
        for node in self.nodes:
            used.update(r.name for r in node.refs() if type(r) is ConstRef)
        used.update(r.name for r in iter_refs(outputs) if type(r) is ConstRef)
        constants = {k: v for k, v in self.constants.items() if k in used}
        return Graph(
            old.inputs, self.nodes, constants, outputs, parameters=old.parameters, name=old.name
        )
