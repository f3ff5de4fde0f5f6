"""Recurrent cells as fused ops, and the step ops ``ops.nn.LSTM`` / ``ops.nn.GRU`` run on.

The public cells follow PyTorch's gate order and equations exactly, so weights load unchanged:

* LSTM, gates ``i, f, g, o`` stacked along the first axis of ``w_ih`` (4H, I) and ``w_hh``
  (4H, H)::

      i, f, g, o = split(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh, 4)
      c' = sigmoid(f) * c + sigmoid(i) * tanh(g)
      h' = sigmoid(o) * tanh(c')

* GRU, gates ``r, z, n`` in ``w_ih`` (3H, I) and ``w_hh`` (3H, H)::

      r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
      z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
      n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
      h' = (1 - z) * n + z * h

The modules split a sequence into ops that expose parallelism (see ``ops.nn._rnn``): one large
input projection for all time steps (:func:`rnn_projection`), then one small op per time step
that only adds the recurrent GEMM (:func:`lstm_step`, :func:`gru_step`), then one op that
writes the per-step outputs into the output array (:func:`rnn_output`).

Kernels are written to hold the GIL as little as possible, because several of them run at once
on the inter-op pool: one BLAS GEMM per weight (numpy releases the GIL inside it), then a few
whole-array ufuncs working in place on the gate buffer (all four activations in one ``exp``
pass), never a Python loop over elements. Float32 stays float32 throughout.

This module holds the kernels and declares the ops (so a saved graph names each one
``ops._recurrent:<name>``); their meta and cost rules are in :mod:`ops._recurrent_rules`.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np

from ._checks import array_kernel
from ._recurrent_rules import (
    _GRU_GATES,
    _LSTM_GATES,
    _gru_cell_cost,
    _gru_cell_meta,
    _gru_step_cost,
    _gru_step_meta,
    _lstm_cell_cost,
    _lstm_cell_meta,
    _lstm_step_cost,
    _lstm_step_meta,
    _output_cost,
    _output_meta,
    _projection_cost,
    _projection_meta,
    _select_cost,
    _select_meta,
    _stack_cost,
    _stack_meta,
)
from ._rnn_gates import _lstm_exp_scale
from ._rnn_layout import recurrent_product
from ._tensor import Tensor, declare, declare_multi

__all__ = [
    "gru_cell",
    "lstm_cell",
    # the decomposition ops.nn's modules use
    "gru_step",
    "lstm_step",
    "rnn_output",
    "rnn_projection",
    "select",
    "stack_states",
]

Array: TypeAlias = "np.ndarray[Any, Any]"
ArrayLike: TypeAlias = "Tensor | np.ndarray[Any, Any]"


# -- gate math (kernels' shared pieces) -------------------------------------------------------


# Activations go through exp, the cheapest transcendental ufunc in numpy (tanh is about twice
# its cost on AVX2 machines, and it is what dominates the gate math):
#   sigmoid(x) = 1 / (1 + exp(-x)),  tanh(x) = 2 * sigmoid(2x) - 1.
# exp(-x) overflows to inf for x < -88 in float32, which gives the right limit (1 / inf = 0);
# only the overflow warning is silenced (numpy's errstate is per thread and per context).


def _sigmoid_(a: Array, scale: Any = -1.0) -> None:
    """``a = sigmoid(-scale * a)`` in place (scale -1 gives sigmoid, -2 gives sigmoid(2a))."""
    np.multiply(a, scale, out=a)
    with np.errstate(over="ignore"):
        np.exp(a, out=a)
    np.add(a, 1.0, out=a)
    np.reciprocal(a, out=a)


def _tanh_(a: Array) -> None:
    """``a = tanh(a)`` in place, as ``2 * sigmoid(2a) - 1``."""
    _sigmoid_(a, -2.0)
    np.multiply(a, 2.0, out=a)
    np.subtract(a, 1.0, out=a)


def _lstm_finish(gates: Array, c: Array | None) -> tuple[Array, Array]:
    """(h', c') from the pre-activation ``gates`` (..., 4H), which this overwrites."""
    hidden = gates.shape[-1] // _LSTM_GATES
    # One pass over all four gates: sigmoid on i, f, o and sigmoid(2g) on g...
    _sigmoid_(gates, _lstm_exp_scale(hidden, gates.dtype))
    i = gates[..., :hidden]
    f = gates[..., hidden : 2 * hidden]
    g = gates[..., 2 * hidden : 3 * hidden]
    o = gates[..., 3 * hidden :]
    # ... then tanh(g) = 2 * sigmoid(2g) - 1 on g's columns only.
    np.multiply(g, 2.0, out=g)
    np.subtract(g, 1.0, out=g)
    np.multiply(i, g, out=i)
    if c is None:  # zero initial state: c' = i * g
        c_new = np.array(i)
    else:
        c_new = np.multiply(f, c)
        c_new += i
    h_new = np.array(c_new)
    _tanh_(h_new)
    h_new *= o
    return h_new, c_new


def _gru_finish(gi: Array, gh: Array, h: Array | None) -> Array:
    """h' from the input part ``gi`` (read only) and the recurrent part ``gh`` (overwritten)."""
    hidden = gh.shape[-1] // _GRU_GATES
    rz = gh[..., : 2 * hidden]
    rz += gi[..., : 2 * hidden]
    _sigmoid_(rz)
    r = gh[..., :hidden]
    z = gh[..., hidden : 2 * hidden]
    n = gh[..., 2 * hidden :]
    n *= r
    n += gi[..., 2 * hidden :]
    _tanh_(n)
    # h' = (1 - z) * n + z * h = n + z * (h - n)
    if h is None:
        h_new = np.multiply(z, n)
        np.subtract(n, h_new, out=h_new)
    else:
        h_new = np.subtract(h, n)
        h_new *= z
        h_new += n
    return h_new


