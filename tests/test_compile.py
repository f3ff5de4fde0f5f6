"""Compiled forwards (issue #12): traced once per signature, launched whole, batched."""

from __future__ import annotations

import asyncio
import threading
import warnings
from typing import Any, ClassVar

import numpy as np
import pytest

import dataflow
import ops
from examples.lstm_ensemble import Ensemble

Array = np.ndarray[Any, Any]


async def _add(a: Any, b: Any) -> Any:
    return ops.add(a, b)


def _x(*shape: int, seed: int = 0) -> Array:
    out: Array = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return out


class Mlp(ops.nn.Module):
    def __init__(self) -> None:
        self.fc1 = ops.nn.Linear(6, 8, seed=1)
        self.fc2 = ops.nn.Linear(8, 3, seed=2)

    async def forward(self, x: Any, scale: float = 1.0) -> Any:
        h = ops.tanh(await self.fc1(x))
        return ops.multiply(await self.fc2(h), scale)


def _reference(m: Mlp, x: Array, scale: float = 1.0) -> Array:
    h = np.tanh(x @ m.fc1.weight.T + m.fc1.bias)
    out: Array = (h @ m.fc2.weight.T + m.fc2.bias) * scale
    return out


async def _all_at_once(forward: Any, xs: list[Array], return_exceptions: bool = False) -> list[Any]:
    """``forward(x)`` for every x, all started before any runs (so they may share batches)."""
    gate = asyncio.Event()

    async def call(x: Array) -> Any:
        await gate.wait()
        return await forward(x)

    calls = [asyncio.ensure_future(call(x)) for x in xs]
    await asyncio.sleep(0)
    gate.set()
    return list(await asyncio.gather(*calls, return_exceptions=return_exceptions))


