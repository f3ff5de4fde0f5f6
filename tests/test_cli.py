"""The `dataflow` command: run, info, exit codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def dataflow_cmd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dataflow", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


SCRIPT = """
import sys, dataflow

async def main(n):
    futs = [dataflow.fork(double, i) for i in range(n)]
    return sum([await f for f in futs])

async def double(i):
    return 2 * i

if __name__ == "__main__":
    print("argv", sys.argv[1:])
    print("result", dataflow.run(main, int(sys.argv[1])))
    print("interop", dataflow.get_num_interop_threads())
"""


class TestRun:
    def test_runs_script_as_main_with_argv(self, tmp_path: Path) -> None:
        """The script runs as __main__ with sys.argv and the options as defaults."""
        script = tmp_path / "s.py"
        script.write_text(SCRIPT)
        r = dataflow_cmd("run", "--interop-threads", "3", str(script), "10", "--flag")
        assert r.returncode == 0, r.stderr
        assert "argv ['10', '--flag']" in r.stdout
        assert "result 90" in r.stdout
        assert "interop 3" in r.stdout

    def test_run_module(self, tmp_path: Path) -> None:
        """-m runs a module as __main__."""
        (tmp_path / "mymod.py").write_text(SCRIPT)
        env = {**os.environ, "PYTHONPATH": str(tmp_path)}
        r = subprocess.run(
            [sys.executable, "-m", "dataflow", "run", "-m", "mymod", "4"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert r.returncode == 0, r.stderr
        assert "result 12" in r.stdout

    def test_fork_basics_example(self) -> None:
        """examples/fork_basics.py prints the tutorial's results."""
        r = dataflow_cmd("run", "examples/fork_basics.py")
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == ["(array([-1.]), array([-1.]))", "-100.0"]

    def test_fork_basics_help(self) -> None:
        """examples/fork_basics.py --help prints its usage and exits, running nothing; an
        unknown flag is a usage error."""
        r = dataflow_cmd("run", "examples/fork_basics.py", "--help")
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("usage: fork_basics.py [-h]")
        assert "fork examples" in r.stdout and "-100.0" not in r.stdout
        r = dataflow_cmd("run", "examples/fork_basics.py", "--bogus")
        assert r.returncode == 2
        assert "error: unrecognized arguments: --bogus" in r.stderr
        assert "Traceback" not in r.stderr and r.stdout == ""

    def test_system_exit_passes_through(self, tmp_path: Path) -> None:
        """The script's own exit code is the command's."""
        script = tmp_path / "x.py"
        script.write_text("import sys\nsys.exit(7)\n")
        assert dataflow_cmd("run", str(script)).returncode == 7

    def test_exception_exits_1_with_traceback(self, tmp_path: Path) -> None:
        """An uncaught exception prints the script's traceback (not the CLI's) and exits 1."""
        script = tmp_path / "e.py"
        script.write_text("def f():\n    raise ValueError('bad thing')\nf()\n")
        r = dataflow_cmd("run", str(script))
        assert r.returncode == 1
        assert "ValueError: bad thing" in r.stderr
        assert "_cli.py" not in r.stderr and "runpy" not in r.stderr

    def test_missing_script(self, tmp_path: Path) -> None:
        """A missing script is a one-line usage error, exit 2."""
        r = dataflow_cmd("run", str(tmp_path / "nope.py"))
        assert r.returncode == 2
        assert r.stderr.strip().count("\n") == 0
        assert "no such script" in r.stderr

    def test_syntax_error(self, tmp_path: Path) -> None:
        """A syntax error shows as python shows it: file, line, the source, a caret; exit 1."""
        script = tmp_path / "bad.py"
        script.write_text("x = 1\ndef (:\n")
        r = dataflow_cmd("run", str(script))
        assert r.returncode == 1
        assert r.stderr.splitlines() == [
            f'  File "{script}", line 2',
            "    def (:",
            "        ^",
            "SyntaxError: invalid syntax",
        ]

    def test_run_module_from_the_current_folder(self, tmp_path: Path) -> None:
        """-m finds a module in the current folder, as python -m does, from a console script."""
        work, bin_dir = tmp_path / "work", tmp_path / "bin"
        work.mkdir()
        bin_dir.mkdir()
        (work / "mymod.py").write_text(SCRIPT)
        # Like the installed `dataflow` script: its own folder, not the current one, on sys.path.
        launcher = bin_dir / "dataflow_launcher.py"
        launcher.write_text("from dataflow._cli import main\nmain()\n")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        r = subprocess.run(
            [sys.executable, str(launcher), "run", "-m", "mymod", "3"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=work,
        )
        assert r.returncode == 0, r.stderr
        assert "result 6" in r.stdout

    def test_dataflow_option_after_the_script_is_warned_about(self, tmp_path: Path) -> None:
        """`run script.py --trace x.json` passes --trace to the script, and says so."""
        script = tmp_path / "s.py"
        script.write_text("import sys\nprint(sys.argv[1:])\n")
        r = dataflow_cmd("run", str(script), "--trace", "x.json", "--epochs", "3")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "['--trace', 'x.json', '--epochs', '3']"
        assert r.stderr.strip() == (
            f"dataflow run: warning: --trace after {script} goes to the script, not to "
            "dataflow run: put dataflow's options before the script"
        )
        assert not (ROOT / "x.json").exists()

    def test_script_options_are_not_warned_about(self, tmp_path: Path) -> None:
        """Options dataflow run does not have pass to the script silently."""
        script = tmp_path / "s.py"
        script.write_text("import sys\nprint(sys.argv[1:])\n")
        r = dataflow_cmd("run", str(script), "--epochs", "3", "-v")
        assert r.returncode == 0 and r.stderr == ""

    @pytest.mark.parametrize(("env", "option", "expected"), [
        ("asyncio", (), "asyncio"),
        ("asyncio", ("--loop", "auto"), "auto"),
        (None, (), "auto"),
    ])  # fmt: skip
    def test_loop_environment_variable_is_kept(
        self, tmp_path: Path, env: str | None, option: tuple[str, ...], expected: str
    ) -> None:
        """$DATAFLOW_LOOP chooses the loop when --loop is not given; a given --loop wins."""
        script = tmp_path / "s.py"
        script.write_text("import os\nprint(os.environ.get('DATAFLOW_LOOP'))\n")
        environ = {k: v for k, v in os.environ.items() if k != "DATAFLOW_LOOP"}
        if env is not None:
            environ["DATAFLOW_LOOP"] = env
        r = subprocess.run(
            [sys.executable, "-m", "dataflow", "run", *option, str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            env=environ,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == expected

    def test_help_says_options_go_first(self) -> None:
        """`dataflow run --help` says options go before the script."""
        r = dataflow_cmd("run", "--help")
        assert "Options go before SCRIPT" in r.stdout

    def test_bad_usage(self) -> None:
        """Bad options exit 2 with a message."""
        assert dataflow_cmd("run").returncode == 2
        r = dataflow_cmd("run", "--interop-threads", "0", "x.py")
        assert r.returncode == 2 and "interop-threads" in r.stderr
        assert dataflow_cmd("run", "--loop", "tokio", "x.py").returncode == 2

    def test_a_count_past_a_c_int_is_bad_usage(self) -> None:
        """A thread count no C int holds exits 2 naming the option (--intraop-threads was a
        ctypes traceback from BLAS's setter, --interop-threads a pool that tried to start
        that many threads)."""
        for option in ("--interop-threads", "--intraop-threads"):
            r = dataflow_cmd("run", option, str(2**64), "x.py")
            assert r.returncode == 2 and option in r.stderr and "Traceback" not in r.stderr

    @pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
    def test_ctrl_c_exits_130(self, tmp_path: Path) -> None:
        """Ctrl-C cancels the tasks, joins the threads and exits 130."""
        script = tmp_path / "long.py"
        script.write_text(
            "import asyncio, dataflow, time\n"
            "def spin():\n    time.sleep(0.2)\n"
            "async def main():\n"
            "    for _ in range(4):\n        dataflow.fork(spin)\n"
            "    print('ready', flush=True)\n"
            "    await asyncio.sleep(60)\n"
            "dataflow.run(main)\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "dataflow", "run", str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
        assert proc.returncode == 130, err


HANGING = """
import asyncio, time, dataflow

def hang():
    time.sleep(300)  # a kernel that does not return, with no timeout

async def main():
    dataflow.fork(hang)
    print("ready", flush=True)
    await asyncio.sleep(300)

dataflow.run(main)
"""


class TestInterrupt:
    @pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
    @pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
    def test_second_ctrl_c_exits_while_a_kernel_hangs(self, tmp_path: Path, loop: str) -> None:
        """Ctrl-C waits for the running kernel; a second one exits 130 at once."""
        script = tmp_path / "hang.py"
        script.write_text(HANGING)
        proc = subprocess.Popen(
            [sys.executable, "-m", "dataflow", "run", "--loop", loop, str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(0.3)  # the kernel is running
            proc.send_signal(signal.SIGINT)
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)  # the clean-up waits for the kernel
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
        assert proc.returncode == 130, err
        assert err.strip().splitlines()[-1] == "dataflow run: interrupted"
        assert "Traceback" not in err

    def test_ctrl_c_in_any_command_exits_130(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Ctrl-C in `dataflow graph run` or `trace summary` exits 130 with one line, as
        `dataflow run`; it was click's 'Aborted!' and exit 1."""
        from click.testing import CliRunner

        from dataflow import _cli_trace
        from dataflow._cli import cli

        def interrupted(path: str) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(_cli_trace, "load", interrupted)
        (tmp_path / "t.json").write_text("{}")
        result = CliRunner().invoke(cli, ["trace", "summary", str(tmp_path / "t.json")])
        assert result.exit_code == 130
        assert result.stderr == "dataflow trace: interrupted\n"


def _info(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -m dataflow info` in a fresh process with ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "dataflow", "info"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )


class TestInfo:
    def test_info_and_version(self) -> None:
        """`dataflow info` prints parallel_info; --version the version."""
        r = dataflow_cmd("info")
        assert r.returncode == 0 and "inter-op threads" in r.stdout
        r = dataflow_cmd("--version")
        assert r.returncode == 0 and "dataflow" in r.stdout

    def test_info_does_not_warn_about_defaults(self) -> None:
        """`dataflow info` with nothing chosen prints no oversubscription warning."""
        from dataflow import _threads

        # Every variable that counts as a choice: a Dask cluster with worker processes, as
        # test_dask.py starts, sets OMP_, MKL_ and OPENBLAS_NUM_THREADS in this process's
        # environment for its workers, and the subprocess would inherit MKL_NUM_THREADS.
        chosen = (_threads._ENV_INTEROP, *_threads._ENV_INTRAOP)
        env = {k: v for k, v in os.environ.items() if k not in chosen}
        r = _info(env)
        assert r.returncode == 0, r.stderr
        assert "WARNING" not in r.stdout

    @pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full")
    def test_output_that_cannot_be_written_is_one_line(self) -> None:
        """`dataflow info > /dev/full` (a full disk): one line and exit 1; it printed the
        traceback through click's frames."""
        with open("/dev/full", "w") as full:
            r = subprocess.run(
                [sys.executable, "-m", "dataflow", "info"],
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
                cwd=ROOT,
            )
        assert r.returncode == 1
        assert r.stderr == "dataflow: error: OSError: [Errno 28] No space left on device\n"

    def test_a_bad_setting_in_the_environment_is_one_line(self) -> None:
        """`dataflow info` under a bad $DATAFLOW_NUM_INTEROP_THREADS says which, in one line
        (`Type: message`), and exits 1; it printed a traceback."""
        env = {**os.environ, "DATAFLOW_NUM_INTEROP_THREADS": "abc"}
        r = _info(env)
        assert r.returncode == 1, r.stderr
        assert "Traceback" not in r.stderr
        assert r.stderr.strip() == (
            "dataflow info: error: DataflowValueError: $DATAFLOW_NUM_INTEROP_THREADS must be "
            "a positive int, got 'abc'"
        )
