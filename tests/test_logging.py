"""Structured logging: task names bound in forked tasks, TaskLogger lines, the progress line."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog
from structlog.contextvars import get_contextvars, merge_contextvars
from structlog.testing import capture_logs

import dataflow
import ops
from dataflow._logging import TASK_KEY, Progress

log = structlog.get_logger("user")


def _sq(x: np.ndarray) -> np.ndarray:
    log.info("in plain")
    out: np.ndarray = x * x
    return out


async def _child(x: Any) -> Any:
    log.info("in child")
    return await dataflow.fork(_sq, x)


class TestTaskBinding:
    def test_forked_coroutine_lines_carry_its_name(self) -> None:
        """A line logged inside a forked async function has dataflow_task = its name."""
        names: list[str] = []

        async def main() -> Any:
            fut = dataflow.fork(_child, np.ones(2))
            names.append(fut.name)  # type: ignore[attr-defined]
            return await fut

        with capture_logs(processors=[merge_contextvars]) as logs:
            dataflow.run(main)
        (line,) = [e for e in logs if e["event"] == "in child"]
        assert line[TASK_KEY] == names[0] and names[0].startswith("_child#")

    def test_forked_function_lines_carry_its_name(self) -> None:
        """A line logged inside a forked plain function (on a worker) has its task's name."""
        names: list[str] = []

        async def main() -> Any:
            fut = dataflow.fork(_sq, np.ones(2))
            assert isinstance(fut, dataflow.Pending)
            names.append(fut.task.name)
            return await fut

        with capture_logs(processors=[merge_contextvars]) as logs:
            dataflow.run(main)
        (line,) = [e for e in logs if e["event"] == "in plain"]
        assert line[TASK_KEY] == names[0] and names[0].startswith("_sq#")

    def test_binding_does_not_leak_to_the_caller(self) -> None:
        """After forking (and awaiting) a task, the caller's context has no task name."""
        seen: list[dict[str, Any]] = []

        async def main() -> Any:
            out = await dataflow.fork(_child, np.ones(2))
            seen.append(get_contextvars())
            return out

        dataflow.run(main)
        assert TASK_KEY not in seen[0]

    def test_nested_forks_bind_the_innermost(self) -> None:
        """A task forked inside a task logs under its own name, not its parent's."""
        with capture_logs(processors=[merge_contextvars]) as logs:

            async def main() -> Any:
                return await dataflow.fork(_child, np.ones(2))

            dataflow.run(main)
        tasks = {e["event"]: e[TASK_KEY] for e in logs}
        assert tasks["in child"].startswith("_child#")
        assert tasks["in plain"].startswith("_sq#")

    def test_op_kernels_are_not_wrapped(self) -> None:
        """Op kernels run as they are: the binding is only for forked functions."""
        seen: list[dict[str, Any]] = []

        @dataflow.op(
            "peek", meta=lambda x: ops.TensorSpec(x.shape, x.dtype), handle=ops.Tensor, inline=False
        )
        def peek(x: np.ndarray) -> np.ndarray:
            seen.append(get_contextvars())
            return x

        async def main() -> Any:
            return await peek(np.ones(2))

        dataflow.run(main)
        assert seen == [{}]


class TestTaskLogger:
    def test_start_and_end_lines(self) -> None:
        """Each task logs a start and an end at debug level, with op, thread, shape, duration."""

        async def main() -> Any:
            a = np.ones((8, 4), dtype=np.float32)
            return await ops.tanh(ops.matmul(a, a.T))

        inst = dataflow.TaskLogger()
        dataflow.add_instrument(inst)
        try:
            with capture_logs() as logs:
                dataflow.run(main)
        finally:
            dataflow.remove_instrument(inst)
        assert [(e["event"], e["op"]) for e in logs] == [
            ("task started", "matmul"),
            ("task finished", "matmul"),
            ("task started", "tanh"),
            ("task finished", "tanh"),
        ]
        assert all(e["log_level"] == "debug" for e in logs)
        end = logs[1]
        assert re.fullmatch(r"matmul#\d+", end["task"])
        assert end["shape"] == [8, 8] and end["dtype"] == "float32"
        assert end["duration_ms"] >= 0 and isinstance(end["thread"], str)
        assert repr(inst) == "<TaskLogger running=0>"

    def test_failure_line(self) -> None:
        """A kernel that raises logs 'task failed' with the error; its dependent too."""

        @dataflow.op("bad", meta=lambda x: ops.TensorSpec(x.shape, x.dtype), handle=ops.Tensor)
        def bad(x: np.ndarray) -> np.ndarray:
            raise ValueError("nope")

        async def main() -> Any:
            return await ops.negative(bad(np.ones(2)))

        inst = dataflow.TaskLogger()
        dataflow.add_instrument(inst)
        try:
            with capture_logs() as logs, pytest.raises(dataflow.TaskError):
                dataflow.run(main)
        finally:
            dataflow.remove_instrument(inst)
        failed = [e for e in logs if e["event"] == "task failed"]
        assert [(e["op"], e["ran"]) for e in failed] == [("bad", True), ("negative", False)]
        assert "ValueError: nope" in failed[0]["error"]

    def test_uses_the_logger_given(self) -> None:
        """A TaskLogger can log through a logger of the application's choosing."""
        logger = structlog.get_logger("app").bind(component="model")
        inst = dataflow.TaskLogger(logger)

        async def main() -> Any:
            return await ops.negative(np.ones(2))

        dataflow.add_instrument(inst)
        try:
            with capture_logs() as logs:
                dataflow.run(main)
        finally:
            dataflow.remove_instrument(inst)
        assert {e["component"] for e in logs} == {"model"}


