"""Bad input: each mistake raises the exact error type, naming the op (or API) and what to do.

Meta rules validate at the call site, so shape and dtype mistakes raise where the op is
called, before anything is queued; values that are merely unusual (NaN, inf, empty arrays)
flow through like numpy.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow import DataflowError, NoRuntimeError, NotReadyError, OpInputError, OpTypeError
from tests.stress._support import run_python

HUGE = 1 << 20  # (HUGE, 1) x (1, HUGE) float64 is 8 TiB


def _huge_view(n: int) -> np.ndarray:
    """A zero-copy view with a huge shape (it takes no memory itself)."""
    return np.broadcast_to(np.ones(1), (n,))


async def _coro() -> int:
    return 1


def _nap_kernel(x: Any) -> Any:
    time.sleep(0.2)
    return x


_nap = dataflow.op("nap", meta=ops.spec_of, handle=ops.Tensor, inline=False)(_nap_kernel)


def _ones(*shape: int) -> np.ndarray:
    return np.ones(shape)


# (id, call, exact error type, regex on the message: the op's name first, then what to do)
OP_CASES: list[tuple[str, Callable[[], Any], type[BaseException], str]] = [
    # -- wrong shapes
    (
        "add-broadcast",
        lambda: ops.add(_ones(3), _ones(4)),
        OpInputError,
        r"^add: shapes \(3,\) and \(4,\) cannot be broadcast together.*reshape",
    ),
    (
        "multiply-broadcast-3",
        lambda: ops.multiply(_ones(2, 3), ops.asarray(_ones(3, 2))),
        OpInputError,
        r"^multiply: shapes \(2, 3\) and \(3, 2\) cannot be broadcast.*reshape",
    ),
    (
        "matmul-not-aligned",
        lambda: ops.matmul(_ones(2, 3), _ones(4, 5)),
        OpInputError,
        r"^matmul: shapes \(2, 3\) and \(4, 5\) are not aligned: 3 != 4.*transpose",
    ),
    (
        "matmul-0d",
        lambda: ops.matmul(np.float64(2.0), _ones(2)),
        OpInputError,
        r"^matmul: .*0-d.*use ops\.multiply",
    ),
    (
        "concatenate-mismatch",
        lambda: ops.concatenate([_ones(2, 3), _ones(2, 4)]),
        OpInputError,
        r"^concatenate: .*must match.*\(shapes \(2, 3\) and \(2, 4\)\).*make",
    ),
    (
        "stack-mismatch",
        lambda: ops.stack([_ones(2, 3), _ones(3, 2)]),
        OpInputError,
        r"^stack: all arrays must have the same shape.*concatenate",
    ),
    (
        "reshape-size",
        lambda: ops.reshape(_ones(6), (4,)),
        OpInputError,
        r"^reshape: cannot reshape array of size 6 \(shape \(6,\)\) into shape \(4,\).*-1",
    ),
    (
        "sum-axis",
        lambda: ops.sum(_ones(3), axis=5),
        OpInputError,
        r"^sum: axis 5 is out of bounds for an array of dimension 1.*valid axes",
    ),
    (
        "getitem-index",
        lambda: ops.asarray(_ones(3))[5],
        dataflow.OpIndexError,  # (an OpInputError and, as numpy's, an IndexError)
        r"^getitem: index 5 is out of bounds for axis 0 with size 3.*valid indices",
    ),
    (
        "lstm-cell-weights",
        lambda: ops.lstm_cell(
            _ones(2, 3), _ones(2, 4), _ones(2, 4), _ones(16, 3), _ones(16, 5), _ones(16), _ones(16)
        ),
        OpInputError,
        r"^lstm_cell: w_hh must have shape \(4\*hidden_size, hidden_size\)",
    ),
    (
        "split-unequal",
        lambda: ops.split(_ones(5), 2),
        OpInputError,
        r"^split: ",
    ),
    # -- wrong dtypes
    (
        "object-array",
        lambda: ops.add(np.array([1, None], dtype=object), 1.0),
        OpTypeError,
        r"^add: argument 1 has dtype object .*expected a numeric dtype.*np\.asarray",
    ),
    (
        "unicode-array",
        lambda: ops.tanh(np.array(["a", "b"])),
        OpTypeError,
        r"^tanh: argument 1 has dtype <U1 \(unicode string\).*np\.asarray",
    ),
    (
        "bytes-array",
        lambda: ops.exp(np.array([b"a"])),
        OpTypeError,
        r"^exp: argument 1 has dtype \|S1 \(byte string\).*np\.asarray",
    ),
    (
        "datetime-array",
        lambda: ops.negative(np.array(["2026-11-21"], dtype="datetime64[D]")),
        OpTypeError,
        r"^negative: argument 1 has dtype datetime64\[D\] \(datetime\).*np\.asarray",
    ),
    (
        "structured-array",
        lambda: ops.sum(np.zeros(2, dtype=[("a", "f8")])),
        OpTypeError,
        r"^sum: argument 1 has dtype .*structured.*np\.asarray",
    ),
    (
        "int8-overflow",
        lambda: ops.add(np.ones(2, dtype=np.int8), 1000),
        dataflow.OpOverflowError,  # (an OpInputError and, as numpy's, an OverflowError)
        r"^add: Python integer 1000 \(argument 2\) is out of bounds for int8.*wider dtype",
    ),
    (
        "astype-to-str",
        lambda: ops.asarray(_ones(2), dtype=str),
        OpTypeError,
        r"^asarray: ",
    ),
    # -- non-array Python objects
    ("none", lambda: ops.tanh(None), OpTypeError, r"^tanh: argument 1 has type NoneType.*expected"),
    ("str", lambda: ops.tanh("abc"), OpTypeError, r"^tanh: argument 1 has type str.*expected"),
    ("dict", lambda: ops.add({}, 1), OpTypeError, r"^add: argument 1 has type dict.*expected"),
    ("set", lambda: ops.sum({1, 2}), OpTypeError, r"^sum: argument 1 has type set.*expected"),
    (
        "object",
        lambda: ops.multiply(2.0, object()),
        OpTypeError,
        r"^multiply: argument 2 has type object.*expected",
    ),
    (
        "function",
        lambda: ops.tanh(np.tanh),
        OpTypeError,
        r"^tanh: argument 1 has type ufunc.*expected",
    ),
    (
        "ragged-list",
        lambda: ops.tanh([[1, 2], [3]]),
        OpInputError,
        r"^tanh: argument 1 is a list that does not form an array.*equal length",
    ),
    (
        "list-of-pending",
        lambda: ops.add([_nap(_ones(2)), ops.asarray(_ones(2))], 1.0),
        OpTypeError,
        r"^add: argument 1 is a list holding pending Tensors.*ops\.stack",
    ),
    (
        "plain-fork-future",
        lambda: ops.tanh(dataflow.fork(np.ones, 3)),
        OpTypeError,
        r"^tanh: argument 1 is a dataflow future \(ones#\d+\), not a Tensor.*await it",
    ),
    # -- huge shapes, refused at dispatch with the size
    (
        "add-huge-broadcast",
        lambda: ops.add(_ones(HUGE, 1), _ones(1, HUGE)),
        OpInputError,
        r"^add: the output of shape \(1048576, 1048576\) and dtype float64 would take "
        r"8192\.0 GiB.*check the shapes",
    ),
    (
        "matmul-huge-outer",
        lambda: ops.matmul(_ones(HUGE, 1), _ones(1, HUGE)),
        OpInputError,
        r"^matmul: the output of shape \(1048576, 1048576\) .* 8192\.0 GiB",
    ),
    (
        "matmul-huge-batched",
        lambda: ops.matmul(np.broadcast_to(np.ones(1), (HUGE, HUGE, 1, 1)), _ones(1, 8)),
        OpInputError,
        r"^matmul: the output of shape \(1048576, 1048576, 1, 8\) .*GiB",
    ),
    (
        "concatenate-huge",
        lambda: ops.concatenate([_huge_view(1 << 40)] * 2),
        OpInputError,
        r"^concatenate: the output of shape \(2199023255552,\) .* 16384\.0 GiB",
    ),
    (
        "stack-huge",
        lambda: ops.stack([_huge_view(1 << 38)] * 64),
        OpInputError,
        r"^stack: the output of shape \(64, 274877906944\) .*GiB",
    ),
    (
        "max-empty",
        lambda: ops.max(_ones(0)),
        OpInputError,
        r"^max: cannot take the maximum over axis 0 of length 0.*no identity.*ops\.sum",
    ),
]


# Cases that need pending values, so a runtime (eagerly, every value is already computed).
_RUNTIME_ONLY = {"plain-fork-future", "list-of-pending"}


class TestOpInputs:
    @pytest.mark.parametrize(
        ("call", "etype", "pattern"),
        [pytest.param(c, e, p, id=i) for i, c, e, p in OP_CASES],
    )
    def test_refused_at_call_site(
        self, call: Callable[[], Any], etype: type[BaseException], pattern: str
    ) -> None:
        """The op refuses the input where it is called, inside a runtime, with advice."""

        async def main() -> str:
            with pytest.raises(etype, match=pattern) as info:
                call()
            assert type(info.value) is etype
            return "refused"

        assert dataflow.run(main) == "refused"

    @pytest.mark.parametrize(
        ("call", "etype", "pattern"),
        [pytest.param(c, e, p, id=i) for i, c, e, p in OP_CASES if i not in _RUNTIME_ONLY],
    )
    def test_refused_eagerly_too(
        self, call: Callable[[], Any], etype: type[BaseException], pattern: str
    ) -> None:
        """Outside a runtime (eager numpy mode) the same call raises the same error."""
        with pytest.raises(etype, match=pattern) as info:
            call()
        assert type(info.value) is etype


# -- unusual values flow through like numpy ----------------------------------------------------

_SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0])

# (id, ops call, numpy call)
VALUE_CASES: list[tuple[str, Callable[[Any], Any], Callable[[Any], Any]]] = [
    ("tanh-nan-inf", ops.tanh, np.tanh),
    ("exp-nan-inf", ops.exp, np.exp),
    ("log-nan-inf-zero", ops.log, np.log),
    ("sigmoid-nan-inf", ops.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    ("divide-by-zero", lambda x: ops.divide(x, 0.0), lambda x: np.divide(x, 0.0)),
    ("inf-minus-inf", lambda x: ops.subtract(x, x), lambda x: x - x),
    ("sum-nan", ops.sum, np.sum),
    ("max-nan", ops.max, np.max),
    ("maximum-nan", lambda x: ops.maximum(x, 0.0), lambda x: np.maximum(x, 0.0)),
    ("mean-nan", ops.mean, np.mean),
    ("matmul-nan", lambda x: ops.matmul(x, x), lambda x: x @ x),
    ("relu-nan", ops.relu, lambda x: np.maximum(x, 0)),
    ("equal-nan", lambda x: ops.equal(x, x), lambda x: x == x),
    ("zero-size-add", lambda x: ops.add(x[:0], 1.0), lambda x: x[:0] + 1.0),
    ("zero-size-2d-tanh", lambda x: ops.tanh(np.ones((0, 3))), lambda x: np.tanh(np.ones((0, 3)))),
    ("zero-size-sum", lambda x: ops.sum(x[:0]), lambda x: np.sum(x[:0])),
    ("zero-size-mean", lambda x: ops.mean(x[:0]), lambda x: np.full((), np.nan)),
    (
        "zero-size-matmul",
        lambda x: ops.matmul(np.ones((2, 0)), np.ones((0, 3))),
        lambda x: np.ones((2, 0)) @ np.ones((0, 3)),
    ),
    (
        "zero-size-concatenate",
        lambda x: ops.concatenate([x[:0], x]),
        lambda x: np.concatenate([x[:0], x]),
    ),
    ("zero-size-reshape", lambda x: ops.reshape(x[:0], (0, 5)), lambda x: x[:0].reshape(0, 5)),
]


class TestValues:
    @pytest.mark.parametrize("threshold", [20e-6, 0.0], ids=["inline", "pool"])
    @pytest.mark.parametrize(
        ("call", "expected"), [pytest.param(c, e, id=i) for i, c, e in VALUE_CASES]
    )
    def test_like_numpy(
        self, call: Callable[[Any], Any], expected: Callable[[Any], Any], threshold: float
    ) -> None:
        """NaN, inf and zero-size arrays give numpy's values (and no warning-as-error)."""

        async def main() -> Any:
            return await call(ops.asarray(_SPECIAL))

        old = dataflow.get_inline_threshold()
        dataflow.set_inline_threshold(threshold)
        try:
            got = dataflow.run(main, interop_threads=2)
        finally:
            dataflow.set_inline_threshold(old)
        with np.errstate(all="ignore"):
            want = expected(_SPECIAL.copy())
        assert np.shape(got) == np.shape(want)
        np.testing.assert_array_equal(got, want)


