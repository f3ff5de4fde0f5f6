"""ops: numpy ops for ``dataflow``, returning pending :class:`Tensor` handles at once.

Each op is a numpy kernel, a meta rule (the output's shape and dtype; bad inputs raise here,
at the call) and a cost rule. Names, arguments (``axis=``, ``keepdims=``) and dtype rules are
numpy's. Outside a runtime the ops run eagerly, so the same code is plain numpy.

Example:
    >>> import numpy as np, dataflow, ops
    >>> async def main(x, w):
    ...     return ops.sum(ops.tanh(x @ w), axis=0)
    >>> y = dataflow.run(main, np.ones((4, 3)), np.ones((3, 2)))
"""

from __future__ import annotations

# First: _tensor imports the op modules (for Tensor's operators) once Tensor is defined.
from ._tensor import Tensor as Tensor
from ._tensor import TensorSpec as TensorSpec
from ._tensor import define as define
from ._tensor import spec_of as spec_of

# isort: split
from ._elementwise import abs as abs
from ._elementwise import add as add
from ._elementwise import clip as clip
from ._elementwise import cos as cos
from ._elementwise import divide as divide
from ._elementwise import equal as equal
from ._elementwise import exp as exp
from ._elementwise import greater as greater
from ._elementwise import greater_equal as greater_equal
from ._elementwise import less as less
from ._elementwise import less_equal as less_equal
from ._elementwise import log as log
from ._elementwise import maximum as maximum
from ._elementwise import minimum as minimum
from ._elementwise import multiply as multiply
from ._elementwise import negative as negative
from ._elementwise import not_equal as not_equal
from ._elementwise import power as power
from ._elementwise import relu as relu
from ._elementwise import sigmoid as sigmoid
from ._elementwise import sin as sin
from ._elementwise import sqrt as sqrt
from ._elementwise import square as square
from ._elementwise import subtract as subtract
from ._elementwise import tanh as tanh
from ._elementwise import where as where
from ._indexing import getitem as getitem
from ._linalg import linear as linear
from ._linalg import matmul as matmul
from ._recurrent import gru_cell as gru_cell
from ._recurrent import lstm_cell as lstm_cell
from ._reduce import argmax as argmax
from ._reduce import argmin as argmin
from ._reduce import max as max
from ._reduce import mean as mean
from ._reduce import min as min
from ._reduce import sum as sum
from ._reduce import var as var
from ._rnn_engine import get_recurrent_engine as get_recurrent_engine
from ._rnn_engine import set_recurrent_engine as set_recurrent_engine
from ._rnn_ops import gru_sequence as gru_sequence
from ._rnn_ops import lstm_sequence as lstm_sequence
from ._shape import asarray as asarray
from ._shape import astype as astype
from ._shape import concatenate as concatenate
from ._shape import flip as flip
from ._shape import reshape as reshape
from ._shape import split as split
from ._shape import stack as stack
from ._shape import transpose as transpose
from ._softmax import log_softmax as log_softmax
from ._softmax import softmax as softmax

# isort: split
from . import nn as nn  # last: the modules build on the ops above

del annotations  # the `from __future__` feature, not part of the API (dir(ops))

# A reduction along a stack's new axis is a fold of this binary op (a graph pass rewrites it:
# dataflow.graph.fold_stack_reductions; stack declares itself with `stacks`).
sum.stack_fold = add  # type: ignore[attr-defined]
max.stack_fold = maximum  # type: ignore[attr-defined]
min.stack_fold = minimum  # type: ignore[attr-defined]
# mean: the sum's fold, then divided by the count (numpy's own order: bit for bit). Not for
# float16, which numpy's mean adds up in float32.
mean.stack_fold = add  # type: ignore[attr-defined]
mean.stack_finish = divide  # type: ignore[attr-defined]
mean.stack_fold_dtypes = ("float32", "float64")  # type: ignore[attr-defined]

__all__ = (
    # the pending array
    "Tensor",
    "TensorSpec",
    "define",
    "spec_of",
    # elementwise
    "add",
    "subtract",
    "multiply",
    "divide",
    "power",
    "negative",
    "abs",
    "square",
    "sqrt",
    "exp",
    "log",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "relu",
    "maximum",
    "minimum",
    "clip",
    "where",
    # activations over an axis
    "softmax",
    "log_softmax",
    # comparisons
    "greater",
    "less",
    "equal",
    "not_equal",
    "greater_equal",
    "less_equal",
    # reductions
    "sum",
    "mean",
    "var",
    "max",
    "min",
    "argmax",
    "argmin",
    # linear algebra
    "matmul",
    "linear",
    # shape
    "reshape",
    "transpose",
    "concatenate",
    "stack",
    "split",
    "flip",
    "getitem",
    "asarray",
    "astype",
    # recurrent cells (ops._recurrent) and modules (ops.nn)
    "lstm_cell",
    "gru_cell",
    "lstm_sequence",
    "gru_sequence",
    "set_recurrent_engine",
    "get_recurrent_engine",
    "nn",
)