def _gemm(a: Array, w: Array) -> Array:
    """``a @ w.T`` in one BLAS call (w.T is a view: BLAS reads it transposed, no copy)."""
    out: Array = np.matmul(a, w.T)
    return out


# -- kernels ----------------------------------------------------------------------------------


def _lstm_cell_kernel(
    x: Array,
    h: Array | None,
    c: Array | None,
    w_ih: Array,
    w_hh: Array,
    b_ih: Array | None,
    b_hh: Array | None,
) -> tuple[Array, Array]:
    gates = _gemm(x, w_ih)
    if h is not None:
        gates += recurrent_product(h, w_hh)
    if b_ih is not None:
        gates += b_ih
    if b_hh is not None:
        gates += b_hh
    return _lstm_finish(gates, c)


def _gru_cell_kernel(
    x: Array,
    h: Array | None,
    w_ih: Array,
    w_hh: Array,
    b_ih: Array | None,
    b_hh: Array | None,
) -> Array:
    gi = _gemm(x, w_ih)
    if b_ih is not None:
        gi += b_ih
    gh = _recurrent_part(h, w_hh, b_hh, gi.shape)
    return _gru_finish(gi, gh, h)


def _recurrent_part(
    h: Array | None, w_hh: Array, b_hh: Array | None, shape: tuple[int, ...]
) -> Array:
    """``h @ w_hh.T + b_hh`` as a fresh buffer (just the bias, or zeros, when h is None)."""
    gh = np.zeros(shape, dtype=w_hh.dtype) if h is None else recurrent_product(h, w_hh)
    if b_hh is not None:
        gh += b_hh
    return gh


def _lstm_step_kernel(
    xproj: Array, t: int, h: Array | None, c: Array | None, w_hh: Array
) -> tuple[Array, Array]:
    if h is None:
        gates = np.array(xproj[t])
    else:
        gates = recurrent_product(h, w_hh)
        gates += xproj[t]
    return _lstm_finish(gates, c)


def _gru_step_kernel(
    xproj: Array, t: int, h: Array | None, w_hh: Array, b_hh: Array | None
) -> Array:
    gi = xproj[t]
    gh = _recurrent_part(h, w_hh, b_hh, gi.shape)
    return _gru_finish(gi, gh, h)


