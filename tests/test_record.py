"""Recorders and observers (issues #16 and #19.2): per runtime, bounded, never fatal."""

from __future__ import annotations

import collections
import json
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow._instrument import PROCESS
from dataflow._record import FlatRecords

Array = np.ndarray[Any, Any]


async def _chain(n: int) -> Any:
    """``n`` pool ops in a chain, awaited."""
    y: Any = ops.asarray(np.ones(8))
    for _ in range(n):
        y = _slow(y)
    return await y


_slow = dataflow.op("slow_id", meta=ops.spec_of, handle=ops.Tensor, inline=False)(np.array)


def _fail(x: Any) -> Any:
    raise ValueError("failing kernel")


_failing = dataflow.op("failing", meta=ops.spec_of, handle=ops.Tensor, inline=False)(_fail)
# Inline whatever their measured time (the lean path is what the test is about).
_inc = dataflow.op("inc", meta=ops.spec_of, handle=ops.Tensor, inline=True)(lambda x: x + 1.0)
_square = dataflow.op("square", meta=lambda x, y: ops.spec_of(x), handle=ops.Tensor, inline=True)(
    np.multiply
)
_failing_inline = dataflow.op("failing_inline", meta=ops.spec_of, handle=ops.Tensor, inline=True)(
    _fail
)


