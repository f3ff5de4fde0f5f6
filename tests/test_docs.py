"""The Python examples of README.md and docs/*.md run, and print what they say they print.

Each page's ```python blocks run in order in one fresh interpreter per page
(tests/_docs_runner.py), in a temporary folder (files an example writes land there), with the
repository root importable (`from examples.lstm_ensemble import Ensemble` works), sharing one
namespace like the cells of a notebook. The namespace starts with `import numpy as np`,
`import dataflow` and `import ops`, and its `__name__` is `"__main__"`. Warnings are errors,
as in the rest of the suite. Shell, console, text and JSON blocks are never run.

How to write an example so that this test keeps it honest:

* A Python block runs as it stands, after the page's earlier blocks. Prefer making an example
  run (define the names it uses, put `await` inside an `async def`) over marking it.
* A one-line `print(...)` whose comment starts with `# ->` must print exactly the text after
  the arrow (trailing spaces aside): `print(out.shape)   # -> (8,)`. Use it only where the
  output is deterministic; any other comment is prose and is not checked.
* A block that cannot run gets an HTML comment on the line right before its opening fence:

  - `<!-- docs-test: skip (REASON) -->`: not run (a fragment that uses names defined only in
    the prose, or that needs a Dask cluster or a web server). The reason is required. A
    skipped block must still parse as Python.
  - `<!-- docs-test: expect NAME -->`, optionally followed by `(REASON)`: the block shows a
    warning or an error on purpose. It must warn or raise NAME (a class name, such as
    `TracerWarning` or `OpInputError`) or a subclass of it; its other warnings are allowed.
  - `<!-- docs-test: output -->` before a fence of any kind: that fence holds all that the
    page's previous Python block prints.

  A marker anywhere else, a skip without a reason, an expect without a name, or an unknown
  marker fails the test, and so does a Python block that neither runs nor is marked.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import pytest

import dataflow

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON_INFO = {"python", "py", "python3"}
PAGE_TIMEOUT_S = 90  # a page takes about 0.3-2.5 s on 2 cores

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:(?P<body>.*?)-->\s*$")
_MARKER_BODY = re.compile(
    r"^\s*(?:(?P<skip>skip)|(?P<output>output)|expect\s+(?P<expect>[A-Za-z_]\w*))"
    r"\s*(?:\((?P<reason>.*)\))?\s*$"
)
_ARROW = re.compile(r"#\s*->\s?(?P<text>.*)$")
_ONE_LINE_PRINT = re.compile(r"^\s*print\(.*\)\s*$")


class MarkerError(Exception):
    """A docs-test marker (or a `# ->` comment) that breaks the rules above."""


@dataclass
class Block:
    """One fenced block; `line` is the markdown line of its first line of content."""

    info: str
    line: int
    source: str
    skip: str | None = None  # the reason
    expect: str | None = None  # the class name
    output: bool = False
    checks: dict[int, str] = field(default_factory=dict)  # markdown line: expected print

    @property
    def python(self) -> bool:
        words = self.info.split()
        return bool(words) and words[0].lower() in PYTHON_INFO

    @property
    def runs(self) -> bool:
        return self.python and self.skip is None


class Result(TypedDict):
    """What tests/_docs_runner.py reports for one block."""

    line: int
    ok: bool
    error: str | None
    stdout: str
    seconds: float
    checked: list[int]


def _marker(text: str, where: str) -> tuple[str, str | None] | None:
    """("skip", reason), ("expect", name) or ("output", None) for a marker line, else None."""
    m = _MARKER.match(text)
    if m is None:
        if re.search(r"<!--\s*docs-test", re.sub(r"`[^`]*`", "", text)):  # code spans aside
            raise MarkerError(f"{where}: a docs-test marker must be a line of its own: {text!r}")
        return None
    body = _MARKER_BODY.match(m["body"])
    if body is None:
        raise MarkerError(f"{where}: unknown docs-test marker {text.strip()!r}")
    reason = (body["reason"] or "").strip()
    if body["skip"]:
        if not reason:
            raise MarkerError(f"{where}: `docs-test: skip` needs a reason: skip (REASON)")
        return "skip", reason
    if body["output"]:
        if body["reason"] is not None:
            raise MarkerError(f"{where}: `docs-test: output` takes no reason")
        return "output", None
    return "expect", body["expect"]


def _arrows(block: Block, name: str) -> dict[int, str]:
    """The block's `print(...)  # -> TEXT` lines: {markdown line: TEXT}."""
    checks: dict[int, str] = {}
    for offset, text in enumerate(block.source.splitlines()):
        code, sep, comment = text.partition("#")
        m = _ARROW.match(sep + comment) if sep else None
        if m is None:
            continue
        line = block.line + offset
        if not _ONE_LINE_PRINT.match(code):
            raise MarkerError(f"{name}:{line}: `# ->` may only end a one-line print(...)")
        checks[line] = m["text"].rstrip()
    return checks


