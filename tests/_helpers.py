"""A minimal op vocabulary for testing the runtime without the ops package."""

from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple

import numpy as np

import dataflow
from dataflow import Cost, Pending, Task


class Spec(NamedTuple):
    shape: tuple[int, ...]
    dtype: Any


class Arr(Pending[Any]):
    """A pending array with a shape, like ops.Tensor but local to the tests."""

    __slots__ = ("dtype", "shape")

    def __init__(self, task: Task, index: int | None, spec: Spec) -> None:
        super().__init__(task, index)
        self.shape = spec.shape
        self.dtype = spec.dtype


def _same(x: Any, *_: Any) -> Spec:
    return Spec(np.shape(x), getattr(x, "dtype", np.dtype(float)))


def _tiny(x: Any, *_: Any) -> Cost:
    return Cost(1, 8)


def _big(x: Any, *_: Any) -> Cost:
    return Cost(1e12, 0)


def _add_kernel(a: Any, b: Any) -> Any:
    return np.add(a, b)


def _sleep_kernel(x: Any, seconds: float) -> Any:
    time.sleep(seconds)
    return x


def _boom_kernel(x: Any) -> Any:
    raise ValueError("boom in kernel")


def _gated_kernel(x: Any, gate: threading.Event) -> Any:
    gate.wait(10)
    return x


def _fail_after_kernel(x: Any, gate: threading.Event) -> Any:
    gate.wait(10)
    raise ValueError("boom after the gate")


def _thread_kernel(x: Any) -> Any:
    return threading.current_thread().name


neg_inline = dataflow.op("neg", meta=_same, handle=Arr, cost=_tiny)(np.negative)
# Pinned to the pool (inline=False): placement otherwise follows the measured kernel time,
# and these kernels are fast.
neg_pool = dataflow.op("neg_pool", meta=_same, handle=Arr, cost=_big, inline=False)(np.negative)
add = dataflow.op("add", meta=_same, handle=Arr, cost=_big, inline=False)(_add_kernel)
sleep_op = dataflow.op("sleep", meta=_same, handle=Arr, cost=_big, inline=False)(_sleep_kernel)
boom = dataflow.op("boom", meta=_same, handle=Arr, cost=_big, inline=False)(_boom_kernel)
where_run = dataflow.op("where_run", meta=_same, handle=Arr, inline=False)(_thread_kernel)
gated = dataflow.op("gated", meta=_same, handle=Arr, inline=False)(_gated_kernel)
fail_after = dataflow.op("fail_after", meta=_same, handle=Arr, inline=False)(_fail_after_kernel)