class TestCompile:
    def test_gives_the_eager_results_as_arrays(self) -> None:
        """await forward(x) equals the eager model's output, as an array."""
        m = Mlp()
        forward = dataflow.compile(m)
        x = _x(4, 6)

        async def main() -> Any:
            return await forward(x)

        out = dataflow.run(main)
        assert isinstance(out, np.ndarray)
        np.testing.assert_allclose(out, _reference(m, x), rtol=1e-5, atol=1e-6)

    def test_a_0d_input_compiles(self) -> None:
        """A program of a 0-d input compiles with the trace check on (it was refused: the
        check's perturbed 0-d input was a numpy scalar, traced as a literal)."""
        forward = dataflow.compile(_add)

        async def main() -> Any:
            return await forward(np.asarray(2.0), np.ones(3))

        np.testing.assert_array_equal(dataflow.run(main), np.full(3, 3.0))

    def test_traces_once_per_signature(self) -> None:
        """Repeated calls reuse the plan; a new shape, dtype or static value compiles anew."""
        m = Mlp()
        forward = dataflow.compile(m)

        async def main() -> None:
            for seed in range(3):
                x = _x(4, 6, seed=seed)
                np.testing.assert_allclose(await forward(x), _reference(m, x), rtol=1e-5)
            assert len(forward.programs) == 1
            await forward(_x(5, 6))  # another batch size
            y = await forward(_x(5, 6), 2.0)  # a static argument's value
            np.testing.assert_allclose(y, _reference(m, _x(5, 6), 2.0), rtol=1e-5)
            assert len(forward.programs) == 3

        dataflow.run(main)

    def test_plans_are_bounded(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Past MAX_PLANS signatures the oldest plan is forgotten (it grew for good: one plan
        per new shape or static value), a RuntimeWarning says so once, and a forgotten
        signature called again is traced again and gives the right value."""
        from dataflow import _plans

        monkeypatch.setattr(_plans, "MAX_PLANS", 3)

        async def scale(x: Any, k: float) -> Any:
            return ops.multiply(x, k)

        forward = dataflow.compile(scale)
        x = _x(2, 3)

        async def main() -> None:
            with pytest.warns(RuntimeWarning, match="more than 3 signatures") as seen:
                for k in range(6):
                    np.testing.assert_allclose(await forward(x, float(k)), x * k)
            assert len(seen) == 1
            assert len(forward.programs) == 3 and forward.evicted == 3
            np.testing.assert_allclose(await forward(x, 0.0), x * 0.0)  # traced again
            assert forward.evicted == 4 and len(forward.programs) == 3

        dataflow.run(main)

    def test_static_arguments_equal_only_by_value_compile_apart(self) -> None:
        """Static arguments that are == but that the program tells apart (2 and 2.0 in a
        tuple, 0.0 and -0.0) are two signatures (the second call reused the first's plan:
        a float64 result for int64 inputs); two NaNs are one (each call traced anew)."""

        async def scale(x: Any, factors: Any) -> Any:
            return ops.multiply(x, factors[1])

        forward = dataflow.compile(scale)
        xi = np.arange(4, dtype=np.int64)
        x = -np.ones(3)

        async def main() -> list[Array]:
            return [
                await forward(xi, (1, 2.0)),
                await forward(xi, (1, 2)),
                await forward(x, (0, 0.0)),
                await forward(x, (0, -0.0)),
                await forward(x, (0, float("nan"))),
                await forward(x, (0, float("nan"))),
            ]

        outs = dataflow.run(main)
        assert [str(o.dtype) for o in outs[:2]] == ["float64", "int64"]
        assert np.signbit(outs[2]).all() and not np.signbit(outs[3]).any()
        assert len(forward.programs) == 5

    def test_a_plain_function_compiles_as_it_traces(self) -> None:
        """A plain function that calls ops (which trace() takes) compiles: its pending
        outputs are its outputs (its call used to be awaited: 'the program awaited the value
        of %1', or TypeError for a tuple)."""

        def plain(x: Any) -> Any:
            return ops.tanh(x), ops.multiply(x, 2.0)

        forward = dataflow.compile(plain)
        x = _x(3)

        async def main() -> Any:
            return await forward(x)

        a, b = dataflow.run(main)
        np.testing.assert_allclose(a, np.tanh(x), rtol=1e-6)
        np.testing.assert_array_equal(b, x * 2)

    def test_a_tensor_input_is_awaited_first(self) -> None:
        """A Tensor argument, done or still pending (a big op on the pool), gives its value
        to the plan's kernels (they used to get the Tensor object itself)."""
        m = Mlp()
        forward = dataflow.compile(m)
        x = _x(4, 6)

        async def main() -> list[Any]:
            outs = []
            for _ in range(3):  # the first call traces; the later ones launch or run here
                done = ops.multiply(x, 1.0)  # tiny: inline, done at dispatch
                pending = ops.matmul(_x(4, 300, seed=3), ops.multiply(_x(300, 6, seed=4), 0.0))
                pending = ops.add(pending, x)  # still pending: its inputs are on the pool
                outs += [await forward(done), await forward(pending)]
            return outs

        for out in dataflow.run(main, interop_threads=2):
            np.testing.assert_allclose(out, _reference(m, x), rtol=1e-4, atol=1e-5)

    def test_another_dtype_compiles_anew(self) -> None:
        """The same shape in another dtype is another signature."""

        async def f(x: Any) -> Any:
            return ops.tanh(x)

        forward = dataflow.compile(f)

        async def main() -> list[str]:
            a = await forward(np.zeros(3, np.float32))
            b = await forward(np.zeros(3, np.float64))
            return [str(a.dtype), str(b.dtype)]

        assert dataflow.run(main) == ["float32", "float64"]
        assert len(forward.programs) == 2

    def test_concurrent_first_calls_trace_once(self) -> None:
        """Many calls of a new signature at once: one trace, all right."""
        m = Mlp()
        forward = dataflow.compile(m)
        xs = [_x(2, 6, seed=k) for k in range(8)]

        async def main() -> list[Array]:
            return list(await asyncio.gather(*(forward(x) for x in xs)))

        outs = dataflow.run(main)
        assert len(forward.programs) == 1
        for x, y in zip(xs, outs, strict=True):
            np.testing.assert_allclose(y, _reference(m, x), rtol=1e-5, atol=1e-6)

    def test_a_call_waiting_for_a_cancelled_trace_traces_itself(self) -> None:
        """The call tracing a signature is cancelled mid-trace: a call waiting for that trace
        traces the signature itself (it used to fail: 'compiling this signature failed')."""

        async def slow(x: Any) -> Any:
            await asyncio.sleep(0.05)  # the trace suspends here: a deadline may strike
            return ops.tanh(x)

        forward = dataflow.compile(slow)
        x = _x(3)

        async def main() -> Array:
            first = asyncio.ensure_future(forward(x))
            await asyncio.sleep(0.01)
            second = asyncio.ensure_future(forward(x))
            await asyncio.sleep(0.01)
            first.cancel()
            out: Array = await asyncio.wait_for(second, 30)
            return out

        np.testing.assert_allclose(dataflow.run(main), np.tanh(x), rtol=1e-6)
        assert len(forward.programs) == 1

    def test_concurrent_traces_leave_the_warnings_machinery_alone(self) -> None:
        """Two signatures traced at once (their traces suspended together): afterwards a
        warning still reaches the process's filters (the traces caught warnings across their
        awaits, restored out of order, and left every later warning silently recorded)."""

        async def slow(x: Any) -> Any:
            await asyncio.sleep(0.01)
            return ops.tanh(x)

        forward = dataflow.compile(slow)
        filters = list(warnings.filters)

        async def main() -> None:
            await asyncio.gather(*(forward(_x(n)) for n in (2, 3, 4)))

        dataflow.run(main)
        assert warnings.filters == filters
        with pytest.warns(UserWarning, match="still seen"):
            warnings.warn("still seen", UserWarning, stacklevel=1)

    def test_a_trace_outlives_a_caller_whose_deadline_struck(self, loop: str) -> None:
        """A caller whose deadline is shorter than the trace gives up; the trace goes on (the
        runtime's task, not the caller's), so the next call finds the plan. Cancelled with
        each caller, a slow signature never compiled (a server's every request timed out)."""

        async def slow(x: Any) -> Any:
            await asyncio.sleep(0.05)  # the trace suspends here: the deadline strikes
            return ops.tanh(x)

        forward = dataflow.compile(slow)
        x = _x(3)

        async def main() -> Array:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(forward(x), 0.01)
            for _ in range(200):  # the trace ends on its own
                if forward.programs:
                    break
                await asyncio.sleep(0.01)
            assert len(forward.programs) == 1
            out: Array = await forward(x)
            return out

        np.testing.assert_allclose(dataflow.run(main, loop=loop), np.tanh(x), rtol=1e-6)
        assert len(forward.programs) == 1

    def test_a_call_waiting_for_a_failed_trace_gets_its_error(self) -> None:
        """Concurrent first calls whose trace fails all raise the trace's own error (the
        waiting ones used to get 'compiling this signature failed (see above)')."""

        async def bad(x: Any) -> Any:
            await asyncio.sleep(0.01)
            return ops.matmul(x, _x(5, 2))

        forward = dataflow.compile(bad)

        async def main() -> list[Any]:
            calls = [forward(_x(2, 3)) for _ in range(3)]
            return list(await asyncio.gather(*calls, return_exceptions=True))

        for got in dataflow.run(main):
            assert isinstance(got, dataflow.OpInputError) and "matmul" in str(got)

    def test_value_dependent_control_flow_is_refused(self) -> None:
        """A program whose ops depend on the input values is not compiled (torch.jit.trace's
        check): a clear error; check=False compiles it anyway."""

        async def branchy(x: Any) -> Any:
            if float(np.asarray(await ops.sum(x))) > 0:
                return ops.tanh(x)
            return ops.exp(x)

        async def main(fn: Any) -> Any:
            return await fn(np.ones(3, np.float32))

        with pytest.raises(dataflow.DataflowError, match="cannot be compiled"):
            dataflow.run(main, dataflow.compile(branchy))
        with pytest.warns(dataflow.TracerWarning):
            out = dataflow.run(main, dataflow.compile(branchy, check=False))
        np.testing.assert_allclose(out, np.tanh(np.ones(3)), rtol=1e-6)

    def test_the_ensemble(self) -> None:
        """The tutorial's ensemble, compiled: the same output as eager."""
        ens = Ensemble(2, 16, seed=3)
        forward = dataflow.compile(ens)
        x = _x(6, 2, 16)

        async def main() -> tuple[Array, Array]:
            return await ens(x), await forward(x)

        eager, compiled = dataflow.run(main)
        np.testing.assert_allclose(compiled, eager, rtol=1e-5, atol=1e-6)

    def test_a_kernel_error_reaches_the_caller(self) -> None:
        """A kernel failing in a launched plan raises at the call, with its type."""
        bad = dataflow.op("bad_c", meta=ops.spec_of, handle=ops.Tensor)(
            lambda x: (_ for _ in ()).throw(ZeroDivisionError("in plan"))
        )

        async def prog(x: Any) -> Any:
            return ops.tanh(bad(x))

        forward = dataflow.compile(prog, check=False)

        async def main() -> None:
            with pytest.raises(ZeroDivisionError, match="in plan"):
                await forward(np.ones(2))

        dataflow.run(main)

    def test_the_synchronous_mode(self) -> None:
        """interop_threads=0 launches run in order on the loop thread."""
        m = Mlp()
        forward = dataflow.compile(m)
        x = _x(3, 6)

        async def main() -> Any:
            return await forward(x)

        np.testing.assert_allclose(dataflow.run(main, interop_threads=0), _reference(m, x),
                                   rtol=1e-5)  # fmt: skip

    def test_inputs_changed_after_the_call_are_not_read(self) -> None:
        """The launch copies (or freezes) its inputs: a later write changes nothing."""
        m = Mlp()
        forward = dataflow.compile(m)
        x = _x(4, 6)
        want = _reference(m, x)

        async def main() -> Any:
            await forward(x)  # compiled
            call = asyncio.ensure_future(forward(x))
            await asyncio.sleep(0)  # launched
            x[:] = 100.0
            return await call

        np.testing.assert_allclose(dataflow.run(main), want, rtol=1e-5, atol=1e-6)

    def test_arguments_are_checked(self) -> None:
        """Non-array arguments must be hashable; the options are validated."""
        forward = dataflow.compile(Mlp())

        async def main() -> None:
            with pytest.raises(TypeError, match="must be hashable"):
                await forward(_x(2, 6), [1.0])

        dataflow.run(main)
        with pytest.raises(TypeError, match="batch_axis"):
            dataflow.compile(Mlp(), batch_axis="0")  # type: ignore[call-overload]
        with pytest.raises(dataflow.DataflowValueError, match="max_batch"):
            dataflow.compile(Mlp(), max_batch=0)
        with pytest.raises(dataflow.DataflowValueError, match="max_wait"):
            dataflow.compile(Mlp(), max_wait=-1)

    @pytest.mark.parametrize(
        "options",
        [{"max_batch": 1.5}, {"max_batch": "8"}, {"max_wait": "0.01"}, {"max_wait": None}],
    )
    def test_options_of_another_type_are_type_errors(self, options: dict[str, Any]) -> None:
        """A wrong type is a DataflowTypeError naming the option (docs/api.md, "Errors")."""
        with pytest.raises(dataflow.DataflowTypeError, match=next(iter(options))):
            dataflow.compile(Mlp(), **options)


class TestBatching:
    def test_concurrent_calls_run_as_one_launch_with_the_same_results(self) -> None:
        """32 concurrent calls: fewer launches than calls, each call its own rows back."""
        m = Mlp()
        forward = dataflow.compile(m, batch_axis=0)
        xs = [_x(1, 6, seed=k) for k in range(32)]

        async def main() -> list[Any]:
            return await _all_at_once(forward, xs)

        outs = dataflow.run(main)
        assert forward.calls == 32 and forward.launches < 32
        for x, y in zip(xs, outs, strict=True):
            assert y.shape == (1, 3)
            np.testing.assert_allclose(y, _reference(m, x), rtol=1e-5, atol=1e-6)

    def test_a_batch_resumes_its_callers_one_loop_iteration_at_a_time(self) -> None:
        """A finished batch wakes its callers one per loop iteration, so other work on the
        loop (here a task that yields continuously) runs between them instead of waiting for
        every caller to have answered."""
        m = Mlp()
        forward = dataflow.compile(m, batch_axis=0)
        xs = [_x(1, 6, seed=k) for k in range(8)]

        async def main() -> tuple[list[str], list[Array]]:
            events: list[str] = []
            gate = asyncio.Event()
            stop = False

            async def ticker() -> None:
                while not stop:
                    events.append("tick")
                    await asyncio.sleep(0)

            async def call(k: int) -> Array:
                await gate.wait()
                out: Array = await forward(xs[k])
                events.append(f"call {k}")
                return out

            await forward(xs[0])  # compiled before the batch forms
            tick = asyncio.ensure_future(ticker())
            calls = [asyncio.ensure_future(call(k)) for k in range(len(xs))]
            await asyncio.sleep(0)
            gate.set()
            outs = list(await asyncio.gather(*calls))
            stop = True
            await tick
            return events, outs

        events, outs = dataflow.run(main)
        for x, y in zip(xs, outs, strict=True):
            np.testing.assert_allclose(y, _reference(m, x), rtol=1e-5, atol=1e-6)
        done = [i for i, e in enumerate(events) if e.startswith("call")]
        assert len(done) == len(xs)
        # Call 0 finds nothing of the model running and launches alone; calls 1-7 arrive in
        # the same loop iteration while it runs and form the next batch. The two batches'
        # wake-ups may fall in one loop iteration (seen under load), so only the second
        # batch's callers are checked: they never answer back to back, a tick runs between.
        second = [i for i, e in enumerate(events) if e.startswith("call") and e != "call 0"]
        assert len(second) == len(xs) - 1
        assert all(events[j - 1] == "tick" for j in second[1:])

    def test_different_batch_sizes_share_a_batch(self) -> None:
        """Calls of 1, 2 and 3 rows batch together; each gets its own rows."""
        m = Mlp()
        forward = dataflow.compile(m, batch_axis=0)
        xs = [_x(n, 6, seed=n) for n in (1, 2, 3, 1)]

        async def main() -> list[Array]:
            return list(await asyncio.gather(*(forward(x) for x in xs)))

        for x, y in zip(xs, dataflow.run(main), strict=True):
            np.testing.assert_allclose(y, _reference(m, x), rtol=1e-5, atol=1e-6)

    def test_a_lone_call_does_not_wait(self) -> None:
        """With nothing of the model running, a call launches at once (no max_wait)."""
        forward = dataflow.compile(Mlp(), batch_axis=0, max_wait=60.0)

        async def main() -> Any:
            return await asyncio.wait_for(forward(_x(1, 6)), 10)

        assert dataflow.run(main).shape == (1, 3)

    def test_a_full_batch_stops_its_timer(self) -> None:
        """A batch launched because it filled up cancels its max_wait timer's task, so closing
        the runtime does not wait out the timer's sleep."""
        m = Mlp()
        forward = dataflow.compile(m, batch_axis=0, max_batch=2, max_wait=600.0)
        xs = [_x(1, 6, seed=k) for k in range(3)]

        async def main() -> tuple[list[Array], list[str]]:
            first = asyncio.ensure_future(forward(xs[0]))  # nothing runs: launches at once
            await asyncio.sleep(0)
            rest = [asyncio.ensure_future(forward(x)) for x in xs[1:]]  # fill a batch of 2
            outs = [await first, *await asyncio.gather(*rest)]
            await asyncio.sleep(0)
            timers = [t.get_name() for t in asyncio.all_tasks() if "timer" in t.get_name()]
            return outs, timers

        outs, timers = dataflow.run(main)
        assert timers == []
        for x, y in zip(xs, outs, strict=True):
            np.testing.assert_allclose(y, _reference(m, x), rtol=1e-5, atol=1e-6)

    def test_the_ensemble_batches_on_axis_1(self) -> None:
        """The ensemble's (T, B, C) input batches on axis 1."""
        ens = Ensemble(2, 8, seed=4)
        forward = dataflow.compile(ens, batch_axis=1)
        xs = [_x(5, 1, 8, seed=k) for k in range(6)]

        async def main() -> tuple[list[Array], list[Array]]:
            eager = [await ens(x) for x in xs]
            return eager, list(await asyncio.gather(*(forward(x) for x in xs)))

        eager, batched = dataflow.run(main)
        for e, b in zip(eager, batched, strict=True):
            np.testing.assert_allclose(b, e, rtol=1e-4, atol=1e-5)

    def test_warm_up_traces_every_padded_batch_size(self) -> None:
        """warm_up compiles the sizes batches will run at (1, 2, 4, 8 calls of one row with
        max_batch 8), so concurrent traffic afterwards traces nothing on the loop."""
        m = Mlp()
        forward = dataflow.compile(m, batch_axis=0, max_batch=8)
        xs = [_x(1, 6, seed=k) for k in range(20)]

        async def main() -> tuple[int, int, int, list[Array]]:
            traced = await forward.warm_up(xs[0])
            again = await forward.warm_up(xs[1])
            before = len(forward.programs)
            outs = list(await asyncio.gather(*(forward(x) for x in xs)))
            return traced, again, len(forward.programs) - before, outs

        traced, again, new, outs = dataflow.run(main)
        assert (traced, again, new) == (4, 0, 0)
        for x, y in zip(xs, outs, strict=True):
            np.testing.assert_allclose(y, _reference(m, x), rtol=1e-5, atol=1e-6)

    @pytest.mark.parametrize("batch_axis", [None, 0], ids=["plain", "batched"])
    def test_warm_up_runs_each_signature_it_compiles_once(self, batch_axis: int | None) -> None:
        """warm_up also runs each plan it compiles, once, so that its kernels' first-call
        costs come before traffic (a recurrent kernel measures its forms at a new batch
        size: the first requests of each size took 0.2-0.6 s longer); the runs are not
        counted as launches, and a signature already compiled is not run again."""
        rows: list[int] = []

        def seen(x: Any) -> Any:
            rows.append(x.shape[0])
            return x * 2.0

        counted = dataflow.op("counted", meta=lambda x: ops.spec_of(x), handle=ops.Tensor,
                              inline=False)(seen)  # fmt: skip
        forward = dataflow.compile(counted, batch_axis=batch_axis, max_batch=4)

        async def main() -> tuple[int, int]:
            traced = await forward.warm_up(_x(1, 3))
            again = await forward.warm_up(_x(1, 3))
            return traced, again

        traced, again = dataflow.run(main)
        assert again == 0 and forward.launches == 0
        assert sorted(rows) == ([1] if batch_axis is None else [1, 2, 4]) and traced == len(rows)

    def test_warm_up_without_batching_and_bad_rows(self) -> None:
        """Without batching warm_up traces the one signature; inputs that disagree on the
        batch axis are refused, naming it."""
        plain = dataflow.compile(Mlp())
        batched = dataflow.compile(lambda a, b: _add(a, b), batch_axis=0)

        async def main() -> int:
            n: int = await plain.warm_up(_x(3, 6))
            with pytest.raises(ValueError, match="same size along batch_axis 0"):
                await batched.warm_up(_x(1, 6), _x(2, 6))
            return n

        assert dataflow.run(main) == 1

    @pytest.mark.parametrize("batch_axis", [None, 0], ids=["plain", "batched"])
    def test_warm_up_takes_a_pending_tensor(self, batch_axis: int | None) -> None:
        """A Tensor example is awaited first, as a call's is (warm_up raised NotReadyError
        while it was still queued)."""
        gate = threading.Event()
        forward = dataflow.compile(Mlp(), batch_axis=batch_axis, max_batch=2)

        async def main() -> int:
            x = slow_neg(gate_op(_x(1, 6), gate))
            asyncio.get_running_loop().call_later(0.05, gate.set)
            n: int = await forward.warm_up(x)
            return n

        assert dataflow.run(main, interop_threads=2) == (1 if batch_axis is None else 2)

    def test_warm_up_with_no_rows(self) -> None:
        """An example without rows along the batch axis traces the signature calls like it
        run at (a batch of such calls has no rows either): a ZeroDivisionError before."""
        forward = dataflow.compile(Mlp(), batch_axis=0)

        async def main() -> tuple[int, int]:
            n: int = await forward.warm_up(_x(0, 6))
            before = len(forward.programs)
            out: Array = await forward(_x(0, 6))
            assert out.shape == (0, 3)
            return n, len(forward.programs) - before

        assert dataflow.run(main) == (1, 0)

    def test_bad_batch_axis(self) -> None:
        """A batch axis out of range for an input is refused, naming the shape."""
        forward = dataflow.compile(Mlp(), batch_axis=3)

        async def main() -> None:
            with pytest.raises(ValueError, match="out of range for an input of shape"):
                await forward(_x(2, 6))
            with pytest.raises(dataflow.DataflowValueError, match="out of range for an input"):
                await forward.warm_up(_x(2, 6))  # (an IndexError before)

        dataflow.run(main)

    def test_an_output_without_the_batch_axis_is_refused(self) -> None:
        """An output reduced over the batch axis cannot be split back into the calls' rows:
        a clear error for every caller (each used to get a slice of the wrong axis: one
        element of the batch's sum), while the outputs that keep the axis were fine."""

        async def pooled(x: Any) -> Any:
            return ops.tanh(x), ops.sum(x, axis=0)

        forward = dataflow.compile(pooled, batch_axis=0, max_wait=0.05)
        xs = [_x(1, 4, seed=k) for k in range(3)]

        async def main() -> list[Any]:
            return await _all_at_once(forward, xs, return_exceptions=True)

        outs = dataflow.run(main, interop_threads=2)
        for got in outs:
            assert isinstance(got, dataflow.DataflowValueError)
            assert "shape (4,) has no batch axis 0" in str(got)


def _gate_kernel(x: Any, gate: threading.Event) -> Any:
    gate.wait(10)
    return x


gate_op = dataflow.op("gate_c", meta=lambda x, g: ops.spec_of(x), handle=ops.Tensor, inline=False)(
    _gate_kernel
)
slow_neg = dataflow.op("slow_neg", meta=ops.spec_of, handle=ops.Tensor, inline=False)(np.negative)


def run_watched(main: Any) -> tuple[Any, list[Any]]:
    """Run ``main`` (dataflow.run) under a profile: its value, and the slow_neg ops
    that started."""
    with dataflow.profile() as prof:
        value = dataflow.run(main, interop_threads=2)
    return value, [t for t in prof.trace().tasks if t.op == "slow_neg"]


async def gated_chain(gate: threading.Event, n: int = 200) -> Any:
    """A request: ``n`` slow_neg ops behind a gate, its last one awaited."""
    y = gate_op(np.zeros(4), gate)
    for _ in range(n):
        y = slow_neg(y)
    return await y


class TestRequests:
    def test_a_cancelled_request_drops_its_queued_ops(self) -> None:
        """Cancelling the task that dispatched a chain drops the chain's unstarted ops
        (counted from the trace: tasks cancelled, never started)."""

        async def main() -> int:
            gate = threading.Event()
            req = asyncio.ensure_future(gated_chain(gate))
            await asyncio.sleep(0.05)
            req.cancel()
            with pytest.raises(asyncio.CancelledError):
                await req
            gate.set()
            rt = dataflow.current_runtime()
            assert rt is not None
            return rt._sched.dropped

        dropped, started = run_watched(main)
        assert dropped == 200 and started == []

    @pytest.mark.parametrize("group", ["asyncio.gather", "anyio task group"])
    def test_a_request_its_group_cancelled_drops_its_queued_ops(self, group: str) -> None:
        """A request cancelled through asyncio.gather or an anyio task group while it awaits
        its chain drops the chain's unstarted ops, as a task cancelled by itself does. The
        group takes the task's CancelledError before the request's end is reported, and keeps
        it (in its future; in a reference cycle), and with it the request's frames and their
        handles: every op ran for nobody."""
        import anyio

        async def main() -> int:
            gate = threading.Event()

            if group == "asyncio.gather":
                both = asyncio.gather(gated_chain(gate), asyncio.sleep(10))
                await asyncio.sleep(0.05)
                both.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await both
            else:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(gated_chain, gate)
                    await asyncio.sleep(0.05)
                    tg.cancel_scope.cancel()
            await asyncio.sleep(0.01)
            gate.set()
            rt = dataflow.current_runtime()
            assert rt is not None
            return rt._sched.dropped

        dropped, started = run_watched(main)
        assert dropped == 200 and started == []

    @pytest.mark.parametrize("scope", ["asyncio.timeout", "anyio.move_on_after"])
    def test_a_caught_timeout_drops_what_its_scope_dispatched(self, scope: str) -> None:
        """A cancellation caught inside the request (a timeout scope: the request goes on, so
        it never ends cancelled) drops the ops dispatched in the scope that nobody holds any
        more, once the scope has unwound; what the request still holds is kept and runs."""
        import anyio

        async def main() -> tuple[int, Any]:
            gate = threading.Event()
            kept = slow_neg(gate_op(np.full(4, 2.0), gate))  # held outside the scope

            if scope == "asyncio.timeout":
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.05):
                        await gated_chain(gate)
            else:
                with anyio.move_on_after(0.05):
                    await gated_chain(gate)
            await asyncio.sleep(0)  # the loop's next step: the drop runs
            gate.set()
            rt = dataflow.current_runtime()
            assert rt is not None
            value = await kept
            return rt._sched.dropped, value

        (dropped, value), started = run_watched(main)
        np.testing.assert_array_equal(value, np.full(4, -2.0))
        assert dropped == 200 and len(started) == 1  # the kept one

    def test_a_caught_timeout_keeps_what_is_still_held(self) -> None:
        """After a caught timeout, a value the request still holds (a handle kept in a list
        outside the scope) is not dropped: awaiting it again gives its value."""

        async def main() -> Any:
            gate = threading.Event()
            held: list[Any] = []

            async def wait_for_it() -> Any:
                y = slow_neg(gate_op(np.ones(3), gate))
                held.append(y)
                return await y

            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await wait_for_it()
            await asyncio.sleep(0)
            gate.set()
            return await held[0]

        np.testing.assert_array_equal(dataflow.run(main, interop_threads=2), [-1.0] * 3)

    @pytest.mark.parametrize("when", ["before", "after"])
    @pytest.mark.parametrize("scope", ["asyncio.timeout", "anyio.move_on_after"])
    def test_a_fork_fired_and_forgotten_around_a_caught_timeout_runs(
        self, scope: str, when: str
    ) -> None:
        """A caught timeout drops the work its await waited for, not the request's other
        work: a fork the request fires and forgets before the scope, or after it, still
        queued when the request ends, runs and its failure is reported. Both were dropped
        unrun, the failure lost."""
        import anyio

        ran: list[int] = []

        def boom(x: Any) -> Any:
            ran.append(1)
            raise ValueError("boom outside the scope")

        async def main() -> None:
            gate = threading.Event()
            if when == "before":
                dataflow.fork(boom, gate_op(np.ones(4), gate))  # its future dropped at once
            if scope == "asyncio.timeout":
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.01):
                        await slow_neg(gate_op(np.zeros(4), gate))
            else:
                with anyio.move_on_after(0.01):
                    await slow_neg(gate_op(np.zeros(4), gate))
            if when == "after":
                dataflow.fork(boom, gate_op(np.ones(4), gate))
            await asyncio.sleep(0)  # the loop's next step: the scope's drop runs
            threading.Timer(0.05, gate.set).start()  # after the request has ended

        with pytest.raises(dataflow.UnobservedTaskError, match="boom"):
            dataflow.run(main, interop_threads=2)
        assert ran == [1]

    def test_a_cancelled_fork_drops_what_nobody_wants(self) -> None:
        """A forked coroutine is a request too: cancelling its future drops the ops it queued
        that nobody wants any more, and keeps the one it handed out (docs/hardening.md)."""

        async def main() -> tuple[int, Any]:
            gate = threading.Event()
            handed: list[Any] = []

            async def child() -> Any:
                handed.append(slow_neg(gate_op(np.full(2, 3.0), gate)))
                y = gate_op(np.zeros(4), gate)
                for _ in range(50):
                    y = slow_neg(y)
                return await y

            fut = dataflow.fork(child)
            await asyncio.sleep(0.05)
            fut.cancel()
            await asyncio.sleep(0.01)
            gate.set()
            rt = dataflow.current_runtime()
            assert rt is not None
            return rt._sched.dropped, await handed[0]

        dropped, value = dataflow.run(main, interop_threads=2)
        assert dropped == 50
        np.testing.assert_array_equal(value, [-3.0, -3.0])

    def test_what_someone_else_waits_for_is_kept(self) -> None:
        """A value another live coroutine awaits is not dropped with its request."""

        async def main() -> Any:
            gate = threading.Event()
            shared: list[Any] = []

            async def request() -> None:
                y = slow_neg(gate_op(np.ones(2), gate))
                shared.append(y)
                await asyncio.sleep(10)

            req = asyncio.ensure_future(request())
            await asyncio.sleep(0.05)
            waiter = asyncio.ensure_future(_await(shared[0]))
            await asyncio.sleep(0.01)
            req.cancel()
            gate.set()
            return await waiter

        np.testing.assert_array_equal(dataflow.run(main), [-1.0, -1.0])

    def test_the_oldest_request_runs_first(self) -> None:
        """With one worker busy, queued work of an older request runs before a newer one's."""
        order: list[str] = []
        mark = _marker(order)

        async def main() -> None:
            gate = threading.Event()
            busy = gate_op(np.zeros(1), gate)  # occupies the only worker

            async def request(name: str, n: int) -> None:
                handles = [mark(np.zeros(1), f"{name}{k}") for k in range(n)]
                await asyncio.gather(*(_await(h) for h in handles))

            burst = [asyncio.ensure_future(request(f"new{j}-", 3)) for j in range(3)]
            await asyncio.sleep(0.01)
            old = asyncio.ensure_future(request("old", 2))
            await asyncio.sleep(0.01)
            gate.set()
            await busy
            await asyncio.gather(old, *burst)

        dataflow.run(main, interop_threads=1)
        # The burst's requests started first: they are the older ones, and run first, in order.
        assert order == [f"new{j}-{k}" for j in range(3) for k in range(3)] + ["old0", "old1"]

    def test_a_streaming_request_does_not_starve_a_newer_one(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An old request that keeps dispatching (a long job, another runtime's whole run on
        the shared pool) no longer starves a newer one: once it has dispatched AGING_TASKS
        more tasks, the newer request's work goes before what it dispatches next (the newer
        request's op ran after all 300 of the old one's)."""
        from dataflow._scheduler import _dispatch

        monkeypatch.setattr(_dispatch, "AGING_TASKS", 50)
        order: list[str] = []
        mark = _marker(order)

        async def main() -> None:
            gate = threading.Event()
            busy = gate_op(np.zeros(1), gate)  # occupies the only worker
            started = asyncio.Event()
            newer_dispatched = asyncio.Event()

            async def old() -> None:
                handles = [mark(np.zeros(1), f"old{k}") for k in range(100)]
                started.set()
                await newer_dispatched.wait()
                handles += [mark(np.zeros(1), f"old{k}") for k in range(100, 300)]
                await asyncio.gather(*(_await(h) for h in handles))

            async def newer() -> None:
                await started.wait()
                h = mark(np.zeros(1), "new")
                newer_dispatched.set()
                await h

            both = asyncio.gather(old(), newer())
            await asyncio.sleep(0.01)
            gate.set()
            await busy
            await both

        dataflow.run(main, interop_threads=1)
        at = order.index("new")
        # The old request's first 100 and about 50 more go first; then the newer one's op.
        assert order[:100] == [f"old{k}" for k in range(100)]
        assert 100 <= at < 200, at


def _marker(order: list[str]) -> Any:
    """A pool op (never inline) that returns its input and appends its name to ``order``
    when it runs: the order the scheduler ran queued work in."""

    def record(x: Any, name: str) -> Any:
        order.append(name)
        return x

    return dataflow.op("mark", meta=lambda x, n: ops.spec_of(x), handle=ops.Tensor,
                       inline=False)(record)  # fmt: skip


class Gated(ops.nn.Module):
    """Holds its first op until ``gate`` opens, then 50 pool ops: a batch that runs a while."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    async def forward(self, x: Any) -> Any:
        y = gate_op(x, self.gate)
        for _ in range(50):
            y = slow_neg(y)
        return y


