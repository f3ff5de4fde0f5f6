"""``ops.nn``: torch-like modules whose forward only dispatches ops.

``Module`` finds parameters (numpy arrays) and submodules by attribute, so subclasses need no
``super().__init__()``; ``state_dict``/``load_state_dict`` use torch's names, so a torch
model's weights load as ``{k: v.detach().numpy() for k, v in m.state_dict().items()}``.
"""

from __future__ import annotations

from ._linear import Linear as Linear
from ._module import IncompatibleKeys as IncompatibleKeys
from ._module import Module as Module
from ._module import StateDictError as StateDictError
from ._rnn import GRU as GRU
from ._rnn import LSTM as LSTM

del annotations  # the `from __future__` feature, not part of the API (dir())

__all__ = (
    "Module",
    "Linear",
    "LSTM",
    "GRU",
    "IncompatibleKeys",
    "StateDictError",
)