class TestRecorder:
    def test_one_record_per_task_with_its_dependencies(self) -> None:
        """A recorder sees each task once, with its inputs, thread and times in order."""
        rec = dataflow.Recorder()

        async def main() -> Any:
            rt = dataflow.current_runtime()
            assert rt is not None
            rt.add_instrument(rec)
            return await _chain(5)

        dataflow.run(main, interop_threads=2)
        trace = rec.trace()
        chain = [t for t in trace.tasks if t.op == "slow_id"]
        assert len(chain) == 5
        assert all(t.ready <= t.start <= t.end for t in chain)
        assert [t.inputs for t in chain[1:]] == [(a.name,) for a in chain[:-1]]
        assert all(trace.threads[t.thread].startswith("interop") for t in chain)

    def test_inline_ops_recorded_on_the_lean_path(self) -> None:
        """Inline ops observed by recorders alone (no hook calls) still give one record
        each, with their inputs, the loop's thread and ordered times; failures too."""
        rec = dataflow.Recorder()
        seen: list[Any] = []

        class Sub(dataflow.Recorder):  # overrides task(): gets the call, not an append
            def task(self, task: Any, *args: Any) -> None:
                seen.append(task.id)
                super().task(task, *args)

        sub = Sub()

        async def main() -> Any:
            rt = dataflow.current_runtime()
            assert rt is not None
            rt.add_instrument(rec)
            rt.add_instrument(sub)
            y: Any = ops.asarray(np.arange(4.0))
            for _ in range(4):
                y = _inc(y)
            z = _square(y, y)
            with pytest.raises(ValueError):
                await _failing_inline(np.ones(3))  # an inline failure is recorded too
            return await z

        value = dataflow.run(main, interop_threads=2)
        np.testing.assert_array_equal(value, (np.arange(4.0) + 4) ** 2)
        for trace in (rec.trace(), sub.trace()):
            adds = [t for t in trace.tasks if t.op == "inc" and not t.failed]
            assert len(adds) == 4
            assert [t.inputs for t in adds[1:]] == [(a.name,) for a in adds[:-1]]
            (mul,) = [t for t in trace.tasks if t.op == "square"]
            assert mul.inputs == (adds[-1].name, adds[-1].name)
            assert all(t.ready <= t.start <= t.end for t in trace.tasks)
            assert {trace.threads[t.thread] for t in adds} == {"loop"}
            assert [t for t in trace.tasks if t.failed]
        assert len(seen) >= 5

    def test_records_hold_nothing_the_collector_walks(self) -> None:
        """Inline and pool records hold ints only (the signature by its ``rid``), so the
        garbage collector untracks them; the trace still has each op's name, spec, cost
        and inputs."""
        import gc

        rec = dataflow.Recorder()

        async def main() -> Any:
            rt = dataflow.current_runtime()
            assert rt is not None
            rt.add_instrument(rec)  # a plain recorder alone: submit's own record path
            y: Any = ops.asarray(np.arange(4.0))
            for _ in range(3):
                y = ops.add(y, 1.0)
            z = _slow(y)  # a pool task
            w = ops.multiply(z, z)
            return await w

        value = dataflow.run(main, interop_threads=2)
        np.testing.assert_array_equal(value, (np.arange(4.0) + 3) ** 2)
        gc.collect()  # (a record is untracked once its inputs' tuple is: at most two passes)
        gc.collect()
        # An unbounded recorder keeps its records flat: no tuple per record, and no field
        # the collector walks (the inputs' tuples are untracked too).
        assert isinstance(rec.tasks, FlatRecords) and len(rec.tasks) >= 5
        assert len(rec.tasks.data) == 8 * len(rec.tasks)
        assert not any(gc.is_tracked(v) for v in rec.tasks.data)
        trace = rec.trace()
        adds = [t for t in trace.tasks if t.op == "add"]
        assert len(adds) == 3
        assert adds[0].args["shape"] == [4] and adds[0].args["flops"] == 4.0
        assert [t.inputs for t in adds[1:]] == [(a.name,) for a in adds[:-1]]
        (slow,) = [t for t in trace.tasks if t.op == "slow_id"]
        assert slow.inputs == (adds[-1].name,)
        (mul,) = [t for t in trace.tasks if t.op == "multiply"]
        assert mul.inputs == (slow.name, slow.name)

    def test_records_hold_the_signature_once_the_table_is_full(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Past the bound on named signatures a record holds the Signature itself (the
        table never grows without limit), and the trace reads both kinds alike."""
        from dataflow import _record

        monkeypatch.setattr(_record, "NAMED", {})
        monkeypatch.setattr(_record, "_MAX_NAMED", 0)
        rec = dataflow.Recorder()
        # Ops of this test's own: no earlier test's record has named their signatures.
        negative = dataflow.op("full_negative", meta=ops.spec_of, handle=ops.Tensor)(np.negative)
        less = dataflow.op("full_less", meta=lambda x, y: ops.spec_of(x), handle=ops.Tensor)(
            np.subtract
        )

        async def main() -> Any:
            rt = dataflow.current_runtime()
            assert rt is not None
            rt.add_instrument(rec)
            return await less(negative(ops.asarray(np.ones(3))), 2.0)

        np.testing.assert_array_equal(dataflow.run(main), -3.0 * np.ones(3))
        assert not _record.NAMED
        ops_seen = [t.op for t in rec.trace().tasks]
        assert "full_negative" in ops_seen and "full_less" in ops_seen
        assert any(type(r[1]) is dataflow.Signature for r in rec.tasks)

    def test_scoped_to_one_runtime(self) -> None:
        """A recorder attached to one runtime records none of another's tasks."""
        rec = dataflow.Recorder()

        async def main() -> None:
            async with dataflow.Runtime(private_pool=True) as mine:
                mine.add_instrument(rec)
                await _chain(3)
            async with dataflow.Runtime(private_pool=True):
                await _chain(4)

        dataflow.run(main)
        assert len([t for t in rec.trace().tasks if t.op == "slow_id"]) == 3
        assert rec not in PROCESS.recorders

    def test_attached_before_entry(self) -> None:
        """rt.add_instrument before `async with` takes effect on entry."""
        rec = dataflow.Recorder()

        async def main() -> None:
            rt = dataflow.Runtime(private_pool=True)
            rt.add_instrument(rec)
            async with rt:
                await _chain(2)

        dataflow.run(main)
        assert len([t for t in rec.trace().tasks if t.op == "slow_id"]) == 2

    def test_profile_of_one_runtime(self) -> None:
        """dataflow.profile(rt) records that runtime only."""

        async def main() -> int:
            async with dataflow.Runtime(private_pool=True) as rt:
                async with dataflow.profile(rt) as prof:
                    await _chain(3)
                async with dataflow.Runtime(private_pool=True):
                    await _chain(2)
            return len([t for t in prof.trace().tasks if t.op == "slow_id"])

        assert dataflow.run(main) == 3

    def test_max_spans_keeps_the_last(self) -> None:
        """A ring buffer: max_spans=10 keeps the 10 most recent task records."""
        rec = dataflow.Recorder(max_spans=10)
        dataflow.add_instrument(rec)
        try:
            dataflow.run(_chain, 50)
        finally:
            dataflow.remove_instrument(rec)
        ids = [t.id for t in rec.trace().tasks]
        assert len(ids) == 10 and ids == sorted(ids)

    def test_max_seconds_drops_old_records(self) -> None:
        """max_seconds keeps only what ended within the window."""
        rec = dataflow.Recorder(max_seconds=3600)
        rec.tasks.append((1, "old", (), 1, 0, 0, rec.t0 - 7200 * 10**9, 0))
        dataflow.add_instrument(rec)
        try:
            dataflow.run(_chain, 3)
        finally:
            dataflow.remove_instrument(rec)
        assert [t.op for t in rec.trace().tasks].count("old") == 0

    def test_max_seconds_bounds_compiled_forwards(self) -> None:
        """A compiled forward's nodes (the lean executor's span records) are dropped by age
        too: each runner call counted its own records, never 256 in a plan of a few nodes,
        so a server of compiled forwards kept every record (memory grew with the load)."""

        async def model(x: Any) -> Any:
            return ops.negative(ops.add(x, 1.0))

        forward = dataflow.compile(model)
        rec = dataflow.Recorder(max_seconds=1e-6)

        async def main() -> int:
            rt = dataflow.current_runtime()
            assert rt is not None
            x = np.ones(4)
            await forward(x)
            rt.add_instrument(rec)
            for _ in range(1000):
                await forward(x)
            return len(rec.tasks)

        assert dataflow.run(main) < 500  # (of 1000 records, one a call; trimmed every 256th)

    def test_two_trims_at_once_keep_the_fresh_records(self) -> None:
        """A trim on one thread (a dump's) and one on another (a pool thread's, as it records)
        run one after the other: interleaved, both saw the same old record first, and the
        second popped a fresh record (or raised IndexError once the buffer was empty)."""
        rec = dataflow.Recorder(max_seconds=1)
        now = rec.t0 + 10 * 10**9
        old = (1, "old", (), 1, 0, 0, now - 5 * 10**9, 0)
        fresh = (2, "fresh", (), 1, 0, 0, now, 0)
        other: list[threading.Thread] = []

        class Interleaved(collections.deque):  # type: ignore[type-arg]
            def popleft(self) -> Any:
                if not other:  # the first pop: another thread trims meanwhile
                    other.append(threading.Thread(target=rec.trim, args=(now,)))
                    other[0].start()
                    other[0].join(0.2)  # (with the lock it waits for this trim to end)
                return super().popleft()

        rec.tasks = Interleaved([old, fresh])
        rec.trim(now)
        other[0].join()
        assert [r[1] for r in rec.tasks] == ["fresh"]

    def test_dump_writes_a_trace_and_keeps_recording(self, tmp_path: Path) -> None:
        """dump(path) writes the buffer as Chrome trace JSON; the recorder goes on."""
        rec = dataflow.Recorder(max_spans=100)
        dataflow.add_instrument(rec)
        try:
            dataflow.run(_chain, 4)
            path = tmp_path / "now.json"
            rec.dump(path)
            dataflow.run(_chain, 2)
        finally:
            dataflow.remove_instrument(rec)
        doc = json.loads(path.read_text())
        slices = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        assert len([e for e in slices if e["name"].startswith("slow_id")]) == 4
        assert len([t for t in rec.trace().tasks if t.op == "slow_id"]) == 6

    def test_empty_dump_says_so(self, tmp_path: Path) -> None:
        """Dumping a recorder that saw nothing is an error that says why."""
        with pytest.raises(dataflow.DataflowError, match="holds nothing"):
            dataflow.Recorder().dump(tmp_path / "x.json")

    def test_bad_bounds(self) -> None:
        """Bounds are validated, naming the argument."""
        with pytest.raises(ValueError, match="max_spans"):
            dataflow.Recorder(max_spans=0)
        with pytest.raises(TypeError, match="max_seconds"):
            dataflow.Recorder(max_seconds="1")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"max_spans=\) must be a positive int .* str"):
            dataflow.Recorder(max_spans="5")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="max_spans"):
            dataflow.Recorder(max_spans=True)
        with pytest.raises(ValueError, match=r"max_seconds=\) must be at most .* math.inf"):
            dataflow.Recorder(max_seconds=1e300)

    def test_numpy_numbers_and_an_infinite_age_are_bounds(self) -> None:
        """numpy ints and floats are taken as their Python values; max_seconds=math.inf is no
        age bound (as None), not an OverflowError."""
        assert dataflow.Recorder(max_spans=np.int64(5)).max_spans == 5  # type: ignore[arg-type]
        assert dataflow.Recorder(max_seconds=np.float32(2.5)).max_seconds == 2.5  # type: ignore[arg-type]
        unbounded = dataflow.Recorder(max_seconds=float("inf"))
        assert unbounded.max_seconds is None and "unbounded" in repr(unbounded)
        assert dataflow.profile(max_seconds=float("inf")).max_seconds is None

    def test_failures_and_unrun_tasks_are_counted(self) -> None:
        """A failed kernel is a failed span; its dependents, which never ran, are counted."""
        rec = dataflow.Recorder()

        async def main() -> None:
            bad = _failing(np.ones(2))
            downstream = ops.add(_slow(bad), 1.0)
            with pytest.raises(dataflow.TaskError):
                await downstream

        dataflow.add_instrument(rec)
        try:
            dataflow.run(main)
        finally:
            dataflow.remove_instrument(rec)
        trace = rec.trace()
        assert [t.failed for t in trace.tasks if t.op == "failing"] == [True]
        assert trace.unrun_failed >= 1


