"""The meta and cost rules of the recurrent ops (:mod:`ops._recurrent` declares the ops).

A meta rule runs at the call site, before anything is queued. The cell and step rules check
every input against the gate layout: ``w_hh`` (G*H, H) fixes hidden_size H and ``w_ih``
(G*H, I) the input size, with G gates stacked on axis 0 (4 for an LSTM, i, f, g, o; 3 for a
GRU, r, z, n); the states are (batch, H) and the biases (G*H,). A shape that does not fit
raises :class:`~dataflow.OpInputError` naming the op and what it should be, with every
input's shape and dtype (:func:`_describe`); inputs of mixed or non-floating dtypes raise
:class:`~dataflow.OpTypeError`, which says how to convert them (:func:`_common_dtype`).

A cost rule estimates from the specs alone what the kernel will do (:class:`~dataflow.Cost`):
its flops (a GEMM's 2 * rows * inner * G * H, plus about 8 per gate element for the gate math)
and the bytes it touches (its inputs, and the gate buffer written and read back). The ops that
only move states (``rnn_output``, ``stack_states``, ``select``) cost no flops and twice the
bytes they copy.

:func:`_specs`, :func:`_describe` and :func:`_common_dtype` serve the whole-sequence ops'
rules too (:mod:`ops._rnn_ops`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dataflow import Cost, OpInputError, OpTypeError

from ._checks import dtype_of, operand
from ._tensor import TensorSpec, spec_of

# Every name is private to the recurrent ops' modules (_recurrent, _rnn_ops).
__all__: list[str] = []

_LSTM_GATES = 4
_GRU_GATES = 3


# -- meta rules -------------------------------------------------------------------------------


def _describe(named: dict[str, TensorSpec | None]) -> str:
    return ", ".join(f"{k} {v!r}" for k, v in named.items() if v is not None)


#: The inputs no recurrent op can do without (the others may be None).
_REQUIRED = frozenset(("x", "w_ih", "w_hh"))


def _specs(op: str = "", /, **values: Any) -> dict[str, TensorSpec | None]:
    """Each input's spec, by name (None stays None where the op allows it).

    Meta rules pass ``op``: an input that is not a numeric array (a ragged list, a string, an
    ndarray subclass) or a required one that is None is refused naming ``op`` and the input.
    Cost rules run after the meta rule passed, and pass no ``op``.
    """
    named: dict[str, TensorSpec | None] = {}
    for k, v in values.items():
        if v is None:
            if op and k in _REQUIRED:
                raise OpTypeError(f"{op}: {k} is None, but it is required: pass an array")
            named[k] = None
        elif op:
            shape, key = operand(op, k, v)
            named[k] = TensorSpec(shape, dtype_of(key))
        else:
            named[k] = spec_of(v)
    return named


def _common_dtype(op: str, named: dict[str, TensorSpec | None]) -> np.dtype[Any]:
    """The one floating dtype of every given input, or an OpTypeError naming them all."""
    dtypes = {v.dtype for v in named.values() if v is not None}
    dtype = next(iter(dtypes))
    if len(dtypes) != 1 or dtype.kind != "f":
        raise OpTypeError(
            f"{op}: every input must have the same floating-point dtype, got "
            f"{_describe(named)}; convert them with .astype(np.float32)"
        )
    return dtype


def _cell_meta(
    op: str,
    gates: int,
    named: dict[str, TensorSpec | None],
) -> TensorSpec:
    """Validate a cell's inputs (x, h, [c], w_ih, w_hh, b_ih, b_hh); the spec of h'."""
    dtype = _common_dtype(op, named)
    x, w_ih, w_hh = named["x"], named["w_ih"], named["w_hh"]
    assert x is not None and w_ih is not None and w_hh is not None
    names = "i, f, g, o" if gates == _LSTM_GATES else "r, z, n"

    def bad(what: str) -> OpInputError:
        return OpInputError(f"{op}: {what} (got {_describe(named)})")

    if len(w_hh.shape) != 2 or w_hh.shape[0] != gates * w_hh.shape[1]:
        raise bad(
            f"w_hh must have shape ({gates}*hidden_size, hidden_size) with gates {names} "
            f"stacked on axis 0"
        )
    hidden = w_hh.shape[1]
    if len(w_ih.shape) != 2 or w_ih.shape[0] != gates * hidden:
        raise bad(
            f"w_ih must have shape ({gates}*hidden_size, input_size) = ({gates * hidden}, "
            f"input_size) for hidden_size {hidden} (from w_hh)"
        )
    if len(x.shape) not in (1, 2) or x.shape[-1] != w_ih.shape[1]:
        raise bad(
            f"x must have shape (batch, input_size) or (input_size,) with input_size "
            f"{w_ih.shape[1]} (from w_ih)"
        )
    state_shape = (*x.shape[:-1], hidden)
    for name in ("h", "c"):
        s = named.get(name)
        if s is not None and s.shape != state_shape:
            raise bad(f"{name} must have shape {state_shape} (x's batch, hidden_size {hidden})")
    for name in ("b_ih", "b_hh"):
        s = named.get(name)
        if s is not None and s.shape != (gates * hidden,):
            raise bad(f"{name} must have shape ({gates * hidden},) = ({gates}*hidden_size,)")
    return TensorSpec(state_shape, dtype)


def _lstm_cell_meta(
    x: Any, h: Any, c: Any, w_ih: Any, w_hh: Any, b_ih: Any = None, b_hh: Any = None
) -> tuple[TensorSpec, TensorSpec]:
    if (h is None) != (c is None):
        raise OpInputError(
            "lstm_cell: give both h and c, or neither (None for both means zero initial state)"
        )
    named = _specs("lstm_cell", x=x, h=h, c=c, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh)
    spec = _cell_meta("lstm_cell", _LSTM_GATES, named)
    return spec, spec


def _gru_cell_meta(
    x: Any, h: Any, w_ih: Any, w_hh: Any, b_ih: Any = None, b_hh: Any = None
) -> TensorSpec:
    named = _specs("gru_cell", x=x, h=h, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh)
    return _cell_meta("gru_cell", _GRU_GATES, named)


def _step_meta(
    op: str, gates: int, xproj: Any, t: Any, named: dict[str, TensorSpec | None]
) -> TensorSpec:
    named = {"xproj": spec_of(xproj), **named}
    dtype = _common_dtype(op, named)
    xp, w_hh = named["xproj"], named["w_hh"]
    assert xp is not None and w_hh is not None
    if len(w_hh.shape) != 2 or w_hh.shape[0] != gates * w_hh.shape[1]:
        raise OpInputError(
            f"{op}: w_hh must have shape ({gates}*hidden_size, hidden_size) "
            f"(got {_describe(named)})"
        )
    hidden = w_hh.shape[1]
    if len(xp.shape) != 3 or xp.shape[2] != gates * hidden:
        raise OpInputError(
            f"{op}: xproj must have shape (steps, batch, {gates}*hidden_size) = "
            f"(steps, batch, {gates * hidden}) (got {_describe(named)})"
        )
    if not isinstance(t, int) or not 0 <= t < xp.shape[0]:
        raise OpInputError(f"{op}: t must be a step index in [0, {xp.shape[0]}), got {t!r}")
    state_shape = (xp.shape[1], hidden)
    for name in ("h", "c"):
        s = named.get(name)
        if s is not None and s.shape != state_shape:
            raise OpInputError(
                f"{op}: {name} must have shape {state_shape} (got {_describe(named)})"
            )
    b = named.get("b_hh")
    if b is not None and b.shape != (gates * hidden,):
        raise OpInputError(
            f"{op}: b_hh must have shape ({gates * hidden},) (got {_describe(named)})"
        )
    return TensorSpec(state_shape, dtype)


def _lstm_step_meta(xproj: Any, t: Any, h: Any, c: Any, w_hh: Any) -> tuple[TensorSpec, TensorSpec]:
    spec = _step_meta("lstm_step", _LSTM_GATES, xproj, t, _specs("lstm_step", h=h, c=c, w_hh=w_hh))
    return spec, spec


def _gru_step_meta(xproj: Any, t: Any, h: Any, w_hh: Any, b_hh: Any) -> TensorSpec:
    named = _specs("gru_step", h=h, w_hh=w_hh, b_hh=b_hh)
    return _step_meta("gru_step", _GRU_GATES, xproj, t, named)


def _projection_meta(
    x: Any, w_ih: Any, bias: Any, batch_first: bool, bias_hh: Any = None
) -> TensorSpec:
    named = _specs("rnn_projection", x=x, w_ih=w_ih, bias=bias, bias_hh=bias_hh)
    dtype = _common_dtype("rnn_projection", named)
    xs, ws = named["x"], named["w_ih"]
    assert xs is not None and ws is not None
    if len(ws.shape) != 2 or len(xs.shape) != 3 or xs.shape[2] != ws.shape[1]:
        raise OpInputError(
            "rnn_projection: x must have shape (steps, batch, input_size) (or batch-first) and "
            f"w_ih (gates*hidden_size, input_size) (got {_describe(named)})"
        )
    for name in ("bias", "bias_hh"):
        bs = named[name]
        if bs is not None and bs.shape != (ws.shape[0],):
            raise OpInputError(
                f"rnn_projection: {name} must have shape ({ws.shape[0]},) (got {_describe(named)})"
            )
    steps, batch = (xs.shape[1], xs.shape[0]) if batch_first else xs.shape[:2]
    return TensorSpec((steps, batch, ws.shape[0]), dtype)


def _output_meta(hs_fwd: list[Any], hs_rev: list[Any] | None, batch_first: bool) -> TensorSpec:
    specs = [spec_of(h) for h in hs_fwd] + [spec_of(h) for h in hs_rev or ()]
    if not hs_fwd or (hs_rev is not None and len(hs_rev) != len(hs_fwd)):
        raise OpInputError(
            "rnn_output: needs one state per step for each direction, got "
            f"{len(hs_fwd)} forward and {len(hs_rev or ())} reverse"
        )
    first = specs[0]
    if len(first.shape) != 2 or any(s != first for s in specs):
        raise OpInputError(
            f"rnn_output: every step's state must be 2-D with one shape and dtype, got "
            f"{sorted({repr(s) for s in specs})}"
        )
    batch, hidden = first.shape
    width = hidden if hs_rev is None else 2 * hidden
    steps = len(hs_fwd)
    shape = (batch, steps, width) if batch_first else (steps, batch, width)
    return TensorSpec(shape, first.dtype)


def _stack_meta(arrays: list[Any]) -> TensorSpec:
    specs = [spec_of(a) for a in arrays]
    if not specs or any(s != specs[0] for s in specs):
        raise OpInputError(
            f"stack_states: needs states of one shape and dtype, got {[repr(s) for s in specs]}"
        )
    return TensorSpec((len(specs), *specs[0].shape), specs[0].dtype)


def _select_meta(a: Any, index: int) -> TensorSpec:
    s = spec_of(a)
    if not s.shape or not -s.shape[0] <= index < s.shape[0]:
        raise OpInputError(f"select: index {index} is out of range for {s!r}")
    return TensorSpec(s.shape[1:], s.dtype)


# -- cost rules -------------------------------------------------------------------------------


def _nbytes(*specs: TensorSpec | None) -> float:
    total = 0
    for s in specs:
        if s is not None:
            n = 1
            for d in s.shape:
                n *= d
            total += n * s.dtype.itemsize
    return float(total)


def _cell_cost(gates: int, named: dict[str, TensorSpec | None], with_x: bool) -> Cost:
    w_hh = named["w_hh"]
    assert w_hh is not None
    hidden = w_hh.shape[1]
    state = named.get("h") or named.get("c")
    x = named.get("x")
    rows = 1
    for d in (x or state or TensorSpec((1, 1), w_hh.dtype)).shape[:-1]:
        rows *= d
    w_ih = named.get("w_ih")
    inner = (w_ih.shape[1] if with_x and w_ih is not None else 0) + (
        hidden if named.get("h") is not None else 0
    )
    flops = 2.0 * rows * inner * gates * hidden + 8.0 * rows * gates * hidden
    touched = _nbytes(*named.values()) + 3.0 * rows * gates * hidden * w_hh.dtype.itemsize
    return Cost(flops, touched)


def _lstm_cell_cost(
    x: Any, h: Any, c: Any, w_ih: Any, w_hh: Any, b_ih: Any = None, b_hh: Any = None
) -> Cost:
    named = _specs(x=x, h=h, c=c, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh)
    return _cell_cost(_LSTM_GATES, named, with_x=True)


def _gru_cell_cost(
    x: Any, h: Any, w_ih: Any, w_hh: Any, b_ih: Any = None, b_hh: Any = None
) -> Cost:
    named = _specs(x=x, h=h, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh)
    return _cell_cost(_GRU_GATES, named, with_x=True)


def _step_cost(gates: int, xproj: Any, named: dict[str, TensorSpec | None]) -> Cost:
    xp = spec_of(xproj)
    w_hh = named["w_hh"]
    assert w_hh is not None
    rows, width = xp.shape[1], xp.shape[2]
    flops = (2.0 * rows * w_hh.shape[1] * width if named.get("h") is not None else 0.0) + (
        8.0 * rows * width
    )
    step_bytes = rows * width * xp.dtype.itemsize
    return Cost(flops, _nbytes(*named.values()) + 3.0 * step_bytes)


def _lstm_step_cost(xproj: Any, t: Any, h: Any, c: Any, w_hh: Any) -> Cost:
    return _step_cost(_LSTM_GATES, xproj, _specs(h=h, c=c, w_hh=w_hh))


def _gru_step_cost(xproj: Any, t: Any, h: Any, w_hh: Any, b_hh: Any) -> Cost:
    return _step_cost(_GRU_GATES, xproj, _specs(h=h, w_hh=w_hh, b_hh=b_hh))


def _projection_cost(x: Any, w_ih: Any, bias: Any, batch_first: bool, bias_hh: Any = None) -> Cost:
    xs, ws = spec_of(x), spec_of(w_ih)
    rows = xs.shape[0] * xs.shape[1]
    out = rows * ws.shape[0] * ws.dtype.itemsize
    return Cost(2.0 * rows * ws.shape[0] * ws.shape[1], _nbytes(xs, ws) + out)


def _output_cost(hs_fwd: list[Any], hs_rev: list[Any] | None, batch_first: bool) -> Cost:
    one = _nbytes(spec_of(hs_fwd[0])) if hs_fwd else 0.0
    return Cost(0.0, 2.0 * one * (len(hs_fwd) + len(hs_rev or ())))


def _stack_cost(arrays: list[Any]) -> Cost:
    return Cost(0.0, 2.0 * sum(_nbytes(spec_of(a)) for a in arrays))


def _select_cost(a: Any, index: int) -> Cost:
    s = spec_of(a)
    return Cost(0.0, 2.0 * _nbytes(s) / max(s.shape[0], 1) if s.shape else 0.0)