def parse_page(text: str, name: str) -> list[Block]:
    """The fenced blocks of a markdown page, with their markers; MarkerError if one is wrong."""
    lines = text.splitlines()
    blocks: list[Block] = []
    pending: tuple[int, str, str | None] | None = None  # the marker's line, kind, value

    def dangling() -> MarkerError:
        assert pending is not None
        return MarkerError(f"{name}:{pending[0]}: a docs-test marker must be right before a fence")

    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            if pending is not None:
                raise dangling()
            found = _marker(lines[i], f"{name}:{i + 1}")
            if found is not None:
                pending = (i + 1, *found)
            i += 1
            continue
        char, width = fence["fence"][0], len(fence["fence"])
        closing = re.compile(rf"^[ \t]*{re.escape(char)}{{{width},}}[ \t]*$")
        end = i + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        source = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
        block = Block(info=fence["info"].strip(), line=i + 2, source=source)
        if pending is not None:
            kind, value = pending[1], pending[2]
            if kind == "output":
                block.output = True
            elif not block.python:
                raise MarkerError(f"{name}:{pending[0]}: `docs-test: {kind}` marks Python only")
            elif kind == "skip":
                block.skip = value
            else:
                block.expect = value
            pending = None
        if block.python:
            block.checks = _arrows(block, name)
        blocks.append(block)
        i = end + 1
    if pending is not None:
        raise dangling()
    return blocks


def run_page(path: Path, blocks: list[Block], tmp_path: Path) -> list[Result]:
    """Run the page's blocks in a fresh interpreter: one result per block that finished."""
    runnable = [b for b in blocks if b.runs]
    spec = {
        "path": str(path),
        "blocks": [{"line": b.line, "source": b.source, "expect": b.expect} for b in runnable],
        "checks": {str(line): text for b in runnable for line, text in b.checks.items()},
    }
    spec_path, results_path = tmp_path / "spec.json", tmp_path / "results.jsonl"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATAFLOW_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "tests._docs_runner", str(spec_path), str(results_path)]
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=PAGE_TIMEOUT_S
        )
        failure = f"exit status {proc.returncode}" if proc.returncode else None
        stderr = proc.stderr
    except subprocess.TimeoutExpired as exc:
        failure = f"timed out after {PAGE_TIMEOUT_S} s"
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    text = results_path.read_text(encoding="utf-8") if results_path.exists() else ""
    records = [json.loads(line) for line in text.splitlines()]
    header: dict[str, str] = records[0] if records else {}
    results: list[Result] = records[1:]
    if failure is None and len(results) < len(runnable):
        failure = "it stopped early"
    if failure is not None:
        done = len(results)
        at = f"line {runnable[done].line}" if done < len(runnable) else "its end"
        pytest.fail(f"{path.name}: the examples' process failed at {at}: {failure}\n{stderr}")
    assert header.get("dataflow") == dataflow.__file__, (
        f"the examples ran against {header.get('dataflow')}, the tests against {dataflow.__file__}"
    )
    return results


def page_failures(name: str, blocks: list[Block], results: list[Result]) -> list[str]:
    """What is wrong with a page's run: blocks that failed, outputs that differ."""
    failures = [f"{name}:{r['line']}:\n{r['error']}" for r in results if not r["ok"]]
    by_line = {r["line"]: r for r in results}
    checked = {line for r in results for line in r["checked"]}
    previous: Block | None = None
    for b in blocks:
        if b.output:
            shown = b.source.rstrip()
            if previous is None or previous.line not in by_line:
                failures.append(f"{name}:{b.line}: `docs-test: output` follows no block that ran")
            elif (printed := by_line[previous.line]["stdout"].rstrip()) != shown:
                failures.append(
                    f"{name}:{b.line}: the block above prints\n{printed}\nand the docs say\n{shown}"
                )
        if b.python:
            previous = b
            ran_ok = b.line in by_line and by_line[b.line]["ok"]
            failures += [
                f"{name}:{line}: this `print(...)  # -> ...` never ran"
                for line in b.checks
                if ran_ok and line not in checked
            ]
    return failures


