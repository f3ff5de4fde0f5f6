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
