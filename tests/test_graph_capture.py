"""Graph capture: what dataflow.trace records, and when it warns."""

from __future__ import annotations

import inspect
import os
import warnings
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow.graph import ConstRef, InputRef, NodeRef, TracerWarning, trace_async

Array = np.ndarray[Any, Any]

CALLS: list[int] = []


def _counting_kernel(x: Array) -> Array:
    CALLS.append(1)
    out: Array = np.negative(x)
    return out


def _same_spec(x: Any) -> ops.TensorSpec:
    return ops.spec_of(x)


def _small_cost(x: Any) -> dataflow.Cost:
    return dataflow.Cost(1.0, 8.0)


counting_negative = ops.define("counting_negative", _counting_kernel, _same_spec, _small_cost)


def _failing_kernel(x: Array) -> Array:
    raise ValueError("boom while forcing")


failing = ops.define("failing", _failing_kernel, _same_spec, _small_cost)


def _rand(*shape: int, seed: int = 0) -> Array:
    out: Array = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return out


def _names(graph: dataflow.Graph) -> list[str]:
    return [node.op.name for node in graph.nodes]


class TestTrace:
    def test_async_function_records_its_ops(self) -> None:
        """Each op call of an async function becomes a node, in issue order."""

        async def f(x: Any, w: Any) -> Any:
            return ops.tanh(ops.matmul(x, w)) + 1.0

        graph = dataflow.trace(f, _rand(2, 3), _rand(3, 4))
        assert _names(graph) == ["matmul", "tanh", "add"]
        assert [i.name for i in graph.inputs] == ["x", "w"]
        assert graph.nodes[0].args == (InputRef(0), InputRef(1))
        assert graph.nodes[2].args == (NodeRef(1), 1.0)
        assert graph.outputs == NodeRef(2)
        assert str(graph.nodes[2].types[0]) == "float32[2, 4]"

    def test_plain_function_is_traced(self) -> None:
        """A plain function that calls ops traces like an async one."""

        def f(x: Any) -> Any:
            return ops.negative(x)

        graph = dataflow.trace(f, _rand(3))
        assert _names(graph) == ["negative"]

    def test_nothing_runs_while_tracing(self) -> None:
        """Tracing records ops without running their kernels."""
        CALLS.clear()

        async def f(x: Any) -> Any:
            return counting_negative(counting_negative(x))

        graph = dataflow.trace(f, _rand(3))
        assert len(graph.nodes) == 2
        assert CALLS == []

    def test_module_parameters_keep_their_names(self) -> None:
        """A module's parameters become constants named as in its state dict."""
        fc = ops.nn.Linear(3, 2, seed=0)
        graph = dataflow.trace(fc, _rand(4, 3))
        assert graph.parameters == {"weight", "bias"}
        assert graph.nodes[0].args[1:] == (ConstRef("weight"), ConstRef("bias"))
        assert graph.constants["weight"] is fc.weight

    def test_other_arrays_become_numbered_constants(self) -> None:
        """An array that is neither input nor parameter is a constant c0, recorded once."""
        b = _rand(3, seed=5)

        async def f(x: Any) -> Any:
            return ops.multiply(ops.add(x, b), b)

        graph = dataflow.trace(f, _rand(3))
        assert graph.nodes[0].args == (InputRef(0), ConstRef("c0"))
        assert graph.nodes[1].args == (NodeRef(0), ConstRef("c0"))
        assert graph.constants["c0"] is b
        assert not graph.parameters

    def test_pending_example_input_traces_tensor_operators(self) -> None:
        """With an ops.asarray input, Tensor operators on the input itself are recorded."""

        async def f(x: Any) -> Any:
            return x[0] * 2.0

        x = _rand(3, 4)
        graph = dataflow.trace(f, ops.asarray(x))
        assert _names(graph) == ["getitem", "multiply"]
        assert graph.nodes[0].args[0] == InputRef(0)
        np.testing.assert_array_equal(graph.run(x), x[0] * 2.0)

    def test_output_structure_is_kept(self) -> None:
        """Tuples, lists, dicts, inputs, constants and literals in the result survive."""
        k = np.arange(3.0)

        async def f(x: Any) -> Any:
            return ops.negative(x), [x, {"k": k}], 7

        x = np.ones(3)
        graph = dataflow.trace(f, x)
        assert graph.outputs == (NodeRef(0), [InputRef(0), {"k": ConstRef("c0")}], 7)
        neg, (same, d), seven = graph.run(x)
        np.testing.assert_array_equal(neg, -x)
        np.testing.assert_array_equal(same, x)
        np.testing.assert_array_equal(d["k"], k)
        assert seven == 7

    def test_forked_async_function_is_traced(self) -> None:
        """Ops issued inside a forked async function are recorded."""

        async def branch(x: Any) -> Any:
            return ops.exp(x)

        async def f(x: Any) -> Any:
            fut = dataflow.fork(branch, x)
            y = ops.tanh(x)
            return y + await dataflow.wait(fut)

        x = _rand(4)
        graph = dataflow.trace(f, x)
        assert sorted(_names(graph)) == ["add", "exp", "tanh"]
        np.testing.assert_allclose(graph.run(x), np.tanh(x) + np.exp(x), rtol=1e-6)

    def test_tutorial_fork_of_plain_function_is_traced_through(self) -> None:
        """The tutorial's first example: fork(foo, x) records foo's negation, no warning."""

        def foo(x: Any) -> Any:
            return ops.negative(x)

        async def example(x: Any) -> Any:
            future = dataflow.fork(foo, x)
            x_normal = foo(x)
            x_parallel = await dataflow.wait(future)
            return x_normal, x_parallel

        graph = dataflow.trace(example, np.ones(1))
        assert _names(graph) == ["negative", "negative"]
        a, b = graph.run(np.ones(1))
        np.testing.assert_array_equal(a, [-1.0])
        np.testing.assert_array_equal(b, [-1.0])
        # Both values are returned: CSE keeps two arrays, as the program made two.
        assert _names(graph.optimize()) == ["negative", "negative"]

    def test_location_is_the_calling_line(self) -> None:
        """Each node records file:line of the user code that called the op."""

        async def f(x: Any) -> Any:
            line = inspect.currentframe().f_lineno  # type: ignore[union-attr]
            return ops.negative(x), line

        graph = dataflow.trace(f, np.ones(2))
        line = graph.outputs[1]
        assert graph.nodes[0].location == f"{os.path.relpath(__file__)}:{line + 1}"

    def test_location_skips_library_frames(self) -> None:
        """Ops issued inside ops.nn point at the line that called the module."""
        lstm = ops.nn.LSTM(3, 4, seed=0)

        async def f(x: Any) -> Any:
            out, _ = await lstm(x)
            return out

        graph = dataflow.trace(f, _rand(2, 1, 3))
        files = {node.location.rpartition(":")[0] for node in graph.nodes if node.location}
        assert files == {os.path.relpath(__file__)}

    def test_location_of_an_op_declared_beside_the_model(self) -> None:
        """An op declared in the caller's own package points at the calling line, not at the
        event loop that drives the traced coroutine."""

        async def f(x: Any) -> Any:
            line = inspect.currentframe().f_lineno  # type: ignore[union-attr]
            return counting_negative(x), line

        graph = dataflow.trace(f, np.ones(2))
        assert graph.nodes[0].location == f"{os.path.relpath(__file__)}:{graph.outputs[1] + 1}"

    @pytest.mark.asyncio
    async def test_location_beside_the_model_on_every_loop(self) -> None:
        """The same on each event loop (uvloop's frames differ from asyncio's)."""

        async def f(x: Any) -> Any:
            line = inspect.currentframe().f_lineno  # type: ignore[union-attr]
            return counting_negative(x), line

        graph = await trace_async(f, np.ones(2))
        assert graph.nodes[0].location == f"{os.path.relpath(__file__)}:{graph.outputs[1] + 1}"

    def test_location_of_a_module_traced_directly(self) -> None:
        """A module traced as the program points at its forward, never at the event loop."""
        lstm = ops.nn.LSTM(3, 4, seed=0)
        graph = dataflow.trace(lstm, _rand(2, 1, 3))
        files = {node.location.rpartition(":")[0] for node in graph.nodes if node.location}
        assert files and {os.path.basename(f) for f in files} == {"_rnn.py"}

    def test_non_array_example_input_is_refused(self) -> None:
        """Example inputs must be arrays; the message says how to bake other values in."""

        async def f(x: Any, n: int) -> Any:
            return x

        with pytest.raises(TypeError, match=r"functools\.partial"):
            dataflow.trace(f, np.ones(2), 3)

    def test_coroutine_object_is_refused(self) -> None:
        """trace(f(x)) instead of trace(f, x) is a TypeError that says so."""

        async def f(x: Any) -> Any:
            return x

        with pytest.raises(TypeError, match="not a coroutine object"):
            dataflow.trace(f(np.ones(1)), np.ones(1))  # type: ignore[arg-type]

    def test_trace_refuses_a_running_loop(self) -> None:
        """trace() inside a running loop points at trace_async."""

        async def f(x: Any) -> Any:
            return ops.negative(x)

        async def main() -> None:
            with pytest.raises(dataflow.DataflowError, match="trace_async"):
                dataflow.trace(f, np.ones(1))

        dataflow.run(main)

    @pytest.mark.asyncio
    async def test_trace_async_inside_a_loop(self) -> None:
        """trace_async traces from a coroutine and leaves no runtime behind."""

        async def f(x: Any) -> Any:
            return ops.negative(x)

        graph = await trace_async(f, np.ones(2))
        assert _names(graph) == ["negative"]
        assert dataflow.current_runtime() is None

    def test_traced_graph_calls_are_inlined(self) -> None:
        """Tracing a program that awaits a graph records the graph's nodes."""

        async def inner(x: Any) -> Any:
            return ops.tanh(x)

        x = _rand(3)
        sub = dataflow.trace(inner, x)

        async def outer(x: Any) -> Any:
            y = await sub(x)
            return ops.negative(y)

        graph = dataflow.trace(outer, x)
        assert _names(graph) == ["tanh", "negative"]
        np.testing.assert_allclose(graph.run(x), -np.tanh(x))