class TestCancelledCallers:
    """A batched call whose caller stops waiting (cancelled: a deadline, a client gone) leaves
    its batch: its rows are not computed if the batch has not started, and a batch nobody
    waits for any more is not run, or is stopped (its queued ops dropped) if it runs."""

    @staticmethod
    def _model(max_wait: float = 5.0) -> tuple[threading.Event, Any]:
        gate = threading.Event()
        return gate, dataflow.compile(Gated(gate), batch_axis=0, max_wait=max_wait)

    def test_a_batch_every_caller_left_is_never_launched(self) -> None:
        gate, forward = self._model()
        xs = [_x(1, 4, seed=k) for k in range(3)]

        async def main() -> tuple[Array, int, list[str]]:
            gate.set()
            await forward(xs[0])  # compiled
            gate.clear()
            first = asyncio.ensure_future(forward(xs[0]))  # runs, held by the gate
            await asyncio.sleep(0.02)
            waiting = [asyncio.ensure_future(forward(x)) for x in xs[1:]]  # one open batch
            await asyncio.sleep(0.02)
            launches = forward.launches
            for w in waiting:
                w.cancel()
            for w in waiting:
                with pytest.raises(asyncio.CancelledError):
                    await w
            await asyncio.sleep(0)
            timers = [t.get_name() for t in asyncio.all_tasks() if "timer" in t.get_name()]
            gate.set()
            out: Array = await first
            await asyncio.sleep(0.02)
            return out, forward.launches - launches, timers

        out, launched, timers = dataflow.run(main, interop_threads=2)
        np.testing.assert_array_equal(out, xs[0])  # 50 negations
        assert launched == 0  # the abandoned batch never ran
        assert timers == []  # and its max_wait timer was stopped with it

    def test_a_cancelled_callers_rows_are_left_out(self) -> None:
        """Two calls share a batch, one is cancelled before it starts: the batch runs the
        other's rows alone (no program for two rows is ever traced) and answers it."""
        gate, forward = self._model(max_wait=0.05)
        xs = [_x(1, 4, seed=k) for k in range(3)]

        async def main() -> tuple[Array, int]:
            gate.set()
            await forward(xs[0])  # compiled for one row
            gate.clear()
            first = asyncio.ensure_future(forward(xs[0]))  # runs, held by the gate
            await asyncio.sleep(0.02)
            gone = asyncio.ensure_future(forward(xs[1]))
            kept = asyncio.ensure_future(forward(xs[2]))
            await asyncio.sleep(0.02)
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone
            gate.set()
            await first
            out: Array = await asyncio.wait_for(kept, 30)
            return out, len(forward.programs)

        out, programs = dataflow.run(main, interop_threads=2)
        np.testing.assert_array_equal(out, xs[2])
        assert programs == 1

    def test_calls_without_rows(self) -> None:
        """A call with no rows along the batch axis gets its empty result, alone or first in
        a padded batch (the padding copied the first call's row: an IndexError, alone; in a
        batch, the failed launch then ran every call again one by one)."""
        gate, forward = self._model(max_wait=0.05)
        sizes = [0, 1, 2]
        xs = [_x(n, 4, seed=n) for n in sizes]

        async def main() -> tuple[list[Array], int]:
            gate.set()
            empty: Array = await forward(xs[0])
            assert empty.shape == (0, 4)
            await forward(xs[1])  # (traced for one row)
            gate.clear()
            first = asyncio.ensure_future(forward(xs[1]))  # runs, held by the gate
            await asyncio.sleep(0.02)
            calls = [asyncio.ensure_future(forward(x)) for x in xs]  # one batch: 3 rows, padded
            await asyncio.sleep(0.02)
            launches = forward.launches
            gate.set()
            await first
            outs = [await asyncio.wait_for(c, 30) for c in calls]
            return outs, forward.launches - launches

        outs, launched = dataflow.run(main, interop_threads=2)
        for x, got in zip(xs, outs, strict=True):
            np.testing.assert_array_equal(got, x)
        assert launched == 1

    def test_a_running_batch_every_caller_left_is_stopped(self) -> None:
        """The lone caller of a running batch is cancelled: the batch's task is cancelled
        with it and the plan's unstarted ops are dropped; the model then serves again."""
        gate, forward = self._model()
        x = _x(1, 4)

        async def main() -> tuple[int, Array]:
            gate.set()
            await forward(x)
            gate.clear()
            call = asyncio.ensure_future(forward(x))
            await asyncio.sleep(0.05)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await asyncio.sleep(0.02)
            gate.set()
            rt = dataflow.current_runtime()
            assert rt is not None
            await asyncio.sleep(0.2)
            dropped = rt._sched.dropped
            again: Array = await asyncio.wait_for(forward(x), 30)
            return dropped, again

        dropped, again = dataflow.run(main, interop_threads=2)
        assert dropped >= 1  # the ops queued behind the gate were never run
        np.testing.assert_array_equal(again, x)

    @pytest.mark.parametrize("batched", [False, True], ids=["plain", "batched"])
    @pytest.mark.parametrize("scope", ["asyncio.timeout", "anyio.move_on_after"])
    def test_a_caught_timeout_around_a_call_drops_its_plan(self, scope: str, batched: bool) -> None:
        """A timeout scope caught inside the request, around `await forward(x)`: the plan's
        unstarted nodes are dropped, as an eager chain's are (docs/serving.md). The call's
        wait did not tell the runtime it was interrupted: every node ran for nobody."""
        import anyio

        gate = threading.Event()
        forward = dataflow.compile(Counted(gate), batch_axis=0 if batched else None)
        x = _x(1, 4)

        async def main() -> tuple[int, Array]:
            gate.set()
            await forward(x)
            gate.clear()
            Counted.ran.clear()
            rt = dataflow.current_runtime()
            assert rt is not None
            before = rt._sched.dropped
            if scope == "asyncio.timeout":
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.05):
                        await forward(x)
            else:
                with anyio.move_on_after(0.05):
                    await forward(x)
            await asyncio.sleep(0.02)
            gate.set()
            await asyncio.sleep(0.1)
            assert Counted.ran == []  # the nodes queued behind the gate never ran
            again: Array = await asyncio.wait_for(forward(x), 30)
            return rt._sched.dropped - before, again

        dropped, again = dataflow.run(main, interop_threads=2)
        assert dropped >= 1
        np.testing.assert_allclose(again, x + 5, rtol=1e-6)


