"""The core runtime: fork/wait semantics, errors, cancellation, ownership, contextvars."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import queue
import threading
import time
from typing import Any

import anyio
import numpy as np
import pytest

import dataflow
from dataflow import (
    CancelledTaskError,
    Cost,
    DataflowError,
    NoRuntimeError,
    NotReadyError,
    TaskError,
    UnobservedTaskError,
)
from dataflow._task import RUNNING
from tests._helpers import (
    Arr,
    Spec,
    add,
    boom,
    fail_after,
    gated,
    neg_inline,
    neg_pool,
    sleep_op,
    where_run,
)


def foo(x: Any) -> Any:
    return neg_inline(x)


async def afoo(x: Any) -> Any:
    return -x


class TestSeedExamples:
    def test_fork_one_negation(self, loop: str) -> None:
        """The tutorial's first example returns two equal negated arrays."""

        async def example(x: Any) -> Any:
            future = dataflow.fork(foo, x)
            x_normal = foo(x)
            x_parallel = await dataflow.wait(future)
            return x_normal, x_parallel

        a, b = dataflow.run(example, np.ones(1), loop=loop)
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
        np.testing.assert_array_equal(a, [-1.0])
        np.testing.assert_array_equal(b, [-1.0])

    def test_hundred_forks_sum(self, loop: str) -> None:
        """100 forks in a loop sum to -100, as in the tutorial."""

        async def example(x: Any) -> Any:
            futures = [dataflow.fork(foo, x) for _ in range(100)]
            results = [await dataflow.wait(f) for f in futures]
            total = 0.0
            for r in results:
                total += float((await r)[()])
            return total

        assert dataflow.run(example, np.ones(()), loop=loop) == -100.0


class TestRunValue:
    def test_the_value_is_not_formatted(self) -> None:
        # asyncio.Runner, restoring SIGINT's handler, formats its main task's repr (result
        # included) when the handler it replaces is not one of signal's enums: a model's
        # output array took ~1 ms to format on every run. The value goes out boxed.
        formatted = []

        class Output:
            def __repr__(self) -> str:
                formatted.append(True)
                return "Output()"

        async def main() -> Output:
            return Output()

        # (The runner hooks SIGINT in the main thread only: this test must run there.)
        assert threading.current_thread() is threading.main_thread()
        assert type(dataflow.run(main)) is Output
        assert type(dataflow.run(main, loop="asyncio")) is Output
        assert formatted == []


class TestFork:
    def test_async_function_runs_on_loop(self, loop: str) -> None:
        """An async function is forked as a task on the event loop thread."""

        async def where() -> str:
            return threading.current_thread().name

        async def main() -> Any:
            return await dataflow.fork(where), threading.current_thread().name

        child, parent = dataflow.run(main, loop=loop)
        assert child == parent

    def test_plain_function_runs_on_pool(self, loop: str) -> None:
        """A plain function runs on an inter-op pool thread."""

        def where() -> str:
            return threading.current_thread().name

        async def main() -> str:
            return await dataflow.fork(where)

        assert dataflow.run(main, loop=loop).startswith("interop-")

    def test_callable_object(self, loop: str) -> None:
        """A callable object whose __call__ is async is forked like an async function."""

        class Model:
            async def __call__(self, x: int) -> int:
                return x * 2

        async def main() -> int:
            return await dataflow.fork(Model(), 21)

        assert dataflow.run(main, loop=loop) == 42

    def test_every_kind_of_callable_runs_where_its_kind_says(self, loop: str) -> None:
        """Plain functions and lambdas (the fast path: their code's flags), and bound methods,
        partials and callable objects (inspect's checks): async ones run on the loop, plain
        ones on the pool; a partial of an async function is async."""

        async def a_async(x: int) -> tuple[int, str]:
            return x, threading.current_thread().name

        def a_plain(x: int) -> tuple[int, str]:
            return x, threading.current_thread().name

        class Holder:
            async def method_async(self, x: int) -> tuple[int, str]:
                return await a_async(x)

            def method_plain(self, x: int) -> tuple[int, str]:
                return a_plain(x)

        h = Holder()
        calls: list[Any] = [
            a_async,
            a_plain,
            lambda x: a_plain(x),
            h.method_async,
            h.method_plain,
            functools.partial(a_async),
            functools.partial(a_plain),
        ]

        async def main() -> tuple[str, list[tuple[int, str]]]:
            got = [await dataflow.fork(fn, i) for i, fn in enumerate(calls)]
            return threading.current_thread().name, got

        here, got = dataflow.run(main, loop=loop)
        assert [i for i, _ in got] == list(range(len(calls)))
        on_loop = [where == here for _, where in got]
        assert on_loop == [True, False, False, True, False, True, False]

    @pytest.mark.skipif(
        not hasattr(inspect, "markcoroutinefunction"), reason="Python 3.12's marker"
    )
    def test_a_function_marked_as_a_coroutine_function_is_forked_on_the_loop(
        self, loop: str
    ) -> None:
        """A plain function marked with inspect.markcoroutinefunction (it returns an
        awaitable) is forked as a coroutine function, as inspect says it is one."""

        async def inner() -> str:
            return threading.current_thread().name

        def marked() -> Any:
            return inner()

        inspect.markcoroutinefunction(marked)  # type: ignore[attr-defined]

        async def main() -> tuple[str, str]:
            return threading.current_thread().name, await dataflow.fork(marked)

        here, there = dataflow.run(main, loop=loop)
        assert here == there

    def test_kwargs_and_returns_at_once(self, loop: str) -> None:
        """fork passes kwargs and returns before the task ran."""

        def f(a: int, *, b: int) -> int:
            return a + b

        async def main() -> Any:
            fut = dataflow.fork(f, 1, b=2)
            assert isinstance(fut, dataflow.Future)
            return await fut

        assert dataflow.run(main, loop=loop) == 3

    def test_pending_arguments_are_resolved(self, loop: str) -> None:
        """A plain function forked with pending values receives their arrays."""

        def total(xs: list[Any]) -> float:
            assert all(isinstance(x, np.ndarray) for x in xs)
            return float(sum(np.sum(x) for x in xs))

        async def main() -> float:
            x = np.arange(4.0)
            parts = [sleep_op(x, 0.01), neg_pool(x)]
            return await dataflow.fork(total, parts)

        assert dataflow.run(main, loop=loop) == 0.0

    def test_nested_forks_one_thread(self, loop: str) -> None:
        """1,000 nested forks complete with one inter-op thread: wait never blocks a thread."""

        async def nested(n: int) -> int:
            if n == 0:
                return 0
            return 1 + await dataflow.wait(dataflow.fork(nested, n - 1))

        assert dataflow.run(nested, 1000, interop_threads=1, loop=loop) == 1000


