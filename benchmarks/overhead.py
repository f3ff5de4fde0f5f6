"""Overhead: microseconds per tiny task, end to end, for dataflow and the usual alternatives.

Every contender runs ``n`` no-op tasks (identity on a small int) in two patterns:

* **batched**: submit all ``n``, then wait for all (throughput; hand-offs can be amortised);
* **one at a time**: submit one, wait for it, repeat (the latency of a round trip).

A third table runs a real op on a tiny array, ``x`` of shape (4,) float64: a plain
``np.add`` loop (``y = np.add(y, 1.0)`` ``n`` times), the same chain as ``ops.add`` inside a
runtime (each op reads the previous one's pending output; awaited at the end), and ``n``
independent ``ops.add(x, 1.0)`` awaited one by one. The last table judges dataflow against the
targets of issue 11 on the median and on the best round: a batched no-op op inline <= 2 us,
offloaded <= 5 us, and a chained tiny ``ops.add`` <= 2x the ``np.add`` loop (that row's
values are the per-round ratios; its best is the best round over the loop's best round).
The offloaded op is also judged with 1,000 in flight at a time (dispatched, then awaited, in
waves: a model forward's worth), where the per-task cost is not inflated by the garbage
collector's passes over 100,000 pending tasks.

The value of a round is the elapsed time divided by ``n``, in microseconds. Only submitting
and waiting is timed; event loops, runtimes and executors are started outside the timed part
(the runtime's own start and stop are measured separately, in the third table). Every pool
has as many worker threads as the machine has cores, like dataflow's default inter-op pool.
Slow contenders run fewer tasks (the count is in the "tasks" column); the per-task figure is
what matters.

Every round of every contender runs in a fresh process (``python -m benchmarks.overhead
--child``) that measures once to warm up, then once timed, as the other benchmarks do: a
process that had imported torch, dask and JAX and run the other contenders first held a few
million more objects, and the garbage collector's full passes over them made the batched
rows slower (a batched inline op: 4.7 us a task measured that way, 2.7 us in a fresh
process). ``--quick`` measures in this process.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

import dataflow

from ._harness import Comparison, Config, Contender, Row, interleave, module_main, run_child
from ._machine import cores

__all__ = ["run"]

#: The ops in flight at once in the in-flight row: about a model forward's worth.
IN_FLIGHT = 1000
# The batched no-op offloaded in waves of IN_FLIGHT rather than all at once: what a task costs
# with a model forward's worth in flight. All at once (the "batched" row, as every other
# contender runs), the collector's passes over the pending tasks and the ready queue's depth
# add 3-4 us a task at 100,000 in flight (5.2 us a task at 1,000, 9.5 at 100,000).
OFFLOADED_IN_FLIGHT = f"dataflow op, offloaded, {IN_FLIGHT:,} in flight"

# The dataflow targets this benchmark reports against (us per task).
TARGETS = {
    ("batched", "dataflow op, inline"): 2.0,
    ("batched", "dataflow op, offloaded"): 5.0,
    ("one at a time", "dataflow fork+wait, plain fn"): 15.0,
    ("one at a time", "dataflow fork+wait, async fn"): 15.0,
}


def _identity(x: Any) -> Any:
    return x


async def _aidentity(x: Any) -> Any:
    return x


def _handle(task: dataflow.Task, index: int | None, spec: Any) -> dataflow.Pending[Any]:
    return dataflow.Pending(task, index)


def _meta(x: Any) -> None:
    return None


_TINY = dataflow.Cost(flops=1.0, bytes=8.0)


def _tiny_cost(x: Any) -> dataflow.Cost:
    return _TINY


# The same no-op kernel declared twice: decided by cost (tiny: runs inline at dispatch), and
# forced to the pool.
noop_inline = dataflow.op("noop", meta=_meta, handle=_handle, cost=_tiny_cost)(_identity)
noop_offloaded = dataflow.op(
    "noop_offloaded", meta=_meta, handle=_handle, cost=_tiny_cost, inline=False
)(_identity)


# -- dataflow ------------------------------------------------------------------------------


def _dataflow_timed(body: Callable[[int], Coroutine[Any, Any, None]], n: int) -> float:
    async def main() -> float:
        t0 = time.perf_counter()
        await body(n)
        return time.perf_counter() - t0

    return dataflow.run(main, interop_threads=cores())


async def _op_batched(op: dataflow.Op[..., Any], n: int) -> None:
    handles = [op(i) for i in range(n)]
    for h in handles:
        await h


async def _op_waves(op: dataflow.Op[..., Any], n: int) -> None:
    """``n`` ops in waves of IN_FLIGHT: each wave dispatched, then awaited."""
    for start in range(0, n, IN_FLIGHT):
        handles = [op(i) for i in range(start, min(n, start + IN_FLIGHT))]
        for h in handles:
            await h


async def _op_one(op: dataflow.Op[..., Any], n: int) -> None:
    for i in range(n):
        await op(i)


async def _fork_batched(fn: Callable[[Any], Any], n: int) -> None:
    futs = [dataflow.fork(fn, i) for i in range(n)]
    for f in futs:
        await dataflow.wait(f)


async def _fork_one(fn: Callable[[Any], Any], n: int) -> None:
    for i in range(n):
        await dataflow.wait(dataflow.fork(fn, i))


# -- thread pools and event loops ------------------------------------------------------------


def _tpe_batched(ex: ThreadPoolExecutor, n: int) -> float:
    t0 = time.perf_counter()
    futs = [ex.submit(_identity, i) for i in range(n)]
    for f in futs:
        f.result()
    return time.perf_counter() - t0


def _tpe_one(ex: ThreadPoolExecutor, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        ex.submit(_identity, i).result()
    return time.perf_counter() - t0


def _loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if kind == "uvloop":
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    return asyncio.new_event_loop


def _executor_timed(kind: str, ex: ThreadPoolExecutor, n: int, batched: bool) -> float:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        if batched:
            futs = [loop.run_in_executor(ex, _identity, i) for i in range(n)]
            for f in futs:
                await f
        else:
            for i in range(n):
                await loop.run_in_executor(ex, _identity, i)
        return time.perf_counter() - t0

    with asyncio.Runner(loop_factory=_loop_factory(kind)) as runner:
        return runner.run(main())


def _anyio_timed(n: int, batched: bool) -> float:
    import anyio
    import anyio.to_thread

    async def main() -> float:
        limiter = anyio.CapacityLimiter(cores())
        t0 = time.perf_counter()
        if batched:

            async def one(i: int) -> None:
                await anyio.to_thread.run_sync(_identity, i, limiter=limiter)

            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(one, i)
        else:
            for i in range(n):
                await anyio.to_thread.run_sync(_identity, i, limiter=limiter)
        return time.perf_counter() - t0

    return anyio.run(main, backend="asyncio")


def _dask_timed(n: int, batched: bool) -> float:
    import dask.threaded

    workers = cores()
    if batched:
        graph = {f"t{i}": (_identity, i) for i in range(n)}
        keys = list(graph)
        t0 = time.perf_counter()
        dask.threaded.get(graph, keys, num_workers=workers)
        return time.perf_counter() - t0
    graphs = [{"t": (_identity, i)} for i in range(n)]
    t0 = time.perf_counter()
    for g in graphs:
        dask.threaded.get(g, "t", num_workers=workers)
    return time.perf_counter() - t0


def _torch_timed(n: int, batched: bool) -> float:
    import torch

    from . import _torch_models

    x = torch.ones(1)
    fn = _torch_models.fork_noop_batched if batched else _torch_models.fork_noop_one
    t0 = time.perf_counter()
    fn(x, n)
    return time.perf_counter() - t0


def _missing(module: str) -> str | None:
    import importlib.util

    return None if importlib.util.find_spec(module) is not None else f"{module} not installed"


def _per_task(fn: Callable[[int], float], n: int, cpu: list[float]) -> Callable[[], float]:
    """Wall microseconds per task; the process's CPU microseconds per task go to ``cpu``."""

    def measure() -> float:
        c0 = time.process_time()
        wall = fn(n)
        cpu.append((time.process_time() - c0) / n * 1e6)
        return wall / n * 1e6

    return measure


