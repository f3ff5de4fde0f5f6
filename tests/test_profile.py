"""The profiler: recorded events, the Chrome trace it writes, the summary and the op table."""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import os
import threading
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow import Pending, Task
from dataflow._instrument import PROCESS
from dataflow._summary import critical_path, op_stats, summarize
from dataflow._trace import TaskSpan, Trace
from dataflow._traceread import from_chrome, load

EPS_US = 0.002  # ts and dur are written with ns precision (3 decimals of a microsecond)


# -- a Chrome Trace Event format checker ------------------------------------------------------


def check_chrome_trace(data: Any) -> None:
    """Assert the rules of the Chrome Trace Event format (JSON object form) that we rely on."""
    assert isinstance(data, dict)
    assert data["displayTimeUnit"] in ("ms", "ns")
    # Perfetto's reader stops at a top-level key it does not know, and wants the time unit
    # before the events.
    assert set(data) <= {"traceEvents", "displayTimeUnit", "otherData"}
    keys = list(data)
    assert keys.index("displayTimeUnit") < keys.index("traceEvents")
    events = data["traceEvents"]
    assert isinstance(events, list) and events
    slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    flows: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    asyncs: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for ev in events:
        ph = ev["ph"]
        assert isinstance(ev["name"], str) and ev["name"]
        assert isinstance(ev["pid"], int)
        assert isinstance(ev["tid"], int)
        if ph == "M":
            assert isinstance(ev["args"], dict)
            if ev["name"] in ("process_name", "thread_name"):
                assert isinstance(ev["args"]["name"], str) and ev["args"]["name"]
            continue
        assert isinstance(ev["ts"], int | float) and ev["ts"] >= 0, ev
        if ph == "X":
            assert isinstance(ev["dur"], int | float) and ev["dur"] >= 0, ev
            assert isinstance(ev.get("args", {}), dict)
            slices.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], ev["ts"] + ev["dur"]))
        elif ph in ("s", "f"):
            assert isinstance(ev["cat"], str) and "id" in ev
            if ph == "f":
                assert ev["bp"] == "e"
            flows.setdefault((ev["cat"], ev["id"]), []).append(ev)
        elif ph in ("b", "e"):
            assert isinstance(ev["cat"], str) and "id" in ev
            asyncs.setdefault((ev["cat"], ev["id"]), []).append(ev)
        elif ph == "C":
            assert ev["args"] and all(
                isinstance(v, int | float) and v >= 0 for v in ev["args"].values()
            ), ev
        else:
            raise AssertionError(f"unexpected phase {ph!r}: {ev}")
    # X slices on one thread nest properly: never a partial overlap.
    for track, spans in slices.items():
        stack: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start + EPS_US:
                stack.pop()
            assert not stack or end <= stack[-1] + EPS_US, f"partial overlap on {track}"
            stack.append(end)
    # Every flow has one start and one end, in time order, each inside a slice of its thread.
    for key, pair in flows.items():
        assert sorted(e["ph"] for e in pair) == ["f", "s"], key
        s = next(e for e in pair if e["ph"] == "s")
        f = next(e for e in pair if e["ph"] == "f")
        assert s["name"] == f["name"]
        assert s["ts"] <= f["ts"] + EPS_US, key
        for e in (s, f):
            spans = slices[(e["pid"], e["tid"])]
            assert any(a - EPS_US <= e["ts"] <= b + EPS_US for a, b in spans), e
    # Every async slice begins and ends.
    for key, pair in asyncs.items():
        assert sorted(e["ph"] for e in pair) == ["b", "e"], key
        b = next(e for e in pair if e["ph"] == "b")
        e = next(e for e in pair if e["ph"] == "e")
        assert b["name"] == e["name"] and b["ts"] <= e["ts"] + EPS_US


def x_events(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in data["traceEvents"] if e["ph"] == "X"]


