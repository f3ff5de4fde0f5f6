"""Deferred ops do not read inputs changed after the call (issue #14.1)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import dataflow
import ops
from dataflow._protect import COPY_BYTES
from tests._helpers import gated

Array = np.ndarray[Any, Any]


def _read(x: Any, y: Any) -> Any:
    return np.asarray(y, dtype=np.float64).copy()


# An op that runs later: it waits for `x` (gated), and returns a copy of `y` as it then is.
later = dataflow.op(
    "later", meta=lambda x, y: ops.TensorSpec(np.shape(y), np.dtype(np.float64)),
    handle=ops.Tensor, inline=False,
)(_read)  # fmt: skip


def _deferred(y: Any, mutate: Any) -> tuple[Array, bool]:
    """Run ``later(gate, y)``, call ``mutate()`` while it waits; (its value, whether the
    mutation raised)."""

    async def main() -> tuple[Array, bool]:
        gate = threading.Event()
        out = later(gated(np.zeros(1), gate), y)
        refused = False
        try:
            mutate()
        except ValueError:
            refused = True
        gate.set()
        return await out, refused

    return dataflow.run(main, interop_threads=2)


class TestSmallArraysAreCopied:
    def test_the_value_at_the_call_is_used(self) -> None:
        """The issue's example: x changed after the call does not change the result."""
        x = np.ones(1000, np.float32)

        def mutate() -> None:
            x[:] = 100.0

        value, refused = _deferred(x, mutate)
        assert not refused and np.all(value == 1.0) and np.all(x == 100.0)

    def test_a_small_view_is_copied_too(self) -> None:
        """A view argument is copied: writing its base later changes nothing."""
        base = np.arange(20.0)
        view = base[::2]

        def mutate() -> None:
            base[:] = -1

        value, _ = _deferred(view, mutate)
        np.testing.assert_array_equal(value, np.arange(0.0, 20.0, 2))

    @pytest.mark.parametrize("layout", ["F", "reversed"])
    def test_the_copy_keeps_the_memory_order(self, layout: str) -> None:
        """A deferred float32 sum of a Fortran-order (or reversed) array is numpy's, bit for
        bit: the copy was C-order, and numpy's float sums add in memory order."""
        x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
        x = np.asfortranarray(x) if layout == "F" else x[::-1, ::-1]
        assert np.sum(x) != np.sum(np.ascontiguousarray(x)) or layout != "F"

        async def main() -> Any:
            return await ops.sum(x)  # queued for the pool (inline threshold 0): copied

        old = dataflow.get_inline_threshold()
        dataflow.set_inline_threshold(0.0)
        try:
            got = dataflow.run(main, interop_threads=2)
        finally:
            dataflow.set_inline_threshold(old)
        assert got == np.sum(x) and got.dtype == np.float32

    def test_arrays_inside_containers(self) -> None:
        """Arrays inside a list argument are protected like top-level ones."""
        parts = [np.ones(3), np.ones(3)]

        async def main() -> Array:
            gate = threading.Event()
            out = ops.concatenate([later(gated(np.zeros(1), gate), np.zeros(3)), *parts])
            parts[0][:] = 7
            gate.set()
            return await out

        np.testing.assert_array_equal(dataflow.run(main), np.r_[np.zeros(3), 1, 1, 1, 1, 1, 1])


