"""Random scheduler programs for tests/test_fuzz_scheduler.py, and their numpy outcome.

A program is a tree of async function bodies (``Block``): statements over a list of
variables, each the outcome of an op call (``ops`` ops and user ops declared here, whose
kernels sleep, fail or call numpy), a fork (``dataflow.fork`` of an ``async def`` body or of
a plain function), an await, a compiled forward's call, a timeout scope that expires, an
await abandoned by a cancelled caller task, or a fork cancelled while it waits. ``Gen`` draws
a program from a seed and, at the same time, runs it as plain sequential numpy: it knows each
variable's value or failure, so it only draws what a deterministic program can do (awaiting
a value a failure never produced, say, cannot happen). The test runs the program under
dataflow and compares (``test_fuzz_scheduler``).

What "the same failure" means: ``F(depth, type, message)``, the original exception's type and
message under ``depth`` TaskErrors (a fork that let an op's error through adds one). Failures
the program never observes must come back in the runtime's ``UnobservedTaskError``, except
those of work a cancellation may have dropped unrun (``Gen.maybe``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import dataflow
import ops
from dataflow import TaskError

try:
    import trio as trio
except ImportError:  # pragma: no cover - trio is a dev dependency
    trio = None  # type: ignore[assignment]

SHAPE = (4, 4)


class FuzzError(Exception):
    """A user exception type of the fuzzer's own."""


ETYPES = {
    "ValueError": ValueError,
    "RuntimeError": RuntimeError,
    "FuzzError": FuzzError,
    "ZeroDivisionError": ZeroDivisionError,
}


# --------------------------------------------------------------------------- user ops
def _meta(x: Any, *rest: Any) -> Any:
    s = ops.spec_of(x)
    return ops.TensorSpec(s.shape, s.dtype)


def _k_np(x: Any) -> Any:
    return np.sin(x) @ x.T * 0.1 + x


def _k_sleep(x: Any, ms: int) -> Any:
    time.sleep(ms / 1000)
    return x * 1.5


def _k_fail(x: Any, code: int, etype: str) -> Any:
    raise ETYPES[etype](f"fz-fail {code}")


def _k_slowfail(x: Any, code: int, etype: str) -> Any:
    time.sleep(0.002)
    raise ETYPES[etype](f"fz-slowfail {code}")


def _k_stuck(x: Any) -> Any:
    time.sleep(0.15)
    return x


def _two_meta(x: Any) -> Any:
    s = ops.spec_of(x)
    return (ops.TensorSpec(s.shape, s.dtype), ops.TensorSpec(s.shape, s.dtype))


fz_np = ops.define("fz_np", _k_np, _meta, lambda x: dataflow.Cost(200, 300))
fz_sleep = dataflow.op("fz_sleep", meta=_meta, handle=ops.Tensor, inline=False)(_k_sleep)
fz_sleep_inl = ops.define("fz_sleep_inl", _k_sleep, _meta, lambda x, ms: dataflow.Cost(10, 10))
fz_fail = ops.define("fz_fail", _k_fail, _meta, lambda *a: dataflow.Cost(1e5, 1e5))
fz_fail_inl = ops.define("fz_fail_inl", _k_fail, _meta, lambda *a: dataflow.Cost(0, 0))
fz_slowfail = dataflow.op("fz_slowfail", meta=_meta, handle=ops.Tensor, inline=False)(_k_slowfail)
fz_stuck = dataflow.op("fz_stuck", meta=_meta, handle=ops.Tensor, timeout=0.02)(_k_stuck)
fz_two = ops.define(
    "fz_two", lambda x: (x * 2.0, x - 1.0), _two_meta, lambda x: dataflow.Cost(100, 100)
)


# --------------------------------------------------------------------------- ops table
def _sig(x: Any) -> Any:
    return 1 / (1 + np.exp(-x))