class TestFuture:
    def test_methods_and_repr(self, loop: str) -> None:
        """done/result/exception/repr behave like asyncio's, with NotReadyError when not done."""

        async def main() -> None:
            gate = asyncio.Event()

            async def slow() -> int:
                await gate.wait()
                return 5

            fut = dataflow.fork(slow)
            assert not fut.done()
            assert "running" in repr(fut) and "slow" in repr(fut)
            with pytest.raises(NotReadyError, match="await"):
                fut.result()
            with pytest.raises(NotReadyError):
                fut.exception()
            gate.set()
            assert await fut == 5
            assert fut.done() and fut.result() == 5 and fut.exception() is None
            assert "done" in repr(fut)

        dataflow.run(main, loop=loop)

    def test_pending_result_not_ready(self, loop: str) -> None:
        """A pending graph value's result() raises NotReadyError telling to await it."""

        async def main() -> None:
            t = sleep_op(np.ones(2), 0.05)
            with pytest.raises(NotReadyError, match="await"):
                t.result()
            assert "sleep#" in repr(t)
            await t
            assert t.done()

        dataflow.run(main, loop=loop)

    def test_not_ready_says_where_the_task_stands(self, loop: str) -> None:
        """result() and exception() say whether a task runs, is queued, or waits for inputs
        (a queued task is not "still ready")."""

        async def main() -> None:
            gate = threading.Event()
            running = gated(np.ones(2), gate)  # holds the one pool thread
            queued = gated(np.ones(2), gate)
            waiting = add(running, running)
            while running.task.state != RUNNING:
                await asyncio.sleep(0.001)
            try:
                for handle, text in [
                    (running, f"{running.task.name} is still running: `await` it"),
                    (queued, f"{queued.task.name} is queued and has not run yet: `await` it"),
                    (
                        waiting,
                        f"{waiting.task.name} is waiting for its input {running.task.name} "
                        "and has not run yet: `await` it",
                    ),
                ]:
                    with pytest.raises(NotReadyError) as info:
                        handle.result()
                    assert str(info.value).startswith(text)
                    with pytest.raises(NotReadyError, match="await it first"):
                        handle.exception()
            finally:
                gate.set()
            await waiting
            await queued

        dataflow.run(main, interop_threads=1, loop=loop)

    def test_cancel_queued_plain_fork(self, loop: str) -> None:
        """cancel() of a queued plain-function fork stops it from running."""
        ran: list[int] = []

        def work(i: int) -> int:
            ran.append(i)
            return i

        async def main() -> None:
            blocker = sleep_op(np.ones(1), 0.1)
            fut = dataflow.fork(work, blocker)  # waits for blocker, so still pending
            assert fut.cancel()
            with pytest.raises(CancelledTaskError):
                await fut
            assert not fut.cancel()

        dataflow.run(main, interop_threads=1, loop=loop)
        assert ran == []


