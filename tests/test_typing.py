"""What a user's type checker sees (checked by the project's mypy run over tests/).

``assert_type`` is a no-op at run time; mypy fails the build if a type drifts.
"""

from __future__ import annotations

from typing import Any, assert_type

import numpy as np

import dataflow
import ops

Array = np.ndarray[Any, Any]


class TestOpTypes:
    def test_ops_return_tensors(self) -> None:
        """ops.matmul, ops.add, ... are Tensor to mypy; awaiting one gives an ndarray."""

        async def main(a: Array, b: Array) -> Array:
            y = ops.matmul(a, b)
            assert_type(y, ops.Tensor)
            assert_type(ops.add(y, 1.0), ops.Tensor)
            assert_type(ops.tanh(y), ops.Tensor)
            assert_type(ops.sum(y, axis=0), ops.Tensor)
            assert_type(y @ b.T, ops.Tensor)
            value = await y
            assert_type(value, np.ndarray)
            return value

        out = dataflow.run(main, np.ones((2, 3)), np.ones((3, 4)))
        assert out.shape == (2, 4)

    def test_declared_op_is_typed_by_its_meta_rule_and_handle(self) -> None:
        """dataflow.op(...) gives an Op whose call returns the handle type."""

        def meta(x: ops.Tensor | Array, k: float) -> ops.TensorSpec:
            return ops.spec_of(x)

        scale = dataflow.op("scale", meta=meta, handle=ops.Tensor)(lambda x, k: x * k)
        assert_type(scale(np.ones(2), 2.0), ops.Tensor)

        def wrong() -> None:  # never called: mypy checks it
            # The meta rule's parameters are the op's: a wrong call is a type error.
            scale(np.ones(2), "two")  # type: ignore[arg-type]

        assert callable(wrong)

    def test_fork_and_wait(self) -> None:
        """fork gives a Future of the function's result; wait gives the result."""

        async def f(x: int) -> int:
            return x + 1

        async def main() -> int:
            fut = dataflow.fork(f, 1)
            assert_type(fut, dataflow.Future[int])
            return await dataflow.wait(fut)

        assert dataflow.run(main) == 2


class TestRunAndCompileTypes:
    def test_run_gives_a_pending_results_value_type(self) -> None:
        """run(main) is main's type, and a pending value main returns is its array."""

        async def tensor(x: Array) -> ops.Tensor:
            return ops.tanh(x)

        async def number() -> int:
            return 2

        out = dataflow.run(tensor, np.ones(2))
        assert_type(out, np.ndarray)
        assert isinstance(out, np.ndarray)
        assert_type(dataflow.run(number), int)

        def wrong() -> None:  # never called: mypy checks it
            # main's arguments are checked against its parameters, as anyio.run does.
            dataflow.run(tensor)  # type: ignore[arg-type, call-arg]
            dataflow.run(number, 1)  # type: ignore[arg-type]
            dataflow.run(tensor, "x")  # type: ignore[arg-type]

        assert callable(wrong)

    def test_materialize_a_future(self) -> None:
        """await materialize(t) is the array of a Tensor; other values stay Any."""

        async def tensor(x: Array) -> ops.Tensor:
            return ops.tanh(x)

        async def main(x: Array) -> Array:
            value = await dataflow.materialize(ops.tanh(x))
            assert_type(value, np.ndarray)
            forked = await dataflow.materialize(dataflow.fork(tensor, x))
            assert_type(forked, np.ndarray)
            assert isinstance(forked, np.ndarray)
            return value

        assert isinstance(dataflow.run(main, np.ones(2)), np.ndarray)

    def test_compile_gives_a_typed_forward(self) -> None:
        """compile(f) is a Compiled of what await forward(x) gives (arrays for a Tensor)."""

        async def f(x: Array) -> ops.Tensor:
            return ops.relu(x)

        forward = dataflow.compile(f)
        assert_type(forward, dataflow.Compiled[np.ndarray])
        assert_type(dataflow.compile(ops.nn.Linear(2, 3)), dataflow.Compiled[Any])

        async def main(x: Array) -> Array:
            y = await forward(x)
            assert_type(y, np.ndarray)
            assert_type(await forward.warm_up(x), int)
            return y

        assert isinstance(dataflow.run(main, np.ones(2)), np.ndarray)

    def test_compile_as_a_decorator(self) -> None:
        """@dataflow.compile and @dataflow.compile(batch_axis=0) keep the function typed (a
        decorator factory typed Any is an error under mypy --strict)."""

        @dataflow.compile
        async def plain(x: Array) -> ops.Tensor:
            return ops.relu(x)

        @dataflow.compile(batch_axis=0, max_batch=4)
        async def batched(x: Array) -> ops.Tensor:
            return ops.relu(x)

        assert_type(plain, dataflow.Compiled[np.ndarray])
        assert_type(batched, dataflow.Compiled[np.ndarray])
        assert batched.max_batch == 4


