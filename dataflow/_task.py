"""Tasks, the signature records dispatch keeps per op call shape, and the handles users hold.

A :class:`Task` is one node of the dataflow graph: an op's kernel or a forked plain function,
with the tasks it waits for and the tasks waiting for it. Its state only moves forward::

    PENDING (inputs not ready) -> READY (queued) -> RUNNING -> DONE | FAILED
    PENDING | READY -> CANCELLED

The transitions themselves are the pure functions of ``_graphstate``; the scheduler makes them
under its lock. Every task points at the :class:`~dataflow._signature.Signature` it came from:
what dispatch knows about one way of calling an op (``_signature``). :class:`Cost`, a cost
rule's estimate, stays here: saved graph files name it ``dataflow._task:Cost``.

:class:`Future` is the public handle type. :class:`Pending` is the handle on a graph task
(``ops.Tensor`` derives from it); ``fork`` of an ``async def`` function returns a future over
the forked coroutine (in ``_fork``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Iterable
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Self, TypeVar

import numpy as np

from ._errors import (
    CancelledTaskError,
    DataflowTypeError,
    DataflowValueError,
    NotReadyError,
    TaskError,
)

if TYPE_CHECKING:
    from ._runtime import Runtime
    from ._signature import Signature

__all__ = ["Cost", "Future", "Pending", "Task"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

PENDING, READY, RUNNING, DONE, FAILED, CANCELLED = range(6)
STATE_NAMES = ("pending", "ready", "running", "done", "failed", "cancelled")


class _Light:
    """The value of a signature's shared done task (:attr:`Signature.light`): the value is in
    the handle."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<value in the handle>"


#: ``Signature.light.value``: the handle carries the value itself (see :class:`Pending`).
LIGHT: Any = _Light()

# itertools.count.__next__ is atomic under the GIL, so ids are unique across threads.
_next_id = itertools.count(1).__next__


class _CostFields(NamedTuple):
    flops: float = 0.0
    bytes: float = 0.0


class Cost(_CostFields):
    """An op's cost estimate, from its cost rule: floating-point operations and bytes touched.

    Each field is a number >= 0: an int or a float (numpy's too, kept as a Python float), not a
    bool and not NaN; anything else raises :class:`~dataflow.DataflowTypeError` or
    :class:`~dataflow.DataflowValueError` naming the field.
    """

    __slots__ = ()

    def __new__(cls, flops: float = 0.0, bytes: float = 0.0) -> Cost:
        # The common case in a few comparisons (NaN fails `>= 0`); the rest is checked apart.
        tf, tb = type(flops), type(bytes)
        if (tf is float or tf is int) and (tb is float or tb is int) and flops >= 0 and bytes >= 0:
            return tuple.__new__(cls, (flops, bytes))
        return tuple.__new__(cls, (_cost_field("flops", flops), _cost_field("bytes", bytes)))

    # namedtuple's _make (which _replace uses) builds the tuple directly: check it too. mypy
    # cannot express the generic signature it overrides.
    @classmethod
    def _make(cls, iterable: Iterable[Any]) -> Self:  # type: ignore[override]
        return cls(*iterable)


_NUMBERS = (int, float, np.integer, np.floating)


def _cost_field(name: str, value: object) -> float:
    if type(value) is bool or not isinstance(value, _NUMBERS):
        raise DataflowTypeError(
            f"Cost({name}=...) must be a number (int or float), got "
            f"{type(value).__name__}: {value!r:.60}"
        )
    number = value if type(value) is int or type(value) is float else float(value)
    if not number >= 0:
        raise DataflowValueError(f"Cost({name}=...) must be a number >= 0, got {value!r}")
    return number


def checked_cost(cost: object, op: str) -> Cost:
    """What an op's cost rule returned, when it is a :class:`Cost`; else an error naming the op."""
    if isinstance(cost, Cost):
        return cost
    raise DataflowTypeError(
        f"op {op!r}: its cost rule must return a dataflow.Cost(flops, bytes), got "
        f"{type(cost).__name__}: {cost!r:.60}"
    )


# Rates that turn a Cost into seconds before a kernel has been timed. Deliberately
# conservative (small numpy ops run far below peak), so only really small ops run inline.
FLOP_RATE = 2e10
BYTE_RATE = 1e10


def estimate_seconds(cost: Cost | None) -> float:
    """The time the scheduler assumes an op with this cost takes (0 without a cost rule)."""
    if cost is None:
        return 0.0
    return cost.flops / FLOP_RATE + cost.bytes / BYTE_RATE


