"""Which engine runs a recurrent direction: the process-wide setting, and the choice per call.

:func:`set_recurrent_engine` picks one of :data:`ENGINES`: ``"numpy"``, the kernels of
:mod:`ops._rnn_small`, :mod:`ops._rnn_lstm` and :mod:`ops._rnn_gru`; ``"numba"``, the
compiled loops of :mod:`ops._rnn_numba`, which release the GIL (an optional extra);
``"auto"`` (the default), ``"numba"`` where numba is installed and its loops compile and
run, else ``"numpy"``, found out once (at the first small kernel, or at
``get_recurrent_engine()``). A numba that is installed but broken is reported once (a
RuntimeWarning) and left alone.

The setting is process-wide state, kept here alone: ``_engine`` (what was set) and ``_auto``
(what "auto" resolved to). Other modules read it through this one (:func:`_small_engine`,
:func:`_numba_gates`), never through a copied binding. Changing it calls the hooks in
``_on_engine_change`` (the sequence ops' learnt kernel times and GIL estimates start over).

Per call (:func:`_small_engine`) a direction goes to:

* numba's loop, where the engine is numba (set, or "auto" finding it), the model float32
  and a step's recurrent product at most :data:`NUMBA_STEP_MACS_MAX` multiply-adds: the
  compiled loop does the product itself, without the GIL, where numpy's kernels pay a BLAS
  call and a dozen numpy calls a step under it;
* else numpy's small kernel, where the weights are at most :data:`SMALL_WEIGHTS_PER_STEP`
  elements a step and the gate array at most :data:`SMALL_GATES_MAX`: a model this small
  spends its steps in numpy's per-call overhead, and that kernel makes the fewest calls
  (:mod:`ops._rnn_small`);
* else numpy's big kernels, in the form measured fastest for the shape
  (:mod:`ops._rnn_forms`). Where the engine is numba, their blocked and fused forms run each
  step's gate math as one compiled pass (:func:`_numba_gates`); the GEMMs stay BLAS's.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any, TypeAlias

import numpy as np

from dataflow import DataflowRuntimeError, OpInputError, OpTypeError

from . import _rnn_numba

__all__ = [
    "ENGINES",
    "NUMBA_STEP_MACS_MAX",
    "SMALL_GATES_MAX",
    "SMALL_WEIGHTS_PER_STEP",
    "get_recurrent_engine",
    "set_recurrent_engine",
]

Array: TypeAlias = "np.ndarray[Any, Any]"

#: The recurrent engines (``set_recurrent_engine``): "auto" (the default) is "numba" where
#: numba is installed and its loops compile, else "numpy".
ENGINES = ("auto", "numpy", "numba")
_engine = ["auto"]
# What "auto" resolved to (None: not yet; resolved at the first small kernel, once).
_auto: list[str | None] = [None]
_auto_lock = threading.Lock()


def set_recurrent_engine(name: str) -> None:
    """Run small recurrent models' sequence kernels on ``name``: ``"auto"`` (the default:
    ``"numba"`` where numba is installed, else ``"numpy"``), ``"numpy"``, or ``"numba"``
    (compiled loops that release the GIL, so a model's directions run side by side: an
    optional extra, ``pip install -e '.[numba]'`` in a checkout; see ``ops._rnn_numba``).

    The numba engine applies to float32 models whose step's recurrent product is at most
    NUMBA_STEP_MACS_MAX multiply-adds; others keep the numpy kernels. Process-wide: set it
    before running a model. The sequence ops' learnt kernel times and GIL estimates start
    over.
    """
    if type(name) is not str:
        raise OpTypeError(
            f"set_recurrent_engine(name): a str, one of {', '.join(map(repr, ENGINES))}; got "
            f"{type(name).__name__}: {name!r}"
        )
    if name not in ENGINES:
        raise OpInputError(
            f"set_recurrent_engine(name): one of {', '.join(map(repr, ENGINES))}, got {name!r}"
        )
    if name == "numba" and not _rnn_numba.available():
        raise DataflowRuntimeError(
            "set_recurrent_engine('numba') needs numba, which is not installed: pip install "
            "'numba>=0.60' (in a checkout: pip install -e '.[numba]')"
        )
    if name != _engine[0]:
        _engine[0] = name
        for forget in _on_engine_change:
            forget()


def get_recurrent_engine() -> str:
    """The recurrent engine small models run on: ``"numpy"`` or ``"numba"`` (what ``"auto"``
    resolves to, if it is set: finding out imports numba and compiles its loops once)."""
    engine = _engine[0]
    return _resolve_auto() if engine == "auto" else engine


def _resolve_auto() -> str:
    """What ``"auto"`` means in this process: ``"numba"`` if numba is installed and its loops
    compile and run (checked once, on a tiny model), else ``"numpy"``. A numba that is
    installed but broken is reported once (a RuntimeWarning) and left alone."""
    found = _auto[0]
    if found is not None:
        return found
    with _auto_lock:
        found = _auto[0]
        if found is None:
            found = "numpy"
            if _rnn_numba.available():
                try:
                    _rnn_numba.check()
                    found = "numba"
                except Exception as exc:  # an installed numba that cannot run our loops
                    warnings.warn(
                        f"ops: the 'numba' recurrent engine is installed but does not work "
                        f"here ({type(exc).__name__}: {exc}); small recurrent models run on "
                        "numpy. ops.set_recurrent_engine('numpy') silences this.",
                        RuntimeWarning,
                        stacklevel=2,
                    )
            _auto[0] = found
    return found


# Called when the engine changes (the sequence ops register theirs: ``_rnn_ops``).
_on_engine_change: list[Callable[[], None]] = []


#: A direction whose weights (``4H x (I + H)`` elements) are at most this many per step, with
#: a gate array (``B x 4H``) of at most SMALL_GATES_MAX elements, takes numpy's small kernel
#: (:func:`ops._rnn_small._lstm_sequence_small`): a model this small spends its steps in
#: numpy's per-call overhead, and the weights' copy it makes (about 0.3 ns an element) costs
#: less than the calls it saves (about 2 us a step). Measured on one thread (AMD EPYC,
#: OpenBLAS), small / plain kernel: 0.77 at (T, B, H) = (10, 1, 32), 0.84 at (10, 2, 32), 0.70
#: at (50, 1, 64), 0.86 at (50, 4, 64), 0.82 at (50, 1, 128); past the weights bound 0.97 at
#: (20, 1, 128), 1.16 at (10, 1, 128), 1.02 at (50, 1, 256).
SMALL_WEIGHTS_PER_STEP = 4096
#: Past this many gate elements the small kernel's time varied from process to process
#: (0.92x the plain kernel's in some, 1.2-1.3x in others, at (50, 4, 128), (50, 8, 128) and
#: (50, 4, 96): a memory-layout effect not yet understood), so it keeps to gate arrays where
#: it was measured steady.
SMALL_GATES_MAX = 1024
#: The numba engine runs a direction whose step's recurrent product (``B x G*H x H``
#: multiply-adds) is at most this: its compiled loop does the product itself, without the
#: GIL, where numpy's kernels pay a BLAS call and a dozen numpy calls a step under it. The
#: ensemble of 4 bidirectional LSTMs, inter-op 2, BLAS 1, best of 60 forwards in one
#: process, numba / numpy engine, two processes each (since the loops vectorize, numba's
#: ``error_model``): 0.72-0.75 at (T, B, C) = (50, 16, 128), 0.87-0.89 at (50, 1, 512),
#: 0.89-0.95 at (50, 4, 256) (1,048,576 a step), 0.73-0.78 at (50, 50, 64) (819,200); past
#: it 1.06-1.17 at (50, 8, 256) and 1.04-1.11 at (50, 32, 128), 0.86-0.95 at (50, 2, 512)
#: (2,097,152). (Before the loops vectorized the bound was half this: 1.03 at (50, 1, 512).)
NUMBA_STEP_MACS_MAX = 1 << 20


def _small_engine(x: Array, w_ih: Array, w_hh: Array, gates: int, batch_first: bool) -> str | None:
    """Which engine runs this direction: "numba" where it is set (or "auto" finds it), the
    model is float32 and a step's recurrent product is at most NUMBA_STEP_MACS_MAX
    multiply-adds; else "numpy" for numpy's small kernel (SMALL_WEIGHTS_PER_STEP,
    SMALL_GATES_MAX); else None (numpy's big kernels)."""
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    hidden = w_hh.shape[1]
    width = gates * hidden
    engine = _engine[0]
    if (
        engine != "numpy"
        and batch * width * hidden <= NUMBA_STEP_MACS_MAX
        and w_hh.dtype == np.float32
        and (engine == "numba" or (_auto[0] or _resolve_auto()) == "numba")
    ):
        return "numba"
    if width * (w_ih.shape[1] + hidden) > steps * SMALL_WEIGHTS_PER_STEP:
        return None
    if batch * width > SMALL_GATES_MAX:
        return None
    return "numpy"


def _numba_gates(dtype: np.dtype[Any], gru: bool = False) -> Callable[..., None] | None:
    """numba's one-pass gate step for the blocked and fused LSTM kernels
    (``_rnn_numba.lstm_block_gates``) or, with ``gru``, the blocked GRU kernel
    (``_rnn_numba.gru_block_gates``), where the recurrent engine is numba (set, or "auto"
    finding it) and the model float32; else None: numpy's passes. The GEMMs stay BLAS's.

    numpy's gate math is a dozen passes over the step's arrays, each a call under the GIL;
    the compiled step is one pass without it (the biases folded in, so the projection needs
    no pass of its own). One LSTM direction on one thread, in place blocks of 16: 478
    against 457 ms at the tutorial's (50, 50, 1024)."""
    if dtype != np.float32:
        return None
    engine = _engine[0]
    if engine == "numpy" or (engine == "auto" and (_auto[0] or _resolve_auto()) != "numba"):
        return None
    gates: Callable[..., None] = (
        _rnn_numba.gru_block_gates() if gru else _rnn_numba.lstm_block_gates()
    )
    return gates
