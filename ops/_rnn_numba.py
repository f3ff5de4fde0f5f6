"""Recurrent sequence kernels compiled with numba: the ``"numba"`` recurrent engine.

An optional extra (``pip install -e '.[numba]'`` in a checkout): used by default where it is
installed (the ``"auto"`` engine, after :func:`check`), or chosen with
``ops.set_recurrent_engine("numba")``. A small model's numpy kernel spends its steps in numpy's
per-call overhead, under the GIL: two directions on two threads only take turns. These
kernels run the whole time loop as compiled code without the GIL (``nogil=True``), so the
scheduler measures them GIL-free and runs a model's directions side by side.

Only for float32, and where a step's recurrent product is at most
``_rnn_engine.NUMBA_STEP_MACS_MAX`` multiply-adds: past that BLAS's own products win, and a
float64 model keeps numpy's exact functions. The input projection is one BLAS product, as in
the numpy kernels; the step runs the recurrent product and the gate math in loops compiled
for this machine. ``tanh`` (and the sigmoids, as ``(tanh(x / 2) + 1) / 2``) is a rational
approximation (Eigen's float ``ptanh``) accurate to 3.3e-7 absolute, against numpy's float32
``tanh`` 6e-8: both agree with torch's LSTM and GRU within 1e-5.

The weights are read where they are at each call: nothing is cached, so a parameter written
in place takes effect at the next call. (A recurrent weight that ``lay_out`` stored in
Fortran order is copied to C order for the call.) The first call of a
process compiles the loops (about a second; numba caches them on disk for the next process).
"""

from __future__ import annotations

import importlib.util
import threading
from typing import Any, TypeAlias

import numpy as np

from dataflow import DataflowRuntimeError

from ._rnn_projection import project_rows

Array: TypeAlias = "np.ndarray[Any, Any]"

__all__ = [
    "available",
    "check",
    "gru_block_gates",
    "gru_sequence",
    "lstm_block_gates",
    "lstm_sequence",
]


def available() -> bool:
    """Whether numba is installed (the ``"numba"`` engine can run). numba itself is imported,
    and the loops compiled, only when a kernel first runs (importing it takes ~0.2 s)."""
    return importlib.util.find_spec("numba") is not None


# Eigen's float tanh: x * p(x^2) / q(x^2) on x clamped to +-7.9 (where float32 tanh is +-1).
_F32 = np.float32
_CLAMP = _F32(7.90531110763549805)
_A13, _A11 = _F32(-2.76076847742355e-16), _F32(2.00018790482477e-13)
_A9, _A7 = _F32(-8.60467152213735e-11), _F32(5.12229709037114e-08)
_A5, _A3, _A1 = _F32(1.48572235717979e-05), _F32(6.37261928875436e-04), _F32(4.89352455891786e-03)
_B6, _B4, _B2 = _F32(1.19825839466702e-06), _F32(1.18534705686654e-04), _F32(2.26843463243900e-03)
_B0 = _F32(4.89352518554385e-03)
_HALF = _F32(0.5)


def _tanh(v: Any) -> Any:
    # (Written so that NaN passes through, as numpy's tanh lets it: NaN > c is false.)
    x = _CLAMP if v > _CLAMP else v
    x = -_CLAMP if x < -_CLAMP else x
    x2 = x * x
    p = x2 * _A13 + _A11
    p = x2 * p + _A9
    p = x2 * p + _A7
    p = x2 * p + _A5
    p = x2 * p + _A3
    p = x2 * p + _A1
    q = x2 * _B6 + _B4
    q = x2 * q + _B2
    q = x2 * q + _B0
    return x * p / q


def _sigmoid(v: Any) -> Any:
    return _HALF * _tanh(_HALF * v) + _HALF


def _add_recurrent(w_hh: Any, h: Any, b: int, acc: Any) -> None:
    """``acc[g] += w_hh[g] . h[b]`` for every row ``g``, four rows at a time: each ``h[b, k]``
    is read once for four rows, and the four sums run side by side (measured at batch 1,
    H = 128: 2.0 us a step against 2.8 one row at a time). Each row's sum runs over ``k`` in
    order, as one row at a time would."""
    width, hidden = w_hh.shape
    g = 0
    while g + 4 <= width:
        a0, a1, a2, a3 = acc[g], acc[g + 1], acc[g + 2], acc[g + 3]
        for k in range(hidden):
            hk = h[b, k]
            a0 += w_hh[g, k] * hk
            a1 += w_hh[g + 1, k] * hk
            a2 += w_hh[g + 2, k] * hk
            a3 += w_hh[g + 3, k] * hk
        acc[g], acc[g + 1], acc[g + 2], acc[g + 3] = a0, a1, a2, a3
        g += 4
    while g < width:
        a = acc[g]
        for k in range(hidden):
            a += w_hh[g, k] * h[b, k]
        acc[g] = a
        g += 1


