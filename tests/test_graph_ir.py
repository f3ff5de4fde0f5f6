"""The graph IR: the printed form, the generated code, and what a Graph accepts."""

from __future__ import annotations

import inspect
import os
import re
import types
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow.graph import Graph, GraphInput, InputRef, Node, NodeRef, ValueType, fuse_elementwise

Array = np.ndarray[Any, Any]
HERE = os.path.relpath(__file__)

# One node line: %<n> : <type or (types)> = <op>(<args>)  # <file>:<line>
LINE = re.compile(r"^  %\d+ : (\(.+\)|\w+\[[\d, ]*\]) = [\w.]+(\[.*\])?\(.*\)(  # \S+:\d+)?$")


def _rand(*shape: int, seed: int = 0) -> Array:
    out: Array = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return out


def _line() -> int:
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


class TestPrintedIR:
    def test_exact_text_of_a_small_program(self) -> None:
        """Header with inputs, one line per node with type, op, args and file:line, return."""

        async def f(x: Any, w: Any) -> Any:
            y = ops.matmul(x, w)
            line = _line()
            return ops.tanh(ops.add(y, 1.0)), line

        graph = dataflow.trace(f, _rand(2, 3), _rand(3, 4))
        line = graph.outputs[1]
        assert str(graph) == "\n".join(
            [
                "graph(%x : float32[2, 3], %w : float32[3, 4]):",
                f"  %0 : float32[2, 4] = ops.matmul(%x, %w)  # {HERE}:{line - 1}",
                f"  %1 : float32[2, 4] = ops.add(%0, 1.0)  # {HERE}:{line + 1}",
                f"  %2 : float32[2, 4] = ops.tanh(%1)  # {HERE}:{line + 1}",
                f"  return (%2, {line})",
            ]
        )

    def test_parameters_constants_and_keywords(self) -> None:
        """Parameters and constants are declared by name; keywords print as name=value."""

        class Head(ops.nn.Module):
            def __init__(self) -> None:
                self.fc = ops.nn.Linear(3, 2, seed=0)
                self.c = _rand(2, seed=3)  # a public array attribute: a parameter too

            async def forward(self, x: Any) -> Any:
                return ops.flip(ops.add(await self.fc(x), _rand(2, seed=4)), axis=0)

        text = str(dataflow.trace(Head(), _rand(4, 3)))
        assert "  %fc.weight : float32[2, 3] = parameter" in text
        assert "  %fc.bias : float32[2] = parameter" in text
        assert "  %c0 : float32[2] = constant" in text
        assert "= ops.linear(%x, %fc.weight, %fc.bias)" in text
        assert "= ops.flip(%1, axis=0)" in text

    def test_multi_output_nodes(self) -> None:
        """A node with several outputs shows a tuple type; its outputs are %n[k]."""

        async def f(x: Any) -> Any:
            a, b = ops.split(x, 2)
            return ops.add(a, b)

        lines = str(dataflow.trace(f, _rand(4))).splitlines()
        assert lines[1].startswith("  %0 : (float32[2], float32[2]) = ops.split(%x, 2)")
        assert lines[2].startswith("  %1 : float32[2] = ops.add(%0[0], %0[1])")

    def test_every_line_matches_the_format(self) -> None:
        """Each node line of the ensemble's IR has the documented shape."""
        from examples.lstm_ensemble import Ensemble

        graph = dataflow.trace(Ensemble(1, 4, seed=0), _rand(3, 2, 4))
        node_lines = [ln for ln in str(graph).splitlines() if re.match(r"^  %\d", ln)]
        assert len(node_lines) == len(graph.nodes)
        for ln in node_lines:
            assert LINE.match(ln), ln

    def test_literals_print_as_python(self) -> None:
        """Slices, tuples, dtypes and Ellipsis print as Python expressions."""

        async def f(x: Any) -> Any:
            return ops.astype(ops.getitem(x, (slice(1, None), Ellipsis)), np.float64)

        text = str(dataflow.trace(f, _rand(3, 4)))
        assert "ops.getitem(%x, (slice(1, None, None), ...))" in text
        assert "ops.astype(%0, np.float64)" in text

    def test_fused_node_shows_its_expression(self) -> None:
        """A fused node prints the nested calls it replaced, with its arguments in place."""
        w = _rand(3, seed=1)

        async def f(x: Any) -> Any:
            return ops.tanh(ops.add(ops.multiply(x, w), 1.0))

        fused = fuse_elementwise(dataflow.trace(f, _rand(3)))
        line = str(fused).splitlines()[2]
        assert line.startswith(
            "  %0 : float32[3] = fused[ops.tanh(ops.add(ops.multiply(%x, %c0), 1.0))]"
        )

    def test_value_type_text(self) -> None:
        """ValueType prints as dtype[shape]."""
        assert str(ValueType((50, 4096), np.dtype(np.float32))) == "float32[50, 4096]"
        assert str(ValueType((), np.dtype(np.int64))) == "int64[]"

    def test_repr_and_op_counts(self) -> None:
        """repr names the graph and its sizes; op_counts counts nodes per op."""

        async def model(x: Any) -> Any:
            return ops.tanh(ops.tanh(x))

        graph = dataflow.trace(model, _rand(2))
        assert repr(graph) == "<Graph model inputs=1 nodes=2 constants=0 parameters=0>"
        assert graph.op_counts() == {"ops.tanh": 2}


