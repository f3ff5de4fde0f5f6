"""Graph passes, each on its own (where it applies and where it must not), and optimize()."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow.graph import (
    ConstRef,
    FusedOp,
    Graph,
    NodeRef,
    eliminate_common_subexpressions,
    eliminate_dead_code,
    fold_constants,
    fold_stack_reductions,
    fuse_elementwise,
    optimize,
)
from dataflow.graph._fused import Arg, Tmp, ufunc_of
from examples.lstm_ensemble import Ensemble

Array = np.ndarray[Any, Any]


def _rand(*shape: int, seed: int = 0, dtype: Any = np.float32) -> Array:
    out: Array = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return out


def _names(graph: Graph) -> list[str]:
    return [node.op.name for node in graph.nodes]


def _fused(graph: Graph) -> list[FusedOp]:
    return [node.op for node in graph.nodes if isinstance(node.op, FusedOp)]


def _same_spec(x: Any) -> ops.TensorSpec:
    return ops.spec_of(x)


def _cost(x: Any) -> dataflow.Cost:
    return dataflow.Cost(float(np.prod(x.shape)), 8.0 * float(np.prod(x.shape)))


def _softsign_kernel(x: Array) -> Array:
    out: Array = x / (1 + np.abs(x))
    return out


def _boom_kernel(x: Array) -> Array:
    raise ValueError("boom")


softsign = ops.define("softsign", _softsign_kernel, _same_spec, _cost)
# A kernel that is not a ufunc, declared elementwise: fusable (Op keeps extra attributes).
setattr(softsign, "elementwise", True)  # noqa: B010
boom = ops.define("boom", _boom_kernel, _same_spec, _cost)


def _equal_results(graph: Graph, other: Graph, *inputs: Array, exact: bool = True) -> None:
    a = graph.run(*inputs)
    b = other.run(*inputs)
    if exact:
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6, equal_nan=True)


class TestFoldConstants:
    def test_folds_a_node_of_constants(self) -> None:
        """w * 2 on a constant w is computed once and becomes a constant."""
        w = _rand(3, seed=1)

        async def f(x: Any) -> Any:
            return ops.add(x, ops.multiply(w, 2.0))

        graph = dataflow.trace(f, _rand(3))
        folded = fold_constants(graph)
        assert _names(folded) == ["add"]
        (ref,) = [a for a in folded.nodes[0].args if isinstance(a, ConstRef)]
        np.testing.assert_array_equal(folded.constants[ref.name], w * 2.0)
        assert "c0" not in folded.constants  # w itself is no longer read
        _equal_results(graph, folded, _rand(3, seed=7))

    def test_folds_chains_and_parameters(self) -> None:
        """A chain on parameters (transpose then scale) folds all the way."""
        fc = ops.nn.Linear(4, 3, seed=0)

        async def f(x: Any) -> Any:
            return ops.matmul(x, ops.multiply(ops.transpose(fc.weight), 0.5))

        graph = dataflow.trace(f, _rand(2, 4))
        folded = fold_constants(graph)
        assert _names(folded) == ["matmul"]
        _equal_results(graph, folded, _rand(2, 4, seed=3))

    def test_leaves_nodes_that_read_inputs(self) -> None:
        """A graph where every node reads an input comes back unchanged."""

        async def f(x: Any) -> Any:
            return ops.tanh(ops.negative(x))

        graph = dataflow.trace(f, _rand(3))
        assert fold_constants(graph) is graph

    def test_leaves_a_failing_kernel_to_fail_at_run_time(self) -> None:
        """A constant node whose kernel raises is kept: the error surfaces when run."""
        w = _rand(3)

        async def f(x: Any) -> Any:
            return ops.add(x, boom(w))

        graph = dataflow.trace(f, _rand(3))
        folded = fold_constants(graph)
        assert _names(folded) == ["boom", "add"]
        with pytest.raises(dataflow.TaskError, match="boom"):
            folded.run(_rand(3))

    def test_folds_a_multi_output_node(self) -> None:
        """Each output of a folded multi-output node becomes its own constant."""
        w = _rand(4, seed=2)

        async def f(x: Any) -> Any:
            a, b = ops.split(w, 2)
            return ops.add(x, a), ops.add(x, b)

        graph = dataflow.trace(f, _rand(2))
        folded = fold_constants(graph)
        assert _names(folded) == ["add", "add"]
        x = _rand(2, seed=5)
        for got, want in zip(folded.run(x), graph.run(x), strict=True):
            np.testing.assert_array_equal(got, want)


class TestCommonSubexpressions:
    def test_merges_the_same_op_on_the_same_arguments(self) -> None:
        """tanh(x) computed twice becomes one node read twice."""

        async def f(x: Any) -> Any:
            return ops.add(ops.tanh(x), ops.tanh(x))

        graph = dataflow.trace(f, _rand(3))
        merged = eliminate_common_subexpressions(graph)
        assert _names(merged) == ["tanh", "add"]
        assert merged.nodes[1].args == (NodeRef(0), NodeRef(0))
        _equal_results(graph, merged, _rand(3, seed=4))

    def test_keeps_different_ops_and_literals(self) -> None:
        """exp vs tanh, 0.0 vs -0.0, 2 vs 2.0: nothing to merge."""

        async def f(x: Any) -> Any:
            return (
                ops.tanh(x),
                ops.exp(x),
                ops.multiply(x, 0.0),
                ops.multiply(x, -0.0),
                ops.multiply(x, 2),
                ops.multiply(x, 2.0),
            )

        graph = dataflow.trace(f, _rand(3))
        assert eliminate_common_subexpressions(graph) is graph

    def test_merges_equal_constants_then_their_readers(self) -> None:
        """Two arrays with the same bytes are one constant, so their readers merge."""
        a, b = _rand(3, seed=1), _rand(3, seed=1)

        async def f(x: Any) -> Any:
            return ops.add(ops.multiply(x, a), ops.multiply(x, b))

        graph = dataflow.trace(f, _rand(3))
        assert len(graph.constants) == 2
        merged = eliminate_common_subexpressions(graph)
        assert len(merged.constants) == 1
        assert _names(merged) == ["multiply", "add"]
        _equal_results(graph, merged, _rand(3, seed=8))

    def test_two_outputs_stay_two_arrays(self) -> None:
        """tanh(x) returned twice, as two computations: two nodes (one node would hand the
        caller one array twice, where writing into one changed the other); a third tanh(x)
        read by another op still merges."""

        async def f(x: Any) -> Any:
            return ops.tanh(x), ops.tanh(x), ops.negative(ops.tanh(x))

        graph = dataflow.trace(f, _rand(3))
        merged = eliminate_common_subexpressions(graph)
        assert _names(merged) == ["tanh", "tanh", "negative"]
        a, b, _ = merged.run(_rand(3, seed=2))
        assert a is not b and np.array_equal(a, b)
        a, b, _ = merged.optimize().run(_rand(3, seed=2))
        a += 1.0
        assert not np.array_equal(a, b)

    def test_merges_multi_output_nodes(self) -> None:
        """split(x) twice: one node; readers of either output follow."""

        async def f(x: Any) -> Any:
            a, _ = ops.split(x, 2)
            _, d = ops.split(x, 2)
            return ops.add(a, d)

        graph = dataflow.trace(f, _rand(4))
        merged = eliminate_common_subexpressions(graph)
        assert _names(merged) == ["split", "add"]
        assert merged.nodes[1].args == (NodeRef(0, 0), NodeRef(0, 1))

    def test_ensemble_flips_the_input_once(self) -> None:
        """Each BiLSTM flips x: after CSE the ensemble flips it once."""
        graph = dataflow.trace(Ensemble(3, 4, seed=0), _rand(3, 2, 4))
        x = graph.nodes[0].args[0]
        flips = [n for n in graph.nodes if n.op.name == "flip" and n.args[0] == x]
        assert len(flips) == 3
        merged = eliminate_common_subexpressions(graph)
        assert merged.op_counts()["ops.flip"] == 1 + 3  # x once, and each model's output


class TestDeadCode:
    def test_drops_values_no_output_needs(self) -> None:
        """exp(x) computed and never used is dropped, with the constant only it read."""
        c = _rand(3, seed=3)

        async def f(x: Any) -> Any:
            ops.exp(ops.add(x, c))
            return ops.tanh(x)

        graph = dataflow.trace(f, _rand(3))
        live = eliminate_dead_code(graph)
        assert _names(live) == ["tanh"]
        assert not live.constants
        _equal_results(graph, live, _rand(3, seed=2))

    def test_keeps_a_graph_without_dead_code(self) -> None:
        """Nothing dead: the same graph comes back."""

        async def f(x: Any) -> Any:
            return ops.tanh(ops.exp(x))

        graph = dataflow.trace(f, _rand(3))
        assert eliminate_dead_code(graph) is graph

    def test_drops_the_lstm_final_states(self) -> None:
        """A forward that ignores a bidirectional LSTM's (h_n, c_n): their stack_states ops
        are dead. (A one-layer, one-direction LSTM returns its states stacked by its own
        op, so the ensemble has none.)"""
        lstm = ops.nn.LSTM(4, 4, bidirectional=True, seed=0)

        async def f(x: Any) -> Any:
            out, _ = await lstm(x)
            return out

        graph = dataflow.trace(f, _rand(3, 2, 4))
        assert graph.op_counts()["ops.stack_states"] == 2
        assert "ops.stack_states" not in eliminate_dead_code(graph).op_counts()
        assert (
            "ops.stack_states"
            not in dataflow.trace(Ensemble(1, 4, seed=0), _rand(3, 2, 4)).op_counts()
        )


class TestStackReductions:
    @pytest.mark.parametrize(("reduce", "axis"), [("sum", 0), ("max", 1), ("min", -2)])
    def test_a_reduction_along_the_new_axis_is_a_fold_bit_for_bit(
        self, reduce: str, axis: int
    ) -> None:
        """sum/max/min of a stack along its new axis: a chain of add/maximum/minimum, exact.
        (Not along the innermost axis, which numpy reduces pairwise: tests/test_fold.py.)"""

        async def f(a: Any, b: Any, c: Any, d: Any) -> Any:
            stacked = ops.stack([ops.tanh(a), b, c, ops.exp(d)], axis=axis)
            return getattr(ops, reduce)(stacked, axis=axis)

        xs = [_rand(5, 7, seed=k) * 10.0 ** (k - 2) for k in range(4)]
        graph = dataflow.trace(f, *xs)
        folded = eliminate_dead_code(fold_stack_reductions(graph))
        fold = {"sum": "add", "max": "maximum", "min": "minimum"}[reduce]
        assert _names(folded).count(fold) == 3 and "stack" not in _names(folded)
        _equal_results(graph, folded, *xs)
        _equal_results(graph, folded, *[_rand(5, 7, seed=9 + k) for k in range(4)])

    def test_positional_arguments_and_optimize(self) -> None:
        """ops.sum(stack, 0) (positional axis) folds inside optimize(); results are exact."""

        async def f(a: Any, b: Any) -> Any:
            return ops.sum(ops.stack([a, b]), 0)

        xs = [_rand(4, seed=1), _rand(4, seed=2)]
        graph = dataflow.trace(f, *xs)
        best = optimize(graph)
        assert "stack" not in _names(best) and "sum" not in _names(best)
        _equal_results(graph, best, *xs)

    @pytest.mark.parametrize(
        "case", ["other reader", "output", "keepdims", "other axis", "no axis", "int dtype"]
    )
    def test_leaves_what_is_not_a_plain_fold(self, case: str) -> None:
        async def f(a: Any, b: Any) -> Any:
            stacked = ops.stack([a, b])
            if case == "other reader":
                return ops.sum(stacked, axis=0), ops.tanh(stacked)
            if case == "output":
                return ops.sum(stacked, axis=0), stacked
            if case == "keepdims":
                return ops.sum(stacked, axis=0, keepdims=True)
            if case == "other axis":
                return ops.sum(stacked, axis=1)
            if case == "no axis":
                return ops.sum(stacked)
            return ops.sum(ops.stack([ops.astype(a, np.int32), ops.astype(b, np.int32)]), 0)

        xs = [_rand(3, 4, seed=1), _rand(3, 4, seed=2)]
        graph = dataflow.trace(f, *xs)
        assert fold_stack_reductions(graph) is graph

    def test_the_ensemble_loses_its_stack_and_a_saved_graph_keeps_the_fold(
        self, tmp_path: Any
    ) -> None:
        """The tutorial's stack-and-sum becomes three adds; the file round trip keeps them."""
        ens = Ensemble(4, 8, seed=0)
        x = _rand(5, 2, 8)
        graph = dataflow.trace(ens, x)
        best = optimize(graph)
        assert "ops.stack" in graph.op_counts() and "ops.stack" not in best.op_counts()
        _equal_results(graph, best, x)
        path = tmp_path / "ens.dfg"
        best.save(path)
        loaded = dataflow.load(path, trust=["ops"])
        _equal_results(best, loaded, x)


