"""Code that awaits each op as it goes: one LSTM, its output awaited at every call.

The ``ensemble`` and ``sizes`` benchmarks dispatch a whole forward before awaiting anything,
so the scheduler sees the work ahead. Much model code is plainer than that: one module, its
result needed at once (a recurrent decoder, a request handler calling one model). There the
scheduler has nothing to overlap, and the promise is only that it costs nothing: no slower
than the same numpy code run plainly. This benchmark measures that, over sizes from a 75 us
op (where a hand-off to a worker and back would double its time) to a few milliseconds:

* **numpy** (``benchmarks._reference.lstm_forward``, the obvious numpy LSTM), BLAS 1;
* **dataflow, automatic** (inter-op threads on every core) and **dataflow, 1 inter-op
  thread**, both BLAS 1: ``out, _ = await lstm(x)`` then ``await dataflow.materialize(out)``
  at every call, ``lstm = ops.nn.LSTM(C, C)`` with the same weights;
* **numpy, BLAS n** and **dataflow, defaults**: the same with nothing set, BLAS on every core
  (a runtime adapts that count, ``dataflow._blas``: one call at a time here, so it keeps all
  of them). The last size, (50, 50, 1024), is one direction of the tutorial's model: a chain
  of large GEMMs, where BLAS's threads are worth having.

Every contender's round runs in a fresh process (``python -m benchmarks.awaited --child``)
that warms up for one round first; rounds are interleaved with the order rotated, and every
output is checked against numpy's. One table per size, then a summary of best-round ratios.

Run: ``python -m benchmarks --only awaited [--rounds 5]`` (about a minute at 3 rounds on 2
cores); ``--quick`` measures one tiny size once, in this process.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ._harness import (
    Comparison,
    Config,
    Contender,
    Row,
    best_ratio,
    interleave,
    module_main,
    run_child,
)
from ._machine import cores
from ._reference import LSTMWeights, allclose, lstm_forward

__all__ = ["CONTENDERS", "SIZES", "run"]

#: (T, B, C) of the one LSTM, fastest call first.
SIZES = ((10, 1, 32), (50, 1, 128), (20, 1, 256), (50, 4, 128), (50, 16, 256), (50, 50, 1024))
QUICK_SIZES = ((5, 1, 16),)
CONTENDERS = (
    "numpy",
    "dataflow, automatic",
    "dataflow, 1 inter-op thread",
    "numpy, BLAS n",
    "dataflow, defaults",
)
#: Contenders that set nothing: BLAS keeps its own thread count (the cores).
_NOTHING_SET = ("numpy, BLAS n", "dataflow, defaults")
ROUND_SECONDS = 0.25  # calls per round: about this long


class MismatchError(RuntimeError):
    """A contender's output differed from numpy's, or its child process failed."""


def _setup(size: tuple[int, int, int]) -> tuple[Any, Any, LSTMWeights]:
    """The module, the input and the same weights for the numpy reference."""
    import ops

    t, b, c = size
    lstm = ops.nn.LSTM(c, c, seed=0)
    x = np.random.default_rng(1).random((t, b, c), dtype=np.float32)
    w = LSTMWeights(lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0)
    return lstm, x, w


def _calls(size: tuple[int, int, int]) -> int:
    """Calls per round: about ROUND_SECONDS of numpy."""
    _, x, w = _setup(size)
    lstm_forward(x, w)
    t0 = time.perf_counter()
    lstm_forward(x, w)
    once = time.perf_counter() - t0
    return max(1, min(2000, round(ROUND_SECONDS / once)))


def measure(name: str, size: tuple[int, int, int], calls: int) -> tuple[float, Any]:
    """One round of ``name``: seconds per call (mean over ``calls``) and the last output."""
    from threadpoolctl import threadpool_limits

    import dataflow

    lstm, x, w = _setup(size)
    with threadpool_limits(limits=cores() if name in _NOTHING_SET else 1, user_api="blas"):
        if name.startswith("numpy"):
            t0 = time.perf_counter()
            for _ in range(calls):
                out = lstm_forward(x, w)
            return (time.perf_counter() - t0) / calls, out
        if name not in CONTENDERS:
            raise ValueError(f"awaited: unknown contender {name!r}; one of {CONTENDERS}")
        interop = 1 if name == "dataflow, 1 inter-op thread" else cores()

        async def main() -> tuple[float, Any]:
            got: Any = None
            t0 = time.perf_counter()
            for _ in range(calls):
                out, _ = await lstm(x)
                got = await dataflow.materialize(out)
            return (time.perf_counter() - t0) / calls, got

        result: tuple[float, Any] = dataflow.run(main, interop_threads=interop)
        return result


def _check(name: str, size: tuple[int, int, int], out: Any) -> None:
    _, x, w = _setup(size)
    ok, diff = allclose(out, lstm_forward(x, w))
    if not ok:
        raise MismatchError(f"awaited {size}: {name!r} differs from numpy (max |diff| {diff:g})")


def child_main(spec: str) -> None:
    """One contender, one round, in this fresh process: a warm-up round, the timed round, the
    output checked, one JSON line."""
    d = json.loads(spec)
    size = (int(d["size"][0]), int(d["size"][1]), int(d["size"][2]))
    name, calls = d["name"], int(d["calls"])
    measure(name, size, calls)  # warm-up (kernel calibration, the scheduler's learning)
    seconds, out = measure(name, size, calls)
    _check(name, size, out)
    print(json.dumps({"name": name, "seconds": seconds}), flush=True)


def _child_contender(name: str, size: tuple[int, int, int], calls: int) -> Contender:
    args = json.dumps({"name": name, "size": list(size), "calls": calls})

    def measure_child() -> float:
        what = f"awaited {size}: contender {name!r}"
        seconds: float = run_child("benchmarks.awaited", args, MismatchError, what)["seconds"]
        return seconds

    return Contender(name, measure_child, note=_note(name))


def _in_process(name: str, size: tuple[int, int, int], calls: int) -> Contender:
    def measure_here() -> float:
        seconds, out = measure(name, size, calls)
        _check(name, size, out)
        return seconds

    return Contender(name, measure_here, note=_note(name))


def _note(name: str) -> str:
    if name == "numpy":
        return "BLAS 1"
    if name == "numpy, BLAS n":
        return f"BLAS {cores()}"
    if name == "dataflow, defaults":
        return f"inter-op {cores()}, BLAS adaptive"
    return f"inter-op {1 if name.endswith('1 inter-op thread') else cores()}, BLAS 1"


def summary(per_size: list[tuple[tuple[int, int, int], list[Row]]]) -> Comparison:
    """One row per size: numpy's rounds, and each dataflow contender's best round over
    numpy's best."""
    rows = []
    for size, measured in per_size:
        extra: dict[str, Any] = {
            col: best_ratio(measured, name, (base,))
            for col, name, base in (
                ("auto / numpy", "dataflow, automatic", "numpy"),
                ("1 thread / numpy", "dataflow, 1 inter-op thread", "numpy"),
                ("defaults / numpy n", "dataflow, defaults", "numpy, BLAS n"),
            )
        }
        extra["holds"] = all(v is not None and v <= 1.05 for v in extra.values())
        numpy_row = next(r for r in measured if r.name == "numpy")
        rows.append(Row(str(size), "numpy round (s)", numpy_row.values, extra=extra))
    return Comparison(
        "awaited",
        "one LSTM awaited at every call: ratios of best rounds per size (lower is faster)",
        "s",
        "",
        rows,
        columns=("auto / numpy", "1 thread / numpy", "defaults / numpy n", "holds"),
        notes=[
            "holds: every dataflow contender within 5% of numpy at the same BLAS setting "
            "(best rounds; the defaults against numpy with nothing set)"
        ],
    )


