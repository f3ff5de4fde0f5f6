"""The public op API: declare an op from a numpy kernel, a meta rule and a cost rule.

An op is three plain functions:

* the **kernel** computes the value from numpy arrays;
* the **meta rule** takes the call's arguments as given (pending handles included: they carry
  whatever the handle type knows, e.g. ``shape`` and ``dtype``) and returns the output's *spec*
  (for ``ops``: shape and dtype) or a tuple of specs for an op with several outputs, without
  running the kernel. It validates the inputs and raises (``OpInputError``, ``OpTypeError``) at
  the call site, in the caller's frame, naming the op and what was expected;
* the optional **cost rule** returns a :class:`~dataflow.Cost` (flops, bytes), used to decide
  whether a ready op runs inline or on the pool, and by the profiler.

Calling the op returns handles at once, built by the ``handle`` factory from the task, the
output's index (None for a single output) and its spec. Outside a runtime an op runs eagerly on
the calling thread, so the same code also works as plain synchronous numpy.

Example:
    >>> import numpy as np, dataflow
    >>> def softplus_meta(x): return ops.TensorSpec(x.shape, x.dtype)
    >>> softplus = dataflow.op("softplus", meta=softplus_meta, handle=ops.Tensor,
    ...                        cost=lambda x: dataflow.Cost(flops=4 * x.size))(
    ...     lambda x: np.log1p(np.exp(x)))
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ._errors import NotReadyError, task_failed
from ._runtime import _current, _resolve, loop_runtime
from ._task import DONE, Cost, Pending, Task
from ._timeout import check_timeout

__all__ = ["Op", "declaring_modules", "lookup_op", "op", "op_for_kernel"]

H = TypeVar("H", bound=Pending[Any])

HandleFactory = Callable[[Task, "int | None", Any], H]


class Op(Generic[H]):
    """A declared op. Call it like the kernel; it returns pending handle(s) at once."""

    __slots__ = (
        "__dict__",
        "__weakref__",
        "cost",
        "handle",
        "inline",
        "kernel",
        "meta",
        "module",
        "name",
        "timeout",
    )

    def __init__(
        self,
        name: str,
        kernel: Callable[..., Any],
        meta: Callable[..., Any],
        handle: HandleFactory[H],
        cost: Callable[..., Cost] | None = None,
        inline: bool | None = None,
        timeout: float | None = None,
    ) -> None:
        self.timeout = check_timeout(timeout, f"op {name!r}: timeout")
        self.name = name
        self.kernel = kernel
        self.meta = meta
        self.cost = cost
        self.handle = handle
        self.inline = inline
        self.__name__ = name
        self.__qualname__ = name
        self.__doc__ = kernel.__doc__
        # The module whose import declared the op: a saved graph names it, so `load` can
        # import it (when trusted) and find the op again under `module:name`.
        self.module = _declaring_module()
        _register(self)

    @property
    def qualname(self) -> str:
        """``module:name``, the op's name in the registry and in saved graphs."""
        return f"{self.module}:{self.name}"

    def __repr__(self) -> str:
        return f"<dataflow.Op {self.name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        spec = self.meta(*args, **kwargs)
        cost = self.cost(*args, **kwargs) if self.cost is not None else None
        rt = _current.get() or loop_runtime()
        if rt is None:
            task = _run_eagerly(self, args, kwargs, spec, cost)
        else:
            timeout = self.timeout if self.timeout is not None else rt.op_timeout
            task = rt.submit(
                self.kernel,
                args,
                kwargs or None,
                self.name,
                spec,
                cost,
                self.inline,
                timeout=timeout,
            )
        if type(spec) is tuple:
            make = self.handle
            return tuple(make(task, i, s) for i, s in enumerate(spec))
        return self.handle(task, None, spec)


# -- the registry: every declared op, by qualified name and by kernel -------------------------
#
# Weak, so an op declared in a function (a test, a notebook cell) goes away with its last user.
# The graph tracer finds the op behind a submitted kernel here, and `dataflow.load` resolves
# the ops a saved graph names: it never imports anything a file names, only looks ops up.

_by_qualname: weakref.WeakValueDictionary[str, Op[Any]] = weakref.WeakValueDictionary()
_by_kernel: weakref.WeakValueDictionary[tuple[int, str], Op[Any]] = weakref.WeakValueDictionary()


def _declaring_module() -> str:
    """The module whose top-level code is running: the innermost ``<module>`` frame."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_name != "<module>":
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "__main__"
    return str(frame.f_globals.get("__name__", "__main__"))


def _register(op: Op[Any]) -> None:
    _by_qualname[op.qualname] = op
    _by_kernel[id(op.kernel), op.name] = op


def declaring_modules() -> set[str]:
    """The modules that declared the ops now registered (each took part in dataflow on purpose)."""
    return {op.module for op in list(_by_qualname.values())}


def lookup_op(qualname: str) -> Op[Any] | None:
    """The live op registered under ``module:name`` (the latest declared), or None."""
    return _by_qualname.get(qualname)


def op_for_kernel(kernel: Callable[..., Any], name: str) -> Op[Any] | None:
    """The op whose kernel is ``kernel`` and whose name is ``name`` (as ``submit`` sees it)."""
    found = _by_kernel.get((id(kernel), name))
    return found if found is not None and found.kernel is kernel else None


def _run_eagerly(
    op: Op[Any], args: tuple[Any, ...], kwargs: dict[str, Any], spec: Any, cost: Cost | None
) -> Task:
    """Outside a runtime: run the kernel now, on this thread, raising its error here."""
    task = Task(op.kernel, args, kwargs or None, op.name, None, spec, cost)
    try:
        value = op.kernel(*_resolve(args), **_resolve(kwargs))
    except NotReadyError:
        raise
    except Exception as exc:
        raise task_failed(task.name, op.name, exc) from exc
    task.value = value
    task.state = DONE
    task.fn = task.args = task.kwargs = None
    return task


def op(
    name: str,
    *,
    meta: Callable[..., Any],
    handle: HandleFactory[H],
    cost: Callable[..., Cost] | None = None,
    inline: bool | None = None,
    timeout: float | None = None,
) -> Callable[[Callable[..., Any]], Op[H]]:
    """Declare an op from a numpy kernel (decorator).

    Args:
        name: the op's name, used in errors, traces and the profiler's table.
        meta: ``meta(*args, **kwargs) -> spec | tuple[spec, ...]``; validates and raises.
        handle: ``handle(task, index, spec) -> Pending`` builds the returned handle(s).
        cost: ``cost(*args, **kwargs) -> Cost``; without it the op always goes to the pool.
        inline: force inline (True) or pool (False) execution instead of deciding by cost.
        timeout: seconds the kernel may run in a runtime before its task (and every task
            depending on it) fails with :class:`~dataflow.OpTimeoutError`; overrides the
            runtime's ``op_timeout``. A timed op always runs on the pool. The kernel itself
            cannot be interrupted: it runs on, its result is discarded (docs/hardening.md).
            Outside a runtime (eager mode) the timeout does not apply.

    Example:
        >>> @dataflow.op("scale", meta=lambda x, k: ops.TensorSpec(x.shape, x.dtype),
        ...              handle=ops.Tensor, cost=lambda x, k: dataflow.Cost(x.size, 8 * x.size))
        ... def scale(x, k):
        ...     return x * k
    """

    checked = check_timeout(timeout, f"op {name!r}: timeout")

    def decorate(kernel: Callable[..., Any]) -> Op[H]:
        return Op(name, kernel, meta, handle, cost, inline, checked)

    return decorate
