"""What the event stream costs per op: tracing off, on, and compiled out.

Run: ``python benchmarks/bench_trace_overhead.py [--ops 100000] [--rounds 7]``

Each round dispatches ``--ops`` tiny inline ops (a ``dataflow.op`` whose cost rule makes it
run on the calling thread: the hot path at its shortest, where instrumentation weighs most)
inside ``dataflow.run``, and reports microseconds per op for every contender:

* **compiled out**: ``Runtime.submit``/``execute`` with every ``if ACTIVE:`` block removed
  (rebuilt from their source with ``ast``): the hot path without instrumentation at all;
* **off**: the library as it is, no instrument attached (the ``if ACTIVE:`` tests only);
* **no-op instrument**: an instrument whose start/finish hooks do nothing: the price of
  the event stream itself (``emit``: a timestamp, a lookup, a call per event);
* **profile**: ``dataflow.profile()`` recording (one tuple appended per event);
* **profile, per-hook emit**: the same, with ``emit`` replaced by a per-hook table of bound
  methods (a proposed change to ``_instrument.emit``, patched in for this row only).

Contenders run round by round in a rotated order; a contender's figure is the median over
rounds, its ratio the median of the per-round ratios to its reference (shared 2-vCPU machines
stall for seconds at a time: a stall hits one round of every contender, not one contender).
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
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


def measure(n: int) -> tuple[float, float]:
    """Microseconds per op (wall, and the thread's CPU time) for ``n`` tiny inline ops."""

    async def main() -> tuple[float, float]:
        x = 1.0
        op = tiny
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(n):
            op(x)
        c1, t1 = time.thread_time_ns(), time.perf_counter_ns()
        return (t1 - t0) / n / 1e3, (c1 - c0) / n / 1e3

    return dataflow.run(main, interop_threads=1)


# -- contenders -------------------------------------------------------------------------------


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


@contextmanager
def compiled_out() -> Iterator[None]:
    saved = {n: getattr(_runtime.Runtime, n) for n in ("submit", "execute")}
    for n in saved:
        setattr(_runtime.Runtime, n, _compiled_out(n))
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(_runtime.Runtime, n, fn)


@contextmanager
def nothing() -> Iterator[None]:
    yield


class NoOp:
    def task_started(self, ts: int, task: Any) -> None:
        pass

    def task_finished(self, ts: int, task: Any) -> None:
        pass


@contextmanager
def instrument(make: Callable[[], Any]) -> Iterator[None]:
    inst = make()
    dataflow.add_instrument(inst)
    try:
        yield
    finally:
        dataflow.remove_instrument(inst)


@contextmanager
def profiling() -> Iterator[None]:
    with dataflow.profile():
        yield


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


@contextmanager
def profiling_per_hook_emit() -> Iterator[None]:
    namespace = vars(_runtime)  # the runtime calls emit() through its module's globals
    with dataflow.profile():
        saved = namespace["emit"]
        namespace["emit"] = _per_hook_emit()
        try:
            yield
        finally:
            namespace["emit"] = saved


CONTENDERS: list[tuple[str, Callable[[], Any], str]] = [
    ("compiled out", compiled_out, ""),
    ("off", nothing, "compiled out"),
    ("no-op instrument", lambda: instrument(NoOp), "off"),
    ("profile", profiling, "off"),
    ("profile, per-hook emit", profiling_per_hook_emit, "off"),
]


# -- the run ------------------------------------------------------------------------------------


def run(ops: int, rounds: int) -> dict[str, Any]:
    wall: dict[str, list[float]] = {name: [] for name, _, _ in CONTENDERS}
    cpu: dict[str, list[float]] = {name: [] for name, _, _ in CONTENDERS}
    measure(min(ops, 10_000))  # warm up: imports, the pool, caches
    for r in range(rounds):
        k = r % len(CONTENDERS)
        for name, setup, _ in CONTENDERS[k:] + CONTENDERS[:k]:
            with setup():
                w, c = measure(ops)
            wall[name].append(w)
            cpu[name].append(c)

    def overhead(values: dict[str, list[float]], name: str, ref: str) -> float | None:
        if not ref:
            return None
        return statistics.median(a / b for a, b in zip(values[name], values[ref], strict=True)) - 1

    rows = []
    for name, _, ref in CONTENDERS:
        rows.append(
            {
                "contender": name,
                "us_per_op": statistics.median(wall[name]),
                "min_us_per_op": min(wall[name]),
                "cpu_us_per_op": statistics.median(cpu[name]),
                "vs": ref or None,
                "overhead": overhead(wall, name, ref),
                "cpu_overhead": overhead(cpu, name, ref),
            }
        )
    export = _export_seconds(ops)
    return {
        "benchmark": "trace_overhead",
        "ops": ops,
        "rounds": rounds,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "rows": rows,
        "export_s": export,
    }


def _export_seconds(ops: int) -> dict[str, float]:
    """One-off: building and writing the trace of ``ops`` tasks (not on the hot path)."""
    import tempfile

    with dataflow.profile() as prof:
        measure(ops)
    t0 = time.perf_counter()
    prof.trace()
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(os.path.join(tmp, "t.json"))
        size = os.path.getsize(os.path.join(tmp, "t.json"))
    t2 = time.perf_counter()
    return {"build": t1 - t0, "write": t2 - t1, "mb": size / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100_000, help="ops per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds (>= 5)")
    args = parser.parse_args()
    result = run(args.ops, max(args.rounds, 5))
    print(f"{args.ops} tiny inline ops per round, {result['rounds']} rounds, median per op")
    print(
        "(cpu: the dispatching thread's CPU time, less disturbed by other tenants of the machine)"
    )
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
        f"trace of {args.ops} tasks: built in {e['build']:.2f} s, written in {e['write']:.2f} s "
        f"({e['mb']:.1f} MB)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
