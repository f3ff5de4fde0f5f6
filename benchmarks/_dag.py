"""Captured task graphs and their scheduling lower bound (pure functions, no threads).

A :class:`Dag` is what an instrument saw being dispatched: every task's id, the ids of the
tasks it reads, and a duration. For a graph run on ``p`` threads no schedule can finish
before ``max(critical path, total work / p)``; a scheduler's *makespan / lower bound* is how
far it is from that ideal (1.0 is perfect, and is not always reachable).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dataflow

__all__ = ["Dag", "DagRecorder", "critical_path", "dask_graph", "lower_bound"]


@dataclass
class Dag:
    """Tasks in creation order (a topological order: inputs exist before their readers)."""

    order: list[int] = field(default_factory=list)
    inputs: dict[int, tuple[int, ...]] = field(default_factory=dict)
    cost: dict[int, dataflow.Cost | None] = field(default_factory=dict)
    op: dict[int, str] = field(default_factory=dict)

    def add(
        self, tid: int, inputs: tuple[int, ...], cost: dataflow.Cost | None, op: str = ""
    ) -> None:
        self.order.append(tid)
        self.inputs[tid] = inputs
        self.cost[tid] = cost
        self.op[tid] = op

    def __len__(self) -> int:
        return len(self.order)

    def nominal(self, scale: float) -> dict[int, float]:
        """Each task's simulated duration: the scheduler's estimate of its cost, scaled."""
        return {t: dataflow.estimate_seconds(self.cost[t]) * scale for t in self.order}

    def edges(self) -> int:
        return sum(len(self.inputs[t]) for t in self.order)


class DagRecorder(dataflow.Instrument):
    """An instrument that records every task created: id, input ids, cost, op name."""

    def __init__(self) -> None:
        self.dag = Dag()

    def task_created(self, ts: int, task: Any) -> None:
        self.dag.add(task.id, tuple(t.id for t in task.inputs), task.cost, task.op)


def critical_path(dag: Dag, duration: Mapping[int, float]) -> float:
    """The longest chain of durations through the graph (inputs outside the graph are 0)."""
    finish: dict[int, float] = {}
    longest = 0.0
    for t in dag.order:
        start = max((finish.get(i, 0.0) for i in dag.inputs[t]), default=0.0)
        f = start + duration.get(t, 0.0)
        finish[t] = f
        longest = max(longest, f)
    return longest


def lower_bound(dag: Dag, duration: Mapping[int, float], threads: int) -> float:
    """``max(critical path, total work / threads)``: no schedule on ``threads`` beats it."""
    work = sum(duration.get(t, 0.0) for t in dag.order)
    return max(critical_path(dag, duration), work / threads)


def dask_graph(
    dag: Dag, duration: Mapping[int, float], kernel: Callable[..., Any]
) -> tuple[dict[str, Any], list[str]]:
    """The same graph for dask: ``kernel(task_id, seconds, *inputs)`` per task; sink keys."""
    graph: dict[str, Any] = {}
    read: set[int] = set()
    for t in dag.order:
        deps = [f"t{i}" for i in dag.inputs[t] if i in dag.inputs]
        read.update(i for i in dag.inputs[t])
        graph[f"t{t}"] = (kernel, t, duration.get(t, 0.0), *deps)
    sinks = [f"t{t}" for t in dag.order if t not in read]
    return graph, sinks
