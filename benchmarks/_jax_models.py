"""The tutorial's ensemble in JAX (``jax.jit`` of a ``lax.scan`` per direction), CPU only.

An optional contender (the ``bench`` extra installs jax): the same weights and equations as
the numpy reference (torch's gate order), so its output is checked against it like every
other contender's.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._reference import EnsembleWeights

__all__ = ["build"]


def _direction(x: Any, w_ih: Any, w_hh: Any, bias: Any) -> Any:
    t, b, c = x.shape
    hidden = w_hh.shape[1]
    gx = (x.reshape(t * b, c) @ w_ih.T + bias).reshape(t, b, 4 * hidden)

    def step(carry: Any, g_t: Any) -> Any:
        h, cell = carry
        g = g_t + h @ w_hh.T
        i, f, gg, o = jnp.split(g, 4, axis=-1)
        cell = jax.nn.sigmoid(f) * cell + jax.nn.sigmoid(i) * jnp.tanh(gg)
        h = jax.nn.sigmoid(o) * jnp.tanh(cell)
        return (h, cell), h

    zeros = jnp.zeros((b, hidden), dtype=x.dtype)
    _, hs = jax.lax.scan(step, (zeros, zeros), gx)
    return hs


def build(weights: EnsembleWeights) -> Any:
    """A jitted ``forward(x) -> (T, B, 2H)`` numpy-returning callable for these weights."""
    params = [
        tuple(
            (jnp.asarray(d.w_ih), jnp.asarray(d.w_hh), jnp.asarray(d.b_ih + d.b_hh))
            for d in (m.forward, m.backward)
        )
        for m in weights.models
    ]

    @jax.jit
    def forward(x: Any, params: Any) -> Any:
        outs = []
        for fwd, bwd in params:
            out_f = _direction(x, *fwd)
            out_b = _direction(x[::-1], *bwd)[::-1]
            outs.append(jnp.concatenate([out_f, out_b], axis=2))
        return jnp.sum(jnp.stack(outs), axis=0)

    def call(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        out: np.ndarray[Any, Any] = np.asarray(forward(jnp.asarray(x), params).block_until_ready())
        return out

    return call