class Task:
    """One node of the dataflow graph. Read-only for instruments; owned by its runtime."""

    __slots__ = (
        "__weakref__",
        "args",
        "dependents",
        "error",
        "fn",
        "frozen",
        "handles",
        "id",
        "inputs",
        "kwargs",
        "owner",
        "priority",
        "ready",
        "runtime",
        "sig",
        "state",
        "value",
        "waiters",
        "waiting",
    )

    def __init__(
        self,
        sig: Signature,
        fn: Callable[..., Any] | None,
        args: tuple[Any, ...] | None,
        kwargs: dict[str, Any] | None,
        runtime: Runtime | None,
        inputs: tuple[Task, ...] = (),
    ) -> None:
        self.id: int = _next_id()
        self.sig = sig
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.runtime = runtime
        self.state = PENDING
        self.value: Any = None
        self.error: BaseException | None = None
        # Tasks whose value this one reads (released once it ran, so values can be freed).
        # A done one may be its signature's shared ``light`` record: the value is then in
        # the handle among the arguments (see Pending).
        self.inputs = inputs
        self.dependents: list[Task] | None = None
        self.waiters: list[Any] | None = None
        self.waiting = 0
        # Argument arrays made read-only until the kernel has run (see _protect).
        self.frozen: list[Any] | None = None
        # The handles on a deferred task (is its value still wanted?): the one handle, or a
        # list of them (an op of several outputs), held until it ends; whether anyone else
        # holds one is a count of references (``_scheduler._requests.handles_held``). A weak
        # reference for a forked function's future and a folded stack's handle.
        self.handles: Any = None
        # The request that dispatched it (``_scheduler._requests._Owner``), until it starts.
        self.owner: Any = None
        # When it became READY (perf_counter_ns), recorded only while something observes.
        self.ready = 0
        # Among ready tasks the smallest priority runs first: issue order by default, the
        # static critical-path rank in graph runs.
        self.priority: float = self.id

    @classmethod
    def done(cls, sig: Signature, value: Any, runtime: Runtime | None) -> Task:
        """A task that ran inline at dispatch: DONE with ``value``, no inputs, no dependents.

        Only the fields a finished task is read by are set; the others read as their
        defaults (``__getattr__``): this is the hot path of small ops.
        """
        task = _new_task(cls)
        task.id = _next_id()
        task.sig = sig
        task.state = DONE
        task.value = value
        task.runtime = runtime
        return task

    if not TYPE_CHECKING:  # (to a type checker, a Task has its fields and nothing else)

        def __getattr__(self, name: str) -> Any:
            # Only reached for a slot a done() task left unset.
            if name in _DEFAULTS:
                return _DEFAULTS[name]
            if name == "priority":
                return self.id
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def op(self) -> str:
        """The op's name (or the forked function's)."""
        return self.sig.name

    @property
    def spec(self) -> Any:
        """The output spec(s) the op's meta rule gave."""
        return self.sig.spec

    @property
    def cost(self) -> Cost | None:
        """The cost rule's estimate."""
        return self.sig.cost

    @property
    def name(self) -> str:
        """``op#id``: how errors, traces and logs name the task (built only when asked)."""
        return f"{self.sig.name}#{self.id}"

    def __repr__(self) -> str:
        return f"<Task {self.name} {STATE_NAMES[self.state]}>"

    def raise_error(self) -> None:
        """Raise the failure of a FAILED or CANCELLED task, marking it observed."""
        err = self.error
        if isinstance(err, TaskError):
            err.observed = True
        if err is None:
            err = CancelledTaskError(f"{self.name} was cancelled before it ran")
        raise err


_new_task = object.__new__
# What the fields of a task made by Task.done() read as.
_DEFAULTS: dict[str, Any] = {
    "args": None,
    "dependents": None,
    "error": None,
    "fn": None,
    "frozen": None,
    "handles": None,
    "inputs": (),
    "kwargs": None,
    "owner": None,
    "ready": 0,
    "waiters": None,
    "waiting": 0,
}


class Future(Generic[T_co]):
    """The result of :func:`dataflow.fork` (and the base of every pending value).

    Await it (``await fut`` or ``await dataflow.wait(fut)``) for its value. ``done()``,
    ``result()``, ``exception()`` and ``cancel()`` behave like ``asyncio.Future``'s, except that
    ``result()`` on a future that is not done raises :class:`~dataflow.NotReadyError` with advice.
    """

    __slots__ = ()

    def done(self) -> bool:
        """Whether the value (or an error) is available."""
        raise NotImplementedError

    def result(self) -> T_co:
        """The value; raises the task's error, or NotReadyError when not done yet."""
        raise NotImplementedError

    def exception(self) -> BaseException | None:
        """The task's error (None if it succeeded); NotReadyError when not done yet."""
        raise NotImplementedError

    def cancel(self) -> bool:
        """Cancel the task if it has not finished; returns whether it was cancelled."""
        raise NotImplementedError

    def __await__(self) -> Generator[Any, None, T_co]:
        raise NotImplementedError


