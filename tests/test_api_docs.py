"""The API reference states the signatures the code has, and documents every public name.

docs/api.md gives each call's signature in its `### ` headings (`### \\`run(main, /, *args,
loop="auto") -> T\\``): every backticked call there must name a public callable of `dataflow`
with the same parameters, in the same order, of the same kinds (positional-only,
keyword-only, `*args`, `**kwargs`) and with the same defaults as `inspect.signature` reports,
and a return type it states (`-> Compiled`) must be the one the code is annotated with (or
one of its overloads'). The op tables of docs/ops.md (`| \\`sum\\` | \\`(x, axis=None,
keepdims=False)\\` |`) must match each op's `inspect.signature` (a declared op's is its meta
rule's). A heading that is not a call (`### \\`class Future[T]\\``) is not checked.
"""

from __future__ import annotations

import ast
import inspect
import re
import types
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dataflow
import dataflow.dask
import dataflow.graph
import ops
import ops.nn

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api.md"
OPS = ROOT / "docs" / "ops.md"
MODULES = ROOT / "docs" / "modules.md"

_CODE = re.compile(r"`([^`]+)`")
_CALL = re.compile(
    r"^(?:await\s+|class\s+)?(?P<name>[A-Za-z_]\w*)\((?P<params>.*)\)(?:\s*->\s*(?P<returns>.*))?$"
)
_OPS_ROW = re.compile(r"^\|\s*(?P<names>`\w+`(?:\s*,\s*`\w+`)*)\s*\|\s*`(?P<sig>\([^`]*\))`\s*\|")

# The public packages: everything their __all__ exports is documented.
PACKAGES = [dataflow, ops, ops.nn, dataflow.graph, dataflow.dask]
_MISSING = object()
# Pages that do not document the API: measurements and their log, and the module list.
_NOT_REFERENCE = {"benchmarks.md", "benchmarks-history.md", "code-map.md"}


