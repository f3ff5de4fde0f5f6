"""The ensemble as a dask graph of the numpy reference's own kernels.

Granularity matches what dataflow's scheduler sees: per direction one input-projection GEMM
task and one task per recurrence step (GEMM + gate math, fused), then the output gathered,
the members concatenated, stacked and summed. dask sees 8 independent chains, like dataflow.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._reference import F32, EnsembleWeights, lstm_step, project

__all__ = ["OUTPUT_KEY", "ensemble_graph"]

OUTPUT_KEY = "ensemble"


def _flip(x: F32) -> F32:
    return np.ascontiguousarray(x[::-1])


def _step(gx: F32, t: int, state: tuple[F32, F32] | None, w_hh: F32) -> tuple[F32, F32]:
    h, c = (None, None) if state is None else state
    return lstm_step(gx[t], h, c, w_hh)


def _gather(states: list[tuple[F32, F32]]) -> F32:
    out: F32 = np.stack([h for h, _ in states])
    return out


def _member(out_f: F32, out_b: F32) -> F32:
    return np.concatenate([out_f, out_b[::-1]], axis=2)


def _sum(members: list[F32]) -> F32:
    out: F32 = np.stack(members).sum(axis=0)
    return out


def ensemble_graph(x: F32, weights: EnsembleWeights) -> dict[Any, Any]:
    """A dask graph whose key ``OUTPUT_KEY`` is the ensemble's output for ``x``."""
    steps = x.shape[0]
    g: dict[Any, Any] = {"x": x, "x_rev": (_flip, "x")}
    members = []
    for m, mw in enumerate(weights.models):
        for d, (w, src) in enumerate(((mw.forward, "x"), (mw.backward, "x_rev"))):
            proj = ("proj", m, d)
            g[proj] = (project, src, w.w_ih, w.b_ih + w.b_hh)
            prev: Any = None
            keys = []
            for t in range(steps):
                key = ("step", m, d, t)
                g[key] = (_step, proj, t, prev, w.w_hh)
                keys.append(key)
                prev = key
            g[("out", m, d)] = (_gather, keys)
        g[("member", m)] = (_member, ("out", m, 0), ("out", m, 1))
        members.append(("member", m))
    g[OUTPUT_KEY] = (_sum, members)
    return g