def _plain_add(a: Any) -> Any:
    return ops.add(a, 1.0).result()  # an op run inline on the pool thread


async def _fork_plain_add() -> Any:
    return await dataflow.fork(_plain_add, np.ones(4))


class TestThreadsAcrossRuns:
    """Each run starts its pool's threads again; Python hands a new thread the ident of one
    that ended. Every task stays on the lane of the thread that ran it, with its label."""

    def test_every_runs_tasks_are_on_their_own_threads_lane(self) -> None:
        with dataflow.profile() as prof:
            for _ in range(3):
                dataflow.run(_fork_plain_add, interop_threads=1)
        trace = prof.trace()
        forks = [t for t in trace.tasks if t.op.endswith("_plain_add")]
        adds = [t for t in trace.tasks if t.op == "add"]
        assert len(forks) == 3 and len(adds) == 3
        for fork in forks:
            assert trace.threads[fork.thread] == "interop-0"
        for add in adds:  # (inline in the fork's kernel, as a rule: its thread's label)
            assert trace.threads[add.thread] in ("interop-0", "loop")
        assert len({t.thread for t in forks}) == 3  # a pool thread per run
        assert set(prof.summary().busy_s) <= {"interop-0", "loop"}

    @pytest.mark.asyncio
    async def test_threads_one_after_another_in_one_runtime_keep_their_own_lanes(self) -> None:
        """In one runtime, threads that dispatch inline ops one after another (each started
        once the one before ended: Python most often gives it the same ident) each record
        their ops under their own native id."""
        import contextvars

        async with dataflow.Runtime(interop_threads=1):
            context = contextvars.copy_context()  # the runtime is current in it
            natives: list[int] = []

            def dispatch() -> None:
                natives.append(threading.get_native_id())
                ops.add(np.ones(4), 1.0).result()  # inline, on this thread

            with dataflow.profile() as prof:
                for _ in range(4):
                    thread = threading.Thread(target=context.run, args=(dispatch,))
                    thread.start()
                    thread.join()
        adds = [t for t in prof.trace().tasks if t.op == "add"]
        assert [t.thread for t in adds] == natives


