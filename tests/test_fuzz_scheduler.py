"""A randomized differential fuzzer of the scheduler: random programs (tests/_fuzz_programs.py)
run under dataflow and as sequential numpy must agree.

Each seed draws a program: random DAGs of ``ops`` ops and user ops whose kernels sleep, raise,
call numpy or outlive their timeout; nested forks of async and plain functions (plain ones
that call ops or fork again, from a pool thread); awaits in random orders, two at once, in
model code; handles never awaited or dropped; compiled sub-forwards, shared across runs or
fresh, and a batched one called concurrently; timeout scopes that expire (``asyncio.timeout``,
``asyncio.wait_for``, trio's ``move_on_after``) around sleeps, pending values and compiled
calls; callers that abandon an await; forks and plain tasks of the loop cancelled once they
handed values out, or at a random point; plain forks cancelled at once. And runtime settings:
asyncio, uvloop or trio; 0 (synchronous) to 4 inter-op threads; inline threshold 0, default
or 1 s; ``max_pending`` unlimited, default or 3; a default ``op_timeout``; now and then a
second program beside it on the same loop and pool, and a deadline around the whole runtime.

It checks: every awaited value equals numpy's (``assert_allclose``); every awaited failure is
the original exception's type and message inside dataflow's ``TaskError`` (nested once per
fork it went through), or ``CancelledTaskError`` for what was cancelled; the failures nobody
observed come back in ``UnobservedTaskError`` (those of work a cancellation may drop, may);
nothing is in flight after the runtime closes; no thread is left; nothing is logged or
warned (asyncio's "never retrieved", "destroyed but it is pending", dataflow's own lines,
unraisable exceptions). A hang fails through pytest-timeout, every thread's stack dumped first.

200 fixed seeds run by default (about 10 s); ``DATAFLOW_FUZZ_SEEDS=N`` runs seeds 0 to N-1,
``DATAFLOW_FUZZ_SEEDS=A:B`` seeds A to B-1. A failure prints the program(s).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import structlog.testing

import dataflow
import ops
from dataflow import CancelledTaskError, TaskError, UnobservedTaskError
from tests._fuzz_programs import (
    BATCHED,
    CANCELLED,
    COMPILED_FNS,
    ETYPES,
    OPS,
    SHARED,
    Block,
    F,
    FuzzError,
    MaybeCancelled,
    Program,
    first_fail,
    fz_fail,
    fz_fail_inl,
    fz_sleep,
    fz_slowfail,
    fz_stuck,
    fz_two,
    generate,
    identity,
    trio,
)


# --------------------------------------------------------------------------- interpreter
class Lib:
    """The event-loop library's few primitives the programs use."""

    def __init__(self, name: str) -> None:
        self.name = name

    def event(self) -> Any:
        return trio.Event() if self.name == "trio" else asyncio.Event()

    async def sleep(self, s: float) -> None:
        if self.name == "trio":
            await trio.sleep(s)
        else:
            await asyncio.sleep(s)

    async def forever(self) -> None:
        await self.sleep(3600)

    @contextlib.asynccontextmanager
    async def timeout(self, s: float) -> Any:
        if self.name == "trio":
            with trio.move_on_after(s):
                yield
        else:
            try:
                async with asyncio.timeout(s):
                    yield
            except TimeoutError:
                pass

    async def both(self, fn: Any, *args: Any) -> tuple[Any, Any]:
        """``fn(*args)`` twice at once, in two tasks; both results."""
        if self.name == "trio":
            out: list[Any] = [None, None]

            async def one(k: int) -> None:
                out[k] = await fn(*args)

            async with trio.open_nursery() as n:
                n.start_soon(one, 0)
                n.start_soon(one, 1)
            return out[0], out[1]
        a, b = await asyncio.gather(fn(*args), fn(*args))
        return a, b

    async def spawn_cancel(self, fn: Any, ev: Any, *args: Any) -> None:
        """Run ``fn(*args, ev)`` in a task of its own until it sets ``ev``, then cancel it."""
        if self.name == "trio":
            async with trio.open_nursery() as n:
                n.start_soon(fn, *args, ev)
                await ev.wait()
                n.cancel_scope.cancel()
            return
        t = asyncio.ensure_future(fn(*args, ev))
        try:
            await ev.wait()
        finally:  # (also when this task is cancelled meanwhile: no task is left running)
            t.cancel()
            await asyncio.wait([t])

    async def abandon(self, coro_fn: Any) -> None:
        """Start ``coro_fn()`` as a task of its own, then cancel it while it awaits."""
        if self.name == "trio":
            async with trio.open_nursery() as n:
                n.start_soon(coro_fn)
                await trio.lowlevel.checkpoint()
                n.cancel_scope.cancel()
        else:
            t = asyncio.ensure_future(coro_fn())
            await asyncio.sleep(0)
            t.cancel()
            await asyncio.wait([t])  # (a cancellation of this task itself goes on up)


