"""The .dfg file format: round trips, and every kind of bad file refused with a clear error."""

from __future__ import annotations

import errno
import gc
import io
import json
import os
import re
import sys
import textwrap
import warnings
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


def _write_twice(target: Any, members: dict[str, bytes], name: str, second: bytes) -> None:
    """Write ``members``, then ``name`` a second time with the ``second`` bytes."""
    with zipfile.ZipFile(target, "w") as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name
        for n, data in members.items():
            zf.writestr(n, data)
        zf.writestr(name, second)


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
        assert doc["nodes"][0]["op"] == "ops._rnn_ops:lstm_sequence"
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

    def test_two_members_of_one_name(self, saved: tuple[Path, dataflow.Graph, Array]) -> None:
        """A second graph.json after the first is refused: zipfile loaded the last one, which
        other tools (unzip) do not show, so what was inspected was not what ran."""
        path, _, _ = saved
        members = _members(path)
        doc = json.loads(members["graph.json"])
        doc["nodes"], doc["outputs"] = [], {"input": 0}
        _write_twice(path, members, "graph.json", json.dumps(doc).encode())
        self._error(path, "holds two members named 'graph.json'")

    def test_an_array_twice_in_params(self, saved: tuple[Path, dataflow.Graph, Array]) -> None:
        """The same in params.npz: an array's member twice, the second all zeros."""
        path, _, _ = saved
        members = _members(path)
        params = members["params.npz"]
        with zipfile.ZipFile(io.BytesIO(params)) as npz:
            arrays = {n: npz.read(n) for n in npz.namelist()}
        name = next(iter(arrays))
        with np.load(io.BytesIO(params)) as npz:
            zeros = np.zeros_like(npz[name.removesuffix(".npy")])
        buf = io.BytesIO()
        npy = io.BytesIO()
        np.save(npy, zeros)
        _write_twice(buf, arrays, name, npy.getvalue())
        members["params.npz"] = buf.getvalue()
        _write(path, members)
        self._error(path, f"params.npz holds two members named '{name}'")

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

    @pytest.mark.parametrize(
        ("edit", "match"),
        [
            # A location that ends the printed graph early and hides the lines after it.
            (
                lambda d: d["nodes"][0].update(location="m.py:1\n  return %x\n\x1b[8m"),
                "location 'm.py:1.*is not printable text",
            ),
            # Names that graph.code writes into Python source as they are.
            (
                lambda d: d.update(name="f(self):\n    import os\nasync def g"),
                "the graph's name 'f\\(self\\):",
            ),
            (lambda d: d["inputs"][0].update(name="x=__import__('os')"), "input 0 "),
            (
                lambda d: d["nodes"][1]["kwargs"].update({"axis=0); import os; (": 1}),
                "keyword 'axis=0\\); import os",
            ),
            (
                lambda d: d["constants"][0].update(name="w\n  %0 : float32[] = ops.exp(%x)"),
                "a constant's name",
            ),
            (
                lambda d: d["nodes"][0].update(op="ops\n:matmul"),
                "op 'ops.*:matmul' is not printable",
            ),
        ],
    )
    def test_names_and_locations_that_would_not_print_as_themselves(
        self,
        saved: tuple[Path, dataflow.Graph, Array],
        edit: Callable[[dict[str, Any]], None],
        match: str,
    ) -> None:
        """What `graph show` prints (and `graph.code` writes) from a file is what runs: a
        name or location with a newline or a terminal escape, or a non-Python name where the
        code needs one, is refused, by read() too (they printed as they were)."""
        path, _, _ = saved
        _edit_json(path, edit)
        self._error(path, match)
        with pytest.raises(GraphFormatError, match=match):
            read(str(path))

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
        self._error(path, r"node %0 \(ops\._rnn_ops:lstm_sequence\): the op computes")

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

    def test_complex_of_a_string(self, saved: tuple[Path, dataflow.Graph, Array]) -> None:
        """{"complex": [1, "a"]} is refused by name, not by complex()'s TypeError."""
        path, _, _ = saved
        _edit_json(path, lambda d: d["nodes"][0]["args"].append({"complex": [1, "a"]}))
        for reader in (dataflow.load, read):
            with pytest.raises(GraphFormatError, match="a complex needs two numbers"):
                reader(str(path))

    @pytest.mark.parametrize("ref", [{"arg": 0}, {"tmp": 0}])
    def test_step_references_outside_a_fused_step(
        self, saved: tuple[Path, dataflow.Graph, Array], ref: dict[str, int]
    ) -> None:
        """{"arg": i} / {"tmp": j} anywhere but a fused step's arguments is refused."""
        path, _, _ = saved
        _edit_json(path, lambda d: d.update(outputs=ref))
        for reader in (dataflow.load, read):
            with pytest.raises(GraphFormatError, match="may only be an argument of a fused step"):
                reader(str(path))

    def test_missing_file_is_file_not_found(self, tmp_path: Path) -> None:
        """A path with no file is a FileNotFoundError, as for open()."""
        with pytest.raises(FileNotFoundError):
            dataflow.load(str(tmp_path / "nope.dfg"))

    @pytest.mark.parametrize("path", [5, None, b"model.dfg", ["model.dfg"]])
    def test_a_path_that_is_not_one_is_refused_naming_the_argument(
        self, saved: tuple[Path, dataflow.Graph, Array], path: Any
    ) -> None:
        """load, read and save name their ``path`` argument for anything but a str or an
        os.PathLike (os.fspath's own error named neither); a pathlib.Path works."""
        file, graph, _ = saved
        for call, name in ((dataflow.load, "dataflow.load"), (read, "dataflow.graph.read"),
                           (graph.save, "Graph.save")):  # fmt: skip
            with pytest.raises(dataflow.DataflowTypeError, match=rf"{re.escape(name)}\(path="):
                call(path)
        assert isinstance(dataflow.load(file, trust=["ops"]), dataflow.Graph)
        assert isinstance(read(file), dataflow.Graph)


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

    def test_a_name_load_would_refuse_is_refused_at_the_save(self, tmp_path: Path) -> None:
        """A graph name that is not a Python name fails the save (a file saved must load)."""
        graph = dataflow.trace(lambda x: ops.negative(x), _rand(3))
        graph.name = "my model"
        with pytest.raises(ValueError, match="not a Python name, and load would refuse"):
            graph.save(str(tmp_path / "g.dfg"))
        assert os.listdir(tmp_path) == []
        graph.name = "my_model"
        graph.save(str(tmp_path / "g.dfg"))
        assert dataflow.load(str(tmp_path / "g.dfg")).name == "my_model"


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