def _projection_kernel(
    x: Array, w_ih: Array, bias: Array | None, batch_first: bool, bias_hh: Array | None = None
) -> Array:
    # One GEMM over every time step: (T*B, I) @ (I, G). A batch-first input is projected in its
    # own order and returned as a (T, B, G) view, so no transposed copy of x is ever made.
    x = np.ascontiguousarray(x)
    out: Array = np.matmul(x.reshape(-1, x.shape[-1]), w_ih.T)
    bias = _bias_sum(bias, bias_hh)
    if bias is not None:
        out += bias
    out = out.reshape(*x.shape[:-1], w_ih.shape[0])
    return out.swapaxes(0, 1) if batch_first else out


def _bias_sum(bias: Array | None, bias_hh: Array | None) -> Array | None:
    """``bias + bias_hh`` (either may be None): the LSTM adds its two biases once, in the
    kernel, so a model passes its ``bias_ih`` and ``bias_hh`` parameters as they are (a traced
    graph then reads both parameters, rather than a sum computed at trace time)."""
    if bias_hh is None:
        return bias
    return bias_hh if bias is None else bias + bias_hh


def _output_kernel(hs_fwd: list[Array], hs_rev: list[Array] | None, batch_first: bool) -> Array:
    steps = len(hs_fwd)
    batch, hidden = hs_fwd[0].shape
    width = hidden if hs_rev is None else 2 * hidden
    shape = (batch, steps, width) if batch_first else (steps, batch, width)
    out = np.empty(shape, dtype=hs_fwd[0].dtype)
    view = out.swapaxes(0, 1) if batch_first else out  # (T, B, D*H) either way
    for t in range(steps):
        view[t, :, :hidden] = hs_fwd[t]
        if hs_rev is not None:
            view[t, :, hidden:] = hs_rev[t]
    return out


def _stack_kernel(arrays: list[Array]) -> Array:
    return np.stack(arrays)


def _select_kernel(a: Array, index: int) -> Array:
    return np.array(a[index])


# -- the ops ----------------------------------------------------------------------------------

# (array_kernel: list inputs converted, numpy's floating-point warnings kept from failing the
# task under ``-W error``, as the other ops' kernels do.)
_lstm_cell = declare_multi(
    "lstm_cell", array_kernel(_lstm_cell_kernel), _lstm_cell_meta, _lstm_cell_cost
)
_gru_cell = declare("gru_cell", array_kernel(_gru_cell_kernel), _gru_cell_meta, _gru_cell_cost)
_lstm_step = declare_multi(
    "lstm_step", array_kernel(_lstm_step_kernel), _lstm_step_meta, _lstm_step_cost
)
_gru_step = declare("gru_step", array_kernel(_gru_step_kernel), _gru_step_meta, _gru_step_cost)
_rnn_projection = declare(
    "rnn_projection", array_kernel(_projection_kernel), _projection_meta, _projection_cost
)
_rnn_output = declare("rnn_output", _output_kernel, _output_meta, _output_cost)
_stack_states = declare("stack_states", _stack_kernel, _stack_meta, _stack_cost)
_select = declare("select", _select_kernel, _select_meta, _select_cost)
# The kernels that call BLAS (a crowd of them gets one BLAS thread each: dataflow._blas).
_lstm_cell.intraop = _gru_cell.intraop = _lstm_step.intraop = True
_gru_step.intraop = _rnn_projection.intraop = True


def lstm_cell(
    x: ArrayLike,
    h: ArrayLike | None,
    c: ArrayLike | None,
    w_ih: ArrayLike,
    w_hh: ArrayLike,
    b_ih: ArrayLike | None = None,
    b_hh: ArrayLike | None = None,
) -> tuple[Tensor, Tensor]:
    """One LSTM step, fused into one op: ``(h', c')`` (like ``torch.nn.LSTMCell``).

    Args:
        x: input, (batch, input_size) or (input_size,).
        h: hidden state, (batch, hidden_size), or None with ``c`` None for zeros.
        c: cell state, same shape as ``h``.
        w_ih: (4*hidden_size, input_size), gates i, f, g, o stacked on axis 0.
        w_hh: (4*hidden_size, hidden_size).
        b_ih: (4*hidden_size,) or None.
        b_hh: (4*hidden_size,) or None.

    Raises:
        OpInputError: a shape does not fit (raised here, naming every input's shape).
        OpTypeError: the dtypes differ or are not floating point.

    Example:
        >>> h1, c1 = ops.lstm_cell(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    """
    result: tuple[Tensor, Tensor] = _lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh)
    return result


