"""``LSTM`` and ``GRU``: torch's modules, as ops sized for the scheduler.

A forward runs at one of two granularities, picked per call (``granularity="auto"``, see
:meth:`_RNNBase.granularity_for`) or fixed by the user:

* **"sequence"**: one op per layer and direction (:func:`ops.lstm_sequence`,
  :func:`ops.gru_sequence`): the input projection in time chunks and the whole time loop run
  inside one kernel (:mod:`ops._rnn_sequence`), the directions of a layer side by side. This is
  what "auto" picks almost everywhere: a step of a small model is a few microseconds of numpy,
  less than an op's hand-off, and per-step ops expose no parallelism that one op per direction
  lacks, except in one case:
* **"step"**: one op per time step (the per-step decomposition, in ``_rnn_layers``). It pays
  where a unidirectional stack's layers can run as a wavefront and each step is big enough (at
  least :data:`STEP_OP_MIN_SECONDS`) for its op to cost under ~1% in dispatch.

How a forward dispatches its ops at either granularity (the layer/direction loop, and the
per-step decomposition that lets a stack's layers run as a wavefront) is the layer below,
:class:`~ops.nn._rnn_layers._RNNLayers`, whose module docstring is that design. This module is
the modules' own layer over it: the arguments, checked as torch takes them; the parameters,
with torch's names, shapes, order and initialisation (a torch state dict loads unchanged), the
recurrent weights stored in the memory order their GEMM runs fastest in at the granularity
chosen for the layout's batch; the granularity choice; the checks of a forward's input and
initial states; and the op patterns the loop asks for (a layer-direction as one op, the input
projection, a step, a fused cell), mapped to each module's own ops.

``forward`` only dispatches these ops and returns pending tensors at once; the runtime runs
each as soon as its inputs are ready.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

import dataflow
from dataflow import OpInputError, OpTypeError

from .._checks import operand
from .._recurrent import (
    gru_cell,
    gru_step,
    lstm_cell,
    lstm_step,
    rnn_projection,
    select,
)
from .._rnn_layout import LAYOUT_BATCH, lay_out
from .._rnn_ops import gru_sequence, lstm_sequence
from .._tensor import Tensor, TensorSpec, spec_of
from ._module import check_flag, check_positive, float_dtype, make_rng, uniform
from ._rnn_layers import Array, State, Value, _RNNLayers, _Weights

__all__ = ["GRANULARITIES", "GRU", "LSTM", "STEP_OP_MIN_SECONDS"]

#: The values of ``granularity``: "auto" picks one of the other two per call.
GRANULARITIES = ("auto", "sequence", "step")

#: A step becomes an op of its own (granularity "step") only where that exposes parallelism
#: (a unidirectional stack's wavefront) and the step's estimated time is at least this:
#: 100 times the ~20 us a hand-off to an inter-op thread costs, so dispatch stays under ~1%.
STEP_OP_MIN_SECONDS = 2e-3

#: The single-thread GEMM rate the estimate assumes (flop/s): a conservative figure for one
#: core of the machines we measure on (OpenBLAS float32 reaches 50-70 GFLOP/s there).
_ASSUMED_GEMM_RATE = 50e9


def _check_dropout(where: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
        raise dataflow.DataflowTypeError(
            f"{where}: dropout must be a number in [0, 1], got {type(v).__name__}: {v!r}"
        )
    if not 0.0 <= float(v) <= 1.0:  # NaN fails this too
        raise dataflow.DataflowValueError(f"{where}: dropout must be in [0, 1], got {v!r}")
    return float(v)


def _check_granularity(where: str, v: object) -> str:
    if not isinstance(v, str) or v not in GRANULARITIES:
        raise dataflow.DataflowValueError(
            f"{where}: granularity must be one of {', '.join(map(repr, GRANULARITIES))}, got {v!r}"
        )
    return v


class _RNNBase(_RNNLayers):
    """What LSTM and GRU share: arguments, parameters, the granularity, input checks (over the
    layer/direction loop of :class:`~ops.nn._rnn_layers._RNNLayers`)."""

    _gates: ClassVar[int]

    if TYPE_CHECKING:
        # Parameters are set by name (weight_ih_l0, ...): let type checkers read them.
        def __getattr__(self, name: str) -> Any: ...

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        *,
        dtype: Any = np.float32,
        seed: int | None = None,
        rng: np.random.Generator | None = None,
        granularity: str = "auto",
    ) -> None:
        where = f"nn.{type(self).__name__}"
        self.input_size = check_positive(where, "input_size", input_size)
        self.hidden_size = check_positive(where, "hidden_size", hidden_size)
        self.num_layers = check_positive(where, "num_layers", num_layers)
        self.bias = check_flag(where, "bias", bias)
        self.batch_first = check_flag(where, "batch_first", batch_first)
        # Inference only: dropout is kept for torch compatibility (torch ignores it in eval).
        self.dropout = _check_dropout(where, dropout)
        self.bidirectional = check_flag(where, "bidirectional", bidirectional)
        self.granularity = _check_granularity(where, granularity)
        dt = float_dtype(where, dtype)
        gen = make_rng(seed, rng, where)
        bound = 1.0 / math.sqrt(hidden_size)
        gh = self._gates * hidden_size
        # Same names, shapes and order as torch: per layer, per direction w_ih, w_hh, b_ih, b_hh.
        for layer in range(num_layers):
            in_size = input_size if layer == 0 else hidden_size * self.num_directions
            for d in range(self.num_directions):
                sfx = self._suffix(layer, d)
                setattr(self, f"weight_ih{sfx}", uniform(gen, bound, (gh, in_size), dt))
                w_hh = uniform(gen, bound, (gh, hidden_size), dt)
                setattr(self, f"weight_hh{sfx}", lay_out(w_hh, self._steps_at_layout()))
                if self.bias:
                    setattr(self, f"bias_ih{sfx}", uniform(gen, bound, (gh,), dt))
                    setattr(self, f"bias_hh{sfx}", uniform(gen, bound, (gh,), dt))

    def _parameter_layout(self, name: str, value: Array) -> Array:
        # Recurrent weights are stored in the memory order their step GEMM runs fastest in
        # (measured per shape: ops._rnn_layout.lay_out); values, shape and dtype unchanged.
        if name.startswith("weight_hh"):
            return lay_out(value, self._steps_at_layout())
        return value

    def _steps_at_layout(self) -> bool:
        """Whether a forward at the batch the weights are laid out for runs as per-step ops
        (their GEMM wants another layout than the sequence kernels: lay_out)."""
        return self.granularity_for(LAYOUT_BATCH) == "step"

    def granularity_for(self, batch: int) -> str:
        """What a forward of this batch size runs as: "sequence" or "step".

        "sequence": one op per layer and direction (:func:`ops.lstm_sequence`), the time loop
        inside the kernel. "step": the input projection, then one op per time step
        (:func:`ops._recurrent.lstm_step`), which lets layer l of a unidirectional stack run
        step t while layer l-1 runs step t+1 (a wavefront). With ``granularity="auto"`` a step
        is an op of its own only where that wavefront exists and a step is estimated to take
        at least :data:`STEP_OP_MIN_SECONDS`; everywhere else per-step ops expose no
        parallelism that one op per direction lacks, and cost a hand-off each.
        """
        if self.granularity != "auto":
            return self.granularity
        if self.bidirectional or self.num_layers == 1:
            return "sequence"
        h = self.hidden_size
        step_flops = 2.0 * batch * h * self._gates * h * 2  # recurrent + layer-below GEMMs
        return "step" if step_flops / _ASSUMED_GEMM_RATE >= STEP_OP_MIN_SECONDS else "sequence"

    @property
    def dtype(self) -> np.dtype[Any]:
        """The parameters' dtype."""
        w: Array = getattr(self, "weight_ih_l0")  # noqa: B009 - set by name in __init__
        return np.dtype(w.dtype)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.bidirectional:
            s += ", bidirectional=True"
        if self.granularity != "auto":
            s += f", granularity={self.granularity!r}"
        return s

    # -- validation -------------------------------------------------------------------------

    def _check_input(self, x: Any) -> tuple[Value, int, int]:
        """x as a Tensor or array, and its (steps, batch)."""
        name = type(self).__name__
        operand(f"nn.{name}", "x", x)  # not an array, or an ndarray subclass: named here
        if not isinstance(x, Tensor | np.ndarray):
            x = np.asarray(x)
        s = spec_of(x)
        layout = "(batch, steps, input_size)" if self.batch_first else "(steps, batch, input_size)"
        if len(s.shape) != 3 or s.shape[2] != self.input_size:
            raise OpInputError(
                f"nn.{name}: x must have shape {layout} with input_size {self.input_size}, "
                f"got {s!r} (batch_first={self.batch_first}; unbatched input: add a batch axis "
                "of 1)"
            )
        steps, batch = (s.shape[1], s.shape[0]) if self.batch_first else s.shape[:2]
        if steps == 0 or batch == 0:
            raise OpInputError(
                f"nn.{name}: x {layout} has {'no steps' if steps == 0 else 'an empty batch'}, "
                f"got {s!r} (batch_first={self.batch_first}): a forward needs at least one "
                "step and one batch row"
            )
        if s.dtype != getattr(self, "weight_ih_l0").dtype:  # noqa: B009 - set by name
            raise OpTypeError(
                f"nn.{name}: x has dtype {s.dtype} but the parameters are {self.dtype}; "
                f"convert x with .astype(np.{self.dtype})"
            )
        return x, steps, batch

    def _split_state(self, state: Any, what: str, batch: int) -> list[State]:
        """One initial state per layer and direction, from (layers*directions, B, H)."""
        n = self.num_layers * self.num_directions
        if state is None:
            return [None] * n
        operand(f"nn.{type(self).__name__}", what, state)
        # A GRU given an LSTM's (h0, c0): stacked by np.asarray, named below.
        pair = isinstance(state, tuple | list) and len(state) == 2 and self._gates == 3
        if not isinstance(state, Tensor | np.ndarray):
            state = np.asarray(state)
        s = spec_of(state)
        expected = TensorSpec((n, batch, self.hidden_size), self.dtype)
        if s.shape != expected.shape:
            hint = " (from a pair: a GRU's hx is h0 alone, it has no c0)" if pair else ""
            raise OpInputError(
                f"nn.{type(self).__name__}: {what} must have shape "
                f"(num_layers*num_directions, batch, hidden_size) = {expected.shape}, got "
                f"{s!r}{hint}"
            )
        if s.dtype != expected.dtype:
            raise OpTypeError(
                f"nn.{type(self).__name__}: {what} has dtype {s.dtype}, the parameters "
                f"{expected.dtype}"
            )
        if isinstance(state, Tensor):
            return [select(state, k) for k in range(n)]
        return [state[k] for k in range(n)]


