"""Shared helpers of the stress tests: thread and memory probes, subprocesses, gated kernels."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import psutil

import dataflow
import ops

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dataflow_threads() -> list[threading.Thread]:
    """The threads dataflow starts: inter-op workers and timeout watchdogs."""
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith("interop") or t.name.startswith("dataflow-")
    ]


def wait_for_no_threads(timeout: float = 10.0) -> list[threading.Thread]:
    """Wait (bounded) until no dataflow thread is alive; return those still alive."""
    deadline = time.monotonic() + timeout
    while True:
        left = dataflow_threads()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)


def rss_mib() -> float:
    """This process's resident set size in MiB."""
    return float(psutil.Process().memory_info().rss) / 2**20


def run_python(
    args: Sequence[str], *, timeout: float = 60.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python args...`` from the repository root and capture its output."""
    full_env = dict(os.environ)
    full_env.pop("PYTHONWARNINGS", None)
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _spec(x: Any, *_: Any, **__: Any) -> ops.TensorSpec:
    return ops.spec_of(x)


class Gate:
    """A kernel that blocks until the test opens the gate (bounded, so no test can hang).

    ``op(x)`` is an op whose kernel waits on the gate and returns ``x``; ``started`` counts
    kernels that began, ``finished`` those that returned.
    """

    def __init__(self, name: str = "gated", *, timeout: float | None = None) -> None:
        self.event = threading.Event()
        self.started = 0
        self.finished = 0
        self._lock = threading.Lock()
        options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        self.op: dataflow.Op[..., ops.Tensor] = dataflow.op(
            name, meta=_spec, handle=ops.Tensor, inline=False, **options
        )(self._kernel)

    def _kernel(self, x: Any) -> Any:
        with self._lock:
            self.started += 1
        self.event.wait(20.0)
        with self._lock:
            self.finished += 1
        return x

    def open(self) -> None:
        self.event.set()


def spec_op(name: str, kernel: Any, **options: Any) -> dataflow.Op[..., ops.Tensor]:
    """An op returning a Tensor shaped like its first argument."""
    return dataflow.op(name, meta=_spec, handle=ops.Tensor, **options)(kernel)


def as_array(x: Any) -> np.ndarray:
    return np.asarray(x)
