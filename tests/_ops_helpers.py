"""Helpers shared by the ops tests: random data, and running an op eagerly and on the pool."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

import dataflow
import ops


def rand(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> np.ndarray:
    """Random data of a dtype: normal floats, small signed ints, coin-flip bools."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind == "u":
        return rng.integers(0, 10, shape).astype(dt)
    return rng.integers(-9, 10, shape).astype(dt)


def _checked(t: Any, value: Any) -> Any:
    """The value of Tensor t, after checking that the meta rule predicted its shape and dtype."""
    a = np.asarray(value)
    assert (a.shape, a.dtype) == (t.shape, t.dtype), f"meta {t.spec}, kernel {a.dtype}{a.shape}"
    return value


def both(build: Callable[[], Any]) -> list[Any]:
    """build()'s values eagerly (no runtime), then in a runtime with every op on the pool."""
    first = build()
    eager = tuple(_checked(t, t.result()) for t in first) if isinstance(first, tuple) else None
    if eager is None:
        eager = _checked(first, first.result())

    async def main() -> Any:
        out = build()
        if isinstance(out, tuple):
            return tuple([_checked(t, await t) for t in out])
        return _checked(out, await out)

    old = dataflow.get_inline_threshold()
    dataflow.set_inline_threshold(0.0)  # every op with a cost goes to the 2 pool threads
    try:
        pooled = dataflow.run(main, interop_threads=2)
    finally:
        dataflow.set_inline_threshold(old)
    return [eager, pooled]


def assert_like(got: Any, expected: Any) -> None:
    """Same dtype and shape as numpy's result, and the same values (NaN equal to NaN)."""
    g, e = np.asarray(got), np.asarray(expected)
    assert g.dtype == e.dtype, (g.dtype, e.dtype)
    assert g.shape == e.shape, (g.shape, e.shape)
    if e.dtype.kind in "fc":
        rtol = {2: 1e-3, 4: 1e-6, 8: 1e-12}.get(e.dtype.itemsize, 1e-6)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol * 1e-3, equal_nan=True)
    else:
        np.testing.assert_array_equal(g, e)


def check(build: Callable[[], Any], expected: Any) -> None:
    """build() matches ``expected`` both eagerly and in a runtime."""
    for got in both(build):
        assert_like(got, expected)


def _wait_kernel(x: Any, gate: threading.Event) -> Any:
    gate.wait(10)
    return x


_wait_op = ops.define(
    "wait_for_gate",
    _wait_kernel,
    meta=lambda x, gate: ops.spec_of(x),
    cost=lambda x, gate: dataflow.Cost(1e12, 0),
    inline=False,  # it blocks: never on the event loop, whatever time it was measured at
)


def blocked(gate: threading.Event, x: np.ndarray) -> Any:
    """A Tensor of ``x`` that stays pending until ``gate`` is set (in a runtime)."""
    return _wait_op(x, gate)
