"""Running a graph: the static plan (critical path, dispatch order, last uses) and dispatch."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow.graph import Graph, NodeRef

Array = np.ndarray[Any, Any]


def _rand(*shape: int, seed: int = 0) -> Array:
    out: Array = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return out


def _same_spec(x: Any, seconds: float) -> ops.TensorSpec:
    return ops.spec_of(x)


def _seconds_cost(x: Any, seconds: float) -> dataflow.Cost:
    # estimate_seconds() = flops / 2e10: this op claims to take `seconds`.
    return dataflow.Cost(seconds * 2e10, 0.0)


def _work_kernel(x: Array, seconds: float) -> Array:
    out: Array = x + 1
    return out


work = ops.define("work", _work_kernel, _same_spec, _seconds_cost)


async def chain_and_shorts(x: Any) -> Any:
    """Three short independent ops issued first, then a chain of five longer ones."""
    shorts = [work(x, 0.001) for _ in range(3)]
    y = x
    for _ in range(5):
        y = work(y, 0.01)
    return y, shorts


class _Starts(dataflow.Instrument):
    """Records which tasks start, in order, and the priority each was created with."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.priority: dict[int, float] = {}

    def task_created(self, ts: int, task: dataflow.Task) -> None:
        self.priority[task.id] = task.priority

    def task_started(self, ts: int, task: dataflow.Task) -> None:
        self.started.append(task.id)


def _run_on_one_thread(fn: Any, *args: Any) -> Any:
    async def main() -> Any:
        async with dataflow.Runtime(interop_threads=1, private_pool=True):
            return await dataflow.materialize(await fn(*args))

    return asyncio.run(main())


class TestPlan:
    def test_longest_path_ranks_the_chain_first(self) -> None:
        """Chain nodes outrank the short ones; the head of the chain is rank 0."""
        graph = dataflow.trace(chain_and_shorts, np.zeros(4))
        plan = graph.plan
        chain = [3, 4, 5, 6, 7]
        assert [plan.rank[i] for i in chain] == [0, 1, 2, 3, 4]
        assert sorted(plan.rank[i] for i in (0, 1, 2)) == [5, 6, 7]
        assert plan.longest_path_s[3] == pytest.approx(5 * (0.01 + 5e-6))
        assert plan.critical_path_s == plan.longest_path_s[3]

    def test_dispatch_order_is_topological_and_critical_first(self) -> None:
        """The dispatch order starts with the chain and reads only dispatched values."""
        graph = dataflow.trace(chain_and_shorts, np.zeros(4))
        order = graph.plan.order
        assert order[:5] == (3, 4, 5, 6, 7)
        seen: set[int] = set()
        for i in order:
            assert all(r.node in seen for r in graph.nodes[i].refs() if isinstance(r, NodeRef))
            seen.add(i)

    def test_each_value_is_freed_after_its_last_reader(self) -> None:
        """frees[k] lists the values whose last reader is order[k]; outputs are never freed."""

        async def f(x: Any) -> Any:
            a = ops.exp(x)  # read by b and c
            b = ops.tanh(a)
            c = ops.add(a, b)
            return ops.negative(c)

        graph = dataflow.trace(f, _rand(3))
        plan = graph.plan
        freed = {ref: plan.order[k] for k, refs in enumerate(plan.frees) for ref in refs}
        assert freed == {NodeRef(0): 2, NodeRef(1): 2, NodeRef(2): 3}

    def test_nodes_of_one_op_and_spec_share_a_signature(self) -> None:
        """What the scheduler learns of a kernel comes from every node that runs it: nodes of
        one op with the same output spec and cost share a signature; others do not."""

        async def f(x: Any, y: Any) -> Any:
            a = ops.tanh(x)
            b = ops.tanh(ops.negative(x))  # tanh again, same spec: shared
            c = ops.tanh(y)  # another shape: its own
            return a, b, c

        graph = dataflow.trace(f, _rand(3), _rand(5))
        sigs: dict[str, list[Any]] = {}
        for i, node in enumerate(graph.nodes):
            sigs.setdefault(node.op.name, []).append(graph.plan.sigs[i])
        tanh = sigs["tanh"]
        assert len(tanh) == 3 and tanh[0] is tanh[1] and tanh[2] is not tanh[0]
        assert sigs["negative"][0] is not tanh[0]

    def test_plan_is_computed_once(self) -> None:
        """The plan is cached on the (immutable) graph."""
        graph = dataflow.trace(chain_and_shorts, np.zeros(4))
        assert graph.plan is graph.plan


