"""The entry points of tracing: :func:`trace` and :func:`trace_async`.

They check what they are given (a callable, example arrays or finished handles, ``check``),
name the graph's inputs after the program's parameters, find a module's parameters, run the
program once under a :class:`~dataflow.graph._capture.Tracer` (``_capture``, where the
recording is: the per-op hot path) in a runtime of its own, and, with ``check``, trace it again
with other input values to compare (``_check``). ``trace`` runs all of that on a new event loop;
``trace_async`` in the running one.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._api import model_code
from .._defaults import resolve_loop_factory
from .._errors import DataflowError, DataflowTypeError
from .._loop import running_library
from .._runtime import Runtime
from .._task import Future, Pending
from ._capture import Tracer
from ._check import check_trace
from ._ir import Graph, GraphInput, ValueType, type_of

__all__ = ["trace", "trace_async"]


# -- entry points --------------------------------------------------------------------------


def _input_names(fn: Any, count: int) -> list[str]:
    """Names for the inputs from ``fn``'s signature (``forward``'s for a module)."""
    target = fn
    if not inspect.isfunction(fn) and not inspect.ismethod(fn):
        forward = getattr(fn, "forward", None)
        target = forward if callable(forward) else getattr(type(fn), "__call__", fn)  # noqa: B004
    names: list[str] = []
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        params = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self":
            names.append(p.name)
    names = names[:count]
    names += [f"input{k}" for k in range(len(names), count)]
    seen: set[str] = set()
    unique = []
    for name in names:
        while name in seen:
            name += "_"
        seen.add(name)
        unique.append(name)
    return unique


def _parameters_of(fn: Any) -> dict[int, tuple[str, np.ndarray[Any, Any]]]:
    named = getattr(fn, "named_parameters", None)
    if not callable(named):
        return {}
    found: dict[int, tuple[str, np.ndarray[Any, Any]]] = {}
    for name, array in named():
        if isinstance(array, np.ndarray):
            found.setdefault(id(array), (str(name), array))
    return found


def _check_examples(examples: Sequence[Any]) -> list[ValueType]:
    types = []
    for k, example in enumerate(examples):
        if isinstance(example, Pending) and not example.done():
            raise DataflowTypeError(
                f"trace(): example input {k} is a pending value that is not computed yet; pass "
                "an array, or a finished handle such as ops.asarray(x)"
            )
        vt = type_of(example) if isinstance(example, (np.ndarray, Pending)) else None
        if vt is None:
            raise DataflowTypeError(
                f"trace(): example input {k} must be a numpy array (or a finished handle with a "
                f"shape and dtype), got {type(example).__name__}; bake other arguments in with "
                "functools.partial"
            )
        types.append(vt)
    return types


async def _trace_once(
    fn: Callable[..., Any],
    templates: Sequence[Any],
    values: Sequence[np.ndarray[Any, Any]],
    inputs: Sequence[GraphInput],
) -> Graph:
    tracer = Tracer(templates, values, _parameters_of(fn))
    async with Runtime(backend=tracer, interop_threads=0):  # type: ignore[arg-type]
        placeholders = [tracer.placeholder(k) for k in range(len(templates))]
        with model_code():  # a traced module's call gives its pending outputs, unawaited
            result = fn(*placeholders)
            if inspect.isawaitable(result) and not isinstance(result, Future):
                result = await result  # a coroutine; a pending value is an output, not awaited
        outputs = await tracer.capture_output(result)
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or not name.isidentifier() or name == "<lambda>":
        name = "forward"
    return tracer.graph(inputs, outputs, name)


async def trace_async(fn: Callable[..., Any], *example_inputs: Any, check: bool = True) -> Graph:
    """:func:`trace` from inside a running event loop (in the calling task's context)."""
    if inspect.iscoroutine(fn):
        fn.close()
        raise DataflowTypeError("trace() needs the function, not a coroutine object: trace(f, x)")
    if not callable(fn):
        raise DataflowTypeError(f"trace() needs a callable, got {type(fn).__name__}")
    if type(check) is not bool:
        raise DataflowTypeError(
            f"trace(check=...) must be True or False, got {type(check).__name__}: {check!r:.60}"
        )
    if isinstance(fn, Graph):
        return fn
    typed = _check_examples(example_inputs)
    names = _input_names(fn, len(example_inputs))
    inputs = [GraphInput(n, t) for n, t in zip(names, typed, strict=True)]
    values = [np.asarray(v.result()) if isinstance(v, Pending) else v for v in example_inputs]
    graph = await _trace_once(fn, example_inputs, values, inputs)
    if check:
        await check_trace(graph, fn, example_inputs, values, _trace_once)
    return graph


def trace(fn: Callable[..., Any], *example_inputs: Any, check: bool = True) -> Graph:
    """Record the ops ``fn(*example_inputs)`` issues as a :class:`~dataflow.Graph`.

    ``fn`` is an ``async def`` function, a module (``ops.nn.Module``: its parameters are
    recorded under their names) or a plain function that calls ops. Nothing is computed unless
    the program awaits a value (then a :class:`~dataflow.TracerWarning` says where). Like
    ``torch.jit.trace``, it records one run's ops, not the Python control flow around them:
    loops are unrolled and branches taken for these example inputs, and the graph accepts only
    inputs of their shapes and dtypes.

    The program receives a pending placeholder for each array input (an ``ops.Tensor``:
    the handle type the op library declared with :func:`dataflow.set_array_handle`), so numpy
    code on an input (``x @ w``, ``np.tanh(x)``) dispatches to ops and is recorded; numpy code
    on a value the program *read* (``np.exp(await x)``) runs once, at trace time, and its
    result is a constant. With ``check`` (the default) the program is traced a second time
    with other input values, and a :class:`~dataflow.TracerWarning` names the first node
    that differs: a constant computed from an input, or a path that depends on the values.

    Example:
        >>> graph = dataflow.trace(model, x)        # x: an example input array
        >>> print(graph)
        >>> y = graph.run(x)

    Args:
        fn: the program.
        example_inputs: arrays (or finished handles, e.g. ``ops.asarray(x)``), one per
            positional argument.
        check: trace again with perturbed inputs and warn where the two graphs differ (True
            or False).

    Raises:
        TypeError: an example input is not an array, ``fn`` is a coroutine object, or
            ``check`` is not a bool (a ``DataflowTypeError``).
        DataflowError: called from a running event loop (use ``await trace_async(...)``).
    """
    if running_library() is not None:  # (trio's loop too: a nested asyncio run would block it)
        raise DataflowError(
            "dataflow.trace() cannot run inside a running event loop; "
            "use `await dataflow.graph.trace_async(fn, *inputs)` there"
        )
    with asyncio.Runner(loop_factory=resolve_loop_factory("asyncio")) as runner:
        return runner.run(trace_async(fn, *example_inputs, check=check))