def _softmax(x: Any) -> Any:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# kind -> (arity, dataflow call, numpy call); params (an int) go last.
OPS: dict[str, tuple[int, Any, Any]] = {
    "add": (2, lambda a, b: ops.add(a, b), np.add),
    "sub": (2, lambda a, b: a - b, np.subtract),
    "mul": (2, lambda a, b: ops.multiply(a, b), np.multiply),
    "max": (2, lambda a, b: ops.maximum(a, b), np.maximum),
    "tanh": (1, lambda a: ops.tanh(a), np.tanh),
    "neg": (1, lambda a: -a, np.negative),
    "sigmoid": (1, lambda a: ops.sigmoid(a), _sig),
    "matmul": (2, lambda a, b: ops.multiply(a @ b, 0.25), lambda a, b: (a @ b) * 0.25),
    "sumk": (
        2,
        lambda a, b: ops.sum(a, axis=0, keepdims=True) * b,
        lambda a, b: np.sum(a, axis=0, keepdims=True) * b,
    ),
    "catslice": (
        2,
        lambda a, b: ops.concatenate([a, b], axis=0)[2:6],
        lambda a, b: np.concatenate([a, b], axis=0)[2:6],
    ),
    "stacksum": (
        3,
        lambda a, b, c: ops.sum(ops.stack([a, b, c]), axis=0),
        lambda a, b, c: np.sum(np.stack([a, b, c]), axis=0),
    ),
    "stackmean": (
        2,
        lambda a, b: ops.mean(ops.stack([a, b]), axis=0),
        lambda a, b: np.mean(np.stack([a, b]), axis=0),
    ),
    "reshape": (
        1,
        lambda a: ops.reshape(ops.reshape(ops.transpose(a), (16,)), SHAPE),
        lambda a: np.transpose(a).reshape(16).reshape(SHAPE),
    ),
    "softmax": (1, lambda a: ops.softmax(a), _softmax),
    "where": (
        2,
        lambda a, b: ops.where(ops.greater(a, b), a, b),
        lambda a, b: np.where(a > b, a, b),
    ),
    "fz_np": (1, lambda a: fz_np(a), _k_np),
    "fz_sleep": (1, lambda a: fz_sleep(a, 1), lambda a: a * 1.5),
    "fz_sleep_inl": (1, lambda a: fz_sleep_inl(a, 1), lambda a: a * 1.5),
}


# --------------------------------------------------------------------------- outcomes
@dataclass(frozen=True)
class F:
    """A failure: how many TaskErrors wrap the root, and the root's type and message."""

    depth: int
    etype: str
    msg: str


class _Cancelled:
    def __repr__(self) -> str:
        return "CANCELLED"


CANCELLED = _Cancelled()


@dataclass(frozen=True)
class MaybeCancelled:
    """The outcome of something cancelled at a random point: cancelled, or ``value``."""

    value: Any


def _is_fail(o: Any) -> bool:
    return isinstance(o, F)


def first_fail(o: Any) -> F | None:
    if isinstance(o, F):
        return o
    if isinstance(o, tuple):
        for x in o:
            f = first_fail(x)
            if f is not None:
                return f
    return None


def identity(exc: BaseException) -> F:
    depth = 0
    e: BaseException | None = exc
    while isinstance(e, TaskError):
        depth += 1
        if e.__cause__ is None:
            return F(depth, type(e).__name__, "")
        e = e.__cause__
    assert e is not None
    return F(depth, type(e).__name__, str(e))


# --------------------------------------------------------------------------- programs
@dataclass
class Block:
    """An async function body: statements over an environment of variables."""

    nparams: int
    stmts: list[tuple[Any, ...]] = field(default_factory=list)
    returns: list[int] = field(default_factory=list)
    raises: tuple[str, str] | None = None  # raise at the end instead of returning