def _count_kernel(x: Any, k: int) -> Any:
    Counted.ran.append(k)
    return x + 1


_count = dataflow.op("count_c", meta=lambda x, k: ops.spec_of(x), handle=ops.Tensor,
                     inline=False)(_count_kernel)  # fmt: skip


class Counted(ops.nn.Module):
    """Holds its first op until ``gate`` opens, then 5 pool ops that say when they run."""

    ran: ClassVar[list[int]] = []

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    async def forward(self, x: Any) -> Any:
        y = gate_op(x, self.gate)
        for k in range(5):
            y = _count(y, k)
        return y


async def _await(h: Any) -> Any:
    return await h


def _refuse_negative(x: Array) -> Array:
    if (x < 0).any():
        raise ValueError("a negative row")
    out: Array = x * 2
    return out


_checked = dataflow.op(
    "refuse_negative", meta=lambda x: ops.spec_of(x), handle=ops.Tensor, inline=False
)(_refuse_negative)


async def _checked_model(x: Any) -> Any:
    return _checked(x)


class TestFailureIsolation:
    """A failing call of a batch fails only itself: the batch runs its calls again alone."""

    def test_one_callers_bad_rows_do_not_fail_the_others(self) -> None:
        forward = dataflow.compile(_checked_model, batch_axis=0, max_wait=0.05)
        xs = [np.full((1, 2), v, np.float32) for v in (1.0, -1.0, 3.0, 4.0)]

        async def main() -> list[Any]:
            return await _all_at_once(forward, xs, return_exceptions=True)

        outs = dataflow.run(main, interop_threads=2)
        assert forward.launches < 4 + len(xs)  # (some calls were batched, then rerun)
        for x, got in zip(xs, outs, strict=True):
            if x[0, 0] < 0:
                assert isinstance(got, ValueError) and "a negative row" in str(got)
            else:
                np.testing.assert_array_equal(got, x * 2)

    def test_a_batch_of_one_fails_with_its_own_error(self) -> None:
        forward = dataflow.compile(_checked_model, batch_axis=0)

        async def main() -> None:
            with pytest.raises(ValueError, match="a negative row"):
                await forward(-np.ones((1, 2), np.float32))

        dataflow.run(main, interop_threads=2)


