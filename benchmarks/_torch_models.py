"""The torch contenders: the tutorial's LSTM ensemble, eager and scripted, with and without fork.

Imported only when torch is installed. The modules are the seed tutorial's, verbatim in
structure: ``BiLSTM`` runs the two directions one after the other, ``BiLSTMFork`` forks the
forward direction; ``Ensemble`` runs the members one after the other, ``EnsembleFork`` forks
them. Weights are copied from the numpy reference's, so every output can be compared.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ._reference import EnsembleWeights, LSTMWeights

__all__ = [
    "build",
    "fork_noop_batched",
    "fork_noop_one",
    "jit_script",
    "warm_fork_noop",
]


# torch.jit.fork/wait are untyped; TorchScript recognises them by identity, so typed aliases
# keep mypy strict without changing what gets scripted.
fork: Any = torch.jit.fork
wait: Any = torch.jit.wait


def _noop(x: torch.Tensor) -> torch.Tensor:
    return x


def _fork_noop_batched(x: torch.Tensor, n: int) -> int:
    futs: list[torch.jit.Future[torch.Tensor]] = []
    for _ in range(n):
        futs.append(fork(_noop, x))
    for f in futs:
        wait(f)
    return n


def _fork_noop_one(x: torch.Tensor, n: int) -> int:
    for _ in range(n):
        wait(fork(_noop, x))
    return n


def jit_script(obj: Any) -> Any:
    """``torch.jit.script``, without its deprecation warning (it is what is being measured)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(obj)


_scripted: dict[str, Any] = {}


def fork_noop_batched(x: torch.Tensor, n: int) -> int:
    """Fork ``n`` no-op tasks, then wait for all of them (a scripted loop)."""
    fn = _scripted.get("batched")
    if fn is None:
        fn = _scripted["batched"] = jit_script(_fork_noop_batched)
    return int(fn(x, n))


def fork_noop_one(x: torch.Tensor, n: int) -> int:
    """Fork a no-op task and wait for it, ``n`` times (a scripted loop)."""
    fn = _scripted.get("one")
    if fn is None:
        fn = _scripted["one"] = jit_script(_fork_noop_one)
    return int(fn(x, n))


def warm_fork_noop() -> None:
    """Script and run both loops once so the first timed round does not pay compilation."""
    x = torch.ones(1)
    fork_noop_batched(x, 10)
    fork_noop_one(x, 10)


class BiLSTM(torch.nn.Module):
    """Forward LSTM, then backward LSTM on the time-flipped input; concatenated on channels."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.cell_f = torch.nn.LSTM(input_size=c, hidden_size=c)
        self.cell_b = torch.nn.LSTM(input_size=c, hidden_size=c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output_f, _ = self.cell_f(x)
        output_b, _ = self.cell_b(torch.flip(x, dims=[0]))
        output_b_rev = torch.flip(output_b, dims=[0])
        return torch.cat((output_f, output_b_rev), dim=2)


class BiLSTMFork(BiLSTM):
    """The same, with the forward direction forked so the two directions overlap."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        future_f = fork(self.cell_f, x)
        output_b, _ = self.cell_b(torch.flip(x, dims=[0]))
        output_b_rev = torch.flip(output_b, dims=[0])
        output_f, _ = wait(future_f)
        return torch.cat((output_f, output_b_rev), dim=2)


class Ensemble(torch.nn.Module):
    """The members one after the other; outputs stacked and summed."""

    def __init__(self, models: list[BiLSTM]) -> None:
        super().__init__()
        self.models = torch.nn.ModuleList(models)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        results = []
        for model in self.models:
            results.append(model(x))
        return torch.stack(results).sum(dim=0)


class EnsembleFork(Ensemble):
    """The members forked, then waited for."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        futures = [fork(model, x) for model in self.models]
        results = [wait(fut) for fut in futures]
        return torch.stack(results).sum(dim=0)


def _load(lstm: torch.nn.LSTM, w: LSTMWeights) -> None:
    params = dict(lstm.named_parameters())
    with torch.no_grad():
        params["weight_ih_l0"].copy_(torch.from_numpy(w.w_ih))
        params["weight_hh_l0"].copy_(torch.from_numpy(w.w_hh))
        params["bias_ih_l0"].copy_(torch.from_numpy(w.b_ih))
        params["bias_hh_l0"].copy_(torch.from_numpy(w.b_hh))


def build(
    weights: EnsembleWeights, *, fork_directions: bool, fork_members: bool, script: bool
) -> torch.nn.Module:
    """The tutorial's ensemble with the numpy reference's weights, in eval mode."""
    c = weights.channels
    members: list[BiLSTM] = []
    for mw in weights.models:
        m = BiLSTMFork(c) if fork_directions else BiLSTM(c)
        _load(m.cell_f, mw.forward)
        _load(m.cell_b, mw.backward)
        members.append(m)
    ens: Ensemble = EnsembleFork(members) if fork_members else Ensemble(members)
    ens.eval()
    for p in ens.parameters():
        p.requires_grad_(False)
    if script:
        scripted: torch.nn.Module = jit_script(ens)
        return scripted
    return ens
