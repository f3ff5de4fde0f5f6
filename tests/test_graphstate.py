"""The graph's transitions, as pure functions on Task records: no runtime, loop or thread."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dataflow import CancelledTaskError
from dataflow import _graphstate as gs
from dataflow._signature import Signature
from dataflow._task import CANCELLED, DONE, FAILED, PENDING, READY, RUNNING, Task


def task(*inputs: Task) -> Task:
    """A bare task record reading ``inputs``."""
    return Task(Signature("t"), lambda *a: None, (), None, None, tuple(inputs))


def run(t: Task, value: Any = None) -> list[Task]:
    """Start and finish ``t``; the tasks it made ready."""
    assert gs.start(t)
    return gs.finish(t, value) or []


class TestAdd:
    def test_no_inputs_is_ready(self) -> None:
        """A task without inputs is READY at once."""
        t = task()
        assert gs.add(t) is None
        assert t.state == READY and t.waiting == 0

    def test_waits_for_unfinished_inputs(self) -> None:
        """It waits for each unfinished input and registers as its dependent."""
        a, b = task(), task()
        gs.add(a)
        gs.add(b)
        c = task(a, b)
        assert gs.add(c) is None
        assert c.state == PENDING and c.waiting == 2
        assert a.dependents == [c] and b.dependents == [c]

    def test_done_inputs_are_not_waited_for(self) -> None:
        """A finished input counts for nothing."""
        a, b = task(), task()
        gs.add(a)
        gs.add(b)
        run(a)
        c = task(a, b)
        gs.add(c)
        assert c.waiting == 1 and a.dependents is None

    def test_an_input_listed_twice_is_waited_for_once(self) -> None:
        """Two outputs of one op (h and c of an LSTM step) are one dependency."""
        a, b = task(), task()
        gs.add(a)
        gs.add(b)
        c = task(a, b, a)
        gs.add(c)
        assert c.waiting == 2 and a.dependents == [c]
        assert run(b) == [] and run(a) == [c]

    def test_a_failed_input_is_returned(self) -> None:
        """A task whose input already failed is told which, and waits for nothing."""
        a = task()
        gs.add(a)
        gs.fail(a, ValueError("x"))
        b = task(a)
        assert gs.add(b) is a
        assert b.state == PENDING and b.waiting == 0


class TestStartFinish:
    def test_start_only_from_ready(self) -> None:
        """start is READY -> RUNNING; anything else is refused and left alone."""
        t = task()
        assert not gs.start(t)  # PENDING
        gs.add(t)
        assert gs.start(t) and t.state == RUNNING
        assert not gs.start(t)

    def test_finish_readies_dependents_whose_last_input_it_was(self) -> None:
        """Only a dependent with no other unfinished input becomes READY."""
        a, b = task(), task()
        gs.add(a)
        gs.add(b)
        c = task(a, b)
        gs.add(c)
        assert run(a) == [] and c.state == PENDING
        assert run(b) == [c] and c.state == READY

    def test_finish_releases_what_the_task_held(self) -> None:
        """A finished task lets go of its kernel, arguments and inputs."""
        a = task()
        gs.add(a)
        b = Task(Signature("t"), print, (1, 2), {"k": 3}, None, (a,))
        gs.add(b)
        run(a)
        run(b, 42)
        assert (b.state, b.value) == (DONE, 42)
        assert b.fn is None and b.args is None and b.kwargs is None and b.inputs == ()

    def test_finish_and_fail_drop_the_handles(self) -> None:
        """Only an unstarted task's handles decide its fate (a cancelled request drops what
        nobody holds): a finished or failed task lets go of them, so the handle and its task
        no longer hold each other."""
        done, failed = task(), task()
        for t in (done, failed):
            gs.add(t)
            t.handles = [object()]
        run(done, 1)
        gs.fail(failed, ValueError("boom"))
        assert done.handles is None and failed.handles is None

    def test_finish_can_keep_inputs(self) -> None:
        """release=False keeps the inputs for an observer that still reads them."""
        a = task()
        gs.add(a)
        b = task(a)
        gs.add(b)
        run(a)
        assert gs.start(b)
        gs.finish(b, 1, release=False)
        assert b.inputs == (a,)

    def test_take_waiters(self) -> None:
        """The waiters registered on a task are handed over once."""
        t = task()
        t.waiters = ["w1", "w2"]
        assert gs.take_waiters(t) == ["w1", "w2"]
        assert gs.take_waiters(t) is None


class TestFail:
    def test_fails_every_transitive_dependent_with_the_same_error(self) -> None:
        """a -> b -> c: failing a fails b and c with a's error; the changed tasks in order."""
        a = task()
        gs.add(a)
        b = task(a)
        gs.add(b)
        c = task(b)
        gs.add(c)
        err = ValueError("boom")
        assert gs.fail(a, err) == [a, b, c]
        assert all(t.state == FAILED and t.error is err for t in (a, b, c))

    def test_cancellation_makes_them_cancelled(self) -> None:
        """A CancelledTaskError cancels rather than fails."""
        a = task()
        gs.add(a)
        b = task(a)
        gs.add(b)
        gs.fail(a, CancelledTaskError("stop"))
        assert a.state == CANCELLED and b.state == CANCELLED

    def test_finished_tasks_are_left_alone(self) -> None:
        """A task that already finished does not fail, and fails at most once."""
        a = task()
        gs.add(a)
        run(a, 1)
        assert gs.fail(a, ValueError("late")) == []
        assert a.state == DONE and a.value == 1

    def test_independent_tasks_are_not_affected(self) -> None:
        """A failure reaches only what depends on the failed task."""
        a, b = task(), task()
        gs.add(a)
        gs.add(b)
        c = task(b)
        gs.add(c)
        gs.fail(a, ValueError("x"))
        assert b.state == READY and c.state == PENDING


@st.composite
def dags(draw: st.DrawFn) -> tuple[list[list[int]], set[int]]:
    """A random DAG (each node's inputs come before it) and a set of nodes that fail."""
    n = draw(st.integers(1, 40))
    edges = [
        sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=4)))) if i else []
        for i in range(n)
    ]
    failing = set(draw(st.lists(st.integers(0, n - 1), max_size=3)))
    return edges, failing


class TestRandomGraphs:
    @settings(max_examples=200, deadline=None)
    @given(dags(), st.integers(0, 2**32 - 1))
    def test_any_execution_order_reaches_the_same_end(
        self, dag: tuple[list[list[int]], set[int]], seed: int
    ) -> None:
        """Running any READY task in any order: a task is READY only after all its inputs are
        DONE, every task ends, and exactly the failing tasks' descendants end FAILED."""
        edges, failing = dag
        tasks: list[Task] = []
        for ins in edges:
            t = task(*(tasks[i] for i in ins))
            gs.add(t)
            tasks.append(t)
        rng = random.Random(seed)
        ready = [t for t in tasks if t.state == READY]
        index = {id(t): i for i, t in enumerate(tasks)}
        while ready:
            t = ready.pop(rng.randrange(len(ready)))
            if t.state != READY:
                continue
            i = index[id(t)]
            assert all(tasks[j].state == DONE for j in edges[i])
            if i in failing:
                gs.start(t)
                gs.fail(t, ValueError(str(i)))
                continue
            ready.extend(run(t, i))
        descendants: set[int] = set()
        for i, ins in enumerate(edges):
            if i in failing or descendants & set(ins):
                descendants.add(i)
        for i, t in enumerate(tasks):
            if i in descendants:
                assert t.state == FAILED, (i, t)
            else:
                assert t.state == DONE and t.value == i, (i, t)