def _documented(params: str) -> list[tuple[str, inspect._ParameterKind, Any]]:
    """The parameters a documented signature lists: (name, kind, default or _MISSING)."""
    args = ast.parse(f"def _f({params}): pass").body[0].args  # type: ignore[attr-defined]
    out: list[tuple[str, inspect._ParameterKind, Any]] = []
    positional: list[tuple[ast.arg, inspect._ParameterKind]] = [
        (a, inspect.Parameter.POSITIONAL_ONLY) for a in args.posonlyargs
    ]
    positional += [(a, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in args.args]
    defaults = [_MISSING] * (len(positional) - len(args.defaults))
    defaults += [ast.literal_eval(d) for d in args.defaults]
    for (arg, kind), default in zip(positional, defaults, strict=True):
        out.append((arg.arg, kind, default))
    if args.vararg is not None:
        out.append((args.vararg.arg, inspect.Parameter.VAR_POSITIONAL, _MISSING))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        value = _MISSING if default is None else ast.literal_eval(default)
        out.append((arg.arg, inspect.Parameter.KEYWORD_ONLY, value))
    if args.kwarg is not None:
        out.append((args.kwarg.arg, inspect.Parameter.VAR_KEYWORD, _MISSING))
    return out


def _actual(obj: Any) -> list[tuple[str, inspect._ParameterKind, Any]]:
    return [
        (p.name, p.kind, _MISSING if p.default is inspect.Parameter.empty else p.default)
        for p in inspect.signature(obj).parameters.values()
    ]


def _heading_calls() -> list[tuple[int, str, str]]:
    """(line, name, parameters) of every call in a `### ` heading of docs/api.md."""
    calls = []
    for number, line in enumerate(API.read_text().splitlines(), 1):
        if not line.startswith("### "):
            continue
        for code in _CODE.findall(line):
            match = _CALL.match(code.strip())
            if match is not None:
                calls.append((number, match["name"], match["params"]))
    return calls


def _heading_returns() -> list[tuple[int, str, str]]:
    """(line, name, return type) of every call in a `### ` heading that states one."""
    calls = []
    for number, line in enumerate(API.read_text().splitlines(), 1):
        if line.startswith("### "):
            for code in _CODE.findall(line):
                match = _CALL.match(code.strip())
                if match is not None and match["returns"]:
                    calls.append((number, match["name"], match["returns"].strip()))
    return calls


def _heads(annotation: str) -> set[str]:
    """The outer names of a type's union members: `Compiled[T] | None` -> {Compiled, None}."""
    depth, parts, current = 0, [], ""
    for char in annotation:
        depth += char == "["
        depth -= char == "]"
        if char == "|" and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return {part.split("[")[0].strip() for part in [*parts, current]}


def _ops_rows() -> list[tuple[int, str, str]]:
    """(line, op name, parameters) of every row of docs/ops.md's op tables."""
    rows = []
    for number, line in enumerate(OPS.read_text().splitlines(), 1):
        match = _OPS_ROW.match(line)
        if match is not None:
            for name in re.findall(r"`(\w+)`", match["names"]):
                rows.append((number, name, match["sig"][1:-1]))
    return rows


class TestApiHeadings:
    def test_headings_are_found(self) -> None:
        """The parser sees the reference's calls (a format change must not silence the test)."""
        names = {name for _, name, _ in _heading_calls()}
        assert {"fork", "wait", "run", "Runtime", "op", "compile", "trace", "profile"} <= names

    @pytest.mark.parametrize(("line", "name", "params"), _heading_calls(), ids=lambda v: str(v))
    def test_heading_matches_signature(self, line: int, name: str, params: str) -> None:
        """A documented call has the code's parameters: names, kinds, order and defaults."""
        assert name in dataflow.__all__, f"docs/api.md:{line}: {name} is not in dataflow.__all__"
        documented = _documented(params)
        actual = _actual(getattr(dataflow, name))
        assert documented == actual, (
            f"docs/api.md:{line}: {name}({params}) differs from the code's "
            f"{name}{inspect.signature(getattr(dataflow, name))}"
        )

    def test_returns_are_found(self) -> None:
        """The parser sees the documented return types."""
        assert {"fork", "wait", "run", "compile", "trace", "profile"} <= {
            name for _, name, _ in _heading_returns()
        }

    @pytest.mark.parametrize(("line", "name", "returns"), _heading_returns(), ids=lambda v: str(v))
    def test_heading_return_matches_annotation(self, line: int, name: str, returns: str) -> None:
        """A documented return type is what the code is annotated to return (the function's
        own annotation or one of its overloads'), so a type checker agrees with the page:
        `compile(...) -> Compiled` must not be annotated `Any`."""
        obj = getattr(dataflow, name)
        annotations = [
            f.__annotations__.get("return", "") for f in (obj, *typing.get_overloads(obj))
        ]
        code = set().union(*(_heads(str(a)) for a in annotations))
        assert _heads(returns) <= code, (
            f"docs/api.md:{line}: {name}(...) -> {returns}, but the code is annotated to "
            f"return {' / '.join(map(str, annotations))}"
        )

    @pytest.mark.parametrize("module", PACKAGES, ids=lambda m: m.__name__)
    def test_every_public_name_is_documented(self, module: types.ModuleType) -> None:
        """Every name in a public package's __all__ is named, in backticks, on a reference
        page of docs/."""
        pages = [p for p in (ROOT / "docs").glob("*.md") if p.name not in _NOT_REFERENCE]
        lines = [line for p in pages for line in p.read_text().splitlines()]
        # Inline code, line by line (a fence's ``` would pair with the next span's backtick).
        code = " ".join(c for line in lines if "```" not in line for c in _CODE.findall(line))
        missing = [n for n in module.__all__ if not re.search(rf"\b{n}\b", code)]
        assert not missing, f"public names of {module.__name__} no page documents: {missing}"


class TestOpsTables:
    def test_rows_are_found(self) -> None:
        """The parser sees the op tables."""
        assert {"add", "sum", "matmul", "split", "softmax"} <= {n for _, n, _ in _ops_rows()}

    @pytest.mark.parametrize(("line", "name", "params"), _ops_rows(), ids=lambda v: str(v))
    def test_row_matches_op(self, line: int, name: str, params: str) -> None:
        """An op's documented parameters are its signature's (names, order and defaults):
        what `inspect.signature`, `help()` and IDEs show, its meta rule's for a declared op."""
        target = getattr(ops, name)
        # The tables show names and defaults; which operands are positional-only the prose says.
        documented = [(n, d) for n, _, d in _documented(params)]
        actual = [(n, d) for n, _, d in _actual(target)]
        assert documented == actual, (
            f"docs/ops.md:{line}: {name}({params}) differs from the code's "
            f"{name}{inspect.signature(target)}"
        )


class TestModulesTable:
    # What the note under the table gives every module: keyword-only `dtype=np.float32`,
    # `seed=` and `rng=`.
    COMMON = frozenset({("dtype", np.float32), ("seed", None), ("rng", None)})

    def _rows(self) -> list[tuple[int, str, str]]:
        rows = []
        for number, line in enumerate(MODULES.read_text().splitlines(), 1):
            match = re.match(r"^\|\s*`(?P<name>\w+)\((?P<params>[^`]*)\)`\s*\|", line)
            if match is not None:
                rows.append((number, match["name"], match["params"]))
        return rows

    def test_rows_match_the_constructors(self) -> None:
        """docs/modules.md's rows (`Linear(in_features, out_features, bias=True)`), with the
        keyword-only `dtype`, `seed` and `rng` its note gives every module, are the
        constructors' parameters."""
        rows = self._rows()
        assert {name for _, name, _ in rows} >= {"Linear", "LSTM"}
        keyword = inspect.Parameter.KEYWORD_ONLY
        for line, name, params in rows:
            documented = _documented(params)
            actual = _actual(getattr(ops.nn, name))
            message = (
                f"docs/modules.md:{line}: {name}({params}) differs from the code's "
                f"{name}{inspect.signature(getattr(ops.nn, name))}"
            )
            assert [p for p in documented if p[1] != keyword] == [
                p for p in actual if p[1] != keyword
            ], message
            assert {(n, d) for n, k, d in documented if k == keyword} | self.COMMON == {
                (n, d) for n, k, d in actual if k == keyword
            }, message
