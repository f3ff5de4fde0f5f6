"""The command line: ``python -m benchmarks [--quick] [--only NAME] [--rounds N] ...``."""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._harness import Comparison, Config, format_table, json_line
from ._machine import describe, summary

__all__ = ["BENCHMARKS", "main", "parse_args"]

# name -> module; each module has run(cfg, log) -> list[Comparison]. Imported only when
# selected, so `--only overhead` does not pay for importing torch.
BENCHMARKS: dict[str, str] = {
    "overhead": "benchmarks.overhead",
    "ensemble": "benchmarks.ensemble",
    "simulated": "benchmarks.simulated",
    "memory": "benchmarks.memory",
    "scaling": "benchmarks.scaling",
    "serving": "benchmarks.serving",
    "sizes": "benchmarks.sizes",
    "awaited": "benchmarks.awaited",
}

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def _names(values: Sequence[str] | None) -> list[str]:
    if not values:
        return list(BENCHMARKS)
    names: list[str] = []
    for v in values:
        for name in v.split(","):
            name = name.strip()
            if not name:
                continue
            if name not in BENCHMARKS:
                raise argparse.ArgumentTypeError(
                    f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}"
                )
            if name not in names:
                names.append(name)
    return names


def _threads(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--threads takes comma-separated positive ints like 1,2,4, got {text!r}"
        ) from None
    if not counts or any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(
            f"--threads takes comma-separated positive ints like 1,2,4, got {text!r}"
        )
    return counts


def _rounds(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--rounds takes a positive int, got {text!r}")
    return n


def _size(text: str) -> tuple[int, int, int]:
    try:
        t, b, c = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is T,B,C (three ints), got {text!r}") from None
    if min(t, b, c) < 1:
        raise argparse.ArgumentTypeError(f"a size's T, B and C must be >= 1, got {text!r}")
    return t, b, c


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run dataflow's benchmarks: contenders interleaved round by round, a table "
        "and a BENCH_JSON line per benchmark, results saved as JSON.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: tiny sizes, 2 rounds (CI); the figures mean nothing",
    )
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help=f"run only these (repeatable or comma-separated): {', '.join(BENCHMARKS)}",
    )
    p.add_argument(
        "--rounds",
        type=_rounds,
        default=None,
        help="measured rounds per comparison (default 5, 2 with --quick)",
    )
    p.add_argument(
        "--big-rounds",
        type=_rounds,
        default=None,
        help="rounds at the seed size (50, 50, 1024) in 'ensemble' and 'scaling' (default: "
        "--rounds); lower it when the full run is too slow",
    )
    p.add_argument(
        "--threads",
        type=_threads,
        default=(1, 2, 4, 8, 16),
        help="inter-op thread counts for 'simulated' and 'scaling' (default "
        "1,2,4,8,16; 'scaling' skips counts above the cores)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="directory for the JSON results (default benchmarks/results/)",
    )
    p.add_argument(
        "--size",
        action="append",
        type=_size,
        metavar="T,B,C",
        help="'ensemble' only: run this size (repeatable; default: its three sizes)",
    )
    p.add_argument(
        "--contender",
        action="append",
        metavar="NAME",
        help="'ensemble' only: run this contender (repeatable; the baseline, numpy "
        "sequential, always runs; default: all)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-round progress on stderr")
    args = p.parse_args(argv)
    try:
        args.names = _names(args.only)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.rounds is None:
        args.rounds = 2 if args.quick else 5
    return args


def _log(quiet: bool) -> Callable[[str], None]:
    def log(msg: str) -> None:
        if not quiet:
            print(f"# {msg}", file=sys.stderr, flush=True)

    return log


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected benchmarks; 0 when all of them ran, 1 when one failed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    cfg = Config(
        quick=args.quick,
        rounds=args.rounds,
        threads=args.threads,
        verbose=not args.quiet,
        big_rounds=args.big_rounds,
        sizes=tuple(args.size or ()),
        contenders=tuple(args.contender or ()),
    )
    log = _log(args.quiet)
    machine = describe(argv)
    print(summary(machine), flush=True)
    results: dict[str, Any] = {
        "machine": machine,
        "config": {
            "quick": cfg.quick,
            "rounds": cfg.rounds,
            "big_rounds": cfg.big_rounds,
            "threads": list(cfg.threads),
            "benchmarks": args.names,
        },
        "benchmarks": {},
    }
    failed: list[str] = []
    tables: list[str] = []
    for name in args.names:
        print(f"\n## {name}\n", flush=True)
        load_before = _loadavg()
        t0 = time.perf_counter()
        try:
            module = importlib.import_module(BENCHMARKS[name])
            comparisons: list[Comparison] = module.run(cfg, log)
        except Exception as exc:
            traceback.print_exc()
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            failed.append(name)
            results["benchmarks"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        elapsed = time.perf_counter() - t0
        for cmp in comparisons:
            table = format_table(cmp)
            tables.append(table)
            print(table + "\n", flush=True)
        print(json_line(name, comparisons, seconds=round(elapsed, 1)), flush=True)
        load = [load_before, _loadavg()]
        print(
            f"load average (1 min) before/after: {load[0]:.2f} / {load[1]:.2f} "
            f"on {machine['cores_available']} cores (other processes compete when high)\n",
            flush=True,
        )
        results["benchmarks"][name] = {
            "seconds": elapsed,
            "loadavg_1min": load,
            "comparisons": [c.to_json() for c in comparisons],
        }
    path = _save(args.out, results, tables)
    print(f"\nresults saved to {path}", flush=True)
    if failed:
        print(f"Error: benchmark(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover - not available
        return float("nan")


def _save(out: Path, results: dict[str, Any], tables: list[str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = out / f"run-{stamp}.json"
    text = json.dumps(results, indent=1, default=str)
    path.write_text(text)
    (out / "latest.json").write_text(text)
    (out / "latest.md").write_text("\n\n".join(tables) + "\n")
    return path
