"""Backends: where a runtime's tasks run. A small protocol, and a registry by name.

A :class:`~dataflow.Runtime` holds one backend and keeps only lifetime and ownership itself.
A backend is told to ``open`` (the runtime's scheduler and loop bridge exist by then), then
receives every dispatched task through ``submit`` (the runtime's ``dispatch`` *is* the
backend's ``submit``, so a local op pays no extra call), answers ``completion`` (what ``await
handle`` waits on) and ``cancel``, and is asked to ``join`` its outstanding work and ``close``.

* ``"local"``: :class:`LocalBackend`, the runtime's own :class:`~dataflow._scheduler.Scheduler`
  over an inter-op pool.
* ``"dask"``: ``dataflow.dask``, ops shipped to a Dask cluster (registered when that package
  is imported; ``Runtime(backend="dask")`` imports it by name).
* The graph tracer (``dataflow.graph``) is a backend too, used by ``dataflow.trace``.

``submit(sig, fn, args, kwargs, inputs, ready, priority=None, timeout=None) -> Task``:
``sig`` is the op call's :class:`~dataflow._signature.Signature`, ``inputs`` the tasks of the
pending handles among the arguments and ``ready`` whether all are done.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ._errors import DataflowError, DataflowTypeError, DataflowValueError

if TYPE_CHECKING:
    from ._runtime import Runtime
    from ._task import Task

__all__ = ["DASK_ADDRESS_ENV", "Backend", "LocalBackend", "make_backend", "register_backend"]

# The Dask scheduler address `dataflow run --dask ADDRESS` sets for the script's runtimes.
DASK_ADDRESS_ENV = "DATAFLOW_DASK_ADDRESS"

# Called with the address by a Dask runtime once its own client connected to the address of
# $DATAFLOW_DASK_ADDRESS: `dataflow run --dask` says there (once) which cluster the run uses,
# and so says nothing when the address is wrong.
on_dask_connected: Callable[[str], None] | None = None


class Backend(Protocol):
    """What a runtime needs from a backend (see the module docstring)."""

    name: str
    submit: Callable[..., Task]

    async def open(self) -> None:
        """Start: the runtime's scheduler and loop bridge exist."""

    def completion(self, task: Task) -> Any:
        """An awaitable that completes when ``task`` is done."""

    def cancel(self, task: Task) -> bool:
        """Cancel a task that has not started (True if it was cancelled)."""

    def cancel_everything(self) -> None:
        """The body failed: drop what has not started."""

    async def join(self) -> None:
        """Wait for the backend's own outstanding work (not the local graph's)."""

    async def close(self) -> None:
        """Release what the backend holds; the runtime is closing."""


class LocalBackend:
    """The runtime's scheduler and inter-op pool, in this process."""

    name = "local"

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def submit(self, *args: Any, **kwargs: Any) -> Task:  # replaced by the scheduler's in open
        raise DataflowError("the runtime is not open")

    async def open(self) -> None:
        sched = self.runtime._sched
        # Dispatch goes straight to the scheduler: no call through this object per op.
        self.submit = sched.submit  # type: ignore[method-assign]
        self.completion = sched.completion  # type: ignore[method-assign]
        self.cancel = sched.cancel  # type: ignore[method-assign]

    def completion(self, task: Task) -> Any:
        return self.runtime._sched.completion(task)

    def cancel(self, task: Task) -> bool:
        return self.runtime._sched.cancel(task)

    def cancel_everything(self) -> None:
        pass

    async def join(self) -> None:
        pass

    async def close(self) -> None:
        pass


_registry: dict[str, Callable[..., Any]] = {"local": LocalBackend}
# Backends found by importing a module that registers them, by name.
_modules = {"dask": "dataflow.dask"}


def register_backend(name: str, factory: Callable[..., Any]) -> None:
    """Make ``Runtime(backend=name)`` build ``factory(runtime, **options)``."""
    _registry[name] = factory


def make_backend(
    runtime: Runtime, name: str | Callable[..., Backend] | None, options: dict[str, Any]
) -> Backend:
    """The backend ``Runtime(backend=name, **options)`` asks for (see :class:`Runtime`).

    ``name`` may also be a factory ``factory(runtime, **options) -> Backend`` (how the graph
    tracer plugs in).
    """
    if callable(name):
        made: Backend = name(runtime, **options)
        return made
    if name is None:
        dask = (
            options.get("address") is not None
            or options.get("client") is not None
            or os.environ.get(DASK_ADDRESS_ENV)
        )
        name = "dask" if dask else "local"
    if not isinstance(name, str):
        raise DataflowTypeError(
            f"Runtime(backend=...) must be 'local' or 'dask', got {type(name).__name__}: {name!r}"
        )
    if name not in _registry and name in _modules:
        importlib.import_module(_modules[name])
    factory = _registry.get(name)
    if factory is None:
        names = ["local", *sorted({*_registry, *_modules} - {"local"})]
        listed = ", ".join(repr(n) for n in names[:-1]) + f" or {names[-1]!r}"
        raise DataflowValueError(f"Runtime(backend=...) must be {listed}, got {name!r}")
    if name == "local" and options:
        given = ", ".join(sorted(options))
        raise DataflowTypeError(
            f"Runtime(): {given} are options of the Dask backend; the local backend "
            "takes interop_threads, intraop_threads, private_pool, simulate, max_pending, "
            "op_timeout and inline_threshold"
        )
    backend: Backend = factory(runtime, **options)
    return backend