class TestCode:
    def test_code_is_runnable_python(self) -> None:
        """graph.code defines an async forward that computes what the graph does."""
        fc = ops.nn.Linear(3, 2, seed=0)

        async def f(x: Any) -> Any:
            a, b = ops.split(ops.tanh(await fc(x)), 2, axis=1)
            return ops.multiply(a, b)

        x = _rand(4, 3)
        graph = dataflow.trace(f, x)
        code = graph.code
        assert code.startswith("async def f(self, x):\n")
        assert "    _2_0, _2_1 = ops.split(_1, 2, axis=1)\n" in code
        namespace: dict[str, Any] = {"ops": ops, "np": np}
        exec(compile(code, "<graph code>", "exec"), namespace)
        holder = types.SimpleNamespace(**graph.constants)  # c0, c1: fc's arrays

        async def main() -> Any:
            return await namespace["f"](holder, x)

        np.testing.assert_allclose(dataflow.run(main), graph.run(x), rtol=1e-6)

    def test_parameter_paths(self) -> None:
        """Dotted parameter names become attribute and index paths on self."""
        from examples.lstm_ensemble import Ensemble

        code = dataflow.trace(Ensemble(1, 4, seed=0), _rand(3, 2, 4)).code
        assert "self.models[0].cell_f.weight_ih_l0" in code
        compile(code, "<graph code>", "exec")

    def test_fused_code_is_nested_calls(self) -> None:
        """A fused node's code is the nested op calls."""

        async def f(x: Any) -> Any:
            return ops.exp(ops.negative(x))

        code = fuse_elementwise(dataflow.trace(f, _rand(3))).code
        assert "    _0 = ops.exp(ops.negative(x))" in code


class TestGraphChecks:
    def test_forward_reference_is_refused(self) -> None:
        """A node may only read earlier nodes."""
        t = ValueType((2,), np.dtype(np.float32))
        node = Node(ops.tanh, (NodeRef(1),), {}, None, (t,))
        with pytest.raises(ValueError, match="node %0 refers to %1"):
            Graph([GraphInput("x", t)], [node, node], {}, NodeRef(1))

    def test_missing_input_or_constant_is_refused(self) -> None:
        """References to inputs and constants that do not exist are refused."""
        t = ValueType((2,), np.dtype(np.float32))
        node = Node(ops.tanh, (InputRef(3),), {}, None, (t,))
        with pytest.raises(ValueError, match="%input3"):
            Graph([GraphInput("x", t)], [node], {}, NodeRef(0))

    def test_output_index_must_match_the_node(self) -> None:
        """%0[1] of a single-output node does not exist."""
        t = ValueType((2,), np.dtype(np.float32))
        node = Node(ops.tanh, (InputRef(0),), {}, None, (t,))
        with pytest.raises(ValueError, match="the outputs"):
            Graph([GraphInput("x", t)], [node], {}, NodeRef(0, 1))

    def test_constants_are_read_only_mapping(self) -> None:
        """A graph's constants mapping cannot be changed."""
        graph = dataflow.trace(ops.tanh, _rand(2))
        with pytest.raises(TypeError):
            graph.constants["x"] = _rand(2)  # type: ignore[index]
