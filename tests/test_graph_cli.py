"""`dataflow graph show` and `dataflow graph run`, through click's test runner."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import dataflow
import ops
from dataflow._cli import cli

Array = np.ndarray[Any, Any]


async def pair(x: Any, y: Any) -> Any:
    return ops.add(x, y), {"diff": ops.subtract(x, y)}


async def _dotted(x: Any) -> Any:
    return {"a.b": ops.tanh(x), "a": {"b": ops.multiply(x, 2.0)}}


async def _with_none(x: Any) -> Any:
    return ops.tanh(x), None


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path, Path, Array, Array]:
    """A saved two-input graph and two input arrays: (model, x.npy, y.npy, x, y)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    y = rng.standard_normal((2, 3)).astype(np.float32)
    model = tmp_path / "pair.dfg"
    dataflow.trace(pair, x, y).save(str(model))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    return model, tmp_path / "x.npy", tmp_path / "y.npy", x, y


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


class TestShow:
    def test_prints_the_ir(self, files: tuple[Path, Path, Path, Array, Array]) -> None:
        """show prints the same IR as print(graph)."""
        model = files[0]
        result = _invoke("graph", "show", str(model))
        assert result.exit_code == 0
        assert result.output.rstrip("\n") == str(dataflow.load(str(model)))
        assert result.output.startswith("graph(%x : float32[2, 3], %y : float32[2, 3]):")

    def test_prints_the_code(self, files: tuple[Path, Path, Path, Array, Array]) -> None:
        """show --code prints the Python source."""
        result = _invoke("graph", "show", "--code", str(files[0]))
        assert result.exit_code == 0
        assert result.output.startswith("async def pair(self, x, y):")

    def test_bad_file(self, tmp_path: Path) -> None:
        """A file that is not a graph: exit 1 with the error's type and message."""
        bad = tmp_path / "bad.dfg"
        bad.write_bytes(b"not a zip")
        result = CliRunner().invoke(cli, ["graph", "show", str(bad)])
        assert result.exit_code == 1
        assert "dataflow graph show: error: GraphFormatError:" in result.output


def _one_line_error(result: Any, command: str, match: str) -> None:
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"dataflow graph {command}: error: GraphFormatError: ")
    assert match in lines[0]


