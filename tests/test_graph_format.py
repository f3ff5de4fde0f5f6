"""The .dfg file format: round trips, and every kind of bad file refused with a clear error."""

from __future__ import annotations

import gc
import io
import json
import os
import sys
import textwrap
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

import dataflow
import ops
from dataflow import GraphFormatError
from dataflow.graph import FORMAT_VERSION, fuse_elementwise, read
from examples.lstm_ensemble import Ensemble

Array = np.ndarray[Any, Any]
PWNED: list[str] = []


def _pwn() -> str:
    PWNED.append("unpickled")
    return "pwned"


class Evil:
    """Unpickling this calls _pwn: a file that holds it must never be unpickled."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_pwn, ())


def _rand(*shape: int, seed: int = 0) -> Array:
    out: Array = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return out


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def _write(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def _edit_json(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    members = _members(path)
    doc = json.loads(members["graph.json"])
    edit(doc)
    members["graph.json"] = json.dumps(doc).encode()
    _write(path, members)


def _edit_params(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    members = _members(path)
    with np.load(io.BytesIO(members["params.npz"])) as npz:
        arrays: dict[str, Any] = {k: npz[k] for k in npz.files}
    edit(arrays)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as npz_out:
        for name, array in arrays.items():
            with npz_out.open(f"{name}.npy", "w") as f:
                np.lib.format.write_array(f, np.asanyarray(array), allow_pickle=True)
    members["params.npz"] = buf.getvalue()
    _write(path, members)


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dataflow.Graph, Array]:
    """A small ensemble, optimised and saved: (path, graph, an input)."""
    x = _rand(3, 2, 4)
    graph = dataflow.trace(Ensemble(2, 4, seed=0), x).optimize()
    path = tmp_path / "model.dfg"
    graph.save(str(path))
    return path, graph, x


class TestRoundTrip:
    def test_load_runs_with_equal_outputs_and_prints_the_same(
        self, saved: tuple[Path, dataflow.Graph, Array]
    ) -> None:
        """Saved and loaded: the same IR, and the same outputs on a new input."""
        path, graph, _ = saved
        loaded = dataflow.load(str(path))
        assert str(loaded) == str(graph)
        assert loaded.parameters == graph.parameters
        x = _rand(3, 2, 4, seed=5)
        np.testing.assert_array_equal(loaded.run(x), graph.run(x))

    def test_specs_and_costs_are_recomputed(
        self, saved: tuple[Path, dataflow.Graph, Array]
    ) -> None:
        """Loading recomputes every spec and cost with the ops' own rules."""
        path, graph, _ = saved
        loaded = dataflow.load(str(path))
        for a, b in zip(graph.nodes, loaded.nodes, strict=True):
            assert a.spec == b.spec
            assert a.cost == b.cost
            assert a.op is b.op

    def test_literals_fused_nodes_and_structured_outputs(self, tmp_path: Path) -> None:
        """Slices, dtypes, NamedTuple specs, fused nodes and nested outputs survive."""
        b = _rand(4, seed=2)

        async def f(x: Any) -> Any:
            y = ops.tanh(ops.add(ops.multiply(x, 2.0), b))
            z = ops.astype(ops.getitem(y, (slice(1, None), Ellipsis)), np.float64)
            return {"y": y, "z": [z, ops.flip(x, axis=0)]}, 3, float("inf")

        x = _rand(3, 4)
        graph = fuse_elementwise(dataflow.trace(f, x))
        path = tmp_path / "f.dfg"
        graph.save(str(path))
        loaded = dataflow.load(str(path))
        assert str(loaded) == str(graph)
        x2 = _rand(3, 4, seed=3)
        (want, _, _), (got, three, inf) = graph.run(x2), loaded.run(x2)
        assert (three, inf) == (3, float("inf"))
        np.testing.assert_array_equal(got["y"], want["y"])
        np.testing.assert_array_equal(got["z"][0], want["z"][0])
        np.testing.assert_array_equal(got["z"][1], want["z"][1])

    def test_numexpr_engine_is_kept(self, tmp_path: Path) -> None:
        """A fused node's engine is saved with it."""

        async def f(x: Any) -> Any:
            return ops.tanh(ops.multiply(x, 3.0))

        graph = fuse_elementwise(dataflow.trace(f, _rand(5)), engine="numexpr")
        graph.save(str(tmp_path / "g.dfg"))
        loaded = dataflow.load(str(tmp_path / "g.dfg"))
        assert loaded.nodes[0].op.engine == "numexpr"  # type: ignore[attr-defined]

    def test_file_layout(self, saved: tuple[Path, dataflow.Graph, Array]) -> None:
        """A zip of graph.json (format, version) and params.npz (no pickles)."""
        path, graph, _ = saved
        members = _members(path)
        assert set(members) == {"graph.json", "params.npz"}
        doc = json.loads(members["graph.json"])
        assert doc["format"] == "dataflow.graph"
        assert doc["version"] == FORMAT_VERSION == 1
        assert len(doc["nodes"]) == len(graph.nodes)
        assert doc["nodes"][0]["op"] == "ops._recurrent:rnn_projection"
        with np.load(io.BytesIO(members["params.npz"]), allow_pickle=False) as npz:
            assert set(npz.files) == set(graph.constants)

    def test_read_prints_without_importing(self, saved: tuple[Path, dataflow.Graph, Array]) -> None:
        """read() shows the IR without resolving ops; such a graph does not run."""
        path, graph, x = saved
        inspected = read(str(path))
        assert str(inspected) == str(graph)
        assert not inspected.resolved
        with pytest.raises(TypeError, match="inspection"):
            inspected.run(x)

    def test_save_leaves_no_temporary_file(self, saved: tuple[Path, dataflow.Graph, Array]) -> None:
        """The file is written under a temporary name and renamed into place."""
        path, _, _ = saved
        assert os.listdir(path.parent) == ["model.dfg"]