class TestTracerWarning:
    def test_is_a_user_warning(self) -> None:
        """TracerWarning is a UserWarning, exported at the top level."""
        assert issubclass(dataflow.TracerWarning, UserWarning)

    def test_awaiting_a_value_warns_at_the_await(self) -> None:
        """Awaiting a value computes it and warns, naming the user's line."""

        async def f(x: Any) -> Any:
            v = await ops.tanh(x)
            if float(v.sum()) > 0:  # control flow on a value: the graph takes one branch
                return ops.negative(x)
            return x

        x = np.abs(_rand(3)) + 1
        with pytest.warns(TracerWarning, match="awaited the value of %0") as record:
            graph = dataflow.trace(f, x)
        assert record[0].filename == __file__
        assert _names(graph) == ["tanh", "negative"]

    def test_kernel_runs_only_for_awaited_values(self) -> None:
        """A forced value runs its kernel (and its inputs'), once."""
        CALLS.clear()

        async def f(x: Any) -> Any:
            y = counting_negative(counting_negative(x))
            await y
            await y
            return y

        with pytest.warns(TracerWarning):
            dataflow.trace(f, np.ones(2), check=False)
        assert CALLS == [1, 1]

    def test_awaited_array_used_in_an_op_stays_a_reference(self) -> None:
        """An array that came out of an await is recorded as its node, not a constant."""

        async def f(x: Any) -> Any:
            v = await ops.tanh(x)
            return ops.negative(v)

        with pytest.warns(TracerWarning):
            graph = dataflow.trace(f, _rand(3))
        assert graph.nodes[1].args == (NodeRef(0),)
        assert not graph.constants
        x2 = _rand(3, seed=9)
        np.testing.assert_allclose(graph.run(x2), -np.tanh(x2))

    def test_numpy_code_on_an_input_is_recorded(self) -> None:
        """x @ w and np.tanh on ndarray inputs: the program gets pending Tensors, so the numpy
        code dispatches to ops and is recorded, not baked in as a constant (#14.5)."""

        async def f(x: Any, w: Any) -> Any:
            return np.tanh(x @ w)

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            graph = dataflow.trace(f, _rand(2, 3), _rand(3, 4))
        assert not graph.constants
        assert graph.op_counts() == {"ops.matmul": 1, "ops.tanh": 1}
        x2, w2 = _rand(2, 3, seed=5), _rand(3, 4, seed=6)
        np.testing.assert_allclose(graph.run(x2, w2), np.tanh(x2 @ w2), rtol=1e-6)

    def test_numpy_code_on_a_read_value_is_caught_by_the_check(self) -> None:
        """numpy code on an awaited input runs at trace time: the second trace sees the
        constant change, and the warning points at the program's line."""

        async def f(x: Any, w: Any) -> Any:
            return ops.tanh(np.exp(await x) @ w)

        with pytest.warns(TracerWarning) as record:
            dataflow.trace(f, _rand(2, 3), _rand(3, 4))
        changed = [w for w in record if "constant %c0, read by node %0" in str(w.message)]
        assert changed and changed[0].filename == os.path.relpath(__file__)

    def test_value_dependent_branch_is_caught_by_the_check(self) -> None:
        """A branch on an awaited value takes another path for other inputs: warned."""

        async def f(x: Any) -> Any:
            if (await x)[0] == 1.0:
                return ops.negative(x)
            return ops.exp(x)

        with pytest.warns(TracerWarning) as record:
            dataflow.trace(f, ops.asarray(np.ones(3)))
        assert any("other ops for other input values" in str(w.message) for w in record)

    @pytest.mark.parametrize("dtype", [np.float64, np.int32, np.bool_])
    def test_a_0d_input_traces_without_warnings(self, dtype: Any) -> None:
        """A 0-d input is perturbed into a 0-d array, not a numpy scalar, for the check: the
        second trace took the scalar for a literal argument and warned on every 0-d input."""

        async def f(x: Any) -> Any:
            return ops.add(x, 1)

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            graph = dataflow.trace(f, np.asarray(1, dtype))
        assert graph.nodes[0].args == (InputRef(0), 1)

    def test_check_can_be_skipped(self) -> None:
        """check=False traces once: the input-dependent constant goes unnoticed."""

        async def f(x: Any, w: Any) -> Any:
            return ops.tanh(np.exp(await x) @ w)

        with pytest.warns(TracerWarning, match="awaited an input"):
            graph = dataflow.trace(f, _rand(2, 3), _rand(3, 4), check=False)
        assert list(graph.constants) == ["c0"]

    def test_indexing_an_input_is_recorded(self) -> None:
        """x[0] on an input is a getitem node, not a slice baked in."""

        async def f(x: Any) -> Any:
            return np.tanh(x[0])

        graph = dataflow.trace(f, _rand(2, 3), check=False)
        assert graph.op_counts() == {"ops.getitem": 1, "ops.tanh": 1}
        x2 = _rand(2, 3, seed=4)
        np.testing.assert_allclose(graph.run(x2), np.tanh(x2[0]), rtol=1e-6)

    def test_ensemble_traces_without_warnings(self) -> None:
        """A program that only dispatches ops traces silently."""
        from examples.lstm_ensemble import Ensemble

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            graph = dataflow.trace(Ensemble(2, 4, seed=0), _rand(3, 2, 4))
        # Tiny members: one op per LSTM direction (granularity "auto" picks "sequence").
        assert graph.op_counts()["ops.lstm_sequence"] == 2 * 2

    def test_failing_kernel_while_forcing_raises_task_error(self) -> None:
        """A kernel that fails when a value is forced raises TaskError at the await."""

        async def f(x: Any) -> Any:
            return await failing(x)

        with pytest.warns(TracerWarning), pytest.raises(dataflow.TaskError, match="boom"):
            dataflow.trace(f, np.ones(2))


