"""Tracing: run a program once with example inputs and record the ops it issues.

:func:`trace` runs the program under a :class:`Tracer`, a runtime that *records* instead of
running: an op call (which reaches ``Runtime.submit`` as for any runtime, so tracing costs the
normal path nothing) becomes a node whose arguments hold references in place of values:

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

This module holds the tracer alone (its recording runs for every traced op); the entry points,
:func:`trace` and :func:`trace_async`, which check their arguments and run a program under a
tracer, are in ``_tracing``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._errors import DataflowError, task_failed
from .._registry import array_handle, op_for_kernel
from .._runtime import Runtime
from .._signature import Signature
from .._task import DONE, FAILED, Cost, Future, Pending, Task
from ._errors import TracerWarning
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
    iter_refs,
    type_of,
)

__all__ = ["Tracer"]


class _Record:
    """A node being recorded (its references are final; its value may be computed later)."""

    __slots__ = ("args", "cost", "kwargs", "location", "op", "spec", "task")

    def __init__(
        self,
        op: OpLike,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        spec: Any,
        cost: Cost | None,
        location: str | None,
        task: Task,
    ) -> None:
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.spec = spec
        self.cost = cost
        self.location = location
        self.task = task


class Tracer:
    """A backend that records op calls as graph nodes instead of running them.

    Used by :func:`trace` (``Runtime(backend=Tracer(...), interop_threads=0)``); see the
    module docstring. It runs no threads: a value the program reads is computed on the loop
    thread when it is awaited.
    """

    name = "trace"

    def __init__(
        self,
        templates: Sequence[Any],
        values: Sequence[np.ndarray[Any, Any]],
        parameters: dict[int, tuple[str, np.ndarray[Any, Any]]],
    ) -> None:
        """``templates[k]``: input k as the program gets it (an array, or a handle whose type
        and spec its placeholder copies); ``values[k]``: its value when the program reads it."""
        self.runtime: Runtime = None  # type: ignore[assignment]  # set by __call__
        self.records: list[_Record] = []
        self.constants: dict[str, np.ndarray[Any, Any]] = {}
        self.parameter_names: set[str] = set()
        self._templates = list(templates)
        self._examples = list(values)
        self._node_of_task: dict[int, int] = {}
        self._input_of_task: dict[int, int] = {}
        self._input_arrays: dict[int, int] = {
            id(v): k for k, v in enumerate(templates) if isinstance(v, np.ndarray)
        }
        self._parameters = parameters
        self._const_ids: dict[int, str] = {}
        # Values computed because the program read them: by node, and by identity (so an array
        # that came out of an `await` and goes back into an op is still that node).
        self._values: dict[int, Any] = {}
        self._forced: dict[int, tuple[NodeRef, np.ndarray[Any, Any]]] = {}
        self._plain_forks: dict[int, Task] = {}

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
        where = user_location({"dataflow", package(op.qualname.rpartition(":")[0])})
        location = f"{short_path(where[0])}:{where[1]}" if where is not None else None
        task = Task(Signature(op.name, spec, cost, op=op), op.kernel, (), None, self.runtime)
        self._node_of_task[task.id] = len(self.records)
        self.records.append(_Record(op, captured, captured_kw, spec, cost, location, task))
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

    # -- reading values ---------------------------------------------------------------------

    def completion(self, task: Task) -> Any:
        """``await handle``: compute the value now (and warn: the program reads it)."""
        if task.state < DONE:
            if task.id in self._plain_forks:
                self._run_plain_fork(task)
            elif task.id in self._input_of_task:
                self._warn("the program awaited an input's value")
                self._finish(task, self._examples[self._input_of_task[task.id]])
            else:
                node = self._node_of_task[task.id]
                record = self.records[node]
                self._warn(
                    f"the program awaited the value of %{node} ({record.op.name}): Python code "
                    "that uses a value is not recorded, so the graph may only be right for "
                    "these example inputs. If it only returns the value, return the pending "
                    "value instead of awaiting it"
                )
                self._force(node)
        assert self.runtime.host is not None
        return self.runtime.host.done_waiter()

    def cancel(self, task: Task) -> bool:
        """Nothing is queued while tracing: there is nothing to cancel."""
        return False

    def _warn(self, message: str) -> None:
        where = user_location({"dataflow"}, start=3)
        if where is None:
            warnings.warn(message, TracerWarning, stacklevel=4)
            return
        filename, line, module_globals = where
        registry = module_globals.setdefault("__warningregistry__", {})
        warnings.warn_explicit(
            message,
            TracerWarning,
            filename,
            line,
            module=module_globals.get("__name__"),
            registry=registry,
        )

    def _finish(self, task: Task, value: Any) -> None:
        task.value = value
        task.state = DONE

    def _run_plain_fork(self, task: Task) -> None:
        """Call a forked plain function now, with the pending values: its ops get recorded."""
        if task.state >= DONE:
            return
        fn, args, kwargs = task.fn, task.args or (), task.kwargs or {}
        assert fn is not None
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:
            err = task_failed(task.name, task.op, exc)
            task.error = err
            task.state = FAILED
            self.runtime.failures.append(err)
            return
        self._finish(task, value)

    def _value(self, ref: Any) -> Any:
        if type(ref) is InputRef:
            return self._examples[ref.index]
        if type(ref) is ConstRef:
            return self.constants[ref.name]
        assert type(ref) is NodeRef
        value = self._values[ref.node]
        return value if ref.index is None else value[ref.index]

    def _bind(self, value: Any) -> Any:
        t = type(value)
        if t is NodeRef or t is InputRef or t is ConstRef:
            return self._value(value)
        if t is tuple or t is list:
            return t(self._bind(v) for v in value)
        if t is dict:
            return {k: self._bind(v) for k, v in value.items()}
        if isinstance(value, tuple) and hasattr(t, "_fields"):
            return t(*(self._bind(v) for v in value))
        return value

    def _force(self, node: int) -> None:
        """Compute node ``node`` and the nodes it reads that are not computed yet."""
        needed: set[int] = set()
        stack = [node]
        while stack:
            n = stack.pop()
            if n in needed or n in self._values:
                continue
            needed.add(n)
            record = self.records[n]
            for ref in _refs_of(record.args, record.kwargs):
                if type(ref) is NodeRef:
                    stack.append(ref.node)
        for n in sorted(needed):  # node order is a topological order
            record = self.records[n]
            task = record.task
            try:
                value = record.op.kernel(*self._bind(record.args), **self._bind(record.kwargs))
            except Exception as exc:
                err = task_failed(task.name, task.op, exc)
                task.error = err
                task.state = FAILED
                raise err from exc
            self._values[n] = value
            self._finish(task, value)
            outputs = value if type(record.spec) is tuple else (value,)
            for k, v in enumerate(outputs):
                if isinstance(v, np.ndarray):
                    ref = NodeRef(n, k if type(record.spec) is tuple else None)
                    self._forced[id(v)] = (ref, v)

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


def _refs_of(args: Any, kwargs: Any) -> list[Any]:
    return [*iter_refs(args), *iter_refs(kwargs)]