class TestFusion:
    def test_fuses_an_elementwise_chain(self) -> None:
        """tanh(x * w + b) is one fused node of three steps; bit-exact with numpy."""
        w, b = _rand(4, 5, seed=1), _rand(5, seed=2)

        async def f(x: Any) -> Any:
            return ops.tanh(ops.add(ops.multiply(x, w), b))

        graph = dataflow.trace(f, _rand(4, 5))
        fused = fuse_elementwise(graph)
        assert len(fused.nodes) == 1
        (op,) = _fused(fused)
        assert [s.op.name for s in op.steps] == ["multiply", "add", "tanh"]
        _equal_results(graph, fused, _rand(4, 5, seed=9))

    def test_long_chain_is_one_node(self) -> None:
        """A 2,000-op chain fuses into one node without recursion; equal to numpy."""
        b = _rand(6, seed=3)

        async def f(x: Any) -> Any:
            for k in range(1000):
                x = ops.tanh(ops.add(x, b) if k % 2 else ops.multiply(b, x))
            return x

        x = _rand(6)
        graph = dataflow.trace(f, x)
        fused = graph.optimize()
        assert _names(fused) == ["fused"]
        assert len(_fused(fused)[0].steps) == 2000
        want = x
        for k in range(1000):
            want = np.tanh(want + b if k % 2 else b * want)
        np.testing.assert_array_equal(fused.run(x), want)

    def test_external_values_are_numbered_in_walk_order(self) -> None:
        """A tree's steps are post-order and its arguments numbered as the walk meets them."""
        b, c = _rand(3, seed=1), _rand(3, seed=2)

        async def f(x: Any, y: Any) -> Any:
            return ops.add(ops.multiply(b, ops.exp(x)), ops.multiply(ops.tanh(y), c))

        graph = dataflow.trace(f, _rand(3), _rand(3, seed=5))
        (op,) = _fused(fuse_elementwise(graph))
        assert [s.op.name for s in op.steps] == ["exp", "multiply", "tanh", "multiply", "add"]
        assert [s.args for s in op.steps] == [
            (Arg(1),),  # b met first (Arg 0), then x
            (Arg(0), Tmp(0)),
            (Arg(2),),
            (Tmp(2), Arg(3)),
            (Tmp(1), Tmp(3)),
        ]
        _equal_results(graph, fuse_elementwise(graph), _rand(3, seed=6), _rand(3, seed=7))

    def test_does_not_fuse_a_value_read_twice(self) -> None:
        """y = x * w read by two nodes stays a node of its own."""
        w = _rand(3, seed=1)

        async def f(x: Any) -> Any:
            y = ops.multiply(x, w)
            return ops.add(ops.tanh(y), y)

        graph = dataflow.trace(f, _rand(3))
        fused = fuse_elementwise(graph)
        assert _names(fused) == ["multiply", "fused"]
        assert [s.op.name for s in _fused(fused)[0].steps] == ["tanh", "add"]
        _equal_results(graph, fused, _rand(3, seed=4))

    def test_does_not_fuse_an_output(self) -> None:
        """A value the program returns is not absorbed into its reader."""

        async def f(x: Any) -> Any:
            y = ops.exp(x)
            return y, ops.tanh(y)

        graph = dataflow.trace(f, _rand(3))
        assert fuse_elementwise(graph) is graph

    def test_leaves_non_elementwise_ops(self) -> None:
        """matmul and sum are not elementwise: nothing to fuse around a lone tanh."""

        async def f(x: Any, w: Any) -> Any:
            return ops.sum(ops.tanh(ops.matmul(x, w)), axis=0)

        graph = dataflow.trace(f, _rand(2, 3), _rand(3, 4))
        assert fuse_elementwise(graph) is graph

    def test_broadcasting_and_dtype_changes(self) -> None:
        """Broadcast shapes, int -> float division and comparisons fuse and stay exact."""

        async def f(x: Any, n: Any) -> Any:
            ratio = ops.divide(n, 3)  # int64 / int -> float64, shape (4, 1)
            scaled = ops.multiply(ratio, x)  # (4, 1) * (5,) -> (4, 5)
            return ops.multiply(ops.greater(scaled, 0.0), scaled)

        x = _rand(5, dtype=np.float64)
        n = np.arange(4).reshape(4, 1)
        graph = dataflow.trace(f, x, n)
        fused = fuse_elementwise(graph)
        assert _names(fused) == ["fused", "fused"]  # scaled is read twice: two groups
        _equal_results(graph, fused, _rand(5, seed=3, dtype=np.float64), n + 2)

    def test_fused_kernel_leaves_its_inputs_alone(self) -> None:
        """Intermediates are reused in place; the inputs never are."""

        async def f(x: Any) -> Any:
            return ops.exp(ops.negative(ops.tanh(x)))

        x = _rand(6)
        before = x.copy()
        fused = fuse_elementwise(dataflow.trace(f, x))
        np.testing.assert_array_equal(fused.run(x), np.exp(-np.tanh(before)))
        np.testing.assert_array_equal(x, before)

    def test_declared_elementwise_op_fuses(self) -> None:
        """An op with elementwise = True joins a group (numpy engine: its own kernel)."""

        async def f(x: Any) -> Any:
            return ops.tanh(softsign(ops.multiply(x, 3.0)))

        graph = dataflow.trace(f, _rand(5))
        fused = fuse_elementwise(graph)
        assert _names(fused) == ["fused"]
        _equal_results(graph, fused, _rand(5, seed=6))

    def test_overflow_gives_inf_like_numpy(self) -> None:
        """A fused exp that overflows returns inf (warnings are errors in this suite)."""

        async def f(x: Any) -> Any:
            return ops.multiply(ops.exp(x), 2.0)

        x = np.array([1.0, 1000.0])
        fused = fuse_elementwise(dataflow.trace(f, x))
        np.testing.assert_array_equal(fused.run(x), [2 * math.e, np.inf])

    def test_numexpr_engine_is_close(self) -> None:
        """engine="numexpr" evaluates float chains in numexpr, within float32 rounding."""
        pytest.importorskip("numexpr")
        b = _rand(5, seed=2)

        async def f(x: Any) -> Any:
            return ops.subtract(ops.tanh(ops.add(ops.multiply(x, 0.5), b)), 1.0)

        graph = dataflow.trace(f, _rand(3, 5))
        fused = fuse_elementwise(graph, engine="numexpr")
        assert _fused(fused)[0].engine == "numexpr"
        _equal_results(graph, fused, _rand(3, 5, seed=1), exact=False)

    def test_numexpr_engine_broadcasts_empty_arrays_like_numpy(self) -> None:
        """An empty operand runs the numpy kernel: numexpr broadcast (1, 0) with (3, 0) to
        (1, 0), and the task failed on its declared (3, 0)."""
        pytest.importorskip("numexpr")

        async def f(x: Any, y: Any) -> Any:
            return ops.subtract(x, ops.multiply(y, 2.0))

        x, y = np.ones((1, 0)), np.ones((3, 0))
        fused = fuse_elementwise(dataflow.trace(f, x, y), engine="numexpr")
        assert _fused(fused)[0].engine == "numexpr"
        assert fused.run(x, y).shape == (3, 0)

    def test_numexpr_engine_falls_back_for_mixed_dtypes(self) -> None:
        """A group numexpr cannot express exactly runs the numpy kernel: exact results."""

        async def f(x: Any) -> Any:
            return ops.multiply(ops.greater(x, 0.0), x)

        graph = dataflow.trace(f, _rand(6))
        fused = fuse_elementwise(graph, engine="numexpr")
        _equal_results(graph, fused, _rand(6, seed=3))

    def test_fused_op_composes_meta_and_cost(self) -> None:
        """A fused op's meta and cost are its steps' rules composed."""

        async def f(x: Any) -> Any:
            return ops.tanh(ops.exp(x))

        x = _rand(2, 3)
        graph = dataflow.trace(f, x)
        fused = fuse_elementwise(graph)
        op = _fused(fused)[0]
        assert op.meta(x) == graph.nodes[1].spec
        cost = op.cost(x)
        assert cost.flops == sum(n.cost.flops for n in graph.nodes if n.cost is not None)

    def test_unknown_engine_is_refused(self) -> None:
        """Only numpy and numexpr engines exist."""
        graph = dataflow.trace(ops.tanh, _rand(2))
        with pytest.raises(ValueError, match="numexpr"):
            fuse_elementwise(graph, engine="cuda")