@dataclass
class Program:
    seed: int
    loop: str
    interop: int
    inline: float | None
    max_pending: int | None
    inputs: list[np.ndarray]
    main: Block
    expected_obs: dict[int, Any]  # observation id -> outcome
    created: set[F]  # failures that surely happen
    maybe: set[F]  # failures that may happen (dropped work)
    observed: set[F]  # failures the program observes (expected)
    result_vars: list[int]
    expected_result: Any
    optional: set[int]  # observations a cancellation may prevent
    op_timeout: float | None = None  # the runtime's default op timeout (never reached)
    deadline: float | None = None  # a timeout around the whole runtime block (seconds)


class _Ordered(set[F]):
    """A set that also keeps the order things were added in (``order``)."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[F] = []

    def add(self, f: F) -> None:
        if f not in self:
            self.order.append(f)
        super().add(f)


class Gen:
    """Generates a program and computes its sequential numpy outcome at the same time."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.uid = 0
        self.obs: dict[int, Any] = {}
        self.optional: set[int] = set()  # observations a cancellation may prevent
        self.created = _Ordered()
        self.maybe: set[F] = set()
        self.observed: set[F] = set()
        self.cancel_constructs = False
        self.loop = "asyncio"
        self.sync = False

    def next_uid(self) -> int:
        self.uid += 1
        return self.uid

    def pick(self, n: int) -> int:
        return int(self.rng.integers(n))

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def new_fail(self, etype: str, msg: str, depth: int = 1, maybe: bool = False) -> F:
        f = F(depth, etype, msg)
        (self.maybe if maybe else self.created).add(f)
        return f

    def observe(self, o: Any) -> None:
        f = first_fail(o)
        if f is not None:
            self.observed.add(f)

    # A block: env entries are (kind, outcome); kind 'arr' | 'fut' | 'pfut' | None (dropped).
    def block(
        self,
        params: list[tuple[str | None, Any]],
        depth: int,
        size: int,
        *,
        in_fork: bool,
        quiet: bool = False,
    ) -> tuple[Block, Any]:
        """A block over ``params`` ((kind, outcome) pairs); returns it and its outcome (a tuple
        of the returned variables' outcomes, or F). A ``quiet`` block has no failure and no
        fork of its own: it may be cancelled once it has run."""
        env: list[tuple[str | None, Any]] = list(params)
        b = Block(len(params))
        st = b.stmts
        n_created = len(self.created.order)

        def arrs(ok_only: bool = False) -> list[int]:
            return [
                i for i, (k, o) in enumerate(env) if k == "arr" and (not ok_only or not _is_fail(o))
            ]

        for _ in range(size):
            choices = ["op"] * 6 + ["fail"] + ["fork"] * 2 + ["pfork"] * 2 + ["await"] * 2
            choices += ["drop", "two", "compiled", "scope", "abandon", "cancel", "stuck"]
            choices += ["batch", "taskcancel", "gather", "racecancel", "pcancel", "mcawait"]
            if in_fork:
                choices += ["await_raise"]
            c = choices[self.pick(len(choices))]
            a = arrs()
            if not a:
                break
            if c == "op":
                kind = list(OPS)[self.pick(len(OPS))]
                ar, _, ref = OPS[kind]
                args = [a[self.pick(len(a))] for _ in range(ar)]
                outs = [env[i][1] for i in args]
                f = first_fail(tuple(outs))
                o = f if f is not None else ref(*outs)
                st.append(("op", kind, args))
                env.append(("arr", o))
            elif c == "fail":
                if quiet:
                    continue
                i = a[self.pick(len(a))]
                code = self.next_uid()
                et = list(ETYPES)[self.pick(len(ETYPES))]
                which = ["fz_fail", "fz_fail_inl", "fz_slowfail"][self.pick(3)]
                src = env[i][1]
                if _is_fail(src):
                    o = src
                else:
                    msg = f"fz-slowfail {code}" if which == "fz_slowfail" else f"fz-fail {code}"
                    o = F(1, et, msg)
                    # Whether it runs depends on whether it is dropped later: decided at drop.
                    self.created.add(o)
                st.append(("fail", which, i, code, et))
                env.append(("arr", o))
            elif c == "stuck":
                if quiet or self.sync or not self.chance(0.15):
                    continue
                i = a[self.pick(len(a))]
                src = env[i][1]
                o = src if _is_fail(src) else F(1, "OpTimeoutError", "")
                if not _is_fail(src):
                    o = F(1, "OpTimeoutError", f"stuck{self.next_uid()}")
                    self.created.add(o)
                st.append(("stuck", i, o))
                env.append(("arr", o))
            elif c == "two":
                i = a[self.pick(len(a))]
                src = env[i][1]
                st.append(("two", i))
                if _is_fail(src):
                    env += [("arr", src), ("arr", src)]
                else:
                    env += [("arr", src * 2.0), ("arr", src - 1.0)]
            elif c == "drop":
                i = a[self.pick(len(a))]
                o = env[i][1]
                # A dropped handle's failure may or may not happen (a cancellation drops
                # what nobody holds).
                if _is_fail(o) and o in self.created and o not in self.observed:
                    self.created.discard(o)
                    self.maybe.add(o)
                st.append(("drop", i))
                env[i] = (None, None)
            elif c == "await" or c == "await_raise":
                cands = [i for i, (k, _) in enumerate(env) if k is not None]
                i = cands[self.pick(len(cands))]
                k, o = env[i]
                f = first_fail(o) if o is not CANCELLED else None
                if c == "await_raise" and o is CANCELLED:
                    continue
                if c == "await_raise" and f is not None:
                    self.observed.add(f)
                    st.append(("await_raise", i))
                    return b, F(f.depth + 1, f.etype, f.msg)
                uid = self.next_uid()
                self.obs[uid] = o
                self.observe(o)
                st.append(("await", i, uid))
                # The awaited value becomes new array variables.
                if f is None and o is not CANCELLED:
                    if k == "fut":
                        env.extend(("arr", x) for x in o)
                        st.append(("unpack", i, len(o)))
                    else:
                        st.append(("unpack", i, -1))
                        env.append(("arr", o))
            elif c == "fork" and depth < 3 and not quiet:
                # Arrays, and now and then a future the fork awaits.
                known = [i for i, (k, _) in enumerate(env) if k is not None]
                n = 1 + self.pick(min(3, len(a)))
                args = [a[self.pick(len(a))] for _ in range(n)]
                if self.chance(0.3):
                    args.append(known[self.pick(len(known))])
                sub, o = self.block(
                    [env[j] for j in args],
                    depth + 1,
                    2 + self.pick(5),
                    in_fork=True,
                    quiet=quiet,
                )
                if o is not CANCELLED and _is_fail(o):
                    self.created.add(o)
                st.append(("fork", sub, args))
                env.append(("fut", o))
            elif c == "pfork":
                if quiet:
                    continue
                kind = ["np", "raise", "ops", "sleep", "nested"][self.pick(5)]
                args = [a[self.pick(len(a))] for _ in range(2)]
                # It may get another plain fork's array. (Not the value of one that returned a
                # pending value: a plain function gets that as it was returned, not its array.)
                futs = [i for i, (k, _) in enumerate(env) if k == "pfut"]
                if futs and self.chance(0.3):
                    args[1] = futs[self.pick(len(futs))]
                outs = [env[j][1] for j in args]
                f = first_fail(tuple(outs))
                code = self.next_uid()
                if f is not None:
                    o = f
                elif kind == "raise":
                    o = self.new_fail("FuzzError", f"pfork {code}")
                elif kind in ("np", "ops", "nested"):
                    o = np.tanh(outs[0]) + outs[1]
                else:
                    o = outs[0] * 2.0
                st.append(("pfork", kind, args, code))
                env.append(("pfut" if kind in ("np", "raise", "sleep") else "pfut-pending", o))
            elif c == "compiled":
                ok = arrs(ok_only=True)
                if not ok:
                    continue
                i = ok[self.pick(len(ok))]
                fn_index = self.pick(len(COMPILED_FNS))
                st.append(("compiled", fn_index, i, self.chance(0.3)))
                env.append(("arr", COMPILED_REF[fn_index](env[i][1])))
            elif c == "scope":
                # Ops dispatched in a timeout scope that expires; the handles stay held.
                kinds = ["sleep", "pending", "compiled"] + (["waitfor"] * (self.loop != "trio"))
                kind = kinds[self.pick(len(kinds))]
                ok = arrs(ok_only=True)
                if not ok:
                    continue
                i = ok[self.pick(len(ok))]
                x = env[i][1]
                self.cancel_constructs = True
                # A caught timeout drops what the request dispatched before it that nobody
                # holds when the request ends (its failures may never happen).
                for f in list(self.created.order[n_created:]):
                    if f in self.created and f not in self.observed:
                        self.created.discard(f)
                        self.maybe.add(f)
                st.append(("scope", kind, i))
                env.append(("arr", np.tanh(x) * 1.5))  # fz_sleep(tanh(x)) held
            elif c == "batch":
                # Concurrent calls of a compiled forward that batches them.
                ok = arrs(ok_only=True)
                if not ok:
                    continue
                args = [ok[self.pick(len(ok))] for _ in range(1 + self.pick(4))]
                st.append(("batch", args))
                env.extend(("arr", _batch_ref(env[j][1])) for j in args)
            elif c == "mcawait":
                # In model code, awaiting a fork gives its pending outputs, not arrays.
                futs = [i for i, (k, o) in enumerate(env) if k == "fut"]
                if not futs:
                    continue
                i = futs[self.pick(len(futs))]
                o = env[i][1]
                uid = self.next_uid()
                st.append(("mcawait", i, uid))
                if isinstance(o, F):
                    self.obs[uid] = o
                    self.observed.add(o)
                else:
                    self.obs[uid] = len(o)
                    env.extend(("arr", x) for x in o)
            elif c == "gather":
                # Two coroutines await the same future at once: both get its outcome.
                cands = [i for i, (k, o) in enumerate(env) if k is not None]
                i = cands[self.pick(len(cands))]
                o = env[i][1]
                uid, uid2 = self.next_uid(), self.next_uid()
                self.obs[uid] = self.obs[uid2] = o
                self.observe(o)
                st.append(("gather", i, uid, uid2))
            elif c == "abandon":
                cands = arrs(ok_only=True)
                if not cands:
                    continue
                i = cands[self.pick(len(cands))]
                self.cancel_constructs = True
                st.append(("abandon", i))
            elif c == "racecancel" and not quiet:
                # A fork cancelled at a random point of its run (mid-await, mid-trace).
                ok = arrs(ok_only=True)
                if not ok:
                    continue
                args = [ok[self.pick(len(ok))] for _ in range(1 + self.pick(2))]
                first = self.uid + 1
                sub, o = self.block(
                    [env[j] for j in args], depth + 1, 2 + self.pick(5), in_fork=True, quiet=True
                )
                self.optional.update(range(first, self.uid + 1))  # it may stop before them
                self.cancel_constructs = True
                uid = self.next_uid()
                self.obs[uid] = MaybeCancelled(o)
                st.append(("racecancel", sub, args, uid, self.pick(4)))
            elif c == "pcancel" and not quiet:
                # A plain fork's future cancelled at once: queued, it never runs.
                ok = arrs(ok_only=True)
                if not ok:
                    continue
                i = ok[self.pick(len(ok))]
                uid = self.next_uid()
                self.obs[uid] = MaybeCancelled(np.tanh(env[i][1]) + env[i][1])
                st.append(("pcancel", i, uid))
            elif c == "taskcancel" and not quiet:
                # A task of the loop's own (not a fork) hands out values, then is cancelled.
                ok = arrs(ok_only=True)
                if not ok:
                    continue
                args = [ok[self.pick(len(ok))] for _ in range(1 + self.pick(2))]
                sub, o = self.block(
                    [env[j] for j in args], depth + 1, 2 + self.pick(4), in_fork=False, quiet=True
                )
                self.cancel_constructs = True
                st.append(("taskcancel", sub, args))
                env.extend(("arr", x) for x in o)
            elif c == "cancel" and depth < 3 and not quiet:
                ok = arrs(ok_only=True)
                if not ok:
                    continue
                args = [ok[self.pick(len(ok))] for _ in range(1 + self.pick(2))]
                sub, o = self.block(
                    [env[j] for j in args],
                    depth + 1,
                    2 + self.pick(4),
                    in_fork=False,
                    quiet=True,
                )
                self.cancel_constructs = True
                # The block's returns are what it hands out before it blocks.
                held = o if isinstance(o, tuple) else ()
                uid = self.next_uid()
                self.obs[uid] = CANCELLED
                st.append(("cancel", sub, args, uid))
                env.extend(("arr", x) for x in held)
        # The block's result.
        if not quiet and in_fork and self.chance(0.15):
            et = list(ETYPES)[self.pick(len(ETYPES))]
            msg = f"fork-raise {self.next_uid()}"
            b.raises = (et, msg)
            return b, F(1, et, msg)
        a = [i for i, (k, o) in enumerate(env) if k == "arr" and (in_fork or not _is_fail(o))]
        if not a:
            return b, ()
        n = 1 + self.pick(min(3, len(a)))
        b.returns = [a[self.pick(len(a))] for _ in range(n)]
        return b, tuple(env[i][1] for i in b.returns)


