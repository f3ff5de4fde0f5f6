"""Light handles: an op that runs at dispatch while nothing observes makes no task record of
its own; its handle carries the value and materializes a task only when asked
(``dataflow._task.Pending``)."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow import Pending, Task
from dataflow._task import DONE, LIGHT

pytestmark = pytest.mark.asyncio


def _lit(h: Pending[Any]) -> bool:
    """Whether ``h`` is light (its value in the handle), without materializing its task."""
    return h._t.value is LIGHT


def _ident_meta(x: Any) -> Any:
    return ops.spec_of(x)


def _tiny(x: Any) -> dataflow.Cost:
    return dataflow.Cost(flops=1.0, bytes=8.0)


# A kernel forced onto the pool, to read light handles from a worker.
pooled_neg = dataflow.op(
    "light_pooled_neg", meta=_ident_meta, handle=ops.Tensor, cost=_tiny, inline=False
)(np.negative)


def _boom(x: Any) -> Any:
    raise ValueError("boom")


# A tiny kernel that raises: it fails at dispatch, inline.
failing_op = dataflow.op("light_failing", meta=_ident_meta, handle=ops.Tensor, cost=_tiny)(_boom)


def _scaled(x: Any, *, by: Any) -> Any:
    return x * by


# A tiny kernel that takes an array as a keyword.
scaled = dataflow.op(
    "light_scaled",
    meta=lambda x, *, by: ops.spec_of(x),
    handle=ops.Tensor,
    cost=lambda x, *, by: _tiny(x),
)(_scaled)


class _NotPending:
    """A handle factory's own type (not a Pending): it has nowhere to put a value."""

    __slots__ = ("task",)

    def __init__(self, task: Task, index: int | None, spec: Any) -> None:
        self.task = task


# inline=True: runs at dispatch whatever its kernel measured (placement otherwise follows the
# measured time, and a slow moment of a loaded machine once sent it to the pool).
plain_handle_op = dataflow.op(  # type: ignore[type-var]
    "light_plain_handle", meta=_ident_meta, handle=_NotPending, cost=_tiny, inline=True
)(np.positive)


