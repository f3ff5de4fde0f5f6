"""The tracer's state, and computing a value the traced program awaits: :class:`TracerBase`.

:class:`~dataflow.graph._capture.Tracer` (``_capture``) records op calls: its recording runs
for every traced op. It is built on this class, as the local scheduler is built in layers
(``dataflow._scheduler``: ``SchedulerBase`` -> ... -> ``Scheduler``, a module each). This layer
holds what the tracer knows (the records, the constants, the inputs' templates and example
values, the values computed so far) and the slow path, taken only when the program reads a
value: awaiting a pending value (``completion``) computes it on the loop thread with the nodes
it depends on (``_force``), or calls the forked plain function held until then
(``_run_plain_fork``), and warns with a :class:`~dataflow.TracerWarning` that the graph may only
be right for the example inputs. It calls nothing of the layer above; the recording calls
down into it (``_warn``, ``_run_plain_fork``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import task_failed
from .._runtime import Runtime
from .._task import DONE, FAILED, Cost, Task
from ._errors import COLLECTED, TracerWarning
from ._frames import user_location
from ._ir import ConstRef, InputRef, NodeRef, OpLike, iter_refs

__all__ = ["Record", "TracerBase"]


class Record:
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


class TracerBase:
    """The tracer's state, and what runs when the traced program reads a value.

    The layer :class:`~dataflow.graph._capture.Tracer` is built on (see the module
    docstring); it is never used alone.
    """

    def __init__(
        self,
        templates: Sequence[Any],
        values: Sequence[np.ndarray[Any, Any]],
        parameters: dict[int, tuple[str, np.ndarray[Any, Any]]],
    ) -> None:
        """``templates[k]``: input k as the program gets it (an array, or a handle whose type
        and spec its placeholder copies); ``values[k]``: its value when the program reads it."""
        self.runtime: Runtime = None  # type: ignore[assignment]  # set by __call__
        self.records: list[Record] = []
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
        collected = COLLECTED.get()
        if collected is not None:  # a compiled forward's trace: its problems, not warnings
            collected.append(message)
            return
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


def _refs_of(args: Any, kwargs: Any) -> list[Any]:
    return [*iter_refs(args), *iter_refs(kwargs)]