# -- optimize(): results equal on random inputs ------------------------------------------------

_UNARY = [ops.tanh, ops.exp, ops.negative, ops.sigmoid, ops.relu]
_BINARY = [ops.add, ops.subtract, ops.multiply, ops.maximum]


def _random_program(seed: int) -> Any:
    """A random straight-line program over two (4, 5) inputs and a constant."""
    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(12):
        kind = rng.integers(0, 4)
        steps.append((int(kind), int(rng.integers(0, 100)), int(rng.integers(0, 100))))
    const = rng.standard_normal((4, 5)).astype(np.float32)
    square = (rng.standard_normal((5, 5)) / 5).astype(np.float32)

    async def program(x: Any, y: Any) -> Any:
        values: list[Any] = [x, y, const]
        for kind, i, j in steps:
            a, b = values[-1 - i % 3], values[j % len(values)]  # mostly chains
            if kind == 0:
                values.append(_UNARY[i % len(_UNARY)](a))
            elif kind == 1:
                values.append(_BINARY[j % len(_BINARY)](a, b))
            elif kind == 2:
                values.append(ops.multiply(ops.tanh(a), 0.5))
            else:
                values.append(ops.matmul(a, square) if i % 3 == 0 else ops.add(b, 1.0))
        return values[-1], values[-2]

    return program


