"""The public API: __all__ matches what the packages export, and everything is documented."""

from __future__ import annotations

import inspect
import types

import pytest

import dataflow
import dataflow.dask
import dataflow.graph
import ops
import ops.nn

# The public packages: each has an __all__, and docs/ document what it exports.
PACKAGES = [dataflow, ops, ops.nn, dataflow.graph, dataflow.dask]
IDS = [p.__name__ for p in PACKAGES]


@pytest.mark.parametrize("module", PACKAGES, ids=IDS)
class TestExports:
    def test_all_matches_public_names(self, module: types.ModuleType) -> None:
        """__all__ lists exactly the public names the package defines (no drift)."""
        public = {n for n in vars(module) if not n.startswith("_")}
        public -= {n for n, v in vars(module).items() if isinstance(v, types.ModuleType)}
        assert sorted(public - set(module.__all__)) == []
        assert sorted(set(module.__all__) - set(vars(module))) == []

    def test_all_is_a_tuple_without_duplicates(self, module: types.ModuleType) -> None:
        """__all__ is a tuple and names each export once."""
        assert isinstance(module.__all__, tuple)
        assert len(set(module.__all__)) == len(module.__all__)

    def test_every_export_has_a_docstring(self, module: types.ModuleType) -> None:
        """Every exported function and class carries a docstring."""
        missing = [
            n
            for n in module.__all__
            if callable(getattr(module, n)) and not (getattr(module, n).__doc__ or "").strip()
        ]
        assert missing == []

    def test_every_public_method_has_a_docstring(self, module: types.ModuleType) -> None:
        """Every public method and property of an exported class has a docstring (its own
        or the one it overrides: `help()` shows that)."""
        missing = []
        for n in module.__all__:
            cls = getattr(module, n)
            if not isinstance(cls, type):
                continue
            for name in dir(cls):
                attr = inspect.getattr_static(cls, name, None)
                if name.startswith("_") or not (callable(attr) or isinstance(attr, property)):
                    continue
                if not inspect.getdoc(
                    attr.fget if isinstance(attr, property) else getattr(cls, name)
                ):
                    missing.append(f"{n}.{name}")
        assert missing == []


@pytest.mark.parametrize("module", PACKAGES, ids=IDS)
def test_dir_shows_no_future_import(module: types.ModuleType) -> None:
    """dir() of the package lists no `annotations` (the `from __future__` name)."""
    assert "annotations" not in dir(module)


class TestOpSignatures:
    @pytest.mark.parametrize(
        "name", [n for n in ops.__all__ if isinstance(getattr(ops, n), dataflow.Op)]
    )
    def test_an_op_shows_its_meta_rules_parameters(self, name: str) -> None:
        """inspect.signature(ops.sum) (help(), IDEs) is how to call it, not `(*args, **kwargs)`."""
        op = getattr(ops, name)
        assert inspect.signature(op).parameters == inspect.signature(op.meta).parameters
        assert inspect.signature(op).return_annotation is inspect.Signature.empty

    def test_a_declared_op_shows_its_meta_rules_parameters(self) -> None:
        """dataflow.op gives the user's op its meta rule's signature."""

        def meta(x: ops.Tensor, k: float, *, scale: bool = True) -> ops.TensorSpec:
            return ops.spec_of(x)

        scale = dataflow.op("sig_scale", meta=meta, handle=ops.Tensor)(lambda x, k, scale: x)
        assert (
            str(inspect.signature(scale))
            == "(x: 'ops.Tensor', k: 'float', *, scale: 'bool' = True)"
        )

    def test_a_meta_rule_without_a_signature_falls_back(self) -> None:
        """A meta rule inspect cannot read (a builtin) leaves the op's __call__ signature."""
        op = dataflow.op("sig_builtin", meta=max, handle=ops.Tensor)(max)
        assert list(inspect.signature(op).parameters) == ["args", "kwargs"]

    def test_the_op_class_keeps_its_own_signature(self) -> None:
        """inspect.signature(dataflow.Op) is the constructor's (no class-level override)."""
        assert list(inspect.signature(dataflow.Op).parameters)[:3] == ["name", "kernel", "meta"]


class TestErrorNames:
    @pytest.mark.parametrize(
        "name", [n for n in dataflow.__all__ if n.endswith(("Error", "Warning"))]
    )
    def test_errors_name_their_public_module(self, name: str) -> None:
        """Every exported error says `dataflow.X` in reprs, not its private module."""
        cls = getattr(dataflow, name)
        assert cls.__module__ == "dataflow"
        assert repr(cls) == f"<class 'dataflow.{name}'>"

    def test_traceback_shows_the_public_name(self) -> None:
        """A traceback's last line reads `dataflow.OpInputError: ...`."""
        import traceback

        try:
            raise dataflow.OpInputError("bad input")
        except dataflow.OpInputError as exc:
            last = traceback.format_exception(exc)[-1]
        assert last == "dataflow.OpInputError: bad input\n"

    def test_errors_still_pickle(self) -> None:
        """An error pickles and unpickles by its public name (Dask sends errors back)."""
        import pickle

        again = pickle.loads(pickle.dumps(dataflow.OpInputError("bad input")))
        assert type(again) is dataflow.OpInputError
        assert str(again) == "bad input"


def test_dataflow_never_imports_ops() -> None:
    """The runtime knows no specific op: no dataflow module imports ops."""
    import pathlib
    import re

    root = pathlib.Path(dataflow.__file__).parent
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if re.search(r"^\s*(from ops\b|import ops\b)", p.read_text(), re.MULTILINE)
    ]
    assert offenders == []


class TestDistributionName:
    ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]

    def test_distribution_is_not_a_pypi_project_of_another(self) -> None:
        """pyproject names numpy-dataflow (PyPI's dataflow and ops are other projects)."""
        import tomllib

        from dataflow import _threads

        project = tomllib.loads((self.ROOT / "pyproject.toml").read_text())["project"]
        assert project["name"] == _threads.DISTRIBUTION == "numpy-dataflow"

    def test_version_is_read_from_that_distribution(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """dataflow --version asks importlib.metadata for numpy-dataflow, not dataflow."""
        import importlib.metadata

        from dataflow import _threads

        asked: list[str] = []

        def version(distribution: str) -> str:
            asked.append(distribution)
            return "9.9"

        monkeypatch.setattr(importlib.metadata, "version", version)
        assert _threads._version() == "9.9"
        assert asked == ["numpy-dataflow"]

    def test_no_install_command_fetches_another_project(self) -> None:
        """No doc or message says `pip install dataflow` / `'dataflow[...]'` / `ops`, nor
        `numpy-dataflow`, which is not on PyPI (README): not the library, nor its examples and
        benchmarks."""
        import re

        bad = re.compile(r"pip install\s+['\"]?(numpy-dataflow|dataflow|ops)\b(?!-)")
        files = [self.ROOT / "README.md", *sorted((self.ROOT / "docs").glob("*.md"))]
        for package in ("dataflow", "ops", "examples", "benchmarks"):
            files += sorted((self.ROOT / package).rglob("*.py"))
        offenders = [
            f"{path.relative_to(self.ROOT)}:{n}"
            for path in files
            for n, line in enumerate(path.read_text().splitlines(), start=1)
            if bad.search(line) and "never `pip install" not in line
        ]
        assert offenders == []
