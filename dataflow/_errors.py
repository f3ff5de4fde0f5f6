"""The one exception hierarchy of ``dataflow``.

Every error the library raises on purpose derives from :class:`DataflowError`. Errors about
bad arguments also derive from the builtin a user would expect (``TypeError``, ``ValueError``),
so ``except ValueError`` keeps working for code written against plain numpy.

The rule, for ``dataflow/`` and ``ops/`` (``tests/test_errors.py`` scans both and fails on a
break, naming the file and line):

* never ``raise TypeError(...)`` (or any builtin exception) directly: raise the
  :class:`DataflowError` subclass that also derives from that builtin, so both
  ``except TypeError`` and ``except dataflow.DataflowError`` catch it --
  :class:`DataflowTypeError`, :class:`DataflowValueError`, :class:`DataflowRuntimeError`,
  :class:`OpNotFoundError` (``LookupError``), or a more precise one (:class:`OpTypeError`,
  :class:`OpInputError`, ``GraphFormatError``, ...). The message names the function and the
  argument, and says what was expected and what was given;
* an exception class the packages define derives from :class:`DataflowError` too, unless it
  never leaves the library (an internal signal caught where it is raised);
* allowed as they are: a bare ``raise`` (re-raising what was caught), an abstract method whose
  whole body is ``raise NotImplementedError``, ``AttributeError`` from ``__getattr__`` (the
  attribute protocol), and the few sites the scan test lists by name with the reason (an
  ``OSError`` from the file system, an error that mirrors the event loop's own).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = [
    "CancelledTaskError",
    "DataflowError",
    "DataflowRuntimeError",
    "DataflowTypeError",
    "DataflowValueError",
    "NoRuntimeError",
    "NotReadyError",
    "OpIndexError",
    "OpInputError",
    "OpNotFoundError",
    "OpOverflowError",
    "OpTypeError",
    "OpOutputError",
    "OpTimeoutError",
    "TaskError",
    "UnobservedTaskError",
    "describe",
    "task_error",
    "task_error_type",
    "task_failed",
]


def describe(exc: BaseException) -> str:
    """``"Type: message"`` for an error message, even when ``str(exc)`` itself raises.

    The scheduler builds a TaskError from whatever a kernel raised; an exception whose
    ``__str__`` is broken must still fail its task rather than escape from a worker thread.
    """
    try:
        text = str(exc)
    except BaseException as inner:
        text = f"<str() of the exception raised {type(inner).__name__}>"
    return f"{type(exc).__name__}: {text}"


class DataflowError(Exception):
    """Base class of every error raised by ``dataflow`` on purpose."""


class DataflowTypeError(DataflowError, TypeError):
    """An argument of the wrong type was passed to dataflow (names the argument)."""


class DataflowValueError(DataflowError, ValueError):
    """An argument of the right type but a wrong value was passed to dataflow."""


class DataflowRuntimeError(DataflowError, RuntimeError):
    """A call that is valid in general is not possible in the library's current state.

    For example, resizing the shared inter-op pool while it is running.
    """


class NoRuntimeError(DataflowError, RuntimeError):
    """An API that needs a running runtime was called outside of one."""


class NotReadyError(DataflowError, RuntimeError):
    """A pending value was read synchronously before it was computed."""


class OpInputError(DataflowError, ValueError):
    """An op was called with inputs of the wrong shape or value (raised at the call site)."""


class OpTypeError(DataflowError, TypeError):
    """An op was called with inputs of the wrong type or dtype (raised at the call site)."""


class OpIndexError(OpInputError, IndexError):
    """An index that does not fit the array (out of range, too many, a mask of another shape):
    an ``IndexError``, as numpy's, and an :class:`OpInputError` (raised at the call site)."""


class OpOverflowError(OpInputError, OverflowError):
    """A Python int argument out of the range of the dtype the op computes in: an
    ``OverflowError``, as numpy's, and an :class:`OpInputError` (raised at the call site)."""


class OpNotFoundError(DataflowError, LookupError):
    """An op named by its qualified name (``module:name``) is not declared where it is looked up.

    Raised on a Dask worker whose import of the op's module declares no op of that name (the
    worker runs other code than the client).
    """


class OpOutputError(DataflowError, TypeError):
    """A kernel returned a value that does not match what its op's meta rule declared."""


class TaskError(DataflowError):
    """A task (an op's kernel or a forked function) raised.

    The original exception is chained as ``__cause__``, so its traceback (down to the
    kernel's frame) is shown too. The error raised is also an instance of the original's
    type (``TaskError[ValueError]`` is both), so ``except ValueError`` works around an
    ``await`` as it would around the plain numpy call. Every value that depends on the failed
    task raises this same error when awaited.

    Attributes:
        task: the failed task's name, e.g. ``"matmul#12"``.
        op: the op's name (``"matmul"``), or the forked function's qualified name.
    """

    def __init__(self, message: str, *, task: str, op: str) -> None:
        super().__init__(message)
        self.task = task
        self.op = op
        # Set once the error reached user code (raised by an await, result() or exception()).
        # A runtime reports failures nobody observed when it closes, so none is lost.
        self.observed = False


