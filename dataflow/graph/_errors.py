"""The graph package's error and warning: a bad graph file, and a trace that may be wrong."""

from __future__ import annotations

from contextvars import ContextVar

from .._errors import DataflowError

__all__ = ["COLLECTED", "GraphFormatError", "TracerWarning"]

#: Where the TracerWarnings of a trace go instead of ``warnings.warn``, when set: a list
#: (``dataflow.compile`` reads its traces' problems from it). A context variable, not
#: ``warnings.catch_warnings``: that swaps process-wide state, and two traces suspended in it
#: at once (concurrent first calls) restored it out of order and left every later warning of
#: the process swallowed.
COLLECTED: ContextVar[list[str] | None] = ContextVar("dataflow_tracer_warnings", default=None)


class GraphFormatError(DataflowError, ValueError):
    """A graph file cannot be read: not a graph archive, truncated or corrupted, written by a
    newer format version, missing a parameter, or naming an op this process cannot find.

    Attributes:
        path: the file.
    """

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class TracerWarning(UserWarning):
    """A traced program did something the graph cannot replay faithfully.

    Tracing records ops, not Python: a program that reads a value (``await t``) and branches or
    computes on it in Python gets a graph specialised to the example inputs. The warning names
    the line; the fix is to keep the computation in ops, or not to trace that part.
    """
