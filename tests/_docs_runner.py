"""Runs one documentation page's Python blocks in this process, for tests/test_docs.py.

    python -m tests._docs_runner SPEC.json RESULTS.jsonl

SPEC.json holds the page's path and its blocks to run, in order (test_docs.py reads the
markdown and its markers; this module knows nothing of markdown). The blocks share one
namespace, a module installed as `__main__` (so `if __name__ == "__main__":` runs), which
starts with `import numpy as np`, `import dataflow` and `import ops`. Each block is compiled
with its page's path and the block's own line numbers, so a traceback points at the markdown.

After each block, one JSON line goes to RESULTS.jsonl (flushed, so a page that hangs still
tells which block finished last): `line`, `ok`, `error` (a traceback or a message), `stdout`,
`seconds`, and `checked` (the lines of `print(...)  # -> ...` calls that printed what they
say). Warnings are errors in a block, except in one marked to expect a warning or an error:
there they are recorded, and the block must raise or warn the named class (or a subclass).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import sys
import time
import traceback
import types
import warnings
from typing import Any, TextIO

PRELUDE = "import numpy as np\nimport dataflow\nimport ops\n"


def _names(cls: type) -> set[str]:
    return {c.__name__ for c in cls.__mro__}


class _CheckedPrint:
    """`print` for the page: a call on a line with `# -> TEXT` must print exactly TEXT."""

    def __init__(self, path: str, checks: dict[int, str]) -> None:
        self.path = path
        self.checks = checks
        self.checked: list[int] = []
        self.mismatches: list[str] = []

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        frame = sys._getframe(1)
        line = frame.f_lineno
        if (
            kwargs.get("file") is not None
            or frame.f_code.co_filename != self.path
            or line not in self.checks
        ):
            builtins.print(*args, **kwargs)  # noqa: T201 (the examples' own print)
            return
        buf = io.StringIO()
        builtins.print(*args, **kwargs, file=buf)
        sys.stdout.write(buf.getvalue())
        printed, expected = buf.getvalue().rstrip(), self.checks[line]
        if printed == expected:
            self.checked.append(line)
        else:
            self.mismatches.append(f"line {line} printed {printed!r}, the docs say {expected!r}")


def _format(exc: BaseException) -> str:
    """The traceback from the block's own frames on (this module's `exec` left out)."""
    tb = exc.__traceback__
    if tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _run_block(
    block: dict[str, Any], path: str, namespace: dict[str, Any], printer: _CheckedPrint
) -> dict[str, Any]:
    line: int = block["line"]
    expect: str | None = block["expect"]
    out = io.StringIO()
    error: str | None = None
    started = time.perf_counter()
    printer.checked, printer.mismatches = [], []
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
        warnings.simplefilter("always" if expect else "error")
        try:
            code = compile("\n" * (line - 1) + block["source"], path, "exec")
            exec(code, namespace)
            raised: BaseException | None = None
        except Exception as exc:
            raised = exc
    seconds = time.perf_counter() - started
    if expect is None:
        if raised is not None:
            error = _format(raised)
    else:
        got = [type(raised)] if raised is not None else []
        got += [w.category for w in caught]
        if not any(expect in _names(cls) for cls in got):
            shown = ", ".join(cls.__name__ for cls in got) or "nothing"
            error = f"the block is marked to expect {expect}, and it raised or warned {shown}"
            if raised is not None:
                error += "\n" + _format(raised)
    if printer.mismatches:
        error = "\n".join([*printer.mismatches, *([error] if error else [])])
    return {
        "line": line,
        "ok": error is None,
        "error": error,
        "stdout": out.getvalue(),
        "seconds": round(seconds, 3),
        "checked": printer.checked,
    }


def run_page(spec: dict[str, Any], results: TextIO) -> None:
    path: str = spec["path"]
    checks = {int(k): v for k, v in spec["checks"].items()}
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    namespace = module.__dict__
    printer = _CheckedPrint(path, checks)
    exec(compile(PRELUDE, "<docs prelude>", "exec"), namespace)
    namespace["print"] = printer
    results.write(json.dumps({"dataflow": namespace["dataflow"].__file__}) + "\n")
    results.flush()
    for block in spec["blocks"]:
        results.write(json.dumps(_run_block(block, path, namespace, printer)) + "\n")
        results.flush()


def main(argv: list[str]) -> None:
    spec_path, results_path = argv
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    with open(results_path, "w", encoding="utf-8") as results:
        run_page(spec, results)


if __name__ == "__main__":
    main(sys.argv[1:])