def _inputs(seed: int) -> tuple[Array, Array]:
    return _rand(4, 5, seed=seed), _rand(4, 5, seed=seed + 1000)


class TestOptimize:
    @pytest.mark.parametrize("seed", range(12))
    @pytest.mark.parametrize("engine", ["numpy", "numexpr"])
    def test_random_programs_keep_their_results(self, seed: int, engine: str) -> None:
        """Random programs: optimized graph == eager run on fresh random inputs."""
        if engine == "numexpr":
            pytest.importorskip("numexpr")
        program = _random_program(seed)
        graph = optimize(dataflow.trace(program, *_inputs(seed)), engine=engine)
        for k in range(3):
            x, y = _inputs(seed * 10 + k + 1)
            want = dataflow.run(program, x, y)
            got = graph.run(x, y)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6, equal_nan=True)

    def test_ensemble_keeps_its_results(self) -> None:
        """The tutorial ensemble (2 models, small T, B, C): optimized == eager, several inputs."""
        ens = Ensemble(2, 8, seed=0)
        graph = dataflow.trace(ens, _rand(4, 3, 8))
        optimized = graph.optimize()
        assert len(optimized.nodes) < len(graph.nodes)
        for seed in range(3):
            x = _rand(4, 3, 8, seed=seed + 10)
            want = dataflow.run(ens, x)
            np.testing.assert_allclose(optimized.run(x), want, rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(graph.run(x), want, rtol=1e-6, atol=1e-7)

    def test_optimize_is_idempotent(self) -> None:
        """A second optimize() finds nothing more to do."""
        graph = dataflow.trace(_random_program(3), *_inputs(3)).optimize()
        again = graph.optimize()
        assert _names(again) == _names(graph)

    def test_unknown_engine_is_refused(self) -> None:
        """optimize(engine=...) checks the engine name first."""
        graph = dataflow.trace(ops.tanh, _rand(2))
        with pytest.raises(ValueError, match="engine"):
            graph.optimize(engine="gpu")


class _TwoZeroBiases(ops.nn.Module):
    def __init__(self) -> None:
        self.a = np.zeros(3, np.float32)
        self.b = np.zeros(3, np.float32)

    async def forward(self, x: Any) -> Any:
        return ops.add(ops.add(x, self.a), self.b)


class _HalfTransposed(ops.nn.Module):
    def __init__(self) -> None:
        self.w = np.random.default_rng(3).standard_normal((3, 3)).astype(np.float32)

    async def forward(self, x: Any) -> Any:
        return ops.matmul(x, ops.multiply(ops.transpose(self.w), 0.5))


_OFFSET = np.arange(3, dtype=np.float32)


async def _a_folded_output(x: Any) -> Any:
    return ops.add(x, 0.0), ops.multiply(_OFFSET, 2.0)


class TestParametersStayParameters:
    """The passes treat a module's parameters as what they are: arrays the program reads at
    each run, which may be written in place between runs."""

    def _compiled_and_eager(self, module: Any, x: Any) -> tuple[Any, Any]:
        forward = dataflow.compile(module)

        async def both() -> tuple[Any, Any]:
            return await forward(x), await dataflow.materialize(await module(x))

        dataflow.run(both)
        return forward, both

    def test_equal_parameters_are_not_merged(self) -> None:
        """Two zero-initialised biases: writing one later must not be lost (nor move the other)."""
        m = _TwoZeroBiases()
        x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
        optimized = dataflow.trace(m, x).optimize()
        assert {"a", "b"} <= set(optimized.parameters)
        _, both = self._compiled_and_eager(m, x)
        m.b[:] = 100.0
        got, want = dataflow.run(both)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(optimized.run(x), want)

    def test_a_chain_on_a_parameter_is_not_folded(self) -> None:
        m = _HalfTransposed()
        x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
        optimized = dataflow.trace(m, x).optimize()
        assert [n.op.name for n in optimized.nodes][-1] == "matmul" and len(optimized.nodes) > 1
        _, both = self._compiled_and_eager(m, x)
        m.w *= np.float32(2)
        got, want = dataflow.run(both)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        np.testing.assert_allclose(optimized.run(x), want, rtol=1e-6)

    def test_a_constant_output_is_a_new_array_each_run(self) -> None:
        """A folded constant returned as an output: writing to one run's result does not
        change the next run's (the eager program made a new array each time)."""
        x = np.ones(3, np.float32)
        graph = dataflow.trace(_a_folded_output, x).optimize()
        forward = dataflow.compile(_a_folded_output)

        async def call() -> Any:
            return await forward(x)

        def on_graph() -> Any:
            return graph.run(x)

        def compiled() -> Any:
            return dataflow.run(call)

        for run in (on_graph, compiled):
            for _ in range(2):
                _, b = run()
                np.testing.assert_array_equal(b, _OFFSET * 2)
                b += 100.0

    def test_a_0d_constant_traces_with_the_check(self) -> None:
        """trace(check=True) compares the two traces' constants: a 0-d one crashed it."""
        c = np.array(2.0, np.float32)

        async def f(x: Any) -> Any:
            return ops.add(x, c)

        x = np.ones(3, np.float32)
        np.testing.assert_array_equal(dataflow.trace(f, x).run(x), x + c)


def _clamped_add(x: Any, y: Any) -> Any:
    return np.clip(np.add(x, y), -1.0, 1.0)


# functools.wraps(np.add) makes it look like np.add (its __wrapped__), but it does more.
_add_clamped = ops.define(
    "add_clamped",
    functools.wraps(np.add)(_clamped_add),
    lambda x, y: ops.TensorSpec(np.broadcast_shapes(x.shape, y.shape), x.dtype),
)


class TestFusionRunsTheKernel:
    def test_a_wrapper_of_a_ufunc_is_not_taken_for_the_ufunc(self) -> None:
        """Fusion calls a ufunc itself only for a kernel that is one, or says it calls one
        unchanged (``dataflow_ufunc``): this clamp, which only wraps np.add's name, runs."""

        async def f(x: Any) -> Any:
            return _add_clamped(ops.multiply(x, 3.0), x)

        x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
        want = np.clip(x * 3 + x, -1, 1)
        np.testing.assert_array_equal(dataflow.run(f, x), want)
        np.testing.assert_array_equal(dataflow.trace(f, x).optimize().run(x), want)
        assert ufunc_of(ops.add) is np.add  # ops' own wrappers say so