class Interp:
    """Runs a program's blocks under dataflow, logging what each observation got."""

    def __init__(self, prog: Program, lib: Lib) -> None:
        self.prog = prog
        self.lib = lib
        self.log: dict[int, Any] = {}
        self.fresh = [dataflow.compile(f) for f in COMPILED_FNS]

    async def run_block(self, b: Block, params: list[Any], holder: list[Any] | None = None) -> Any:
        """Run ``b`` on ``params``; its returned variables go into ``holder`` too."""
        env: list[Any] = list(params)
        hold: list[Any]
        last: Any = None
        for s in b.stmts:
            k = s[0]
            if k == "op":
                _, kind, args = s
                env.append(OPS[kind][1](*(env[i] for i in args)))
            elif k == "fail":
                _, which, i, code, et = s
                fn = {"fz_fail": fz_fail, "fz_fail_inl": fz_fail_inl, "fz_slowfail": fz_slowfail}[
                    which
                ]
                env.append(fn(env[i], code, et))
            elif k == "const":  # (what reducing a failing program leaves of a statement)
                env.extend([env[0]] * s[1])
            elif k == "stuck":
                env.append(fz_stuck(env[s[1]]))
            elif k == "two":
                env.extend(fz_two(env[s[1]]))
            elif k == "drop":
                env[s[1]] = None
            elif k == "await":
                _, i, uid = s
                try:
                    v = await _aw(env[i])
                except Exception as exc:
                    self.log[uid] = v = exc
                else:
                    self.log[uid] = v
                last = v
            elif k == "unpack":
                _, i, n = s
                v = last
                if n >= 0:
                    env.extend(v)
                else:
                    env.append(v)
            elif k == "await_raise":
                await dataflow.materialize(await env[s[1]])
                raise AssertionError("await_raise did not raise")
            elif k == "fork":
                _, sub, args = s
                env.append(dataflow.fork(self.forked, sub, [env[i] for i in args]))
            elif k == "pfork":
                _, kind, args, code = s
                env.append(dataflow.fork(PLAIN[kind], env[args[0]], env[args[1]], code))
            elif k == "compiled":
                _, which, i, fresh = s
                fwd = (self.fresh if fresh else SHARED)[which]
                env.append(await fwd(env[i]))
            elif k == "scope":
                _, kind, i = s
                async with self.lib.timeout(0.001):
                    y = fz_sleep(ops.tanh(env[i]), 1)
                    env.append(y)
                    if kind == "sleep":
                        await self.lib.sleep(10)
                    elif kind == "pending":
                        await fz_sleep(y, 30)
                    elif kind == "compiled":
                        await SHARED[2](y)
                    else:  # asyncio.wait_for: the awaitable runs in a task of its own
                        await asyncio.wait_for(_aw(fz_sleep(y, 30)), 0.001)
            elif k == "batch":
                futs = [dataflow.fork(BATCHED, env[i]) for i in s[1]]
                env.extend([await f for f in futs])
            elif k == "mcawait":
                _, i, uid = s
                try:
                    with dataflow.model_code():
                        got = await env[i]
                except Exception as exc:
                    self.log[uid] = exc
                else:
                    self.log[uid] = len(got)
                    env.extend(got)
            elif k == "gather":
                _, i, uid, uid2 = s
                self.log[uid], self.log[uid2] = await self.lib.both(_outcome, env[i])
            elif k == "racecancel":
                _, sub, args, uid, n = s
                fut = dataflow.fork(self.forked, sub, [env[i] for i in args])
                for _ in range(n):
                    await self.lib.sleep(0)
                fut.cancel()
                self.log[uid] = await _outcome(fut)
            elif k == "pcancel":
                _, i, uid = s
                fut = dataflow.fork(_p_np, env[i], env[i], 0)
                fut.cancel()
                self.log[uid] = await _outcome(fut)
            elif k == "taskcancel":
                _, sub, args = s
                hold = []
                ev = self.lib.event()
                await self.lib.spawn_cancel(self.cancelled, ev, sub, [env[i] for i in args], hold)
                env.extend(hold)
            elif k == "abandon":
                x = env[s[1]]

                async def awaiter(x: Any = x) -> None:
                    with contextlib.suppress(Exception):
                        await x

                await self.lib.abandon(awaiter)
            elif k == "cancel":
                _, sub, args, uid = s
                hold = []
                ev = self.lib.event()
                fut = dataflow.fork(self.cancelled, sub, [env[i] for i in args], hold, ev)
                await ev.wait()
                fut.cancel()
                self.log[uid] = await _outcome(fut)
                env.extend(hold)
            else:
                raise AssertionError(k)
        if b.raises is not None:
            raise ETYPES[b.raises[0]](b.raises[1])
        out = tuple(env[i] for i in b.returns)
        if holder is not None:
            holder.extend(out)
        return out

    async def forked(self, b: Block, params: list[Any]) -> Any:
        return await self.run_block(b, params)

    async def cancelled(self, b: Block, params: list[Any], hold: list[Any], ev: Any) -> Any:
        await self.run_block(b, params, holder=hold)
        ev.set()
        await self.lib.forever()

    async def main(self) -> Any:
        out = await self.run_block(self.prog.main, list(self.prog.inputs))
        return out


