"""``os.fork()`` from a process whose runtime is open: the child starts with no pool, no lock
held and no array frozen, and runs a runtime of its own (docs/hardening.md, "Processes")."""

from __future__ import annotations

import os
import select
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import dataflow
from dataflow import _blas, _pool
from tests._helpers import gated, where_run

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")

#: How long a child may take; past it, it is taken for hung and killed.
CHILD_SECONDS = 20.0


def in_child(fn: Callable[[], str]) -> str:
    """Run ``fn`` in a forked child and return what it returned (or raise what went wrong:
    an error in the child, or a child still running after CHILD_SECONDS)."""
    r, w = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns that forking a process with threads may deadlock the child:
        # what these tests check does not.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: report and leave, whatever happens
        code = 1
        try:
            os.close(r)
            try:
                message = "ok " + fn()
                code = 0
            except BaseException as exc:
                message = f"error {type(exc).__name__}: {exc}"
            os.write(w, message.encode())
        finally:
            os._exit(code)
    os.close(w)
    try:
        deadline = time.monotonic() + CHILD_SECONDS
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise AssertionError(f"the forked child hung (killed after {CHILD_SECONDS} s)")
            time.sleep(0.02)
        chunks = []
        while select.select([r], [], [], 0)[0]:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
    message = b"".join(chunks).decode()
    assert os.waitstatus_to_exitcode(status) == 0, message or f"child status {status}"
    assert message.startswith("ok "), message
    return message[3:]


def child_run() -> str:
    """In the child: a runtime of its own, whose op must run on a pool thread."""

    async def main() -> str:
        return str(await where_run(np.ones(1)))

    return dataflow.run(main, interop_threads=2)


class TestForkedChild:
    def test_a_child_forked_while_a_runtime_runs_opens_its_own(self) -> None:
        """The child inherited the shared pool's bookkeeping but none of its threads: its
        first runtime queued work for threads that do not exist there, and hung."""
        gate = threading.Event()

        async def main() -> str:
            blocked = gated(np.ones(1), gate)  # a pool thread busy at the fork
            try:
                return in_child(child_run)
            finally:
                gate.set()
                await blocked

        assert dataflow.run(main, interop_threads=2).startswith("interop-")

    def test_a_child_forked_while_the_graph_lock_is_held(self) -> None:
        """A pool thread holding the scheduling lock at the fork left it held in the child
        (the thread does not exist there to release it): the child's first op hung."""
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with _pool.GRAPH_LOCK:
                held.set()
                release.wait(CHILD_SECONDS)

        t = threading.Thread(target=hold)
        t.start()
        held.wait()
        try:
            assert in_child(child_run).startswith("interop-")
        finally:
            release.set()
            t.join()

    def test_arrays_frozen_at_the_fork_are_writeable_in_the_child(self) -> None:
        """An array a pending op had frozen (read-only until the op ran) stayed read-only in
        the child for good: the op never runs there."""
        gate = threading.Event()
        big = np.zeros(1 << 16)  # over COPY_BYTES: frozen, not copied

        def write() -> str:
            big[0] = 1.0
            return repr(dataflow.frozen_by(big))

        async def main() -> str:
            pending = gated(big, gate)
            try:
                assert not big.flags.writeable
                return in_child(write)
            finally:
                gate.set()
                await pending

        assert dataflow.run(main, interop_threads=2) == "[]"
        assert big.flags.writeable and big[0] == 0.0  # the parent's is the parent's

    def test_the_blas_governor_is_off_in_the_child(self) -> None:
        """A runtime governing BLAS's thread count at the fork: the child had no runtime open
        but kept the governor (and BLAS's governed count) for good."""

        def state() -> str:
            return f"{_blas.GOVERNOR} {_blas._users}"

        async def main() -> str:
            if _blas.GOVERNOR is None:
                pytest.skip("BLAS is not governed here (not a serializing OpenBLAS)")
            return in_child(state)

        assert dataflow.run(main, interop_threads=2) == "None 0"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX only")
def test_child_run_helper_reports_errors() -> None:
    """The helper raises what went wrong in the child (so a passing test means it ran)."""

    def bad() -> Any:
        raise ValueError("in the child")

    with pytest.raises(AssertionError, match="ValueError: in the child"):
        in_child(bad)