def _interrupt_if_negative(x: Any) -> Any:
    if (x < 0).any():
        raise KeyboardInterrupt
    return x


_interrupting = dataflow.op(
    "interrupt_if_negative",
    meta=ops.spec_of,
    handle=ops.Tensor,
    cost=lambda x: dataflow.Cost(1.0, 8.0),
)(_interrupt_if_negative)


class TestInterrupts:
    @pytest.mark.timeout(30)
    def test_ctrl_c_in_a_plan_run_on_the_loop_stops_the_program(self) -> None:
        """A short plan runs whole on the loop's thread: a KeyboardInterrupt its kernel raises
        (Ctrl-C lands on the main thread) comes out of dataflow.run, not as a TaskError that
        `except Exception` catches."""
        forward = dataflow.compile(lambda x: ops.negative(_interrupting(x)))
        swallowed: list[BaseException] = []

        async def main() -> None:
            np.testing.assert_array_equal(await forward(np.ones(3)), -np.ones(3))
            try:
                await forward(-np.ones(3))
            except Exception as e:  # what the interrupt must not become
                swallowed.append(e)

        with pytest.raises(KeyboardInterrupt):
            dataflow.run(main, interop_threads=2)
        assert swallowed == []


class TestRuntimesInThreads:
    """One compiled forward used by several runtimes at once (each thread's dataflow.run):
    a call of one runtime never waits on another runtime's loop (both cases hung)."""

    @staticmethod
    def _in_threads(forward: Any, count: int, calls: int) -> dict[int, Any]:
        results: dict[int, Any] = {}

        def worker(k: int) -> None:
            async def main() -> list[Array]:
                xs = [np.full((1, 3), 10.0 * k + j, np.float32) for j in range(calls)]
                return list(await asyncio.gather(*(forward(x) for x in xs)))

            try:
                results[k] = dataflow.run(main, interop_threads=2)
            except BaseException as exc:  # (reported by the test)
                results[k] = exc

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "a runtime's calls hung"
        return results

    def test_a_trace_another_runtime_waits_for(self) -> None:
        """A runtime's first call waits for the trace another runtime's call is making, and
        is woken on its own loop."""

        async def slow_trace(x: Any) -> Any:
            await asyncio.sleep(0.1)
            return ops.multiply(x, 2.0)

        results = self._in_threads(dataflow.compile(slow_trace), 2, 1)
        for k in range(2):
            np.testing.assert_array_equal(results[k][0], np.full((1, 3), 20.0 * k))

    def test_batches_of_several_runtimes(self) -> None:
        """Batched calls of several runtimes: each runtime's calls batch on its own loop."""
        forward = dataflow.compile(_checked_model, batch_axis=0, max_wait=0.05)
        dataflow.run(forward.warm_up, np.ones((1, 3), np.float32))
        results = self._in_threads(forward, 3, 2)
        for k in range(3):
            for j, got in enumerate(results[k]):
                np.testing.assert_array_equal(got, np.full((1, 3), 2 * (10.0 * k + j)))