# -- hostile files: bombs, huge declarations, deep nesting ------------------------------------

MiB = 2**20


def _small_graph(path: Path) -> None:
    """A valid one-op graph with one constant ``w`` of float32[4]."""
    w = _rand(4, seed=7)

    async def f(x: Any) -> Any:
        return ops.add(x, w)

    dataflow.trace(f, _rand(4)).save(str(path))


def _zeros_npy(nbytes: int) -> Iterator[bytes]:
    """A .npy of float32 zeros of ``nbytes`` data bytes, in 1 MiB pieces."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (nbytes // 4,)}
    )
    yield header.getvalue()  # (the magic string, then the header)
    chunk = bytes(MiB)
    for start in range(0, nbytes, MiB):
        yield chunk[: min(MiB, nbytes - start)]


def _deflated_member(name: str, pieces: Iterator[bytes]) -> bytes:
    """A zip archive (bytes) with one deflated member made of ``pieces``."""
    buf = io.BytesIO()
    with (
        zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf,
        zf.open(name, "w", force_zip64=True) as member,
    ):
        for piece in pieces:
            member.write(piece)
    return buf.getvalue()


def _forge_size(path: Path, name: str, size: int) -> None:
    """Make the archive declare ``size`` uncompressed bytes for member ``name`` (a lie)."""
    data = bytearray(path.read_bytes())
    encoded = name.encode()
    for signature, size_at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = data.find(signature)
        while at >= 0:
            name_at = at + (30 if signature == b"PK\x03\x04" else 46)
            if data[name_at : name_at + len(encoded)] == encoded:
                data[at + size_at : at + size_at + 4] = size.to_bytes(4, "little")
            at = data.find(signature, at + 1)
    path.write_bytes(bytes(data))


def _peak_bytes(call: Callable[[], Any]) -> tuple[BaseException | None, int]:
    """(what ``call`` raised, the peak of memory it allocated, as tracemalloc sees it)."""
    import tracemalloc

    tracemalloc.start()
    raised: BaseException | None = None
    try:
        call()
    except BaseException as exc:
        raised = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return raised, peak


class TestBombs:
    def _refused(self, path: Path, match: str) -> None:
        """Both load and read refuse the file with ``match``, allocating under 8 MiB."""
        for reader in (dataflow.load, read):
            raised, peak = _peak_bytes(lambda: reader(str(path)))  # noqa: B023
            assert isinstance(raised, GraphFormatError), raised
            assert re.search(match, str(raised)), str(raised)
            assert peak < 8 * MiB

    def test_graph_json_bomb(self, tmp_path: Path) -> None:
        """A 200 KiB file whose graph.json inflates to 200 MiB is refused on its declaration."""
        path = tmp_path / "bomb.dfg"
        path.write_bytes(_deflated_member("graph.json", iter([b" " * MiB] * 200)))
        assert path.stat().st_size < MiB
        self._refused(path, r"graph\.json declares 200\.0 MiB .* \(MAX_GRAPH_JSON\)")

    def test_declared_three_gib(self, tmp_path: Path) -> None:
        """graph.json declaring 3 GiB uncompressed is refused before a byte is inflated."""
        path = tmp_path / "bomb.dfg"
        path.write_bytes(_deflated_member("graph.json", iter([b" " * MiB])))
        _forge_size(path, "graph.json", 3 * 2**30)
        self._refused(path, r"declares 3\.0 GiB uncompressed, more than the 128\.0 MiB")

    def test_member_inflating_past_its_declared_size(self, tmp_path: Path) -> None:
        """A member that declares 1 KiB but inflates to 16 MiB is cut at 1 KiB and refused."""
        path = tmp_path / "bomb.dfg"
        path.write_bytes(_deflated_member("graph.json", iter([b" " * MiB] * 16)))
        _forge_size(path, "graph.json", 1024)
        self._refused(path, "graph.json is corrupted|inflates to more than")

    def test_nested_params_bomb(self, tmp_path: Path) -> None:
        """A deflated params.npz of deflated members (a zip in a zip) is refused unopened."""
        path = tmp_path / "model.dfg"
        _small_graph(path)
        nbytes = 256 * MiB
        inner = _deflated_member("w.npy", _zeros_npy(nbytes))
        members = _members(path)
        doc = json.loads(members["graph.json"])
        doc["constants"][0]["shape"] = [nbytes // 4]
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
            zf.writestr("graph.json", json.dumps(doc))
            zf.writestr("params.npz", inner)
        assert path.stat().st_size < 16 * 2**10
        self._refused(path, r"constants declare 256\.0 MiB .* \(MAX_EXPANSION")

    def test_params_member_bigger_than_its_constant(self, tmp_path: Path) -> None:
        """A params.npz member declaring more than graph.json's float32[4] is never inflated."""
        path = tmp_path / "model.dfg"
        _small_graph(path)
        members = _members(path)
        members["params.npz"] = _deflated_member("w.npy", _zeros_npy(64 * MiB))
        name = json.loads(members["graph.json"])["constants"][0]["name"]
        members["params.npz"] = _deflated_member(f"{name}.npy", _zeros_npy(64 * MiB))
        _write(path, members)
        self._refused(path, r"params\.npz declares .* more than .* graph\.json's constants need")

    def test_npy_header_is_checked_before_its_data(self, tmp_path: Path) -> None:
        """A member whose .npy header disagrees with graph.json is refused unread."""
        path = tmp_path / "model.dfg"
        _small_graph(path)
        members = _members(path)
        name = json.loads(members["graph.json"])["constants"][0]["name"]
        # graph.json declares float32[4]; the member's header says float32[8].
        members["params.npz"] = _deflated_member(f"{name}.npy", _zeros_npy(32))
        _write(path, members)
        self._refused(path, r"params\.npz holds float32\[8\], graph\.json says float32\[4\]")

    def test_too_many_members(self, tmp_path: Path) -> None:
        """An archive of 10,000 members is refused before its directory is read."""
        path = tmp_path / "many.dfg"
        with zipfile.ZipFile(path, "w") as zf:
            for k in range(10_000):
                zf.writestr(f"m{k}", b"")
        self._refused(path, r"has 10000 members, more than the 64 .*\(MAX_MEMBERS\)")

    def test_other_compression_methods(self, tmp_path: Path) -> None:
        """A bzip2 member (ratios far beyond deflate's) is refused unopened."""
        path = tmp_path / "bz.dfg"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_BZIP2) as zf:
            zf.writestr("graph.json", b"{}")
        self._refused(path, "compressed with method 12")