async def _outcome(x: Any) -> Any:
    """Await ``x``: its value, or the exception the await raised."""
    try:
        return await _aw(x)
    except Exception as exc:
        return exc


async def _aw(x: Any) -> Any:
    if isinstance(x, dataflow.Future):
        # (a plain fork's future gives the pending value its function returned, as is)
        return await dataflow.materialize(await dataflow.wait(x))
    return x


def _p_np(a: Any, b: Any, code: int) -> Any:
    return np.tanh(a) + b


def _p_raise(a: Any, b: Any, code: int) -> Any:
    raise FuzzError(f"pfork {code}")


def _p_ops(a: Any, b: Any, code: int) -> Any:
    return ops.add(ops.tanh(a), b)


def _p_sleep(a: Any, b: Any, code: int) -> Any:
    time.sleep(0.001)
    return a * 2.0


def _p_nested(a: Any, b: Any, code: int) -> Any:
    return dataflow.fork(_p_np, a, b, code)  # from a pool thread; its future is the value


PLAIN = {"np": _p_np, "raise": _p_raise, "ops": _p_ops, "sleep": _p_sleep, "nested": _p_nested}


# --------------------------------------------------------------------------- checking
def _check_outcome(what: str, got: Any, want: Any) -> None:
    if isinstance(want, MaybeCancelled):
        if not isinstance(got, CancelledTaskError):
            _check_outcome(what, got, want.value)
        return
    if want is CANCELLED:
        assert isinstance(got, CancelledTaskError), f"{what}: want CancelledTaskError, got {got!r}"
        return
    f = first_fail(want)
    if f is not None:
        assert isinstance(got, TaskError), f"{what}: want failure {f}, got {got!r}"
        gi = identity(got)
        if f.etype == "OpTimeoutError":
            assert gi.etype == "OpTimeoutError" or type(got).__name__ == "OpTimeoutError", (
                f"{what}: want timeout, got {got!r}"
            )
            return
        assert gi == f, f"{what}: want {f}, got {gi} ({got!r})"
        assert isinstance(got, ETYPES[f.etype]), f"{what}: {got!r} is not a {f.etype}"
        return
    assert not isinstance(got, BaseException), f"{what}: want a value, got {got!r}"
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), f"{what}: {got!r}"
        for j, (g2, w2) in enumerate(zip(got, want, strict=True)):
            _check_outcome(f"{what}[{j}]", g2, w2)
        return
    if isinstance(want, int):  # (how many pending values an await in model code gave)
        assert got == want, f"{what}: want {want} values, got {got!r}"
        return
    assert isinstance(got, np.ndarray), f"{what}: want an array, got {type(got)}"
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12, err_msg=what)