class TestLargeArraysAreFrozen:
    def test_a_write_is_refused_until_the_op_has_run(self) -> None:
        """A big input is read-only while an op still has to read it, writeable after."""
        big = np.ones(COPY_BYTES // 8 + 1)

        def mutate() -> None:
            big[:] = 5

        value, refused = _deferred(big, mutate)
        assert refused and np.all(value == 1.0)
        assert big.flags.writeable
        big[:] = 5  # free again

    def test_frozen_by_names_the_pending_tasks(self) -> None:
        """dataflow.frozen_by(array) names the tasks holding it."""
        big = np.ones(COPY_BYTES)

        async def main() -> list[str]:
            gate = threading.Event()
            out = later(gated(np.zeros(1), gate), big)
            names = dataflow.frozen_by(big)
            gate.set()
            await out
            assert dataflow.frozen_by(big) == []
            return names

        names = dataflow.run(main)
        assert len(names) == 1 and names[0].startswith("later#")

    def test_the_base_of_a_big_view_is_frozen_too(self) -> None:
        """Writing the array a view was taken from is refused as well."""
        base = np.ones((4, COPY_BYTES))
        view = base[1]

        def mutate() -> None:
            base[1, 0] = 9

        value, refused = _deferred(view, mutate)
        assert refused and np.all(value == 1.0)
        assert base.flags.writeable and view.flags.writeable

    def test_a_view_of_a_view_freezes_the_whole_chain(self) -> None:
        """A view of a view: numpy points it at the array owning the memory, so writing the
        base is refused (writing through the middle view, made before the call, is not
        caught: the module docstring's limit), and all three are writeable again once the
        op has run."""
        base = np.ones((4, 2, COPY_BYTES))
        middle = base[1]
        view = middle[0]
        refused: list[bool] = []

        def mutate() -> None:
            for target in (middle, base):
                try:
                    target[0, 0] = 9.0
                except ValueError:
                    refused.append(True)
                else:
                    refused.append(False)

        value, _ = _deferred(view, mutate)
        assert view.base is base
        assert refused == [False, True] and value[0] == 9.0 and np.all(value[1:] == 1.0)
        assert base.flags.writeable and middle.flags.writeable and view.flags.writeable

    def test_a_big_keyword_argument_is_frozen_too(self) -> None:
        """Arrays passed by keyword are protected like positional ones."""
        big = np.ones(COPY_BYTES)

        async def main() -> tuple[bool, bool]:
            gate = threading.Event()
            out = later(gated(np.zeros(1), gate), y=big)
            during = big.flags.writeable
            gate.set()
            await out
            return during, big.flags.writeable

        assert dataflow.run(main, interop_threads=2) == (False, True)

    def test_keywords_are_protected_beside_plain_ones(self) -> None:
        """A small array by keyword is copied (the kernel sees it as it was) and a big one
        frozen, whatever plain values (ints, None, strings) the other keywords hold; plain
        values only pass as they are."""
        from dataflow._protect import protect
        from dataflow._signature import Signature
        from dataflow._task import Task

        small, big = np.ones(3), np.ones(COPY_BYTES)
        task = Task(Signature("k"), _read, (), {"axis": 0, "y": small, "z": None}, None)
        protect(task)
        assert task.kwargs is not None and task.kwargs["y"] is not small
        assert task.kwargs["axis"] == 0 and task.kwargs["z"] is None
        task = Task(Signature("k"), _read, (), {"name": "a", "y": big}, None)
        protect(task)
        assert task.kwargs is not None and task.kwargs["y"] is big and not big.flags.writeable
        dataflow._protect.thaw(task)
        assert big.flags.writeable
        plain = {"axis": 1, "keepdims": True}
        task = Task(Signature("k"), _read, (), plain, None)
        protect(task)
        assert task.kwargs == {"axis": 1, "keepdims": True} and task.frozen is None

    def test_two_readers_hold_it_until_both_ran(self) -> None:
        """An array read by two pending tasks stays read-only until the second has run."""
        big = np.ones(COPY_BYTES)

        async def main() -> list[bool]:
            g1, g2 = threading.Event(), threading.Event()
            a = later(gated(np.zeros(1), g1), big)
            b = later(gated(np.zeros(1), g2), big)
            states = [big.flags.writeable]
            g1.set()
            await a
            states.append(big.flags.writeable)
            g2.set()
            await b
            states.append(big.flags.writeable)
            return states

        assert dataflow.run(main, interop_threads=3) == [False, False, True]

    def test_failed_and_cancelled_tasks_release_their_arrays(self) -> None:
        """A task that fails upstream, or is cancelled, never runs and still thaws."""
        big = np.ones(COPY_BYTES)
        boom = dataflow.op("boom_p", meta=ops.spec_of, handle=ops.Tensor, inline=False)(
            lambda x: (_ for _ in ()).throw(ValueError("no"))
        )

        async def main() -> None:
            gate = threading.Event()
            failing = later(boom(gated(np.zeros(1), gate)), big)
            cancelled = later(gated(np.zeros(1), gate), big)
            assert cancelled.cancel()
            gate.set()
            with pytest.raises(ValueError):
                await failing

        dataflow.run(main)
        assert big.flags.writeable

    def test_read_only_arrays_are_left_alone(self) -> None:
        """An array the caller made read-only is not copied, frozen or thawed."""
        big = np.ones(COPY_BYTES)
        big.flags.writeable = False

        value, _ = _deferred(big, lambda: None)
        assert not big.flags.writeable and np.all(value == 1.0)


class TestInlineOpsAreUntouched:
    def test_an_op_that_runs_at_dispatch_needs_no_protection(self) -> None:
        """A small op with ready inputs runs at the call: its input stays writeable."""
        x = np.ones(3)

        async def main() -> bool:
            y = ops.add(x, 1.0)
            assert y.done()
            return bool(x.flags.writeable)

        assert dataflow.run(main)
