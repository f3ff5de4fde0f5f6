"""dataflow: an asyncio dataflow scheduler for numpy model code.

``fork``/``wait`` bring ``torch.jit.fork``/``torch.jit.wait`` to ``async def`` Python; ops
declared with :func:`op` return pending values at once and run as soon as their inputs are
ready, on a bounded pool of inter-op threads, so independent work overlaps by itself.
"""

from __future__ import annotations

from ._api import in_model_code as in_model_code
from ._api import materialize as materialize
from ._api import model_code as model_code
from ._api import run as run
from ._compile import Compiled as Compiled
from ._compile import compile as compile
from ._errors import CancelledTaskError as CancelledTaskError
from ._errors import DataflowError as DataflowError
from ._errors import DataflowRuntimeError as DataflowRuntimeError
from ._errors import DataflowTypeError as DataflowTypeError
from ._errors import DataflowValueError as DataflowValueError
from ._errors import NoRuntimeError as NoRuntimeError
from ._errors import NotReadyError as NotReadyError
from ._errors import OpIndexError as OpIndexError
from ._errors import OpInputError as OpInputError
from ._errors import OpNotFoundError as OpNotFoundError
from ._errors import OpOutputError as OpOutputError
from ._errors import OpOverflowError as OpOverflowError
from ._errors import OpTimeoutError as OpTimeoutError
from ._errors import OpTypeError as OpTypeError
from ._errors import TaskError as TaskError
from ._errors import UnobservedTaskError as UnobservedTaskError
from ._fork import fork as fork
from ._fork import wait as wait
from ._instrument import Instrument as Instrument
from ._instrument import add_instrument as add_instrument
from ._instrument import remove_instrument as remove_instrument
from ._logging import TaskLogger as TaskLogger
from ._lookup import current_runtime as current_runtime
from ._op import Op as Op
from ._op import op as op
from ._profile import Profiler as Profiler
from ._profile import profile as profile
from ._protect import frozen_by as frozen_by
from ._record import Recorder as Recorder
from ._registry import set_array_handle as set_array_handle
from ._runtime import Runtime as Runtime
from ._scheduler import get_inline_threshold as get_inline_threshold
from ._scheduler import set_inline_threshold as set_inline_threshold
from ._signature import Signature as Signature
from ._summary import Summary as Summary
from ._task import Cost as Cost
from ._task import Future as Future
from ._task import Pending as Pending
from ._task import Task as Task
from ._task import estimate_seconds as estimate_seconds
from ._threads import get_num_interop_threads as get_num_interop_threads
from ._threads import get_num_threads as get_num_threads
from ._threads import parallel_info as parallel_info
from ._threads import set_num_interop_threads as set_num_interop_threads
from ._threads import set_num_threads as set_num_threads
from ._trace import Span as Span
from ._trace import TaskSpan as TaskSpan
from ._trace import Trace as Trace
from .graph import Graph as Graph
from .graph import GraphFormatError as GraphFormatError
from .graph import TracerWarning as TracerWarning
from .graph import load as load
from .graph import trace as trace

# Errors name their public module in tracebacks and reprs (``dataflow.TaskError``, not
# ``dataflow._errors.TaskError``); pickles (Dask sends errors back) find them here too.
for _error in (
    DataflowError,
    DataflowTypeError,
    DataflowValueError,
    DataflowRuntimeError,
    OpOutputError,
    NoRuntimeError,
    NotReadyError,
    OpInputError,
    OpIndexError,
    OpOverflowError,
    OpTypeError,
    OpNotFoundError,
    OpTimeoutError,
    TaskError,
    CancelledTaskError,
    UnobservedTaskError,
    GraphFormatError,
    TracerWarning,
):
    _error.__module__ = __name__
del _error
del annotations  # the `from __future__` feature, not part of the API (dir(dataflow))

__all__ = (
    # tasks
    "fork",
    "wait",
    "run",
    "materialize",
    "model_code",
    "in_model_code",
    "frozen_by",
    "Runtime",
    "current_runtime",
    "Future",
    "Pending",
    "Task",
    "Signature",
    # compiled forwards
    "compile",
    "Compiled",
    # ops
    "op",
    "set_array_handle",
    "Op",
    "Cost",
    "set_inline_threshold",
    "get_inline_threshold",
    "estimate_seconds",
    # threads
    "set_num_interop_threads",
    "get_num_interop_threads",
    "set_num_threads",
    "get_num_threads",
    "parallel_info",
    # instruments
    "Instrument",
    "add_instrument",
    "remove_instrument",
    # profiling and logging
    "profile",
    "Profiler",
    "Recorder",
    "Summary",
    "Trace",
    "TaskSpan",
    "Span",
    "TaskLogger",
    # graph capture
    "trace",
    "load",
    "Graph",
    "TracerWarning",
    # errors
    "DataflowError",
    "DataflowTypeError",
    "DataflowValueError",
    "DataflowRuntimeError",
    "NoRuntimeError",
    "NotReadyError",
    "OpInputError",
    "OpIndexError",
    "OpOverflowError",
    "OpTypeError",
    "OpOutputError",
    "OpNotFoundError",
    "OpTimeoutError",
    "TaskError",
    "CancelledTaskError",
    "UnobservedTaskError",
    "GraphFormatError",
)
