"""The dataflow contenders' models: the seed ensemble on ``ops.nn``, loaded with the reference's
weights, run automatically (no fork: the scheduler finds the parallelism) or with manual forks
(the tutorial's fork/wait placement, in dataflow).

``ops``/``ops.nn`` and ``examples/lstm_ensemble.py`` are optional here: :func:`unavailable`
says why the dataflow ensemble contenders must be skipped, and they are reported as such.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import dataflow

from ._reference import EnsembleWeights, LSTMWeights

__all__ = ["build_ensemble", "forward_auto", "forward_forked", "stacked_lstm", "unavailable"]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "lstm_ensemble.py"


def _example() -> ModuleType:
    name = "_dataflow_example_lstm_ensemble"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLE)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {EXAMPLE}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def unavailable() -> str | None:
    """Why the dataflow ensemble cannot run here (None when it can)."""
    try:
        import ops
        import ops.nn

        ops.nn.LSTM  # noqa: B018 - the attribute is what is being checked
        ops.flip  # noqa: B018
    except (ImportError, AttributeError) as exc:
        return f"ops.nn.LSTM not available ({type(exc).__name__}: {exc})"
    if not EXAMPLE.exists():
        return "examples/lstm_ensemble.py not written yet"
    try:
        mod = _example()
        mod.Ensemble  # noqa: B018
        mod.BiLSTM  # noqa: B018
    except Exception as exc:
        return f"examples/lstm_ensemble.py: {type(exc).__name__}: {exc}"
    return None


def _state(w: LSTMWeights) -> dict[str, Any]:
    return {
        "weight_ih_l0": w.w_ih,
        "weight_hh_l0": w.w_hh,
        "bias_ih_l0": w.b_ih,
        "bias_hh_l0": w.b_hh,
    }


def build_ensemble(weights: EnsembleWeights) -> Any:
    """``examples/lstm_ensemble.py``'s ``Ensemble`` with the reference's weights."""
    mod = _example()
    ens = mod.Ensemble(len(weights.models), weights.channels)
    for member, mw in zip(ens.models, weights.models, strict=True):
        member.cell_f.load_state_dict(_state(mw.forward))
        member.cell_b.load_state_dict(_state(mw.backward))
    return ens


async def forward_auto(ens: Any, x: Any) -> Any:
    """The example's forward, unchanged: dispatch only, no fork."""
    return await ens(x)


async def forward_forked(ens: Any, x: Any) -> Any:
    """The tutorial's fork/wait placement: the example's ``ensemble_forked`` when it has one."""
    fn = getattr(_example(), "ensemble_forked", None)
    if fn is not None:
        return await fn(ens, x)
    return await _ensemble_forked(ens, x)


async def _member_forked(member: Any, x: Any) -> Any:
    import ops

    # The tutorial's BiLSTM with fork: the forward direction forked, the backward inline.
    fut_f = dataflow.fork(member.cell_f, x)
    out_b, _ = await member.cell_b(ops.flip(x, axis=0))
    out_f, _ = await dataflow.wait(fut_f)
    return ops.concatenate([out_f, ops.flip(out_b, axis=0)], axis=2)


async def _ensemble_forked(ens: Any, x: Any) -> Any:
    """The tutorial's fully forked version: directions and members forked, then waited."""
    import ops

    futures = [dataflow.fork(_member_forked, m, x) for m in ens.models]
    results = [await dataflow.wait(f) for f in futures]
    return ops.sum(ops.stack(results), axis=0)


def stacked_lstm(channels: int, layers: int) -> Any:
    """A unidirectional stacked ``ops.nn.LSTM`` (its steps form a wavefront)."""
    import ops.nn

    return ops.nn.LSTM(channels, channels, num_layers=layers, seed=0)
