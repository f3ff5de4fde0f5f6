"""Graph capture: trace a program into a graph, print it, optimise it, save it, run it.

``dataflow.trace(fn, *example_inputs)`` records the ops a program issues into a
:class:`~dataflow.Graph` (see ``docs/graph.md``). This package holds the pieces, one concern
per module: the IR (``_ir``), tracing (``_tracing``: the entry points; ``_capture``: the tracer
that records, on ``_tracer_base``: its state, and computing a value the program awaits), the
passes (``_passes``, ``_fusion``; ``_builder``: how a pass builds a new graph; ``_fused``: the
op a fused group runs as, and its kernels), running (``_execute``), printing (``_printer``)
and the file format (``_format``: the format and writing it; ``_read``, ``_decoder``,
``_archive``: reading it).
"""

from __future__ import annotations

from ._errors import GraphFormatError as GraphFormatError
from ._errors import TracerWarning as TracerWarning
from ._execute import Plan as Plan
from ._format import FORMAT_VERSION as FORMAT_VERSION
from ._fused import FusedOp as FusedOp
from ._fusion import fuse_elementwise as fuse_elementwise
from ._ir import ConstRef as ConstRef
from ._ir import Graph as Graph
from ._ir import GraphInput as GraphInput
from ._ir import InputRef as InputRef
from ._ir import Node as Node
from ._ir import NodeRef as NodeRef
from ._ir import ValueType as ValueType
from ._passes import eliminate_common_subexpressions as eliminate_common_subexpressions
from ._passes import eliminate_dead_code as eliminate_dead_code
from ._passes import fold_constants as fold_constants
from ._passes import fold_stack_reductions as fold_stack_reductions
from ._passes import optimize as optimize
from ._read import load as load
from ._read import read as read
from ._tracing import trace as trace
from ._tracing import trace_async as trace_async

del annotations  # the `from __future__` feature, not part of the API (dir())

__all__ = (
    # capture and files
    "trace",
    "trace_async",
    "load",
    "read",
    "FORMAT_VERSION",
    # the IR
    "Graph",
    "GraphInput",
    "Node",
    "NodeRef",
    "InputRef",
    "ConstRef",
    "ValueType",
    "FusedOp",
    "Plan",
    # passes
    "fold_constants",
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "fold_stack_reductions",
    "fuse_elementwise",
    "optimize",
    # errors
    "GraphFormatError",
    "TracerWarning",
)