class TestParameters:
    """A compiled module's plans read its parameters by name: written in place or replaced by
    load_state_dict, the next call uses the new values."""

    def test_load_state_dict_reaches_the_compiled_model(self) -> None:
        m, other = Mlp(), Mlp()
        for k, layer in enumerate((other.fc1, other.fc2)):
            layer.weight = layer.weight + np.float32(k + 1)
        forward = dataflow.compile(m)
        x, x2 = _x(4, 6), _x(2, 6, seed=1)

        async def main() -> tuple[Array, Array]:
            return await forward(x), await forward(x2)

        dataflow.run(main)
        assert len(forward.programs) == 2
        m.load_state_dict(other.state_dict())
        got, got2 = dataflow.run(main)
        np.testing.assert_allclose(got, _reference(other, x), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got2, _reference(other, x2), rtol=1e-5, atol=1e-5)

    def test_only_plans_that_read_a_replaced_array_are_traced_again(self) -> None:
        m, unrelated = Mlp(), Mlp()
        forward = dataflow.compile(m)

        async def main() -> Array:
            out: Array = await forward(_x(4, 6))
            return out

        dataflow.run(main)
        plan = next(iter(forward.programs.values()))
        unrelated.load_state_dict(unrelated.state_dict())  # another module: m's arrays stay
        dataflow.run(main)
        assert next(iter(forward.programs.values())) is plan
        m.load_state_dict(m.state_dict())
        dataflow.run(main)
        assert next(iter(forward.programs.values())) is not plan

    def test_a_parameter_written_in_place_or_cleared(self) -> None:
        m = Mlp()
        forward = dataflow.compile(m)
        x = _x(4, 6)

        async def main() -> Array:
            out: Array = await forward(x)
            return out

        dataflow.run(main)
        bias = m.fc2.bias
        assert bias is not None
        bias[...] += np.float32(1.5)  # in place: read at the next call
        np.testing.assert_allclose(dataflow.run(main), _reference(m, x), rtol=1e-5, atol=1e-5)
        m.fc1.weight = m.fc1.weight * np.float32(2)  # assigned: not seen until clear()
        forward.clear()
        assert not forward.programs
        np.testing.assert_allclose(dataflow.run(main), _reference(m, x), rtol=1e-5, atol=1e-5)

    def test_warm_up_after_a_reload_traces_the_stale_plans_again(self) -> None:
        """warm_up after load_state_dict traces again what the reload made stale (as
        serving.md says to), so the next calls trace nothing: it found the stale plans
        still cached (they were dropped at the next call, which traced on the request path)."""
        m = Mlp()
        forward = dataflow.compile(m, batch_axis=0, max_batch=4)
        x = _x(1, 6)

        async def main() -> tuple[int, int, int, list[Array]]:
            first = await forward.warm_up(x)
            m.load_state_dict({k: v * 2 for k, v in m.state_dict().items()})
            again = await forward.warm_up(x)
            before = len(forward.programs)
            outs = list(await asyncio.gather(*(forward(x) for _ in range(4))))
            return first, again, len(forward.programs) - before, outs

        first, again, new, outs = dataflow.run(main)
        assert (first, again, new) == (3, 3, 0)
        for out in outs:
            np.testing.assert_allclose(out, _reference(m, x), rtol=1e-5, atol=1e-5)


