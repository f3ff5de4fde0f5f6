"""What `dataflow run` runs and how it ends, as `python` would: targets, options, errors."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

ARGV = "import sys\nprint(__name__, sys.argv[1:])\n"


def dataflow_run(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, **kw: object
) -> subprocess.CompletedProcess[str]:
    """``python -m dataflow run ARGS`` in a fresh process, this checkout's dataflow first."""
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    environ = {**(os.environ if env is None else env), "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "dataflow", "run", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=environ,
        **kw,
    )


class TestTargets:
    def test_a_folder_with_a_main_runs(self, tmp_path: Path) -> None:
        """A folder with a __main__.py runs it, as `python FOLDER`; it was refused."""
        (tmp_path / "app").mkdir()
        (tmp_path / "app" / "__main__.py").write_text(ARGV)
        r = dataflow_run(str(tmp_path / "app"), "x")
        assert r.returncode == 0, r.stderr
        assert r.stdout == "__main__ ['x']\n"

    def test_a_zip_archive_with_a_main_runs(self, tmp_path: Path) -> None:
        """A .pyz archive runs its __main__.py, as `python app.pyz`; it was 'null bytes'."""
        with zipfile.ZipFile(tmp_path / "app.pyz", "w") as archive:
            archive.writestr("__main__.py", ARGV)
        r = dataflow_run(str(tmp_path / "app.pyz"), "x")
        assert r.returncode == 0, r.stderr
        assert r.stdout == "__main__ ['x']\n"

    def test_file_is_absolute_and_argv_as_typed(self, tmp_path: Path) -> None:
        """As python 3.9+: __file__ and the tracebacks' file name absolute, sys.argv[0] as
        typed; __file__ was relative, so a script that changed folder lost its own files."""
        (tmp_path / "s.py").write_text(
            "import os, sys\nos.chdir('/')\nprint(sys.argv[0], os.path.exists(__file__))\n1/0\n"
        )
        r = dataflow_run("s.py", cwd=tmp_path)
        assert r.returncode == 1
        assert r.stdout == "s.py True\n"
        assert f'File "{tmp_path / "s.py"}", line 4' in r.stderr

    def test_a_compiled_script_runs(self, tmp_path: Path) -> None:
        """A .pyc runs, as `python script.pyc`; it was 'SyntaxError: ... null bytes'."""
        import py_compile

        (tmp_path / "s.py").write_text(ARGV)
        py_compile.compile(str(tmp_path / "s.py"), cfile=str(tmp_path / "s.pyc"))
        r = dataflow_run(str(tmp_path / "s.pyc"), "x")
        assert r.returncode == 0, r.stderr
        assert r.stdout == "__main__ ['x']\n"

    def test_a_binary_file_is_named(self, tmp_path: Path) -> None:
        """A file that is not Python source (null bytes): one line that names it, exit 1."""
        (tmp_path / "blob").write_bytes(b"\x7fELF\x00\x01")
        r = dataflow_run(str(tmp_path / "blob"))
        assert r.returncode == 1
        assert r.stderr.startswith(f"dataflow run: error: cannot run {tmp_path / 'blob'}: not ")
        assert r.stderr.count("\n") == 1

    def test_a_linked_script_imports_beside_its_file(self, tmp_path: Path) -> None:
        """A script reached through a symbolic link finds the modules beside the file it
        links to, as python puts that folder on sys.path; it got the link's folder."""
        (tmp_path / "real").mkdir()
        (tmp_path / "bin").mkdir()
        (tmp_path / "real" / "helper_mod.py").write_text("VALUE = 7\n")
        (tmp_path / "real" / "s.py").write_text("import helper_mod\nprint(helper_mod.VALUE)\n")
        (tmp_path / "bin" / "s.py").symlink_to(tmp_path / "real" / "s.py")
        r = dataflow_run(str(tmp_path / "bin" / "s.py"))
        assert r.returncode == 0, r.stderr
        assert r.stdout == "7\n"

    def test_code_nested_too_deep_to_compile_is_one_line(self, tmp_path: Path) -> None:
        """An expression nested past the compiler's stack: one line naming the file, exit 1,
        as python's one line; it printed the CLI's and click's frames."""
        (tmp_path / "deep.py").write_text("x = " + "-" * 200_000 + "1\n")
        r = dataflow_run(str(tmp_path / "deep.py"))
        assert r.returncode == 1
        assert r.stderr == f"dataflow run: error: cannot compile {tmp_path / 'deep.py'}: " + (
            "MemoryError (its code nests too deep)\n"
        )

    def test_a_folder_without_a_main_is_one_line(self, tmp_path: Path) -> None:
        """A folder with nothing to run: one line, exit 2."""
        r = dataflow_run(str(tmp_path))
        assert r.returncode == 2
        assert r.stderr.strip().count("\n") == 0 and "no __main__.py" in r.stderr

    def test_stdin(self, tmp_path: Path) -> None:
        """`-` reads the script from stdin, as `python -`; it was 'no such script'."""
        r = dataflow_run("-", "x", input=ARGV)
        assert r.returncode == 0, r.stderr
        assert r.stdout == "__main__ ['x']\n"
        r = dataflow_run("-", input="def (:\n")
        assert r.returncode == 1 and r.stderr.strip().endswith("SyntaxError: invalid syntax")
        assert "Traceback" not in r.stderr

    @pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="/dev/fd")
    def test_a_pipe(self) -> None:
        """A pipe (`dataflow run <(...)`) is read once and runs; it was 'no such script'."""
        read, write = os.pipe()
        os.write(write, ARGV.encode())
        os.close(write)
        try:
            r = dataflow_run(f"/dev/fd/{read}", "x", pass_fds=(read,))
        finally:
            os.close(read)
        assert r.returncode == 0, r.stderr
        assert r.stdout == "__main__ ['x']\n"

    def test_a_package_without_a_main_is_one_line(self, tmp_path: Path) -> None:
        """-m of a package with no __main__: one line, exit 2; it printed runpy's traceback."""
        (tmp_path / "pkg").mkdir()
        (tmp_path / "pkg" / "__init__.py").write_text("")
        r = dataflow_run("-m", "pkg", cwd=tmp_path)
        assert r.returncode == 2
        assert r.stderr.strip() == (
            "dataflow run: error: 'pkg' is a package with no __main__ module: it cannot be "
            "run with -m (run one of its modules, -m PACKAGE.MODULE)"
        )

    def test_a_package_that_fails_to_import_shows_its_error(self, tmp_path: Path) -> None:
        """-m pkg.mod whose package's __init__ fails: its traceback, exit 1, as python -m; a
        dependency it lacks was 'no module named pkg.mod' (exit 2), another error the CLI's
        and click's frames."""
        (tmp_path / "pkg").mkdir()
        (tmp_path / "pkg" / "mod.py").write_text(ARGV)
        for init, error in [
            ("import missing_dep_xyz\n", "ModuleNotFoundError: No module named 'missing_dep_xyz'"),
            ("raise RuntimeError('init broke')\n", "RuntimeError: init broke"),
        ]:
            (tmp_path / "pkg" / "__init__.py").write_text(init)
            r = dataflow_run("-m", "pkg.mod", cwd=tmp_path)
            assert r.returncode == 1
            assert r.stderr.strip().endswith(error)
            assert "__init__.py" in r.stderr and "click" not in r.stderr
            assert "_cli" not in r.stderr


