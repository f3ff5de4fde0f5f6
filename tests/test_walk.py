"""The one walker over nested arguments, and the containers it walks on every path."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pytest

import dataflow
import ops
from dataflow._walk import is_container, leaves, replace
from tests._helpers import gated


class Pair(NamedTuple):
    a: Any
    b: Any


@dataclass
class Box:
    value: Any


def _pair_sum(p: Pair) -> Any:
    return np.asarray(p.a) + np.asarray(p.b)


pairsum = dataflow.op(
    "pairsum",
    meta=lambda p: ops.TensorSpec((4,), np.dtype(np.float64)),
    handle=ops.Tensor,
    inline=False,
)(_pair_sum)


class TestWalker:
    def test_containers(self) -> None:
        """list, tuple, NamedTuple and dict are walked; nothing else is."""
        walked: list[Any] = [[], (), Pair(1, 2), {}]
        assert all(is_container(c) for c in walked)

        class MyList(list[Any]):
            pass

        assert not any(is_container(c) for c in ({1}, MyList(), Box(1), "ab", np.ones(2)))

    def test_leaves_in_order(self) -> None:
        """Leaves come depth first, in order; a dict's values, not its keys."""
        value = [1, (2, Pair(3, {"k": 4, "j": [5]})), {6}]
        assert list(leaves(value)) == [1, 2, 3, 4, 5, {6}]

    def test_replace_rebuilds_each_kind(self) -> None:
        """replace keeps list, tuple, NamedTuple (its class) and dict (its keys, in order)."""
        value = [1, (2, Pair(3, {"k": 4, "j": 5}))]
        out = replace(value, lambda v: v * 10)
        assert out == [10, (20, Pair(30, {"k": 40, "j": 50}))]
        assert type(out[1][1]) is Pair and list(out[1][1].b) == ["k", "j"]

    def test_deep_nesting_has_no_recursion_limit(self) -> None:
        """10,000 levels deep: walked without RecursionError."""
        deep: Any = 1
        for _ in range(10_000):
            deep = [deep]
        assert list(leaves(deep)) == [1]
        out = replace(deep, lambda v: v + 1)
        for _ in range(10_000):
            out = out[0]
        assert out == 2


class TestNamedTupleInputs:
    def test_pending_value_in_a_namedtuple_is_an_input(self) -> None:
        """The kernel runs after the pending value inside a NamedTuple is ready (issue #17.1)."""

        async def main() -> Any:
            gate = threading.Event()
            slow = gated(np.full(4, 2.0), gate)
            out = pairsum(Pair(slow, np.ones(4)))
            gate.set()
            return await out

        np.testing.assert_array_equal(dataflow.run(main, interop_threads=2), np.full(4, 3.0))

    def test_failure_inside_a_namedtuple_propagates(self) -> None:
        """A failed input inside a NamedTuple fails the op with that input's error."""

        async def main() -> Any:
            bad = ops.reshape(ops.asarray(np.ones(4)), (4,))
            boom = dataflow.op(
                "boom4", meta=lambda x: ops.spec_of(x), handle=ops.Tensor, inline=False
            )(lambda x: (_ for _ in ()).throw(ValueError("boom")))
            out = pairsum(Pair(boom(bad), np.ones(4)))
            with pytest.raises(dataflow.TaskError, match="boom4"):
                await out
            return "ok"

        assert dataflow.run(main) == "ok"

    def test_plain_fork_receives_values_inside_a_namedtuple(self) -> None:
        """A forked plain function gets arrays, not handles, inside a NamedTuple argument."""

        async def main() -> Any:
            x = ops.tanh(np.zeros(3))
            return await dataflow.fork(lambda p: type(p.a).__name__, Pair(x, 1))

        assert dataflow.run(main) == "ndarray"

    def test_materialize_awaits_inside_namedtuples_and_dicts(self) -> None:
        """materialize walks NamedTuples and dicts, and keeps their types."""

        async def main() -> Any:
            x = ops.tanh(np.zeros(2))
            return await dataflow.materialize({"p": Pair(x, [x, 2])})

        out = dataflow.run(main)
        assert type(out["p"]) is Pair
        np.testing.assert_array_equal(out["p"].a, np.zeros(2))

    def test_materialize_of_a_deep_result(self) -> None:
        """A result nested 3,000 deep is materialized without RecursionError (issue #19.6)."""

        async def main() -> Any:
            deep: Any = ops.add(np.ones(1), 1.0)
            for _ in range(3000):
                deep = [deep]
            return await dataflow.materialize(deep)

        out = dataflow.run(main)
        for _ in range(3000):
            out = out[0]
        np.testing.assert_array_equal(out, [2.0])

    def test_graph_trace_records_a_namedtuple_argument(self) -> None:
        """The tracer sees the pending value inside a NamedTuple as the node's input."""

        async def f(x: Any) -> Any:
            return pairsum(Pair(ops.tanh(x), np.ones(4)))

        x = np.linspace(-1, 1, 4)
        graph = dataflow.trace(f, x, check=False)
        assert [n.op.name for n in graph.nodes] == ["tanh", "pairsum"]
        x2 = np.linspace(0, 2, 4)
        np.testing.assert_allclose(graph.run(x2), np.tanh(x2) + 1)

    def test_other_containers_are_not_inputs(self) -> None:
        """A pending value inside an object that is not walked reaches the kernel as a handle."""
        seen: list[str] = []

        def kernel(box: Box) -> Any:
            seen.append(type(box.value).__name__)
            return np.zeros(1)

        peek = dataflow.op(
            "peek", meta=lambda b: ops.TensorSpec((1,), np.dtype(np.float64)), handle=ops.Tensor
        )(kernel)

        async def main() -> Any:
            return await peek(Box(ops.tanh(np.zeros(1))))

        dataflow.run(main)
        assert seen == ["Tensor"]