class TestArgumentErrors:
    def test_keywords_are_refused_clearly(self) -> None:
        forward = dataflow.compile(Mlp())

        async def main() -> None:
            with pytest.raises(dataflow.DataflowTypeError, match=r"by position .* keyword\(s\) x"):
                await forward(x=_x(4, 6))

        dataflow.run(main)

    def test_a_tuple_of_arrays_says_to_pass_them_one_by_one(self) -> None:
        forward = dataflow.compile(ops.nn.LSTM(5, 7, seed=0))
        x, h0 = _x(4, 2, 5), np.zeros((1, 2, 7), np.float32)

        async def main() -> None:
            with pytest.raises(dataflow.DataflowTypeError, match=r"a tuple of arrays .* one by"):
                await forward(x, (h0, h0))

        dataflow.run(main)

    def test_a_tuple_of_tensors_is_refused_too(self) -> None:
        """Tensors are hashable: a tuple of them was taken as a static argument, keyed by
        the Tensors' identity, so every call traced a plan of its own, all kept."""
        forward = dataflow.compile(ops.nn.LSTM(5, 7, seed=0))
        x = _x(4, 2, 5)

        async def main() -> None:
            h0 = ops.tanh(np.zeros((1, 2, 7), np.float32))
            for _ in range(2):
                with pytest.raises(dataflow.DataflowTypeError, match=r"tuple of arrays .* one"):
                    await forward(x, (h0, h0))
            with pytest.raises(dataflow.DataflowTypeError, match=r"tuple of arrays .* one"):
                await forward(x, (1, (h0,)))  # (nested)
            assert not forward.programs

        dataflow.run(main)