def thread_names(data: dict[str, Any]) -> dict[int, str]:
    return {
        e["tid"]: e["args"]["name"]
        for e in data["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


# -- workloads ---------------------------------------------------------------------------------


class Box(Pending[Any]):
    """A bare handle for the ops defined here."""

    __slots__ = ()


def _box(task: Task, index: int | None, spec: Any) -> Box:
    return Box(task, index)


@dataflow.op(
    "boom", meta=lambda x: ops.TensorSpec(x.shape, x.dtype), handle=ops.Tensor, inline=False
)
def boom(x: Any) -> Any:
    raise ValueError("boom")


def _same_spec(x: Any, *_: Any) -> Any:
    spec = ops.spec_of(x)
    return ops.TensorSpec(spec.shape, spec.dtype)


def _hold_kernel(x: Any, started: threading.Event, gate: threading.Event) -> Any:
    started.set()
    gate.wait(10)
    return x


# ``hold`` keeps the one pool thread busy until the test opens the gate; ``bump`` runs on the
# pool (never inline at dispatch), so it queues behind ``hold``.
hold = dataflow.op("hold", meta=_same_spec, handle=ops.Tensor, inline=False)(_hold_kernel)
bump = dataflow.op("bump", meta=_same_spec, handle=ops.Tensor, inline=False)(np.negative)


def _weights(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    w = rng.standard_normal((n, n), dtype=np.float32) / np.float32(np.sqrt(n))
    return a, w


async def _chain(x: Any, w: np.ndarray, n: int) -> Any:
    for _ in range(n):
        x = ops.tanh(ops.matmul(x, w))
    return x  # still pending: the join below depends on it


async def two_chains(n: int = 384, steps: int = 4) -> Any:
    """Two independent matmul chains, forked, then joined by an add."""
    a, w = _weights(n)
    # Model code: awaiting the forks gives their pending outputs, so the add depends on both.
    with dataflow.model_code():
        f1 = dataflow.fork(_chain, a, w, steps)
        f2 = dataflow.fork(_chain, a * 2, w, steps)
        joined = ops.add(await f1, await f2)
    return await joined


def profile_two_chains(**kw: Any) -> dataflow.Profiler:
    with dataflow.profile() as prof:
        dataflow.run(two_chains, interop_threads=2, intraop_threads=1, **kw)
    return prof


@pytest.fixture(scope="module")
def two_chains_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    prof = profile_two_chains()
    path = tmp_path_factory.mktemp("trace") / "parallel.json"
    prof.export_chrome_trace(path)
    return prof, path


# -- tests -------------------------------------------------------------------------------------


class TestRecording:
    def test_every_kernel_starts_and_finishes(self, loop: str) -> None:
        """Each task run is recorded as a start (with thread and op) and a finish."""
        prof = profile_two_chains(loop=loop)
        kinds = Counter(e.kind for e in prof.events)
        assert kinds["task_started"] == kinds["task_finished"] == 17
        started = [e for e in prof.events if e.kind == "task_started"]
        assert {e.op for e in started} == {"matmul", "tanh", "add"}
        assert all(e.thread for e in started)

    def test_fork_and_wait_spans(self) -> None:
        """Forked coroutines and waits are recorded as spans on the loop thread."""
        trace = profile_two_chains().trace()
        forks = [s for s in trace.spans if s.kind == "fork"]
        assert len(forks) == 2
        assert all(trace.threads[s.thread] == "loop" for s in trace.spans)
        assert all(s.end >= s.start for s in trace.spans)

    @pytest.mark.asyncio
    async def test_async_with(self) -> None:
        """`async with dataflow.profile()` records inside a running application."""
        a, w = _weights(64)
        async with dataflow.Runtime(interop_threads=2), dataflow.profile() as prof:
            await (await _chain(a, w, 2))
        assert len(prof.trace().tasks) == 4
        assert prof not in PROCESS.recorders

    @pytest.mark.asyncio
    @pytest.mark.parametrize("kind", ["waiting", "queued"])
    async def test_tasks_cancelled_unrun_are_counted(self, kind: str) -> None:
        """Tasks dropped unrun when the runtime closes, whether waiting for an input or queued
        ready behind a running kernel, are each counted as never ran."""
        started, gate = threading.Event(), threading.Event()
        runtimes: list[dataflow.Runtime] = []

        async def body() -> None:
            async with dataflow.Runtime(interop_threads=1) as rt:
                runtimes.append(rt)
                a = hold(np.ones(2), started, gate)
                if kind == "waiting":
                    _ = [bump(a) for _ in range(5)]
                else:
                    _ = [bump(np.ones(2)) for _ in range(5)]
                await asyncio.sleep(30)

        with dataflow.profile() as prof:
            task = asyncio.create_task(body())
            while not started.is_set():
                await asyncio.sleep(0.001)
            task.cancel()
            # Open the gate once the runtime is cancelling, so what waits behind is dropped.
            while not runtimes[0]._sched.cancelling:
                await asyncio.sleep(0.001)
            gate.set()
            with pytest.raises(asyncio.CancelledError):
                await task
        summary = prof.summary()
        assert (summary.tasks, summary.unrun) == (1, 5)
        assert (prof.unrun_cancelled, prof.unrun_failed) == (5, 0)
        assert "5 never ran" in str(summary)

    def test_every_runtime_while_open(self) -> None:
        """Two runs in one profile: both recorded; same-named pool threads share a row."""
        with dataflow.profile() as prof:
            dataflow.run(two_chains, 32, 1, interop_threads=2)
            dataflow.run(two_chains, 32, 1, interop_threads=2)
        trace = prof.trace()
        assert len(trace.tasks) == 10
        assert set(prof.summary().busy_s) <= {"loop", "interop-0", "interop-1"}

    def test_records_once(self) -> None:
        """A profiler cannot be restarted; the error says what to do."""
        prof = dataflow.profile()
        with prof:
            pass
        with pytest.raises(dataflow.DataflowError, match=r"dataflow.profile\(\)"):
            prof.start()

    def test_runtime_argument_is_checked_at_the_call(self) -> None:
        """profile(3) raises a DataflowTypeError naming the argument, not an AttributeError
        at the `with`."""
        with pytest.raises(dataflow.DataflowTypeError, match=r"profile\(runtime=\).*got int: 3"):
            dataflow.profile(3)  # type: ignore[arg-type]
        with pytest.raises(dataflow.DataflowTypeError, match=r"got str: 'x'"):
            dataflow.Profiler("x")  # type: ignore[arg-type]

    @pytest.mark.asyncio
    async def test_one_runtime(self) -> None:
        """profile(rt) records that runtime's tasks."""
        async with dataflow.Runtime(interop_threads=1) as rt:
            with dataflow.profile(rt) as prof:
                await ops.add(np.ones(2), 1.0)
        assert len(prof.trace().tasks) == 1

    def test_repr(self) -> None:
        """The repr tells the state and the number of tasks recorded."""
        prof = dataflow.profile()
        assert repr(prof) == "<Profiler new tasks=0>"
        with prof:
            assert repr(prof).startswith("<Profiler recording")
        assert repr(prof).startswith("<Profiler stopped")

    def test_values_not_kept_alive(self) -> None:
        """Recording keeps no task, so intermediate arrays are freed as usual."""
        refs: list[weakref.ref[np.ndarray]] = []

        @dataflow.op(
            "keep", meta=lambda x: ops.TensorSpec(x.shape, x.dtype), handle=ops.Tensor, inline=False
        )
        def keep(x: np.ndarray) -> np.ndarray:
            out = x + 1
            refs.append(weakref.ref(out))
            return out

        async def main() -> float:
            y = keep(np.zeros(1000))
            return float((await ops.sum(keep(y))).item())

        with dataflow.profile() as prof:
            assert dataflow.run(main) == 2000.0
        gc.collect()
        assert len(refs) == 2 and all(r() is None for r in refs)
        assert len(prof.trace().tasks) == 3


class TestChromeTrace:
    def test_follows_the_format(self, two_chains_trace: tuple[Any, Path]) -> None:
        """The exported JSON obeys the format's rules (fields, nesting, flows, async pairs)."""
        data = json.loads(two_chains_trace[1].read_text())
        check_chrome_trace(data)
        assert {e["pid"] for e in data["traceEvents"] if e["ph"] != "M"} == {os.getpid()}

    def test_kernels_overlap_on_two_threads(self, two_chains_trace: tuple[Any, Path]) -> None:
        """With two inter-op threads, kernels of the two chains run at the same time."""
        xs = x_events(json.loads(two_chains_trace[1].read_text()))
        overlapping = [
            (a, b)
            for a in xs
            for b in xs
            if a["tid"] != b["tid"] and a["ts"] < b["ts"] < a["ts"] + a["dur"]
        ]
        assert overlapping

    def test_slice_args(self, two_chains_trace: tuple[Any, Path]) -> None:
        """Each slice carries op, task id, shape, dtype, flops, bytes and inputs."""
        xs = x_events(json.loads(two_chains_trace[1].read_text()))
        mm = next(e for e in xs if e["name"] == "matmul" and e["args"]["inputs"])
        args = mm["args"]
        assert args["op"] == "matmul" and args["task"] == f"matmul#{args['id']}"
        assert args["shape"] == [384, 384] and args["dtype"] == "float32"
        assert args["flops"] == 2 * 384**3 and args["bytes"] > 0
        assert all("#" in i for i in args["inputs"])

    def test_thread_names(self, two_chains_trace: tuple[Any, Path]) -> None:
        """Workers are named interop-N, the event loop's thread loop, the process dataflow."""
        data = json.loads(two_chains_trace[1].read_text())
        names = thread_names(data)
        assert {"interop-0", "interop-1", "loop"} <= set(names.values())
        assert {names[e["tid"]] for e in x_events(data)} <= {"interop-0", "interop-1", "loop"}
        proc = [e for e in data["traceEvents"] if e["name"] == "process_name"]
        assert proc[0]["args"]["name"] == "dataflow"

    def test_a_flow_per_dependency(self, two_chains_trace: tuple[Any, Path]) -> None:
        """Each input -> task edge is a flow from the input's slice to the task's slice."""
        data = json.loads(two_chains_trace[1].read_text())
        xs = {e["args"]["task"]: e for e in x_events(data)}
        edges = [(i, t) for t, e in xs.items() for i in e["args"]["inputs"] if i in xs]
        starts = [e for e in data["traceEvents"] if e["ph"] == "s"]
        assert len(starts) == len(edges) == 16
        ends = {e["id"]: e for e in data["traceEvents"] if e["ph"] == "f"}
        for s in starts:
            f = ends[s["id"]]
            assert s["tid"] in {xs[i]["tid"] for i, _ in edges}
            assert f["ts"] >= s["ts"]

    def test_counters(self, two_chains_trace: tuple[Any, Path]) -> None:
        """Counter tracks count tasks running (at least 2 at once here) and ready."""
        data = json.loads(two_chains_trace[1].read_text())
        counters = [e for e in data["traceEvents"] if e["ph"] == "C"]
        running = [e["args"]["tasks"] for e in counters if e["name"] == "running"]
        ready = [e["args"]["tasks"] for e in counters if e["name"] == "ready"]
        assert max(running) >= 2 and running[-1] == 0
        assert ready and ready[-1] == 0

    def test_load_gives_the_same_summary(self, two_chains_trace: tuple[Any, Path]) -> None:
        """A saved trace, loaded back, summarizes like the live profile (to the ns rounding)."""
        prof, path = two_chains_trace
        live, loaded = prof.summary(), summarize(load(path))
        assert loaded.tasks == live.tasks and loaded.critical_path == live.critical_path
        for field in ("wall_s", "profiled_s", "critical_path_s", "total_busy_s", "ready_wait_s"):
            assert getattr(loaded, field) == pytest.approx(getattr(live, field), abs=1e-6)
        assert loaded.busy_s.keys() == live.busy_s.keys()

    def test_inline_op_nests_in_forked_function(self, tmp_path: Path) -> None:
        """An op run inline inside a forked function is a slice nested in the function's."""

        def outer(x: np.ndarray) -> Any:
            return ops.negative(x)  # tiny: runs inline, on this worker, inside outer's slice

        async def main() -> Any:
            return await dataflow.fork(outer, np.ones(4))

        with dataflow.profile() as prof:
            dataflow.run(main, interop_threads=1)
        prof.export_chrome_trace(tmp_path / "t.json")
        data = json.loads((tmp_path / "t.json").read_text())
        check_chrome_trace(data)
        xs = {e["name"].rpartition(".")[2]: e for e in x_events(data)}  # outer: a qualname
        assert xs["negative"]["tid"] == xs["outer"]["tid"]
        assert xs["outer"]["ts"] <= xs["negative"]["ts"]
        trace = prof.trace()
        by_op = {t.op.rpartition(".")[2]: t for t in trace.tasks}
        busy = prof.summary().busy_s[trace.threads[by_op["outer"].thread]]
        assert busy == pytest.approx(by_op["outer"].duration / 1e9)

    def test_failed_task(self, tmp_path: Path) -> None:
        """A kernel that raises is a slice with status failed; its dependents never ran."""

        async def main() -> Any:
            return await ops.negative(boom(np.ones(3)))

        with dataflow.profile() as prof, pytest.raises(dataflow.TaskError, match="boom"):
            dataflow.run(main)
        prof.export_chrome_trace(tmp_path / "t.json")
        data = json.loads((tmp_path / "t.json").read_text())
        check_chrome_trace(data)
        (x,) = x_events(data)
        assert x["name"] == "boom" and x["args"]["status"] == "failed"
        summary = prof.summary()
        assert summary.failed == 1 and summary.unrun == 1

    def test_an_infinite_cost_is_valid_json(self, tmp_path: Path) -> None:
        """A cost rule may say ``Cost(flops=inf)``; the file said ``Infinity``, which is not
        JSON (Perfetto and strict parsers refuse the whole file). It says ``"inf"`` now."""
        costly = dataflow.op(
            "costly", meta=ops.spec_of, handle=ops.Tensor, cost=lambda x: dataflow.Cost(np.inf, 8)
        )(np.negative)

        async def main() -> Any:
            return await costly(np.ones(3))

        with dataflow.profile() as prof:
            dataflow.run(main)
        prof.export_chrome_trace(tmp_path / "t.json")

        def refuse(name: str) -> Any:
            raise ValueError(f"not JSON: {name}")

        data = json.loads((tmp_path / "t.json").read_text(), parse_constant=refuse)
        check_chrome_trace(data)
        (x,) = x_events(data)
        assert x["args"]["flops"] == "inf" and x["args"]["bytes"] == 8
        assert load(tmp_path / "t.json").tasks[0].args["flops"] == "inf"

    def test_foreign_trace_loads(self) -> None:
        """A Chrome trace not written by dataflow loads: slices become tasks, times rebased."""
        data = [
            {"name": "a", "ph": "X", "pid": 1, "tid": 7, "ts": 1000.0, "dur": 10.0},
            {"name": "b", "ph": "X", "pid": 1, "tid": 8, "ts": 1005.0, "dur": 10.0},
        ]
        trace = from_chrome(data)
        assert [(t.op, t.start, t.end) for t in trace.tasks] == [
            ("a", 0, 10_000),
            ("b", 5_000, 15_000),
        ]
        assert summarize(trace).parallelism == pytest.approx(20 / 15)

    def test_not_a_trace(self) -> None:
        """Loading JSON that is not a trace explains what was expected."""
        with pytest.raises(ValueError, match="no traceEvents list"):
            from_chrome({"hello": 1})


def _span(name: str, thread: int, start: int, end: int, *inputs: str, ready: int = -1) -> TaskSpan:
    op = name.split("#")[0]
    return TaskSpan(name, op, thread, start, end, start if ready < 0 else ready, inputs)


class TestSummary:
    def test_consistent_with_events(self, two_chains_trace: tuple[Any, Path]) -> None:
        """busy <= wall x threads, critical path <= wall, parallelism = busy / wall."""
        prof, _ = two_chains_trace
        s = prof.summary()
        trace = prof.trace()
        assert s.tasks == len(trace.tasks) == 17
        assert 0 < s.total_busy_s <= s.wall_s * s.threads
        assert all(b <= s.wall_s for b in s.busy_s.values())
        assert 0 < s.critical_path_s <= s.wall_s <= s.profiled_s
        assert s.parallelism == pytest.approx(s.total_busy_s / s.wall_s)
        pool = [b for name, b in s.busy_s.items() if not name.startswith("loop")]
        loop = max([b for name, b in s.busy_s.items() if name.startswith("loop")] + [0.0])
        spread = sum(pool) / s.pool_threads
        assert s.lower_bound_s == pytest.approx(max(s.critical_path_s, spread, loop))
        assert s.lower_bound_s <= s.wall_s
        assert 0 <= s.dispatch_s <= s.ready_wait_s
        assert 0 <= s.overhead_share < 1

    def test_critical_path_is_a_chain(self, two_chains_trace: tuple[Any, Path]) -> None:
        """The critical path follows dependencies and its length is its kernels' total."""
        prof, _ = two_chains_trace
        s = prof.summary()
        by_name = {t.name: t for t in prof.trace().tasks}
        path = [by_name[n] for n in s.critical_path]
        assert path[-1].op == "add" and len(path) == 9
        for prev, nxt in itertools.pairwise(path):
            assert prev.name in nxt.inputs
        assert s.critical_path_s == pytest.approx(sum(t.duration for t in path) / 1e9)

    def test_pure_figures(self) -> None:
        """Hand-built trace: busy, critical path, queue wait and dispatch as defined."""
        tasks = [
            _span("a#1", 1, 0, 10),
            _span("b#2", 2, 2, 5),
            _span("c#3", 1, 12, 20, "a#1", "b#2", ready=10),
            _span("d#4", 2, 30, 31, "b#2", ready=6),
        ]
        trace = Trace(tasks=tasks, threads={1: "interop-0", 2: "interop-1"}, wall=40)
        s = summarize(trace)
        assert s.busy_s == {"interop-0": 18e-9, "interop-1": 4e-9}
        assert s.critical_path == ("a#1", "c#3") and s.critical_path_s == 18e-9
        assert s.ready_wait_s == pytest.approx(26e-9)  # c waited 2, d waited 24
        assert s.dispatch_s == pytest.approx(26e-9)  # both threads were free meanwhile
        assert s.wall_s == pytest.approx(31e-9) and s.profiled_s == pytest.approx(40e-9)
        assert s.parallelism == pytest.approx(22 / 31)

    def test_nested_kernels_counted_once(self) -> None:
        """An inline op inside a forked function's run does not count twice as busy time."""
        tasks = [_span("f#1", 1, 0, 10), _span("g#2", 1, 2, 4)]
        s = summarize(Trace(tasks=tasks, threads={1: "interop-0"}, wall=10))
        assert s.busy_s == {"interop-0": 10e-9}

    def test_critical_path_empty(self) -> None:
        """No tasks, no path."""
        assert critical_path([]) == (0, [])
        s = summarize(Trace(tasks=[], threads={}, wall=0))
        assert s.parallelism == 0 and s.critical_path == ()

    def test_lower_bound_counts_pool_threads_only(self) -> None:
        """Two pool threads busy 99% of the wall: the bound is the wall (not 2/3 of it)."""
        tasks = [
            _span("a#1", 1, 0, 99),
            _span("b#2", 2, 1, 100),
            _span("c#3", 3, 0, 1),  # a small op run inline on the loop
        ]
        trace = Trace(tasks=tasks, threads={1: "interop-0", 2: "interop-1", 3: "loop"}, wall=100)
        s = summarize(trace)
        assert (s.threads, s.pool_threads) == (3, 2)
        assert s.lower_bound_s == pytest.approx(99e-9)
        assert "wall is 1.01x that" in str(s)
        assert "on 2 pool threads and the loop" in str(s)

    def test_loop_work_bounds_the_run(self) -> None:
        """Kernels run inline on the loop run one after the other: their sum bounds the run."""
        tasks = [_span("a#1", 3, 0, 50), _span("b#2", 3, 50, 100), _span("c#3", 1, 0, 10)]
        trace = Trace(tasks=tasks, threads={1: "interop-0", 3: "loop"}, wall=100)
        assert summarize(trace).lower_bound_s == pytest.approx(100e-9)

    def test_threads_of_successive_runs_share_a_lane(self) -> None:
        """interop-0 of run 1 and of run 2 (new threads, never at once): one lane."""
        tasks = [_span("a#1", 11, 0, 10), _span("b#2", 12, 0, 10), _span("c#3", 21, 20, 30)]
        threads = {11: "interop-0", 12: "interop-1", 21: "interop-0"}
        s = summarize(Trace(tasks=tasks, threads=threads, wall=30))
        assert s.busy_s == {"interop-0": 20e-9, "interop-1": 10e-9}
        assert (s.threads, s.pool_threads) == (2, 2)

    def test_same_named_threads_at_once_get_two_lanes(self) -> None:
        """Two pools at once, both with an interop-0: two lanes, busy counted for each."""
        tasks = [_span("a#1", 11, 0, 10), _span("b#2", 21, 5, 15)]
        s = summarize(Trace(tasks=tasks, threads={11: "interop-0", 21: "interop-0"}, wall=15))
        assert s.busy_s == {"interop-0": 10e-9, "interop-0 (2)": 10e-9}
        assert s.lower_bound_s == pytest.approx(10e-9)

    def test_str_is_readable(self, two_chains_trace: tuple[Any, Path]) -> None:
        """str(summary) names wall time, parallelism, threads and the critical path."""
        text = str(two_chains_trace[0].summary())
        for needle in ("wall time", "parallelism", "interop-0", "critical path", "->", "dispatch"):
            assert needle in text


class TestTable:
    def test_per_op_totals(self, two_chains_trace: tuple[Any, Path]) -> None:
        """One row per op, largest total first, with the counts."""
        table = two_chains_trace[0].table()
        lines = table.splitlines()
        assert lines[0].split() == ["op", "count", "total", "mean", "max", "share"]
        rows = [line.split() for line in lines[2:-2]]
        stats = op_stats(two_chains_trace[0].trace())
        assert [r[0] for r in rows] == [s[0] for s in stats]
        assert [s[2] for s in stats] == sorted((s[2] for s in stats), reverse=True)
        assert {r[0]: int(r[1]) for r in rows} == {"matmul": 8, "tanh": 8, "add": 1}
        assert lines[-1].split()[:2] == ["total", "17"]


class TestInstruments:
    def test_raising_instrument_is_removed(self) -> None:
        """An instrument that raises is removed with a RuntimeWarning; the run completes."""

        class Broken:
            def task_started(self, ts: int, task: Task) -> None:
                raise RuntimeError("broken instrument")

        broken = Broken()
        dataflow.add_instrument(broken)
        try:
            with (
                dataflow.profile() as prof,
                pytest.warns(RuntimeWarning, match="broken instrument"),
            ):
                result = dataflow.run(two_chains, 32, 2, interop_threads=2)
        finally:
            dataflow.remove_instrument(broken)
        assert broken not in PROCESS.instruments
        assert result.shape == (32, 32)
        assert len(prof.trace().tasks) == 9  # the profiler saw every task all the same

    def test_cost_free_ops_have_no_flops(self) -> None:
        """An op without a cost rule has no flops/bytes in its slice args."""

        @dataflow.op("plain", meta=lambda x: None, handle=_box)
        def plain(x: Any) -> Any:
            return x

        async def main() -> Any:
            return await plain(1)

        with dataflow.profile() as prof:
            dataflow.run(main)
        (task,) = prof.trace().tasks
        assert "flops" not in task.args and task.op == "plain"


class TestAliveBytes:
    """Bytes of task outputs alive over time (#13.2): a counter track and the summary's peak."""

    @staticmethod
    def _trace() -> Trace:
        f32 = {"shape": [256, 256], "dtype": "float32"}  # 256 KiB each
        tasks = [
            TaskSpan("a#1", "a", 1, 0, 10, 0, (), dict(f32)),
            TaskSpan("b#2", "b", 2, 0, 20, 0, (), dict(f32)),
            TaskSpan("c#3", "c", 1, 30, 40, 20, ("a#1", "b#2"), dict(f32)),  # frees a and b
            TaskSpan("d#4", "d", 1, 50, 60, 40, ("c#3",), {"shape": [1], "dtype": "float64"}),
            TaskSpan("x#5", "x", 2, 5, 8, 0, (), {"spec": "?"}),  # no shape: not counted
        ]
        return Trace(tasks=tasks, threads={1: "interop-0", 2: "interop-1"}, wall=70)

    def test_alive_from_end_to_last_reader(self) -> None:
        """An output counts from its task's end to its last reader's end; an unread one to
        the end of the trace."""
        from dataflow._trace import alive_bytes

        kib = 1024
        assert alive_bytes(self._trace()) == [
            (10, 256 * kib),
            (20, 512 * kib),
            (40, 256 * kib),  # c made, a and b freed
            (60, 8),  # c freed, d (read by nobody) alive to the end
            (70, 0),
        ]

    def test_summary_and_chrome_counter(self) -> None:
        """The summary gives the peak; the Chrome trace has a `memory` counter track."""
        from dataflow._tracewrite import to_chrome

        trace = self._trace()
        summary = summarize(trace)
        assert summary.peak_alive_bytes == 512 * 1024
        assert "memory          peak 0.5 MiB of task outputs alive" in str(summary)
        counters = [e for e in to_chrome(trace)["traceEvents"] if e.get("name") == "memory"]
        assert [e["args"]["bytes alive"] for e in counters] == [262144, 524288, 262144, 8, 0]

    def test_profiled_run_reports_its_peak(self) -> None:
        """A real run: two independent 64 KiB outputs alive at once, then their sum."""

        async def main() -> Any:
            a = ops.multiply(np.ones(8192), 2.0)
            b = ops.multiply(np.ones(8192), 3.0)
            return await ops.add(a, b)

        with dataflow.profile() as prof:
            dataflow.run(main, interop_threads=2)
        assert prof.summary().peak_alive_bytes >= 2 * 8192 * 8
