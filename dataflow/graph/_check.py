"""Checking a trace: trace the program again with other input values and compare.

A trace is only as good as the program's independence from its input *values*: numpy code run
on an input array (``x @ w`` on ndarrays), a Python ``if`` on an awaited value, an argument
computed from data. None of that is recorded, and a single trace cannot tell. Two traces can:
:func:`check_trace` traces again with perturbed inputs (same shapes and dtypes, other values:
Gaussian noise added to floats, ``+1`` on integers, negated booleans) and reports the first
node where the graphs differ, as a :class:`~dataflow.TracerWarning` pointing at that node's
line (like ``torch.jit.trace``'s ``check_trace``).
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from ._errors import COLLECTED, TracerWarning
from ._frames import user_location
from ._ir import ConstRef, Graph, GraphInput, display_name
from ._passes import _key

__all__ = ["check_trace", "difference", "perturb"]

TraceOnce = Callable[
    [Callable[..., Any], Sequence[Any], Sequence[np.ndarray[Any, Any]], Sequence[GraphInput]],
    Awaitable[Graph],
]


def perturb(value: np.ndarray[Any, Any], rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """An array like ``value`` (shape, dtype) with different values.

    Always an ndarray: arithmetic on a 0-d array gives a numpy scalar, which the second trace
    took for a literal argument, not an input (every 0-d input was reported as a value the
    program computed, and ``compile`` refused the program).
    """
    kind = value.dtype.kind
    out: Any
    if kind == "b":
        out = ~value
    elif kind in "iu":
        out = (value + 1).astype(value.dtype)
    elif kind in "fc":
        out = (value + rng.standard_normal(value.shape) + 0.5).astype(value.dtype)
    else:
        out = value.copy()
    return np.asarray(out)


def _same_array(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def difference(a: Graph, b: Graph) -> tuple[str, str | None] | None:
    """(what differs, ``file:line``) for the first difference of two traces, else None."""
    for i, (na, nb) in enumerate(zip(a.nodes, b.nodes, strict=False)):
        name = display_name(na.op.qualname)
        if na.op is not nb.op:
            return (
                f"the program issues other ops for other input values: node %{i} is {name} "
                f"for the example inputs and {display_name(nb.op.qualname)} for others; its "
                "Python control flow depends on the values, and the graph follows one path",
                na.location,
            )
        args_a = (_key(na.args), _key(dict(na.kwargs)))
        if args_a != (_key(nb.args), _key(dict(nb.kwargs))):
            return (
                f"node %{i} ({name}) gets other arguments for other input values: Python code "
                "computed an argument from the values, and the graph keeps the example's",
                na.location,
            )
        for ref in na.refs():
            if type(ref) is not ConstRef or ref.name in a.parameters:
                continue
            other = b.constants.get(ref.name)
            if other is None or not _same_array(a.constants[ref.name], other):
                return (
                    f"constant %{ref.name}, read by node %{i} ({name}), changes with the input "
                    "values: it was computed from an input outside the ops (numpy code on a "
                    "value the program read, such as np.exp(await x)), and the graph would "
                    "reuse the example's result. Compute it from the pending value instead "
                    "(np.exp(x) and ops on Tensors are recorded)",
                    na.location,
                )
    if len(a.nodes) != len(b.nodes):
        return (
            f"the program issues {len(a.nodes)} ops for the example inputs and {len(b.nodes)} "
            "for others: its Python control flow depends on the values",
            None,
        )
    if _key(a.outputs) != _key(b.outputs):
        return ("the program returns other values for other inputs", None)
    for name, array in a.constants.items():
        other = b.constants.get(name)  # (None: the other trace has no such constant)
        if name not in a.parameters and (other is None or not _same_array(array, other)):
            return (
                f"constant %{name}, returned by the program, changes with the input values",
                None,
            )
    return None


def _warn(message: str, location: str | None) -> None:
    text = f"trace check: {message}"
    collected = COLLECTED.get()
    if collected is not None:  # a compiled forward's trace: its problems, not warnings
        collected.append(text)
        return
    if location is not None:
        filename, _, line = location.rpartition(":")
        if line.isdigit():
            warnings.warn_explicit(text, TracerWarning, filename, int(line))
            return
    where = user_location({"dataflow", "asyncio", "uvloop"})
    if where is None:
        warnings.warn(text, TracerWarning, stacklevel=2)
        return
    filename, lineno, module_globals = where
    warnings.warn_explicit(
        text,
        TracerWarning,
        filename,
        lineno,
        module=module_globals.get("__name__"),
        registry=module_globals.setdefault("__warningregistry__", {}),
    )


async def check_trace(
    graph: Graph,
    fn: Callable[..., Any],
    templates: Sequence[Any],
    values: Sequence[np.ndarray[Any, Any]],
    trace_once: TraceOnce,
) -> None:
    """Trace ``fn`` again with perturbed inputs; warn where the graph differs from ``graph``."""
    rng = np.random.default_rng(0x5EED)
    others = [perturb(v, rng) for v in values]
    other_templates = [
        o if isinstance(t, np.ndarray) else t for t, o in zip(templates, others, strict=True)
    ]
    # The first trace already warned about what this one finds: its TracerWarnings are
    # dropped (in this task's context: catching warnings across the await silenced every
    # task's warnings meanwhile, and two checks at once left the process's filters wrong).
    token = COLLECTED.set([])
    try:
        try:
            other = await trace_once(fn, other_templates, others, graph.inputs)
        finally:
            COLLECTED.reset(token)
    except Exception as exc:
        _warn(
            f"tracing again with other input values failed ({type(exc).__name__}: {exc}), so "
            "the graph could not be checked; pass check=False to skip the check",
            None,
        )
        return
    found = difference(graph, other)
    if found is not None:
        _warn(*found)