class _Raising(dataflow.Instrument):
    """Raises ``exc`` from ``hook`` (and, optionally, from its own __repr__)."""

    def __init__(self, hook: str, exc: BaseException, bad_repr: bool = False) -> None:
        self.exc = exc
        self.bad_repr = bad_repr
        setattr(self, hook, self._raise)

    def _raise(self, *args: Any) -> None:
        raise self.exc

    def __repr__(self) -> str:
        if self.bad_repr:
            raise RuntimeError("repr is broken too")
        return "<Raising>"


class TestAttaching:
    @pytest.mark.parametrize("cls", [dataflow.Instrument, dataflow.Recorder])
    def test_a_class_instead_of_an_instance_is_refused(self, cls: type) -> None:
        """Attached, a class would fail at its first event (its hooks miss ``self``)."""
        with pytest.raises(dataflow.DataflowTypeError, match=r"got the class .*, not an instance"):
            dataflow.add_instrument(cls)
        runtime = dataflow.Runtime()
        with pytest.raises(dataflow.DataflowTypeError, match=r"not an instance"):
            runtime.add_instrument(cls)
        assert cls not in PROCESS.instruments and cls not in PROCESS.recorders

    def test_an_object_without_hooks_is_refused(self) -> None:
        with pytest.raises(dataflow.DataflowTypeError, match=r"has none of the hook methods"):
            dataflow.add_instrument(object())


