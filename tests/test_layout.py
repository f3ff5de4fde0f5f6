"""The code's layout rules (../shared/STYLE.md, issue #11): small modules, no import circle in
``dataflow/``, ``dataflow/`` never imports ``ops/``, and docs/code-map.md lists every module.

These read the source (``ast``), so they run without importing anything. A module that grows
past :data:`MAX_LINES` is a sign that it holds two concerns: split it (as ``ops/_rnn_*`` and
``dataflow/_plans`` were split) rather than raising the limit.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dataflow", "ops")

#: "most under ~400 lines": a hard ceiling a little above, so ~400 stays the norm.
MAX_LINES = 450


def _modules(package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package``."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _top_level_imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``name`` imports when it is imported: its module-level
    imports (inside ``if``/``try`` too), not those under ``if TYPE_CHECKING:`` nor those in
    functions, which run later."""
    is_package = path.name == "__init__.py"
    base = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    start = base
                    for _ in range(node.level - 1):
                        start = start.rpartition(".")[0]
                    module = f"{start}.{node.module}" if node.module else start
                else:
                    module = node.module or ""
                subs = [f"{module}.{a.name}" for a in node.names]
                if all(s in known for s in subs):  # ``from . import _x``: the submodules
                    out.update(subs)
                elif module in known:
                    out.add(module)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    out.discard(name)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


class TestModuleSize:
    @pytest.mark.parametrize("package", PACKAGES)
    def test_no_module_over_the_limit(self, package: str) -> None:
        """Every module of dataflow/ and ops/ has at most MAX_LINES lines."""
        over = {
            str(path.relative_to(ROOT)): n
            for path in _modules(package).values()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
        }
        assert not over, f"modules over {MAX_LINES} lines (split them by concern): {over}"


class TestImports:
    def test_no_import_circle_in_dataflow(self) -> None:
        """No two modules of dataflow/ import each other, directly or through others, when
        imported (imports in functions and under TYPE_CHECKING aside)."""
        known = _modules("dataflow")
        graph = {name: _top_level_imports(name, path, known) for name, path in known.items()}
        assert _cycles(graph) == []

    def test_dataflow_never_imports_ops(self) -> None:
        """dataflow/ (the runtime) knows no specific op: no import of ops anywhere in it,
        functions included."""
        offenders = []
        for path in _modules("dataflow").values():
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                else:
                    continue
                if any(n == "ops" or n.startswith("ops.") for n in names):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        assert not offenders, f"dataflow/ imports ops at {offenders}"

    def test_the_cycle_finder_finds_a_cycle(self) -> None:
        """The check itself works: a -> b -> c -> a is reported, a tree is not."""
        assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
        assert _cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []

    def test_top_level_imports_skip_type_checking_and_functions(self, tmp_path: Path) -> None:
        """Imports under TYPE_CHECKING or in a function do not count; relative ones resolve."""
        pkg = tmp_path / "pkg"
        pkg.mkdir()
        for name in ("__init__", "a", "b", "c", "d"):
            (pkg / f"{name}.py").write_text("")
        source = (
            "from typing import TYPE_CHECKING\n"
            "from . import b\n"
            "from .c import thing\n"
            "if TYPE_CHECKING:\n    from . import d\n"
            "def f():\n    from . import d\n"
        )
        path = pkg / "a.py"
        path.write_text(source)
        known = {f"pkg.{n}": pkg / f"{n}.py" for n in ("a", "b", "c", "d")}
        known["pkg"] = pkg / "__init__.py"
        assert _top_level_imports("pkg.a", path, known) == {"pkg.b", "pkg.c"}


class TestCodeMap:
    def test_the_code_map_lists_every_module_and_no_other(self) -> None:
        """docs/code-map.md has a line for each module of dataflow/ and ops/, under its
        folder's heading, and none for a module that is gone (add a line when you add one)."""
        listed: set[str] = set()
        folder = None
        for line in (ROOT / "docs" / "code-map.md").read_text(encoding="utf-8").splitlines():
            if heading := re.match(r"## `([\w/]+/)`", line):
                folder = heading.group(1)
            elif (item := re.match(r"- `(\w+\.py)`: \S", line)) and folder is not None:
                listed.add(folder + item.group(1))
        present = {
            str(path.relative_to(ROOT))
            for package in PACKAGES
            for path in _modules(package).values()
        }
        assert sorted(present - listed) == [], "modules missing from docs/code-map.md"
        assert sorted(listed - present) == [], "docs/code-map.md lists modules that do not exist"
