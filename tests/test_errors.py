"""Errors users catch: a kernel's exception keeps its type across `await` (#14.2); every error
raised on purpose is a DataflowError that keeps its builtin (#17.3)."""

from __future__ import annotations

import ast
import builtins
import importlib
import pickle
import pkgutil
import textwrap
import threading
import traceback
import types
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

import dataflow
import ops
from dataflow import TaskError
from dataflow._errors import task_error_type


async def _raise(exc: Exception) -> None:
    raise exc


def _bad_kernel(x: Any, kind: str) -> Any:
    if kind == "value":
        raise ValueError("bad value in kernel")
    if kind == "key":
        raise KeyError("missing")
    if kind == "linalg":
        return np.linalg.inv(np.zeros((2, 2)))
    return x


bad = dataflow.op("bad", meta=lambda x, kind: ops.spec_of(x), handle=ops.Tensor, inline=False)(
    _bad_kernel
)


class TestOriginalType:
    def test_except_valueerror_around_await(self) -> None:
        """A kernel's ValueError is caught by `except ValueError` where it is awaited."""

        async def main() -> str:
            try:
                await bad(np.ones(2), "value")
            except ValueError as exc:
                assert isinstance(exc, TaskError)
                assert exc.op == "bad" and exc.task.startswith("bad#")
                assert isinstance(exc.__cause__, ValueError)
                return str(exc)
            return "not raised"

        assert "bad value in kernel" in dataflow.run(main)

    @pytest.mark.parametrize(
        ("kind", "expected"), [("key", KeyError), ("linalg", np.linalg.LinAlgError)]
    )
    def test_other_types(self, kind: str, expected: type[BaseException]) -> None:
        """KeyError, numpy's LinAlgError and friends keep their type too."""

        async def main() -> None:
            with pytest.raises(expected):
                await bad(np.ones(2), kind)

        dataflow.run(main)

    def test_dependents_raise_the_same_error(self) -> None:
        """Every value downstream of the failed kernel raises that same error object."""

        async def main() -> None:
            first = bad(np.ones(2), "value")
            later = ops.add(ops.tanh(first), 1.0)
            with pytest.raises(ValueError) as a:
                await later
            with pytest.raises(ValueError) as b:
                await first
            assert a.value is b.value

        dataflow.run(main)

    def test_forked_functions_keep_the_type(self) -> None:
        """An async or plain forked function's exception keeps its type at wait()."""

        async def failing() -> None:
            raise LookupError("async fork")

        def plain() -> None:
            raise ZeroDivisionError("plain fork")

        async def main() -> None:
            with pytest.raises(LookupError, match="async fork"):
                await dataflow.wait(dataflow.fork(failing))
            with pytest.raises(ZeroDivisionError, match="plain fork"):
                await dataflow.wait(dataflow.fork(plain))

        dataflow.run(main)

    def test_a_fork_that_lets_an_op_error_through_keeps_it(self) -> None:
        """A forked coroutine that awaited a failed op: its future raises a ValueError too."""

        async def child() -> Any:
            return await bad(np.ones(2), "value")

        async def main() -> None:
            with pytest.raises(ValueError, match="bad value in kernel"):
                await dataflow.fork(child)

        dataflow.run(main)

    def test_a_fork_whose_task_group_failed_raises_an_exception_group(self) -> None:
        """A forked coroutine whose task group failed: its future raises a TaskError that is
        an ExceptionGroup of the same exceptions, so ``except*`` around the ``await`` splits
        it as around the coroutine awaited directly (it was a plain TaskError: ``except*
        ValueError`` let it through, and ``except ExceptionGroup`` did not catch it)."""
        import anyio

        async def child() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_raise, ValueError("not this"))  # (both raise at their start)
                tg.start_soon(_raise, KeyError("not here"))

        async def main() -> tuple[Any, Any, Any]:
            fut = dataflow.fork(child)
            try:
                await fut
            except* ValueError as values:
                got_values = values
            except* KeyError as keys:
                got_keys = keys
            err = fut.exception()
            return got_values, got_keys, err

        values, keys, err = dataflow.run(main)
        assert [type(e) for e in values.exceptions] == [ValueError]
        assert [type(e) for e in keys.exceptions] == [KeyError]
        assert isinstance(err, TaskError) and isinstance(err, ExceptionGroup)
        assert str(err).startswith("forked task ") and "ExceptionGroup" in str(err)
        back = pickle.loads(pickle.dumps(err))
        assert isinstance(back, ExceptionGroup) and isinstance(back, TaskError)
        assert (back.task, back.op, str(back)) == (err.task, err.op, str(err))
        assert [type(e) for e in back.exceptions] == [type(e) for e in err.exceptions]

    def test_traceback_reaches_the_kernel(self) -> None:
        """The printed traceback goes down to the kernel's own frame."""

        async def main() -> str:
            try:
                await bad(np.ones(2), "value")
            except ValueError as exc:
                return "".join(traceback.format_exception(exc))
            return ""

        text = dataflow.run(main)
        assert "_bad_kernel" in text and 'raise ValueError("bad value in kernel")' in text
        assert "dataflow.TaskError[ValueError]: bad#" in text

    def test_eager_mode_too(self) -> None:
        """Outside a runtime the op raises at the call, with the same double type."""
        with pytest.raises(ValueError, match="bad value"):
            bad(np.ones(2), "value")

    def test_errors_pickle(self) -> None:
        """A TaskError[ValueError] survives pickling (e.g. sent to another process)."""
        err = task_error_type(ValueError)("t#1 failed: ValueError: x", task="t#1", op="t")
        back = pickle.loads(pickle.dumps(err))
        assert isinstance(back, ValueError) and isinstance(back, TaskError)
        assert (back.task, back.op, str(back)) == ("t#1", "t", str(err))

    def test_types_that_cannot_combine_fall_back(self) -> None:
        """BaseExceptions, StopIteration and layout conflicts give plain TaskError."""
        assert task_error_type(KeyboardInterrupt) is TaskError
        assert task_error_type(StopIteration) is TaskError
        assert task_error_type(UnicodeDecodeError) is TaskError
        assert task_error_type(ValueError) is task_error_type(ValueError)
        assert task_error_type(task_error_type(ValueError)) is task_error_type(ValueError)


