"""A description of the machine and software a result was measured on."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["cores", "describe", "summary"]


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _blas() -> list[dict[str, Any]]:
    from threadpoolctl import threadpool_info

    keep = (
        "user_api",
        "internal_api",
        "version",
        "threading_layer",
        "architecture",
        "num_threads",
        "filepath",
    )
    return [{k: info.get(k) for k in keep} for info in threadpool_info()]


def _torch_threads() -> str | None:
    """torch's own view of its threads and BLAS (MKL, OpenMP), when torch is installed."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    info: str = torch.__config__.parallel_info()
    return info


def describe(argv: list[str] | None = None) -> dict[str, Any]:
    """Cores, CPU model, BLAS (via threadpoolctl), library versions, date and command."""
    import numpy as np

    mem_total = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks", *(argv or [])]),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cores_available": cores(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": mem_total,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "numpy": np.__version__,
        "torch": _version("torch"),
        "dask": _version("dask"),
        "uvloop": _version("uvloop"),
        "anyio": _version("anyio"),
        "threadpoolctl": _version("threadpoolctl"),
        "dataflow": _version("numpy-dataflow"),
        "dataflow_git_commit": _git_commit(),
        "torch_parallel_info": _torch_threads(),
        "blas": _blas(),
        "env": {
            k: os.environ[k]
            for k in (
                "OMP_NUM_THREADS",
                "OPENBLAS_NUM_THREADS",
                "MKL_NUM_THREADS",
                "DATAFLOW_NUM_INTEROP_THREADS",
                "DATAFLOW_LOOP",
            )
            if k in os.environ
        },
        "executable": sys.executable,
    }


def summary(desc: dict[str, Any]) -> str:
    """A few lines for the top of the printed report."""
    blas = (
        ", ".join(
            f"{b['internal_api']} {b['version']} ({b['user_api']}, {b['threading_layer']}, "
            f"{b['architecture']}, {b['num_threads']} threads)"
            for b in desc["blas"]
        )
        or "none found"
    )
    return "\n".join(
        [
            f"machine: {desc['cpu_model']}, {desc['cores_available']} cores available, "
            f"{(desc['memory_bytes'] or 0) / 2**30:.1f} GiB, {desc['platform']}",
            f"python {desc['python']}, numpy {desc['numpy']}, "
            f"torch {desc['torch'] or 'not installed'}, dask {desc['dask'] or 'not installed'}, "
            f"uvloop {desc['uvloop']}, anyio {desc['anyio']}",
            f"BLAS: {blas}",
            f"dataflow {desc['dataflow']} (git {desc['dataflow_git_commit']}), {desc['date']}",
        ]
    )