class TestObserversNeverBreakARun:
    @pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3), ValueError("v")])
    @pytest.mark.parametrize("hook", ["task_started", "task_finished", "task_ready"])
    def test_anything_raised_switches_the_observer_off(self, hook: str, exc: Any) -> None:
        """An instrument raising KeyboardInterrupt, SystemExit or anything else, on a worker
        thread, is switched off and reported once; the run completes (issue #19.2)."""
        inst = _Raising(hook, exc)
        dataflow.add_instrument(inst)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = dataflow.run(_chain, 6, interop_threads=2)
        finally:
            dataflow.remove_instrument(inst)
        np.testing.assert_array_equal(got, np.ones(8))
        reports = [w for w in caught if f"raised in {hook}()" in str(w.message)]
        assert len(reports) == 1
        assert inst not in PROCESS.instruments

    def test_a_recorder_raising_in_unrun_is_switched_off(self) -> None:
        """A Recorder whose ``unrun`` raises (a task failing unrun, its input failed) is
        switched off and reported once; the program gets its own error, nothing else."""

        class BadUnrun(dataflow.Recorder):
            def unrun(self, cancelled: bool) -> None:
                raise KeyboardInterrupt

        fail = dataflow.op("fail_x", meta=ops.spec_of, handle=ops.Tensor, inline=False)(
            lambda x: 1 / 0
        )

        async def main() -> Any:
            return await _slow(_slow(fail(np.ones(2))))

        rec = BadUnrun()
        dataflow.add_instrument(rec)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with pytest.raises(dataflow.TaskError) as info:
                    dataflow.run(main, interop_threads=2)
        finally:
            dataflow.remove_instrument(rec)
        assert isinstance(info.value.__cause__, ZeroDivisionError)
        assert len([w for w in caught if "raised in unrun()" in str(w.message)]) == 1
        assert rec not in PROCESS.recorders

    def test_two_threads_raising_at_once_are_reported_once(self) -> None:
        """Both pool threads inside the hook when it raises: one of them switches the
        observer off and says so; the other finds it switched off already, and is silent."""
        barrier = threading.Barrier(2, timeout=5)

        class BothAtOnce(dataflow.Instrument):
            def task_started(self, ts: int, task: Any) -> None:
                barrier.wait()  # (both threads are in the hook before either raises)
                raise ValueError("hook")

        async def main() -> None:
            futs = [dataflow.fork(np.add, np.ones(2), 1.0) for _ in range(2)]
            for f in futs:
                await f

        inst = BothAtOnce()
        dataflow.add_instrument(inst)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                dataflow.run(main, interop_threads=2)
        finally:
            dataflow.remove_instrument(inst)
        assert len([w for w in caught if "raised in task_started()" in str(w.message)]) == 1

    def test_hook_and_repr_both_raising(self) -> None:
        """An instrument whose hook and __repr__ both raise is still switched off cleanly."""
        inst = _Raising("task_started", KeyboardInterrupt(), bad_repr=True)
        dataflow.add_instrument(inst)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = dataflow.run(_chain, 4, interop_threads=2)
        finally:
            dataflow.remove_instrument(inst)
        np.testing.assert_array_equal(got, np.ones(8))
        assert any("<_Raising object>" in str(w.message) for w in caught)

    def test_workers_survive(self) -> None:
        """After an instrument raised on the workers, the pool still has all its threads and
        runs the next program."""
        inst = _Raising("task_started", SystemExit(1))

        async def main() -> tuple[Any, int]:
            rt = dataflow.current_runtime()
            assert rt is not None and rt._pool is not None
            rt.add_instrument(inst)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                first = await _chain(4)
            alive = sum(t.is_alive() for t in rt._pool.threads)
            return first, alive + 0 * len(await _chain(4))

        first, alive = dataflow.run(main, interop_threads=2)
        np.testing.assert_array_equal(first, np.ones(8))
        assert alive == 2

    def test_runtime_scope_switches_off_in_that_runtime_only(self) -> None:
        """A raising observer of one runtime is removed from that runtime, not the process."""
        inst = _Raising("task_finished", ValueError("x"))

        async def main() -> bool:
            async with dataflow.Runtime(private_pool=True) as rt:
                rt.add_instrument(inst)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    await _chain(2)
                return inst in rt._sched.scope.instruments

        assert dataflow.run(main) is False


