"""Eager stack folding (dataflow._fold): a reduction along a pending stack's new axis runs as a
fold of its binary op; the stack, once nobody holds it, is dropped unrun."""

from __future__ import annotations

import gc
import threading
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow._task import CANCELLED, DONE
from tests._ops_helpers import rand


def _gate_kernel(x: Any, gate: threading.Event) -> Any:
    gate.wait(10)
    return np.array(x, copy=True)


gated = ops.define("fold_gate", _gate_kernel, lambda x, gate: ops.spec_of(x), inline=False)


def _members(n: int, dtype: Any = np.float32) -> list[np.ndarray]:
    return [rand((5, 7), dtype, seed=k) for k in range(n)]


async def _folded(reduce: Any, xs: list[np.ndarray], **kw: Any) -> tuple[Any, list[str], Any]:
    """``reduce(stack(pending xs), **kw)`` with the inputs held back until both calls were
    made: (its value, the ops that ran, the stack task)."""
    gate = threading.Event()
    with dataflow.profile() as prof:
        pending = [gated(x, gate) for x in xs]
        stacked = ops.stack(pending)
        task = stacked.task
        out = reduce(stacked, **kw)
        del stacked
        gc.collect()
        gate.set()
        value = await out
        await dataflow.fork(lambda: None)  # let the loop run the drop it was handed
    ran = [s.op for s in prof.trace().tasks]
    return value, ran, task