def _fid(f: F) -> F:
    return F(f.depth, "OpTimeoutError", "") if f.etype == "OpTimeoutError" else f


def execute(progs: list[Program]) -> list[tuple[Any, Interp, Any]]:
    """Run ``progs`` under dataflow, side by side on one event loop, each in a runtime of its
    own (on the same shared pool): for each, its result or exception, its interpreter and
    its runtime."""
    loop = progs[0].loop
    interps = [Interp(prog, Lib(loop)) for prog in progs]
    runtimes: list[Any] = [None] * len(progs)
    results: list[Any] = [None] * len(progs)

    async def run(k: int) -> None:
        prog = progs[k]
        kw: dict[str, Any] = {"interop_threads": prog.interop, "max_pending": prog.max_pending}
        try:
            async with dataflow.Runtime(
                inline_threshold=prog.inline, op_timeout=prog.op_timeout, **kw
            ) as rt:
                runtimes[k] = rt
                results[k] = await dataflow.materialize(await interps[k].main())
        except Exception as exc:
            results[k] = exc

    async def body(k: int) -> None:
        deadline = progs[k].deadline
        if deadline is None:
            await run(k)
        elif loop == "trio":
            with trio.move_on_after(deadline) as scope:
                await run(k)
            if scope.cancelled_caught:
                results[k] = CUT
        else:
            try:
                async with asyncio.timeout(deadline):
                    await run(k)
            except TimeoutError:
                results[k] = CUT

    async def asyncio_main() -> None:
        await asyncio.gather(*(body(k) for k in range(len(progs))))

    async def trio_main() -> None:
        async with trio.open_nursery() as nursery:
            for k in range(len(progs)):
                nursery.start_soon(body, k)

    if loop == "trio":
        trio.run(trio_main)
    elif loop == "uvloop":
        import uvloop

        uvloop.run(asyncio_main())
    else:
        asyncio.run(asyncio_main())
    return list(zip(results, interps, runtimes, strict=True))


CUT = "the deadline around the runtime cut the run"


def check(prog: Program, result: Any, interp: Interp, rt: Any) -> None:
    """Compare what running ``prog`` under dataflow gave with its numpy outcome."""
    for uid, want in prog.expected_obs.items():
        if uid not in interp.log and (uid in prog.optional or result is CUT):
            continue
        assert uid in interp.log, f"observation {uid} never made"
        if result is CUT:  # (its runtime's exit may have dropped what this awaited)
            want = MaybeCancelled(want)
        _check_outcome(f"observation {uid}", interp.log[uid], want)
    assert set(interp.log) <= set(prog.expected_obs), "unexpected observations"
    required = {_fid(f) for f in prog.created - prog.observed}
    maybe = {_fid(f) for f in prog.maybe}
    if result is CUT:  # cancelled: queued work was dropped, failures only logged
        pass
    elif isinstance(result, UnobservedTaskError):
        got = {_fid(identity(e)) for e in result.errors}
        assert required <= got, f"unobserved failures: want {required}, got {got}"
        assert not got - required - maybe, f"unexpected unobserved failures {got - required}"
    else:
        if isinstance(result, BaseException):
            raise AssertionError(f"the run raised {result!r}") from result
        assert not required, f"want an UnobservedTaskError for {required}, the run returned"
        _check_outcome("result", result, prog.expected_result)
    assert rt is not None and rt._inflight == 0, f"in flight after exit: {rt!r}"