def _cf0(x: Any) -> Any:
    return ops.tanh(x @ x) * 0.5 + x


def _cf1(x: Any) -> Any:
    return ops.softmax(ops.sigmoid(x) - x)


async def _cfa0(x: Any) -> Any:
    return _cf0(x)


async def _cfa1(x: Any) -> Any:
    return _cf1(x)


async def _cfa2(x: Any) -> Any:
    return fz_sleep(ops.tanh(x), 1) * 2.0


COMPILED_FNS = [_cfa0, _cfa1, _cfa2]
COMPILED_REF = [
    lambda x: np.tanh(x @ x) * 0.5 + x,
    lambda x: _softmax(_sig(x) - x),
    lambda x: np.tanh(x) * 1.5 * 2.0,
]
_W = np.linspace(-1.0, 1.0, 16).reshape(SHAPE)


async def _batched(x: Any) -> Any:
    """Rows are independent: concurrent calls batch along axis 0."""
    return ops.tanh(ops.matmul(x, _W)) * 0.5 + x


BATCHED = dataflow.compile(_batched, batch_axis=0, max_wait=0.001)


def _batch_ref(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.tanh(x @ _W) * 0.5 + x)


# Shared across seeds (and so across runtimes); a program also makes fresh ones.
SHARED = [dataflow.compile(f) for f in COMPILED_FNS]