def _contenders(mode: str, counts: dict[str, int], ex: ThreadPoolExecutor) -> list[Contender]:
    batched = mode == "batched"
    big, mid, small = counts["big"], counts["mid"], counts["small"]
    op_body = _op_batched if batched else _op_one
    fork_body = _fork_batched if batched else _fork_one
    threads = f"{cores()} threads"

    def df(body: Callable[[int], Coroutine[Any, Any, None]]) -> Callable[[int], float]:
        return lambda n: _dataflow_timed(body, n)

    specs: list[tuple[str, Callable[[int], float], int, str, str | None]] = [
        ("dataflow op, inline", df(lambda n: op_body(noop_inline, n)), big, "uvloop, inline", None),
        (
            "dataflow op, offloaded",
            df(lambda n: op_body(noop_offloaded, n)),
            big,
            f"uvloop, {threads}",
            None,
        ),
        (
            "dataflow fork+wait, async fn",
            df(lambda n: fork_body(_aidentity, n)),
            big,
            "uvloop, loop task",
            None,
        ),
        (
            "dataflow fork+wait, plain fn",
            df(lambda n: fork_body(_identity, n)),
            big,
            f"uvloop, {threads}",
            None,
        ),
        (
            "ThreadPoolExecutor",
            lambda n: (_tpe_batched if batched else _tpe_one)(ex, n),
            big,
            threads,
            None,
        ),
        (
            "run_in_executor, asyncio",
            lambda n: _executor_timed("asyncio", ex, n, batched),
            mid,
            f"TPE {threads}",
            None,
        ),
        (
            "run_in_executor, uvloop",
            lambda n: _executor_timed("uvloop", ex, n, batched),
            mid,
            f"TPE {threads}",
            _missing("uvloop"),
        ),
        (
            "anyio.to_thread.run_sync",
            lambda n: _anyio_timed(n, batched),
            mid,
            f"asyncio, limiter {cores()}",
            None,
        ),
        (
            "dask threaded get",
            lambda n: _dask_timed(n, batched),
            small,
            f"num_workers={cores()}",
            _missing("dask"),
        ),
        (
            "torch.jit.fork (scripted)",
            lambda n: _torch_timed(n, batched),
            big,
            "torch inter-op pool",
            _missing("torch"),
        ),
    ]
    if batched:  # beside the all-at-once offloaded row
        waves = df(lambda n: _op_waves(noop_offloaded, n))
        specs.insert(2, (OFFLOADED_IN_FLIGHT, waves, big, f"uvloop, {threads}", None))
    out = []
    for name, fn, n, note, skip in specs:
        target = TARGETS.get((mode, name))
        extra: dict[str, Any] = {"tasks": n}
        if target is not None:
            extra["target_us"] = target
        cpu: list[float] = []
        extra["cpu"] = cpu  # replaced by its median once measured
        out.append(Contender(name, _per_task(fn, n, cpu), note=note, skip=skip, extra=extra))
    return out