def programs(seed: int) -> list[Program]:
    """The seed's program, and now and then a second one that runs beside it on the same
    loop and pool, in a runtime of its own."""
    rng = np.random.default_rng(seed + 7**9)
    progs = [generate(seed)]
    if progs[0].interop and rng.random() < 0.2:
        progs.append(generate(seed + 1_000_003, progs[0].loop, progs[0].interop))
    for prog in progs:  # now and then, a deadline cuts the whole run short
        prog.deadline = float(rng.uniform(0.0, 0.02)) if rng.random() < 0.15 else None
    return progs


def _check_threads(before: set[int], wait: float = 2.0) -> None:
    deadline = time.monotonic() + wait
    while True:
        left = [t for t in threading.enumerate() if t.ident not in before]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    assert not left, f"threads left: {left}"


def describe(prog: Program) -> str:
    lines = [
        f"seed={prog.seed} loop={prog.loop} interop={prog.interop} inline={prog.inline} "
        f"max_pending={prog.max_pending} op_timeout={prog.op_timeout} inputs={len(prog.inputs)} "
        f"deadline={prog.deadline}"
    ]

    def blk(b: Block, ind: str) -> None:
        for s in b.stmts:
            if s[0] in ("fork", "cancel", "racecancel", "taskcancel"):
                lines.append(f"{ind}{s[0]} args={s[2]}" + (f" uid={s[3]}" if len(s) > 3 else ""))
                blk(s[1], ind + "    ")
                sub = s[1]
                lines.append(f"{ind}    -> returns {sub.returns} raises {sub.raises}")
            else:
                lines.append(f"{ind}{s}")

    blk(prog.main, "  ")
    lines.append(f"  -> returns {prog.main.returns}")
    return "\n".join(lines)


class _Noise(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def _quiet() -> Iterator[list[str]]:
    """Collect what a run logs (asyncio, trio, dataflow), its unraisable exceptions and its
    structlog lines; warnings are errors."""
    noise = _Noise()
    names = ("asyncio", "dataflow", "trio")
    for name in names:
        logging.getLogger(name).addHandler(noise)
    old_hook = sys.unraisablehook
    sys.unraisablehook = lambda u: noise.records.append(f"unraisable: {u.exc_value!r}")
    try:
        with warnings.catch_warnings(), structlog.testing.capture_logs() as logs:
            warnings.simplefilter("error")
            yield noise.records
            gc.collect()
        noise.records.extend(f"structlog: {line}" for line in logs)
    finally:
        sys.unraisablehook = old_hook
        for name in names:
            logging.getLogger(name).removeHandler(noise)


def run_seed(seed: int) -> None:
    """Check the program of ``seed``; a failure names the seed and shows the program."""
    progs = programs(seed)
    before = {t.ident for t in threading.enumerate() if t.ident is not None}
    faulthandler.dump_traceback_later(60)  # a hang: every thread's stack, then the timeout
    try:
        try:
            with _quiet() as noise:
                outcomes = execute(progs)
                for prog, (result, interp, rt) in zip(progs, outcomes, strict=True):
                    check(prog, result, interp, rt)
            if any(result is CUT for result, _, _ in outcomes):
                # A run cut short logs the failures nobody awaited (docs/hardening.md).
                noise = [line for line in noise if "never awaited" not in line]
            assert not noise, f"log noise: {noise}"
        finally:
            _check_threads(before)
    except AssertionError as exc:
        shown = "\n".join(describe(prog) for prog in progs)
        raise AssertionError(f"{exc}\n{shown}") from None
    finally:
        faulthandler.cancel_dump_traceback_later()


DEFAULT_SEEDS = 200


def _seeds() -> list[int]:
    spec = os.environ.get("DATAFLOW_FUZZ_SEEDS", "")
    if not spec:
        return list(range(DEFAULT_SEEDS))
    start, _, stop = spec.partition(":")
    return list(range(int(start), int(stop))) if stop else list(range(int(start)))


class TestFuzzScheduler:
    @pytest.mark.parametrize("seed", _seeds())
    def test_program_agrees_with_numpy(self, seed: int) -> None:
        """The seed's random program gives numpy's values and failures, leaves nothing."""
        run_seed(seed)