class TestBadFiles:
    def _error(self, path: Path, match: str, **kwargs: Any) -> GraphFormatError:
        with pytest.raises(GraphFormatError, match=match) as info:
            dataflow.load(str(path), **kwargs)
        assert str(path) in str(info.value)
        assert info.value.path == str(path)
        return info.value

    def test_error_type(self) -> None:
        """GraphFormatError is a DataflowError and a ValueError."""
        assert issubclass(GraphFormatError, dataflow.DataflowError)
        assert issubclass(GraphFormatError, ValueError)

    def test_not_a_zip(self, tmp_path: Path) -> None:
        """Random bytes: not a graph file."""
        path = tmp_path / "junk.dfg"
        path.write_bytes(os.urandom(300))
        self._error(path, "not a zip archive")

    def test_truncated(self, saved: tuple[Path, dataflow.Graph, Array]) -> None:
        """Half a file: refused, not half-loaded."""
        path, _, _ = saved
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        self._error(path, "truncated")

    def test_corrupted_member(self, saved: tuple[Path, dataflow.Graph, Array]) -> None:
        """Flipped bytes inside the compressed graph.json fail the CRC / inflate."""
        path, _, _ = saved
        data = bytearray(path.read_bytes())
        start = data.index(b"graph.json") + len(b"graph.json")
        for k in range(start + 20, start + 60):
            data[k] ^= 0xFF
        path.write_bytes(bytes(data))
        self._error(path, "corrupted|not valid JSON")

    def test_newer_version(self, saved: tuple[Path, dataflow.Graph, Array]) -> None:
        """A version from the future asks for an upgrade."""
        path, _, _ = saved
        _edit_json(path, lambda d: d.update(version=FORMAT_VERSION + 1))
        self._error(path, "newer dataflow")

    def test_bad_version_and_format_name(self, tmp_path: Path) -> None:
        """A version that is not a positive int, or another format name, is refused."""
        path = tmp_path / "g.dfg"
        _write(path, {"graph.json": b'{"format": "dataflow.graph", "version": "1"}'})
        self._error(path, "bad format version")
        _write(path, {"graph.json": b'{"format": "something.else", "version": 1}'})
        self._error(path, "not a graph file")
        _write(path, {"graph.json": b"{nope"})
        self._error(path, "not valid JSON")
        _write(path, {"other.txt": b""})
        self._error(path, "no graph.json")

    def test_missing_parameter(self, saved: tuple[Path, dataflow.Graph, Array]) -> None:
        """A constant graph.json names but params.npz lacks is named in the error."""
        path, _, _ = saved
        _edit_params(path, lambda a: a.pop("models.1.cell_b.weight_hh_l0"))
        self._error(path, r"constant models\.1\.cell_b\.weight_hh_l0 is missing")

    def test_parameter_of_the_wrong_shape(self, saved: tuple[Path, dataflow.Graph, Array]) -> None:
        """params.npz and graph.json must agree on each array's shape and dtype."""
        path, _, _ = saved
        _edit_params(path, lambda a: a.update({"models.0.cell_f.weight_ih_l0": np.zeros(3)}))
        self._error(path, "params.npz holds float64")

    def test_pickle_in_params_is_refused_unopened(
        self, saved: tuple[Path, dataflow.Graph, Array]
    ) -> None:
        """An object array (a pickle) in params.npz is refused without being unpickled."""
        path, _, _ = saved
        evil = np.empty(1, dtype=object)
        evil[0] = Evil()
        _edit_params(path, lambda a: a.update({"models.0.cell_f.weight_ih_l0": evil}))
        PWNED.clear()
        self._error(path, "Python objects")
        assert PWNED == []

    def test_unknown_op(self, saved: tuple[Path, dataflow.Graph, Array]) -> None:
        """An op name the module does not declare is an unknown op."""
        path, _, _ = saved
        _edit_json(path, lambda d: d["nodes"][0].update(op="ops._recurrent:no_such_op"))
        self._error(path, r"unknown op ops\._recurrent:no_such_op")

    def test_untrusted_module_is_not_imported(
        self, saved: tuple[Path, dataflow.Graph, Array]
    ) -> None:
        """A module the file names is imported only when trusted (here: never, it is `os`)."""
        path, _, _ = saved
        _edit_json(path, lambda d: d["nodes"][0].update(op="antigravity:fly"))
        self._error(path, "not trusted")
        assert "antigravity" not in sys.modules

    def test_recorded_types_must_match_the_op(
        self, saved: tuple[Path, dataflow.Graph, Array]
    ) -> None:
        """A node whose recorded type is not what its op computes is refused."""
        path, _, _ = saved

        def edit(doc: dict[str, Any]) -> None:
            doc["nodes"][0]["outputs"][0]["shape"] = [9, 9]

        _edit_json(path, edit)
        self._error(path, r"node %0 \(ops\._recurrent:rnn_projection\): the op computes")

    def test_bad_reference(self, saved: tuple[Path, dataflow.Graph, Array]) -> None:
        """A node that reads a later node is refused."""
        path, _, _ = saved
        _edit_json(path, lambda d: d["nodes"][0].update(args=[{"node": 5}]))
        self._error(path, "not defined before it")

    def test_op_rejecting_its_arguments(self, saved: tuple[Path, dataflow.Graph, Array]) -> None:
        """Arguments the op's meta rule refuses are reported with the op's own message."""
        path, _, _ = saved

        def edit(doc: dict[str, Any]) -> None:
            doc["nodes"][0]["args"][1] = {"input": 0}  # x where the weight should be

        _edit_json(path, edit)
        self._error(path, "the op rejects the recorded arguments")

    def test_missing_file_is_file_not_found(self, tmp_path: Path) -> None:
        """A path with no file is a FileNotFoundError, as for open()."""
        with pytest.raises(FileNotFoundError):
            dataflow.load(str(tmp_path / "nope.dfg"))


