"""A differential fuzzer of op programs across execution modes (programs: tests/_ops_programs).

Each seed draws a random program of 5-30 ops (tests/_ops_programs.py says what it draws) and
runs it as plain numpy, then

* eagerly under dataflow (``dataflow.run``; inputs done or pending Tensors, ops inline or
  all on the pool),
* traced (``dataflow.trace``, as a function or as a module whose parameters are the
  program's constant arrays) and run as the graph, after each pass of docs/graph.md alone,
  after ``optimize()`` with either fusion engine, and saved and loaded (``Graph.save``,
  ``dataflow.load``), plain and optimized, on the traced inputs and on fresh ones,
* compiled (``dataflow.compile``): the first call, the cached call, fresh inputs.

Every mode must give numpy's values (NaN equal to NaN; ints and bools exact, floats to a
tolerance for their width), dtypes, shapes and output structure, and the passes the unoptimized
graph's bits; where numpy raises, every mode must raise a ``DataflowError`` of numpy's builtin
class at the op call that numpy refused (the graph modes have no graph then). Known deviations
are left out of the draws (tests/_ops_programs.py). ``DATAFLOW_FUZZ_SEEDS=3000`` runs more
seeds than CI's default (about 80 ms a seed).
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow import DataflowError
from dataflow.graph import (
    Graph,
    eliminate_common_subexpressions,
    eliminate_dead_code,
    fold_constants,
    fold_stack_reductions,
    fuse_elementwise,
)
from tests._ops_programs import (
    STRUCTURES,
    Program,
    draw,
    flatten,
    interpret,
    interpret_forking,
)
from tests.test_ops_fuzz import _pending

SEEDS = int(os.environ.get("DATAFLOW_FUZZ_SEEDS", "120"))
PASSES = {
    "fold_constants": fold_constants,
    "cse": eliminate_common_subexpressions,
    "fold_stack_reductions": fold_stack_reductions,
    "dead_code": eliminate_dead_code,
    "fuse": fuse_elementwise,
}
try:
    import numexpr  # noqa: F401

    ENGINES = ["numpy", "numexpr"]
except ImportError:  # pragma: no cover - numexpr is a dev dependency
    ENGINES = ["numpy"]


def _builtin_bases(exc: BaseException) -> tuple[type[BaseException], ...]:
    """numpy's error's builtin classes (an AxisError is a ValueError and an IndexError)."""
    return tuple(
        c
        for c in type(exc).__mro__
        if c.__module__ == "builtins" and c not in (Exception, BaseException, object)
    )


def _program_fn(program: Program, failed: list[int], wrap: Any = None) -> Any:
    async def program_fn(*xs: Any) -> Any:
        if wrap is not None:
            xs = tuple(wrap(x) for x in xs)
        return await interpret_forking(program, xs, failed)

    return program_fn


class _ProgramModule(ops.nn.Module):
    """The program as a module whose parameters are the program's constant arrays (a trace
    records them as parameters: never folded nor merged, saved by name)."""

    def __init__(self, program: Program, failed: list[int]) -> None:
        self._program, self._failed = program, failed
        for k, a in enumerate(_arrays(program)):
            setattr(self, f"p{k}", a)

    async def forward(self, *xs: Any) -> Any:
        return await interpret_forking(self._program, xs, self._failed)


def _arrays(program: Program) -> list[np.ndarray[Any, Any]]:
    found: dict[int, np.ndarray[Any, Any]] = {}

    def walk(a: Any) -> None:
        if isinstance(a, np.ndarray):
            found.setdefault(id(a), a)
        elif type(a) in (list, tuple):
            for v in a:
                walk(v)

    for step in program.steps:
        walk(step.args)
    return list(found.values())


def _traced_fn(program: Program, failed: list[int]) -> Any:
    """What the graph modes trace: the program as a function, or (a third of the seeds) as
    a module of parameters."""
    if program.seed % 3 == 1:
        return _ProgramModule(program, failed)
    return _program_fn(program, failed)


def _eager_fn(program: Program, failed: list[int]) -> Any:
    """The program run eagerly on Tensors (as a traced program gets them, so numpy code on an
    input dispatches to ops): done ones for even seeds, pending ones for odd seeds."""
    return _program_fn(program, failed, _pending if program.seed % 2 else ops.asarray)


def _run_eagerly(program: Program, fn: Any) -> Any:
    """``dataflow.run(fn, *inputs)``; every third seed with every op on the pool."""
    if program.seed % 3:
        return dataflow.run(fn, *program.inputs)
    old = dataflow.get_inline_threshold()
    dataflow.set_inline_threshold(0.0)
    try:
        return dataflow.run(fn, *program.inputs, interop_threads=2)
    finally:
        dataflow.set_inline_threshold(old)


def _structure(value: Any) -> Any:
    """The containers of a program's outputs, leaves left out."""
    if isinstance(value, dict):
        return (dict, tuple((k, _structure(v)) for k, v in value.items()))
    if type(value) in (list, tuple):
        return (type(value), tuple(_structure(v) for v in value))
    return None


