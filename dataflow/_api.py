"""The user-facing API around fork and wait: run, materialize, and the model-code rule.

:func:`run` runs an ``async def`` function in a new runtime on a new event loop (like
``asyncio.run``); :func:`materialize` awaits every future and pending value in a container;
:func:`model_code` marks the code whose awaits keep pending outputs pending, so a forward's
ops keep overlapping.

Design note: ``fork`` and ``wait``, and the future of a forked coroutine, are ``_fork``'s: the
per-task path, kept apart from what starts and ends a run. ``_fork`` builds on this module (a
forked task's future materializes its value outside model code, and forks started in model
code are model code), so it imports from here and this module never imports ``_fork``: no
cycle. ``dataflow/__init__`` re-exports both.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar, TypeVarTuple, overload

from . import _loop
from ._defaults import DEFAULT_MAX_PENDING, resolve_loop_factory
from ._errors import DataflowError, DataflowTypeError
from ._runtime import Runtime
from ._task import Future
from ._walk import leaves, replace

__all__ = ["in_model_code", "materialize", "model_code", "run"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

# Whether the running code is model code: a module's forward, or code started from one.
_model: contextvars.ContextVar[bool] = contextvars.ContextVar("dataflow_model_code", default=False)


class _ModelCode:
    """The context manager :func:`model_code` returns (a class: entered on every module call,
    where a generator-based one cost three times as much)."""

    __slots__ = ("_token",)

    def __enter__(self) -> bool:
        token = self._token = _model.set(True)
        return token.old_value is True

    def __exit__(self, *exc: object) -> None:
        _model.reset(self._token)


def model_code() -> contextlib.AbstractContextManager[bool]:
    """Mark the code in the block as *model code*; yields whether it already was.

    The rule that makes one ``await`` give arrays: awaiting a module call (``ops.nn.Module``
    uses this) or a forked task's future gives its values with every pending output resolved
    to arrays, except in model code, where it gives the pending outputs themselves, so the
    ops a forward dispatches keep overlapping (``results = [await m(x) for m in members]``
    dispatches every member before any has run). Forks started in model code are model code.

    Example:
        >>> async def __call__(self, x):          # how ops.nn.Module uses it
        ...     with dataflow.model_code() as nested:
        ...         out = await self.forward(x)
        ...     return out if nested else await dataflow.materialize(out)
    """
    return _ModelCode()


def in_model_code() -> bool:
    """Whether the calling code is model code (see :func:`model_code`)."""
    return _model.get()


def _fn_name(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


@overload
async def materialize(value: Future[Future[T]]) -> T: ...  # (a fork's future of a Tensor)
@overload
async def materialize(value: Future[T]) -> T: ...
@overload
async def materialize(value: Any) -> Any: ...
async def materialize(value: Any) -> Any:
    """``value`` with every future and pending value in it awaited (containers walked).

    Lists, tuples, NamedTuples and dicts are looked into (see ``dataflow._walk``), however
    deeply nested; a future whose value holds more futures is materialized in turn.
    """
    while isinstance(value, Future):
        value = await value
    while True:
        futures = [v for v in leaves(value) if isinstance(v, Future)]
        if not futures:
            return value
        done: dict[int, Any] = {}
        for f in futures:
            if id(f) not in done:
                got = await f
                while isinstance(got, Future):
                    got = await got
                done[id(f)] = got
        value = replace(value, _swap(done))


class _Value(Generic[T]):
    """The program's value, carried out of ``asyncio.Runner`` in an object of a cheap repr.

    When the runner restores SIGINT's handler, ``signal.signal`` turns the handler it replaces
    (a partial naming the main task) into an enum if it can, and the failed lookup formats that
    partial's repr: the task's, its result included. A model's output array took as long to
    format as a small forward takes to run (1.3 ms for a (50, 1, 128) float64 array), on
    every ``dataflow.run``, for a message nobody reads.
    """

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value


def _swap(done: dict[int, Any]) -> Callable[[Any], Any]:
    def swap(v: Any) -> Any:
        return done[id(v)] if isinstance(v, Future) else v

    return swap


# run() gives arrays for pending values: a main that returns one (``async def main(x) ->
# ops.Tensor``) gives its value's type. Inside containers (a tuple of Tensors) a type checker
# sees main's own types; the values are arrays all the same.
@overload
def run(
    main: Callable[[*Ts], Awaitable[Future[T]]],
    /,
    *args: *Ts,
    interop_threads: int | None = ...,
    intraop_threads: int | None = ...,
    loop: str = ...,
    backend: str | None = ...,
    address: str | None = ...,
    max_pending: int | None = ...,
    op_timeout: float | None = ...,
) -> T: ...
@overload
def run(
    main: Callable[[*Ts], Awaitable[T]],
    /,
    *args: *Ts,
    interop_threads: int | None = ...,
    intraop_threads: int | None = ...,
    loop: str = ...,
    backend: str | None = ...,
    address: str | None = ...,
    max_pending: int | None = ...,
    op_timeout: float | None = ...,
) -> T: ...
def run(
    main: Callable[[*Ts], Awaitable[Any]],
    /,
    *args: *Ts,
    interop_threads: int | None = None,
    intraop_threads: int | None = None,
    loop: str = "auto",
    backend: str | None = None,
    address: str | None = None,
    max_pending: int | None = DEFAULT_MAX_PENDING,
    op_timeout: float | None = None,
) -> Any:
    """Run ``main(*args)`` in a new runtime on a new event loop and return its value.

    Like ``asyncio.run``; uses uvloop where installed (``loop="asyncio"`` to opt out). Pending
    values in the result (also inside tuples, lists and dicts) are awaited, so the caller gets
    arrays. Forked tasks nobody waited for still run to the end before ``run`` returns.

    Args:
        main: an ``async def`` function (not a coroutine object).
        interop_threads: inter-op pool size (default :func:`get_num_interop_threads`).
        intraop_threads: BLAS threads per op while running (default: unchanged).
        loop: "auto", "asyncio" or "uvloop".
        backend: "local" or "dask" (see :class:`Runtime`; default: "dask" when ``address``
            is given or ``$DATAFLOW_DASK_ADDRESS`` is set, else "local").
        address: the Dask scheduler's address, e.g. ``"tcp://host:8786"`` (docs/dask.md).
        max_pending, op_timeout: backpressure limit and default op timeout (see
            :class:`Runtime` and docs/hardening.md).

    Raises:
        TypeError: ``main`` is a coroutine object or not callable.
        DataflowError: called from a running event loop (use :class:`Runtime` there).
    """
    if inspect.iscoroutine(main):
        name = main.cr_code.co_name
        main.close()
        raise DataflowTypeError(
            f"dataflow.run() got a coroutine object; you did something like "
            f"dataflow.run({name}(...)), you want dataflow.run({name}, ...)"
        )
    if not callable(main):
        raise DataflowTypeError(
            f"dataflow.run() needs an async function, got {type(main).__name__}: pass the "
            "function and its arguments, dataflow.run(main, *args)"
        )
    running = _loop.running_library()
    if running is not None:
        raise DataflowError(
            f"dataflow.run() cannot be called from a running event loop (here {running}'s: it "
            "would block it). Inside async code use `async with dataflow.Runtime(): ...` and "
            "await your function."
        )
    factory = resolve_loop_factory(loop)
    # Passed only when set, so a backend without them (Dask) is not handed unknown options.
    options: dict[str, Any] = {}
    if max_pending != DEFAULT_MAX_PENDING:
        options["max_pending"] = max_pending
    if op_timeout is not None:
        options["op_timeout"] = op_timeout
    if address is not None:
        options["address"] = address
    runtime = Runtime(
        interop_threads=interop_threads,
        intraop_threads=intraop_threads,
        backend=backend,
        **options,
    )

    async def _main() -> _Value[Any]:
        async with runtime:
            coro = main(*args)
            if not inspect.isawaitable(coro):
                raise DataflowTypeError(
                    f"dataflow.run(): {_fn_name(main)} returned {type(coro).__name__}, not a "
                    "coroutine: declare it `async def` (a plain function can be forked, or "
                    "called directly)"
                )
            result = await coro
            return _Value(await materialize(result))

    runner = asyncio.Runner(loop_factory=factory)
    body = _main()
    stuck = False
    try:
        return runner.run(body).value
    except KeyboardInterrupt:
        # A second Ctrl-C, while the first one's clean-up (the Runner cancelled the body)
        # waits for a kernel that does not return: leave now (docs/hardening.md); the stuck
        # loop is left unclosed. Any other interrupt (raised by a fork, or by a kernel on the
        # loop's thread) is cleaned up as a first Ctrl-C is: closing the runner cancels the
        # body, so the runtime drops queued work, waits for running kernels, joins threads.
        stuck = any(
            t.get_coro() is body and not t.done() and t.cancelling() > 0
            for t in asyncio.all_tasks(runner.get_loop())
        )
        raise
    finally:
        if not stuck:
            runner.close()