class LSTM(_RNNBase):
    """A multi-layer LSTM (like ``torch.nn.LSTM``), decomposed into schedulable ops.

    Parameters have torch's names, shapes and default init (U(-1/sqrt(hidden_size),
    1/sqrt(hidden_size))): ``weight_ih_l{k}`` (4*hidden_size, in), ``weight_hh_l{k}``
    (4*hidden_size, hidden_size), ``bias_ih_l{k}``, ``bias_hh_l{k}`` (4*hidden_size,), and
    ``..._reverse`` for the reverse direction. A torch LSTM's state dict loads unchanged.

    Args:
        input_size: features of x.
        hidden_size: features of h.
        num_layers: stacked layers.
        bias: whether the layers have biases.
        batch_first: x and output are (batch, steps, features) instead of (steps, batch, ...).
        dropout: accepted for torch compatibility; inference only, so not applied.
        bidirectional: add a reverse direction; the output has 2*hidden_size features.
        dtype: parameter dtype (float32 by default).
        seed: seed for the initial weights (or pass ``rng``, a numpy Generator).

    Example:
        >>> lstm = ops.nn.LSTM(1024, 1024, bidirectional=True, seed=0)
        >>> out, (h_n, c_n) = await lstm(x)    # pending Tensors, returned at once
        >>> y = await out                      # (T, B, 2048) ndarray
    """

    _gates = 4

    async def forward(
        self, x: Value, hx: tuple[Value, Value] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """``(output, (h_n, c_n))`` for x (steps, batch, input_size) and optional (h0, c0).

        output is (steps, batch, D*hidden_size) (batch first if ``batch_first``), and h_n, c_n
        are (num_layers*D, batch, hidden_size), as torch returns them. All are pending.
        """
        x, steps, batch = self._check_input(x)
        if hx is None:
            h0 = c0 = self._split_state(None, "h0", batch)
        else:
            if not isinstance(hx, tuple | list) or len(hx) != 2:
                got = type(hx).__name__
                if isinstance(hx, tuple | list):
                    got += f" of {len(hx)} items"
                raise OpInputError(f"nn.LSTM: hx must be a tuple (h0, c0), got {got}")
            if (hx[0] is None) != (hx[1] is None):
                raise OpInputError(
                    "nn.LSTM: hx must give both h0 and c0 (or pass hx=None for zero states), got "
                    f"{'h0' if hx[1] is None else 'c0'} alone"
                )
            h0 = self._split_state(hx[0], "h0", batch)
            c0 = self._split_state(hx[1], "c0", batch)
        output, h_n, c_n = self._run(x, steps, batch, h0, c0)
        assert c_n is not None
        return output, (h_n, c_n)

    def _sequence(
        self, w: _Weights, layer_in: Value, h0: State, c0: State, reverse: bool, stacked: bool
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        if w.b_hh is None:
            return lstm_sequence(
                layer_in, w.w_ih, None, w.w_hh, h0, c0, reverse, self.batch_first, stacked
            )
        return lstm_sequence(
            layer_in, w.w_ih, w.b_ih, w.w_hh, h0, c0, reverse, self.batch_first, stacked, w.b_hh
        )

    def _project(self, w: _Weights, layer_in: Value, batch_first: bool) -> Tensor:
        # Both biases are added once, to the whole projection (in its kernel).
        return rnn_projection(layer_in, w.w_ih, w.b_ih, batch_first, w.b_hh)

    def _step(
        self, w: _Weights, xproj: Tensor, t: int, h: State, c: State
    ) -> tuple[Tensor, Tensor | None]:
        return lstm_step(xproj, t, h, c, w.w_hh)

    def _cell(self, w: _Weights, x_t: Tensor, h: State, c: State) -> tuple[Tensor, Tensor | None]:
        return lstm_cell(x_t, h, c, w.w_ih, w.w_hh, w.b_ih, w.b_hh)


class GRU(_RNNBase):
    """A multi-layer GRU (like ``torch.nn.GRU``), decomposed into schedulable ops.

    Parameters as torch names them, with gates r, z, n: ``weight_ih_l{k}`` (3*hidden_size, in),
    ``weight_hh_l{k}`` (3*hidden_size, hidden_size), ``bias_ih_l{k}``, ``bias_hh_l{k}``, and
    ``..._reverse``. Arguments as for :class:`LSTM`.

    Example:
        >>> gru = ops.nn.GRU(64, 128, num_layers=2, seed=0)
        >>> out, h_n = await gru(x)
    """

    _gates = 3

    async def forward(self, x: Value, hx: Value | None = None) -> tuple[Tensor, Tensor]:
        """``(output, h_n)`` for x (steps, batch, input_size) and optional h0."""
        x, steps, batch = self._check_input(x)
        h0 = self._split_state(hx, "h0", batch)
        output, h_n, _ = self._run(x, steps, batch, h0, None)
        return output, h_n

    def _sequence(
        self, w: _Weights, layer_in: Value, h0: State, c0: State, reverse: bool, stacked: bool
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        out, h_n = gru_sequence(
            layer_in, w.w_ih, w.b_ih, w.w_hh, w.b_hh, h0, reverse, self.batch_first, stacked
        )
        return out, h_n, None

    def _project(self, w: _Weights, layer_in: Value, batch_first: bool) -> Tensor:
        # b_hh stays in the step: r multiplies (W_hn h + b_hn), so it cannot be folded in.
        return rnn_projection(layer_in, w.w_ih, w.b_ih, batch_first)

    def _step(
        self, w: _Weights, xproj: Tensor, t: int, h: State, c: State
    ) -> tuple[Tensor, Tensor | None]:
        return gru_step(xproj, t, h, w.w_hh, w.b_hh), None

    def _cell(self, w: _Weights, x_t: Tensor, h: State, c: State) -> tuple[Tensor, Tensor | None]:
        return gru_cell(x_t, h, w.w_ih, w.w_hh, w.b_ih, w.b_hh), None
