"""A node's arguments at run time: the slots of a prepared argument template, and references.

A program (``_launch.Program``) prepares each node's arguments once. Where every reference is
at the top level of the arguments (:func:`flat_slots`), the node gets a template (its
constants already in place) and a tuple of *slots* ``(position, kind, source, index)`` to
fill per run: ``INPUT``, the launch's input ``source``; ``NODE``, node ``source``'s value;
``NODE_OUT``, output ``index`` of node ``source``'s value. Other arguments (nested
references, keyword arguments) are bound by the generic walk, ``map_refs`` with
:func:`ref_value`, which also builds the outputs.

Each executor of a plan fills them the same way: the lean runners (``_lean``), a plan run
whole on the calling thread (``_here``) and the task-per-node launch (``_planrun``). The
kinds, the slots' making and the reference lookup live here, below the program and all three
executors, so none imports another for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._ir import ConstRef, InputRef, NodeRef, iter_refs

__all__ = ["INPUT", "NODE", "NODE_OUT", "flat_slots", "output_value", "ref_value"]

# Slot kinds of a node's argument template (``_launch.Program.slots``).
INPUT, NODE, NODE_OUT = range(3)


def ref_value(ref: Any, inputs: Sequence[Any], constants: Any, node: Callable[[int], Any]) -> Any:
    """The value a reference in a node's arguments or the outputs stands for: an input of
    the launch, a constant, or (``node(i)``: node i's value) a node's output."""
    t = type(ref)
    if t is InputRef:
        return inputs[ref.index]
    if t is ConstRef:
        return constants[ref.name]
    value = node(ref.node)
    return value if ref.index is None else value[ref.index]


def output_value(
    ref: Any, inputs: Sequence[Any], constants: Any, node: Callable[[int], Any]
) -> Any:
    """:func:`ref_value` for a graph output: a constant is copied, so each run returns an array
    of its own, as the eager program did (a folded ``c * 2`` made a new array at each call;
    the graph's own one, handed out and written to by the caller, changed later runs)."""
    if type(ref) is ConstRef:
        return constants[ref.name].copy()
    return ref_value(ref, inputs, constants, node)


def flat_slots(args: tuple[Any, ...]) -> tuple[tuple[int, int, int, int | None], ...] | None:
    """The reference slots of arguments whose references are all at the top level."""
    slots = []
    for pos, a in enumerate(args):
        t = type(a)
        if t is InputRef:
            slots.append((pos, INPUT, a.index, None))
        elif t is NodeRef:
            slots.append((pos, NODE if a.index is None else NODE_OUT, a.node, a.index))
        elif t is not ConstRef and any(True for _ in iter_refs(a)):
            return None
    return tuple(slots)