class TestHugeDeclarations:
    def _with_input_shape(self, tmp_path: Path, shape: list[int]) -> Path:
        path = tmp_path / "model.dfg"
        _small_graph(path)
        _edit_json(path, lambda d: d["inputs"][0].update(shape=shape))
        return path

    def test_huge_constant_shape(self, tmp_path: Path) -> None:
        """A constant declared float32[2**40] in a small file is refused before reading."""
        path = tmp_path / "model.dfg"
        _small_graph(path)
        _edit_json(path, lambda d: d["constants"][0].update(shape=[2**40]))
        raised, peak = _peak_bytes(lambda: dataflow.load(str(path)))
        assert isinstance(raised, GraphFormatError)
        assert "constants declare 4096.0 GiB" in str(raised)
        assert peak < 8 * MiB

    def test_too_many_dimensions(self, tmp_path: Path) -> None:
        """An input shape of 65 dimensions is refused by name, not by numpy."""
        path = self._with_input_shape(tmp_path, [1] * 65)
        with pytest.raises(GraphFormatError, match="at most 64 dimensions, got 65"):
            dataflow.load(str(path))

    def test_shape_beyond_addressable_bytes(self, tmp_path: Path) -> None:
        """An input of 2**31 x 2**31 float32 (2**64 bytes) is refused by name."""
        path = self._with_input_shape(tmp_path, [2**31, 2**31])
        with pytest.raises(GraphFormatError, match=r"describes 2\*\*62 bytes or more"):
            dataflow.load(str(path))

    def test_large_input_shape_takes_no_memory(self, tmp_path: Path) -> None:
        """A large but valid input shape is checked with stand-ins, allocating nothing."""
        path = self._with_input_shape(tmp_path, [2**20, 2**20])
        raised, peak = _peak_bytes(lambda: dataflow.load(str(path)))
        assert isinstance(raised, GraphFormatError)  # add(x, w[4]) cannot broadcast
        assert "the op rejects the recorded arguments" in str(raised)
        assert peak < 8 * MiB