def _lstm_loop(xp: Any, w_hh: Any, h: Any, c: Any, out: Any, reverse: bool) -> None:
    """The time loop: ``xp`` (T, B, 4H) the projected input, ``w_hh`` (4H, H); ``h`` and ``c``
    (B, H) are the running states (updated in place), ``out`` (T, B, H) the output. The
    recurrent product runs a row of ``w_hh`` at a time (no transposed copy to make)."""
    steps, batch, width = xp.shape
    hidden = width // 4
    gates = np.empty(width, dtype=np.float32)
    for s in range(steps):
        t = steps - 1 - s if reverse else s
        for b in range(batch):
            for g in range(width):
                gates[g] = xp[t, b, g]
            _add_recurrent(w_hh, h, b, gates)
            for j in range(hidden):
                i = _sigmoid(gates[j])
                f = _sigmoid(gates[hidden + j])
                gg = _tanh(gates[2 * hidden + j])
                o = _sigmoid(gates[3 * hidden + j])
                cj = f * c[b, j] + i * gg
                c[b, j] = cj
                out[t, b, j] = o * _tanh(cj)
            for j in range(hidden):
                h[b, j] = out[t, b, j]


def _gru_loop(xp: Any, w_hh: Any, b_hn: Any, h: Any, out: Any, reverse: bool) -> None:
    """The time loop: ``xp`` (T, B, 3H) the projected input with ``b_ih`` and ``b_hh``'s r
    and z parts, ``w_hh`` (3H, H), ``b_hn`` (H,); ``h`` (B, H) the running state."""
    steps, batch, width = xp.shape
    hidden = width // 3
    gh = np.empty(width, dtype=np.float32)
    for s in range(steps):
        t = steps - 1 - s if reverse else s
        for b in range(batch):
            gh[:] = np.float32(0)
            _add_recurrent(w_hh, h, b, gh)
            for j in range(hidden):
                r = _sigmoid(xp[t, b, j] + gh[j])
                z = _sigmoid(xp[t, b, hidden + j] + gh[hidden + j])
                n = _tanh(xp[t, b, 2 * hidden + j] + r * (gh[2 * hidden + j] + b_hn[j]))
                out[t, b, j] = n + z * (h[b, j] - n)
            for j in range(hidden):
                h[b, j] = out[t, b, j]


def _lstm_block_gates(gates: Any, col: Any, bias: Any, c: Any, h: Any) -> None:
    """One step's gate math for numpy's blocked LSTM kernels (``_rnn_lstm``: the GEMM
    stays BLAS's), in one pass: ``gates`` (blocks, B, block) the recurrent product, gate
    ``q``'s columns in blocks ``q*H/block`` to ``(q+1)*H/block``; ``col`` (B, 4H) the step's
    projected input, or (0, 0) for none; ``bias`` (4H,) or (0,); ``c`` (H/block, B, block) the
    cell state, updated in place; ``h`` (B, H) receives the new hidden state (any strides).
    """
    blocks, batch, block = gates.shape
    per = blocks // 4
    hidden = per * block
    with_col = col.shape[0] > 0
    with_bias = bias.shape[0] > 0
    for kb in range(per):
        for b in range(batch):
            for r in range(block):
                j = kb * block + r
                zi = gates[kb, b, r]
                zf = gates[per + kb, b, r]
                zg = gates[2 * per + kb, b, r]
                zo = gates[3 * per + kb, b, r]
                if with_col:
                    zi += col[b, j]
                    zf += col[b, hidden + j]
                    zg += col[b, 2 * hidden + j]
                    zo += col[b, 3 * hidden + j]
                if with_bias:
                    zi += bias[j]
                    zf += bias[hidden + j]
                    zg += bias[2 * hidden + j]
                    zo += bias[3 * hidden + j]
                cj = _sigmoid(zf) * c[kb, b, r] + _sigmoid(zi) * _tanh(zg)
                c[kb, b, r] = cj
                h[b, j] = _sigmoid(zo) * _tanh(cj)