# -- a tiny real op: np.add against ops.add ---------------------------------------------------


def _np_add_loop(n: int) -> float:
    y = np.ones(4)
    t0 = time.perf_counter()
    for _ in range(n):
        y = np.add(y, 1.0)
    elapsed = time.perf_counter() - t0
    assert y[0] == n + 1
    return elapsed


async def _ops_chained(n: int) -> None:
    import ops

    y: Any = np.ones(4)
    for _ in range(n):
        y = ops.add(y, 1.0)
    out = await y
    assert out[0] == n + 1


async def _ops_independent(n: int) -> None:
    import ops

    x = np.ones(4)
    handles = [ops.add(x, 1.0) for _ in range(n)]
    for h in handles:
        await h


# A compiled plan's nodes: a chain of PLAN_NODES ops.add, compiled without the graph passes
# (fusion would make it one op), launched n / PLAN_NODES times.
PLAN_NODES = 1000


async def _plan_chain(x: Any) -> Any:
    import ops

    y = x
    for _ in range(PLAN_NODES):
        y = ops.add(y, 1.0)
    return y


def _compiled_chained(n: int) -> float:
    forward = dataflow.compile(_plan_chain, optimize=False, check=False)
    launches = max(1, n // PLAN_NODES)

    async def main() -> float:
        x = np.ones(4)
        await forward(x)  # traced and warmed up outside the timed part
        await forward(x)
        t0 = time.perf_counter()
        for _ in range(launches):
            out = await forward(x)
        elapsed = time.perf_counter() - t0
        assert out[0] == PLAN_NODES + 1
        return elapsed * n / (launches * PLAN_NODES)  # (per node, scaled to n)

    return dataflow.run(main, interop_threads=cores())


def _tiny_op_contenders(n: int) -> list[Contender]:
    threads = f"uvloop, {cores()} threads"
    specs: list[tuple[str, Callable[[int], float], str]] = [
        ("np.add loop", _np_add_loop, "plain numpy"),
        ("ops.add, chained", lambda k: _dataflow_timed(_ops_chained, k), threads),
        ("ops.add, independent", lambda k: _dataflow_timed(_ops_independent, k), threads),
        ("compiled plan, chained", _compiled_chained, f"{threads}, {PLAN_NODES} nodes a launch"),
    ]
    out = []
    for name, fn, note in specs:
        cpu: list[float] = []
        out.append(
            Contender(name, _per_task(fn, n, cpu), note=note, extra={"tasks": n, "cpu": cpu})
        )
    return out


def _target_row(name: str, target: str, values: list[float], best: float, limit: float) -> Row:
    row = Row(name, target, values)
    median = row.median
    row.extra.update(
        {
            "best": best,
            "median meets": None if median is None else median <= limit,
            "best meets": best <= limit,
        }
    )
    return row


def targets(batched: Comparison, tiny: Comparison) -> Comparison:
    """Issue 11's overhead targets, judged on the median and on the best round."""
    rows = []
    for name, limit in (("dataflow op, inline", 2.0), ("dataflow op, offloaded", 5.0)):
        r = batched.row(name)
        if r.values:
            rows.append(
                _target_row(f"{name} (batched)", f"<= {limit:g} us", r.values, min(r.values), limit)
            )
    r = batched.row(OFFLOADED_IN_FLIGHT)
    if r.values:
        rows.append(_target_row(OFFLOADED_IN_FLIGHT, "<= 5 us", r.values, min(r.values), 5.0))
    base, chained = tiny.row("np.add loop"), tiny.row("ops.add, chained")
    if base.values and chained.values:
        ratios = [c / b for c, b in zip(chained.values, base.values, strict=True)]
        best = min(chained.values) / min(base.values)
        rows.append(_target_row("ops.add chained / np.add loop", "<= 2x", ratios, best, 2.0))
    plan = tiny.row("compiled plan, chained")
    if base.values and plan.values:
        # Issue 12: a plan node costs <= 1 us of scheduling beyond its kernel (the loop's add).
        extra = [p - b for p, b in zip(plan.values, base.values, strict=True)]
        best = min(plan.values) - min(base.values)
        rows.append(_target_row("plan node - np.add (us)", "<= 1 us", extra, best, 1.0))
    return Comparison(
        "overhead",
        "overhead targets (issue 11): median and best round against each target",
        "us or x",
        "",
        rows,
        columns=("best", "median meets", "best meets"),
        notes=[
            "us rows: microseconds per task from the batched table; the ratio row: per-round "
            "ratios of chained ops.add to the np.add loop, its best = best round / best round"
        ],
    )


def _lifetime_contenders() -> list[Contender]:
    async def empty() -> None:
        return None

    def timed(fn: Callable[[], None], reps: int) -> Callable[[], float]:
        def measure() -> float:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            return (time.perf_counter() - t0) / reps * 1e6

        return measure

    n = cores()
    return [
        Contender("asyncio.run", timed(lambda: asyncio.run(empty()), 50), note="asyncio"),
        Contender(
            "dataflow.run",
            timed(lambda: dataflow.run(empty, interop_threads=n), 50),
            note=f"uvloop, {n} threads",
        ),
        Contender(
            "dataflow.run, asyncio",
            timed(lambda: dataflow.run(empty, interop_threads=n, loop="asyncio"), 50),
            note=f"asyncio, {n} threads",
        ),
    ]


# -- every round in a fresh process ------------------------------------------------------------


def _group(
    group: str, mode: str, counts: dict[str, dict[str, int]], n_tiny: int, ex: ThreadPoolExecutor
) -> list[Contender]:
    """The in-process contenders of one table: ``group`` is "tasks" (with ``mode``), "tiny"
    or "lifetime"."""
    if group == "tasks":
        return _contenders(mode, counts[mode], ex)
    if group == "tiny":
        return _tiny_op_contenders(n_tiny)
    return _lifetime_contenders()


class ChildError(RuntimeError):
    """A contender's child process failed."""


def _fresh(c: Contender, spec: dict[str, Any]) -> Contender:
    """``c`` measured in a fresh ``python -m benchmarks.overhead --child`` each round; the
    child's CPU figure goes to ``c``'s ``cpu`` list, as the in-process one would."""
    args = json.dumps({**spec, "name": c.name})

    def measure() -> float:
        got = run_child("benchmarks.overhead", args, ChildError, f"overhead: contender {c.name!r}")
        cpu = c.extra.get("cpu")
        if isinstance(cpu, list) and got["cpu"] is not None:
            cpu.append(got["cpu"])
        value: float = got["value"]
        return value

    return Contender(c.name, measure, note=c.note, skip=c.skip, extra=c.extra)


def child_main(spec: str) -> None:
    """One contender, one round, in this fresh process: a warm-up measure, the timed one."""
    d = json.loads(spec)
    if d["name"] == "torch.jit.fork (scripted)":
        from . import _torch_models

        _torch_models.warm_fork_noop()
    with ThreadPoolExecutor(max_workers=cores()) as ex:
        found = [
            c
            for c in _group(d["group"], d["mode"], d["counts"], d["n_tiny"], ex)
            if c.name == d["name"]
        ]
        if not found:
            raise SystemExit(f"overhead: no contender {d['name']!r} in {d['group']!r}")
        c = found[0]
        c.measure()  # warm-up
        value = c.measure()
    cpu = c.extra.get("cpu")
    print(json.dumps({"value": value, "cpu": cpu[-1] if cpu else None}), flush=True)


def run(cfg: Config, log: Callable[[str], None]) -> list[Comparison]:
    """Measure the per-task overhead tables (every round a fresh process; quick: here)."""
    if cfg.quick:
        counts = {
            "batched": {"big": 2000, "mid": 1000, "small": 200},
            "one at a time": {"big": 500, "mid": 300, "small": 50},
        }
    else:
        counts = {
            "batched": {"big": 100_000, "mid": 20_000, "small": 5_000},
            "one at a time": {"big": 20_000, "mid": 10_000, "small": 1_000},
        }
    n_tiny = 2000 if cfg.quick else 100_000
    fresh = not cfg.quick
    warmup = 0 if fresh else 1  # a child warms up itself

    def contenders(group: str, mode: str, ex: ThreadPoolExecutor) -> list[Contender]:
        here = _group(group, mode, counts, n_tiny, ex)
        if not fresh:
            return here
        spec = {"group": group, "mode": mode, "counts": counts, "n_tiny": n_tiny}
        return [_fresh(c, spec) for c in here]

    if not fresh and _missing("torch") is None:
        from . import _torch_models

        _torch_models.warm_fork_noop()
    comparisons = []
    with ThreadPoolExecutor(max_workers=cores()) as ex:
        for mode in ("batched", "one at a time"):
            log(f"overhead: {mode}")
            rows = interleave(
                contenders("tasks", mode, ex),
                cfg.rounds,
                baseline="ThreadPoolExecutor",
                warmup=warmup,
                log=log,
            )
            cmp = Comparison(
                "overhead",
                f"overhead, {mode}: microseconds per no-op task",
                "us",
                "ThreadPoolExecutor",
                rows,
                params={"mode": mode, "counts": counts[mode]},
                columns=("cpu_us", "tasks", "target_us", "meets_target"),
            )
            for row in rows:
                cpu = row.extra.pop("cpu", [])
                if cpu:
                    row.extra["cpu_us"] = statistics.median(cpu)
                target = row.extra.get("target_us")
                if target is not None and row.median is not None:
                    row.extra["meets_target"] = row.median <= target
            cmp.notes.append(
                "value = elapsed / tasks; only submitting and waiting is timed; ratio = median "
                "of per-round ratios to ThreadPoolExecutor (lower is better); cpu_us = the "
                "process's CPU time (all threads) per task, which other processes' load does "
                "not inflate; "
                + ("each round a fresh process" if fresh else "measured in this process")
            )
            comparisons.append(cmp)
        log("overhead: a tiny real op (np.add vs ops.add)")
        rows = interleave(
            contenders("tiny", "", ex), cfg.rounds, baseline="np.add loop", warmup=warmup, log=log
        )
    for row in rows:
        cpu = row.extra.pop("cpu", [])
        if cpu:
            row.extra["cpu_us"] = statistics.median(cpu)
    tiny = Comparison(
        "overhead",
        "tiny op: microseconds per add on a (4,) float64 array",
        "us",
        "np.add loop",
        rows,
        params={"tasks": n_tiny},
        columns=("cpu_us", "tasks"),
        notes=[
            "chained: each ops.add reads the previous one's output, the last one awaited; "
            "independent: n ops.add(x, 1.0) issued, then awaited one by one; the runtime's "
            "start is not timed"
        ],
    )
    comparisons.append(tiny)
    comparisons.append(targets(comparisons[0], tiny))
    log("overhead: runtime lifetime")
    with ThreadPoolExecutor(max_workers=cores()) as ex:
        rows = interleave(
            contenders("lifetime", "", ex),
            cfg.rounds,
            baseline="asyncio.run",
            warmup=warmup,
            log=log,
        )
    comparisons.append(
        Comparison(
            "overhead",
            "runtime lifetime: microseconds to start and close an empty run",
            "us",
            "asyncio.run",
            rows,
            notes=["the fixed cost every dataflow.run pays (loop + pool threads start and join)"],
        )
    )
    return comparisons


def main(argv: list[str] | None = None) -> None:
    module_main("overhead", __doc__.splitlines()[0], child_main, argv)


if __name__ == "__main__":
    main()