class TestTensorTypes:
    def test_operators_and_attributes(self) -> None:
        """Tensor operators build Tensors; shape, dtype and ndim are known now."""

        async def main(x: Array) -> Array:
            t = ops.asarray(x)
            for y in (t + 1, 1 + t, t - t, 2 - t, t * 2.0, t / 2, 1 / t, t**2, 2**t, -t, abs(t)):
                assert_type(y, ops.Tensor)
            for y in (t @ t.T, t < 1, t <= 1, t > 1, t >= 1, t == 1, t != 1, t[0], t[:, None]):
                assert_type(y, ops.Tensor)
            assert_type(t.shape, tuple[int, ...])
            assert_type(t.dtype, np.dtype[Any])
            assert_type(t.ndim, int)
            assert_type(t.spec, ops.TensorSpec)
            assert_type(ops.split(t, 2), tuple[ops.Tensor, ...])
            assert_type(await dataflow.wait(t), np.ndarray)
            value = await t
            assert_type(np.asarray(t), np.ndarray[tuple[Any, ...], np.dtype[Any]])
            return value

        assert dataflow.run(main, np.ones((2, 2))).shape == (2, 2)

    def test_fork_of_a_plain_function_returning_a_tensor(self) -> None:
        """A forked plain function's future is of what it returns (a Tensor stays pending)."""

        def plain(x: Array) -> ops.Tensor:
            return ops.tanh(x)

        async def main(x: Array) -> Array:
            fut = dataflow.fork(plain, x)
            assert_type(fut, dataflow.Future[ops.Tensor])
            t = await fut
            assert_type(t, ops.Tensor)
            return await t

        assert dataflow.run(main, np.ones(2)).shape == (2,)


class TestModuleAndObserverTypes:
    def test_module_state(self) -> None:
        """nn modules: parameters are arrays, state dicts map names to arrays, a forward's
        outputs are Tensors."""
        lstm = ops.nn.LSTM(3, 4)
        assert_type(lstm.state_dict(), dict[str, Array])
        assert_type(lstm.load_state_dict(lstm.state_dict()), ops.nn.IncompatibleKeys)
        assert_type(list(lstm.parameters()), list[Array])
        assert_type(ops.nn.Linear(3, 4).weight, Array)

        async def main(x: Array) -> Array:
            out, (_, c) = await lstm.forward(x)
            assert_type(out, ops.Tensor)
            assert_type(c, ops.Tensor)
            return await out

        assert dataflow.run(main, np.ones((2, 1, 3), np.float32)).shape == (2, 1, 4)

    def test_profile_and_instrument_hooks(self) -> None:
        """profile takes a Runtime (or None); an instrument's hooks are given Tasks."""

        class Names(dataflow.Instrument):
            def __init__(self) -> None:
                self.names: list[str] = []

            def task_finished(self, ts: int, task: dataflow.Task) -> None:
                self.names.append(task.name)

        def wrong() -> None:  # never called: mypy checks it
            dataflow.profile("all")  # type: ignore[arg-type]
            dataflow.Instrument().task_started(0, "matmul#1")  # type: ignore[arg-type]
            task = dataflow.Task.done(dataflow.Signature("op"), None, None)
            assert task.nmae  # type: ignore[attr-defined]  # (a typo: a Task has its fields only)

        names = Names()

        async def main(x: Array) -> Array:
            rt = dataflow.current_runtime()
            assert rt is not None
            rt.add_instrument(names)
            with dataflow.profile(rt) as prof:
                value = await ops.tanh(x)
            assert_type(prof, dataflow.Profiler)
            trace = prof.trace()
            assert_type(trace, dataflow.Trace)
            assert_type(trace.tasks, list[dataflow.TaskSpan])
            assert_type(trace.spans, list[dataflow.Span])
            assert [s.op for s in trace.tasks] == ["tanh"]
            return value

        dataflow.run(main, np.ones(2), interop_threads=1)
        assert callable(wrong)
        assert names.names and names.names[0].startswith("tanh")
