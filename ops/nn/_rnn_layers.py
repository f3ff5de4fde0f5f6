"""The layer/direction loop of ``LSTM`` and ``GRU``: a forward's ops, at either granularity.

The lower layer of ``nn.LSTM`` and ``nn.GRU``, over :class:`~ops.nn.Module`. The upper one,
:mod:`ops.nn._rnn`, holds the modules' arguments, parameters and input checks, chooses the
granularity (``_RNNBase.granularity_for``: its module docstring says when each pays), and maps
the op patterns this loop asks for (``_sequence``, ``_project``, ``_step``, ``_cell``) to each
module's own ops. At granularity "sequence" the loop issues one op per layer and direction, a
bidirectional layer's outputs joined by one more (``_run_sequences``); at "step" it issues the
decomposition below (``_run_steps``). Either way the final states come stacked as torch
returns them (``stack_states``; at "sequence" a single layer-direction's op stacks its own).

In the per-step decomposition a recurrent layer is a chain: step t needs step t-1's state.
What is *not* a chain is dispatched so the scheduler can see it:

* **The input projection is one GEMM.** For layer 0 (and every layer of a bidirectional
  stack), ``x @ W_ih.T + biases`` for all T steps is a single (T*B, I) x (I, G*H) product
  (:func:`ops._recurrent.rnn_projection`), large enough to use the cores well. Each step then
  only adds the recurrent part, one small (B, H) x (H, G*H) GEMM plus the gate math
  (:func:`ops._recurrent.lstm_step`): T small ops on the critical path, nothing else.
* **Directions are independent.** The reverse direction has its own projection and its own
  chain over reversed time; the two chains run side by side.
* **Stacked layers form a wavefront.** In a unidirectional stack, layer l >= 1 does not wait for
  all of layer l-1: its step t is a fused cell (``x_t @ W_ih.T + h @ W_hh.T + b``,
  :func:`ops.lstm_cell`) that reads layer l-1's h_t directly, so it can start as soon as step t
  of layer l-1 and step t-1 of layer l are done::

      layer 1:        s0 -> s1 -> s2 -> s3
                      ^     ^     ^     ^
      layer 0:  s0 -> s1 -> s2 -> s3 -> ...      (two steps in flight at every moment)

  In a bidirectional stack layer l's every step reads both directions of layer l-1 at time t,
  and the reverse direction reaches t = 0 last, so no step of layer l can start before layer
  l-1 is complete; there the one-GEMM projection of the concatenated outputs is the faster
  choice.
* **Outputs are gathered once.** The per-step states are written into the (T, B, D*H) output
  by one op at the end (:func:`ops._recurrent.rnn_output`), not concatenated step by step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .._recurrent import rnn_output, stack_states
from .._shape import concatenate
from .._tensor import Tensor
from ._module import Module

__all__: list[str] = []

Array = np.ndarray[Any, Any]
Value = Tensor | Array
State = Value | None


# The parameter names of a layer and direction: weight_ih, weight_hh, bias_ih, bias_hh.
_NAMES: dict[tuple[int, int], tuple[str, ...]] = {}


class _Weights(NamedTuple):
    """One layer-direction's parameters, as the module holds them (passed to the ops as they
    are: a traced graph reads each by its parameter name)."""

    w_ih: Array
    w_hh: Array
    b_ih: Array | None
    b_hh: Array | None


class _RNNLayers(Module):
    """The layer/direction loop LSTM and GRU share (set up by :class:`~ops.nn._rnn._RNNBase`'s
    constructor)."""

    num_layers: int
    bias: bool
    batch_first: bool
    bidirectional: bool

    if TYPE_CHECKING:
        # A layer up (``_rnn``): the granularity a forward of this batch runs at.
        def granularity_for(self, batch: int) -> str: ...

    @property
    def num_directions(self) -> int:
        """2 if bidirectional, else 1."""
        return 2 if self.bidirectional else 1

    @staticmethod
    def _suffix(layer: int, direction: int) -> str:
        return f"_l{layer}" + ("_reverse" if direction else "")

    def _weights(self, layer: int, direction: int) -> _Weights:
        names = _NAMES.get((layer, direction))
        if names is None:
            sfx = self._suffix(layer, direction)
            names = _NAMES[layer, direction] = tuple(
                f"{kind}{sfx}" for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
            )
        w_ih: Array = getattr(self, names[0])
        w_hh: Array = getattr(self, names[1])
        if not self.bias:
            return _Weights(w_ih, w_hh, None, None)
        # (The LSTM's ops add both biases once, in their kernels: a sum computed here would be
        # a constant to dataflow.trace, and a compiled model would keep the biases it was
        # traced with after they were written in place.)
        return _Weights(w_ih, w_hh, getattr(self, names[2]), getattr(self, names[3]))

    # -- the layer / direction loop ---------------------------------------------------------

    def _run(
        self, x: Value, steps: int, batch: int, h0: list[State], c0: list[State] | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Dispatch every op of the forward pass: (output, h_n, c_n), the final states
        stacked as torch returns them, (num_layers*D, batch, hidden_size) (c_n None for a
        GRU)."""
        if self.granularity_for(batch) == "sequence":
            if self.num_layers * self.num_directions == 1:
                # One layer-direction: its op returns the states stacked already (views),
                # which saves two ops (a dispatch and a task each) on every call.
                return self._sequence(
                    self._weights(0, 0), x, h0[0], None if c0 is None else c0[0], False, True
                )
            output, hs, cs = self._run_sequences(x, h0, c0)
        else:
            output, hs, cs = self._run_steps(x, steps, h0, c0)
        return output, stack_states(hs), stack_states(cs) if cs else None

    def _run_sequences(
        self, x: Value, h0: list[State], c0: list[State] | None
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """One op per layer and direction; a bidirectional layer's outputs joined by one op."""
        layers, dirs = self.num_layers, self.num_directions
        layer_in: Value = x
        final_h: list[Tensor] = []
        final_c: list[Tensor] = []
        output: Tensor | None = None
        for layer in range(layers):
            outs: list[Tensor] = []
            for d in range(dirs):
                k = layer * dirs + d
                out, h_n, c_n = self._sequence(
                    self._weights(layer, d),
                    layer_in,
                    h0[k],
                    None if c0 is None else c0[k],
                    d == 1,
                    False,
                )
                outs.append(out)
                final_h.append(h_n)
                if c_n is not None:
                    final_c.append(c_n)
            output = outs[0] if dirs == 1 else concatenate(outs, axis=2)
            layer_in = output
        assert output is not None
        return output, final_h, final_c

    def _sequence(
        self, w: _Weights, layer_in: Value, h0: State, c0: State, reverse: bool, stacked: bool
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """One layer-direction as one op: (output, h_n, c_n); the states (1, batch,
        hidden_size) with ``stacked``."""
        raise NotImplementedError

    def _run_steps(
        self, x: Value, steps: int, h0: list[State], c0: list[State] | None
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """The per-step decomposition (see the module docstring)."""
        layers, dirs = self.num_layers, self.num_directions
        weights = [[self._weights(layer, d) for d in range(dirs)] for layer in range(layers)]
        # states[k] is the running (h, c) of layer k // dirs, direction k % dirs.
        states: list[tuple[State, State]] = [
            (h0[k], None if c0 is None else c0[k]) for k in range(layers * dirs)
        ]
        # hs[k][t]: that layer-direction's h at time t (time order for both directions).
        hs: list[list[Tensor]] = [[] for _ in range(layers * dirs)]
        if dirs == 1 and layers > 1:
            # The wavefront. Dispatch time-major, so step t of every layer is issued right
            # after step t of the layer below: layer l never waits for the dispatch of layer
            # l-1's later steps (the dispatching thread competes with the workers for the
            # GIL, so dispatching a whole layer first can let layer l-1 finish alone).
            xproj = self._project(weights[0][0], x, self.batch_first)
            for t in range(steps):
                for layer in range(layers):
                    h, c = states[layer]
                    if layer == 0:
                        h, c = self._step(weights[0][0], xproj, t, h, c)
                    else:
                        h, c = self._cell(weights[layer][0], hs[layer - 1][t], h, c)
                    states[layer] = (h, c)
                    hs[layer].append(h)
        else:
            layer_in: Value = x
            for layer in range(layers):
                for d in range(dirs):
                    k = layer * dirs + d
                    w = weights[layer][d]
                    xproj = self._project(w, layer_in, self.batch_first and layer == 0)
                    h, c = states[k]
                    col: list[Tensor | None] = [None] * steps
                    for t in range(steps) if d == 0 else range(steps - 1, -1, -1):
                        h, c = self._step(w, xproj, t, h, c)
                        col[t] = h
                    states[k] = (h, c)
                    hs[k] = [v for v in col if v is not None]
                if layer + 1 < layers:
                    layer_in = rnn_output(hs[layer * dirs], hs[layer * dirs + 1], batch_first=False)
        top = (layers - 1) * dirs
        output = rnn_output(hs[top], hs[top + 1] if dirs == 2 else None, self.batch_first)
        final_h = [h for h, _ in states if isinstance(h, Tensor)]
        final_c = [c for _, c in states if isinstance(c, Tensor)]
        return output, final_h, final_c

    # The three op patterns each module maps to its own ops.

    def _project(self, w: _Weights, layer_in: Value, batch_first: bool) -> Tensor:
        """The input projection of every step: (steps, batch, gates*hidden)."""
        raise NotImplementedError

    def _step(
        self, w: _Weights, xproj: Tensor, t: int, h: State, c: State
    ) -> tuple[Tensor, Tensor | None]:
        """Step t from the projection: (h', c')."""
        raise NotImplementedError

    def _cell(self, w: _Weights, x_t: Tensor, h: State, c: State) -> tuple[Tensor, Tensor | None]:
        """A fused step from the layer below's h_t: (h', c')."""
        raise NotImplementedError