class TestHostileFiles:
    def _deep(self, files: tuple[Path, Path, Path, Array, Array]) -> Path:
        """The model with its outputs nested 100,000 deep."""
        model = files[0]
        with zipfile.ZipFile(model) as zf:
            members = {n: zf.read(n) for n in zf.namelist()}
        text = members["graph.json"].decode()
        start = text.index('"outputs"')
        nested = '{"tuple": [' * 100_000 + '{"input": 0}' + "]}" * 100_000
        members["graph.json"] = (text[:start] + f'"outputs": {nested}}}').encode()
        with zipfile.ZipFile(model, "w") as zf:
            for name, data in members.items():
                zf.writestr(name, data)
        return model

    @pytest.mark.parametrize("command", ["show", "run"])
    def test_deep_json(self, files: tuple[Path, Path, Path, Array, Array], command: str) -> None:
        """Deeply nested graph.json: the one-line error, no RecursionError traceback."""
        model = self._deep(files)
        args = ["graph", command, str(model)]
        if command == "run":
            args += ["-i", str(files[1]), "-i", str(files[2])]
        result = CliRunner().invoke(cli, args, catch_exceptions=False)
        _one_line_error(result, command, "MAX_JSON_DEPTH")

    def test_zip_bomb(self, tmp_path: Path) -> None:
        """A graph.json that inflates to 200 MiB: the one-line error naming the limit."""
        bomb = tmp_path / "bomb.dfg"
        with (
            zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf,
            zf.open("graph.json", "w") as member,
        ):
            for _ in range(200):
                member.write(b" " * 2**20)
        result = CliRunner().invoke(cli, ["graph", "show", str(bomb)], catch_exceptions=False)
        _one_line_error(result, "show", "MAX_GRAPH_JSON")

    def test_no_traceback_in_a_real_process(
        self, files: tuple[Path, Path, Path, Array, Array]
    ) -> None:
        """`python -m dataflow graph show` on a hostile file prints one line, exit 1."""
        model = self._deep(files)
        root = Path(__file__).resolve().parents[1]
        proc = subprocess.run(
            [sys.executable, "-m", "dataflow", "graph", "show", str(model)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=root,
        )
        assert proc.returncode == 1
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


class TestRun:
    def test_prints_the_outputs(self, files: tuple[Path, Path, Path, Array, Array]) -> None:
        """run prints each output's type and values."""
        model, xf, yf, _, _ = files
        result = _invoke("graph", "run", str(model), "-i", str(xf), "-i", str(yf))
        assert result.exit_code == 0, result.output
        assert "output0 : float32[2, 3]" in result.output
        assert "output1.diff : float32[2, 3]" in result.output

    def test_writes_an_npz(self, files: tuple[Path, Path, Path, Array, Array]) -> None:
        """run -o saves the outputs, named by their place in the result."""
        model, xf, yf, x, y = files
        out = model.parent / "out.npz"
        result = _invoke("graph", "run", str(model), "--input", str(xf), "--input", str(yf),
                         "-o", str(out))  # fmt: skip
        assert result.exit_code == 0, result.output
        assert result.output == f"wrote {out} (output0, output1.diff)\n"
        with np.load(out) as npz:
            np.testing.assert_array_equal(npz["output0"], x + y)
            np.testing.assert_array_equal(npz["output1.diff"], x - y)

    def test_output_keys_that_would_drive_the_terminal_print_escaped(self, tmp_path: Path) -> None:
        """A dict key of the graph's outputs is the file's: a terminal escape in it prints as
        `\\x1b` (printed and with -o), as trace summary prints a trace's names; it went to the
        terminal raw."""

        async def keyed(x: Any) -> Any:
            return {"k\x1b[2J": ops.tanh(x)}

        x = np.ones(2, dtype=np.float32)
        model = tmp_path / "keyed.dfg"
        dataflow.trace(keyed, x).save(str(model))
        np.save(tmp_path / "x.npy", x)
        for extra in ((), ("-o", str(tmp_path / "out.npz"))):
            result = CliRunner().invoke(
                cli, ["graph", "run", str(model), "-i", str(tmp_path / "x.npy"), *extra],
                color=True,  # (else click strips escapes itself, as off a terminal)
            )  # fmt: skip
            assert result.exit_code == 0, result.output
            assert "\x1b" not in result.output and "k\\x1b[2J" in result.output

    def test_outputs_sharing_an_npz_key_are_refused(self, tmp_path: Path) -> None:
        """Two outputs that flatten to one key (a dict key with a dot) are an error with -o
        (the second silently replaced the first in the .npz) and both print without it."""
        x = np.ones(3, np.float32)
        model = tmp_path / "dots.dfg"
        dataflow.trace(_dotted, x).save(str(model))
        np.save(tmp_path / "x.npy", x)
        args = ["graph", "run", str(model), "-i", str(tmp_path / "x.npy")]
        result = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "out.npz")])
        assert result.exit_code == 1
        assert "same key 'output.a.b'" in result.stderr
        assert not (tmp_path / "out.npz").exists()
        printed = _invoke(*args)
        assert printed.exit_code == 0 and printed.output.count("output.a.b : float32[3]") == 2

    def test_an_output_that_is_not_an_array_is_not_pickled(self, tmp_path: Path) -> None:
        """-o refuses an output it could only pickle (None), which np.load would refuse."""
        x = np.ones(3, np.float32)
        model = tmp_path / "none.dfg"
        dataflow.trace(_with_none, x).save(str(model))
        np.save(tmp_path / "x.npy", x)
        args = ["graph", "run", str(model), "-i", str(tmp_path / "x.npy")]
        result = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "o.npz")])
        assert result.exit_code == 1
        assert "output output1 is NoneType, not an array" in result.stderr
        assert not (tmp_path / "o.npz").exists()

    def test_an_npz_input_is_refused_clearly(
        self, files: tuple[Path, Path, Path, Array, Array]
    ) -> None:
        """An .npz given as an --input says so (it was read as a 1-element object array:
        'input x has shape [1]')."""
        model, xf, _, x, y = files
        archive = model.parent / "xy.npz"
        np.savez(archive, x=x, y=y)
        result = CliRunner().invoke(cli, ["graph", "run", str(model), "-i", str(archive),
                                          "-i", str(xf)])  # fmt: skip
        assert result.exit_code == 1
        assert "xy.npz: an .npz archive, not one array" in result.stderr

    @pytest.mark.parametrize("name", ["noext", "out.npy", "out.NPZ"])
    def test_output_without_npz_suffix_is_refused(
        self, files: tuple[Path, Path, Path, Array, Array], name: str
    ) -> None:
        """-o must end in .npz (np.savez would write NAME.npz): a usage error, nothing written."""
        model, xf, yf, _, _ = files
        out = model.parent / name
        result = CliRunner().invoke(cli, ["graph", "run", str(model), "-i", str(xf),
                                          "-i", str(yf), "-o", str(out)])  # fmt: skip
        assert result.exit_code == 2
        assert "does not end in .npz" in result.output
        assert "Traceback" not in result.output
        assert sorted(p.name for p in model.parent.iterdir()) == ["pair.dfg", "x.npy", "y.npy"]

    def test_output_in_a_missing_folder_is_refused_before_running(
        self, files: tuple[Path, Path, Path, Array, Array]
    ) -> None:
        """A usage error at once (it was found after the graph ran: exit 1)."""
        model, xf, yf, _, _ = files
        out = model.parent / "missing" / "out.npz"
        result = CliRunner().invoke(cli, ["graph", "run", str(model), "-i", str(xf),
                                          "-i", str(yf), "-o", str(out)])  # fmt: skip
        assert result.exit_code == 2
        assert "does not exist" in result.output and "Traceback" not in result.output

    def test_output_in_a_read_only_folder_is_refused_before_running(
        self, files: tuple[Path, Path, Path, Array, Array], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A usage error at once, as for `dataflow run --trace` (it ran the graph, then failed
        to save: exit 1)."""
        import os

        model, xf, yf, _, _ = files
        access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: mode != os.W_OK and access(p, mode))
        out = model.parent / "out.npz"
        result = CliRunner().invoke(cli, ["graph", "run", str(model), "-i", str(xf),
                                          "-i", str(yf), "-o", str(out)])  # fmt: skip
        assert result.exit_code == 2
        assert "is not writable" in result.output and "Traceback" not in result.output

    def test_wrong_number_of_inputs(self, files: tuple[Path, Path, Path, Array, Array]) -> None:
        """Too few inputs is a usage error naming the graph's inputs."""
        model, xf, _, _, _ = files
        result = CliRunner().invoke(cli, ["graph", "run", str(model), "-i", str(xf)])
        assert result.exit_code == 2
        assert "takes 2 input(s) (x: float32[2, 3], y: float32[2, 3])" in result.output

    def test_wrong_input_shape(self, files: tuple[Path, Path, Path, Array, Array]) -> None:
        """An input of another shape: exit 1 with the graph's message."""
        model, xf, _, _, _ = files
        other = model.parent / "z.npy"
        np.save(other, np.zeros((5, 3), np.float32))
        result = CliRunner().invoke(cli, ["graph", "run", str(model), "-i", str(xf),
                                          "-i", str(other)])  # fmt: skip
        assert result.exit_code == 1
        assert "OpInputError" in result.output and "traced with [2, 3]" in result.output

    def test_untrusted_module_says_how_to_trust(self, tmp_path: Path) -> None:
        """A graph whose op module is not imported and not trusted: exit 1, --trust hint."""
        model = tmp_path / "m.dfg"
        x = np.ones(2, np.float32)
        dataflow.trace(ops.negative, x).save(str(model))
        np.save(tmp_path / "x.npy", x)
        doc_model = tmp_path / "n.dfg"
        import json
        import zipfile

        with zipfile.ZipFile(model) as zf:
            members = {n: zf.read(n) for n in zf.namelist()}
        doc = json.loads(members["graph.json"])
        doc["nodes"][0]["op"] = "not_imported_pkg.sub:negative"
        members["graph.json"] = json.dumps(doc).encode()
        with zipfile.ZipFile(doc_model, "w") as zf:
            for n, data in members.items():
                zf.writestr(n, data)
        result = CliRunner().invoke(cli, ["graph", "run", str(doc_model), "-i",
                                          str(tmp_path / "x.npy")])  # fmt: skip
        assert result.exit_code == 1
        assert "--trust not_imported_pkg" in result.output

    def test_pickled_input_is_refused(self, files: tuple[Path, Path, Path, Array, Array]) -> None:
        """An input .npy holding Python objects is refused, not unpickled."""
        model, xf, _, _, _ = files
        evil = model.parent / "evil.npy"
        np.save(evil, np.array([object()], dtype=object), allow_pickle=True)
        result = CliRunner().invoke(cli, ["graph", "run", str(model), "-i", str(xf),
                                          "-i", str(evil)])  # fmt: skip
        assert result.exit_code == 1
        assert "without pickles" in result.output