# -- the API: fork, wait, run, threads and loops --------------------------------------------

API_CASES: list[tuple[str, Callable[[], Any], type[BaseException], str]] = [
    (
        "fork-int",
        lambda: dataflow.fork(42),  # type: ignore[call-overload]
        TypeError,
        r"^fork\(\) needs a callable .*got int: 42.*fork\(fn, \*args\)",
    ),
    (
        "fork-none",
        lambda: dataflow.fork(None),  # type: ignore[call-overload]
        TypeError,
        r"^fork\(\) needs a callable .*NoneType.*fork\(fn, \*args\)",
    ),
    (
        "fork-str",
        lambda: dataflow.fork("model"),  # type: ignore[call-overload]
        TypeError,
        r"^fork\(\) needs a callable .*str: 'model'",
    ),
    (
        "fork-coroutine",
        lambda: dataflow.fork(_coro()),  # type: ignore[call-overload]
        TypeError,
        r"^fork\(\) got a coroutine object \(_coro\(\.\.\.\)\).*you want fork\(_coro, x\)",
    ),
    (
        "fork-asyncio-future",
        lambda: dataflow.fork(asyncio.get_running_loop().create_future()),  # type: ignore[call-overload]
        TypeError,
        r"^fork\(\) got an awaitable \(Future\), not a function: await it",
    ),
    (
        "fork-dataflow-future",
        lambda: dataflow.fork(ops.add(_ones(2), 1.0)),  # type: ignore[call-overload]
        TypeError,
        r"^fork\(\) got an awaitable \(Tensor\), not a function: await it",
    ),
    (
        "run-inside-loop",
        lambda: dataflow.run(_coro),
        DataflowError,
        r"^dataflow\.run\(\) cannot be called from a running event loop.*dataflow\.Runtime",
    ),
    (
        "runtime-bad-threads",
        lambda: dataflow.Runtime(interop_threads=-1),
        ValueError,
        r"^interop_threads must be a positive int, got -1",
    ),
    (
        "runtime-bad-max-pending",
        lambda: dataflow.Runtime(max_pending=0),
        ValueError,
        r"^max_pending must be a positive int or None, got 0",
    ),
    (
        "inline-threshold-nan",
        lambda: dataflow.set_inline_threshold(float("nan")),
        ValueError,
        r"^set_inline_threshold\(seconds\): must be >= 0",
    ),
    (
        "bool-of-pending",
        lambda: bool(ops.add(ops.asarray(_ones(2)), 1.0) > 0),
        TypeError,
        r"the truth value of .* is not known yet: `await` it first",
    ),
]


