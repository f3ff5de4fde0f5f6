"""Errors users catch: a kernel's exception keeps its type across `await` (issue #14.2)."""

from __future__ import annotations

import pickle
import traceback
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow import TaskError
from dataflow._errors import task_error_type


def _bad_kernel(x: Any, kind: str) -> Any:
    if kind == "value":
        raise ValueError("bad value in kernel")
    if kind == "key":
        raise KeyError("missing")
    if kind == "linalg":
        return np.linalg.inv(np.zeros((2, 2)))
    return x


bad = dataflow.op(
    "bad", meta=lambda x, kind: ops.spec_of(x), handle=ops.Tensor, inline=False
)(_bad_kernel)


class TestOriginalType:
    def test_except_valueerror_around_await(self) -> None:
        """A kernel's ValueError is caught by `except ValueError` where it is awaited."""

        async def main() -> str:
            try:
                await bad(np.ones(2), "value")
            except ValueError as exc:
                assert isinstance(exc, TaskError)
                assert exc.op == "bad" and exc.task.startswith("bad#")
                assert isinstance(exc.__cause__, ValueError)
                return str(exc)
            return "not raised"

        assert "bad value in kernel" in dataflow.run(main)

    @pytest.mark.parametrize(
        ("kind", "expected"), [("key", KeyError), ("linalg", np.linalg.LinAlgError)]
    )
    def test_other_types(self, kind: str, expected: type[BaseException]) -> None:
        """KeyError, numpy's LinAlgError and friends keep their type too."""

        async def main() -> None:
            with pytest.raises(expected):
                await bad(np.ones(2), kind)

        dataflow.run(main)

    def test_dependents_raise_the_same_error(self) -> None:
        """Every value downstream of the failed kernel raises that same error object."""

        async def main() -> None:
            first = bad(np.ones(2), "value")
            later = ops.add(ops.tanh(first), 1.0)
            with pytest.raises(ValueError) as a:
                await later
            with pytest.raises(ValueError) as b:
                await first
            assert a.value is b.value

        dataflow.run(main)

    def test_forked_functions_keep_the_type(self) -> None:
        """An async or plain forked function's exception keeps its type at wait()."""

        async def failing() -> None:
            raise LookupError("async fork")

        def plain() -> None:
            raise ZeroDivisionError("plain fork")

        async def main() -> None:
            with pytest.raises(LookupError, match="async fork"):
                await dataflow.wait(dataflow.fork(failing))
            with pytest.raises(ZeroDivisionError, match="plain fork"):
                await dataflow.wait(dataflow.fork(plain))

        dataflow.run(main)

    def test_a_fork_that_lets_an_op_error_through_keeps_it(self) -> None:
        """A forked coroutine that awaited a failed op: its future raises a ValueError too."""

        async def child() -> Any:
            return await bad(np.ones(2), "value")

        async def main() -> None:
            with pytest.raises(ValueError, match="bad value in kernel"):
                await dataflow.fork(child)

        dataflow.run(main)

    def test_traceback_reaches_the_kernel(self) -> None:
        """The printed traceback goes down to the kernel's own frame."""

        async def main() -> str:
            try:
                await bad(np.ones(2), "value")
            except ValueError as exc:
                return "".join(traceback.format_exception(exc))
            return ""

        text = dataflow.run(main)
        assert "_bad_kernel" in text and 'raise ValueError("bad value in kernel")' in text
        assert "dataflow.TaskError[ValueError]: bad#" in text

    def test_eager_mode_too(self) -> None:
        """Outside a runtime the op raises at the call, with the same double type."""
        with pytest.raises(ValueError, match="bad value"):
            bad(np.ones(2), "value")

    def test_errors_pickle(self) -> None:
        """A TaskError[ValueError] survives pickling (e.g. sent to another process)."""
        err = task_error_type(ValueError)("t#1 failed: ValueError: x", task="t#1", op="t")
        back = pickle.loads(pickle.dumps(err))
        assert isinstance(back, ValueError) and isinstance(back, TaskError)
        assert (back.task, back.op, str(back)) == ("t#1", "t", str(err))

    def test_types_that_cannot_combine_fall_back(self) -> None:
        """BaseExceptions, StopIteration and layout conflicts give plain TaskError."""
        assert task_error_type(KeyboardInterrupt) is TaskError
        assert task_error_type(StopIteration) is TaskError
        assert task_error_type(UnicodeDecodeError) is TaskError
        assert task_error_type(ValueError) is task_error_type(ValueError)
        assert task_error_type(task_error_type(ValueError)) is task_error_type(ValueError)