# -- every error the library raises on purpose is a DataflowError (issue #17.3) ---------------

_REPO = Path(dataflow.__file__).resolve().parent.parent
_PACKAGES = ("dataflow", "ops")
_BUILTIN_ERRORS = frozenset(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
)

# Bare raises of a builtin exception that stay, keyed by (file, function) so an entry survives
# line shifts. Every entry must still match a raise: a stale one fails the test.
_ALLOWED: dict[tuple[str, str], str] = {
    ("dataflow/_trio.py", "TrioLoop._post"): (
        "RuntimeError: a wake-up posted to a finished trio run, as asyncio's "
        "call_soon_threadsafe raises on a closed loop; the runtime catches that RuntimeError"
    ),
    ("dataflow/graph/_format.py", "_create_beside"): (
        "FileExistsError: an OSError from the file system (no free temporary name)"
    ),
}

# Files whose bare raises are still to convert, because another change rewrites them; the
# entry goes once the file has none (a stale entry fails the test).
_TO_CONVERT: dict[str, str] = {}

# Exception classes the packages define that are not DataflowErrors: internal signals that
# never reach user code.
_INTERNAL_CLASSES: dict[str, str] = {
    "dataflow.graph._archive:Problem": "caught by load/read and re-raised as GraphFormatError",
    "dataflow.dask._worker:KernelFailed": "carries a kernel's error from a worker; unwrapped",
    "dataflow._timeout:LateResult": "a timed-out kernel's late result, never raised to users",
}


class _Raise(NamedTuple):
    file: str
    line: int
    function: str
    name: str


def _raised_name(node: ast.Raise) -> str | None:
    """The builtin exception a ``raise`` names (``raise X``, ``raise X(...)``), or None."""
    exc = node.exc
    target = exc.func if isinstance(exc, ast.Call) else exc
    if isinstance(target, ast.Name) and target.id in _BUILTIN_ERRORS:
        return target.id
    if (
        isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "builtins"
        and target.attr in _BUILTIN_ERRORS
    ):
        return target.attr
    return None


def _is_abstract(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The whole body (after a docstring) is one ``raise NotImplementedError``."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return (
        len(body) == 1
        and isinstance(body[0], ast.Raise)
        and _raised_name(body[0]) == "NotImplementedError"
    )