class TestErrors:
    def test_fork_error_names_task_and_chains(self, loop: str) -> None:
        """A forked task's exception is re-raised by wait, task named, original chained."""

        async def bad(x: int) -> int:
            raise KeyError(f"missing {x}")

        async def main() -> None:
            fut = dataflow.fork(bad, 3)
            with pytest.raises(TaskError, match=r"bad#\d+ failed: KeyError") as info:
                await dataflow.wait(fut)
            assert isinstance(info.value.__cause__, KeyError)
            assert fut.exception() is info.value

        dataflow.run(main, loop=loop)

    def test_plain_fork_error(self, loop: str) -> None:
        """A plain function's exception is raised by wait with its name and cause."""

        def bad() -> None:
            raise ZeroDivisionError("nope")

        async def main() -> None:
            with pytest.raises(TaskError, match="bad#") as info:
                await dataflow.fork(bad)
            assert isinstance(info.value.__cause__, ZeroDivisionError)

        dataflow.run(main, loop=loop)

    def test_kernel_error_fails_dependents_not_others(self, loop: str) -> None:
        """A failing kernel fails every dependent with its error; independent work completes."""

        async def main() -> None:
            x = np.arange(3.0)
            bad = boom(x)
            dep1 = neg_pool(bad)
            dep2 = add(dep1, x)
            ok = add(neg_pool(x), x)
            np.testing.assert_array_equal(await ok, np.zeros(3))
            for t in (bad, dep1, dep2):
                with pytest.raises(TaskError, match=r"boom#\d+ failed: ValueError: boom") as info:
                    await t
                assert isinstance(info.value.__cause__, ValueError)

        dataflow.run(main, loop=loop)

    def test_unawaited_failure_is_not_lost(self, loop: str) -> None:
        """A forked task that fails and is never awaited makes run() raise at the end."""

        async def bad() -> None:
            raise RuntimeError("lost?")

        async def main() -> int:
            dataflow.fork(bad)
            return 1

        with pytest.raises(UnobservedTaskError, match="bad#") as info:
            dataflow.run(main, loop=loop)
        assert isinstance(info.value.__cause__, TaskError)

    @pytest.mark.parametrize("exc", [SystemExit(5), KeyboardInterrupt()], ids=repr)
    def test_a_fork_that_stops_the_program_is_reported_once(
        self, exc: BaseException, loop: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A fork raising SystemExit or KeyboardInterrupt stops dataflow.run with it, and
        that is all: it was logged again as a failure nobody awaited, and asyncio logged
        "Task exception was never retrieved" with its traceback once the task was freed."""
        import gc

        from structlog.testing import capture_logs

        async def stop() -> None:
            raise exc

        async def main() -> None:
            dataflow.fork(stop)
            await asyncio.sleep(30)

        with capture_logs() as logs, pytest.raises(type(exc)):
            dataflow.run(main, loop=loop)
        gc.collect()  # (the finished task's finalizer, where asyncio logs what was left)
        assert logs == []
        assert "never retrieved" not in caplog.text

    @pytest.mark.parametrize("exc", [SystemExit(5), KeyboardInterrupt()], ids=repr)
    def test_a_fork_whose_task_group_was_stopped_stops_the_program(
        self, exc: BaseException, loop: str
    ) -> None:
        """Ctrl-C (or SystemExit) in a task of a task group inside a fork: the group raises
        an exception group holding it, and the program stops with the interrupt itself. The
        group became the fork's TaskError, which an `except Exception` could catch, and
        nothing stopped the program."""

        async def stop() -> None:
            raise BaseExceptionGroup("a task group in the fork", [ValueError("other"), exc])

        async def main() -> None:
            with contextlib.suppress(Exception):
                await dataflow.fork(stop)
            await asyncio.sleep(0.5)

        with pytest.raises(type(exc)):
            dataflow.run(main, loop=loop)

    def test_unawaited_task_runs_to_end(self, loop: str) -> None:
        """A forked task nobody waits for still runs to the end before run() returns."""
        done: list[str] = []

        async def later() -> None:
            await asyncio.sleep(0.05)
            done.append("async")

        def plain() -> None:
            done.append("plain")

        async def main() -> None:
            dataflow.fork(later)
            dataflow.fork(plain)

        dataflow.run(main, loop=loop)
        assert sorted(done) == ["async", "plain"]

    def test_fork_coroutine_object_teaches(self) -> None:
        """fork(f(x)) raises a TypeError that shows fork(f, x)."""

        async def main() -> None:
            with pytest.raises(TypeError, match=r"you want fork\(afoo, x\)"):
                dataflow.fork(afoo(1))  # type: ignore[call-overload]

        dataflow.run(main)

    def test_fork_non_callable(self) -> None:
        """fork(42) names what it got."""

        async def main() -> None:
            with pytest.raises(TypeError, match=r"callable.*int: 42"):
                dataflow.fork(42)  # type: ignore[call-overload]

        dataflow.run(main)

    def test_wait_foreign_object(self) -> None:
        """wait(42) raises a TypeError naming what it got."""

        async def main() -> None:
            with pytest.raises(TypeError, match="got int: 42"):
                await dataflow.wait(42)  # type: ignore[arg-type]

        dataflow.run(main)

    def test_fork_outside_runtime(self) -> None:
        """fork outside a runtime says how to start one."""
        with pytest.raises(NoRuntimeError, match=r"dataflow\.run\(main\)"):
            dataflow.fork(foo, 1)

    def test_run_coroutine_object(self) -> None:
        """run(main()) raises a TypeError that shows run(main)."""
        with pytest.raises(TypeError, match=r"you want dataflow\.run\(afoo, \.\.\.\)"):
            dataflow.run(afoo(1))  # type: ignore[call-overload]

    @pytest.mark.asyncio
    async def test_run_inside_running_loop(self) -> None:
        """run() inside a running loop is refused with advice to use Runtime."""
        with pytest.raises(DataflowError, match="Runtime"):
            dataflow.run(afoo, 1)


class TestCancellation:
    def test_cancel_cancels_forked_children(self, loop: str) -> None:
        """Cancelling a task cancels the tasks it forked that are still running."""
        cancelled: list[str] = []

        async def child() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled.append("child")
                raise

        async def parent() -> None:
            dataflow.fork(child)
            await asyncio.sleep(10)

        async def main() -> None:
            p = dataflow.fork(parent)
            await asyncio.sleep(0.02)
            p.cancel()
            with pytest.raises(CancelledTaskError):
                await p
            await asyncio.sleep(0.01)

        dataflow.run(main, loop=loop)
        assert cancelled == ["child"]

    @pytest.mark.asyncio
    async def test_a_deadline_that_expires_while_the_exit_waits_for_forks(self) -> None:
        """An asyncio.timeout around the block that expires after the body ended, while the
        exit waits for a fork, cancels the fork and waits for it: the runtime closes with
        nothing left running, and TimeoutError comes out. The exit stopped waiting and the
        runtime closed with the fork still running (anyio's shield does not stop asyncio's
        own cancellation), and it ran on afterwards."""
        states: list[str] = []

        async def child() -> None:
            try:
                await asyncio.sleep(10)
                states.append("finished")
            except asyncio.CancelledError:
                states.append("cancelled")
                raise

        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                async with dataflow.Runtime(interop_threads=1) as rt:
                    dataflow.fork(child)  # the body ends at once: the exit waits for it
        assert rt._closed and states == ["cancelled"]
        assert not rt.host.tasks  # type: ignore[union-attr]

    @pytest.mark.asyncio
    async def test_runtime_exit_on_error_cancels_everything(self) -> None:
        """When the body raises, forked tasks are cancelled and queued kernels never run."""
        ran: list[int] = []

        def record(x: Any) -> None:
            ran.append(1)

        async def forever() -> None:
            await asyncio.sleep(100)

        with pytest.raises(ZeroDivisionError):
            async with dataflow.Runtime(interop_threads=1):
                first = sleep_op(np.ones(1), 0.05)
                for _ in range(20):
                    dataflow.fork(record, first)
                dataflow.fork(forever)
                raise ZeroDivisionError
        assert ran == []
        assert not [t for t in threading.enumerate() if t.name.startswith("interop")]

    @pytest.mark.asyncio
    async def test_outer_cancel_joins_threads(self) -> None:
        """Cancelling the task that holds a Runtime still joins the pool threads."""

        async def body() -> None:
            async with dataflow.Runtime(interop_threads=2):
                sleep_op(np.ones(1), 0.05)
                await asyncio.sleep(100)

        task = asyncio.ensure_future(body())
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not [t for t in threading.enumerate() if t.name.startswith("interop")]


def _cancel_and_hold(fut: Any, release: threading.Event) -> bool:
    said = bool(fut.cancel())
    release.wait(10)  # (no wake-up of the loop from this thread meanwhile)
    return said


class TestCancelFromAnotherThread:
    @pytest.mark.timeout(60)
    def test_a_plain_fork_cancels_a_running_async_fork(self, loop: str) -> None:
        """A running fork's future cancelled from a pool thread (a plain fork): the loop
        cancels it at once. Task.cancel() was called on that thread, which asyncio does not
        allow: the loop, asleep, noticed only at its next wake-up (here, the plain fork's
        end, which waits until the program has seen the cancellation)."""
        release = threading.Event()

        async def sleeper() -> str:
            await asyncio.sleep(20)
            return "slept"

        async def main() -> tuple[bool, bool]:
            f = dataflow.fork(sleeper)
            await asyncio.sleep(0.01)  # it sleeps
            timer = threading.Timer(5, release.set)  # (the old code: noticed after this)
            timer.start()
            c = dataflow.fork(_cancel_and_hold, f, release)
            with pytest.raises(CancelledTaskError):
                await f
            seen_first = not release.is_set()
            timer.cancel()
            release.set()
            return seen_first, await c

        assert dataflow.run(main, interop_threads=1, loop=loop) == (True, True)


class TestContextVars:
    def test_visible_in_tasks_and_threads(self, loop: str) -> None:
        """contextvars set by the caller are seen by forked coroutines and pool threads."""
        var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

        async def in_task() -> str:
            return var.get()

        def in_thread() -> tuple[str, str]:
            return var.get(), threading.current_thread().name

        async def main() -> Any:
            var.set("request-7")
            return await dataflow.fork(in_task), await dataflow.fork(in_thread)

        a, (b, thread) = dataflow.run(main, loop=loop)
        assert a == b == "request-7"
        assert thread.startswith("interop-")


class TestPools:
    @pytest.mark.asyncio
    async def test_runtimes_share_one_pool(self) -> None:
        """Two runtimes in one process share the inter-op pool by default."""
        async with (
            dataflow.Runtime(interop_threads=2) as a,
            dataflow.Runtime(interop_threads=2) as b,
        ):
            assert a._pool is b._pool
            assert len([t for t in threading.enumerate() if t.name.startswith("interop")]) == 2

    @pytest.mark.asyncio
    async def test_private_pool(self) -> None:
        """A runtime may ask for a private pool; a size clash on the shared one is explained."""
        async with dataflow.Runtime(interop_threads=2) as a:
            async with dataflow.Runtime(interop_threads=1, private_pool=True) as b:
                assert a._pool is not b._pool
                t = where_run(np.ones(1))
                assert (await t).startswith("interop-p")
            with pytest.raises(dataflow.DataflowRuntimeError, match="private_pool=True"):
                async with dataflow.Runtime(interop_threads=3):
                    pass

    def test_the_way_to_a_pool_of_its_own_fits_what_was_called(self) -> None:
        """The errors that name private_pool=True say how dataflow.run gets one (it has no
        such option), and a synchronous-mode runtime in a kernel is told that it needs
        threads: it was told to take private_pool=True, which it had."""

        async def nothing() -> None:
            pass

        def run_in_kernel() -> None:
            dataflow.run(nothing)

        def sync_runtime_in_kernel() -> None:
            async def body() -> None:
                async with dataflow.Runtime(interop_threads=0, private_pool=True):
                    pass

            asyncio.run(body())

        def other_size() -> None:
            dataflow.run(nothing, interop_threads=1)

        async def main() -> list[str]:
            out = []
            for fn in (run_in_kernel, sync_runtime_in_kernel):
                with pytest.raises(dataflow.TaskError) as info:
                    await dataflow.fork(fn)
                out.append(str(info.value.__cause__))
            with pytest.raises(dataflow.DataflowRuntimeError) as clash:
                await asyncio.to_thread(other_size)
            return [*out, str(clash.value)]

        in_kernel, sync, clash = dataflow.run(main, interop_threads=2)
        for message in (in_kernel, clash):
            assert "Runtime(private_pool=True); dataflow.run has no such option: asyncio.run" in (
                message
            )
        assert "with interop_threads=1 or more" in sync
        assert "give this Runtime private_pool=True" not in sync

    @pytest.mark.asyncio
    @pytest.mark.parametrize("private", [False, True])
    async def test_a_thread_the_system_refuses_leaves_no_pool_behind(
        self, private: bool, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The pool's third thread cannot start (the process's thread limit): the two
        started stop, and the error says what failed. They stayed parked for good, the
        shared pool's bookkeeping kept the half-made pool, and the error was a bare
        RuntimeError."""
        from dataflow import _pool

        start = threading.Thread.start
        started = 0

        def refuse_third(thread: threading.Thread) -> None:
            nonlocal started
            if thread.name.startswith("interop"):
                started += 1
                if started == 3:
                    raise RuntimeError("can't start new thread")
            start(thread)

        monkeypatch.setattr(threading.Thread, "start", refuse_third)
        with pytest.raises(dataflow.DataflowRuntimeError, match=r"thread 3 of 4 .*can't start"):
            async with dataflow.Runtime(interop_threads=4, private_pool=private):
                pass
        assert _pool._shared is None and _pool._shared_users == 0
        monkeypatch.undo()
        async with dataflow.Runtime(interop_threads=2) as rt:  # the next one opens as usual
            assert (await where_run(np.ones(1))).startswith("interop-")
        assert "closed" in repr(rt)

    @pytest.mark.asyncio
    async def test_a_failure_while_opening_releases_the_shared_pool(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Whatever raises once the runtime holds the shared pool (Ctrl-C under trio lands
        anywhere) releases it: its threads ran on, and a later runtime of another size was
        refused as if the pool were in use."""
        from dataflow import _pool, _runtime

        def interrupted(*args: Any, **kwargs: Any) -> Any:
            raise KeyboardInterrupt

        monkeypatch.setattr(_runtime, "Scheduler", interrupted)
        with pytest.raises(KeyboardInterrupt):
            async with dataflow.Runtime(interop_threads=2):
                pass
        assert _pool._shared is None and _pool._shared_users == 0
        monkeypatch.undo()
        async with dataflow.Runtime(interop_threads=3):  # another size: no pool is running
            assert (await where_run(np.ones(1))).startswith("interop-")

    @pytest.mark.asyncio
    async def test_repr(self) -> None:
        """The runtime's repr shows its settings and counters."""
        async with dataflow.Runtime(interop_threads=2, intraop_threads=1) as rt:
            r = repr(rt)
            assert "interop=2" in r and "intraop=1" in r and "queued=" in r
            assert dataflow.current_runtime() is rt
        assert dataflow.current_runtime() is None
        assert "closed" in repr(rt)


class TestMemory:
    def test_a_closed_runtime_is_not_held_by_the_task_that_entered_it(self) -> None:
        """A long-lived task (a server's, or a script's main) that enters and leaves
        runtimes does not keep them: each one's end callback on the task, with the context
        that named the runtime, held it (and its pool, scheduler and caches) until the task
        ended; five runtimes in a row were all alive."""
        import gc
        import weakref

        import ops

        refs: list[weakref.ref[dataflow.Runtime]] = []

        async def main() -> int:
            for _ in range(3):
                async with dataflow.Runtime() as rt:
                    y = ops.tanh(np.ones(300_000))  # deferred: the task is a request
                    f = dataflow.fork(ops.exp, np.ones(3))
                    await y
                    await f
                    refs.append(weakref.ref(rt))
                del rt, y, f
            # (a wake-up a runtime posted may still wait in the loop's queue, with the
            # context that named it, until the loop runs it: let it run)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            gc.collect()
            return sum(r() is not None for r in refs)

        assert asyncio.run(main()) == 0

    def test_intermediate_released_after_last_consumer(self, loop: str) -> None:
        """An intermediate value is freed once its last consumer ran and no handle holds it."""
        import gc
        import weakref

        class Box:
            pass

        refs: list[weakref.ref[Box]] = []

        def make(x: Any) -> Box:
            b = Box()
            refs.append(weakref.ref(b))
            return b

        def consume(b: Box) -> int:
            return 1

        async def main() -> int:
            inter = dataflow.fork(make, 0)
            out = dataflow.fork(consume, inter)
            del inter
            result = await out
            gc.collect()
            assert refs[0]() is None
            return result

        assert dataflow.run(main, loop=loop) == 1

    @pytest.mark.parametrize("interop", [1, 2])
    def test_a_chain_on_a_worker_frees_each_value_after_its_last_reader(
        self, loop: str, interop: int
    ) -> None:
        """A worker goes on with the op its task made ready; the first op's output is freed
        once the second has run, before the third starts (the worker's own frame kept it to
        the chain's end: one array more than numpy at the peak of ``tanh(x * y + 1)``)."""
        import weakref

        refs: list[weakref.ref[np.ndarray]] = []
        alive: list[bool] = []

        def first(x: Any) -> Any:
            out = np.asarray(x) + 1.0
            refs.append(weakref.ref(out))
            return out

        def second(x: Any) -> Any:
            return x + 1.0

        def third(x: Any) -> Any:
            alive.append(refs[-1]() is not None)
            return x + 1.0

        spec = lambda x: Spec(np.shape(x), np.dtype(np.float64))  # noqa: E731
        ops_ = [
            dataflow.op(f.__name__, meta=spec, handle=Arr, inline=False)(f)
            for f in (first, second, third)
        ]

        async def main() -> float:
            y = ops_[2](ops_[1](ops_[0](np.zeros(3))))
            return float((await y)[0])

        assert dataflow.run(main, loop=loop, interop_threads=interop) == 3.0
        assert alive == [False]

    def test_a_finished_fork_keeps_its_outcome_not_its_task(self, loop: str) -> None:
        """A forked async function's future, kept after it finished, holds its value and lets
        go of what ran it (the loop's task, and with it the context the task ran in and
        what its context variables held) without waiting for the garbage collector."""
        import gc
        import weakref

        class Box:
            pass

        refs: list[weakref.ref[Box]] = []
        var: contextvars.ContextVar[Box | None] = contextvars.ContextVar("box", default=None)

        async def work() -> int:
            box = Box()
            refs.append(weakref.ref(box))
            var.set(box)  # in the forked task's own context
            del box
            await anyio.sleep(0)
            return 7

        async def main() -> int:
            fut = dataflow.fork(work)
            value = await fut
            for _ in range(3):  # the loop's own callbacks for the finished task
                await anyio.sleep(0)
            assert refs[0]() is None
            assert fut.result() == value
            return value

        gc.disable()
        try:
            assert dataflow.run(main, loop=loop) == 7
        finally:
            gc.enable()


class TestFailuresKept:
    @pytest.mark.asyncio
    async def test_a_long_lived_runtime_lets_go_of_handled_failures(self) -> None:
        """A server's requests that fail and handle their error: the runtime kept every
        error, its traceback and the arrays its frames held, for its whole life."""
        import gc
        import weakref

        first: list[Any] = []
        async with dataflow.Runtime(interop_threads=2) as rt:
            for i in range(300):
                x = np.ones(3)
                if i == 0:
                    first.append(weakref.ref(x))
                with pytest.raises(ValueError):
                    await boom(x)
            del x
            gc.collect()
            assert first[0]() is None
            assert len(rt.failures) < 64

    def test_every_unobserved_failure_is_still_reported(self, loop: str) -> None:
        """Letting go of the observed failures keeps every unobserved one for the exit."""

        async def main() -> None:
            for _ in range(100):
                boom(np.ones(2))  # never awaited
                with pytest.raises(ValueError):
                    await boom(np.ones(2))

        with pytest.raises(UnobservedTaskError) as info:
            dataflow.run(main, loop=loop)
        assert len(info.value.errors) == 100
        assert all(not e.observed for e in info.value.errors)  # type: ignore[attr-defined]

    def test_unobserved_failures_let_go_of_their_inputs(self, loop: str) -> None:
        """Fire-and-forget ops that fail: each failure is kept for the exit's report, but not
        the arrays its kernel was given. Their frames kept every input to the end (1 MiB
        more per failed op of 1 MiB)."""
        import gc
        import traceback
        import weakref

        from dataflow._scheduler._base import Failures

        refs: list[weakref.ref[np.ndarray[Any, Any]]] = []

        async def main() -> None:
            rt = dataflow.current_runtime()
            assert rt is not None
            for _ in range(200):
                x = np.ones(1 << 14)  # 128 KiB: frozen, not copied (the kernel gets x)
                refs.append(weakref.ref(x))
                boom(x)  # never awaited
                del x
            while rt._inflight:
                await anyio.sleep(0.001)
            gc.collect()
            alive = sum(r() is not None for r in refs)
            assert alive <= Failures.DROP_EVERY + 1, alive

        with pytest.raises(UnobservedTaskError) as info:
            dataflow.run(main, loop=loop)
        assert len(info.value.errors) == 200
        report = "".join(traceback.format_exception(info.value))
        assert "_boom_kernel" in report  # the chained traceback is whole


class TestChildrenKept:
    def test_a_long_lived_fork_lets_go_of_finished_children(self, loop: str) -> None:
        """A forked coroutine that forks and awaits children one after another (a pipeline
        stage) kept every child's future and value while it ran: 2 MiB more a pair here."""
        import gc
        import weakref

        firsts: list[Any] = []

        async def item() -> Any:
            return np.ones(1000)

        def plain() -> Any:
            return np.ones(1000)

        async def stage() -> bool:
            for i in range(200):
                a = await dataflow.fork(item)
                b = await dataflow.fork(plain)
                if i == 0:
                    firsts.extend([weakref.ref(a), weakref.ref(b)])
                del a, b
            gc.collect()
            return all(r() is None for r in firsts)

        async def main() -> bool:
            return await dataflow.fork(stage)

        assert dataflow.run(main, loop=loop)

    def test_running_children_are_still_cancelled_with_their_parent(self, loop: str) -> None:
        """Letting go of finished children keeps the running ones for a cancellation."""
        cancelled: list[int] = []

        async def quick() -> None:
            pass

        async def slow(i: int) -> None:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(i)
                raise

        async def parent() -> None:
            for i in range(300):
                await dataflow.fork(quick)
                if i % 30 == 0:
                    dataflow.fork(slow, i)
            await asyncio.sleep(30)

        async def main() -> None:
            p = dataflow.fork(parent)
            await asyncio.sleep(0.05)
            p.cancel()
            with pytest.raises(CancelledTaskError):
                await p

        dataflow.run(main, loop=loop)
        assert sorted(cancelled) == list(range(0, 300, 30))


class TestLoopRuntime:
    @pytest.mark.asyncio
    async def test_tasks_outside_the_context_find_the_loops_runtime(self) -> None:
        """A task created outside the Runtime's context (a server handler) still finds it."""
        outside = contextvars.Context()  # an empty context: no runtime variable set

        async def handler() -> Any:
            assert dataflow.current_runtime() is rt
            x = np.arange(3.0)
            return await dataflow.fork(lambda a: a * 2, neg_pool(x))

        async with dataflow.Runtime(interop_threads=2) as rt:
            task = asyncio.get_running_loop().create_task(handler(), context=outside)
            np.testing.assert_array_equal(await task, [0.0, -2.0, -4.0])
        assert dataflow.current_runtime() is None

    @pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
    def test_the_bound_current_task_getter_is_asyncio_current_task(self, loop_name: str) -> None:
        """The scheduler's getter of the request (bound once to the loop, a C call) reads what
        asyncio.current_task reads: the task in a coroutine, None in a plain callback."""
        from dataflow._loop import AsyncioLoop

        async def main() -> None:
            loop = asyncio.get_running_loop()
            get = AsyncioLoop(loop).current_task_getter()
            assert get() is asyncio.current_task() is not None
            other = loop.create_task(asyncio.sleep(0, result=None))
            seen: list[Any] = []

            async def inner() -> None:
                seen.append(get())

            t = loop.create_task(inner())
            await t
            assert seen == [t]
            fut = loop.create_future()
            loop.call_soon(lambda: fut.set_result(get()))
            assert await fut is None
            await other

        dataflow.run(main, loop=loop_name)

    def test_threads_without_a_loop_find_none(self) -> None:
        """Off the loop, with no inherited context, there is no runtime."""
        found: list[object] = []

        async def main() -> None:
            t = threading.Thread(target=lambda: found.append(dataflow.current_runtime()))
            t.start()
            t.join()

        dataflow.run(main)
        assert found == [None]


class TestCrossRuntime:
    """A task of one runtime depending on a task of another: each accounts for its own."""

    @pytest.mark.asyncio
    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("private", [True, False])
    async def test_failure_crossing_nested_runtimes(self, private: bool) -> None:
        """An input failing in runtime A fails B's dependent; both exit, neither hangs."""
        gate = threading.Event()
        async with dataflow.Runtime(private_pool=private) as a:
            bad = fail_after(np.ones(3), gate)
            async with dataflow.Runtime(private_pool=private) as b:
                y = add(bad, 1.0)
                assert y.task.runtime is b
                gate.set()
                with pytest.raises(TaskError, match="boom after the gate"):
                    await asyncio.wait_for(y, 10)
                assert b._inflight == 0
            with pytest.raises(TaskError):
                await bad
            assert a._inflight == 0

    @pytest.mark.asyncio
    @pytest.mark.timeout(30)
    async def test_success_crossing_private_pools(self) -> None:
        """A dependent in another runtime's private pool runs there once its input is done."""
        gate = threading.Event()
        async with dataflow.Runtime(private_pool=True):
            slow = gated(np.full(3, 2.0), gate)
            async with dataflow.Runtime(private_pool=True) as b:
                y = where_run(add(slow, 1.0))
                gate.set()
                name = await asyncio.wait_for(y, 10)
                assert name.startswith(f"interop-p{id(b) & 0xFFFF:x}")

    @pytest.mark.timeout(30)
    def test_failure_crossing_runtimes_in_two_threads(self) -> None:
        """Runtime B (another thread, another loop) is woken when A's input fails."""
        gate = threading.Event()
        handoff: queue.SimpleQueue[Any] = queue.SimpleQueue()
        got: list[str] = []

        async def body_a() -> None:
            bad = fail_after(np.ones(3), gate)
            handoff.put(bad)
            with pytest.raises(TaskError):
                await bad

        async def body_b() -> None:
            bad = handoff.get(timeout=10)
            y = add(bad, 1.0)
            gate.set()
            try:
                await y
            except TaskError as exc:
                got.append(str(exc))

        t = threading.Thread(target=dataflow.run, args=(body_b,), kwargs={"interop_threads": 2})
        t.start()
        dataflow.run(body_a, interop_threads=2)
        t.join(20)
        assert not t.is_alive()
        assert got and "boom after the gate" in got[0]

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("other", ["asyncio", "trio"])
    def test_a_fork_awaited_on_another_loop_is_refused_by_name(self, other: str) -> None:
        """A running fork's future awaited on another thread's loop raises a DataflowError
        naming the task, as a pending value does; it was asyncio's bare RuntimeError about
        a future "attached to a different loop" (or trio's refusal of an asyncio future)."""
        release = threading.Event()
        got: list[BaseException] = []

        async def slow() -> int:
            await asyncio.to_thread(release.wait, 10)
            return 7

        async def elsewhere(fut: Any) -> None:
            try:
                await fut
            except BaseException as exc:
                got.append(exc)

        def await_there(fut: Any) -> None:
            if other == "trio":
                trio = pytest.importorskip("trio")
                trio.run(elsewhere, fut)
            else:
                asyncio.run(elsewhere(fut))

        async def main() -> int:
            fut = dataflow.fork(slow)
            t = threading.Thread(target=await_there, args=(fut,))
            t.start()
            await asyncio.to_thread(t.join, 10)
            release.set()
            return await fut

        assert dataflow.run(main, loop="asyncio") == 7
        assert len(got) == 1 and isinstance(got[0], DataflowError), got
        assert "slow#" in str(got[0]) and "another event loop" in str(got[0])


def _held(x: Any) -> Any:
    import time

    time.sleep(0.01)
    return x


class TestExitWhileOthersDispatch:
    def test_the_block_exits_while_other_tasks_keep_dispatching(self) -> None:
        """Tasks the block started (not forks) that keep sending ops: the exit waits for what
        is in flight, then refuses their new work with a clear error, instead of waiting for
        ever for a graph they keep filling."""
        import ops

        held = ops.define("held", _held, lambda x: ops.spec_of(x), inline=False)
        errors: list[str] = []

        async def worker() -> None:
            while True:
                try:
                    await held(np.ones(3))
                except dataflow.DataflowError as exc:
                    errors.append(str(exc))
                    return
                await asyncio.sleep(0.001)

        async def main() -> None:
            async with dataflow.Runtime(interop_threads=1):
                workers = [asyncio.create_task(worker()) for _ in range(2)]
                await asyncio.sleep(0.1)
            await asyncio.wait_for(asyncio.gather(*workers), 10)

        asyncio.run(asyncio.wait_for(main(), 20))
        assert len(errors) == 2
        # ("closing" while it drains; "closed" for a worker that dispatches again only after)
        assert all("this runtime is clos" in e for e in errors), errors

    def test_a_plain_fork_the_loop_runs_while_its_runtime_drains_may_dispatch(self) -> None:
        """A forked plain function of a draining runtime, run on the loop's thread (the loop
        helps another runtime on the shared pool under backpressure), dispatches as it would
        on a worker: its fork was refused as if a coroutine on the loop had made it."""
        gate = threading.Event()
        got: list[str] = []

        def plain(x: Any) -> None:
            try:
                dataflow.fork(np.negative, x)  # deferred: a task of the draining runtime
                got.append(threading.current_thread().name)
            except dataflow.DataflowError as exc:
                got.append(str(exc))

        async def draining() -> None:
            async with dataflow.Runtime(interop_threads=1):
                gated(np.ones(2), gate)  # the one worker waits on the gate
                dataflow.fork(plain, np.ones(2))  # queued behind it while the block exits

        async def helping() -> Any:
            async with dataflow.Runtime(interop_threads=1, max_pending=2, inline_threshold=0):
                await asyncio.sleep(0.02)  # the other runtime's block has ended: it drains
                threading.Timer(0.2, gate.set).start()
                ys = [neg_pool(np.ones(2)) for _ in range(5)]  # over max_pending: loop helps
                return [await y for y in ys]

        async def main() -> None:
            await asyncio.gather(draining(), helping())

        asyncio.run(asyncio.wait_for(main(), 20))
        assert got == [threading.current_thread().name]  # run by the loop's thread, and ok

    @pytest.mark.timeout(30)
    @pytest.mark.timeout(30)
    def test_a_fork_from_such_a_task_is_refused_as_its_ops_are(self) -> None:
        """Forking an async function from a task that outlives the block, once the block's
        own forks have finished (or after the exit), is refused like an op: it spawned a
        coroutine nobody owned, which ran on after the runtime had closed."""
        said: list[str] = []
        ran_after_close: list[int] = []
        closed = asyncio.Event()

        async def child() -> None:
            if closed.is_set():
                ran_after_close.append(1)

        async def background() -> None:
            # Its first step runs once the block's exit waits for the graph to drain (the
            # body never awaited: no forks to wait for).
            for _ in range(2):
                try:
                    await dataflow.fork(child)
                except DataflowError as exc:
                    said.append(str(exc))
                await closed.wait()

        async def main() -> None:
            async with dataflow.Runtime(interop_threads=1):
                bg = asyncio.create_task(background())
                sleep_op(np.ones(2), 0.05)  # the exit drains for it
            closed.set()
            await bg

        asyncio.run(main())
        assert ran_after_close == []
        assert len(said) == 2, said
        assert "fork(" in said[0] and "this runtime is closing" in said[0], said
        assert "this runtime is closed" in said[1], said


class TestOutOfOrderExit:
    def test_no_closed_runtime_is_current_after_exits_out_of_order(self) -> None:
        """A entered, then B, then A exits first: B's exit restored A, closed, as the
        context's runtime. It now falls back to what is open on the loop (here: none)."""

        async def main() -> tuple[Any, Any, Any]:
            a = dataflow.Runtime()
            b = dataflow.Runtime(private_pool=True)
            await a.__aenter__()
            await b.__aenter__()
            await a.__aexit__(None, None, None)
            between = dataflow.current_runtime()
            await b.__aexit__(None, None, None)
            return between, b, dataflow.current_runtime()

        between, b, after = asyncio.run(main())
        assert between is b  # (the one still open)
        assert after is None


def _stop_kernel(x: Any, exc: type[BaseException]) -> Any:
    raise exc


def _same_spec(x: Any, *_: Any) -> Spec:
    return Spec(np.shape(x), np.dtype(float))


# The same stopping kernel as an op run at dispatch, as one the loop runs when it awaits it
# (small and deferred: queued quietly, then taken by the awaiting loop), and as tiny ones a
# worker hands back to the loop.
stop_at_dispatch = dataflow.op("stop_at_dispatch", meta=_same_spec, handle=Arr, inline=True)(
    _stop_kernel
)
stop_awaited = dataflow.op(
    "stop_awaited", meta=_same_spec, handle=Arr, cost=lambda x, e: Cost(4e6)
)(_stop_kernel)
handed_stop = dataflow.op("handed_stop", meta=_same_spec, handle=Arr, cost=lambda x, e: Cost(1))(
    _stop_kernel
)
handed_neg = dataflow.op("handed_neg", meta=_same_spec, handle=Arr, cost=lambda x: Cost(1))(
    np.negative
)


class TestStoppingTheProcessOnTheLoop:
    """Ctrl-C lands on the main thread, in whatever kernel it runs: a kernel the event loop
    runs (at dispatch, or when it awaits one) that raises KeyboardInterrupt or SystemExit
    fails its task and then stops the program, as a forked coroutine's or an eager op's does;
    it was turned into a TaskError, an Exception that `except Exception` caught, so the
    program went on as if nothing had been pressed."""

    @pytest.mark.timeout(30)
    @pytest.mark.parametrize("where", ["dispatch", "awaited", "observed", "synchronous"])
    @pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
    def test_it_propagates_and_the_runtime_closes(
        self, where: str, exc: type[BaseException], loop: str
    ) -> None:
        """The interrupt comes out of dataflow.run; the runtime closed, no failure is logged
        as unobserved, and the next run works."""
        stop = stop_awaited if where == "awaited" else stop_at_dispatch
        swallowed: list[BaseException] = []

        class Hooked(dataflow.Instrument):
            def task_started(self, ts: int, task: Any) -> None:
                pass

        async def main() -> None:
            if where == "observed":  # an instrument with hooks: the full-task inline path
                rt = dataflow.current_runtime()
                assert rt is not None
                rt.add_instrument(Hooked())
            try:
                if where == "synchronous":  # a forked plain function, run at the fork
                    await dataflow.fork(_stop_kernel, np.ones(2), exc)
                else:
                    await stop(np.ones(2), exc)
            except Exception as e:  # what the interrupt must not become
                swallowed.append(e)

        threads = threading.active_count()
        interop = 0 if where == "synchronous" else 2
        with pytest.raises(exc):
            dataflow.run(main, interop_threads=interop, loop=loop)
        assert swallowed == []
        assert threading.active_count() == threads
        assert dataflow.run(afoo, 1.0, loop=loop) == -1.0

    @pytest.mark.timeout(30)
    def test_an_interrupt_on_a_pool_thread_stays_in_its_task(self, loop: str) -> None:
        """On a pool thread (a forked plain function) the task keeps it, as documented."""

        async def main() -> str:
            with pytest.raises(TaskError, match="KeyboardInterrupt"):
                await dataflow.fork(_stop_kernel, np.ones(2), KeyboardInterrupt)
            return "ok"

        assert dataflow.run(main, interop_threads=1, loop=loop) == "ok"

    @pytest.mark.asyncio
    @pytest.mark.timeout(30)
    async def test_work_handed_back_to_the_loop_is_not_lost(self) -> None:
        """Small tasks a worker handed back to the loop, left when one of them stops the
        loop's thread, go back to the pool: the runtime's exit (the body raised, so it drops
        them unrun) settles them, where it waited for ever for tasks nobody held."""
        gate = threading.Event()
        with pytest.raises(KeyboardInterrupt):
            async with dataflow.Runtime(interop_threads=1, private_pool=True) as rt:
                sched = rt._sched
                first = gated(np.ones(2), gate)
                a = handed_stop(first, KeyboardInterrupt)
                b = handed_neg(first)
                sched._loop_pending_ns = 1 << 62  # the loop "dispatches": hand them back
                gate.set()
                while len(sched._handback) < 2:  # (holding the loop, so it runs no drain)
                    time.sleep(0.001)
                sched.drain()  # a raises on this thread; b must not be lost
        assert a.done() and b.done()
        assert isinstance(b.exception(), CancelledTaskError)

    @pytest.mark.timeout(30)
    def test_an_interrupt_from_a_fork_closes_the_runtime(self, loop: str) -> None:
        """A KeyboardInterrupt a forked coroutine raises leaves dataflow.run once the
        runtime has closed: running kernels waited for, the pool's threads joined. It was
        taken for a second Ctrl-C (the loop left as it was), so the runtime stayed open
        and its pool's threads ran on after dataflow.run had returned."""
        from dataflow._pool import shared_pool_size

        done: list[int] = []

        def kernel() -> None:
            time.sleep(0.05)
            done.append(1)

        async def stop() -> None:
            await asyncio.sleep(0)
            raise KeyboardInterrupt

        async def main() -> None:
            dataflow.fork(kernel)
            dataflow.fork(stop)
            await asyncio.sleep(30)

        threads = threading.active_count()
        with pytest.raises(KeyboardInterrupt):
            dataflow.run(main, interop_threads=2, loop=loop)
        assert threading.active_count() == threads
        assert shared_pool_size() is None
        assert dataflow.current_runtime() is None