def generate(seed: int, loop: str | None = None, interop: int | None = None) -> Program:
    """The program of ``seed`` (on ``loop`` with ``interop`` threads, when given)."""
    g = Gen(seed)
    rng = g.rng
    loops = ["asyncio", "uvloop"] + (["trio"] if trio is not None else [])
    drawn = loops[g.pick(len(loops))]
    loop = drawn if loop is None else loop
    drawn_interop = 1 + g.pick(4) if g.chance(0.9) else 0  # 0: the synchronous mode
    interop = drawn_interop if interop is None else interop
    g.loop, g.sync = loop, interop == 0
    inline = [None, 0.0, 1.0][g.pick(3)]
    max_pending = [None, 100_000, 3][g.pick(3)]
    inputs = [rng.standard_normal(SHAPE) * 0.5 for _ in range(1 + g.pick(3))]
    main, o = g.block([("arr", x) for x in inputs], 0, 3 + g.pick(10), in_fork=False)
    assert isinstance(o, tuple)
    return Program(
        seed,
        loop,
        interop,
        inline,
        max_pending,
        inputs,
        main,
        g.obs,
        g.created,
        g.maybe,
        g.observed,
        main.returns,
        o,
        g.optional,
        30.0 if g.chance(0.15) and not g.sync else None,
    )
