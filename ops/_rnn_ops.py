"""The whole-sequence recurrent ops: ``lstm_sequence`` and ``gru_sequence``.

One op runs one layer-direction over every time step (kernels in :mod:`ops._rnn_sequence`):
the input projection in time chunks and the recurrence, in one call. ``ops.nn.LSTM`` and
``ops.nn.GRU`` use them when a step is too small to be worth an op of its own (see
``granularity`` there); they are public for users who write their own recurrent modules.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np

from dataflow import Cost, OpInputError, OpTypeError

from . import _rnn_engine
from ._checks import array_kernel
from ._recurrent import _bias_sum
from ._recurrent_rules import _common_dtype, _describe, _specs
from ._rnn_projection import chunk_steps
from ._rnn_sequence import gru_sequence_kernel, lstm_sequence_kernel
from ._tensor import Tensor, TensorSpec, declare_multi, spec_of

__all__ = ["gru_sequence", "lstm_sequence"]

ArrayLike: TypeAlias = "Tensor | np.ndarray[Any, Any]"
Array: TypeAlias = "np.ndarray[Any, Any]"


def _sequence_meta(
    op: str,
    gates: int,
    named: dict[str, TensorSpec | None],
    reverse: Any,
    batch_first: Any,
    stacked: Any,
) -> tuple[TensorSpec, TensorSpec]:
    """Validate a sequence op's inputs; the specs of its output and of one final state."""
    for flag, value in (("reverse", reverse), ("batch_first", batch_first), ("stacked", stacked)):
        if not isinstance(value, bool | np.bool_):
            raise OpTypeError(
                f"{op}: {flag} must be True or False, got {type(value).__name__}: {value!r}"
            )
    dtype = _common_dtype(op, named)
    x, w_ih, w_hh = named["x"], named["w_ih"], named["w_hh"]
    assert x is not None and w_ih is not None and w_hh is not None

    def bad(what: str) -> OpInputError:
        return OpInputError(f"{op}: {what} (got {_describe(named)})")

    if len(w_hh.shape) != 2 or w_hh.shape[0] != gates * w_hh.shape[1]:
        raise bad(f"w_hh must have shape ({gates}*hidden_size, hidden_size)")
    hidden = w_hh.shape[1]
    if len(w_ih.shape) != 2 or w_ih.shape[0] != gates * hidden:
        raise bad(
            f"w_ih must have shape ({gates}*hidden_size, input_size) = ({gates * hidden}, "
            "input_size)"
        )
    layout = "(batch, steps, input_size)" if batch_first else "(steps, batch, input_size)"
    if len(x.shape) != 3 or x.shape[2] != w_ih.shape[1] or 0 in x.shape:
        raise bad(f"x must have shape {layout} with input_size {w_ih.shape[1]} (from w_ih)")
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    state = (batch, hidden)
    for name in ("h0", "c0"):
        s = named.get(name)
        if s is not None and s.shape != state:
            raise bad(f"{name} must have shape {state} (batch, hidden_size)")
    for name in ("bias", "bias_hh", "b_ih", "b_hh"):
        s = named.get(name)
        if s is not None and s.shape != (gates * hidden,):
            raise bad(f"{name} must have shape ({gates * hidden},) = ({gates}*hidden_size,)")
    out = (batch, steps, hidden) if batch_first else (steps, batch, hidden)
    return TensorSpec(out, dtype), TensorSpec((1, *state) if stacked else state, dtype)


def _lstm_sequence_meta(
    x: Any,
    w_ih: Any,
    bias: Any,
    w_hh: Any,
    h0: Any = None,
    c0: Any = None,
    reverse: Any = False,
    batch_first: Any = False,
    stacked: Any = False,
    bias_hh: Any = None,
) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
    if (h0 is None) != (c0 is None):
        raise OpInputError(
            "lstm_sequence: give both h0 and c0, or neither (None for both means zero state)"
        )
    named = _specs(
        "lstm_sequence", x=x, w_ih=w_ih, bias=bias, w_hh=w_hh, h0=h0, c0=c0, bias_hh=bias_hh
    )
    out, state = _sequence_meta("lstm_sequence", 4, named, reverse, batch_first, stacked)
    return out, state, state