WAIT_CASES: list[tuple[str, Callable[[], Any], str]] = [
    ("wait-int", lambda: 42, r"^wait\(\) needs a dataflow Future .*got int: 42.*fork\(\) or an op"),
    (
        "wait-array",
        lambda: np.ones(2),
        r"^wait\(\) needs a dataflow Future .*got ndarray.*fork\(\) or an op",
    ),
    (
        "wait-asyncio-future",
        lambda: asyncio.get_running_loop().create_future(),
        r"got Future.*asyncio future or task: await it directly",
    ),
    (
        "wait-coroutine",
        _coro,
        r"^wait\(\) got a coroutine object \(_coro\(\.\.\.\)\).*await _coro\(\.\.\.\) directly"
        r".*wait\(fork\(_coro, \.\.\.\)\)",
    ),
    (
        "wait-list",
        lambda: [dataflow.fork(np.ones, 2)],
        r"^wait\(\) takes one future, got a list.*one at a time",
    ),
]


class TestApiMisuse:
    @pytest.mark.parametrize(
        ("call", "etype", "pattern"),
        [pytest.param(c, e, p, id=i) for i, c, e, p in API_CASES],
    )
    def test_api_misuse(
        self, call: Callable[[], Any], etype: type[BaseException], pattern: str
    ) -> None:
        """Misusing fork/run/Runtime raises the builtin a user catches, with the fix."""

        async def main() -> str:
            with pytest.raises(etype, match=pattern) as info:
                call()
            assert isinstance(info.value, etype)
            await asyncio.sleep(0)
            return "refused"

        assert dataflow.run(main) == "refused"

    @pytest.mark.parametrize(
        ("make", "pattern"), [pytest.param(m, p, id=i) for i, m, p in WAIT_CASES]
    )
    def test_wait_on_foreign_objects(self, make: Callable[[], Any], pattern: str) -> None:
        """wait() on anything but a dataflow future raises TypeError saying what to pass."""

        async def main() -> str:
            with pytest.raises(TypeError, match=pattern) as info:
                await dataflow.wait(make())
            assert isinstance(info.value, TypeError)
            assert isinstance(info.value, dataflow.DataflowError)
            return "refused"

        assert dataflow.run(main) == "refused"

    def test_fork_from_thread_without_runtime(self) -> None:
        """fork() from a thread with no loop and no runtime says how to start one."""
        errors: list[BaseException] = []

        def thread() -> None:
            try:
                dataflow.fork(np.ones, 2)
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=thread)
        t.start()
        t.join()
        assert len(errors) == 1 and type(errors[0]) is NoRuntimeError
        assert "dataflow.run(main)" in str(errors[0]) and "dataflow.Runtime()" in str(errors[0])

    def test_async_fork_from_foreign_thread(self) -> None:
        """A thread that inherited a runtime's context cannot fork an async function."""

        async def main() -> BaseException | None:
            ctx = contextvars.copy_context()
            out: list[BaseException] = []

            def thread() -> None:
                try:
                    dataflow.fork(_coro)
                except BaseException as exc:
                    out.append(exc)

            t = threading.Thread(target=lambda: ctx.run(thread))
            t.start()
            t.join()
            return out[0] if out else None

        err = dataflow.run(main)
        assert type(err) is DataflowError
        assert "only be forked from a coroutine on the runtime's event loop" in str(err)
        assert "fork a plain function there instead" in str(err)

    def test_pending_result_from_thread(self) -> None:
        """A thread without a loop reading a pending value gets NotReadyError, not a hang."""
        gate = threading.Event()

        def slow(x: Any) -> Any:
            gate.wait(10)
            return x

        op = dataflow.op("slow", meta=ops.spec_of, handle=ops.Tensor, inline=False)(slow)

        async def main() -> str:
            y = op(_ones(2))
            out: list[BaseException] = []
            t = threading.Thread(target=lambda: _capture(out, y.result))
            t.start()
            t.join()
            gate.set()
            await y
            assert len(out) == 1 and type(out[0]) is NotReadyError
            assert "`await` it" in str(out[0])
            return "ok"

        assert dataflow.run(main) == "ok"

    def test_await_tensor_of_another_loop(self) -> None:
        """Two threads, each with its own loop and runtime: awaiting the other's Tensor fails."""
        handoff: queue.Queue[Any] = queue.Queue()
        release = threading.Event()
        errors: list[BaseException] = []

        async def owner() -> None:
            gate = threading.Event()
            op = dataflow.op("held", meta=ops.spec_of, handle=ops.Tensor, inline=False)(
                lambda x: (gate.wait(10), x)[1]
            )
            handoff.put(op(_ones(2)))
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 10)
            gate.set()

        async def thief() -> None:
            stolen = handoff.get(timeout=10)
            try:
                await stolen
            except BaseException as exc:
                errors.append(exc)
            finally:
                release.set()

        a = threading.Thread(target=dataflow.run, args=(owner,), kwargs={"interop_threads": 2})
        b = threading.Thread(target=dataflow.run, args=(thief,), kwargs={"interop_threads": 2})
        a.start()
        b.start()
        a.join(20)
        b.join(20)
        assert not a.is_alive() and not b.is_alive()
        assert len(errors) == 1 and type(errors[0]) is DataflowError
        assert "belongs to a runtime on another event loop; await it there" in str(errors[0])

    def test_run_inside_a_kernel(self) -> None:
        """dataflow.run() inside a pool kernel is refused (it would wait on its own pool)."""

        async def inner() -> Any:
            return await ops.matmul(ops.asarray(_ones(8, 8)), _ones(8, 8))

        def kernel() -> Any:
            return dataflow.run(inner, interop_threads=1)

        async def main() -> BaseException | None:
            try:
                await dataflow.fork(kernel)
            except dataflow.TaskError as exc:
                return exc.__cause__
            return None

        err = dataflow.run(main, interop_threads=1)
        assert type(err) is DataflowError
        assert "on an inter-op pool thread" in str(err) and "fork" in str(err)

    def test_run_sync_function(self) -> None:
        """dataflow.run(f) with a plain (non-async) function says to make it async."""

        def main() -> int:
            return 1

        with pytest.raises(TypeError, match=r"main returned int, not a coroutine.*async def"):
            dataflow.run(main)  # type: ignore[arg-type, call-arg]

    def test_run_non_callable(self) -> None:
        """dataflow.run(42) names what it got and shows the call to make."""
        with pytest.raises(TypeError, match=r"needs an async function, got int.*run\(main"):
            dataflow.run(42)  # type: ignore[call-overload]