def _nested(depth: int) -> Any:
    value: Any = {"input": 0}
    for _ in range(depth):
        value = {"tuple": [value]}
    return value


class TestDeepNesting:
    @pytest.mark.parametrize("depth", [200, 100_000])
    def test_deep_json_is_refused(self, tmp_path: Path, depth: int) -> None:
        """Outputs nested deeper than the limit: GraphFormatError, not RecursionError."""
        path = tmp_path / "model.dfg"
        _small_graph(path)
        _edit_json_text(path, lambda d: d.update(outputs="@@"), _nested(depth))
        for reader in (dataflow.load, read):
            with pytest.raises(GraphFormatError, match=r"more than 256 deep \(MAX_JSON_DEPTH\)"):
                reader(str(path))

    def test_nesting_within_the_limit_round_trips(self, tmp_path: Path) -> None:
        """A 60-deep nested output saves and loads."""

        async def f(x: Any) -> Any:
            out: Any = ops.negative(x)
            for _ in range(60):
                out = (out,)
            return out

        path = tmp_path / "deep.dfg"
        graph = dataflow.trace(f, _rand(3))
        graph.save(str(path))
        assert str(dataflow.load(str(path))) == str(graph)

    def test_save_refuses_values_deeper_than_load_reads(self, tmp_path: Path) -> None:
        """save raises TypeError naming MAX_VALUE_DEPTH for a 150-deep output."""

        async def f(x: Any) -> Any:
            out: Any = ops.negative(x)
            for _ in range(150):
                out = [out]
            return out

        graph = dataflow.trace(f, _rand(3))
        with pytest.raises(TypeError, match="more than 100 levels deep"):
            graph.save(str(tmp_path / "deep.dfg"))
        assert os.listdir(tmp_path) == []