def _compare(
    mode: str, program: Program, got: Any, expected: tuple[Any, ...], *, exact: bool = False
) -> None:
    """``got`` is ``expected``: dtypes, shapes and values (floats to a tolerance unless
    ``exact``: bit for bit but NaN, as the same kernels on the same arrays give)."""
    if not exact:  # (exact: against another mode's outputs, already flat)
        want = STRUCTURES[program.structure]([None] * len(expected))
        assert _structure(got) == _structure(want), f"{mode}: {got!r:.300}\n{program!r}"
        got = flatten(got)
    assert len(got) == len(expected), (mode, got, program)
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        g, e = np.asarray(g), np.asarray(e)
        where = f"{mode}: output {k} of\n{program!r}\n"
        assert (g.dtype, g.shape) == (e.dtype, e.shape), (
            f"{where}got {g.dtype}{g.shape}, want {e.dtype}{e.shape}"
        )
        if e.dtype.kind == "f" and not exact:
            # (numexpr rounds float32 steps otherwise, and a float64 value may come from one)
            tol = 1e-4 if e.dtype.itemsize == 4 else 1e-9
            tol = 1e-3 if "numexpr" in mode else tol
            ok = np.isclose(g, e, rtol=tol, atol=tol, equal_nan=True)
            assert ok.all(), f"{where}got {g}\nwant {e}"
        else:
            assert np.array_equal(g, e, equal_nan=e.dtype.kind == "f"), f"{where}got {g}\nwant {e}"


def _expected(program: Program, inputs: list[Any]) -> tuple[Any, ...] | None:
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return flatten(interpret(program, inputs, reference=True))
    except Exception:
        return None  # (a value-dependent refusal on the other inputs: not compared)


def _graphs(graph: Graph, folder: Path) -> dict[str, Graph]:
    out = {"graph": graph}
    for name, p in PASSES.items():
        out[name] = p(graph)
    for engine in ENGINES:
        out[f"optimize[{engine}]"] = graph.optimize(engine=engine)
    for g in out.values():
        assert str(g) and g.code  # (printing and the source of every graph)
    for name in ("graph", f"optimize[{ENGINES[-1]}]"):
        path = folder / f"{name}.dfg"
        out[name].save(path)
        out[f"saved {name}"] = dataflow.load(path, trust=["ops"])
    return out


def check_values(program: Program, other: list[np.ndarray[Any, Any]]) -> None:
    """A program numpy runs: every mode gives numpy's outputs."""
    assert program.expected is not None
    inputs = program.inputs
    failed: list[int] = []
    fn = _traced_fn(program, failed)
    eager = _eager_fn(program, failed)
    _compare("eager", program, _run_eagerly(program, eager), program.expected)
    graph = dataflow.trace(fn, *inputs)
    expected_other = _expected(program, other)
    with tempfile.TemporaryDirectory() as folder:
        graphs = _graphs(graph, Path(folder))

    async def main() -> dict[str, Any]:
        got: dict[str, Any] = {}
        for name, g in graphs.items():
            got[name] = await dataflow.materialize(await g(*inputs))
            if expected_other is not None:
                got[f"{name}, other inputs"] = await dataflow.materialize(await g(*other))
        compiled = dataflow.compile(fn)
        got["compile, first call"] = await compiled(*inputs)
        got["compile, cached call"] = await compiled(*inputs)
        if expected_other is not None:
            got["compile, other inputs"] = await compiled(*other)
        return got

    results = dataflow.run(main)
    reversed_ = any(min(a.strides, default=0) < 0 for a in [*inputs, *other, *_arrays(program)])
    for mode, value in results.items():
        expected = expected_other if "other" in mode else program.expected
        assert expected is not None
        _compare(mode, program, value, expected)
        # Passes keep the bits (the same kernels on the same arrays), numexpr aside. (Eager
        # runs and saved graphs may differ in the last bit: an array copied for a queued op,
        # or saved, has positive strides, and numpy's matmul of a reversed array takes
        # another loop than BLAS; whether a node is queued or runs inline varies from run
        # to run, so graphs of reversed arrays are not compared bit for bit either.)
        if "numexpr" not in mode and "saved" not in mode and not reversed_:
            base = "graph, other inputs" if "other" in mode else "graph"
            mine, theirs = flatten(value), flatten(results[base])
            _compare(f"{mode} against {base}", program, mine, theirs, exact=True)


def check_error(program: Program) -> None:
    """A program numpy refuses at its last step: every mode raises there, at the call."""
    assert program.error is not None
    classes = _builtin_bases(program.error)
    last = len(program.steps) - 1
    failed: list[int] = []
    fn = _traced_fn(program, failed)

    async def compiled() -> Any:
        return await dataflow.compile(fn)(*program.inputs)

    modes: dict[str, Callable[[], Any]] = {
        "eager": lambda: _run_eagerly(program, _eager_fn(program, failed)),
        "trace": lambda: dataflow.trace(fn, *program.inputs),
        "compile": lambda: dataflow.run(compiled),
    }
    for mode, run in modes.items():
        failed.clear()
        with pytest.raises(Exception) as info:
            run()
        where = f"{mode}: numpy raised {program.error!r} in\n{program!r}"
        assert isinstance(info.value, DataflowError), f"{where}\ngot {info.value!r}"
        assert isinstance(info.value, classes), f"{where}\ngot {info.value!r}"
        assert failed == [last], f"{where}\nraised at step {failed}, not at the call"


def check(seed: int) -> None:
    """Seed ``seed``'s program in every mode."""
    program, other = draw(seed)
    with warnings.catch_warnings():
        # (a TracerWarning is a finding; numpy's own warnings of a kernel are its business)
        warnings.simplefilter("error")
        if program.error is not None:
            check_error(program)
        else:
            check_values(program, other)


class TestFuzzModes:
    @pytest.mark.parametrize("block", range(4))
    def test_random_programs_agree_in_every_mode(self, block: int) -> None:
        """numpy, eager, traced (each pass, optimized, saved and loaded) and compiled: the
        same values, dtypes and shapes, or the same error at the same op call."""
        for seed in range(block, SEEDS, 4):
            check(seed)