def task_failed(name: str, op: str, exc: BaseException, what: str = "") -> TaskError:
    """The TaskError for task ``name`` whose kernel (or function) raised ``exc``, chained to it.

    The error is also an instance of ``exc``'s own type (see :func:`task_error_type`), so
    ``except ValueError`` around an ``await`` catches a kernel's ValueError, as asyncio and
    concurrent.futures re-raise the original. ``what`` prefixes the task's name (``"forked
    task "``). The message stays printable even when ``str(exc)`` raises (:func:`describe`).
    """
    return task_error(exc, f"{what}{name} failed: {describe(exc)}", task=name, op=op)


def task_error(exc: BaseException, message: str, *, task: str, op: str) -> TaskError:
    """The TaskError of ``exc``'s type (:func:`task_error_type`) saying ``message``, chained
    to ``exc``; an exception group's holds the group's exceptions too, so ``except*`` around
    an ``await`` splits it as it would the group itself."""
    cls = task_error_type(type(exc))
    make: Callable[..., TaskError] = cls  # (a group's constructor takes its exceptions too)
    if isinstance(exc, BaseExceptionGroup) and issubclass(cls, BaseExceptionGroup):
        err = make(message, exc.exceptions, task=task, op=op)
    else:
        err = make(message, task=task, op=op)
    err.__cause__ = exc
    return err


# Exception type -> the TaskError subclass that is also that type (see task_error_type).
_dual_types: dict[type[BaseException], type[TaskError]] = {}


def task_error_type(cls: type[BaseException]) -> type[TaskError]:
    """``TaskError[cls]``: a subclass of both :class:`TaskError` and ``cls``, made once.

    A TaskError subclass stands for itself (a forked task that let an op's error through
    keeps its type). An ``ExceptionGroup`` (what a task group inside a forked coroutine
    raises) gives a TaskError that is an exception group too, of the same exceptions
    (:func:`task_error` builds it), so ``except*`` sees them; one of a subclass whose
    constructor cannot take that gives ``TaskError[ExceptionGroup]``. Exceptions that are
    not ``Exception`` subclasses (KeyboardInterrupt, SystemExit, ...), StopIteration (PEP 479
    would turn it into a RuntimeError inside the awaiting coroutine), and the few types that
    cannot be combined with another base (a C layout conflict, a constructor that refuses a
    message) give plain TaskError.
    """
    if issubclass(cls, TaskError):
        return cls
    if not issubclass(cls, Exception) or issubclass(cls, StopIteration | StopAsyncIteration):
        # (A StopIteration raised inside a coroutine turns into a RuntimeError: PEP 479.)
        return TaskError
    found = _dual_types.get(cls)
    if found is not None:
        return found
    group = issubclass(cls, BaseExceptionGroup)
    space: dict[str, object] = {
        "__module__": "dataflow",
        "__reduce__": _reduce_dual,
        "__str__": TaskError.__str__,
    }
    if group:  # (a group's constructor takes its exceptions)
        space["__new__"] = _group_new
        space["__init__"] = _group_init
    try:
        made: type[TaskError] = type(f"TaskError[{cls.__qualname__}]", (TaskError, cls), space)
        probe = ((Exception("probe"),),) if group else ()  # (a group's: its exceptions)
        made("probe", *probe, task="probe#0", op="probe")  # some types' constructors refuse this
    except Exception:
        made = TaskError
    if made is TaskError and group and cls is not ExceptionGroup:
        made = task_error_type(ExceptionGroup)
    if len(_dual_types) < 1024:
        _dual_types[cls] = made
    return made


def _group_new(
    cls: type[BaseExceptionGroup[Exception]],
    message: str,
    exceptions: tuple[Exception, ...],
    *,
    task: str,
    op: str,
) -> BaseExceptionGroup[Exception]:
    return BaseExceptionGroup.__new__(cls, message, exceptions)


def _group_init(
    self: TaskError, message: str, exceptions: tuple[Exception, ...], *, task: str, op: str
) -> None:
    TaskError.__init__(self, message, task=task, op=op)
    self.args = (message,)  # (a group type's own __init__ may have kept its exceptions there)


def _reduce_dual(self: TaskError) -> tuple[object, ...]:
    # Dual types are made at run time, so they pickle as "the TaskError for that type".
    base = next(b for b in type(self).__bases__ if b is not TaskError)
    exceptions = getattr(self, "exceptions", None)
    return (_rebuild, (base, str(self), self.task, self.op, exceptions))


def _rebuild(
    base: type[BaseException],
    message: str,
    task: str,
    op: str,
    exceptions: tuple[Exception, ...] | None = None,
) -> TaskError:
    make: Callable[..., TaskError] = task_error_type(base)
    if exceptions is not None:  # (a group's constructor takes its exceptions too)
        return make(message, exceptions, task=task, op=op)
    return make(message, task=task, op=op)


class OpTimeoutError(TaskError, TimeoutError):
    """An op's kernel ran longer than its timeout."""


class CancelledTaskError(DataflowError):
    """A value was awaited whose task was cancelled before it ran."""


class UnobservedTaskError(DataflowError):
    """Raised at runtime exit when tasks failed and nobody awaited their result.

    Attributes:
        errors: the failures, oldest first.
    """

    def __init__(self, errors: list[BaseException]) -> None:
        names = ", ".join(getattr(e, "task", type(e).__name__) for e in errors[:5])
        more = f" and {len(errors) - 5} more" if len(errors) > 5 else ""
        super().__init__(
            f"{len(errors)} task(s) failed and nobody awaited them: {names}{more}. "
            "Await every fork() future (or keep the result) to handle its error; "
            "the first failure is chained below."
        )
        self.errors = errors