def _capture(out: list[BaseException], fn: Callable[[], Any]) -> None:
    try:
        fn()
    except BaseException as exc:
        out.append(exc)


# -- the CLI: bad script paths -----------------------------------------------------------------


class TestCliScripts:
    def test_missing_script(self, tmp_path: Path) -> None:
        """A script path that does not exist: exit 2 and one line that says what to check."""
        missing = tmp_path / "nope.py"
        proc = run_python(["-m", "dataflow", "run", str(missing)])
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith("dataflow run: error: no such script: ")
        assert "nope.py" in lines[0] and "-m MODULE" in lines[0]

    def test_directory_as_script(self, tmp_path: Path) -> None:
        """A directory with no __main__.py given as the script: exit 2 and one line saying so."""
        proc = run_python(["-m", "dataflow", "run", str(tmp_path)])
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert "is a folder with no __main__.py" in lines[0]

    def test_script_does_not_parse(self, tmp_path: Path) -> None:
        """A syntax error: exit 1; file, line, source and caret as python shows them."""
        bad = tmp_path / "bad.py"
        bad.write_text("import dataflow\n\ndef f(:\n    pass\n")
        proc = run_python(["-m", "dataflow", "run", str(bad)])
        assert proc.returncode == 1
        lines = proc.stderr.rstrip("\n").splitlines()
        assert lines[:3] == [f'  File "{bad}", line 3', "    def f(:", "          ^"]
        assert len(lines) == 4 and lines[3].startswith("SyntaxError: ")

    def test_missing_module(self) -> None:
        """-m with a module that does not exist: exit 2 and one line."""
        proc = run_python(["-m", "dataflow", "run", "-m", "no_such_module_xyz"])
        assert proc.returncode == 2
        assert proc.stderr.strip() == "dataflow run: error: no module named 'no_such_module_xyz'"

    def test_script_raising(self, tmp_path: Path) -> None:
        """A script that raises: exit 1 with the script's traceback (and not the CLI's frames)."""
        bad = tmp_path / "raises.py"
        bad.write_text("raise KeyError('weights')\n")
        proc = run_python(["-m", "dataflow", "run", str(bad)])
        assert proc.returncode == 1
        assert "KeyError: 'weights'" in proc.stderr
        assert "_cli.py" not in proc.stderr and sys.executable not in proc.stderr