class TestFold:
    @pytest.mark.parametrize("n", [2, 3, 4, 7])
    def test_sum_is_bit_for_bit_and_the_stack_never_runs(self, n: int) -> None:
        xs = _members(n)

        async def main() -> tuple[Any, list[str], Any]:
            return await _folded(ops.sum, xs, axis=0)

        value, ran, stack = dataflow.run(main)
        np.testing.assert_array_equal(value, np.sum(np.stack(xs), axis=0))
        assert value.dtype == np.float32
        assert "stack" not in ran and "sum" not in ran
        assert ran.count("add") == n - 1
        assert stack.state == CANCELLED
        assert "folded into a reduction" in str(stack.error)

    @pytest.mark.parametrize(("reduce", "binary"), [(ops.max, np.max), (ops.min, np.min)])
    def test_max_and_min(self, reduce: Any, binary: Any) -> None:
        xs = _members(3, np.float64)

        async def main() -> tuple[Any, list[str], Any]:
            return await _folded(reduce, xs, axis=0)

        value, ran, _ = dataflow.run(main)
        np.testing.assert_array_equal(value, binary(np.stack(xs), axis=0))
        assert "stack" not in ran

    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_mean_folds_then_divides_bit_for_bit(self, dtype: Any) -> None:
        xs = _members(5, dtype)

        async def main() -> tuple[Any, list[str], Any]:
            return await _folded(ops.mean, xs, axis=0)

        value, ran, stack = dataflow.run(main)
        np.testing.assert_array_equal(value, np.mean(np.stack(xs), axis=0))
        assert value.dtype == dtype
        assert "stack" not in ran and "mean" not in ran
        assert ran.count("add") == 4 and ran.count("divide") == 1
        assert stack.state == CANCELLED

    def test_a_float16_mean_is_not_folded(self) -> None:
        """numpy's mean adds float16 values in float32: a float16 fold would differ."""
        xs = _members(4, np.float16)

        async def main() -> tuple[Any, list[str], Any]:
            return await _folded(ops.mean, xs, axis=0)

        value, ran, _ = dataflow.run(main)
        np.testing.assert_array_equal(value, np.mean(np.stack(xs), axis=0))
        assert "stack" in ran and "mean" in ran

    def test_the_graph_pass_folds_a_mean(self) -> None:
        xs = _members(4, np.float64)

        async def program(a: Any, b: Any, c: Any, d: Any) -> Any:
            return ops.mean(ops.stack([ops.exp(a), ops.exp(b), ops.exp(c), ops.exp(d)]), axis=0)

        graph = dataflow.graph.fold_stack_reductions(dataflow.trace(program, *xs))
        graph = dataflow.graph.eliminate_dead_code(graph)
        names = [n.op.name for n in graph.nodes]
        assert "stack" not in names and "mean" not in names
        assert names.count("add") == 3 and names.count("divide") == 1

        async def main() -> Any:
            return await graph(*xs)

        want = np.mean(np.stack([np.exp(x) for x in xs]), axis=0)
        np.testing.assert_array_equal(dataflow.run(main), want)

    def test_negative_axis_and_positional_arguments(self) -> None:
        xs = _members(3)

        async def main() -> Any:
            gate = threading.Event()
            pending = [gated(x, gate) for x in xs]
            out = ops.sum(ops.stack(pending, 1), -2)  # the new axis 1 of a 3-d stack
            gate.set()
            return await out

        np.testing.assert_array_equal(dataflow.run(main), np.sum(np.stack(xs, 1), -2))

    def test_a_stack_someone_holds_still_runs(self) -> None:
        xs = _members(3)

        async def main() -> tuple[Any, Any]:
            gate = threading.Event()
            stacked = ops.stack([gated(x, gate) for x in xs])
            total = ops.sum(stacked, axis=0)
            gate.set()
            return await total, await stacked

        total, stacked = dataflow.run(main)
        np.testing.assert_array_equal(stacked, np.stack(xs))
        np.testing.assert_array_equal(total, np.sum(np.stack(xs), axis=0))

    def test_a_stack_another_op_reads_still_runs(self) -> None:
        xs = _members(3)

        async def main() -> tuple[Any, Any]:
            gate = threading.Event()
            stacked = ops.stack([gated(x, gate) for x in xs])
            total = ops.sum(stacked, axis=0)
            doubled = ops.multiply(stacked, 2.0)
            del stacked
            gate.set()
            return await total, await doubled

        total, doubled = dataflow.run(main)
        np.testing.assert_array_equal(doubled, np.stack(xs) * np.float32(2.0))
        np.testing.assert_array_equal(total, np.sum(np.stack(xs), axis=0))

    @pytest.mark.parametrize(
        ("dtype", "kw"),
        [
            (np.float32, {"axis": 1}),  # not the new axis
            (np.float32, {"axis": 0, "keepdims": True}),
            (np.float32, {"axis": None}),
            (np.int64, {"axis": 0}),  # integers are not folded (nor in the graph pass)
        ],
    )
    def test_what_is_not_folded_runs_as_written(self, dtype: Any, kw: dict[str, Any]) -> None:
        xs = _members(3, dtype)

        async def main() -> tuple[Any, list[str], Any]:
            return await _folded(ops.sum, xs, **kw)

        value, ran, stack = dataflow.run(main)
        np.testing.assert_array_equal(value, np.sum(np.stack(xs), **kw))
        assert "stack" in ran and "sum" in ran
        assert stack.state == DONE

    def test_a_reduction_of_the_innermost_axis_is_not_folded(self) -> None:
        """numpy reduces the innermost axis pairwise: a stack of 0-d values (its one axis is
        the innermost) is summed as numpy sums it, bit for bit, in the graph pass too."""
        rng = np.random.default_rng(5)
        xs = [np.asarray(v) for v in (rng.standard_normal(16) * 1000).astype(np.float32)]

        async def main() -> tuple[Any, list[str], Any]:
            return await _folded(ops.sum, xs, axis=0)

        value, ran, _ = dataflow.run(main)
        assert "stack" in ran and "sum" in ran
        np.testing.assert_array_equal(value, np.sum(np.stack(xs), axis=0))

        x = np.stack(xs)

        async def program(x: Any) -> Any:
            return ops.sum(ops.stack([x[i] for i in range(16)], axis=-1), axis=-1)

        graph = dataflow.trace(program, x).optimize()
        assert any(n.op.name == "stack" for n in graph.nodes)
        np.testing.assert_array_equal(graph.run(x), np.sum(np.stack(xs, axis=-1), axis=-1))

    def test_mixed_dtypes_are_not_folded(self) -> None:
        """stack promotes float32 and float64 to float64 before the sum: a fold would add two
        float32 values in float32 first."""
        a, b, c = (
            rand((5, 7), np.float32, 1),
            rand((5, 7), np.float32, 2),
            rand((5, 7), np.float64, 3),
        )

        async def main() -> tuple[Any, list[str], Any]:
            gate = threading.Event()
            with dataflow.profile() as prof:
                out = ops.sum(ops.stack([gated(a, gate), gated(b, gate), c]), axis=0)
                gate.set()
                value = await out
            return value, [s.op for s in prof.trace().tasks], None

        value, ran, _ = dataflow.run(main)
        np.testing.assert_array_equal(value, np.sum(np.stack([a, b, c]), axis=0))
        assert "stack" in ran

    def test_the_graph_pass_leaves_mixed_dtypes_too(self) -> None:
        a, b = rand((5, 7), np.float32, 1), rand((5, 7), np.float64, 2)

        async def program(x: Any, y: Any) -> Any:
            return ops.sum(ops.stack([ops.exp(x), ops.exp(x), y]), axis=0)

        graph = dataflow.trace(program, a, b).optimize()
        assert "stack" in [n.op.name for n in graph.nodes]

        async def main() -> Any:
            return await graph(a, b)

        e = np.exp(a)
        np.testing.assert_array_equal(dataflow.run(main), np.sum(np.stack([e, e, b]), axis=0))

    def test_a_traced_program_records_what_it_called(self) -> None:
        """Tracing keeps stack and sum (the graph pass folds them when optimizing)."""
        xs = _members(3)

        async def program(a: Any, b: Any, c: Any) -> Any:
            return ops.sum(ops.stack([ops.exp(a), ops.exp(b), ops.exp(c)]), axis=0)

        graph = dataflow.trace(program, *xs)
        names = [n.op.name for n in graph.nodes]
        assert "stack" in names and "sum" in names

        async def main() -> Any:
            return await graph(*xs)

        want = np.sum(np.exp(np.stack(xs)), axis=0)
        np.testing.assert_allclose(dataflow.run(main), want, rtol=1e-6)