class TestLightHandles:
    async def test_a_small_op_at_dispatch_gives_a_light_handle_with_its_value(self) -> None:
        x = np.arange(4.0)
        async with dataflow.Runtime():
            h = ops.add(x, 1.5)
            assert _lit(h)
            assert h.done()
            np.testing.assert_array_equal(h.result(), x + 1.5)
            np.testing.assert_array_equal(await h, x + 1.5)
            assert h.exception() is None
            assert h.cancel() is False  # done: nothing to cancel
            assert "done" in repr(h)

    async def test_its_task_is_made_on_first_use_one_per_handle(self) -> None:
        x = np.arange(3.0)
        async with dataflow.Runtime():
            a, b = ops.add(x, 1.0), ops.add(x, 1.0)  # one signature, two values
            assert a._t is b._t  # the signature's shared record...
            ta, tb = a.task, b.task
            assert ta is not tb  # ...and a task of its own for each, once asked
            assert a.task is ta and not _lit(a)  # made once
            assert ta.state == DONE and tb.state == DONE
            assert ta.id != tb.id
            np.testing.assert_array_equal(ta.value, x + 1.0)
            np.testing.assert_array_equal(a.result(), x + 1.0)
            np.testing.assert_array_equal(b.result(), x + 1.0)

    async def test_light_values_feed_ops_inline_on_the_pool_and_in_containers(self) -> None:
        rng = np.random.default_rng(5)
        x, y = rng.standard_normal(6), rng.standard_normal(6)
        async with dataflow.Runtime(interop_threads=2):
            a = ops.multiply(x, 2.0)
            b = ops.add(a, y)  # inline, reading a light input
            c = pooled_neg(b)  # on a worker, reading a light input
            d = ops.stack([a, b])  # a container of light handles
            e = ops.add(c, a)
            assert _lit(a) and _lit(b)
            np.testing.assert_allclose(await c, -(x * 2.0 + y))
            np.testing.assert_allclose(await d, np.stack([x * 2.0, x * 2.0 + y]))
            np.testing.assert_allclose(await e, -(x * 2.0 + y) + x * 2.0)

    async def test_ops_of_several_outputs_keep_their_task(self) -> None:
        x = np.arange(12.0).reshape(3, 4)
        async with dataflow.Runtime():
            parts = ops.split(x, 2, axis=1)
            assert not any(_lit(p) for p in parts)
            for p, want in zip(parts, np.split(x, 2, axis=1), strict=True):
                np.testing.assert_array_equal(await p, want)

    async def test_a_factory_that_is_not_a_pending_gets_a_task_of_its_own(self) -> None:
        x = np.arange(3.0)
        async with dataflow.Runtime():
            h = plain_handle_op(x)
            assert type(h) is _NotPending
            assert h.task.value is not LIGHT
            np.testing.assert_array_equal(h.task.value, x)

    async def test_tracing_takes_a_light_value_as_a_constant(self) -> None:
        x = np.arange(3.0)
        async with dataflow.Runtime():
            outside = ops.add(x, 1.0)
            assert _lit(outside)

            async def program(v: Any) -> Any:
                return ops.add(v, outside)

            graph = await dataflow.graph.trace_async(program, x)
            np.testing.assert_array_equal(await graph(x), x + x + 1.0)

    async def test_a_handle_factory_setting_task_directly_still_works(self) -> None:
        """A Pending subclass of a user's may set ``_task`` itself (as ops.Tensor did)."""

        class Mine(Pending[Any]):
            __slots__ = ()

            def __init__(self, task: Task, index: int | None, spec: Any) -> None:
                self._task = task
                self._index = index

        op = dataflow.op("light_mine", meta=_ident_meta, handle=Mine, cost=_tiny)(np.positive)
        x = np.arange(3.0)
        async with dataflow.Runtime():
            h = op(x)
            assert type(h) is Mine and _lit(h)
            np.testing.assert_array_equal(await h, x)
            np.testing.assert_array_equal(h.task.value, x)

    async def test_holding_small_results_costs_one_tracked_object_each(self) -> None:
        """The point of light handles: the garbage collector tracks the handle only."""
        x = np.arange(3.0)
        n = 2000
        async with dataflow.Runtime():
            ops.add(x, 1.0)  # the signature and its shared record exist before counting
            gc.collect()
            gc.disable()
            try:
                before = len(gc.get_objects())
                held = [ops.add(x, 1.0) for _ in range(n)]
                grown = len(gc.get_objects()) - before
            finally:
                gc.enable()
            assert all(_lit(h) for h in held)
            assert grown < 1.2 * n, grown

    async def test_wait_materialize_and_fork_read_light_values(self) -> None:
        rng = np.random.default_rng(11)
        x = rng.standard_normal(5)
        async with dataflow.Runtime(interop_threads=2):
            a, b = ops.add(x, 1.0), ops.multiply(x, 3.0)
            assert _lit(a) and _lit(b)
            np.testing.assert_array_equal(await dataflow.wait(a), x + 1.0)
            got = await dataflow.materialize({"a": a, "pair": (b, [a])})
            np.testing.assert_array_equal(got["a"], x + 1.0)
            np.testing.assert_array_equal(got["pair"][0], x * 3.0)
            np.testing.assert_array_equal(got["pair"][1][0], x + 1.0)

            def plain(v: Any) -> Any:  # a forked plain function gets a light handle's value
                assert type(v) is np.ndarray
                return v * 2.0

            np.testing.assert_array_equal(await dataflow.fork(plain, b), x * 6.0)
            assert _lit(a) and _lit(b)  # reading values made no task


def _by_name(trace: Any) -> dict[str, Any]:
    return {t.name: t for t in trace.tasks}


