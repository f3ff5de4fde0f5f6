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