def _stuck_kernel(x: Any, gate: threading.Event) -> Any:
    gate.wait(10)
    return x


_stuck = dataflow.op("stuck_c", meta=lambda x, g: ops.spec_of(x), handle=ops.Tensor)(_stuck_kernel)
_stuck_timed = dataflow.op(
    "stuck_timed_c", meta=lambda x, g: ops.spec_of(x), handle=ops.Tensor, timeout=0.05
)(_stuck_kernel)


class TestTimeouts:
    """Op timeouts apply to a compiled plan's nodes as to eager ops: the call fails with
    OpTimeoutError naming the op (a plan ran every kernel to its end, however long)."""

    @pytest.mark.parametrize("batch_axis", [None, 0], ids=["plain", "batched"])
    @pytest.mark.parametrize("where", ["op", "runtime"])
    def test_a_kernel_past_its_timeout_fails_the_call(
        self, where: str, batch_axis: int | None
    ) -> None:
        gate = threading.Event()
        stuck = _stuck_timed if where == "op" else _stuck

        async def model(x: Any) -> Any:
            return ops.add(stuck(x, gate), 1.0)

        forward = dataflow.compile(model, batch_axis=batch_axis)
        x = _x(1, 3)

        async def main() -> list[str]:
            gate.set()
            for _ in range(40):  # measured short: a plan the loop's thread runs, if untimed
                await forward(x)
            gate.clear()
            errors = []
            for call in (model, forward, forward):  # eager, then compiled twice
                with pytest.raises(dataflow.OpTimeoutError) as info:
                    await dataflow.materialize(await call(x))
                errors.append(str(info.value))
            return errors

        try:
            op_timeout = 0.05 if where == "runtime" else None
            errors = dataflow.run(main, interop_threads=2, op_timeout=op_timeout)
        finally:
            gate.set()  # the stuck kernels return, and their abandoned threads end
            for t in threading.enumerate():
                if t.name.startswith("interop"):
                    t.join(10)
        for message in errors:
            assert f"timeout of op '{stuck.name}'" in message

    def test_a_timed_elementwise_op_is_not_fused(self) -> None:
        """Fusion keeps an op with a timeout a node of its own (fused, it ran untimed)."""
        timed_neg = dataflow.op("timed_neg_c", meta=ops.spec_of, handle=ops.Tensor, timeout=5.0)(
            np.negative
        )

        async def model(x: Any) -> Any:
            return ops.tanh(timed_neg(ops.add(x, 1.0)))

        forward = dataflow.compile(model)

        async def main() -> Array:
            out: Array = await forward(_x(2, 3))
            return out

        np.testing.assert_allclose(dataflow.run(main), np.tanh(-(_x(2, 3) + 1)), rtol=1e-6)
        (prog,) = forward.programs.values()
        assert "timed_neg_c" in [node.op.name for node in prog.graph.nodes]


async def _inner_fn(x: Any) -> Any:
    return ops.tanh(ops.add(x, 1.0))


class TestNested:
    """A compiled forward called by a program being traced (``dataflow.trace``, or another
    compiled forward's first call) records its ops there, as the function it compiles would:
    its launch read the traced input's value, so the outer graph kept the example's result
    as a constant (or compiling refused the program: "the program awaited an input's value")."""

    def test_a_compiled_forward_inside_a_compiled_forward(self) -> None:
        inner = dataflow.compile(_inner_fn)

        async def outer_fn(x: Any) -> Any:
            return ops.multiply(await inner(x), 2.0)

        outer = dataflow.compile(outer_fn)
        xs = [_x(2, 3, seed=k) for k in range(3)]

        async def main() -> list[Array]:
            return [await outer(x) for x in xs]

        for x, got in zip(xs, dataflow.run(main), strict=True):
            np.testing.assert_allclose(got, np.tanh(x + 1) * 2, rtol=1e-6)

    def test_a_compiled_forward_inside_a_trace(self) -> None:
        inner = dataflow.compile(_inner_fn)

        async def outer_fn(x: Any) -> Any:
            return ops.multiply(await inner(x), 2.0)

        with warnings.catch_warnings():
            warnings.simplefilter("error", dataflow.TracerWarning)
            graph = dataflow.trace(outer_fn, _x(2, 3))
        assert not graph.constants
        x = _x(2, 3, seed=5)
        np.testing.assert_allclose(graph.run(x), np.tanh(x + 1) * 2, rtol=1e-6)