def _gru_sequence_meta(
    x: Any,
    w_ih: Any,
    b_ih: Any,
    w_hh: Any,
    b_hh: Any,
    h0: Any = None,
    reverse: Any = False,
    batch_first: Any = False,
    stacked: Any = False,
) -> tuple[TensorSpec, TensorSpec]:
    named = _specs("gru_sequence", x=x, w_ih=w_ih, b_ih=b_ih, w_hh=w_hh, b_hh=b_hh, h0=h0)
    return _sequence_meta("gru_sequence", 3, named, reverse, batch_first, stacked)


def _sequence_cost(x: Any, w_ih: Any, w_hh: Any, batch_first: Any) -> Cost:
    xs, wi, wh = spec_of(x), spec_of(w_ih), spec_of(w_hh)
    steps, batch = (xs.shape[1], xs.shape[0]) if batch_first else xs.shape[:2]
    width, inputs, hidden = wi.shape[0], wi.shape[1], wh.shape[1]
    rows = steps * batch
    flops = 2.0 * rows * width * (inputs + hidden) + 12.0 * rows * width
    item = wh.dtype.itemsize
    chunk = chunk_steps(steps, batch, width, item) * batch * width * item
    weights = (wi.shape[0] * wi.shape[1] + wh.shape[0] * wh.shape[1]) * item
    moved = xs.shape[0] * xs.shape[1] * xs.shape[2] * item + rows * hidden * item
    return Cost(flops, float(weights + moved + chunk))


def _lstm_sequence_cost(
    x: Any,
    w_ih: Any,
    bias: Any,
    w_hh: Any,
    h0: Any = None,
    c0: Any = None,
    reverse: Any = False,
    batch_first: Any = False,
    stacked: Any = False,
    bias_hh: Any = None,
) -> Cost:
    return _sequence_cost(x, w_ih, w_hh, batch_first)


def _gru_sequence_cost(
    x: Any,
    w_ih: Any,
    b_ih: Any,
    w_hh: Any,
    b_hh: Any,
    h0: Any = None,
    reverse: Any = False,
    batch_first: Any = False,
    stacked: Any = False,
) -> Cost:
    return _sequence_cost(x, w_ih, w_hh, batch_first)


def _lstm_sequence_kernel(
    x: Array,
    w_ih: Array,
    bias: Array | None,
    w_hh: Array,
    h0: Array | None = None,
    c0: Array | None = None,
    reverse: bool = False,
    batch_first: bool = False,
    stacked: bool = False,
    bias_hh: Array | None = None,
) -> tuple[Array, Array, Array]:
    bias = _bias_sum(bias, bias_hh)
    out, h_n, c_n = lstm_sequence_kernel(x, w_ih, bias, w_hh, h0, c0, reverse, batch_first)
    return (out, h_n[None], c_n[None]) if stacked else (out, h_n, c_n)


def _gru_sequence_kernel(
    x: Array,
    w_ih: Array,
    b_ih: Array | None,
    w_hh: Array,
    b_hh: Array | None,
    h0: Array | None = None,
    reverse: bool = False,
    batch_first: bool = False,
    stacked: bool = False,
) -> tuple[Array, Array]:
    out, h_n = gru_sequence_kernel(x, w_ih, b_ih, w_hh, b_hh, h0, reverse, batch_first)
    return (out, h_n[None]) if stacked else (out, h_n)


# (array_kernel: list inputs converted, floating-point warnings as numpy's, see _recurrent.)
_lstm_sequence = declare_multi(
    "lstm_sequence", array_kernel(_lstm_sequence_kernel), _lstm_sequence_meta, _lstm_sequence_cost
)
_gru_sequence = declare_multi(
    "gru_sequence", array_kernel(_gru_sequence_kernel), _gru_sequence_meta, _gru_sequence_cost
)
# Their kernels call BLAS (numba's loops too, for the input projection): with the intra-op
# count left unset, two side by side make a crowd however short they are (dataflow._blas).
_lstm_sequence.intraop = True
_gru_sequence.intraop = True