def run(cfg: Config, log: Callable[[str], None]) -> list[Comparison]:
    """A table per size (every round in a fresh process; quick mode: each contender once in
    this process on a tiny size), then the summary."""
    n = cores()
    comparisons: list[Comparison] = []
    per_size: list[tuple[tuple[int, int, int], list[Row]]] = []
    for size in QUICK_SIZES if cfg.quick else SIZES:
        calls = 3 if cfg.quick else _calls(size)
        make = _in_process if cfg.quick else _child_contender
        contenders = [make(name, size, calls) for name in CONTENDERS]
        rounds = 1 if cfg.quick else cfg.rounds
        log(f"awaited: {size}: {calls} call(s) per round, {rounds} round(s)")
        load0 = os.getloadavg()[0]
        rows = interleave(contenders, rounds, baseline="numpy", warmup=0, log=log)
        load1 = os.getloadavg()[0]
        for row in rows:
            row.extra["best vs best"] = best_ratio(rows, row.name, ("numpy",))
        t, b, c = size
        comparisons.append(
            Comparison(
                "awaited",
                f"one LSTM (T, B, C) = ({t}, {b}, {c}), awaited at every call: seconds a call",
                "s",
                "numpy",
                rows,
                params={
                    "size": list(size),
                    "calls_per_round": calls,
                    "rounds": rounds,
                    "load_average": [load0, load1],
                    "fresh_processes": not cfg.quick,
                },
                columns=("best vs best",),
                notes=[
                    f"{rounds} round(s), "
                    + (
                        "measured once in this process; "
                        if cfg.quick
                        else "each a fresh process after a warm-up round there; "
                    )
                    + f"round value = mean of {calls} call(s); outputs checked; load average "
                    f"(1 min) {load0:.2f} -> {load1:.2f} on {n} cores",
                ],
            )
        )
        per_size.append((size, rows))
    comparisons.append(summary(per_size))
    return comparisons


def main(argv: list[str] | None = None) -> None:
    module_main("awaited", __doc__.splitlines()[0], child_main, argv)


if __name__ == "__main__":
    main()