# -- trust: a module of ops that is not imported yet ------------------------------------------


@pytest.fixture
def op_module(tmp_path: Path) -> Iterator[str]:
    """A module on sys.path that declares an op; removed again afterwards."""
    name = f"graph_test_ops_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            import numpy as np
            import dataflow
            import ops

            def _kernel(x):
                return np.negative(x) * 2

            twice_negative = ops.define(
                "twice_negative", _kernel, lambda x: ops.spec_of(x),
                lambda x: dataflow.Cost(1.0, 8.0),
            )
            """
        )
    )
    sys.path.insert(0, str(tmp_path))
    try:
        yield name
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
        gc.collect()


class TestTrust:
    def test_only_trusted_modules_are_imported(self, op_module: str, tmp_path: Path) -> None:
        """A graph using an op from a module not imported loads only with trust=[module]."""
        path = tmp_path / "g.dfg"
        _save_with(op_module, path)
        sys.modules.pop(op_module)
        gc.collect()  # the op (and its registry entry) go away with the module
        with pytest.raises(GraphFormatError, match=f"trust=\\['{op_module}'\\]"):
            dataflow.load(str(path))
        assert op_module not in sys.modules
        loaded = dataflow.load(str(path), trust=[op_module])
        np.testing.assert_array_equal(loaded.run(np.ones(2)), [-2.0, -2.0])


def _save_with(module_name: str, path: Path) -> None:
    """Trace a graph that calls the module's op and save it (no reference outlives this)."""
    import importlib

    module = importlib.import_module(module_name)

    async def f(x: Any) -> Any:
        return module.twice_negative(x)

    dataflow.trace(f, np.ones(2)).save(str(path))