def _forget_learnt() -> None:
    """The recurrent engine changed: the sequence ops' signatures (kernel times, GIL
    estimates) start over."""
    for op in (_lstm_sequence, _gru_sequence):
        op._sigs.clear()
        op._outcomes.clear()


_rnn_engine._on_engine_change.append(_forget_learnt)


def lstm_sequence(
    x: ArrayLike,
    w_ih: ArrayLike,
    bias: ArrayLike | None,
    w_hh: ArrayLike,
    h0: ArrayLike | None = None,
    c0: ArrayLike | None = None,
    reverse: bool = False,
    batch_first: bool = False,
    stacked: bool = False,
    bias_hh: ArrayLike | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One LSTM layer-direction over a whole sequence, as one op: ``(output, h_n, c_n)``.

    Args:
        x: (steps, batch, input_size), or (batch, steps, input_size) with ``batch_first``.
        w_ih: (4*hidden_size, input_size), gates i, f, g, o stacked on axis 0 (torch's).
        bias: ``b_ih + b_hh`` (4*hidden_size,), or None.
        w_hh: (4*hidden_size, hidden_size), in either memory order.
        h0, c0: initial states (batch, hidden_size), or both None for zeros.
        reverse: run from the last step to the first (a bidirectional layer's reverse
            direction); the output stays in time order and h_n is the state after step 0.
        batch_first: x and the output are batch-major.
        stacked: h_n and c_n as (1, batch, hidden_size), the layout ``torch.nn.LSTM``
            returns for one layer and direction (views of the kernel's own states: no
            copy, and no op of their own to dispatch and run).
        bias_hh: a second bias (4*hidden_size,), added to ``bias`` in the kernel: pass
            ``b_ih, ..., bias_hh=b_hh`` as they are rather than their sum, and a traced graph
            reads both (a sum computed in numpy is a constant to the tracer, frozen at trace
            time: ``ops.nn.LSTM`` passes its biases this way).

    Returns:
        output (steps, batch, hidden_size) (batch-major with ``batch_first``), h_n and c_n
        (batch, hidden_size), or (1, batch, hidden_size) with ``stacked``; all pending.

    Raises:
        OpInputError: a shape does not fit (naming every input's shape and dtype).
        OpTypeError: dtypes differ or are not floating point; a flag is not a bool.

    Example:
        >>> out, h_n, c_n = ops.lstm_sequence(x, w_ih, b_ih + b_hh, w_hh)
    """
    if bias_hh is None:
        result: tuple[Tensor, Tensor, Tensor] = _lstm_sequence(
            x, w_ih, bias, w_hh, h0, c0, reverse, batch_first, stacked
        )
    else:
        result = _lstm_sequence(x, w_ih, bias, w_hh, h0, c0, reverse, batch_first, stacked, bias_hh)
    return result


def gru_sequence(
    x: ArrayLike,
    w_ih: ArrayLike,
    b_ih: ArrayLike | None,
    w_hh: ArrayLike,
    b_hh: ArrayLike | None,
    h0: ArrayLike | None = None,
    reverse: bool = False,
    batch_first: bool = False,
    stacked: bool = False,
) -> tuple[Tensor, Tensor]:
    """One GRU layer-direction over a whole sequence, as one op: ``(output, h_n)``.

    Arguments as for :func:`lstm_sequence`, with gates r, z, n and both biases separate
    (``b_hh``'s n part is multiplied by r, so it cannot be folded into the projection).
    """
    result: tuple[Tensor, Tensor] = _gru_sequence(
        x, w_ih, b_ih, w_hh, b_hh, h0, reverse, batch_first, stacked
    )
    return result
