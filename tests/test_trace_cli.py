"""`dataflow run --trace/--log-tasks/--progress`, `dataflow trace summary|render`, the SVG."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import dataflow
import ops
from dataflow._cli import cli
from dataflow._render import MAX_ARROWS, MAX_LABEL, render_html, render_svg
from dataflow._trace import TaskSpan, Trace, lanes
from dataflow._traceread import load
from dataflow._tracewrite import to_chrome

SVG = "{http://www.w3.org/2000/svg}"
ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m dataflow ARGS`` in a fresh process (the run command configures logging)."""
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run(
        [sys.executable, "-m", "dataflow", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )


SCRIPT = """
import sys
import numpy as np
import dataflow
import ops

async def main():
    a = np.ones((64, 64), dtype=np.float32)
    x = ops.tanh(ops.matmul(a, a))
    await x
    if len(sys.argv) > 1:
        raise {exc}("the script failed on purpose")
    return x

dataflow.run(main)
"""


def write_script(tmp_path: Path, exc: str = "RuntimeError") -> Path:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(SCRIPT.format(exc=exc)))
    return path


def x_events(path: Path) -> list[dict[str, Any]]:
    return [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]


@pytest.fixture(scope="module")
def saved_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace of two chains joined at the end, saved to a file."""

    async def chain(x: Any, n: int) -> Any:
        for _ in range(n):
            x = ops.tanh(ops.matmul(x, x))
        return x

    async def main() -> Any:
        a = np.eye(256, dtype=np.float32)  # big enough for the pool: two lanes, arrows
        f1, f2 = dataflow.fork(chain, a, 3), dataflow.fork(chain, a * 0.5, 3)
        with dataflow.model_code():  # the forks' pending outputs, so `add` depends on both
            x1, x2 = await f1, await f2
        return await ops.add(x1, x2)

    with dataflow.profile() as prof:
        dataflow.run(main, interop_threads=2)
    path = tmp_path_factory.mktemp("saved") / "run.json"
    prof.export_chrome_trace(path)
    return path


class TestRunTrace:
    def test_written_when_the_script_raises(self, tmp_path: Path) -> None:
        """--trace writes the timeline even when the script fails; the exit code is 1."""
        script = write_script(tmp_path)
        out = tmp_path / "out.json"
        proc = run_cli("run", "--trace", str(out), str(script), "fail", cwd=tmp_path)
        assert proc.returncode == 1, proc.stderr
        assert "RuntimeError: the script failed on purpose" in proc.stderr
        assert "trace of 2 tasks written to" in proc.stderr
        assert [e["name"] for e in x_events(out)] == ["matmul", "tanh"]

    def test_written_when_interrupted(self, tmp_path: Path) -> None:
        """An interrupted run (Ctrl-C) still writes its trace, and exits 130."""
        script = write_script(tmp_path, exc="KeyboardInterrupt")
        out = tmp_path / "out.json"
        proc = run_cli("run", "--trace", str(out), str(script), "stop", cwd=tmp_path)
        assert proc.returncode == 130, proc.stderr
        assert len(x_events(out)) == 2

    def test_a_trace_path_in_a_missing_folder_is_a_usage_error_before_the_run(
        self, tmp_path: Path
    ) -> None:
        """The script does not run (its output would be lost after it): exit 2 at once."""
        script = write_script(tmp_path)
        out = tmp_path / "missing" / "t.json"
        proc = run_cli("run", "--trace", str(out), str(script), cwd=tmp_path)
        assert proc.returncode == 2
        assert (
            "Invalid value for --trace: the folder" in proc.stderr
            and "does not exist" in proc.stderr
        )
        assert "trace of" not in proc.stderr and not out.exists()

    def test_an_empty_trace_path_is_a_usage_error(self, tmp_path: Path) -> None:
        """`--trace "$UNSET"`: exit 2 before the run; the script ran and no trace was written,
        with exit 0 and not a word."""
        script = write_script(tmp_path)
        proc = run_cli("run", "--trace", "", str(script), cwd=tmp_path)
        assert proc.returncode == 2
        assert "Invalid value for --trace: the path is empty" in proc.stderr

    @pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full")
    def test_a_trace_that_cannot_be_written_exits_1(self, tmp_path: Path) -> None:
        """The script succeeded but the trace asked for is lost: an error line and exit 1 (it
        was exit 0 after the error line)."""
        script = write_script(tmp_path)
        proc = run_cli("run", "--trace", "/dev/full", str(script), cwd=tmp_path)
        assert proc.returncode == 1
        assert "dataflow run: error: cannot write the trace: OSError" in proc.stderr

    def test_written_where_given_when_the_script_changes_folder(self, tmp_path: Path) -> None:
        """A relative --trace path is the folder's the command ran in; it was written into
        the folder the script moved to (os.chdir), where nobody looked for it."""
        (tmp_path / "elsewhere").mkdir()
        script = tmp_path / "s.py"
        script.write_text("import os\nos.chdir('elsewhere')\n")
        proc = run_cli("run", "--trace", "t.json", str(script), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "t.json").exists()
        assert not (tmp_path / "elsewhere" / "t.json").exists()

    def test_the_program_s_own_file_is_refused(self, tmp_path: Path) -> None:
        """`--trace script.py script.py` (by any name: a link, a folder's __main__.py, a -m
        module's file) is refused before the run: the trace overwrote the script."""
        script = write_script(tmp_path)
        (tmp_path / "link.py").symlink_to(script)
        (tmp_path / "app").mkdir()
        (tmp_path / "app" / "__main__.py").write_text(script.read_text())
        (tmp_path / "pkg").mkdir()
        (tmp_path / "pkg" / "__init__.py").write_text("")
        (tmp_path / "pkg" / "__main__.py").write_text(script.read_text())
        for trace, target in (
            ("script.py", ["script.py"]),
            ("link.py", ["script.py"]),
            ("script.py", ["link.py"]),
            ("app/__main__.py", ["app"]),
            ("pkg/__main__.py", ["-m", "pkg"]),
            ("pkg/__init__.py", ["-m", "pkg"]),
        ):
            before = {p: p.read_bytes() for p in tmp_path.rglob("*.py")}
            proc = run_cli("run", "--trace", trace, *target, cwd=tmp_path)
            assert proc.returncode == 2, (trace, target, proc.stderr)
            assert f"--trace {trace} is the program's own file" in proc.stderr
            assert {p: p.read_bytes() for p in tmp_path.rglob("*.py")} == before

    def test_log_tasks_and_progress(self, tmp_path: Path) -> None:
        """--log-tasks logs each task's start and end; --progress stays off without a TTY."""
        script = write_script(tmp_path)
        proc = run_cli(
            "run", "--log-tasks", "--log-format", "json", "--progress", str(script), cwd=tmp_path
        )
        assert proc.returncode == 0, proc.stderr
        lines = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
        assert [(e["event"], e["op"]) for e in lines] == [
            ("task started", "matmul"),
            ("task finished", "matmul"),
            ("task started", "tanh"),
            ("task finished", "tanh"),
        ]
        assert lines[1]["shape"] == [64, 64] and lines[1]["level"] == "debug"
        assert "tasks done" not in proc.stderr


PRINTING = """
import time
import numpy as np
import dataflow, ops

async def main():
    x = np.ones((32, 32), dtype=np.float32)
    for k in range(30):
        await ops.tanh(ops.matmul(x, x))
        print(f"line {k}")
        time.sleep(0.03)  # the status line is redrawn every 0.1 s: between these prints

dataflow.run(main)
"""


def _screen(output: str) -> list[str]:
    """What a terminal shows for ``output`` (carriage returns, newlines, ESC [K only)."""
    lines, col = [""], 0
    i = 0
    while i < len(output):
        if output.startswith("\x1b[K", i):
            lines[-1] = lines[-1][:col]
            i += 3
            continue
        ch = output[i]
        if ch == "\r":
            col = 0
        elif ch == "\n":
            lines.append("")
            col = 0
        else:
            line = lines[-1]
            lines[-1] = line[:col] + ch + line[col + 1 :]
            col += 1
        i += 1
    return lines


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX terminal")
class TestProgressOnATerminal:
    def test_status_line_and_script_output_do_not_collide(self, tmp_path: Path) -> None:
        """With --progress on a terminal, every line the script prints stands on its own."""
        import pty

        script = tmp_path / "printing.py"
        script.write_text(PRINTING)
        master, slave = pty.openpty()
        paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        proc = subprocess.Popen(
            [sys.executable, "-m", "dataflow", "run", "--progress", str(script)],
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        )
        os.close(slave)
        chunks = []
        try:
            while True:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            assert proc.wait(timeout=60) == 0
        finally:
            proc.kill()
            os.close(master)
        output = b"".join(chunks).decode()
        assert "tasks done" in output  # the status line was drawn
        screen = [line for line in _screen(output) if line]
        assert [line for line in screen if line.startswith("line")] == [
            f"line {k}" for k in range(30)
        ]
        assert screen[-1] == "dataflow: 60/60 tasks done"


class TestTraceSummary:
    def test_prints_summary_and_table(self, saved_trace: Path) -> None:
        """`dataflow trace summary` recomputes the figures from the file."""
        result = CliRunner().invoke(cli, ["trace", "summary", str(saved_trace)])
        assert result.exit_code == 0, result.output
        expected = str(dataflow._summary.summarize(load(saved_trace)))
        assert result.stdout.startswith(expected)
        assert "matmul" in result.stdout and "share" in result.stdout

    def test_bad_file(self, tmp_path: Path) -> None:
        """A file that is not a trace: one line naming the problem, exit code 1."""
        bad = tmp_path / "bad.json"
        bad.write_text('{"not": "a trace"}')
        result = CliRunner().invoke(cli, ["trace", "summary", str(bad)])
        assert result.exit_code == 1
        assert "dataflow trace summary: error: TraceFormatError:" in result.stderr


class TestFilesThatAreNotTraces:
    """What `summary` and `render` read is bounded: a device or a pipe with no end, or a file
    too big, is one error line, not a read until memory runs out."""

    @pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="/dev/zero")
    def test_dev_zero(self, tmp_path: Path) -> None:
        """/dev/zero is refused at its first bytes (it was read without end)."""
        # The old reader ran until memory ran out: bounded here, not by the machine's.
        limited = (
            "import resource, runpy, sys; "
            "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
            "sys.argv[0] = 'dataflow'; runpy.run_module('dataflow', run_name='__main__')"
        )
        paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "OPENBLAS_NUM_THREADS": "1"}
        for command in ("summary", "render"):
            proc = subprocess.run(
                [sys.executable, "-c", limited, "trace", command, "/dev/zero"],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert proc.returncode == 1, proc.stderr
            (line,) = proc.stderr.strip().splitlines()
            assert line.startswith(f"dataflow trace {command}: error: TraceFormatError: ")
            assert "/dev/zero is not JSON: a trace starts with { or [" in line

    def test_binary_and_text_that_is_not_json(self, tmp_path: Path) -> None:
        for name, data in (("b.json", b"\x89PNG\r\n\x1a\n"), ("s.py", b"import os\n")):
            (tmp_path / name).write_bytes(data)
            result = CliRunner().invoke(cli, ["trace", "summary", str(tmp_path / name)])
            assert result.exit_code == 1
            assert "is not JSON: a trace starts with { or [" in result.stderr

    def test_too_big(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Over MAX_TRACE_BYTES: refused, a regular file by its size, a stream once read."""
        from dataflow import _traceread

        monkeypatch.setattr(_traceread, "MAX_TRACE_BYTES", 1000, raising=False)
        monkeypatch.setattr(_traceread, "_CHUNK", 100, raising=False)
        path = tmp_path / "big.json"
        path.write_text('{"traceEvents": []' + " " * 2000 + "}")
        with pytest.raises(_traceread.TraceFormatError, match=r"at most .* GiB, got 0\.0 GiB"):
            load(path)
        read, write = os.pipe()
        os.write(write, path.read_bytes())
        os.close(write)
        try:
            with pytest.raises(_traceread.TraceFormatError, match="got more than that"):
                load(f"/dev/fd/{read}")
        finally:
            os.close(read)

    def test_a_pipe_reads(self, saved_trace: Path) -> None:
        """A trace given through a pipe (`<(gunzip -c t.json.gz)`) still reads."""
        read, write = os.pipe()
        data = saved_trace.read_bytes()

        def feed() -> None:
            os.write(write, data)
            os.close(write)

        writer = threading.Thread(target=feed)
        writer.start()
        try:
            assert len(load(f"/dev/fd/{read}").tasks) == len(load(saved_trace).tasks)
        finally:
            writer.join()
            os.close(read)


class TestHostileTraces:
    def _error(self, tmp_path: Path, text: str, match: str) -> None:
        """summary and render both print one `TraceFormatError` line matching, exit 1."""
        path = tmp_path / "t.json"
        path.write_text(text)
        for command in ("summary", "render"):
            result = CliRunner().invoke(cli, ["trace", command, str(path)], catch_exceptions=False)
            assert result.exit_code == 1
            (line,) = result.stderr.strip().splitlines()
            assert line.startswith(f"dataflow trace {command}: error: TraceFormatError: ")
            assert match in line

    def test_the_array_form_without_its_closing_bracket_reads(self, tmp_path: Path) -> None:
        """The format lets the array form end without `]` (a traced program that died), also
        after a comma; it was 'not JSON'. Another truncation is still one error line."""
        event = '{"name": "k", "ph": "X", "ts": 0, "dur": 5, "pid": 1, "tid": 1}'
        for text in (f"[{event},\n{event},\n", f"[{event}"):
            path = tmp_path / "open.json"
            path.write_text(text)
            result = CliRunner().invoke(cli, ["trace", "summary", str(path)])
            assert result.exit_code == 0, result.output
            assert "k#1" in result.stdout
        self._error(tmp_path, event[:30], "is not JSON")
        self._error(tmp_path, f"[{event[:30]}", "is not JSON")

    def test_begin_and_end_pairs_read_as_slices(self, tmp_path: Path) -> None:
        """Another tool's B/E pairs (nested per thread) are the slices they stand for; they
        were skipped: a summary of 0 tasks, exit 0. An end before its begin is one error line.
        """

        def event(ph: str, ts: int, tid: int, name: str = "") -> str:
            return json.dumps({"name": name, "ph": ph, "ts": ts, "pid": 1, "tid": tid})

        events = [event("B", 0, 1, "outer"), event("B", 2, 1, "inner"), event("E", 5, 1),
                  event("B", 1, 2, "other"), event("E", 9, 2), event("E", 10, 1),
                  event("B", 11, 1, "left open")]  # fmt: skip
        path = tmp_path / "be.json"
        path.write_text('{"traceEvents": [' + ", ".join(events) + "]}")
        trace = load(path)
        slices = {(t.op, t.thread, (t.end - t.start) // 1000) for t in trace.tasks}
        assert slices == {("outer", 1, 10), ("inner", 1, 3), ("other", 2, 8)}
        result = CliRunner().invoke(cli, ["trace", "summary", str(path)])
        assert result.exit_code == 0 and "(3 tasks;" in result.stdout
        text = '{"traceEvents": [' + event("B", 5, 1, "x") + ", " + event("E", 1, 1) + "]}"
        self._error(tmp_path, text, "event 1 (ph 'E'): ts must be at or after its B event's")

    def test_deep_json(self, tmp_path: Path) -> None:
        """JSON nested 100,000 deep: a one-line error, not a RecursionError traceback."""
        self._error(tmp_path, "[" * 100_000 + "]" * 100_000, "more than 64 deep")

    def test_deep_args(self, tmp_path: Path) -> None:
        """An event whose args nest 900 deep (JSON can parse it) is refused the same way."""
        event = '{"ph": "X", "ts": 0, "dur": 1, "args": ' + "[" * 900 + "]" * 900 + "}"
        self._error(tmp_path, '{"traceEvents": [' + event + "]}", "more than 64 deep")

    @pytest.mark.parametrize("ts", ["1e400", "-1e400", "NaN", '"5"', "1e20"])
    def test_timestamps_that_are_not_times(self, tmp_path: Path, ts: str) -> None:
        """`ts: 1e400` (infinite), NaN, a string: an error naming the event and field."""
        text = '{"traceEvents": [{"ph": "X", "name": "a", "tid": 1, "ts": ' + ts + ', "dur": 1}]}'
        self._error(tmp_path, text, "event 0 (ph 'X'): ts must be a finite number")

    def test_negative_duration(self, tmp_path: Path) -> None:
        """A slice with a negative duration is refused by name."""
        text = '{"traceEvents": [{"ph": "X", "name": "a", "tid": 1, "ts": 5, "dur": -3}]}'
        self._error(tmp_path, text, "dur must be a duration")

    def test_args_of_the_wrong_kind(self, tmp_path: Path) -> None:
        """args that is not an object, inputs that is not a list: named."""
        text = '{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1, "args": [1, 2]}]}'
        self._error(tmp_path, text, "args must be an object")
        text = '{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1, "args": {"inputs": 3}}]}'
        self._error(tmp_path, text, "args.inputs must be a list of task names")

    @pytest.mark.parametrize(
        "shape", ['["a"]', "1.5", "[null]", "[[1]]", "true", '{"x": 1}', "[-1]", "[true]"]
    )
    def test_shapes_that_are_not_shapes_count_as_unknown(self, tmp_path: Path, shape: str) -> None:
        """A shape the reader cannot use (a foreign or edited trace) counts its output's bytes
        as unknown: summary and render succeed, no traceback."""
        path = tmp_path / "t.json"
        for key, value in (("shape", shape), ("shapes", f"[{shape}]")):
            path.write_text(
                '{"traceEvents": [{"ph": "X", "name": "a", "tid": 1, "ts": 0, "dur": 1, '
                f'"args": {{"task": "x#1", "{key}": {value}, "dtype": "float32", '
                '"dtypes": ["float32"]}}]}'
            )
            for command in ("summary", "render"):
                args = [
                    "trace",
                    command,
                    str(path),
                    *(["-o", str(tmp_path / "o.svg")] * (command == "render")),
                ]
                result = CliRunner().invoke(cli, args, catch_exceptions=False)
                assert result.exit_code == 0, result.output

    def test_a_repeated_task_name_does_not_loop(self, tmp_path: Path) -> None:
        """Names repeated so that the inputs form a cycle (a hand-made or merged file): the
        critical path stops at the name it saw, summary and render finish."""
        events = [
            {"ph": "X", "name": "a", "ts": 0, "dur": 1, "tid": 1, "args": {"task": "x"}},
            {
                "ph": "X",
                "name": "a",
                "ts": 2,
                "dur": 1,
                "tid": 1,
                "args": {"task": "y", "inputs": ["x"]},
            },
            {
                "ph": "X",
                "name": "a",
                "ts": 4,
                "dur": 1,
                "tid": 1,
                "args": {"task": "x", "inputs": ["y"]},
            },
        ]
        path = tmp_path / "t.json"
        path.write_text(json.dumps({"traceEvents": events}))
        result = CliRunner().invoke(cli, ["trace", "summary", str(path)], catch_exceptions=False)
        assert result.exit_code == 0 and "critical path" in result.stdout
        out = tmp_path / "t.svg"
        result = CliRunner().invoke(cli, ["trace", "render", str(path), "-o", str(out)])
        assert result.exit_code == 0 and out.exists()

    def test_string_thread_ids_load(self, tmp_path: Path) -> None:
        """A foreign trace naming threads by strings loads; the lane keeps the string."""
        path = tmp_path / "t.json"
        path.write_text(
            '{"traceEvents": [{"ph": "X", "name": "a", "tid": "gpu", "ts": 1, "dur": 2},'
            '{"ph": "X", "name": "b", "tid": "cpu", "ts": 2, "dur": 2}]}'
        )
        trace = load(path)
        assert sorted(trace.threads.values()) == ["cpu", "gpu"]
        result = CliRunner().invoke(cli, ["trace", "summary", str(path)], catch_exceptions=False)
        assert result.exit_code == 0 and "gpu" in result.stdout

    def test_names_that_would_drive_the_terminal_print_escaped(self, tmp_path: Path) -> None:
        """An op or thread name holding a terminal escape or a carriage return (a crafted
        file) is printed as its escapes by summary, never as control characters."""
        path = tmp_path / "t.json"
        events = [
            {"ph": "M", "name": "thread_name", "tid": 1, "args": {"name": "w\x1b]0;pwn\x07"}},
            {"ph": "X", "name": "a\x1b[2J\rb", "tid": 1, "ts": 1, "dur": 2},
        ]
        path.write_text(json.dumps({"traceEvents": events}))
        result = CliRunner().invoke(cli, ["trace", "summary", str(path)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.stdout and "\r" not in result.stdout
        assert "a\\x1b[2J\\rb" in result.stdout

    def test_a_newline_in_a_name_prints_no_line_of_its_own(self, tmp_path: Path) -> None:
        """A name with a newline printed a line of the crafted file's choosing in the
        summary ("wall time 1 ms" twice); it is escaped like any control character now."""
        path = tmp_path / "t.json"
        events = [
            {"ph": "M", "name": "thread_name", "tid": 1, "args": {"name": "w\nbusy  9 s"}},
            {"ph": "X", "name": "a\nwall time  1 ms", "tid": 1, "ts": 1, "dur": 2},
        ]
        path.write_text(json.dumps({"traceEvents": events}))
        result = CliRunner().invoke(cli, ["trace", "summary", str(path)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert [line for line in lines if line.startswith("wall time")] == [lines[0]]
        assert not any(line.startswith("busy  9 s") for line in lines)
        assert "a\\nwall time  1 ms#1" in result.stdout and "w\\nbusy  9 s" in result.stdout

    def test_foreign_values_in_args_render(self, tmp_path: Path) -> None:
        """flops given as a string (a foreign trace) is shown as it is, not a crash."""
        path = tmp_path / "t.json"
        path.write_text(
            '{"traceEvents": [{"ph": "X", "name": "a", "tid": 1, "ts": 1, "dur": 2, '
            '"args": {"flops": "many", "bytes": [1]}}]}'
        )
        svg = render_svg(load(path))
        assert "&#x27;many&#x27; flops, [1] bytes" in svg


class TestTraceRender:
    def test_svg_has_a_bar_per_task(self, saved_trace: Path, tmp_path: Path) -> None:
        """`trace render -o x.svg` writes parseable SVG with one titled bar per task."""
        out = tmp_path / "timeline.svg"
        result = CliRunner().invoke(cli, ["trace", "render", str(saved_trace), "-o", str(out)])
        assert result.exit_code == 0, result.output
        root = ET.parse(out).getroot()
        bars = [r for r in root.iter(f"{SVG}rect") if "task" in (r.get("class") or "").split()]
        tasks = {e["args"]["task"] for e in x_events(saved_trace)}
        assert len(bars) == len(tasks) == 13
        assert {b.get("data-task") for b in bars} == tasks
        assert all(b.find(f"{SVG}title") is not None for b in bars)
        drawn = {t.text for t in root.iter(f"{SVG}text") if t.get("class") == "lane"}
        assert drawn == set(lanes(load(saved_trace)).values())  # whichever threads ran tasks
        texts = [t.text or "" for t in root.iter(f"{SVG}text")]
        assert any(t.startswith("matmul: ") for t in texts)  # its legend entry
        assert {"time (s)", "time (ms)", "time (us)"} & set(texts)  # the unit fits the run

    def test_the_trace_itself_as_the_output_is_refused(
        self, saved_trace: Path, tmp_path: Path
    ) -> None:
        """A trace saved as t.svg (or t.html): `render t.svg` wrote the picture over it."""
        for name, extra in (("t.svg", []), ("t.html", ["-o"])):
            path = tmp_path / name
            path.write_bytes(saved_trace.read_bytes())
            args = ["trace", "render", str(path), *extra, *([str(path)] if extra else [])]
            result = CliRunner().invoke(cli, args)
            assert result.exit_code == 2, result.output
            assert "that is the trace being read" in result.stderr
            assert path.read_bytes() == saved_trace.read_bytes()

    def test_html_page(self, saved_trace: Path, tmp_path: Path) -> None:
        """`-o x.html` embeds the SVG in a page with the summary and the op table."""
        out = tmp_path / "timeline.html"
        result = CliRunner().invoke(cli, ["trace", "render", str(saved_trace), "-o", str(out)])
        assert result.exit_code == 0, result.output
        page = out.read_text()
        assert page.startswith("<!doctype html>") and page.count("<svg") == 1
        assert "<title>matmul#" in page and "critical path" in page

    def test_arrows_option(self, tmp_path: Path) -> None:
        """--arrows all draws every dependency, none draws none; other values are refused.

        On a hand-made trace: which arrows a real run draws depends on its schedule (tasks
        back to back on one lane get none), so a run can draw as many for "all" as for
        "critical"."""
        saved = tmp_path / "diamond.json"
        saved.write_text(json.dumps(to_chrome(DIAMOND)))
        counts = {}
        for arrows in ("critical", "all", "none"):
            out = tmp_path / f"{arrows}.svg"
            args = ["trace", "render", str(saved), "-o", str(out), "--arrows", arrows]
            assert CliRunner().invoke(cli, args).exit_code == 0
            root = ET.parse(out).getroot()
            counts[arrows] = len([p for p in root.iter(f"{SVG}path") if p.get("class") == "dep"])
        assert counts == {"critical": 1, "all": 3, "none": 0}  # as TestRenderSvg finds in process
        bad = ["trace", "render", str(saved), "--arrows", "some"]
        assert CliRunner().invoke(cli, bad).exit_code == 2

    def test_an_empty_output_is_a_usage_error(self, saved_trace: Path, tmp_path: Path) -> None:
        """`-o ""` is refused: it wrote the default PATH.svg instead."""
        trace = tmp_path / "run.json"
        trace.write_bytes(saved_trace.read_bytes())
        result = CliRunner().invoke(cli, ["trace", "render", str(trace), "-o", ""])
        assert result.exit_code == 2
        assert "the path is empty" in result.output
        assert not trace.with_suffix(".svg").exists()

    def test_default_output_and_bad_suffix(self, saved_trace: Path, tmp_path: Path) -> None:
        """Without -o the SVG goes next to the trace; other suffixes are a usage error."""
        result = CliRunner().invoke(cli, ["trace", "render", str(saved_trace)])
        assert result.exit_code == 0 and saved_trace.with_suffix(".svg").exists()
        result = CliRunner().invoke(cli, ["trace", "render", str(saved_trace), "-o", "x.png"])
        assert result.exit_code == 2 and ".svg or .html" in result.output


def _span(name: str, thread: int, start: int, end: int, *inputs: str) -> TaskSpan:
    return TaskSpan(name, name.split("#")[0], thread, start, end, start, inputs)


DIAMOND = Trace(
    tasks=[
        _span("load#1", 1, 0, 100),
        _span("left#2", 1, 100, 400, "load#1"),
        _span("right#3", 2, 110, 350, "load#1"),
        _span("join#4", 1, 420, 500, "left#2", "right#3"),
    ],
    threads={1: "interop-0", 2: "interop-1", 3: "loop"},
    wall=520,
)


class TestRenderSvg:
    def _parse(self, svg: str) -> ET.Element:
        return ET.fromstring(svg)

    def _deps(self, root: ET.Element) -> list[ET.Element]:
        return [p for p in root.iter(f"{SVG}path") if p.get("class") == "dep"]

    def test_all_arrows(self) -> None:
        """arrows="all": an arrow per dependency, except back-to-back tasks on one lane."""
        root = self._parse(render_svg(DIAMOND, arrows="all"))
        deps = self._deps(root)
        assert len(deps) == 3  # load->right, left->join, right->join; load->left is adjacent
        assert all(p.get("marker-end") == "url(#arrow)" for p in deps)

    def test_critical_path_by_default(self) -> None:
        """By default only the critical path: its bars outlined, an arrow across its gap."""
        svg = render_svg(DIAMOND)
        root = self._parse(svg)
        critical = [
            r.get("data-task") for r in root.iter(f"{SVG}rect") if r.get("class") == "task critical"
        ]
        assert critical == ["load#1", "left#2", "join#4"]
        assert len(self._deps(root)) == 1  # left -> join (load -> left is back to back)
        assert "the critical path, 3 tasks" in svg

    def test_no_arrows(self) -> None:
        """arrows="none": no arrows, nothing outlined; a bad value is a ValueError."""
        root = self._parse(render_svg(DIAMOND, arrows="none"))
        assert self._deps(root) == []
        assert not [r for r in root.iter(f"{SVG}rect") if r.get("class") == "task critical"]
        with pytest.raises(ValueError, match="critical"):
            render_svg(DIAMOND, arrows="some")

    def test_one_lane_per_thread_name_over_successive_runs(self) -> None:
        """12 runs' fresh pool threads (24 ids, 2 names) and the loop: 3 lanes, as the header."""
        tasks, threads = [_span("inline#0", 99, 0, 5)], {99: "loop"}
        for run in range(12):
            for k in range(2):
                tid = 100 + 2 * run + k
                threads[tid] = f"interop-{k}"
                name = f"op#{1 + 2 * run + k}"
                tasks.append(_span(name, tid, 10 + 100 * run, 90 + 100 * run))
        svg = render_svg(Trace(tasks=tasks, threads=threads, wall=1300))
        root = self._parse(svg)
        labels = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "lane"]
        assert labels == ["loop", "interop-0", "interop-1"]
        assert "25 tasks on 2 pool threads and the loop" in svg

    def test_long_lane_names_fit(self) -> None:
        """Dask worker threads are drawn by port; other long names are cut in the middle."""
        names = {
            1: "dask tcp://127.0.0.1:42543 0-Dask-Default-Threads-30554-0",
            2: "dask tcp://127.0.0.1:45587 1-Dask-Default-Threads-30554-1",
            3: "a-pool-with-a-very-long-name-thread-7",
        }
        tasks = [_span(f"t#{tid}", tid, 10 * tid, 10 * tid + 5) for tid in names]
        root = self._parse(render_svg(Trace(tasks=tasks, threads=names, wall=40)))
        lanes_drawn = {
            t.text: t.find(f"{SVG}title").text  # type: ignore[union-attr]
            for t in root.iter(f"{SVG}text")
            if t.get("class") == "lane"
        }
        assert lanes_drawn == {
            "dask :42543": names[1],
            "dask :45587": names[2],
            "a-pool-with\u2026e-thread-7": names[3],
        }
        assert all(len(label or "") <= MAX_LABEL for label in lanes_drawn)

    def test_dask_worker_with_several_threads(self) -> None:
        """Two threads of one worker keep a thread number: dask :42543 t0 / t1."""
        base = "dask tcp://127.0.0.1:42543 "
        names = {1: base + "Dask-Default-Threads-1-0", 2: base + "Dask-Default-Threads-1-1"}
        tasks = [_span(f"t#{tid}", tid, 0, 5) for tid in names]
        root = self._parse(render_svg(Trace(tasks=tasks, threads=names, wall=5)))
        labels = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "lane"]
        assert labels == ["dask :42543 t0", "dask :42543 t1"]

    def test_lanes_and_colours(self) -> None:
        """A lane per thread that ran tasks; one colour per op, the same on every bar."""
        root = self._parse(render_svg(DIAMOND))
        labels = [
            t.text
            for t in root.iter(f"{SVG}text")
            if t.get("font-weight") == "bold" and t.get("font-size") == "12"
        ]
        assert labels == ["interop-0", "interop-1"]
        bars = [r for r in root.iter(f"{SVG}rect") if "task" in (r.get("class") or "").split()]
        fills = {b.get("data-task"): b.get("fill") for b in bars}
        assert len(set(fills.values())) == 4

    def test_arrows_left_out_when_too_many(self) -> None:
        """Past MAX_ARROWS edges the arrows are left out, with a note saying so."""
        n = MAX_ARROWS + 2
        tasks = [_span("a#1", 1, 0, 10)] + [
            _span(f"b#{i}", 2, 20 + i, 21 + i, "a#1") for i in range(2, n + 2)
        ]
        svg = render_svg(Trace(tasks=tasks, threads={1: "x", 2: "y"}, wall=n + 30), arrows="all")
        root = self._parse(svg)
        assert not [p for p in root.iter(f"{SVG}path") if p.get("class") == "dep"]
        assert f"{n} dependency arrows left out" in svg

    def test_escapes_names(self) -> None:
        """Op and thread names are escaped, so any name gives valid XML."""
        trace = Trace(tasks=[_span("a<b>&#1", 1, 0, 10)], threads={1: "t<&>"}, wall=10)
        root = self._parse(render_svg(trace, title="x & y"))
        assert [r.get("data-task") for r in root.iter(f"{SVG}rect") if r.get("class")] == [
            "a<b>&#1"
        ]
        assert "t&lt;&amp;&gt;" in render_html(trace)