class TestDispatch:
    def test_critical_path_runs_first(self) -> None:
        """On one thread the graph runs the long chain before the short ops."""
        x = np.zeros(4)
        graph = dataflow.trace(chain_and_shorts, x)

        def starts(fn: Any) -> list[str]:
            inst = _Starts()
            names: dict[int, str] = {}

            class Named(dataflow.Instrument):
                def task_created(self, ts: int, task: dataflow.Task) -> None:
                    names[task.id] = "chain" if task.args[1] == 0.01 else "short"  # type: ignore[index]

            named = Named()
            dataflow.add_instrument(inst)
            dataflow.add_instrument(named)
            try:
                _run_on_one_thread(fn, x)
            finally:
                dataflow.remove_instrument(inst)
                dataflow.remove_instrument(named)
            return [names[i] for i in inst.started]

        assert starts(graph) == ["chain"] * 5 + ["short"] * 3
        # (Eager dispatch raises heights as the chain is issued, but a worker may already have
        # taken a short op before the chain existed, so its order is not asserted here.)

    def test_priorities_follow_the_ranks(self) -> None:
        """Each task's priority is the run's base plus its node's rank."""
        graph = dataflow.trace(chain_and_shorts, np.zeros(4))
        inst = _Starts()
        dataflow.add_instrument(inst)
        try:
            _run_on_one_thread(graph, np.zeros(4))
        finally:
            dataflow.remove_instrument(inst)
        priorities = [inst.priority[t] for t in sorted(inst.priority)]  # dispatch order
        base = priorities[0]
        assert [p - base for p in priorities] == [graph.plan.rank[i] for i in graph.plan.order]

    def test_intermediate_buffers_are_freed_after_their_last_reader(self) -> None:
        """Only the outputs' buffers outlive the run: the dispatcher keeps no intermediates."""
        values: list[weakref.ref[Array]] = []

        class Keep(dataflow.Instrument):
            def task_finished(self, ts: int, task: dataflow.Task) -> None:
                if isinstance(task.value, np.ndarray):
                    values.append(weakref.ref(task.value))

        async def f(x: Any) -> Any:
            y = x
            for _ in range(4):
                y = work(y, 1.0)  # pooled, not inline
            return y

        graph = dataflow.trace(f, np.zeros(1000))
        inst = Keep()
        dataflow.add_instrument(inst)
        try:
            out = graph.run(np.zeros(1000))
        finally:
            dataflow.remove_instrument(inst)
        gc.collect()
        alive = [r() for r in values if r() is not None]
        assert len(values) == 4
        assert len(alive) == 1 and alive[0] is out

    def test_returns_pending_tensors_inside_a_runtime(self) -> None:
        """await graph(x) gives pending Tensors with shapes, like the traced program."""

        async def f(x: Any) -> Any:
            return ops.tanh(x), ops.sum(x, axis=0)

        x = _rand(3, 2)
        graph = dataflow.trace(f, x)

        async def main() -> Any:
            a, b = await graph(x)
            assert isinstance(a, ops.Tensor) and a.shape == (3, 2)
            assert isinstance(b, ops.Tensor) and b.shape == (2,)
            return await a, await b

        a, b = dataflow.run(main)
        np.testing.assert_allclose(a, np.tanh(x))
        np.testing.assert_allclose(b, x.sum(axis=0), rtol=1e-6)

    def test_a_graph_can_be_forked(self) -> None:
        """A graph is an async callable: fork runs it as a task."""
        graph = dataflow.trace(ops.negative, np.ones(2))

        async def main() -> Any:
            return await dataflow.wait(dataflow.fork(graph, np.ones(2)))

        np.testing.assert_array_equal(dataflow.run(main), [-1.0, -1.0])

    def test_inputs_are_checked_against_the_trace(self) -> None:
        """Count, shape and dtype must be the traced ones; the errors say what to do."""
        graph = dataflow.trace(ops.tanh, _rand(2, 3))
        with pytest.raises(TypeError, match="takes 1 input"):
            graph.run(_rand(2, 3), _rand(2, 3))
        with pytest.raises(dataflow.OpInputError, match="trace again"):
            graph.run(_rand(4, 3))
        with pytest.raises(dataflow.OpTypeError, match=r"astype\(np.float32\)"):
            graph.run(np.ones((2, 3)))

    def test_the_dtype_hint_is_python_for_every_dtype(self) -> None:
        """A traced dtype numpy has no attribute for (big-endian data read from a file) is
        written np.dtype('>f4'), which runs; the hint said .astype(np.>f4)."""
        graph = dataflow.trace(ops.tanh, _rand(2, 3).astype(">f4"))
        with pytest.raises(dataflow.OpTypeError, match=r"astype\(np.dtype\('>f4'\)\)"):
            graph.run(_rand(2, 3))
        np.testing.assert_allclose(
            graph.run(_rand(2, 3).astype(np.dtype(">f4"))), np.tanh(_rand(2, 3)), rtol=1e-6
        )

    def test_lists_are_converted_when_they_fit(self) -> None:
        """A nested list of the right shape and dtype is accepted as an array."""
        graph = dataflow.trace(ops.negative, np.array([1, 2]))
        np.testing.assert_array_equal(graph.run([3, 4]), [-3, -4])

    def test_outside_a_runtime_it_says_how_to_run(self) -> None:
        """await graph(x) with no runtime is a NoRuntimeError; graph.run(x) is the way."""
        graph = dataflow.trace(ops.negative, np.ones(2))
        with pytest.raises(dataflow.NoRuntimeError, match=r"dataflow\.run"):
            asyncio.run(graph(np.ones(2)))

    def test_failure_propagates_like_eager(self) -> None:
        """A kernel error in a graph run raises TaskError naming the op."""

        async def f(x: Any) -> Any:
            return ops.matmul(x, x)

        graph: Graph = dataflow.trace(f, _rand(2, 2))

        def broken(a: Any, b: Any) -> Any:
            raise ArithmeticError("no")

        object.__setattr__(graph.nodes[0], "op", _Broken(graph.nodes[0].op, broken))
        with pytest.raises(dataflow.TaskError, match="ArithmeticError: no"):
            graph.run(_rand(2, 2))