def gru_cell(
    x: ArrayLike,
    h: ArrayLike | None,
    w_ih: ArrayLike,
    w_hh: ArrayLike,
    b_ih: ArrayLike | None = None,
    b_hh: ArrayLike | None = None,
) -> Tensor:
    """One GRU step, fused into one op: ``h'`` (like ``torch.nn.GRUCell``).

    Args:
        x: input, (batch, input_size) or (input_size,).
        h: hidden state, (batch, hidden_size), or None for zeros.
        w_ih: (3*hidden_size, input_size), gates r, z, n stacked on axis 0.
        w_hh: (3*hidden_size, hidden_size).
        b_ih: (3*hidden_size,) or None.
        b_hh: (3*hidden_size,) or None.

    Raises:
        OpInputError: a shape does not fit.
        OpTypeError: the dtypes differ or are not floating point.
    """
    result: Tensor = _gru_cell(x, h, w_ih, w_hh, b_ih, b_hh)
    return result


def lstm_step(
    xproj: ArrayLike, t: int, h: ArrayLike | None, c: ArrayLike | None, w_hh: ArrayLike
) -> tuple[Tensor, Tensor]:
    """LSTM step ``t`` given the input projection of all steps: ``(h', c')``.

    ``gates = xproj[t] + h @ w_hh.T``: ``xproj`` (steps, batch, 4H) already holds
    ``x @ w_ih.T + b_ih + b_hh``, so a step costs one (batch, H) x (H, 4H) GEMM.
    """
    result: tuple[Tensor, Tensor] = _lstm_step(xproj, t, h, c, w_hh)
    return result


def gru_step(
    xproj: ArrayLike, t: int, h: ArrayLike | None, w_hh: ArrayLike, b_hh: ArrayLike | None
) -> Tensor:
    """GRU step ``t`` given the input projection ``x @ w_ih.T + b_ih`` of all steps: ``h'``."""
    result: Tensor = _gru_step(xproj, t, h, w_hh, b_hh)
    return result


def rnn_projection(
    x: ArrayLike,
    w_ih: ArrayLike,
    bias: ArrayLike | None,
    batch_first: bool = False,
    bias_hh: ArrayLike | None = None,
) -> Tensor:
    """``x @ w_ih.T + bias`` for every step at once, as (steps, batch, gates*hidden).

    ``bias_hh`` (optional) is added too, in the kernel: an LSTM passes its ``b_ih`` and
    ``b_hh`` as they are, so that a traced graph reads both parameters."""
    if bias_hh is None:
        result: Tensor = _rnn_projection(x, w_ih, bias, batch_first)
    else:
        result = _rnn_projection(x, w_ih, bias, batch_first, bias_hh)
    return result


def rnn_output(
    hs_fwd: list[Tensor], hs_rev: list[Tensor] | None, batch_first: bool = False
) -> Tensor:
    """The per-step states in one array: (steps, batch, D*hidden), reverse states last.

    Both lists are in time order (``hs_rev[t]`` is the reverse direction's state at time t).
    """
    result: Tensor = _rnn_output(hs_fwd, hs_rev, batch_first)
    return result


def stack_states(states: list[Tensor]) -> Tensor:
    """Final states of every layer and direction stacked on a new axis 0."""
    result: Tensor = _stack_states(states)
    return result


def select(a: ArrayLike, index: int) -> Tensor:
    """``a[index]`` along axis 0, as an op (for pending initial states)."""
    result: Tensor = _select(a, index)
    return result