class TestOptions:
    def test_the_module_ends_the_options(self, tmp_path: Path) -> None:
        """After -m MODULE everything is the module's argv, as `python -m`: -h printed
        dataflow run's help, --trace went to dataflow."""
        (tmp_path / "mod.py").write_text(ARGV)
        r = dataflow_run("-m", "mod", "-h", "--trace", "t.json", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert r.stdout == "__main__ ['-h', '--trace', 't.json']\n"
        assert "--trace after mod goes to the script" in r.stderr
        assert not (tmp_path / "t.json").exists()

    def test_an_unknown_option_before_the_script_is_named(self, tmp_path: Path) -> None:
        """A misspelt option is a usage error that names it; it was 'no such script'."""
        r = dataflow_run("--interop-thread", "2", "s.py")
        assert r.returncode == 2
        assert "No such option '--interop-thread'" in r.stderr


class TestErrors:
    def test_the_scripts_excepthook_reports_its_exception(self, tmp_path: Path) -> None:
        """A script's own sys.excepthook reports what it raised, as under python."""
        script = tmp_path / "s.py"
        script.write_text(
            "import sys\n"
            "sys.excepthook = lambda t, e, tb: print('hook:', t.__name__, e, file=sys.stderr)\n"
            "raise ValueError('bad')\n"
        )
        r = dataflow_run(str(script))
        assert r.returncode == 1
        assert r.stderr == "hook: ValueError bad\n"

    @pytest.mark.parametrize(
        ("name", "value"), [("DATAFLOW_LOOP", "tokio"), ("DATAFLOW_NUM_INTEROP_THREADS", "abc")]
    )
    def test_a_bad_setting_in_the_environment_is_one_line(
        self, tmp_path: Path, name: str, value: str
    ) -> None:
        """A bad dataflow variable: one line, exit 2, before the script runs; it was a
        traceback from the script's dataflow.run."""
        script = tmp_path / "s.py"
        script.write_text("print('ran')\nimport dataflow\ndataflow.run(lambda: None)\n")
        r = dataflow_run(str(script), env={**os.environ, name: value})
        assert r.returncode == 2
        assert r.stdout == ""
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("dataflow run: error: DataflowValueError: ") and value in line
