"""Tracing: run a program once with example inputs and record the ops it issues.

:func:`trace` runs the program under a :class:`Tracer`, a runtime that *records* instead of
running: an op call (which reaches the backend's ``submit`` as in any runtime, so tracing
costs the normal path nothing) becomes a node whose arguments hold references in place of values:

* the example inputs, by identity (an ndarray argument that *is* an input) or as the pending
  placeholders the program received (inputs given as ``ops.asarray(x)``-like handles);
* module parameters, by identity with ``module.named_parameters()``, under their names;
* any other ndarray: a constant (``c0``, ``c1`` ...), captured as it was at trace time;
* pending values from earlier op calls: references to those nodes.

Nothing runs unless the program reads a value: awaiting a pending value makes the tracer
compute it then (the nodes it depends on, on the loop thread) and warn with a
:class:`~dataflow.TracerWarning`: Python code that uses a value is not recorded, so the graph
may be specialised to the example inputs. That is the tracer's limit, as for
``torch.jit.trace``: it records the ops one run issues, not the Python around them (``if``,
``for`` over data, ``float(t)``), and loops are unrolled for the example shapes.

Forked ``async def`` functions run as tasks as usual and their ops are recorded; a forked
plain function is traced through when its future is awaited (called with the pending values,
so its op calls are recorded; the fork itself leaves no trace in the graph, which has all the
parallelism anyway).

This module holds the tracer alone (its recording runs for every traced op), built on
``_tracer_base`` (its state, and computing a value the program awaits); the entry points,
:func:`trace` and :func:`trace_async`, which check their arguments and run a program under a
tracer, are in ``_tracing``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._errors import DataflowError
from .._registry import array_handle, op_for_kernel
from .._runtime import Runtime
from .._signature import Signature
from .._task import DONE, Cost, Future, Pending, Task
from ._frames import package, short_path, user_location
from ._ir import (
    ConstRef,
    Graph,
    GraphInput,
    InputRef,
    Node,
    NodeRef,
    OpLike,
    Ref,
    type_of,
)
from ._tracer_base import Record, TracerBase

__all__ = ["Tracer"]


class Tracer(TracerBase):
    """A backend that records op calls as graph nodes instead of running them.

    Used by :func:`trace` (``Runtime(backend=Tracer(...), interop_threads=0)``); see the
    module docstring. It runs no threads: a value the program reads is computed on the loop
    thread when it is awaited.
    """

    name = "trace"

    def __call__(self, runtime: Runtime) -> Tracer:
        """The backend factory ``Runtime(backend=...)`` calls: this tracer, bound to it."""
        self.runtime = runtime
        return self

    # -- the backend protocol (see dataflow._backend) --------------------------------------

    async def open(self) -> None:
        pass

    def cancel_everything(self) -> None:
        pass

    async def join(self) -> None:
        pass

    async def close(self) -> None:
        pass

    # -- placeholders for the inputs ------------------------------------------------------

    def placeholder(self, index: int) -> Any:
        """What the program receives for input ``index``: the array, or a fresh handle."""
        example = self._templates[index]
        make: Any
        if isinstance(example, Pending):
            task = example.task
            spec = task.spec if example._index is None else task.spec[example._index]
            make = type(example)
        else:
            declared = array_handle()  # the op library's pending-array type (ops.Tensor)
            if declared is None or type(example) is not np.ndarray:
                return example
            make, spec_rule = declared
            spec = spec_rule(example)
        stand_in = Task(Signature("input", spec), _input_kernel, (), None, self.runtime)
        self._input_of_task[stand_in.id] = index
        return make(stand_in, None, spec)

    # -- recording ----------------------------------------------------------------------

    def submit(
        self,
        sig: Signature,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        inputs: tuple[Task, ...],
        ready: bool,
        priority: float | None = None,
        timeout: float | None = None,
        values: Any = None,
        light: bool = False,
    ) -> Task:
        """Record an op call (or hold a forked plain function until its future is awaited)."""
        if sig.op is None:  # a forked plain function
            task = Task(sig, fn, args, kwargs, self.runtime)
            self._plain_forks[task.id] = task
            return task
        declared = op_for_kernel(fn, sig.name)
        if declared is None:
            declared = sig.op if getattr(sig.op, "kernel", None) is fn else None
        if declared is None:
            raise DataflowError(
                f"cannot trace {sig.name}: its kernel reached the runtime without a declared op "
                "(declare it with dataflow.op, or call it outside the traced program)"
            )
        return self.record(declared, args, kwargs, sig.spec, sig.cost)

    def record(
        self,
        op: OpLike,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        spec: Any,
        cost: Cost | None,
    ) -> Task:
        """Add a node for ``op(*args, **kwargs)``; the task stands for its value."""
        captured = tuple(self._capture(a) for a in args)
        captured_kw = {k: self._capture(v) for k, v in (kwargs or {}).items()}
        declared_in = op.qualname.rpartition(":")[0]
        where = user_location({"dataflow", package(declared_in)}, declared_in=declared_in)
        location = f"{short_path(where[0])}:{where[1]}" if where is not None else None
        task = Task(Signature(op.name, spec, cost, op=op), op.kernel, (), None, self.runtime)
        self._node_of_task[task.id] = len(self.records)
        self.records.append(Record(op, captured, captured_kw, spec, cost, location, task))
        return task

    def _capture(self, value: Any) -> Any:
        """``value`` with references in place of the values the graph knows."""
        if isinstance(value, Pending):
            return self._capture_pending(value)
        t = type(value)
        if t is np.ndarray or isinstance(value, np.ndarray):
            return self._capture_array(value)
        if t is tuple or t is list:
            return t(self._capture(v) for v in value)
        if t is dict:
            return {k: self._capture(v) for k, v in value.items()}
        if isinstance(value, tuple) and hasattr(t, "_fields"):
            return t(*(self._capture(v) for v in value))
        return value

    def _capture_pending(self, handle: Pending[Any]) -> Any:
        task = handle.task
        node = self._node_of_task.get(task.id)
        if node is not None:
            return NodeRef(node, handle._index)
        index = self._input_of_task.get(task.id)
        if index is not None:
            return InputRef(index)
        if task.id in self._plain_forks:
            self._run_plain_fork(task)
        if task.runtime is not self.runtime and task.state < DONE:
            raise DataflowError(
                f"{task.name} is pending in another runtime: a traced program can only use "
                "values it computes, its inputs and finished values"
            )
        return self._capture(handle.result())  # a finished value from outside: a constant

    def _capture_array(self, array: np.ndarray[Any, Any]) -> Ref:
        key = id(array)
        index = self._input_arrays.get(key)
        if index is not None:
            return InputRef(index)
        forced = self._forced.get(key)
        if forced is not None:
            return forced[0]
        param = self._parameters.get(key)
        if param is not None:
            self.constants[param[0]] = array
            self.parameter_names.add(param[0])
            return ConstRef(param[0])
        name = self._const_ids.get(key)
        if name is None:
            for k, example in enumerate(self._templates):
                if isinstance(example, np.ndarray) and np.may_share_memory(array, example):
                    self._warn(
                        f"an array that shares memory with input {k} (a numpy view of it, made "
                        "outside the ops) is recorded as a constant: the graph will reuse the "
                        "example's data. Apply ops to the input instead (ops.getitem, "
                        "ops.reshape ...), or trace with a pending input (ops.asarray(x))"
                    )
                    break
            name = f"c{len(self._const_ids)}"
            while name in self.constants:
                name += "_"
            self._const_ids[key] = name
            self.constants[name] = array
        return ConstRef(name)

    # -- the result ---------------------------------------------------------------------

    async def capture_output(self, value: Any) -> Any:
        """The program's result with references; forked futures in it are awaited."""
        if isinstance(value, Pending):
            task = value.task
            if task.id in self._plain_forks:
                self._run_plain_fork(task)
                return await self.capture_output(value.result())
            return self._capture_pending(value)
        if isinstance(value, Future):  # a forked async function's future
            return await self.capture_output(await value)
        t = type(value)
        if t is tuple or t is list:
            return t([await self.capture_output(v) for v in value])
        if t is dict:
            return {k: await self.capture_output(v) for k, v in value.items()}
        if isinstance(value, np.ndarray):
            return self._capture_array(value)
        return value

    def graph(self, inputs: Sequence[GraphInput], outputs: Any, name: str) -> Graph:
        """The recorded graph."""
        nodes: list[Node] = []
        for r in self.records:
            multi = type(r.spec) is tuple
            specs = r.spec if multi else (r.spec,)
            nodes.append(
                Node(
                    r.op,
                    r.args,
                    r.kwargs,
                    r.spec,
                    tuple(type_of(s) for s in specs),
                    multi,
                    r.cost,
                    r.location,
                )
            )
        return Graph(
            inputs, nodes, self.constants, outputs, parameters=self.parameter_names, name=name
        )


def _input_kernel(*args: Any) -> Any:
    raise DataflowError("a graph input placeholder has no kernel")
