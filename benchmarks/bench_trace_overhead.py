"""What the event stream costs per op: tracing off, on, and compiled out.

Run: ``python benchmarks/bench_trace_overhead.py [--ops 100000] [--rounds 7]``

Each round is one ``dataflow.run`` that dispatches ``--ops`` tiny inline ops per contender (a
``dataflow.op`` whose cost rule makes it run on the calling thread: the hot path at its
shortest, where instrumentation weighs most), and reports microseconds per op for:

* **compiled out**: every ``Runtime`` method that tests ``ACTIVE`` (``submit``, ``execute``,
  the inline path...) rebuilt from its source with ``ast``, its ``if ACTIVE:`` blocks removed:
  the hot path without instrumentation at all;
* **off**: the library as it is, no instrument attached (the ``if ACTIVE:`` tests only);
* **no-op instrument**: an instrument whose start/finish hooks do nothing: the price of
  the event stream itself (``emit``: a timestamp, a lookup, a call per event);
* **profile**: ``dataflow.profile()`` recording (one list.extend per event);
* **profile, per-hook emit**: the same, with ``emit`` replaced by a per-hook table of bound
  methods (a proposed change to ``_instrument.emit``, patched in for this row only).

The machines this runs on are shared 2-vCPU VMs that stall for whole seconds, so contenders
take turns in chunks of ``--chunk`` ops within each round, in an order rotated from chunk to
chunk; a round's figure for a contender is its total time over its ops, its overhead the
median over rounds of the ratio to its reference in the same round. The profile keeps one
recording per round across its chunks, so its memory grows as in a real run.
Targets: off <= 1% over compiled out; profile <= 10% over off.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from typing import Any

import dataflow
from dataflow import _instrument, _runtime


def _kernel(x: Any) -> Any:
    return x


def _meta(x: Any) -> None:
    return None


def _cost(x: Any) -> dataflow.Cost:
    return dataflow.Cost(1.0, 8.0)


def _handle(task: dataflow.Task, index: int | None, spec: Any) -> dataflow.Pending[Any]:
    return dataflow.Pending(task, index)


tiny = dataflow.op("tiny", meta=_meta, handle=_handle, cost=_cost)(_kernel)


# -- contenders: each is (switch on, switch off), called between chunks --------------------------


class _StripActive(ast.NodeTransformer):
    """Drop every ``if ACTIVE...:`` statement (the instrumentation sites)."""

    def visit_If(self, node: ast.If) -> Any:
        names = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
        if "ACTIVE" in names and not node.orelse:
            return None
        return self.generic_visit(node)


def _compiled_out(name: str) -> Callable[..., Any]:
    fn = getattr(_runtime.Runtime, name)
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    tree = ast.fix_missing_locations(_StripActive().visit(tree))
    scope: dict[str, Any] = {}
    # The module's own globals, so settings such as the inline threshold stay live.
    exec(compile(tree, f"<{name} without instrumentation>", "exec"), vars(_runtime), scope)
    stripped: Callable[..., Any] = scope[name]
    return stripped


class NoOp:
    def task_started(self, ts: int, task: Any) -> None:
        pass

    def task_finished(self, ts: int, task: Any) -> None:
        pass


def _per_hook_emit() -> Callable[..., None]:
    """The proposed emit: bound methods per hook, looked up once per event."""
    hooks: dict[str, tuple[Callable[..., None], ...]] = {}
    for name in vars(_instrument.Instrument):
        if not name.startswith("_"):
            found = [getattr(i, name, None) for i in _instrument.ACTIVE]
            hooks[name] = tuple(m for m in found if m is not None)
    clock = time.perf_counter_ns

    def emit(hook: str, *args: Any) -> None:
        methods = hooks.get(hook)
        if not methods:
            return
        ts = clock()
        for method in methods:
            method(ts, *args)

    return emit


class Round:
    """The contenders' switches for one round (one recording for each profile row)."""

    def __init__(self) -> None:
        self.original = {
            n: fn
            for n, fn in vars(_runtime.Runtime).items()
            if inspect.isfunction(fn) and "ACTIVE" in inspect.getsource(fn)
        }
        self.stripped = {n: _compiled_out(n) for n in self.original}
        self.noop = NoOp()
        self.profiles = [dataflow.Profiler(), dataflow.Profiler()]
        for p in self.profiles:  # started, then detached until their chunks
            p.start()
            dataflow.remove_instrument(p)
        self.namespace = vars(_runtime)  # the runtime calls emit() through its globals
        self.emit = self.namespace["emit"]

    def switches(self) -> list[tuple[str, Callable[[], None], Callable[[], None], str]]:
        def strip() -> None:
            for n, fn in self.stripped.items():
                setattr(_runtime.Runtime, n, fn)

        def restore() -> None:
            for n, fn in self.original.items():
                setattr(_runtime.Runtime, n, fn)

        def nothing() -> None:
            pass

        def attach(inst: Any) -> Callable[[], None]:
            return lambda: dataflow.add_instrument(inst)

        def detach(inst: Any) -> Callable[[], None]:
            return lambda: dataflow.remove_instrument(inst)

        def per_hook_on() -> None:
            dataflow.add_instrument(self.profiles[1])
            self.namespace["emit"] = _per_hook_emit()

        def per_hook_off() -> None:
            self.namespace["emit"] = self.emit
            dataflow.remove_instrument(self.profiles[1])

        return [
            ("compiled out", strip, restore, ""),
            ("off", nothing, nothing, "compiled out"),
            ("no-op instrument", attach(self.noop), detach(self.noop), "off"),
            ("profile", attach(self.profiles[0]), detach(self.profiles[0]), "off"),
            ("profile, per-hook emit", per_hook_on, per_hook_off, "off"),
        ]