class TestFusedDispatch:
    def test_group_of_tiny_ops_runs_inline(self) -> None:
        """A fused group whose steps would each run inline runs inline too."""
        import threading

        from dataflow.graph import fuse_elementwise

        async def f(x: Any) -> Any:
            return ops.exp(ops.negative(ops.tanh(ops.multiply(x, 2.0))))

        graph = fuse_elementwise(dataflow.trace(f, _rand(8)))
        threads: list[str] = []

        class Where(dataflow.Instrument):
            def task_started(self, ts: int, task: dataflow.Task) -> None:
                threads.append(threading.current_thread().name)

        inst = Where()
        dataflow.add_instrument(inst)
        try:
            graph.run(_rand(8))
        finally:
            dataflow.remove_instrument(inst)
        assert threads == [threading.current_thread().name]


class TestBenchmark:
    def test_bench_graph_quick(self, capsys: pytest.CaptureFixture[str]) -> None:
        """benchmarks/bench_graph.py --quick runs, checks outputs equal, prints its JSON line."""
        import importlib.util
        import json
        from pathlib import Path

        path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_graph.py"
        spec = importlib.util.spec_from_file_location("bench_graph", path)
        assert spec is not None and spec.loader is not None
        bench_graph = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench_graph)
        assert bench_graph.main(["--quick", "--rounds", "1", "--models", "2"]) == 0
        last = capsys.readouterr().out.strip().splitlines()[-1]
        assert last.startswith("BENCH_JSON ")
        doc = json.loads(last[len("BENCH_JSON ") :])
        assert {c for r in doc["results"] for c in r["contenders"]} == {
            "eager",
            "graph",
            "optimized",
        }


class _Broken:
    """An op stand-in with another kernel (to make a node fail)."""

    def __init__(self, op: Any, kernel: Any) -> None:
        self.name = op.name
        self.qualname = op.qualname
        self.kernel = kernel
        self.meta = op.meta
        self.cost = op.cost
        self.handle = op.handle
        self.inline = False