class TestSaveErrors:
    def test_local_namedtuple_cannot_be_named(self, tmp_path: Path) -> None:
        """An argument whose class lives in a function has no name a file could use."""

        class Local(NamedTuple):
            k: int

        def _kernel(x: Array, opt: Any) -> Array:
            return x

        op = ops.define("with_local", _kernel, lambda x, opt: ops.spec_of(x))
        graph = dataflow.trace(lambda x: op(x, Local(1)), np.ones(2))
        with pytest.raises(TypeError, match="inside a function"):
            graph.save(str(tmp_path / "g.dfg"))
        assert os.listdir(tmp_path) == []

    def test_shadowed_op_cannot_be_saved(self, tmp_path: Path) -> None:
        """An op re-declared under the same name since the trace is refused by save."""

        def _kernel(x: Array) -> Array:
            return x

        first = ops.define("shadowed", _kernel, lambda x: ops.spec_of(x))
        graph = dataflow.trace(lambda x: first(x), np.ones(2))
        second = ops.define("shadowed", _kernel, lambda x: ops.spec_of(x))
        with pytest.raises(TypeError, match="not the one registered"):
            graph.save(str(tmp_path / "g.dfg"))
        del second


def _gadget_graph(tmp_path: Path, namedtuple: str, fields: list[Any]) -> Path:
    """A valid graph file whose getitem node's index is a NamedTuple of that name."""

    async def f(x: Any) -> Any:
        return ops.getitem(x, (slice(0, 2), Ellipsis))

    path = tmp_path / "gadget.dfg"
    dataflow.trace(f, _rand(3, 4)).save(str(path))

    def edit(doc: dict[str, Any]) -> None:
        (node,) = [n for n in doc["nodes"] if n["op"] == "ops._indexing:getitem"]
        node["args"][1] = {"namedtuple": namedtuple, "fields": fields}

    _edit_json(path, edit)
    return path


class TestNamedTupleAllowList:
    def test_gadget_class_is_never_built(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """platform:uname_result (iterating it runs `uname -p`) is refused unbuilt: no marker."""
        marker = tmp_path / "ran"
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "uname").write_text(f"#!/bin/sh\necho pwned > {marker}\necho x86_64\n")
        (fake / "uname").chmod(0o755)
        monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
        path = _gadget_graph(tmp_path, "platform:uname_result", ["a", "b", "c", "d", "e"])
        with pytest.raises(GraphFormatError, match="NamedTuple platform:uname_result is not"):
            dataflow.load(str(path))
        assert not marker.exists()

    def test_lazy_module_attributes_are_not_walked(self, tmp_path: Path) -> None:
        """numpy:testing.X is refused before numpy.testing (and what it imports) is imported."""
        path = _gadget_graph(tmp_path, "numpy:testing.X", [1])
        code = textwrap.dedent(
            f"""
            import sys, dataflow, ops
            try:
                dataflow.load({str(path)!r})
            except dataflow.GraphFormatError as exc:
                print("refused:", exc)
            print("numpy.testing imported:", "numpy.testing" in sys.modules)
            """
        )
        import subprocess

        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        assert "refused:" in out and "is not allowed" in out
        assert "numpy.testing imported: False" in out

    def test_trusted_module_still_walks_only_its_namespace(self, tmp_path: Path) -> None:
        """Trusting numpy does not make numpy's lazy __getattr__ import numpy.testing."""
        path = _gadget_graph(tmp_path, "numpy:testing.X", [1])
        code = textwrap.dedent(
            f"""
            import sys, dataflow, ops
            try:
                dataflow.load({str(path)!r}, trust=["numpy"])
            except dataflow.GraphFormatError as exc:
                print("refused:", exc)
            print("numpy.testing imported:", "numpy.testing" in sys.modules)
            """
        )
        import subprocess

        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        assert "is not a NamedTuple class of module numpy" in out
        assert "numpy.testing imported: False" in out

    def test_namedtuples_of_op_packages_load(self, tmp_path: Path) -> None:
        """ops._tensor:TensorSpec is allowed: its package declares ops."""
        path = _gadget_graph(tmp_path, "ops._tensor:TensorSpec", [[2], {"dtype": "<f4"}])
        try:
            dataflow.load(str(path))
        except GraphFormatError as exc:  # built; getitem's own rule may then refuse the index
            assert "is not allowed" not in str(exc)