def check_page(path: Path, tmp_path: Path) -> list[str]:
    """Parse, syntax-check and run one page; the failures found."""
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    blocks = parse_page(path.read_text(encoding="utf-8"), name)
    for b in blocks:
        if b.python:
            try:
                ast.parse(b.source)
            except SyntaxError as exc:
                return [f"{name}:{b.line - 1 + (exc.lineno or 1)}: not Python: {exc.msg}"]
    if not any(b.runs for b in blocks):
        return []
    return page_failures(name, blocks, run_page(path, blocks, tmp_path))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples(page: Path, tmp_path: Path) -> None:
    """Every Python block of the page runs or is marked, and prints what the page says."""
    failures = check_page(page, tmp_path)
    assert not failures, "\n\n".join(failures)


def test_every_python_block_is_seen() -> None:
    """The pages hold about 32 Python blocks; a fence the parser misread would lose some."""
    blocks = [
        b
        for page in PAGES
        for b in parse_page(page.read_text(encoding="utf-8"), page.name)
        if b.python
    ]
    raw = sum(page.read_text(encoding="utf-8").count("```python\n") for page in PAGES)
    assert len(blocks) == raw >= 30


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("<!-- docs-test: skip -->\n```python\nx\n```\n", "needs a reason"),
        ("<!-- docs-test: skip () -->\n```python\nx\n```\n", "needs a reason"),
        ("<!-- docs-test: expect -->\n```python\nx\n```\n", "unknown docs-test marker"),
        ("<!-- docs-test: skipp (typo) -->\n```python\nx\n```\n", "unknown docs-test marker"),
        ("<!-- docs-test: skip (why) -->\n\n```python\nx\n```\n", "right before a fence"),
        ("<!-- docs-test: skip (why) -->\n", "right before a fence"),
        ("<!-- docs-test: skip (why) -->\n```bash\nls\n```\n", "marks Python only"),
        ("<!-- docs-test: output (why) -->\n```\n1\n```\n", "takes no reason"),
        ("text <!-- docs-test: skip (why) -->\n```python\nx\n```\n", "a line of its own"),
        ("```python\nx = 1  # -> 1\n```\n", "one-line print"),
    ],
)
def test_marker_rules(text: str, says: str) -> None:
    with pytest.raises(MarkerError, match=re.escape(says)):
        parse_page(text, "page.md")


def test_marker_forms() -> None:
    text = textwrap.dedent(
        """\
        <!-- docs-test: skip (fragment: needs a running server) -->
        ```python
        await serve()
        ```

        <!-- docs-test: expect TracerWarning -->
        ```python
        trace(model)
        ```

        - a list item:

          ```python
          print(np.ones(1))   # -> [1.]
          ```
        """
    )
    skip, expect, item = parse_page(text, "page.md")
    assert skip.skip == "fragment: needs a running server" and not skip.runs
    assert expect.expect == "TracerWarning" and expect.runs
    assert item.source == "print(np.ones(1))   # -> [1.]\n" and item.checks == {14: "[1.]"}


def test_a_broken_page_fails(tmp_path: Path) -> None:
    """Each rule catches what it is for: the test is not vacuous."""
    page = tmp_path / "broken.md"
    page.write_text(
        textwrap.dedent(
            """\
            ```python
            y = np.ones(2)
            print(y.shape)      # -> (3,)
            ```

            ```python
            print(undefined_name)
            ```

            <!-- docs-test: expect UserWarning -->
            ```python
            z = 1
            ```

            ```python
            print("a")
            ```

            <!-- docs-test: output -->
            ```
            b
            ```

            ```python
            def f():
                print(1)    # -> 1
            ```

            <!-- docs-test: expect ZeroDivisionError -->
            ```python
            1 / 0
            ```

            <!-- docs-test: expect RuntimeWarning -->
            ```python
            import warnings
            warnings.warn("on purpose", RuntimeWarning)
            ```
            """
        ),
        encoding="utf-8",
    )
    run = tmp_path / "run"
    run.mkdir()
    failures = "\n".join(check_page(page, run))
    assert "line 3 printed '(2,)', the docs say '(3,)'" in failures
    assert "NameError: name 'undefined_name' is not defined" in failures
    assert "marked to expect UserWarning, and it raised or warned nothing" in failures
    assert "broken.md:21: the block above prints\na\nand the docs say\nb" in failures
    assert "broken.md:26: this `print(...)  # -> ...` never ran" in failures
    assert "ZeroDivisionError" not in failures and "RuntimeWarning" not in failures
    assert failures.count("broken.md:") == 5