def _edit_json_text(path: Path, edit: Callable[[dict[str, Any]], None], value: Any) -> None:
    """Like _edit_json, then splice ``value`` (JSON of any depth) where the edit put "@@"."""
    members = _members(path)
    doc = json.loads(members["graph.json"])
    edit(doc)
    text = json.dumps(doc)
    depth = 0
    inner: Any = value
    while isinstance(inner, dict) and "tuple" in inner:
        depth += 1
        inner = inner["tuple"][0]
    nested = '{"tuple": [' * depth + json.dumps(inner) + "]}" * depth
    members["graph.json"] = text.replace('"@@"', nested).encode()
    _write(path, members)


class TestFileMode:
    def test_new_file_follows_the_umask(self, tmp_path: Path) -> None:
        """A new file gets 0o666 less the umask, as open() gives (not mkstemp's 0o600)."""
        old = os.umask(0o022)
        try:
            _small_graph(tmp_path / "a.dfg")
            os.umask(0o027)
            _small_graph(tmp_path / "b.dfg")
        finally:
            os.umask(old)
        assert (tmp_path / "a.dfg").stat().st_mode & 0o777 == 0o644
        assert (tmp_path / "b.dfg").stat().st_mode & 0o777 == 0o640

    def test_symlink_is_followed(self, tmp_path: Path) -> None:
        """Saving over a symlink writes the file it points to (as open(path, 'w') does), beside
        that file; the link stays a link."""
        real_dir, link_dir = tmp_path / "real", tmp_path / "links"
        real_dir.mkdir()
        link_dir.mkdir()
        target = real_dir / "a.dfg"
        target.write_bytes(b"old")
        target.chmod(0o604)
        link = link_dir / "a.dfg"
        link.symlink_to(os.path.join("..", "real", "a.dfg"))  # relative, as ln -s makes them
        _small_graph(link)
        assert link.is_symlink() and os.readlink(link) == os.path.join("..", "real", "a.dfg")
        assert target.stat().st_mode & 0o777 == 0o604
        assert dataflow.load(str(target)).nodes
        assert os.listdir(real_dir) == ["a.dfg"] and os.listdir(link_dir) == ["a.dfg"]

    def test_dangling_symlink_creates_its_target(self, tmp_path: Path) -> None:
        """A link to a file not there yet: the file is created, as open(path, 'w') would."""
        link = tmp_path / "link.dfg"
        link.symlink_to(tmp_path / "new.dfg")
        _small_graph(link)
        assert link.is_symlink()
        assert dataflow.load(str(tmp_path / "new.dfg")).nodes

    def test_symlink_loop_is_refused(self, tmp_path: Path) -> None:
        """A link loop: open()'s error (ELOOP), the links left as they were, nothing written."""
        a, b = tmp_path / "a.dfg", tmp_path / "b.dfg"
        a.symlink_to(b)
        b.symlink_to(a)
        with pytest.raises(OSError) as info:
            _small_graph(a)
        assert info.value.errno == errno.ELOOP
        assert a.is_symlink() and b.is_symlink()
        assert sorted(os.listdir(tmp_path)) == ["a.dfg", "b.dfg"]

    def test_overwritten_file_keeps_its_mode(self, tmp_path: Path) -> None:
        """Saving over an existing file keeps that file's mode, as open(path, 'w') does."""
        path = tmp_path / "a.dfg"
        path.write_bytes(b"")
        path.chmod(0o604)
        _small_graph(path)
        assert path.stat().st_mode & 0o777 == 0o604
        assert dataflow.load(str(path)).nodes