def _not_yet(task: Task) -> str:
    """Where an unfinished task stands, for a NotReadyError: the state names alone mislead
    ("is still ready" reads as if the value were ready), so say it in words."""
    state = task.state
    if state == RUNNING:
        return "is still running"
    if state == READY:
        return "is queued and has not run yet"
    waiting = list(dict.fromkeys(t.name for t in task.inputs if t.state < DONE))
    if not waiting:
        return "has not run yet"
    names = ", ".join(waiting[:3]) + (", ..." if len(waiting) > 3 else "")
    return f"is waiting for its input{'s' if len(waiting) > 1 else ''} {names} and has not run yet"


class Pending(Future[T]):
    """A handle on a graph task's value (one output of it when the op has several).

    Ops return these at once; the kernel runs when its inputs are ready. ``ops.Tensor`` derives
    from this class and adds ``shape`` and ``dtype``. Awaiting a handle never blocks a thread:
    if the value is ready it is returned without suspending, otherwise the awaiting coroutine
    is woken when the task completes.
    """

    # __weakref__: a folded stack's handle and a forked function's future are watched weakly.
    # _t: the task. _v: the value itself, when _t is its signature's shared ``light`` task.
    # _id: a light handle's task id, when a profile recorded its op (unset otherwise).
    __slots__ = ("__weakref__", "_id", "_index", "_t", "_v")
    _id: int
    _index: int | None
    _t: Task
    _v: Any

    # An op that ran at dispatch while nothing observed (no profile, trace or instrument)
    # makes no task record of its own: its handle carries the value (``_v``) and points at
    # the signature's shared done task (``Signature.light``, whose value is LIGHT). A small
    # op's call then allocates one object the garbage collector tracks instead of two, which
    # is what a program holding many small results pays most for. ``_task`` (and the public
    # ``task``) makes the handle's own record on first use, so everything outside the
    # dispatch hot path sees a task per handle as before.
    #
    # While recorders observe (a profile), an op run at dispatch gets a light handle too,
    # with the id of its span record in ``_id``: the ops that read it name that id as their
    # input in their own records (``_args.record_ids``), and the task ``_task`` makes takes
    # it, so every edge of the trace still joins the right spans.

    def __init__(self, task: Task, index: int | None = None) -> None:
        self._t = task
        self._index = index

    @property
    def _task(self) -> Task:
        t = self._t
        if t.value is LIGHT:
            t = Task.done(t.sig, self._v, None)
            recorded = getattr(self, "_id", 0)
            if recorded:  # a profile recorded its op: the id its span record has
                t.id = recorded
            self._t = t
        return t

    @_task.setter
    def _task(self, task: Task) -> None:
        self._t = task

    @property
    def task(self) -> Task:
        """The graph task that computes this value."""
        return self._task

    def done(self) -> bool:
        return self._t.state >= DONE

    def result(self) -> T:
        task = self._t
        if task.state == DONE:
            value = task.value
            if value is LIGHT:
                return self._v  # type: ignore[no-any-return]
            return value if self._index is None else value[self._index]  # type: ignore[no-any-return]
        if task.state > DONE:
            task.raise_error()
        raise NotReadyError(
            f"{task.name} {_not_yet(task)}: `await` it (or dataflow.wait) to get its value "
            "without blocking the event loop"
        )

    def exception(self) -> BaseException | None:
        task = self._t
        if task.state == DONE:
            return None
        if task.state > DONE:
            try:
                task.raise_error()
            except BaseException as exc:
                return exc
        raise NotReadyError(f"{task.name} {_not_yet(task)}: await it first")

    def cancel(self) -> bool:
        rt = self._t.runtime  # (None for a light one: done, so nothing to cancel)
        return rt is not None and rt.cancel_task(self._t)

    def __await__(self) -> Generator[Any, None, T]:
        task = self._t
        if task.state < DONE:
            # Only a runtime's tasks can be unfinished (eager tasks complete at creation).
            rt = task.runtime
            assert rt is not None
            try:
                yield from rt.completion(task).__await__()
            except BaseException as exc:
                # A cancellation (perhaps caught above: a timeout scope): what the request
                # dispatched and nobody wants any more is dropped (Requests.await_interrupted).
                rt.await_interrupted(exc, task)
                raise
        return self.result()

    def __repr__(self) -> str:
        task = self._task
        out = "" if self._index is None else f"[{self._index}]"
        return f"<{type(self).__name__} {task.name}{out} {STATE_NAMES[task.state]}>"
