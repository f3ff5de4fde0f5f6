"""The one exception hierarchy of ``dataflow``.

Every error the library raises on purpose derives from :class:`DataflowError`. Errors about
bad arguments also derive from the builtin a user would expect (``TypeError``, ``ValueError``),
so ``except ValueError`` keeps working for code written against plain numpy.
"""

from __future__ import annotations

__all__ = [
    "CancelledTaskError",
    "DataflowError",
    "DataflowTypeError",
    "DataflowValueError",
    "NoRuntimeError",
    "NotReadyError",
    "OpInputError",
    "OpTypeError",
    "OpOutputError",
    "OpTimeoutError",
    "TaskError",
    "UnobservedTaskError",
    "describe",
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


class NoRuntimeError(DataflowError, RuntimeError):
    """An API that needs a running runtime was called outside of one."""


class NotReadyError(DataflowError, RuntimeError):
    """A pending value was read synchronously before it was computed."""


class OpInputError(DataflowError, ValueError):
    """An op was called with inputs of the wrong shape or value (raised at the call site)."""


class OpTypeError(DataflowError, TypeError):
    """An op was called with inputs of the wrong type or dtype (raised at the call site)."""


class OpOutputError(DataflowError, TypeError):
    """A kernel returned a value that does not match what its op's meta rule declared."""


class TaskError(DataflowError):
    """A task (an op's kernel or a forked function) raised.

    The original exception is chained as ``__cause__``, so its traceback is shown too.
    Every value that depends on the failed task raises this same error when awaited.

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

    ``what`` prefixes the task's name (``"forked task "``). The message stays printable even
    when ``str(exc)`` raises (see :func:`describe`).
    """
    err = TaskError(f"{what}{name} failed: {describe(exc)}", task=name, op=op)
    err.__cause__ = exc
    return err


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