def one_round(ops: int, chunk: int) -> tuple[dict[str, float], dict[str, float], Round]:
    """Microseconds per op (wall, CPU) for each contender, over one dataflow.run."""
    rnd = Round()
    switches = rnd.switches()
    wall = {name: 0 for name, *_ in switches}
    cpu = {name: 0 for name, *_ in switches}

    async def main() -> None:
        x = 1.0
        op = tiny
        for c in range(ops // chunk):
            k = c % len(switches)
            for name, on, off, _ in switches[k:] + switches[:k]:
                on()
                t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                for _ in range(chunk):
                    op(x)
                c1, t1 = time.thread_time_ns(), time.perf_counter_ns()
                off()
                wall[name] += t1 - t0
                cpu[name] += c1 - c0

    dataflow.run(main, interop_threads=1)
    n = (ops // chunk) * chunk * 1e3
    return {k: v / n for k, v in wall.items()}, {k: v / n for k, v in cpu.items()}, rnd


def run(ops: int, rounds: int, chunk: int) -> dict[str, Any]:
    one_round(min(ops, 10 * chunk), chunk)  # warm up: imports, caches
    walls: list[dict[str, float]] = []
    cpus: list[dict[str, float]] = []
    for _ in range(rounds):
        w, c, rnd = one_round(ops, chunk)
        walls.append(w)
        cpus.append(c)
    names = [(name, ref) for name, _, _, ref in rnd.switches()]

    def overhead(values: list[dict[str, float]], name: str, ref: str) -> float | None:
        return statistics.median(v[name] / v[ref] for v in values) - 1 if ref else None

    rows = [
        {
            "contender": name,
            "us_per_op": statistics.median(w[name] for w in walls),
            "min_us_per_op": min(w[name] for w in walls),
            "cpu_us_per_op": statistics.median(c[name] for c in cpus),
            "vs": ref or None,
            "overhead": overhead(walls, name, ref),
            "cpu_overhead": overhead(cpus, name, ref),
        }
        for name, ref in names
    ]
    return {
        "benchmark": "trace_overhead",
        "ops": ops,
        "chunk": chunk,
        "rounds": rounds,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "rows": rows,
        "export_s": _export_seconds(rnd.profiles[0]),
    }


def _export_seconds(prof: dataflow.Profiler) -> dict[str, float]:
    """One-off: building and writing the trace of a round's recording (not on the hot path)."""
    prof.stop()
    t0 = time.perf_counter()
    tasks = len(prof.trace().tasks)
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.json")
        prof.export_chrome_trace(path)
        size = os.path.getsize(path)
    t2 = time.perf_counter()
    return {"tasks": tasks, "build": t1 - t0, "write": t2 - t1, "mb": size / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100_000, help="ops per contender per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds (at least 5)")
    parser.add_argument("--chunk", type=int, default=2_000, help="ops per turn")
    args = parser.parse_args()
    result = run(args.ops, max(args.rounds, 5), args.chunk)
    print(
        f"{args.ops} tiny inline ops per contender per round, in turns of {args.chunk}; "
        f"{result['rounds']} rounds; medians"
    )
    print("(cpu: the dispatching thread's CPU time, less disturbed by other tenants)")
    head = (
        f"{'contender':<24} {'us/op':>7} {'min':>7} {'cpu us':>7}  {'overhead':>8} {'(cpu)':>8}  vs"
    )
    print(head)
    print("-" * len(head))

    def pct(x: float | None) -> str:
        return "" if x is None else f"{100 * x:+.1f}%"

    for row in result["rows"]:
        print(
            f"{row['contender']:<24} {row['us_per_op']:7.3f} {row['min_us_per_op']:7.3f} "
            f"{row['cpu_us_per_op']:7.3f}  {pct(row['overhead']):>8} "
            f"{pct(row['cpu_overhead']):>8}  {row['vs'] or ''}"
        )
    e = result["export_s"]
    print(
        f"trace of {e['tasks']} tasks: built in {e['build']:.2f} s, written in "
        f"{e['write']:.2f} s ({e['mb']:.1f} MB)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