def _gru_block_gates(gh: Any, gi: Any, b_ih: Any, b_hh: Any, hb: Any, h: Any) -> None:
    """One GRU step's gate math for numpy's blocked GRU kernel (the GEMM stays BLAS's), in one
    pass: ``gh`` (blocks, B, block) the recurrent product, gate ``q``'s columns in blocks
    ``q*H/block`` to ``(q+1)*H/block`` (r, z, n); ``gi`` (B, 3H) the step's projected input;
    ``b_ih`` and ``b_hh`` (3H,) or (0,); ``hb`` (H/block, B, block) the state, updated in
    place; ``h`` (B, H) receives it too (any strides)."""
    blocks, batch, block = gh.shape
    per = blocks // 3
    hidden = per * block
    with_ih = b_ih.shape[0] > 0
    with_hh = b_hh.shape[0] > 0
    for kb in range(per):
        for b in range(batch):
            for q in range(block):
                j = kb * block + q
                hr = gh[kb, b, q]
                hz = gh[per + kb, b, q]
                hn = gh[2 * per + kb, b, q]
                xr = gi[b, j]
                xz = gi[b, hidden + j]
                xn = gi[b, 2 * hidden + j]
                if with_hh:
                    hr += b_hh[j]
                    hz += b_hh[hidden + j]
                    hn += b_hh[2 * hidden + j]
                if with_ih:
                    xr += b_ih[j]
                    xz += b_ih[hidden + j]
                    xn += b_ih[2 * hidden + j]
                r = _sigmoid(xr + hr)
                z = _sigmoid(xz + hz)
                n = _tanh(xn + r * hn)
                hj = n + z * (hb[kb, b, q] - n)
                hb[kb, b, q] = hj
                h[b, j] = hj


# LLVM may contract multiply-adds, reassociate sums and use reciprocals; not assume there is
# no NaN or inf ("fast" would): those propagate as numpy's kernels let them. Division follows
# numpy's rules, not Python's (``error_model``): Python's tests every divisor for zero, a
# branch that kept LLVM from vectorizing the gate loops (``_tanh`` divides; its divisor is a
# polynomial in x^2 with positive coefficients, never zero). One direction at (T, B, H) =
# (50, 1, 128): 425 against 245 us (LSTM), 289 against 177 (GRU).
_FASTMATH = {"contract", "reassoc", "arcp"}
_JIT: dict[str, Any] = {"fastmath": _FASTMATH, "error_model": "numpy"}
_compile_lock = threading.Lock()
_loops: tuple[Any, Any, Any, Any] | None = None
# The Python functions the loops call (the module's globals ``_tanh``, ``_sigmoid`` and
# ``_add_recurrent`` become their jitted versions, which the loops call).
_PY = {"_tanh": _tanh, "_sigmoid": _sigmoid, "_add_recurrent": _add_recurrent}


def _compiled() -> tuple[Any, Any, Any, Any]:
    """The compiled loops and the blocked kernels' gate step: numba imported and the
    functions above jitted on first use, once (two threads may run their first kernels at the
    same time)."""
    global _loops
    loops = _loops
    if loops is not None:
        return loops
    with _compile_lock:
        if _loops is None:
            try:
                import numba
            except ImportError:
                raise DataflowRuntimeError(
                    "the 'numba' recurrent engine needs numba, which is not installed: pip "
                    "install 'numba>=0.60' (in a checkout: pip install -e '.[numba]')"
                ) from None
            g = globals()
            for name, fn in _PY.items():
                g[name] = numba.njit(inline="always", **_JIT)(fn)
            _loops = (
                numba.njit(nogil=True, cache=True, **_JIT)(_lstm_loop),
                numba.njit(nogil=True, cache=True, **_JIT)(_gru_loop),
                numba.njit(nogil=True, cache=True, **_JIT)(_lstm_block_gates),
                numba.njit(nogil=True, cache=True, **_JIT)(_gru_block_gates),
            )
        return _loops


#: The gate steps' "no bias" (an empty float32 array: numba compiles one signature for both).
NO_BIAS = np.zeros(0, dtype=np.float32)