class TestRecordedLightHandles:
    """While a profile records, an op run at dispatch still makes no task: its handle is light
    and carries its span record's id (``Pending._id``), which the ops reading it name as their
    input, so the trace's edges are those of full tasks."""

    async def test_a_recorded_op_is_light_and_its_edges_join_the_right_spans(self) -> None:
        rng = np.random.default_rng(3)
        x, y, z = rng.standard_normal((3, 4))
        async with dataflow.Runtime():
            with dataflow.profile() as prof:
                a = ops.multiply(x, y)
                b = ops.multiply(x, z)  # the same signature as a: one shared light task
                c = ops.add(a, b)
                d = ops.negative(c)
                assert all(_lit(h) for h in (a, b, c, d))
                assert a._t is b._t and a._id != b._id
                np.testing.assert_allclose(await d, -(x * y + x * z))
            spans = _by_name(prof.trace())
        name = {h: f"{op}#{h._id}" for h, op in ((a, "multiply"), (b, "multiply"),
                                                 (c, "add"), (d, "negative"))}  # fmt: skip
        assert set(name.values()) <= spans.keys()
        assert spans[name[c]].inputs == (name[a], name[b])
        assert spans[name[d]].inputs == (name[c],)
        assert spans[name[a]].inputs == ()

    async def test_a_recorded_handle_makes_its_task_with_its_records_id(self) -> None:
        x = np.arange(3.0)
        async with dataflow.Runtime():
            with dataflow.profile():
                a = ops.add(x, 1.0)
                rid = a._id
                assert _lit(a)
                task = a.task  # made now, on first use
            assert not _lit(a) and task.id == rid and a.task is task
            np.testing.assert_array_equal(task.value, x + 1.0)

    async def test_inputs_in_containers_keywords_and_queued_readers(self) -> None:
        rng = np.random.default_rng(4)
        x = rng.standard_normal((2, 3))
        async with dataflow.Runtime(interop_threads=2):
            with dataflow.profile() as prof:
                a = ops.add(x, 1.0)
                b = ops.add(x, 2.0)
                assert _lit(a) and _lit(b)  # (their readers below make their tasks)
                s = ops.stack([a, b])  # two light handles in a list
                n = pooled_neg(a)  # read on a worker
                k = scaled(x, by=b)  # as a keyword
                np.testing.assert_allclose(await s, np.stack([x + 1.0, x + 2.0]))
                np.testing.assert_allclose(await n, -(x + 1.0))
                np.testing.assert_allclose(await k, x * (x + 2.0))
            spans = _by_name(prof.trace())
        an, bn = f"add#{a._id}", f"add#{b._id}"
        assert an in spans and bn in spans
        assert a.task.id == a._id and b.task.id == b._id
        assert sorted(spans[s.task.name].inputs) == sorted([an, bn])
        assert spans[n.task.name].inputs == (an,)
        assert spans[k.task.name].inputs == (bn,)

    async def test_a_bounded_recorder_and_an_instrument_see_the_same_ids(self) -> None:
        seen: list[Any] = []

        class Inputs(dataflow.Instrument):
            def task_finished(self, ts: int, task: Any) -> None:
                seen.append((task.op, tuple(t.id for t in task.inputs)))

        x = np.arange(3.0)
        rec = dataflow.Recorder(max_spans=100)  # the general record path (a ring buffer)
        async with dataflow.Runtime() as rt:
            rt.add_instrument(rec)
            a = ops.add(x, 1.0)
            b = ops.multiply(a, 2.0)
            assert _lit(a) and _lit(b)
            rt.add_instrument(Inputs())  # from now on a full task per op, with its events
            c = ops.negative(b)
            np.testing.assert_array_equal(await c, -(x + 1.0) * 2.0)
        spans = _by_name(rec.trace())
        assert spans[f"multiply#{b._id}"].inputs == (f"add#{a._id}",)
        assert ("negative", (b._id,)) in seen
        assert spans[c.task.name].inputs == (f"multiply#{b._id}",)

    async def test_an_input_made_before_the_profile_is_read_as_before(self) -> None:
        x = np.arange(3.0)
        async with dataflow.Runtime():
            before = ops.add(x, 1.0)  # light, unrecorded: no id of its own yet
            assert _lit(before)
            with dataflow.profile() as prof:
                during = ops.add(before, 1.0)
                assert _lit(during)
                np.testing.assert_array_equal(await during, x + 2.0)
            trace = prof.trace()  # its input ran before recording: a "?#id" edge
            assert _by_name(trace)[f"add#{during._id}"].inputs == (f"?#{before.task.id}",)
            assert "add" in prof.table()

    async def test_a_failing_recorded_op_names_its_light_input(self) -> None:
        x = np.arange(3.0)
        async with dataflow.Runtime():
            with dataflow.profile() as prof:
                a = ops.add(x, 1.0)
                assert _lit(a)
                with pytest.raises(ValueError, match="boom"):
                    await failing_op(a)
            spans = [t for t in prof.trace().tasks if t.failed]
        assert spans and spans[0].inputs == (f"add#{a._id}",)
