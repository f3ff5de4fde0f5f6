"""The Dask backend: the same programs on a ``distributed`` cluster, with the local results."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

import dataflow
import ops
from dataflow import (
    CancelledTaskError,
    DataflowError,
    OpInputError,
    OpOutputError,
    OpTimeoutError,
    TaskError,
)
from dataflow.dask import Call as _Call
from dataflow.dask import DaskBackend, KernelFailed, WorkerLostError, run_op
from dataflow.dask import Ref as _Ref
from dataflow.dask import fill as _fill
from dataflow.dask._client import HangUpQuietly
from dataflow.dask._lost import dropped, killed_worker_error, lost_workers
from examples.lstm_ensemble import Ensemble, ensemble_forked
from tests._helpers import Arr, Spec, add, boom, neg_inline, sleep_op, where_run

distributed = pytest.importorskip("distributed")
dask_config = pytest.importorskip("dask.config")

ROOT = Path(__file__).resolve().parent.parent
Array = np.ndarray[Any, Any]


@pytest.fixture(autouse=True, scope="module")
def _restore_environ() -> Iterator[None]:
    """Put this process's environment back after this module's tests: a cluster with worker
    processes (distributed's nanny) sets OMP_, MKL_ and OPENBLAS_NUM_THREADS,
    MALLOC_TRIM_THRESHOLD_ and more in it for its workers, and every later test's
    subprocesses would inherit them (the million-op stress test's child then grew 300 MiB
    against its 200 MiB bound). Module scope, so it is set up before the module's clusters
    and torn down after them; pytest's own PYTEST_CURRENT_TEST is left to pytest."""
    saved = dict(os.environ)
    yield
    own = "PYTEST_CURRENT_TEST"
    for key in [k for k in os.environ if k not in saved and k != own]:
        del os.environ[key]
    for key, value in saved.items():
        if key != own and os.environ.get(key) != value:
            os.environ[key] = value


# -- kernels the tests ship (module level: worker processes import them by name) -------------


def _like(x: Any, *_: Any) -> Spec:
    return Spec(np.shape(x), getattr(x, "dtype", np.dtype(float)))


def _gate_kernel(x: Any, where: str) -> Any:
    """Say which process runs it (a file ``running-PID``), then wait for the file ``go``."""
    folder = Path(where)
    (folder / f"running-{os.getpid()}").touch()
    deadline = time.monotonic() + 60
    while not (folder / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never opened the gate")
        time.sleep(0.005)
    return x


def _die_kernel(x: Any, test_pid: int) -> Any:
    """Kill the worker process running it, as a segfaulting kernel would."""
    if os.getpid() == test_pid:  # an in-process worker: never kill the test itself
        raise RuntimeError("_die_kernel must run in a worker process")
    os.kill(os.getpid(), signal.SIGKILL)
    return x


class Unprintable(Exception):
    """An exception whose __str__ raises (so its message cannot be built from str())."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken")


def _unprintable_kernel(x: Any) -> Any:
    raise Unprintable("the original")


class Unpicklable(Exception):
    """An exception that cannot be pickled (so it cannot travel back from a worker)."""

    def __reduce__(self) -> Any:
        raise TypeError("no pickle")


def _unpicklable_kernel(x: Any) -> Any:
    raise Unpicklable("the original")


class Coded(Exception):
    """An exception whose constructor takes other arguments than its message (pickle calls
    the class with ``args``, the message alone, which this constructor refuses)."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"code {code}: {detail}")
        self.code = code
        self.detail = detail


class Locked(Exception):
    """An exception holding an attribute that does not pickle (a lock)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()
        self.code = 5


def _by_value_class() -> type[Exception]:
    class ByValue(Exception):
        """An exception class the standard pickle cannot find by name (as a class of the
        client's ``__main__`` on a worker process, which cloudpickle sent there by value)."""

    return ByValue


ByValue = _by_value_class()


def _by_value_kernel(x: Any) -> Any:
    raise ByValue("defined by value")


def _locked_arg_kernel(x: Any, lock: Any) -> Any:
    with lock:
        return x


class Named(Exception):
    """An exception whose one-argument constructor builds its message: pickle calls it again
    with that message, and garbles it ("no such thing: no such thing: x")."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no such thing: {name}")


def _coded_kernel(x: Any) -> Any:
    raise Coded(7, "bad thing")


def _named_kernel(x: Any) -> Any:
    raise Named("x")


def _grouped_kernel(x: Any) -> Any:
    raise ExceptionGroup("several", [Named("y"), Coded(8, "in a group")])


def _locked_kernel(x: Any) -> Any:
    raise Locked("holds a lock")


def _exit_kernel(x: Any, how: str) -> Any:
    """Raise what ends a program: sys.exit(3), or a KeyboardInterrupt."""
    if how == "exit":
        sys.exit(3)
    raise KeyboardInterrupt


def _poisoned() -> Any:
    raise ValueError("poisoned when unpickled")


class Poisoned:
    """An argument that pickles, but raises where it is unpickled (Dask's scheduler)."""

    def __reduce__(self) -> Any:
        return (_poisoned, ())


def _wrong_shape_kernel(x: Any) -> Any:
    return np.zeros(7)


def _wrong_dtype_kernel(x: Any) -> Any:
    return np.asarray(x).astype(np.uint8)


class Pair(NamedTuple):
    a: Any
    b: Any


def _pair_sum_kernel(p: Pair) -> Any:
    return np.add(p.a, p.b)


def _pair_meta(p: Pair) -> ops.TensorSpec:
    return ops.spec_of(p.b)


gate = ops.define("gate", _gate_kernel, lambda x, where: ops.spec_of(x), inline=False)
die = dataflow.op("die", meta=_like, handle=Arr, inline=False)(_die_kernel)
unprintable = dataflow.op("unprintable", meta=_like, handle=Arr, inline=False)(_unprintable_kernel)
unpicklable = dataflow.op("unpicklable", meta=_like, handle=Arr, inline=False)(_unpicklable_kernel)
coded = ops.define("coded", _coded_kernel, ops.spec_of, inline=False)
named = ops.define("named", _named_kernel, ops.spec_of, inline=False)
grouped = ops.define("grouped", _grouped_kernel, ops.spec_of, inline=False)
locked_arg = ops.define(
    "locked_arg", _locked_arg_kernel, lambda x, lock: ops.spec_of(x), inline=False
)
by_value = ops.define("by_value", _by_value_kernel, ops.spec_of, inline=False)
locked = ops.define("locked", _locked_kernel, ops.spec_of, inline=False)
exiting = ops.define("exiting", _exit_kernel, lambda x, how: ops.spec_of(x), inline=False)
wrong_shape = ops.define("wrong_shape", _wrong_shape_kernel, ops.spec_of, inline=False)
wrong_dtype = ops.define("wrong_dtype", _wrong_dtype_kernel, ops.spec_of, inline=False)
pair_sum = ops.define("pair_sum", _pair_sum_kernel, _pair_meta, inline=False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two single-threaded in-process workers on loopback TCP, shared by this module."""
    c = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=False,
        protocol="tcp",  # processes=False with host= fails; tcp keeps it on loopback
        dashboard_address=":0",  # the scheduler always serves HTTP; 8787 may be taken
        local_directory=str(tmp_path_factory.mktemp("dask")),
        silence_logs=logging.ERROR,
    )
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def address(cluster: Any) -> str:
    return str(cluster.scheduler_address)


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two single-threaded worker processes under nannies (a killed one is restarted)."""
    # The cluster closes the nanny of a worker that is missing 15 s after a loss of the same
    # worker (by name), so a worker killed twice, 15 s apart, would not come back.
    with dask_config.set({"distributed.deploy.lost-worker-timeout": "1h"}):
        c = distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",  # the scheduler always serves HTTP; 8787 may be taken
            local_directory=str(tmp_path_factory.mktemp("dask-processes")),
            silence_logs=logging.CRITICAL,  # the killed workers' tracebacks
        )
        try:
            yield c
        finally:
            c.close()


async def worker_pids(cluster: Any, client: Any) -> dict[str, int]:
    """{address: pid} of the cluster's two workers, once a killed one is gone and replaced."""
    deadline = time.monotonic() + 60
    while True:
        workers = cluster.scheduler.workers  # the scheduler runs in this process
        if len(workers) == 2 and all(ws.status.name == "running" for ws in workers.values()):
            try:
                pids: dict[str, int] = await client.run(os.getpid)
            except OSError:  # a worker the scheduler has not dropped yet
                pids = {}
            if len(pids) == 2:
                return pids
        assert time.monotonic() < deadline, "the cluster did not get its two workers back"
        await asyncio.sleep(0.05)


async def wait_for(paths: Any, what: str, seconds: float = 60.0) -> list[Path]:
    """Poll ``paths()`` (a glob) until it finds something; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not (found := sorted(paths())):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)
    return found


def small_input(steps: int = 5, batch: int = 2, channels: int = 8) -> Array:
    return np.random.default_rng(1).random((steps, batch, channels), dtype=np.float32)


def dask(address: Any, **options: Any) -> dataflow.Runtime:
    """A Dask runtime that ships every op (local_threshold=0) unless told otherwise."""
    options.setdefault("local_threshold", 0.0)
    rt = dataflow.Runtime(backend="dask", address=address, **options)
    assert isinstance(rt.backend, DaskBackend)
    return rt


def counters(rt: dataflow.Runtime) -> DaskBackend:
    """The Dask backend of a runtime, whose counters the tests read."""
    backend = rt.backend
    assert isinstance(backend, DaskBackend)
    return backend


def local_ensemble(ens: Ensemble, x: Array) -> Array:
    async def main() -> Array:
        y: Array = await ens(x)
        return y

    return dataflow.run(main, backend="local")


class TestBackendChoice:
    def test_local_is_the_default(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Runtime() is the plain local runtime, untouched by the Dask backend."""
        monkeypatch.delenv("DATAFLOW_DASK_ADDRESS", raising=False)
        assert dataflow.Runtime().backend.name == "local"

    def test_address_or_env_selects_dask(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """address=, backend='dask' and $DATAFLOW_DASK_ADDRESS select the Dask backend."""
        monkeypatch.delenv("DATAFLOW_DASK_ADDRESS", raising=False)
        assert dataflow.Runtime(address="tcp://127.0.0.1:1").backend.name == "dask"
        monkeypatch.setenv("DATAFLOW_DASK_ADDRESS", "tcp://127.0.0.1:1")
        rt = dataflow.Runtime()
        assert counters(rt).address == "tcp://127.0.0.1:1"
        assert dataflow.Runtime(backend="local").backend.name == "local"

    def test_unknown_backend(self) -> None:
        """An unknown backend name is a ValueError naming the choices."""
        with pytest.raises(ValueError, match="'local' or 'dask'"):
            dataflow.Runtime(backend="ray")

    def test_dask_options_on_the_local_backend(self) -> None:
        """Dask options with backend='local' are a TypeError that names them."""
        with pytest.raises(TypeError, match="address, local_threshold"):
            dataflow.Runtime(backend="local", address="tcp://x:1", local_threshold=0)

    def test_dask_without_a_scheduler(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """backend='dask' alone says where the address comes from."""
        monkeypatch.delenv("DATAFLOW_DASK_ADDRESS", raising=False)
        with pytest.raises(DataflowError, match="DATAFLOW_DASK_ADDRESS"):
            dataflow.Runtime(backend="dask")

    def test_missing_extra_names_it(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without distributed installed, the error says what to install."""
        monkeypatch.setitem(sys.modules, "distributed", None)
        with pytest.raises(DataflowError, match=r"pip install 'dask\[distributed\]>=2024\.1'"):
            dataflow.Runtime(backend="dask", address="tcp://127.0.0.1:1")

    def test_unreachable_scheduler(self) -> None:
        """A scheduler that is not there is a DataflowError naming the address."""

        async def main() -> None:
            async with dataflow.Runtime(address="tcp://127.0.0.1:9", connect_timeout=0.5):
                pass

        with pytest.raises(DataflowError, match=r"cannot connect .*127\.0\.0\.1:9"):
            dataflow.run(main)

    def test_a_cluster_object_as_address(self, cluster: Any) -> None:
        """address= a cluster object (documented) connects to its scheduler: the client the
        runtime made from the object joined the cluster's own loop, and every fetch failed
        (or the run hung)."""

        async def main() -> Any:
            async with dask(cluster) as rt:
                assert counters(rt).client.asynchronous
                return await ops.add(np.ones(2), 1.0)

        np.testing.assert_array_equal(dataflow.run(main), [2.0, 2.0])

    def test_sync_client_is_rejected_with_advice(self, address: str) -> None:
        """client= must be asynchronous on the runtime's loop; the error shows how."""
        client = distributed.Client(address, set_as_default=False)
        try:

            async def main() -> None:
                async with dataflow.Runtime(backend="dask", client=client):
                    pass

            with pytest.raises(DataflowError, match="asynchronous=True"):
                dataflow.run(main)
        finally:
            client.close()


class TestEnsemble:
    def test_ensemble_matches_local(self, address: str, loop: str) -> None:
        """The ensemble on the cluster equals the local backend's; only the output comes back."""
        ens, x = Ensemble(2, 8, seed=0), small_input()
        expected = local_ensemble(ens, x)
        runtimes: list[Any] = []

        async def main() -> Array:
            async with dask(address) as rt:
                runtimes.append(rt)
                y: Array = await ens(x)
            return y

        y = dataflow.run(main, loop=loop)
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
        rt = runtimes[0]
        # At least the four LSTM directions (one lstm_sequence op each) ran on the cluster.
        assert counters(rt).sent >= 2 * 2 and counters(rt).remote_done == counters(rt).sent
        assert counters(rt).fetched == 1, "intermediates were fetched to the client"
        assert counters(rt).local_ops == 0

    def test_manual_forks_match(self, address: str) -> None:
        """The tutorial's fork/wait placement runs on the cluster with the same result."""
        ens, x = Ensemble(2, 8, seed=3), small_input()
        expected = local_ensemble(ens, x)

        async def main() -> Array:
            y: Array = await (await ensemble_forked(ens, x))
            return y

        async def on_dask() -> Array:
            async with dask(address):
                return await main()

        np.testing.assert_allclose(dataflow.run(on_dask), expected, rtol=1e-5, atol=1e-6)

    def test_dataflow_run_with_address(self, address: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """dataflow.run(main, address=...) and $DATAFLOW_DASK_ADDRESS run main on Dask."""
        seen: list[str] = []

        async def main(x: Array) -> Any:
            rt = dataflow.current_runtime()
            assert rt is not None
            seen.append(rt.backend.name)
            return ops.tanh(x) @ np.ones((3, 2), dtype=np.float32)

        x = np.ones((4, 3), dtype=np.float32)
        expected = np.tanh(x) @ np.ones((3, 2), dtype=np.float32)
        np.testing.assert_allclose(dataflow.run(main, x, address=address), expected, rtol=1e-6)
        monkeypatch.setenv("DATAFLOW_DASK_ADDRESS", address)
        np.testing.assert_allclose(dataflow.run(main, x), expected, rtol=1e-6)
        assert seen == ["dask", "dask"]

    @pytest.mark.asyncio
    async def test_kernels_run_on_worker_threads(self, address: str) -> None:
        """A shipped op's kernel runs on a Dask worker thread, not on the client's threads."""
        async with dask(address):
            name = await where_run(np.ones(3))
        assert "Dask" in name, name

    @pytest.mark.asyncio
    async def test_existing_async_client(self, address: str) -> None:
        """client= reuses an asynchronous Client on the loop and leaves it open."""
        async with distributed.Client(address, asynchronous=True, set_as_default=False) as c:
            async with dask(client=c, address=None) as rt:
                y = await add(np.ones(3), 2.0)
            assert counters(rt).sent == 1
            assert c.status == "running"
        np.testing.assert_array_equal(y, [3.0, 3.0, 3.0])

    @pytest.mark.asyncio
    async def test_a_profiled_runtime_on_a_given_client_is_let_go(self, address: str) -> None:
        """A runtime that reported kernel spans through a client it was given (left open)
        leaves no handler on it: Dask's unsubscribe_topic keeps the handler (the backend's
        bound method), so the client held every such runtime, and all it held, until it
        closed. (Dask keeps its handlers in Client._event_handlers.)"""
        async with distributed.Client(address, asynchronous=True, set_as_default=False) as c:
            for _ in range(3):
                async with dask(client=c, address=None) as rt:
                    with dataflow.profile():
                        np.testing.assert_array_equal(await add(np.ones(2), 1.0), [2.0, 2.0])
                    assert counters(rt)._subscribed
            held = [h for h in c._event_handlers.values() if getattr(h, "__self__", None)]
            assert not any(isinstance(h.__self__, DaskBackend) for h in held), held


class TestShipping:
    @pytest.mark.asyncio
    async def test_parameters_are_scattered_once(self, address: str) -> None:
        """A weight passed to every step of a chain is sent once, not once per call."""
        w = np.eye(64, dtype=np.float32) * 0.5
        async with dask(address, scatter_bytes=4096) as rt:
            h = ops.asarray(np.ones((2, 64), dtype=np.float32))
            for _ in range(10):
                h = ops.matmul(h, w)
            y = await h
            assert counters(rt).sent == 10
            assert counters(rt).scattered == 1
            z = await ops.matmul(h, w)  # a second batch reuses the scattered weight
            assert counters(rt).scattered == 1
        np.testing.assert_allclose(y, np.full((2, 64), 0.5**10, dtype=np.float32))
        np.testing.assert_allclose(z, np.full((2, 64), 0.5**11, dtype=np.float32))

    @pytest.mark.asyncio
    async def test_small_ops_stay_local(self, address: str) -> None:
        """With local inputs and a small cost, an op runs on the client; a big one is sent."""
        async with dask(address, local_threshold=1e-3) as rt:
            small = ops.tanh(np.ones(4))
            assert small.done() and counters(rt).sent == 0 and counters(rt).local_ops == 1
            big = add(np.ones(4), 1.0)  # its cost rule says 1e12 flops
            after = neg_inline(big)  # small, but its input is on the cluster: sent too
            np.testing.assert_array_equal(await after, np.full(4, -2.0))
            assert counters(rt).sent == 2 and counters(rt).fetched == 1

    @pytest.mark.asyncio
    async def test_bad_input_raises_at_the_call(self, address: str) -> None:
        """Meta rules run at the call site: a shape error raises at once, nothing is sent."""
        async with dask(address) as rt:
            a = ops.asarray(np.ones((2, 3))) * 2.0
            with pytest.raises(OpInputError):
                ops.matmul(a, np.ones((4, 5)))
            await a
            assert counters(rt).sent == 1

    @pytest.mark.asyncio
    async def test_plain_fork_gets_arrays(self, address: str) -> None:
        """A forked plain function runs on the client and receives its inputs' arrays."""

        def describe(v: Any) -> str:
            return f"{type(v).__name__} {float(v.sum())}"

        async with dask(address) as rt:
            fut = dataflow.fork(describe, add(np.ones(3), 1.0))
            assert await dataflow.wait(fut) == "ndarray 6.0"
            assert counters(rt).sent == 1 and counters(rt).fetched == 1

    @pytest.mark.asyncio
    async def test_ops_called_from_a_pool_thread(self, address: str) -> None:
        """A forked plain function's ops (dispatched from a pool thread) are shipped too."""

        def step(v: Any) -> Any:
            assert threading.current_thread().name.startswith("interop")
            return add(add(v, 1.0), 1.0)

        async with dask(address) as rt:
            pending = await dataflow.wait(dataflow.fork(step, np.zeros(3)))
            np.testing.assert_array_equal(await pending, [2.0, 2.0, 2.0])
            assert counters(rt).sent == 2 and counters(rt).fetched == 1

    @pytest.mark.asyncio
    async def test_multiple_outputs(self, address: str) -> None:
        """An op with several outputs ships once; each output feeds later ops by index."""
        x = np.arange(12.0, dtype=np.float32).reshape(4, 3)
        async with dask(address) as rt:
            a, b = ops.split(ops.asarray(x) * 2.0, 2, axis=0)
            y = await (b - a)
            assert counters(rt).fetched == 1
        np.testing.assert_array_equal(y, np.full((2, 3), 12.0, dtype=np.float32))


class TestWorkerSide:
    def test_unaligned_inputs_are_realigned_once(self) -> None:
        """An unaligned array (as the network delivers some) reaches kernels aligned, once."""
        raw = np.frombuffer(bytearray(4 * 64 + 1), dtype=np.float32, count=64, offset=1)
        assert not raw.flags.aligned
        call = _Call(np.sum, (_Ref(0, None),), None, "sum#1", "sum", 1, None, True)
        first = _fill(call.args, [raw])[0]
        assert first.flags.aligned and first is not raw
        assert _fill(call.args, [raw])[0] is first, "the copy is made once per array"
        assert run_op(call, [raw]) == 0.0
        embedded = _fill((raw,), [])[0]  # inside the task: copied each time, it is not shared
        assert embedded.flags.aligned

    def test_value_check_runs_on_the_worker(self) -> None:
        """A kernel shipped by value is checked against the spec it travels with."""
        spec = ops.TensorSpec((3,), np.dtype(np.float64))
        call = _Call(
            _wrong_shape_kernel, (np.ones(3),), None, "liar#1", "liar", 1, None, False, spec,
            wrong_shape.check,
        )  # fmt: skip
        with pytest.raises(KernelFailed) as info:
            run_op(call, [])
        assert isinstance(info.value.exc, OpOutputError)
        assert info.value.task == "liar#1"

    def test_a_timed_kernel_runs_under_its_timeout(self, tmp_path: Path) -> None:
        """A Call with a timeout fails with OpTimeoutError (which travels back pickled) once
        its kernel outlives it; within it, the kernel's value or its own error comes back."""
        timed = _Call(_gate_kernel, (1.0, str(tmp_path)), None, "gate#1", "gate", 1, None,
                      False, None, None, 0.05)  # fmt: skip
        try:
            with pytest.raises(KernelFailed) as info:
                run_op(timed, [])
        finally:
            (tmp_path / "go").touch()  # the kernel's thread, left running, ends
        back = pickle.loads(pickle.dumps(info.value))
        for failed in (info.value, back):
            assert type(failed.exc) is OpTimeoutError, repr(failed.exc)
            assert (failed.exc.task, failed.exc.op) == ("gate#1", "gate")
            assert "longer than the 0.05 s timeout of op 'gate'" in str(failed.exc)
        quick = _Call(np.add, (1.0, 2.0), None, "add#2", "add", 2, None, False, None, None, 30.0)
        assert run_op(quick, []) == 3.0
        raising = _Call(_coded_kernel, (1.0,), None, "coded#3", "coded", 3, None, False, None,
                        None, 30.0)  # fmt: skip
        with pytest.raises(KernelFailed) as raised:
            run_op(raising, [])
        assert type(raised.value.exc) is Coded

    def test_declared_ops_travel_by_name(self) -> None:
        """A declared op's kernel is found on the worker by its registry name."""
        call = _Call(
            "ops._elementwise:add", (np.ones(2), 1.0), None, "add#1", "add", 1, None, False
        )
        np.testing.assert_array_equal(run_op(call, []), [2.0, 2.0])


class TestErrors:
    @pytest.mark.asyncio
    async def test_kernel_error_at_await(self, address: str) -> None:
        """A worker-side exception is a TaskError naming the op, with the original chained."""
        async with dask(address):
            bad = boom(np.ones(2))
            after = add(bad, 1.0)
            with pytest.raises(TaskError) as info:
                await after
            err = info.value
            assert err.op == "boom" and err.task == bad.task.name
            assert "dask worker" in str(err)
            assert isinstance(err.__cause__, ValueError)
            assert "boom in kernel" in str(err.__cause__)
            with pytest.raises(TaskError) as again:
                await dataflow.wait(bad)
            assert again.value is err, "dependents fail with the failed task's own error"

    def test_unobserved_failure_raised_at_close(self, address: str) -> None:
        """A failure on the cluster that nobody awaited is raised when the runtime closes."""

        async def main() -> None:
            async with dask(address):
                boom(np.ones(2))

        with pytest.raises(dataflow.UnobservedTaskError) as info:
            dataflow.run(main)
        assert isinstance(info.value.__cause__, TaskError)

    @pytest.mark.asyncio
    async def test_failed_input_fails_a_client_side_task(self, address: str) -> None:
        """A forked plain function whose input failed on the cluster fails with that error."""
        async with dask(address):
            bad = boom(np.ones(2))
            fut = dataflow.fork(lambda v: v, bad)
            with pytest.raises(TaskError) as info:
                await fut
            assert info.value.op == "boom"

    @pytest.mark.asyncio
    async def test_unprintable_kernel_error_keeps_the_original(self, address: str) -> None:
        """A kernel error whose __str__ raises is chained, as on the local backend (#17)."""
        async with dask(address):
            bad = unprintable(np.ones(2))
            with pytest.raises(TaskError) as info:
                await add(bad, 1.0)
        check_unprintable(info.value, bad)

    def test_unprintable_kernel_error_matches_the_local_backend(self, address: str) -> None:
        """The local and the Dask backend chain the same original exception."""
        causes = []

        async def main(backend: str, options: dict[str, Any]) -> None:
            async with dataflow.Runtime(backend=backend, **options):
                with pytest.raises(TaskError) as info:
                    await unprintable(np.ones(2))
            causes.append(info.value.__cause__)

        dataflow.run(main, "local", {})
        dataflow.run(main, "dask", {"address": address, "local_threshold": 0.0})
        assert [type(c) for c in causes] == [Unprintable, Unprintable]
        assert [c.args for c in causes] == [("the original",)] * 2  # type: ignore[union-attr]

    def test_unpicklable_kernel_error_fails_its_dependents_with_one_error(
        self, address: str
    ) -> None:
        """An exception that cannot be pickled arrives as a RuntimeError describing it, in a
        TaskError naming the failed op that its dependents share; awaiting one observes it."""
        bad, err = _dependent_fails(address, lambda: unpicklable(np.ones(2)))
        assert err.op == "unpicklable" and err.task == bad.task.name, str(err)
        assert "dask worker" in str(err)
        cause = err.__cause__
        assert type(cause) is RuntimeError, repr(cause)
        assert "Unpicklable: the original" in str(cause) and "could not be pickled" in str(cause)
        assert any("_unpicklable_kernel" in note for note in cause.__notes__)
        assert bad.exception() is err, "dependents fail with the failed task's own error"

    def test_exceptions_with_their_own_constructor_arrive_as_themselves(self, address: str) -> None:
        """A kernel's exception whose __init__ takes other arguments than its message (or
        that holds an attribute that does not pickle) is chained as itself, as on the local
        backend, with its attributes: it was a RuntimeError("... could not be pickled"), so
        the TaskError's type, ``except Coded`` and ``err.__cause__.code`` all differed; one
        whose constructor builds its message from one argument came back with its message
        garbled ("no such thing: no such thing: x"), alone or inside an ExceptionGroup."""
        errors: dict[str, list[TaskError]] = {"local": [], "dask": []}

        async def main(backend: str, options: dict[str, Any]) -> None:
            async with dataflow.Runtime(backend=backend, **options):
                for op in (coded, locked, named, grouped):
                    with pytest.raises(TaskError) as info:
                        await ops.add(op(np.ones(2)), 1.0)
                    errors[backend].append(info.value)

        dataflow.run(main, "local", {})
        dataflow.run(main, "dask", {"address": address, "local_threshold": 0.0})
        for here, there in zip(errors["local"], errors["dask"], strict=True):
            assert type(there) is type(here), (here, there)
            assert type(there.__cause__) is type(here.__cause__), repr(there.__cause__)
            assert repr(there.__cause__) == repr(here.__cause__)
            assert "dask worker" in str(there) and "could not be pickled" not in str(there)
        assert repr(errors["dask"][2].__cause__) == "Named('no such thing: x')"
        cause_coded, cause_locked = (e.__cause__ for e in errors["dask"][:2])
        assert isinstance(cause_coded, Coded)
        assert (cause_coded.code, cause_coded.detail) == (7, "bad thing")
        assert isinstance(cause_locked, Locked) and cause_locked.code == 5
        assert not hasattr(cause_locked, "lock")
        assert any("could not be pickled: lock" in n for n in cause_locked.__notes__)
        assert any("_locked_kernel" in n for n in cause_locked.__notes__)

    @pytest.mark.asyncio
    async def test_an_exception_class_sent_by_value_arrives_as_itself(self, address: str) -> None:
        """An exception whose class only cloudpickle can send (one of the client's __main__,
        which reached the workers by value) arrives as itself: the worker checked it with the
        standard pickle, and sent a RuntimeError("... could not be pickled") instead."""
        async with dask(address):
            with pytest.raises(ByValue) as info:
                await by_value(np.ones(2))
        assert type(info.value.__cause__) is ByValue, repr(info.value.__cause__)
        assert info.value.__cause__.args == ("defined by value",)

    @pytest.mark.asyncio
    async def test_an_argument_that_does_not_pickle_is_named(
        self, address: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """An op whose argument does not pickle fails alone, with an error that says what
        does not pickle: it said "Could not serialize object of type _MapExpr", Dask's graph
        expression, with the cause two exceptions down."""
        caplog.set_level(logging.CRITICAL, logger="distributed.protocol.pickle")
        async with dask(address):
            bad = locked_arg(np.ones(2), threading.Lock())
            good = ops.add(np.ones(2), 1.0)
            np.testing.assert_array_equal(await good, [2.0, 2.0])
            with pytest.raises(TaskError) as info:
                await ops.add(bad, 1.0)
        message = str(info.value)
        assert message.startswith(f"{bad.task.name} could not be sent to the Dask cluster: ")
        assert "cannot pickle '_thread.lock' object" in message, message
        assert "an op's arguments must pickle" in message and "_MapExpr" not in message

    def test_dependents_share_a_failure_that_is_not_the_kernels(self, address: str) -> None:
        """A task that could not run at all (here: its batch, which Dask's scheduler cannot
        unpickle) fails its dependents with its own error, as a kernel's failure does."""
        seen: list[Any] = []

        async def main() -> None:
            async with dask(address):
                bad = add(np.ones(2), Poisoned())
                with pytest.raises(TaskError) as info:
                    await add(bad, 1.0)
                seen.extend([bad, info.value])

        dataflow.run(main)  # no UnobservedTaskError: the one failure was observed
        bad, err = seen
        assert err.task == bad.task.name and "failed on the Dask cluster" in str(err), str(err)
        assert bad.exception() is err, "dependents fail with the failed task's own error"


class TestNewCore:
    """The scheduler core's rules hold on Dask too: value checks, containers, cancellation."""

    @pytest.mark.asyncio
    async def test_kernel_breaking_its_shape_fails_the_task(self, address: str) -> None:
        """A value of another shape than declared is an OpOutputError naming both."""
        async with dask(address) as rt:
            y = wrong_shape(np.ones(3))
            after = ops.add(y, 1.0)
            with pytest.raises(TaskError) as info:
                await after
            assert counters(rt).sent == 2
        err = info.value
        assert err.op == "wrong_shape" and "dask worker" in str(err)
        cause = err.__cause__
        assert isinstance(cause, OpOutputError)
        assert "float64[7]" in str(cause) and "declared float64[3]" in str(cause), str(cause)

    @pytest.mark.asyncio
    async def test_kernel_breaking_its_dtype_fails_the_task(self, address: str) -> None:
        """A value of another dtype than declared is an OpOutputError naming both."""
        async with dask(address):
            with pytest.raises(TaskError) as info:
                await wrong_dtype(np.full(3, 300.0))
        cause = info.value.__cause__
        assert isinstance(cause, OpOutputError)
        assert "float64" in str(cause) and "uint8" in str(cause), str(cause)

    @pytest.mark.asyncio
    async def test_namedtuple_argument_holds_inputs(self, address: str) -> None:
        """Pending values inside a NamedTuple argument are inputs: the kernel gets arrays."""
        a = np.random.default_rng(3).random(4)
        b = np.random.default_rng(4).random(4)
        async with dask(address) as rt:
            slow = sleep_op(a, 0.2)  # on the cluster, not done yet when pair_sum is called
            here = ops.asarray(b) * 1.0  # a value computed on the client
            await here
            y = await pair_sum(Pair(slow, here))
            z = await pair_sum(Pair(a, b))  # plain arrays in it
            assert counters(rt).sent >= 3
        np.testing.assert_allclose(y, a + b)
        np.testing.assert_allclose(z, a + b)

    @pytest.mark.asyncio
    async def test_queued_client_task_is_cancelled(self, address: str) -> None:
        """A task kept on the client, queued behind a fork, cancels as on the local backend."""
        release = threading.Event()

        def slow() -> Array:
            release.wait(10)
            return np.ones(3)

        async with dask(address, local_threshold=1e-3) as rt:
            forked = dataflow.fork(slow)
            queued = neg_inline(forked)  # its input is computed on the client: it stays here
            later = neg_inline(queued)
            assert queued.cancel()
            release.set()
            with pytest.raises(CancelledTaskError):
                await queued
            with pytest.raises(CancelledTaskError):
                await later
            np.testing.assert_array_equal(await dataflow.wait(forked), np.ones(3))
            assert counters(rt).sent == 0

    @pytest.mark.asyncio
    async def test_compiled_forward_runs_on_the_client(self, address: str) -> None:
        """dataflow.compile inside a Dask runtime: the plan runs on the client's lean executor
        (documented in docs/dask.md), with the right result, and sends no op."""

        async def forward(x: Any) -> Any:
            return ops.tanh(ops.add(ops.matmul(x, np.eye(3) * 2.0), 1.0))

        compiled = dataflow.compile(forward)
        x = np.arange(6.0).reshape(2, 3)
        async with dask(address) as rt:
            y = await compiled(x)
            y2 = await compiled(x)  # the prepared plan, launched
            on_cluster = add(x, 1.0)  # a Tensor argument computed on the cluster: fetched
            z = await compiled(on_cluster)
            assert counters(rt).sent == 1 and counters(rt).fetched == 1
        np.testing.assert_allclose(y, np.tanh(x * 2.0 + 1.0))
        np.testing.assert_allclose(y2, y)
        np.testing.assert_allclose(z, np.tanh((x + 1.0) * 2.0 + 1.0))
        assert compiled.launches >= 2


class TestTimeouts:
    def test_op_timeout_applies_on_the_cluster(self, address: str, tmp_path: Path) -> None:
        """A kernel on the cluster that outlives the runtime's op_timeout fails its task, and
        its dependents, with OpTimeoutError, as on the local backend: it ran to its end, and
        the run with it, with no error at all."""
        errors: list[BaseException] = []

        async def main() -> None:
            async with dask(address, op_timeout=0.3) as rt:
                stuck = gate(np.ones(2), str(tmp_path))
                after = ops.add(stuck, 1.0)
                try:
                    with pytest.raises(OpTimeoutError) as info:
                        await after
                finally:
                    (tmp_path / "go").touch()  # let the kernel's thread end
                errors.append(info.value)
                with pytest.raises(OpTimeoutError) as again:
                    await stuck
                assert again.value is info.value, "dependents share the timed-out task's error"
                assert counters(rt).sent == 2
                np.testing.assert_array_equal(await ops.add(np.ones(2), 1.0), [2.0, 2.0])

        dataflow.run(main)
        err = errors[0]
        assert isinstance(err, TimeoutError) and isinstance(err, TaskError)
        assert err.op == "gate" and "dask worker" in str(err), str(err)
        assert "longer than the 0.3 s timeout of op 'gate'" in str(err), str(err)


class TestClientClosed:
    @pytest.mark.asyncio
    async def test_a_client_closed_mid_run_says_so(self, address: str, tmp_path: Path) -> None:
        """A client given with client= and closed while the runtime's ops run fails them with
        a CancelledTaskError that says so (it said "it was cancelled on Dask"), and the
        runtime still closes."""
        client = distributed.Client(address, asynchronous=True, set_as_default=False)
        async with client as c, dask(client=c, address=None) as rt:
            held = ops.add(gate(np.ones(2), str(tmp_path)), 1.0)
            try:
                while counters(rt).sent < 2:
                    await asyncio.sleep(0.01)
                await c.close()
            finally:
                (tmp_path / "go").touch()
            with pytest.raises(CancelledTaskError, match="its Dask client was closed"):
                await held


class TestAfterTheRuntime:
    def test_a_value_left_on_the_cluster_says_so(self, address: str) -> None:
        """A pending tensor awaited after its Dask runtime closed (the block returned it) says
        that its value was left on the cluster and what to do; it said "was not run: it was
        cancelled on Dask". A value awaited inside the block stays valid after it."""

        async def main() -> tuple[Any, Any]:
            async with dask(address):
                fetched = ops.tanh(np.zeros(3)) * 2.0
                await fetched
                left = ops.tanh(np.ones(3)) * 2.0
            return fetched, left

        fetched, left = asyncio.run(main())
        np.testing.assert_array_equal(fetched.result(), np.zeros(3))
        with pytest.raises(CancelledTaskError) as info:
            left.result()
        message = str(info.value)
        assert message.startswith(f"{left.task.name}: its value was left on the Dask cluster")
        assert "inside the `async with dataflow.Runtime(...)` block" in message


class TestCancellation:
    @pytest.mark.asyncio
    async def test_cancel_before_it_ran(self, address: str) -> None:
        """A sent task cancelled before it computed raises CancelledTaskError; so do dependents."""
        async with dask(address):
            slow = sleep_op(np.ones(2), 0.3)
            queued = add(slow, 1.0)
            later = add(queued, 1.0)
            assert queued.cancel()
            with pytest.raises(CancelledTaskError):
                await queued
            with pytest.raises(CancelledTaskError):
                await later
            np.testing.assert_array_equal(await slow, [1.0, 1.0])

    @pytest.mark.asyncio
    async def test_cancel_after_it_was_sent(self, address: str) -> None:
        """Cancelling a task already on the cluster cancels it there, and its dependents."""
        async with dask(address) as rt:
            slow = sleep_op(np.ones(2), 0.5)
            queued = add(slow, 1.0)
            later = add(queued, 1.0)
            while counters(rt).sent < 3:  # wait until the batch has been sent
                await asyncio.sleep(0.01)
            assert queued.cancel()
            with pytest.raises(CancelledTaskError) as first:
                await queued
            with pytest.raises(CancelledTaskError) as second:
                await later
            assert second.value is first.value
            assert not queued.cancel()
            np.testing.assert_array_equal(await slow, [1.0, 1.0])

    def test_body_error_cancels_what_was_sent(self, address: str) -> None:
        """When the body raises, tasks still on the cluster are cancelled, not awaited."""
        handles: list[Arr] = []

        async def main() -> None:
            async with dask(address):
                x = sleep_op(np.ones(2), 0.2)
                for _ in range(20):
                    x = add(x, 1.0)
                handles.append(x)
                await asyncio.sleep(0.05)
                raise KeyError("body failed")

        with pytest.raises(KeyError):
            dataflow.run(main)
        assert isinstance(handles[0].exception(), CancelledTaskError)


class _Drops(dataflow.Instrument):
    """Counts the tasks cancelled without running (the runtime dropped them)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def task_cancelled(self, ts: int, task: Any) -> None:
        self.names.append(task.name)


class TestRequests:
    """A request (a task on the loop) cancelled while its ops run on the cluster: what it sent
    that nobody else wants is cancelled there, as the local backend drops what it queued."""

    async def _cancel_a_request(
        self, address: str, folder: Path, keep: int | None
    ) -> tuple[_Drops, list[Any], Any]:
        """Dispatch gate -> 10 adds in a request; keep the ``keep``-th add's handle outside
        (None: keep nothing); cancel the request while the gate holds the chain."""
        drops = _Drops()
        kept: list[Any] = []
        async with dask(address) as rt:
            rt.add_instrument(drops)

            async def request() -> Any:
                x: Any = gate(np.ones(2), str(folder))
                for i in range(10):
                    x = add(x, 1.0)
                    if i == keep:
                        kept.append(x)
                return await x

            task = asyncio.create_task(request())
            try:
                while counters(rt).sent < 11:  # the whole chain is on the cluster
                    await asyncio.sleep(0.01)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                expected = 10 - (keep + 1 if keep is not None else -1)
                for _ in range(1000):
                    if len(drops.names) >= expected:
                        break
                    await asyncio.sleep(0.01)
            finally:
                (folder / "go").touch()
            value = await kept[0] if kept else None
        return drops, kept, value

    @pytest.mark.asyncio
    async def test_a_cancelled_request_cancels_what_it_sent(
        self, address: str, tmp_path: Path
    ) -> None:
        """Every op of the cancelled request, sent and waiting on the cluster, is cancelled
        (before, all of them ran to the end for nobody, and the runtime's exit waited)."""
        drops, _, _ = await self._cancel_a_request(address, tmp_path, None)
        assert sorted(n.split("#")[0] for n in drops.names) == ["add"] * 10 + ["gate"]

    @pytest.mark.asyncio
    async def test_what_someone_else_holds_still_runs(self, address: str, tmp_path: Path) -> None:
        """A handle held outside the request keeps its task and what it reads; only the
        ops after it are cancelled, and the held value arrives."""
        drops, kept, value = await self._cancel_a_request(address, tmp_path, 4)
        assert len(drops.names) == 5 and all(n.startswith("add#") for n in drops.names)
        np.testing.assert_array_equal(value, [6.0, 6.0])
        assert kept[0].task.name not in drops.names


class TestLongLivedRuntime:
    """A runtime kept open for many requests (a server) does not grow with them."""

    @pytest.mark.asyncio
    async def test_scattered_keys_go_with_their_arrays(self, address: str) -> None:
        """Each request's new input is scattered; its key is let go with the array (every
        key was kept until the runtime closed)."""
        async with dask(address, scatter_bytes=64) as rt:
            for i in range(10):
                await add(np.full(100, float(i)), 1.0)
            gc.collect()
            backend = counters(rt)
            assert backend.scattered == 10
            assert len(backend._scattered.keys) <= 1, backend._scattered.keys

    @pytest.mark.asyncio
    async def test_failures_are_let_go(self, address: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """Only the last ERRORS_KEPT failures' errors are kept to share with their dependents
        (every failed request's error, traceback and frames were kept until the close)."""
        monkeypatch.setattr(DaskBackend, "ERRORS_KEPT", 4, raising=False)
        async with dask(address) as rt:
            for _ in range(10):
                bad = boom(np.ones(2))
                with pytest.raises(TaskError) as info:
                    await add(bad, 1.0)
                assert info.value is bad.exception(), "dependents still share the error"
            assert len(counters(rt)._errors) == 4


class TestTimeline:
    def test_worker_threads_are_tracks(self, address: str) -> None:
        """Profiling a Dask run draws each shipped kernel on a track named for its worker thread."""
        ens, x = Ensemble(1, 8, seed=0), small_input(steps=3)
        runtimes: list[Any] = []

        async def main() -> Array:
            async with dask(address) as rt:
                runtimes.append(rt)
                y: Array = await ens(x)
            return y

        with dataflow.profile() as prof:
            dataflow.run(main)
        trace = prof.trace()
        remote = [t for t in trace.tasks if trace.threads[t.thread].startswith("dask tcp://")]
        assert len(remote) == counters(runtimes[0]).sent
        assert 1 <= len({t.thread for t in remote}) <= 2  # 2 workers x 1 thread
        assert all(t.end >= t.start for t in remote)
        directions = [t for t in remote if t.op == "lstm_sequence"]
        assert len(directions) == 2  # one op per LSTM direction at this size
        assert any(t.inputs for t in directions), "dependency edges are recorded"
        assert not [t for t in threading.enumerate() if t.name.startswith("dask tcp://")]


class TestProcesses:
    def test_ensemble_on_worker_processes(self, processes: Any) -> None:
        """Worker processes (pickled kernels, results and errors) behave as in-process ones."""
        ens, x = Ensemble(2, 8, seed=5), small_input(steps=4)
        expected = local_ensemble(ens, x)

        async def main() -> Array:
            async with dask(processes.scheduler_address):
                y: Array = await ens(x)
                with pytest.raises(TaskError) as info:
                    await boom(np.ones(2))
                assert isinstance(info.value.__cause__, ValueError)
            return y

        np.testing.assert_allclose(dataflow.run(main), expected, rtol=1e-5, atol=1e-6)

    def test_unprintable_kernel_error_on_worker_processes(self, processes: Any) -> None:
        """A kernel error whose __str__ raises comes back from a worker process chained."""

        async def main() -> None:
            async with dask(processes.scheduler_address):
                bad = unprintable(np.ones(2))
                with pytest.raises(TaskError) as info:
                    await add(bad, 1.0)
            check_unprintable(info.value, bad)

        dataflow.run(main)

    def test_system_exit_in_a_kernel_fails_its_task(self, processes: Any) -> None:
        """SystemExit and KeyboardInterrupt raised by a kernel fail its task, as on the local
        backend; they do not end the worker process that runs it."""
        errors: dict[str, list[BaseException]] = {}

        async def main(options: dict[str, Any]) -> None:
            async with dataflow.Runtime(**options) as rt:
                for how in ("exit", "interrupt"):
                    bad = exiting(np.ones(2), how)
                    with pytest.raises(TaskError) as info:
                        await add(bad, 1.0)
                    assert info.value.op == "exiting" and bad.exception() is info.value
                    errors.setdefault(how, []).append(info.value)
                if rt.backend.name == "dask":
                    assert counters(rt).sent == 4

        dataflow.run(main, {"backend": "local"})
        # Not WorkerLostError: before, the worker process exited and was restarted until
        # Dask gave up on the task.
        dataflow.run(main, {"address": processes.scheduler_address, "local_threshold": 0.0})
        for (here, there), cause in zip(
            errors.values(), (SystemExit, KeyboardInterrupt), strict=True
        ):
            assert type(here) is type(there) is TaskError, (here, there)
            assert type(here.__cause__) is type(there.__cause__) is cause
            said = str(here).split(" failed: ", 1)[1]  # "SystemExit: 3", "KeyboardInterrupt"
            assert str(there).endswith(f": {said}"), (here, there)
        assert "dask worker" in str(errors["exit"][1])
        assert errors["exit"][1].__cause__.args == (3,)  # type: ignore[union-attr]

    def test_op_from_a_module_the_workers_lack(
        self, processes: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An op whose module the workers cannot import fails with one TaskError naming it,
        shared by its dependents and saying what the workers need; awaiting one observes it."""
        name = f"dataflow_test_absent_{os.getpid()}"
        (tmp_path / f"{name}.py").write_text(
            "import ops\n"
            "def _kernel(x):\n"
            "    return x + 5\n"
            "absent = ops.define('absent', _kernel, lambda x: ops.spec_of(x), inline=False)\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))  # here only: the workers started before
        monkeypatch.delitem(sys.modules, name, raising=False)
        module = __import__(name)
        bad, err = _dependent_fails(processes.scheduler_address, lambda: module.absent(np.ones(3)))
        assert err.op == "absent" and err.task == bad.task.name, str(err)
        assert f"No module named '{name}'" in str(err), str(err)
        assert "the workers need the same packages as the client" in str(err)
        assert isinstance(err.__cause__, ImportError)
        assert bad.exception() is err, "dependents fail with the failed task's own error"


def check_unprintable(err: TaskError, bad: Arr) -> None:
    """The TaskError of ``unprintable``: names it, and chains the original exception."""
    assert err.op == "unprintable" and err.task == bad.task.name
    assert "Unprintable: <str() of the exception raised RuntimeError>" in str(err)
    cause = err.__cause__
    assert type(cause) is Unprintable and cause.args == ("the original",)


class TestLostWorkers:
    """A worker process killed mid-run (#18): recovered where possible, else a clear error."""

    def test_killed_worker_mid_run_gives_the_right_result(
        self, processes: Any, tmp_path: Path
    ) -> None:
        """SIGKILL a worker while a 2-layer LSTM runs: what was lost is sent again."""
        layer1, layer2 = ops.nn.LSTM(16, 16, seed=0), ops.nn.LSTM(16, 16, seed=1)
        x = np.random.default_rng(2).random((6, 2, 16), dtype=np.float32)

        async def on(backend: str, folder: Path | None, victim: str) -> tuple[Array, int]:
            async with dataflow.Runtime(backend=backend, **options(backend)) as rt:
                out1, _ = await layer1.forward(x)
                if folder is not None:
                    out1 = gate(out1, str(folder))
                out2, _ = await layer2.forward(out1)
                if folder is None:
                    return await out2, 0
                client = counters(rt).client
                pids = await worker_pids(processes, client)
                running = await wait_for(lambda: folder.glob("running-*"), "the gate")
                gated = int(running[0].name.split("-")[1])
                pid = gated if victim == "gated" else next(p for p in pids.values() if p != gated)
                os.kill(pid, signal.SIGKILL)
                (folder / "go").touch()
                y = await out2
                await worker_pids(processes, client)  # healed: the nanny restarted it
                return y, counters(rt).resent

        def options(backend: str) -> dict[str, Any]:
            if backend == "local":
                return {}
            # Ship every op, and scatter the weights (so that data Dask cannot recompute is lost).
            return {"address": processes.scheduler_address, "local_threshold": 0.0,
                    "scatter_bytes": 1024}  # fmt: skip

        expected, _ = dataflow.run(on, "local", None, "")
        for victim in ("gated", "other"):  # the worker running the gate, then the other one
            folder = tmp_path / victim
            folder.mkdir()
            y, resent = dataflow.run(on, "dask", folder, victim)
            np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
            # Each worker held one of layer 2's scattered weights: its tasks were dropped.
            assert resent > 0, victim

    def test_kernel_killing_its_worker_is_a_clear_error(self, processes: Any) -> None:
        """A kernel whose workers all die is a WorkerLostError naming the worker, not a cancel."""
        scheduler = processes.scheduler
        allowed, scheduler.allowed_failures = scheduler.allowed_failures, 0  # give up at once

        async def main() -> None:
            async with dask(processes.scheduler_address) as rt:
                client = counters(rt).client
                workers = set(await worker_pids(processes, client))
                dead = die(np.ones(2), os.getpid())
                after = add(dead, 1.0)
                with pytest.raises(WorkerLostError) as info:
                    await after
                err = info.value
                assert err.task == dead.task.name and err.op == "die"
                assert len(err.workers) == 1 and err.workers[0] in workers
                assert f"its Dask worker {err.workers[0]} was lost while running it" in str(err)
                assert isinstance(err, TaskError) and not isinstance(err, CancelledTaskError)
                with pytest.raises(WorkerLostError) as again:
                    await dead
                assert again.value is err, "dependents fail with the origin's one error"
                # The runtime goes on (sent now: a task queued on the dying worker would die
                # with it, and with allowed_failures=0 fail too).
                np.testing.assert_array_equal(await add(np.ones(2), 1.0), [2.0, 2.0])
                await worker_pids(processes, client)  # healed: the nanny restarted it

        try:
            dataflow.run(main)
        finally:
            scheduler.allowed_failures = allowed


class _Future:
    """Just enough of a distributed.Future for ``dropped``."""

    def __init__(self, status: str, reason: str | None = None) -> None:
        self.status = status
        exc = distributed.client.FutureCancelledError("k", reason) if reason else None
        self._state = type("State", (), {"exception": exc})()


class TestLossRules:
    """The pure part of #18 (``dataflow.dask._lost``): no cluster needed."""

    def test_loss_is_told_from_a_cancel_by_its_reason(self) -> None:
        """Keys Dask forgot for lost data are "lost"; a reason-less cancel is to be checked."""
        assert dropped(_Future("cancelled", "already forgotten")) == "lost"
        assert dropped(_Future("cancelled", "lost dependencies")) == "lost"
        assert dropped(_Future("cancelled", "scheduler-restart")) == "cancelled"
        assert dropped(_Future("cancelled", "unknown")) == "unsaid"
        assert dropped(_Future("cancelled")) == "unsaid"
        assert dropped(_Future("pending")) is None
        assert dropped(_Future("lost")) is None  # Dask recomputes it

    def test_lost_workers_are_read_from_the_event_log(self) -> None:
        """Removed workers that held this runtime's keys are named, once each, oldest first."""
        mine = "add-abc-1"

        def removed(worker: str, **keys: Any) -> tuple[float, dict[str, Any]]:
            return 1.0, {"action": "remove-worker", "worker": worker, **keys}

        events = [
            (0.5, {"action": "add-worker", "worker": "tcp://a:1"}),
            removed("tcp://other:1", **{"lost-computed-tasks": ["theirs-1"]}),
            removed("tcp://a:1", **{"processing-tasks": {mine}}),
            removed("tcp://b:1", **{"lost-scattered-tasks": [mine]}),
            removed("tcp://a:1", **{"lost-computed-tasks": [mine]}),
            "not an event",
            (2.0, "not a message"),
        ]
        assert lost_workers(events, lambda k: k == mine) == ["tcp://a:1", "tcp://b:1"]

    def test_killed_worker_error_names_the_worker(self) -> None:
        """Dask's KilledWorker becomes a WorkerLostError naming the last worker, chained."""
        worker = type("WorkerState", (), {"address": "tcp://10.0.0.7:4000"})()
        killed = distributed.scheduler.KilledWorker("die-abc-3", worker, 3)
        err = killed_worker_error("die#3", "die", killed)
        assert err.workers == ["tcp://10.0.0.7:4000"] and err.__cause__ is killed
        assert "die#3 failed: its Dask worker tcp://10.0.0.7:4000 was lost" in str(err)
        assert "4 workers" in str(err)


class _Sender:
    """Just enough of distributed's BatchedSend for HangUpQuietly."""

    def __init__(self) -> None:
        self.comm = object()
        self.aborted = False
        self.stopped = asyncio.Event()

    def abort(self) -> None:
        self.aborted = True
        self.stopped.set()


class TestClosing:
    """Closing the runtime closes its Dask client quietly (#15.6)."""

    @pytest.mark.asyncio
    async def test_own_hang_up_is_not_logged(self, caplog: pytest.LogCaptureFixture) -> None:
        """While a client closes, only its own connection's CommClosedError log is dropped."""
        sender = _Sender()
        client = type("Client", (), {"scheduler_comm": sender})()
        log = logging.getLogger("distributed.batched")
        other = object()
        with caplog.at_level(logging.INFO, logger="distributed.batched"):
            async with HangUpQuietly(client):
                log.info("Batched Comm Closed %r", sender.comm)
                log.info("Batched Comm Closed %r", other)
            log.info("Batched Comm Closed %r", sender.comm)
        # (Only this logger's records: a client an earlier test left closing may log on
        # distributed.scheduler meanwhile.)
        batched = [r for r in caplog.records if r.name == "distributed.batched"]
        assert [r.args[0] for r in batched] == [other, sender.comm]  # type: ignore[index]
        assert sender.aborted, "what was still queued is dropped before the filter goes"
        assert HangUpQuietly not in {type(f) for f in log.filters}

    def test_closing_runtimes_log_no_comm_errors(
        self, address: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Futures released while the client closes log no CommClosedError traceback."""

        async def main() -> None:
            loop = asyncio.get_running_loop()
            async with dask(address):
                handles = [add(np.full(2, float(i)), 1.0) for i in range(100)]
                await dataflow.wait(handles[-1])
                # Released one by one over the 100 ms Dask's close waits for the scheduler
                # to hang up: some are queued just before it does, and sent just after.
                for i in range(len(handles)):
                    loop.call_later(i * 0.001, handles.pop)
            await asyncio.sleep(0.05)

        with caplog.at_level(logging.INFO, logger="distributed"):
            for _ in range(3):
                dataflow.run(main)
        noise = [r for r in caplog.records if "CommClosed" in r.getMessage() or r.exc_info]
        assert not noise, [r.getMessage() for r in noise]


class TestCLI:
    def test_run_dask_address(self, address: str, tmp_path: Path) -> None:
        """`dataflow run --dask ADDRESS script.py`: the script's dataflow.run uses the cluster."""
        script = tmp_path / "s.py"
        script.write_text(
            "import numpy as np, dataflow, ops\n"
            "async def main():\n"
            "    rt = dataflow.current_runtime()\n"
            "    rt.backend.local_threshold = 0.0\n"
            "    y = await ops.tanh(np.zeros(3))\n"
            "    print(rt.backend.name, rt.backend.sent, y.tolist())\n"
            "dataflow.run(main)\n"
        )
        r = subprocess.run(
            [sys.executable, "-m", "dataflow", "run", "--dask", address, str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "dask 1 [0.0, 0.0, 0.0]"
        # It says which cluster it used, and closes quietly.
        assert r.stderr == f"dataflow run: ops run on the Dask cluster at {address}\n", r.stderr

    def test_run_dask_bad_address(self, tmp_path: Path) -> None:
        """A wrong address is a DataflowError on one line, and nothing more: the half-started
        client is closed (no "coroutine ... was never awaited" warnings), and no line claims
        the run uses a cluster."""
        script = tmp_path / "s.py"
        script.write_text("import dataflow\nasync def main():\n    pass\ndataflow.run(main)\n")
        command = ["-X", "dev", "-m", "dataflow", "run", "--dask", "notanaddress", str(script)]
        r = subprocess.run(
            [sys.executable, *command],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert r.returncode == 1
        assert "DataflowError: cannot connect to the Dask scheduler at 'notanaddress'" in r.stderr
        # One line, as for bad usage: the address is wrong, not the script (it was the whole
        # traceback, through dataflow's and distributed's frames, with the chained cause).
        assert r.stderr.startswith("dataflow run: error: DataflowError: cannot connect"), r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert "never awaited" not in r.stderr, r.stderr
        assert "Warning" not in r.stderr, r.stderr
        assert "ops run on the Dask cluster" not in r.stderr, r.stderr

    def test_run_dask_empty_address_is_a_usage_error(self, tmp_path: Path) -> None:
        """`--dask ""` (an unset variable) is a usage error: it ran on the local backend."""
        script = tmp_path / "s.py"
        script.write_text("print('ran')\n")
        r = subprocess.run(
            [sys.executable, "-m", "dataflow", "run", "--dask", " ", str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert r.returncode == 2, r
        assert "Invalid value for --dask: the scheduler's address is empty" in r.stderr
        assert r.stdout == ""


def _dependent_fails(address: str, failing: Any) -> tuple[Any, TaskError]:
    """Run ``failing()`` (an op call that fails on the cluster) and ``add`` on its output in a
    Dask runtime at ``address``: the TaskError awaiting the dependent raised, and the failed
    handle. The run itself must end cleanly (no UnobservedTaskError: the failure was
    observed through its dependent)."""
    seen: list[Any] = []

    async def main() -> None:
        async with dask(address):
            bad = failing()
            with pytest.raises(TaskError) as info:
                await add(bad, 1.0)
            seen.extend([bad, info.value])

    dataflow.run(main)
    bad, err = seen
    return bad, err