def check() -> None:
    """Import numba, compile the loops and run each once on a tiny model: raises what numba
    raises where it cannot (the ``"auto"`` engine's test before choosing it). The first run
    in a process compiles (about a second; later processes load numba's disk cache)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 1, 3)).astype(np.float32)
    w = rng.standard_normal((8, 5)).astype(np.float32) * np.float32(0.5)
    out, h, c = lstm_sequence(x, w[:, :3], w[:, 0], w[:, 3:], None, None, False, False)
    out_g, h_g = gru_sequence(x, w[:6, :3], w[:6, 0], w[:6, 3:], w[:6, 1], None, True, False)
    block_gates = lstm_block_gates()
    gates, c_b, h_b = np.ones((8, 1, 1), np.float32), np.ones((2, 1, 1), np.float32), h.copy()
    block_gates(gates, np.zeros((0, 0), np.float32), w[:, 0], c_b, h_b)
    hb_g, h_gb = np.ones((2, 1, 1), np.float32), h.copy()
    gru_block_gates()(gates[:6], w[:6, 1:2].T.copy(), w[:6, 0], NO_BIAS, hb_g, h_gb)
    for a in (out, h, c, out_g, h_g, c_b, h_b, hb_g, h_gb):
        if not np.isfinite(a).all():
            raise DataflowRuntimeError("the numba recurrent loops gave a non-finite result")


def lstm_block_gates() -> Any:
    """The compiled :func:`_lstm_block_gates` (numba imported and the loops compiled on first
    use)."""
    return _compiled()[2]


def gru_block_gates() -> Any:
    """The compiled :func:`_gru_block_gates` (numba imported and the loops compiled on first
    use)."""
    return _compiled()[3]


def _project(x: Array, w_ih: Array, bias: Array | None, batch_first: bool) -> Array:
    """``x @ w_ih.T + bias`` as a (T, B, G) float32 array: one BLAS product, in the form
    measured fastest for its shape (``_rnn_projection.project_rows``: at the (50, 1, 128)
    ensemble's (50, 128) x (128, 512), in blocks of the weight's rows, 83 against 114 us)."""
    xs = x.swapaxes(0, 1) if batch_first else x
    steps, batch = xs.shape[0], xs.shape[1]
    rows = np.ascontiguousarray(xs, dtype=np.float32).reshape(steps * batch, xs.shape[2])
    xp = np.empty((steps * batch, w_ih.shape[0]), dtype=np.float32)
    project_rows(rows, w_ih, xp)
    if bias is not None:
        xp += bias
    out: Array = xp.reshape(steps, batch, w_ih.shape[0])
    return out


def _state(s: Array | None, batch: int, hidden: int) -> Array:
    """A fresh (B, H) float32 state: zeros, or a copy of ``s`` (the kernel writes it)."""
    if s is None:
        return np.zeros((batch, hidden), dtype=np.float32)
    return np.array(s, dtype=np.float32, order="C")


def _c32(w: Array) -> Array:
    """``w`` as a C-ordered float32 array (itself when it is one: the usual case)."""
    return np.ascontiguousarray(w, dtype=np.float32)


def _layout(out: Array, batch_first: bool) -> Array:
    return np.ascontiguousarray(out.swapaxes(0, 1)) if batch_first else out


def lstm_sequence(
    x: Array,
    w_ih: Array,
    bias: Array | None,
    w_hh: Array,
    h0: Array | None,
    c0: Array | None,
    reverse: bool,
    batch_first: bool,
) -> tuple[Array, Array, Array]:
    """``_rnn_sequence.lstm_sequence_kernel`` on the compiled loop: (output, h_n, c_n)."""
    lstm_loop = _compiled()[0]
    xp = _project(x, w_ih, bias, batch_first)
    steps, batch = xp.shape[0], xp.shape[1]
    hidden = w_hh.shape[1]
    h, c = _state(h0, batch, hidden), _state(c0, batch, hidden)
    out = np.empty((steps, batch, hidden), dtype=np.float32)
    lstm_loop(xp, _c32(w_hh), h, c, out, bool(reverse))
    return _layout(out, batch_first), h, c


def gru_sequence(
    x: Array,
    w_ih: Array,
    b_ih: Array | None,
    w_hh: Array,
    b_hh: Array | None,
    h0: Array | None,
    reverse: bool,
    batch_first: bool,
) -> tuple[Array, Array]:
    """``_rnn_sequence.gru_sequence_kernel`` on the compiled loop: (output, h_n). ``b_hh``'s
    r and z parts are folded into the projection's bias; its n part stays in the step."""
    gru_loop = _compiled()[1]
    hidden = w_hh.shape[1]
    bias = None if b_ih is None else np.array(b_ih, dtype=np.float32)
    b_hn = np.zeros(hidden, dtype=np.float32)
    if b_hh is not None:
        if bias is None:
            bias = np.zeros(3 * hidden, dtype=np.float32)
        bias[: 2 * hidden] += b_hh[: 2 * hidden]
        b_hn[:] = b_hh[2 * hidden :]
    xp = _project(x, w_ih, bias, batch_first)
    steps, batch = xp.shape[0], xp.shape[1]
    h = _state(h0, batch, hidden)
    out = np.empty((steps, batch, hidden), dtype=np.float32)
    gru_loop(xp, _c32(w_hh), b_hn, h, out, bool(reverse))
    return _layout(out, batch_first), h
