"""Cross-request batching (``dataflow._batching``): what a batched call's caller sees."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

import dataflow
import ops

Array = np.ndarray[Any, Any]


def _gate_kernel(x: Any, gate: threading.Event) -> Any:
    gate.wait(10)
    return x


_gate = dataflow.op("gate_b", meta=lambda x, g: ops.spec_of(x), handle=ops.Tensor, inline=False)(
    _gate_kernel
)


def _gated(gate: threading.Event) -> Any:
    """A model whose batches wait for ``gate`` (so the next calls gather meanwhile)."""

    async def model(x: Any) -> Any:
        return ops.add(_gate(x, gate), 1.0)

    return model


class TestInputs:
    """A batched call's arrays are the caller's as they were at the call, as an eager op's
    and an unbatched compiled call's are (``dataflow._protect``)."""

    @pytest.mark.parametrize("rows", [2, 64], ids=["small-copied", "big-frozen"])
    def test_a_write_after_the_call_is_not_read(self, rows: int) -> None:
        """A caller's write to its input while its call waits for its batch: the batch
        read the written values (the result of x + 1 was 100 + 1)."""
        gate = threading.Event()
        forward = dataflow.compile(_gated(gate), batch_axis=0, max_wait=5.0)
        shape = (rows, 512)  # 4 KiB or 128 KiB of float32: copied, or made read-only

        async def main() -> tuple[Array, str]:
            gate.set()
            await forward(np.zeros(shape, np.float32))
            gate.clear()
            busy = asyncio.ensure_future(forward(np.zeros(shape, np.float32)))
            await asyncio.sleep(0.02)  # running, held by the gate: the next call waits
            x = np.ones(shape, np.float32)
            call = asyncio.ensure_future(forward(x))
            await asyncio.sleep(0.02)  # in its open batch
            try:
                x[:] = 100.0
                wrote = "written"
            except ValueError:
                wrote = "read-only"
                assert any("batched call" in n for n in dataflow.frozen_by(x))
            gate.set()
            await busy
            out: Array = await asyncio.wait_for(call, 30)
            x[:] = 7.0  # writeable again once the call has its result
            return out, wrote

        out, wrote = dataflow.run(main, interop_threads=2)
        np.testing.assert_array_equal(out, np.full(shape, 2.0, np.float32))
        assert wrote == ("written" if rows == 2 else "read-only")

    def test_a_cancelled_callers_input_is_writeable_again(self) -> None:
        """A caller that stops waiting gets its (big, read-only) input back at once: its
        batch will not read it."""
        gate = threading.Event()
        forward = dataflow.compile(_gated(gate), batch_axis=0, max_wait=5.0)
        shape = (64, 512)

        async def main() -> None:
            gate.set()
            await forward(np.zeros(shape, np.float32))
            gate.clear()
            busy = asyncio.ensure_future(forward(np.zeros(shape, np.float32)))
            await asyncio.sleep(0.02)
            x = np.ones(shape, np.float32)
            call = asyncio.ensure_future(forward(x))
            await asyncio.sleep(0.02)
            assert not x.flags.writeable
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            x[:] = 3.0
            gate.set()
            await busy

        dataflow.run(main, interop_threads=2)


class TestWhenBatchesLaunch:
    """An open batch waits at most ``max_wait``, and only while a batch of its model runs:
    calls that gathered meanwhile launch as soon as the model is free."""

    def test_an_open_batch_launches_when_the_running_one_ends(self) -> None:
        """Calls gathered behind a running batch launch when it ends, not at ``max_wait``
        (they waited out the whole minute, the model idle)."""
        gate = threading.Event()
        forward = dataflow.compile(_gated(gate), batch_axis=0, max_wait=60.0)
        xs = [np.full((1, 3), k, np.float32) for k in range(3)]

        async def main() -> list[Array]:
            gate.set()
            await forward(xs[0])
            gate.clear()
            busy = asyncio.ensure_future(forward(xs[0]))
            await asyncio.sleep(0.02)
            calls = [asyncio.ensure_future(forward(x)) for x in xs[1:]]  # one open batch
            await asyncio.sleep(0.02)
            gate.set()
            await busy
            return [await asyncio.wait_for(c, 10) for c in calls]

        outs = dataflow.run(main, interop_threads=2)
        for x, got in zip(xs[1:], outs, strict=True):
            np.testing.assert_array_equal(got, x + 1)

    def test_closing_the_runtime_does_not_wait_out_max_wait(self) -> None:
        """Calls still gathering when the runtime's block ends: the block's exit waits for
        the running batch, then for theirs, not for their minute-long timer."""
        gate = threading.Event()
        forward = dataflow.compile(_gated(gate), batch_axis=0, max_wait=60.0)
        x = np.ones((1, 3), np.float32)

        async def main() -> list[Array]:
            async with dataflow.Runtime(interop_threads=2):
                gate.set()
                await forward(x)
                gate.clear()
                calls = [asyncio.ensure_future(forward(x))]  # runs, held by the gate
                await asyncio.sleep(0.02)
                calls += [asyncio.ensure_future(forward(x)) for _ in range(2)]
                await asyncio.sleep(0.02)
                gate.set()
            return [await c for c in calls]

        outs = asyncio.run(asyncio.wait_for(main(), 10))
        for got in outs:
            np.testing.assert_array_equal(got, x + 1)

    @pytest.mark.parametrize("spins", range(5))
    def test_a_batch_cancelled_before_it_started_frees_the_model(self, spins: int) -> None:
        """The last caller of a batch its timer just launched leaves before the batch's task
        took its first step: the task never runs (nor its cleanup), and the model stayed
        marked running: every later call of that shape waited ``max_wait`` for nothing."""
        gate = threading.Event()
        forward = dataflow.compile(_gated(gate), batch_axis=0, max_wait=0)
        x = np.ones((1, 3), np.float32)

        async def main() -> dict[Any, int]:
            gate.set()
            await forward(x)
            gate.clear()
            busy = asyncio.ensure_future(forward(x))
            await asyncio.sleep(0.02)
            call = asyncio.ensure_future(forward(x))  # its timer fires in two iterations
            for _ in range(spins):
                await asyncio.sleep(0)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            gate.set()
            await busy
            await asyncio.sleep(0.05)
            return dict(forward._running)

        assert dataflow.run(main, interop_threads=2) == {}


_W = np.ones((3, 4), np.float32)


async def _slow_trace_matmul(x: Any) -> Any:
    await asyncio.sleep(0.05)  # a slow trace: the next calls gather into one batch meanwhile
    return ops.matmul(x, _W)


class TestErrors:
    def test_a_failed_trace_names_each_callers_own_shape(self) -> None:
        """Calls that gathered into a batch whose trace fails get the error their own call
        gets, naming their shapes (each got one error object naming the batch's (2, 5))."""
        forward = dataflow.compile(_slow_trace_matmul, batch_axis=0)
        xs = [np.ones((1, 5), np.float32), np.ones((1, 5), np.float32), np.ones((3, 5), np.float32)]

        async def main() -> list[Any]:
            return list(await asyncio.gather(*(forward(x) for x in xs), return_exceptions=True))

        errors = dataflow.run(main)
        for x, err in zip(xs, errors, strict=True):
            assert isinstance(err, dataflow.OpInputError)
            assert f"shapes {x.shape} and (3, 4)" in str(err)
        assert len({id(e) for e in errors}) == len(errors)