class TestTaskLoggerArguments:
    def test_a_standard_library_logger_is_refused_with_the_wrapper_to_use(self) -> None:
        """Its methods take no keyword fields: it would fail at the first task (and be
        switched off), so it is refused at once, naming structlog's wrapper."""
        import logging

        with pytest.raises(dataflow.DataflowTypeError, match=r"structlog.wrap_logger"):
            dataflow.TaskLogger(logging.getLogger("dataflow.test"))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class TestProgress:
    def test_counts_and_final_line(self) -> None:
        """The line ends with every created task done, and a newline."""
        term = _Terminal()
        inst = Progress(term, interval=0.0)

        async def main() -> Any:
            x: Any = np.ones(4)
            for _ in range(20):
                x = ops.negative(x)
            return await x

        dataflow.add_instrument(inst)
        try:
            dataflow.run(main)
        finally:
            dataflow.remove_instrument(inst)
        inst.close()
        text = term.getvalue()
        assert text.endswith("dataflow: 20/20 tasks done\n")
        assert text.count("\r") == 21
        assert repr(inst) == "<Progress done=20 created=20 failed=0>"

    def test_redraws_are_rate_limited(self) -> None:
        """Within one interval the line is drawn once, however many tasks finish."""
        term = _Terminal()
        inst = Progress(term, interval=3600.0)

        async def main() -> Any:
            total: Any = ops.sum(ops.stack([ops.negative(np.ones(2)) for _ in range(50)]))
            return await total

        dataflow.add_instrument(inst)
        try:
            dataflow.run(main)
        finally:
            dataflow.remove_instrument(inst)
        inst.close()
        assert term.getvalue().count("\r") == 2  # the first finish, and close()


def test_the_library_never_configures_structlog() -> None:
    """Only the CLI (the application) calls structlog.configure()."""
    pkg = Path(dataflow.__file__).parent
    offenders = [
        p.name
        for p in pkg.glob("*.py")
        if p.name != "_cli.py"
        and re.search(r"(?<!`)structlog\.configure\(", p.read_text(encoding="utf-8"))
    ]
    assert offenders == []


class TestTheLibrarysOwnLog:
    def test_unconfigured_it_writes_to_stderr_not_stdout(self, tmp_path: Path) -> None:
        """With structlog unconfigured (a plain script), dataflow's own error lines go to
        stderr: structlog's default printed them on stdout, into the program's output."""
        script = tmp_path / "s.py"
        script.write_text(
            "import asyncio\n"
            "import dataflow\n"
            "def bad():\n"
            "    raise ValueError('boom')\n"
            "async def main():\n"
            "    dataflow.fork(bad)\n"
            "    await asyncio.sleep(0.1)  # bad fails meanwhile, unobserved\n"
            "    raise KeyError('body')\n"
            "try:\n"
            "    dataflow.run(main)\n"
            "except KeyError:\n"
            "    print('the output')\n"
        )
        r = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout == "the output\n"
        assert "task failed and was never awaited" in r.stderr

    def test_configured_it_goes_where_the_application_said(self) -> None:
        """Once structlog is configured (here by capture_logs), the events go there."""
        from dataflow._log import logger

        with capture_logs() as logs:
            logger.error("an event", key=1)
        assert logs == [{"event": "an event", "key": 1, "log_level": "error"}]
