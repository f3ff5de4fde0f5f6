"""Memory: peak resident memory of one ensemble forward, dataflow automatic vs plain numpy.

Each measurement is a fresh ``python -m benchmarks.memory --child ...`` process, so nothing
left over from another contender counts. The child builds the weights and the input, then
resets the kernel's high-water mark (``/proc/self/clear_refs``), runs one forward pass and
reports:

* ``peak`` (the value): the process's peak RSS during the forward (``VmHWM``), in MiB;
* ``forward_mib``: that peak minus the RSS just before the forward, i.e. what the forward
  itself needed on top of the weights and the input (activations, temporaries, and for
  dataflow the runtime's graph and pending values);
* ``private_mib``: the peak of the process's private memory during the forward (``RssAnon``:
  the heap, arrays, the interpreter's objects), sampled every :data:`SAMPLE_SECONDS` by a
  thread, so a lower bound that misses only peaks shorter than that. Peak RSS also counts
  the pages of shared libraries' code and data that the process has touched (``RssFile``:
  mapped from disk, shared with every other process using them, dropped and read back by
  the kernel under memory pressure); numba's compiler (LLVM) is most of the difference
  between the two for dataflow where it runs the recurrent gate math.

(``getrusage``'s ``ru_maxrss`` is no use here: Linux carries the parent's high-water mark over
``fork``/``exec``, so every child would report the benchmark process's own peak.)

Both children import the same modules (numpy, dataflow, ops) so import costs cancel out.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._harness import Comparison, Config, Contender, interleave
from ._machine import cores

__all__ = ["child_main", "run"]

SIZE = (50, 50, 1024)
QUICK_SIZE = (5, 4, 32)
MODES = ("numpy", "dataflow")
#: How often the child samples its private memory during the forward.
SAMPLE_SECONDS = 0.0005


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class PrivatePeak:
    """The peak of this process's private resident memory (``RssAnon``, KiB) while the
    ``with`` block runs, sampled every ``interval`` seconds on a daemon thread (and at both
    ends). ``peak`` stays None where ``/proc/self/status`` has no ``RssAnon`` (not Linux)."""

    def __init__(self, interval: float = SAMPLE_SECONDS) -> None:
        self.interval = interval
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="memory-sampler", daemon=True)

    def _read(self) -> None:
        value = _status_kib("RssAnon")
        if value is not None and (self.peak is None or value > self.peak):
            self.peak = value

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._read()

    def __enter__(self) -> PrivatePeak:
        self._read()
        if self.peak is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.peak is not None:
            self._read()


def child_main(argv: list[str]) -> int:
    """Run one forward in this process and print its memory figures as JSON."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory")
    p.add_argument("--child", choices=MODES, required=True)
    p.add_argument("--size", required=True, help="T,B,C")
    args = p.parse_args(argv)
    t, b, c = (int(v) for v in args.size.split(","))

    import numpy as np
    from threadpoolctl import threadpool_limits

    import dataflow

    from . import _models
    from . import _reference as ref

    weights = ref.make_weights(c)
    x = ref.make_input(t, b, c)
    ens: Any = None
    if args.child == "dataflow":
        why = _models.unavailable()
        if why is not None:
            raise SystemExit(f"dataflow contender unavailable: {why}")
        ens = _models.build_ensemble(weights)
        # The dataflow model holds its own copy of the weights; drop the reference's so both
        # children hold one copy.
        del weights
    else:
        _models.unavailable()  # import the same modules as the dataflow child
    n = cores()
    reset = _reset_peak()
    before = _status_kib("VmRSS") or 0
    private_before = _status_kib("RssAnon")
    with PrivatePeak() as private:
        if args.child == "dataflow":
            with threadpool_limits(limits=1, user_api="blas"):
                out = dataflow.run(_models.forward_auto, ens, x, interop_threads=n)
        else:
            with threadpool_limits(limits=n, user_api="blas"):
                out = ref.ensemble_forward(x, weights)
    peak = _status_kib("VmHWM") if reset else None
    # Without clear_refs, fall back to the lifetime peak (may include the parent's: see above).
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = {
        "mode": args.child,
        "rss_before_kib": before,
        "peak_kib": peak if peak is not None else maxrss,
        "peak_exact": reset,
        "private_before_kib": private_before,
        "private_peak_kib": private.peak,
        "file_kib": _status_kib("RssFile"),
        "output_shape": list(np.shape(out)),
    }
    print(json.dumps(result), flush=True)
    return 0


def measure_child(mode: str, size: tuple[int, int, int]) -> dict[str, Any]:
    """Run one child process and return what it reported."""
    cmd = [sys.executable, "-m", "benchmarks.memory", "--child", mode, "--size",
           ",".join(map(str, size))]  # fmt: skip
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"memory child {mode} {size} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}"
        )
    line = proc.stdout.strip().splitlines()[-1]
    data: dict[str, Any] = json.loads(line)
    return data


def run(cfg: Config, log: Callable[[str], None]) -> list[Comparison]:
    """Peak RSS of the ensemble forward, each in a fresh process."""
    from . import _models

    size = QUICK_SIZE if cfg.quick else SIZE
    details: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}

    def contender(mode: str, name: str, note: str, skip: str | None) -> Contender:
        def measure() -> float:
            d = measure_child(mode, size)
            details[mode].append(d)
            return float(d["peak_kib"]) / 1024

        return Contender(name, measure, note=note, skip=skip)

    n = cores()
    names = {"numpy": "numpy sequential", "dataflow": "dataflow, automatic"}
    contenders = [
        contender("numpy", names["numpy"], f"BLAS {n}", None),
        contender("dataflow", names["dataflow"], f"inter-op {n}, BLAS 1", _models.unavailable()),
    ]
    rows = interleave(contenders, cfg.rounds, baseline="numpy sequential", warmup=0, log=log)
    for mode, name in names.items():
        ds = details[mode]
        if not ds:
            continue
        row = next(r for r in rows if r.name == name)
        row.extra["forward_mib"] = statistics.median(
            (d["peak_kib"] - d["rss_before_kib"]) / 1024 for d in ds
        )
        row.extra["before_mib"] = statistics.median(d["rss_before_kib"] / 1024 for d in ds)
        private = [d["private_peak_kib"] / 1024 for d in ds if d.get("private_peak_kib")]
        if private:
            row.extra["private_mib"] = statistics.median(private)
    base = next((r for r in rows if r.name == names["numpy"]), None)
    if base is not None:
        for key in ("forward", "private"):
            if base.extra.get(f"{key}_mib", 0) <= 0:
                continue
            for row in rows:
                if f"{key}_mib" in row.extra:
                    row.extra[f"{key}_vs_numpy"] = (
                        row.extra[f"{key}_mib"] / base.extra[f"{key}_mib"]
                    )
    t, b, c = size
    return [
        Comparison(
            "memory",
            f"memory: peak RSS of one ensemble forward (T, B, C) = ({t}, {b}, {c}), MiB",
            "MiB",
            "numpy sequential",
            rows,
            params={"size": list(size)},
            columns=(
                "before_mib",
                "forward_mib",
                "forward_vs_numpy",
                "private_mib",
                "private_vs_numpy",
            ),
            notes=[
                "each value from a fresh process; before = RSS with weights and input built; "
                "forward = peak during the forward minus before; private = peak private "
                f"(anonymous) resident memory during the forward, sampled every "
                f"{SAMPLE_SECONDS * 1e3:g} ms (peak RSS also counts shared libraries' pages)",
            ],
        )
    ]


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