class TestAttachedToBothScopes:
    """An observer attached to the process and to a runtime too sees each event of that
    runtime once, as one attached twice to one scope does."""

    @staticmethod
    async def _program() -> None:
        await _chain(3)  # pool ops
        x: Any = ops.asarray(np.ones(4))
        for _ in range(3):
            x = _inc(x)  # inline ops, on the lean path
        await x
        await dataflow.wait(dataflow.fork(_chain, 1))  # a fork, and a wait
        with pytest.raises(dataflow.TaskError):
            await ops.add(_failing(np.ones(2)), 1.0)  # a failed span, and one that never ran

    def _run_with(self, observer: Any) -> None:
        async def main() -> None:
            async with dataflow.Runtime(private_pool=True) as rt:
                rt.add_instrument(observer)
                await self._program()

        dataflow.add_instrument(observer)
        try:
            dataflow.run(main)
        finally:
            dataflow.remove_instrument(observer)

    def test_a_recorder_records_each_task_once(self) -> None:
        """One record per task (pool, inline, failed), one span per fork and wait, and one
        count per task that never ran: a bounded buffer is not half full of copies."""
        rec = dataflow.Recorder()
        self._run_with(rec)
        ids = [r[0] for r in rec.tasks]
        assert len(ids) == len(set(ids)) == 11  # (1 + 3) + (1 + 3) + the fork's (1 + 1) + 1
        assert len(rec.spans) == len({(s[0], s[1]) for s in rec.spans})
        assert rec.unrun_failed == 1

    def test_an_instrument_sees_each_event_once(self) -> None:
        """Each hook is called once per event (not once per scope)."""
        counts: collections.Counter[tuple[str, Any]] = collections.Counter()

        class Counting(dataflow.Instrument):
            def task_created(self, ts: int, task: Any) -> None:
                counts["created", task.id] += 1

            def task_started(self, ts: int, task: Any) -> None:
                counts["started", task.id] += 1

            def fork(self, ts: int, name: str, parent: str | None) -> None:
                counts["fork", name] += 1

        self._run_with(Counting())
        assert counts and set(counts.values()) == {1}

    @pytest.mark.parametrize("hook", ["task_started", "fork", "task_created"])
    def test_one_that_raises_is_switched_off_in_both_and_reported_once(self, hook: str) -> None:
        """It raised on this runtime's event: it is switched off in both scopes (or it would
        raise, and be reported, again through the other one), with one report."""
        inst = _Raising(hook, ValueError("hook"))
        box: list[Any] = []

        async def main() -> None:
            async with dataflow.Runtime(private_pool=True) as rt:
                rt.add_instrument(inst)
                await self._program()
                box.append(rt._sched.scope)

        dataflow.add_instrument(inst)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                dataflow.run(main)
        finally:
            dataflow.remove_instrument(inst)
        assert len([w for w in caught if f"raised in {hook}()" in str(w.message)]) == 1
        assert inst not in box[0].instruments

    def test_a_recorder_that_raises_is_reported_once(self) -> None:
        """A recorder whose ``task`` raises, attached to both: one report, off in both."""

        class Bad(dataflow.Recorder):
            def task(self, *args: Any, **kwargs: Any) -> None:
                raise ValueError("record")

        rec = Bad()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self._run_with(rec)
        assert len([w for w in caught if "raised in task()" in str(w.message)]) == 1