class TestArrayHandle:
    def test_declared_by_ops(self) -> None:
        """ops declares ops.Tensor (and its spec rule) as the placeholder of array inputs."""
        from dataflow._registry import array_handle

        declared = array_handle()
        assert declared is not None and declared[0] is ops.Tensor

    def test_bad_declaration_is_refused(self) -> None:
        """set_array_handle needs two callables, and says which call was wrong."""
        with pytest.raises(dataflow.DataflowTypeError, match="set_array_handle"):
            dataflow.set_array_handle(5, ops.spec_of)  # type: ignore[arg-type]


class TestRecurrentParameters:
    """A traced or compiled LSTM reads every parameter by name, its two biases included (the
    module passes them to the ops as they are, and the kernels add them), so a parameter
    written in place takes effect in the graph as in eager runs."""

    @pytest.mark.parametrize("granularity", ["sequence", "step"])
    def test_the_lstms_biases_are_parameters(self, granularity: str) -> None:
        lstm = ops.nn.LSTM(5, 7, num_layers=2, granularity=granularity, seed=0)
        graph = dataflow.trace(lstm, _rand(4, 2, 5))
        params = set(graph.parameters)
        for layer in (0, 1):
            assert {f"bias_ih_l{layer}", f"bias_hh_l{layer}"} <= params
        assert not [n for n in graph.constants if n not in params]  # no bias sum frozen in

    @pytest.mark.parametrize("module", ["LSTM", "GRU"])
    @pytest.mark.parametrize("granularity", ["sequence", "step"])
    def test_a_bias_written_in_place_reaches_a_compiled_model(
        self, module: str, granularity: str
    ) -> None:
        rnn = getattr(ops.nn, module)(5, 7, num_layers=2, granularity=granularity, seed=0)
        x = _rand(4, 2, 5)
        compiled = dataflow.compile(rnn)

        async def both() -> tuple[Array, Array]:
            got = await dataflow.materialize((await compiled(x))[0])
            want = await dataflow.materialize((await rnn(x))[0])
            return got, want

        dataflow.run(both)
        for name in ("bias_ih_l0", "bias_hh_l1", "weight_hh_l1"):
            getattr(rnn, name)[...] += np.float32(0.5)
            got, want = dataflow.run(both)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