def bare_raises(source: str, file: str) -> list[_Raise]:
    """Every ``raise`` of a builtin exception in ``source`` the rule does not allow.

    Allowed: a bare ``raise``; an abstract method (its whole body ``raise
    NotImplementedError``); ``AttributeError`` from ``__getattr__`` / ``__getattribute__``.
    """
    found: list[_Raise] = []

    def visit(node: ast.AST, scope: list[str], function: ast.AST | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = child if not isinstance(child, ast.ClassDef) else function
                visit(child, [*scope, child.name], inner)
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                name = _raised_name(child)
                if name is not None and not _allowed_by_rule(name, function):
                    found.append(_Raise(file, child.lineno, ".".join(scope) or "<module>", name))
            visit(child, scope, function)

    visit(ast.parse(source, file), [], None)
    return found


def _allowed_by_rule(name: str, function: ast.AST | None) -> bool:
    if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    if name == "NotImplementedError" and _is_abstract(function):
        return True
    return name == "AttributeError" and function.name in ("__getattr__", "__getattribute__")


def _package_files() -> list[tuple[str, str]]:
    files = []
    for package in _PACKAGES:
        for path in sorted((_REPO / package).rglob("*.py")):
            files.append((path.relative_to(_REPO).as_posix(), path.read_text(encoding="utf-8")))
    return files


def _package_modules() -> list[types.ModuleType]:
    """Every module of the packages, imported by its own name (never by file path: that would
    make a second copy of the package)."""
    modules = []
    for package in (dataflow, ops):
        modules.append(package)
        prefix = package.__name__ + "."
        for info in pkgutil.walk_packages(package.__path__, prefix):
            if info.name.rpartition(".")[2] == "__main__":  # importing it runs the CLI
                continue
            modules.append(importlib.import_module(info.name))
    return modules


class TestEveryErrorIsADataflowError:
    def test_no_bare_builtin_raise(self) -> None:
        """dataflow/ and ops/ raise no builtin exception directly, outside the named sites."""
        found = [r for file, source in _package_files() for r in bare_raises(source, file)]
        left = [
            r for r in found if (r.file, r.function) not in _ALLOWED and r.file not in _TO_CONVERT
        ]
        assert left == [], "raise a DataflowError subclass of the same builtin instead:\n" + (
            "\n".join(f"{r.file}:{r.line} in {r.function}: raise {r.name}" for r in left)
        )

    def test_every_allowed_site_still_raises(self) -> None:
        """Each allow-list entry still matches a raise: the lists only shrink."""
        found = [r for file, source in _package_files() for r in bare_raises(source, file)]
        stale = sorted(set(_ALLOWED) - {(r.file, r.function) for r in found})
        stale_files = sorted(set(_TO_CONVERT) - {r.file for r in found})
        assert stale == [] and stale_files == [], "remove these allow-list entries"

    def test_every_exception_class_is_a_dataflow_error(self) -> None:
        """Exception classes the packages define derive from DataflowError (or are internal)."""
        classes: dict[str, type] = {}
        for module in _package_modules():
            for value in vars(module).values():
                if (
                    isinstance(value, type)
                    and issubclass(value, BaseException)
                    and not issubclass(value, Warning)
                    and value.__module__.split(".")[0] in _PACKAGES
                ):
                    classes[f"{value.__module__}:{value.__qualname__}"] = value
        assert len(classes) > 10  # the walk found the hierarchy
        bad = sorted(
            name
            for name, cls in classes.items()
            if not issubclass(cls, dataflow.DataflowError) and name not in _INTERNAL_CLASSES
        )
        assert bad == [], "derive these from dataflow.DataflowError"
        stale = sorted(set(_INTERNAL_CLASSES) - set(classes))
        assert stale == [], "remove these entries from _INTERNAL_CLASSES"

    def test_the_scanner_finds_a_bare_raise(self) -> None:
        """The scan sees each form of a bare raise, and lets the allowed forms through."""
        source = textwrap.dedent(
            '''
            import builtins

            def check(x):
                if x:
                    raise ValueError("bad x")
                raise TypeError

            class Thing:
                def method(self):
                    raise builtins.RuntimeError()

                def abstract(self):
                    """Subclasses define it."""
                    raise NotImplementedError

                def not_abstract(self, x):
                    if x:
                        return 1
                    raise NotImplementedError("only some cases")

                def __getattr__(self, name):
                    raise AttributeError(name)

                def elsewhere(self):
                    raise AttributeError("not the attribute protocol")

            def reraise():
                try:
                    pass
                except Exception:
                    raise

            def fine():
                raise dataflow.DataflowValueError("ok")

            raise LookupError("at module level")
            '''
        )
        found = [(r.line, r.function, r.name) for r in bare_raises(source, "sample.py")]
        assert found == [
            (6, "check", "ValueError"),
            (7, "check", "TypeError"),
            (11, "Thing.method", "RuntimeError"),
            (20, "Thing.not_abstract", "NotImplementedError"),
            (26, "Thing.elsewhere", "AttributeError"),
            (37, "<module>", "LookupError"),
        ]


_NOT_CALLABLE: Any = 5


def _double(x: Any) -> Any:
    return ops.add(x, x)


def _graph() -> dataflow.Graph:
    return dataflow.trace(_double, np.ones(3), check=False)


def _shared_pool_resize() -> None:
    async def main() -> None:
        running = dataflow.get_num_interop_threads()
        dataflow.set_num_interop_threads(running + 1)

    dataflow.run(main)


def _shared_pool_clash() -> None:
    async def main() -> None:
        async with dataflow.Runtime(interop_threads=dataflow.get_num_interop_threads() + 1):
            pass

    dataflow.run(main)


async def _nothing() -> None:
    return None


def _shared_pool_clash_from_thread() -> None:
    async def main() -> None:
        size = dataflow.get_num_interop_threads()
        errors: list[BaseException] = []

        def other() -> None:
            try:
                dataflow.run(_nothing, interop_threads=size + 1)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()  # (blocks the loop: nothing else runs meanwhile)
        if errors:
            raise errors[0]

    dataflow.run(main)


def _bad_env_interop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAFLOW_NUM_INTEROP_THREADS", "many")
    from dataflow._threads import default_interop_threads

    default_interop_threads()


def _unknown_op_on_worker() -> None:
    from dataflow.dask._worker import _declared

    _declared("ops:no_such_op")


def _bad_trace_file(tmp_path: Path) -> None:
    from dataflow._traceread import load

    path = tmp_path / "t.json"
    path.write_text("{not json")
    load(path)


def _read_then_run(tmp_path: Path) -> None:
    path = str(tmp_path / "g.dfg")
    _graph().save(path)
    dataflow.graph.read(path).run(np.ones(3))


def _render_arrows() -> None:
    from dataflow._render import render_svg
    from dataflow._trace import Trace

    render_svg(Trace(tasks=[], threads={}), arrows="some")


# (name, the builtin a user catches, the call) for errors that used to be bare builtins.
_CONVERTED: list[tuple[str, type[BaseException], Any]] = [
    ("set_num_interop_threads while running", RuntimeError, lambda mp, tmp: _shared_pool_resize()),
    (
        "Runtime(interop_threads=) clashing with the shared pool",
        RuntimeError,
        lambda mp, tmp: _shared_pool_clash(),
    ),
    (
        "run(interop_threads=) in another thread clashing with the shared pool",
        RuntimeError,
        lambda mp, tmp: _shared_pool_clash_from_thread(),
    ),
    ("$DATAFLOW_NUM_INTEROP_THREADS", ValueError, lambda mp, tmp: _bad_env_interop(mp)),
    ("op missing on a Dask worker", LookupError, lambda mp, tmp: _unknown_op_on_worker()),
    ("trace(non-callable)", TypeError, lambda mp, tmp: dataflow.trace(_NOT_CALLABLE, np.ones(3))),
    ("graph inputs count", TypeError, lambda mp, tmp: _graph().run(np.ones(3), np.ones(3))),
    ("optimize(engine=)", ValueError, lambda mp, tmp: _graph().optimize(engine="fast")),
    ("read graph run", TypeError, lambda mp, tmp: _read_then_run(tmp)),
    ("trace file", ValueError, lambda mp, tmp: _bad_trace_file(tmp)),
    ("render_svg(arrows=)", ValueError, lambda mp, tmp: _render_arrows()),
    ("len(0-d Tensor)", TypeError, lambda mp, tmp: len(ops.asarray(np.float64(1.0)))),
    ("nn.Linear(0, 3)", ValueError, lambda mp, tmp: ops.nn.Linear(0, 3)),
    (
        "seed and rng",
        ValueError,
        lambda mp, tmp: ops.nn.Linear(2, 3, seed=1, rng=np.random.default_rng(1)),
    ),
]


class TestConvertedErrorsKeepTheirBuiltin:
    @pytest.mark.parametrize(
        ("builtin", "call"), [c[1:] for c in _CONVERTED], ids=[c[0] for c in _CONVERTED]
    )
    def test_caught_by_the_builtin_and_by_dataflow_error(
        self,
        builtin: type[BaseException],
        call: Any,
        monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path,
    ) -> None:
        """`except TypeError/ValueError/RuntimeError/LookupError` still catches each one."""
        try:
            call(monkeypatch, tmp_path)
        except builtin as exc:
            assert isinstance(exc, dataflow.DataflowError), repr(exc)
            assert not isinstance(exc, dataflow.TaskError)  # raised at the call, not at await
        else:
            pytest.fail(f"no {builtin.__name__} raised")


# -- arguments checked at the call, naming the argument (#19.9, #18.2) ------------------------


class TestCostChecksItsFields:
    @pytest.mark.parametrize(
        ("flops", "nbytes", "error", "field"),
        [
            ("a", "b", dataflow.DataflowTypeError, "flops"),
            (1.0, "8", dataflow.DataflowTypeError, "bytes"),
            (True, 0.0, dataflow.DataflowTypeError, "flops"),
            (1.0, np.bool_(False), dataflow.DataflowTypeError, "bytes"),
            (None, 0.0, dataflow.DataflowTypeError, "flops"),
            (1 + 2j, 0.0, dataflow.DataflowTypeError, "flops"),
            (-1, 0, dataflow.DataflowValueError, "flops"),
            (0.0, -0.5, dataflow.DataflowValueError, "bytes"),
            (float("nan"), 0.0, dataflow.DataflowValueError, "flops"),
            (0.0, np.float32("nan"), dataflow.DataflowValueError, "bytes"),
            (np.int64(-3), 0.0, dataflow.DataflowValueError, "flops"),
        ],
    )
    def test_refused_naming_the_field(
        self, flops: Any, nbytes: Any, error: type[Exception], field: str
    ) -> None:
        """A field that is not a number >= 0 raises, naming the field."""
        with pytest.raises(error, match=rf"Cost\({field}=\.\.\.\)"):
            dataflow.Cost(flops, nbytes)
        with pytest.raises(error, match=rf"Cost\({field}=\.\.\.\)"):
            dataflow.Cost(flops=flops, bytes=nbytes)

    def test_numbers_accepted(self) -> None:
        """Ints, floats, numpy scalars (made Python floats), inf and the defaults are costs."""
        assert dataflow.Cost(1, 8) == (1, 8)
        assert dataflow.Cost(2.5, 0.0) == (2.5, 0.0)
        four: Any = np.int64(4)
        eight: Any = np.float32(8.0)
        numpy_cost = dataflow.Cost(four, eight)
        assert numpy_cost == (4.0, 8.0)
        assert [type(v) for v in numpy_cost] == [float, float]
        assert dataflow.Cost(float("inf"), 0) == (float("inf"), 0)
        assert dataflow.Cost() == (0.0, 0.0)
        assert dataflow.Cost(bytes=3) == (0.0, 3)

    def test_replace_make_and_pickle_check_too(self) -> None:
        """_replace, _make and unpickling build a checked Cost; the type stays a NamedTuple."""
        cost = dataflow.Cost(1.0, 2.0)
        assert cost._replace(bytes=5.0) == (1.0, 5.0)
        assert type(cost._replace(bytes=5.0)) is dataflow.Cost
        with pytest.raises(dataflow.DataflowValueError, match="bytes"):
            cost._replace(bytes=-1.0)
        with pytest.raises(dataflow.DataflowTypeError, match="flops"):
            dataflow.Cost._make(["x", 1.0])
        again = pickle.loads(pickle.dumps(cost))
        assert again == cost and type(again) is dataflow.Cost
        assert dataflow.Cost._fields == ("flops", "bytes")
        assert repr(cost) == "Cost(flops=1.0, bytes=2.0)"

    def test_errors_keep_their_builtin(self) -> None:
        """`except TypeError` / `except ValueError` still catch them."""
        text: Any = "a"
        with pytest.raises(TypeError):
            dataflow.Cost(text, text)
        with pytest.raises(ValueError):
            dataflow.Cost(-1.0, 0.0)


def _identity(x: Any) -> Any:
    return x


class TestCostRuleResult:
    @pytest.mark.parametrize("returned", [3, (1.0, 2.0), None, "cheap"], ids=repr)
    def test_not_a_cost_fails_at_the_call_naming_the_op(self, returned: Any) -> None:
        """A cost rule returning anything but a Cost fails where the op is called."""
        name = f"cost_returns_{type(returned).__name__}"
        liar = dataflow.op(
            name, meta=ops.spec_of, handle=ops.Tensor, cost=lambda x: returned, inline=False
        )(_identity)
        reached_await = False

        async def main() -> None:
            nonlocal reached_await
            y = liar(np.ones(3))
            reached_await = True
            await y

        with pytest.raises(dataflow.DataflowTypeError, match=rf"op '{name}': its cost rule"):
            dataflow.run(main)
        assert not reached_await

    def test_a_cost_runs(self) -> None:
        """A cost rule that returns a Cost (ints included) runs as before."""
        fine = dataflow.op(
            "cost_returns_cost",
            meta=ops.spec_of,
            handle=ops.Tensor,
            cost=lambda x: dataflow.Cost(1, 8),
        )(_identity)

        async def main() -> Any:
            return await fine(np.ones(3))

        np.testing.assert_array_equal(dataflow.run(main), np.ones(3))


async def _getitem_program(x: Any) -> Any:
    return ops.getitem(x, (slice(0, 2), Ellipsis))


class TestLoadTrust:
    @pytest.fixture
    def saved(self, tmp_path: Path) -> str:
        path = str(tmp_path / "g.dfg")
        dataflow.trace(_getitem_program, np.ones((3, 4))).save(path)
        return path

    @pytest.mark.parametrize(
        ("trust", "error"),
        [
            (5, dataflow.DataflowTypeError),
            (None, dataflow.DataflowTypeError),
            (b"ops", dataflow.DataflowTypeError),
            ([5], dataflow.DataflowTypeError),
            (["ops", b"dataflow"], dataflow.DataflowTypeError),
            ("ops.", dataflow.DataflowValueError),
            ("", dataflow.DataflowValueError),
            (["ops", "my-package"], dataflow.DataflowValueError),
        ],
        ids=repr,
    )
    def test_refused_naming_trust(self, saved: str, trust: Any, error: type[Exception]) -> None:
        """trust is a module name or an iterable of them; anything else names `trust`."""
        with pytest.raises(error, match=r"load\(trust=\.\.\.\)"):
            dataflow.load(saved, trust=trust)

    @pytest.mark.parametrize(
        "trust", ["ops", ["ops"], ("ops", "dataflow"), {"ops"}, iter(["ops.nn"]), ()], ids=repr
    )
    def test_module_names_accepted(self, saved: str, trust: Any) -> None:
        """A name, a list, tuple, set or iterator of names, or nothing, all load."""
        graph = dataflow.load(saved, trust=trust)
        np.testing.assert_array_equal(graph.run(np.ones((3, 4))), np.ones((2, 4)))

    def test_a_negative_cost_in_the_file_is_a_format_error(self, saved: str) -> None:
        """A file whose dataflow.Cost argument has a negative field: GraphFormatError."""
        import json
        import zipfile

        with zipfile.ZipFile(saved) as zf:
            members = {name: zf.read(name) for name in zf.namelist()}
        doc = json.loads(members["graph.json"])
        (node,) = [n for n in doc["nodes"] if n["op"] == "ops._indexing:getitem"]
        node["args"][1] = {"namedtuple": "dataflow._task:Cost", "fields": [-1.0, 8.0]}
        members["graph.json"] = json.dumps(doc).encode()
        with zipfile.ZipFile(saved, "w") as zf:
            for name, data in members.items():
                zf.writestr(name, data)
        with pytest.raises(dataflow.GraphFormatError, match=r"Cost\(flops=\.\.\.\) must be"):
            dataflow.load(saved)


class TestTraceCheckFlag:
    @pytest.mark.parametrize("check", ["no", "False", 0, 1, None], ids=repr)
    def test_not_a_bool_is_refused(self, check: Any) -> None:
        """trace(check=) is True or False; a string used to be read as True."""
        with pytest.raises(dataflow.DataflowTypeError, match=r"trace\(check=\.\.\.\)"):
            dataflow.trace(_getitem_program, np.ones((3, 4)), check=check)

    @pytest.mark.parametrize("check", [True, False])
    def test_bools_trace(self, check: bool) -> None:
        """True and False both give the graph."""
        graph = dataflow.trace(_getitem_program, np.ones((3, 4)), check=check)
        np.testing.assert_array_equal(graph.run(np.ones((3, 4))), np.ones((2, 4)))