class TestCompiledPlansObserved:
    """While an instrument observes, a compiled forward runs a task per node (``_planrun``):
    each node is reported created, with its input nodes as its inputs, as an op's task is."""

    @staticmethod
    async def _model(x: Any) -> Any:
        a = ops.tanh(ops.matmul(x, x))
        return ops.sum(ops.multiply(a, ops.add(a, 1.0)))

    def test_nodes_are_created_with_their_inputs(self) -> None:
        """Every task that starts was reported created first, and a node's ``inputs`` are
        its input nodes' tasks: --progress showed `30/0 tasks done`, and a profile had no
        dependency edge (no critical path) in a compiled forward while an instrument
        observed."""
        forward = dataflow.compile(self._model)
        created: dict[int, tuple[str, tuple[str, ...]]] = {}
        unannounced: list[str] = []

        class Watch(dataflow.Instrument):
            def task_created(self, ts: int, task: Any) -> None:
                created[task.id] = (task.op, tuple(t.op for t in task.inputs))

            def task_started(self, ts: int, task: Any) -> None:
                if task.id not in created:
                    unannounced.append(task.name)

        async def main() -> None:
            x = np.eye(32, dtype=np.float32)
            for _ in range(3):
                await forward(x)

        inst = Watch()
        dataflow.add_instrument(inst)
        try:
            with dataflow.profile() as prof:
                dataflow.run(main, interop_threads=2)
        finally:
            dataflow.remove_instrument(inst)
        assert not unannounced
        nodes = [v for v in created.values() if v[0] in ("matmul", "tanh", "sum")]
        assert ("tanh", ("matmul",)) in nodes and ("matmul", ()) in nodes
        assert ("_model", ("sum",)) in created.values()  # the gather, with the output node
        trace = prof.trace()
        by_name = {t.name: t for t in trace.tasks}
        for t in trace.tasks:
            if t.op == "tanh":
                assert [by_name[i].op for i in t.inputs] == ["matmul"]
        assert len(prof.summary().critical_path) > 2


class TestFlatRecords:
    """An unbounded recorder's task records, kept flat (8 fields each, one list)."""

    def test_reads_as_a_sequence_of_record_tuples(self) -> None:
        flat = FlatRecords()
        flat.append((1, "a", (), 7, 10, 11, 12, False))
        flat.data.extend((2, "b", 1, 7, 12, 13, 15, True))  # what the scheduler calls
        assert len(flat) == 2
        assert list(flat) == [(1, "a", (), 7, 10, 11, 12, False), (2, "b", 1, 7, 12, 13, 15, True)]

    def test_iteration_sees_the_records_there_when_it_began(self) -> None:
        flat = FlatRecords()
        flat.append((1, "a", (), 7, 10, 11, 12, False))
        it = iter(flat)
        flat.append((2, "b", 1, 7, 12, 13, 15, False))
        assert [r[0] for r in it] == [1]

    def test_only_unbounded_recorders_keep_them_flat(self) -> None:
        assert isinstance(dataflow.Recorder().tasks, FlatRecords)
        assert not isinstance(dataflow.Recorder(max_spans=10).tasks, FlatRecords)
        assert not isinstance(dataflow.Recorder(max_seconds=5).tasks, FlatRecords)

    def test_a_bounded_recorder_still_keeps_the_last_spans(self) -> None:
        rec = dataflow.Recorder(max_spans=3)

        async def main() -> Any:
            rt = dataflow.current_runtime()
            assert rt is not None
            rt.add_instrument(rec)
            y: Any = ops.asarray(np.arange(4.0))
            for _ in range(10):
                y = ops.add(y, 1.0)
            return await y

        dataflow.run(main)
        assert len(rec.tasks) == 3 and len(rec.trace().tasks) == 3


def _sleepy(x: Any) -> Any:
    import time

    time.sleep(0.02)
    return x


_sleepy_op = dataflow.op("sleepy", meta=lambda x: ops.spec_of(x), handle=ops.Tensor, inline=False)(
    _sleepy
)


class TestWaitSpans:
    def test_a_wait_on_a_pending_value_is_named_by_its_task(self) -> None:
        """``dataflow.wait(t)`` on a pending Tensor: the span is ``op#id``, not a repr that
        froze the state the value had when the wait began."""

        async def main() -> str:
            t = _sleepy_op(np.ones(2))
            await dataflow.wait(t)
            return t._t.name

        with dataflow.profile() as prof:
            name = dataflow.run(main, interop_threads=1)
        waits = [s for s in prof.trace().spans if s.kind == "wait"]
        assert [s.name for s in waits] == [name]
        assert name.startswith("sleepy#")
