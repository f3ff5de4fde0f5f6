"""Property tests: random DAGs of ops give the values of plain sequential numpy.

Hypothesis draws a small program (a list of steps, each an op applied to earlier values of
compatible shapes), the number of inter-op threads and whether ops run inline or on the pool;
the program runs once through ``dataflow`` (ops dispatched, then awaited) and once as plain
numpy, step by step, and every value must agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dataflow
import ops

# The shapes values can have; every op below maps these shapes to these shapes.
SHAPES: list[tuple[int, ...]] = [(3, 4), (4, 3), (4,), (3, 3), (6, 4)]


@dataclass(frozen=True)
class Step:
    """``out = op(*values[args])``: ``kind`` names the op, ``args`` index earlier values."""

    kind: str
    args: tuple[int, ...]
    param: int = 0


def _ops_kernels() -> dict[str, tuple[Callable[..., Any], Callable[..., Any]]]:
    """kind -> (the dataflow call, the numpy call), on the same arguments."""
    return {
        "add": (ops.add, np.add),
        "multiply": (ops.multiply, np.multiply),
        "subtract": (ops.subtract, np.subtract),
        "maximum": (ops.maximum, np.maximum),
        "tanh": (ops.tanh, np.tanh),
        "negative": (ops.negative, np.negative),
        "sigmoid": (ops.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
        "matmul": (ops.matmul, np.matmul),
        "sum": (lambda x, axis: ops.sum(x, axis=axis), lambda x, axis: np.sum(x, axis=axis)),
        "concatenate": (
            lambda a, b: ops.concatenate([a, b], axis=0),
            lambda a, b: np.concatenate([a, b], axis=0),
        ),
        "transpose": (ops.transpose, np.transpose),
        "scale": (lambda x, k: ops.multiply(x, 0.5 * k), lambda x, k: np.multiply(x, 0.5 * k)),
    }


KERNELS = _ops_kernels()


def _out_shape(kind: str, shapes: list[tuple[int, ...]], param: int) -> tuple[int, ...] | None:
    """The output shape, or None when the op does not apply (or leaves the shape set)."""
    a = shapes[0]
    if kind in ("add", "multiply", "subtract", "maximum"):
        b = shapes[1]
        try:
            out = tuple(np.broadcast_shapes(a, b))
        except ValueError:
            return None
        return out
    if kind in ("tanh", "negative", "sigmoid", "scale"):
        return a
    if kind == "transpose":
        return a[::-1]
    if kind == "matmul":
        b = shapes[1]
        if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
            return (a[0], b[1])
        return None
    if kind == "sum":
        return a[:param] + a[param + 1 :] if param < len(a) else None
    if kind == "concatenate":
        b = shapes[1]
        if len(a) == len(b) and a[1:] == b[1:]:
            return (a[0] + b[0], *a[1:])
        return None
    raise AssertionError(kind)


_ARITY = {"add": 2, "multiply": 2, "subtract": 2, "maximum": 2, "matmul": 2, "concatenate": 2}


@st.composite
def programs(draw: st.DrawFn) -> tuple[list[np.ndarray], list[Step]]:
    """Initial arrays and a list of steps whose shapes all fit."""
    n_inputs = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    inputs = [
        rng.uniform(-1, 1, SHAPES[draw(st.integers(0, len(SHAPES) - 1))]) for _ in range(n_inputs)
    ]
    shapes = [x.shape for x in inputs]
    steps: list[Step] = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(sorted(KERNELS)))
        arity = _ARITY.get(kind, 1)
        args = tuple(draw(st.integers(0, len(shapes) - 1)) for _ in range(arity))
        param = draw(st.integers(0, 2))
        out = _out_shape(kind, [shapes[i] for i in args], param)
        if out is None or not out or len(out) > 2 or max(out) > 12:
            continue  # keep values small, at least 1-d
        steps.append(Step(kind, args, param))
        shapes.append(out)
    return inputs, steps


def _call(kind: str, which: int, values: list[Any], step: Step) -> Any:
    fn = KERNELS[kind][which]
    args = [values[i] for i in step.args]
    if kind in ("sum", "scale"):
        return fn(*args, step.param)
    return fn(*args)


def run_numpy(inputs: list[np.ndarray], steps: list[Step]) -> list[np.ndarray]:
    values: list[Any] = list(inputs)
    with np.errstate(all="ignore"):
        for s in steps:
            values.append(np.asarray(_call(s.kind, 1, values, s)))
    return values


async def run_dataflow(inputs: list[np.ndarray], steps: list[Step]) -> list[Any]:
    values: list[Any] = [ops.asarray(x) for x in inputs]
    for s in steps:
        values.append(_call(s.kind, 0, values, s))
    return [await v for v in values]


@pytest.fixture
def restore_threshold() -> Iterator[None]:
    old = dataflow.get_inline_threshold()
    try:
        yield
    finally:
        dataflow.set_inline_threshold(old)


class TestRandomDags:
    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        program=programs(),
        threads=st.integers(1, 4),
        inline=st.booleans(),
        loop=st.sampled_from(["asyncio", "uvloop"]),
    )
    def test_same_values_as_numpy(
        self,
        restore_threshold: None,
        program: tuple[list[np.ndarray], list[Step]],
        threads: int,
        inline: bool,
        loop: str,
    ) -> None:
        """A random DAG of ops gives numpy's values, inline or on 1..4 threads, on both loops."""
        inputs, steps = program
        dataflow.set_inline_threshold(1.0 if inline else 0.0)
        got = dataflow.run(run_dataflow, inputs, steps, interop_threads=threads, loop=loop)
        want = run_numpy(inputs, steps)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert np.shape(g) == np.shape(w), (i, steps)
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, equal_nan=True)

    @settings(max_examples=30, deadline=None)
    @given(program=programs(), cancel_at=st.integers(0, 40))
    def test_cancelling_one_step_fails_exactly_its_dependents(
        self, program: tuple[list[np.ndarray], list[Step]], cancel_at: int
    ) -> None:
        """Cancelling a queued step fails it and everything downstream; the rest is numpy's."""
        inputs, steps = program
        if cancel_at >= len(steps):
            cancel_at = len(steps) - 1
        if cancel_at < 0:
            return
        target = len(inputs) + cancel_at
        downstream = {target}
        for j, s in enumerate(steps):
            if any(a in downstream for a in s.args):
                downstream.add(len(inputs) + j)

        async def main() -> list[Any]:
            from tests.stress._support import Gate

            gate = Gate("hold")
            held = [gate.op(x) for x in inputs]  # every value waits until the gate opens
            values: list[Any] = list(held)
            for s in steps:
                values.append(_call(s.kind, 0, values, s))
            assert values[target].cancel()
            gate.open()
            out: list[Any] = []
            for v in values:
                try:
                    out.append(await v)
                except dataflow.CancelledTaskError:
                    out.append(None)
            return out

        got = dataflow.run(main, interop_threads=2)
        want = run_numpy(inputs, steps)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if i in downstream:
                assert g is None, (i, steps)
            else:
                np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, equal_nan=True)
