"""Random op programs for tests/test_fuzz_modes.py, and their plain numpy outcome.

A program is a list of ``Step`` s over a list of values: the program's inputs first, then one
value per step (``Ref(i)`` names value i). A step is an op of the ``ops`` library in one of
its spellings (``ops.add(a, b)``, ``a + b``, ``np.add(a, b)`` on a Tensor), with literals:
Python scalars, axes, keys, dtypes, and constant arrays baked into the program (so a traced
graph gets constants to fold). ``Gen`` draws a program from a seed and runs it as plain numpy
at the same time, so it knows every value's shape and dtype and draws operands that mostly
fit (random broadcastable shapes, 0-d, size-1 and empty dimensions, bool / int32 / int64 /
float32 / float64, Fortran-order, reversed and strided arrays, NaN and inf). Where numpy
raises at a step, the program may end there: every mode must then raise a ``DataflowError``
of numpy's builtin class at that very op call. Errors that depend on the values (an integer
array to a negative integer array's power) and the refusals docs/ops.md states on purpose are
never drawn. A step may run in a forked function under dataflow (``Step.fork``), a step may
repeat an earlier one (for CSE) or with a literal equal but not the same (0.0 and -0.0, 2 and
2.0), and the program returns its outputs as a tuple, one value, a list, a dict or nested.

``interpret`` runs a program with one of two op tables: ``numpy`` (the reference) or the
step's dataflow spelling (``interpret_forking``: with its forks); both record which step
raised, for "raised at the call".
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import dataflow
import ops
from tests.test_ops_fuzz import _array, _clip, _sigmoid, _softmax

DTYPES: list[Any] = [np.bool_, np.int32, np.int64, np.float32, np.float64]
SCALARS: list[Any] = [
    2, -3, 0, 1, 2.5, -0.5, 0.0, -0.0, True, False, 300, 2**40, 2**63 - 1, float("nan"),
    float("inf"), -float("inf"), 1e300, np.float32(1.5), np.int32(-2), np.float64("nan"),
    np.bool_(True), np.int64(7),
]  # fmt: skip


@dataclass(frozen=True)
class Ref:
    """Value ``i`` of the program: an input (``i < inputs``) or a step's output."""

    i: int


@dataclass(frozen=True)
class Step:
    """One op call: the op's name, its spelling (a key of ``FORMS[op]``), and its arguments."""

    op: str
    form: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    pick: int | None = None  # split: which of its outputs is the step's value
    fork: str = ""  # under dataflow: "async" / "plain", run by dataflow.fork of such a function


def _relu(x: Any) -> Any:
    return np.maximum(x, 0)


def _astype(x: Any, dtype: Any) -> Any:
    return np.asarray(x).astype(dtype)


def _getitem(x: Any, key: Any) -> Any:
    return x[key]


_UFUNCS = [
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum",
    "greater", "less", "equal", "not_equal", "greater_equal", "less_equal",
    "negative", "abs", "square", "sqrt", "exp", "log", "sin", "cos", "tanh",
]  # fmt: skip
_OPERATORS: dict[str, Callable[..., Any]] = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "divide": lambda a, b: a / b,
    "power": lambda a, b: a**b,
    "greater": lambda a, b: a > b,
    "less": lambda a, b: a < b,
    "equal": lambda a, b: a == b,
    "not_equal": lambda a, b: a != b,
    "greater_equal": lambda a, b: a >= b,
    "less_equal": lambda a, b: a <= b,
    "negative": lambda a: -a,
    "abs": lambda a: abs(a),
    "matmul": lambda a, b: a @ b,
    "getitem": _getitem,
}
_METHODS = {"sum", "mean", "max", "reshape", "transpose", "astype"}

# op -> numpy's function (the reference)
NUMPY: dict[str, Callable[..., Any]] = {name: getattr(np, name) for name in _UFUNCS}
NUMPY.update(
    sigmoid=_sigmoid, relu=_relu, where=np.where, clip=_clip, sum=np.sum, mean=np.mean,
    var=np.var, max=np.max, min=np.min, argmax=np.argmax, argmin=np.argmin,
    matmul=np.matmul, reshape=np.reshape, transpose=np.transpose, flip=np.flip,
    getitem=_getitem, concatenate=np.concatenate, stack=np.stack, astype=_astype,
    softmax=_softmax("softmax"), log_softmax=_softmax("log_softmax"),
    split=lambda x, ios, axis: tuple(np.split(np.asarray(x), ios, axis)),
)  # fmt: skip


def _forms(name: str) -> dict[str, Callable[..., Any]]:
    forms: dict[str, Callable[..., Any]] = {"ops": getattr(ops, name)}
    if name in _OPERATORS:
        forms["operator"] = _OPERATORS[name]
    if name in _UFUNCS or name in ("matmul", "sum", "mean", "var", "max", "min", "argmax",
                                   "argmin", "clip", "reshape", "transpose", "concatenate",
                                   "stack", "where"):  # fmt: skip
        forms["numpy"] = NUMPY[name]  # through Tensor's __array_ufunc__ / __array_function__
    if name in _METHODS:
        forms["method"] = lambda x, *a, **kw: getattr(x, name)(*a, **kw)
    return forms


# op -> spelling -> the call a dataflow program makes
FORMS: dict[str, dict[str, Callable[..., Any]]] = {name: _forms(name) for name in NUMPY}


def _resolve(arg: Any, values: Sequence[Any]) -> Any:
    if isinstance(arg, Ref):
        return values[arg.i]
    if type(arg) in (list, tuple):
        return type(arg)(_resolve(a, values) for a in arg)
    return arg


def call(step: Step, values: Sequence[Any], reference: bool) -> Any:
    """Run one step on ``values``: numpy's function (``reference``) or its dataflow form."""
    fn = NUMPY[step.op] if reference else FORMS[step.op][step.form]
    args = tuple(_resolve(a, values) for a in step.args)
    out = fn(*args, **step.kwargs)
    return out if step.pick is None else out[step.pick]


@dataclass
class Program:
    """A drawn program: its inputs, steps, the values it returns, and numpy's outcome."""

    seed: int
    inputs: list[np.ndarray[Any, Any]]
    steps: list[Step]
    outputs: list[int]
    expected: tuple[Any, ...] | None  # numpy's values of ``outputs``, or None: it raised
    error: BaseException | None = None  # what numpy raised at the last step
    structure: str = "tuple"  # how the program returns its outputs: see ``STRUCTURES``

    def __repr__(self) -> str:
        lines = [f"Program(seed={self.seed})"]
        for k, x in enumerate(self.inputs):
            lines.append(f"  %{k} = input {x.dtype}{list(x.shape)} strides={x.strides}")
        n = len(self.inputs)
        for k, s in enumerate(self.steps):
            kw = f", {s.kwargs}" if s.kwargs else ""
            pick = "" if s.pick is None else f"[{s.pick}]"
            lines.append(f"  %{n + k} = {s.op}<{s.form}>{_short(s.args)}{kw}{pick}")
        lines.append(f"  return {self.outputs} as {self.structure}; numpy raised: {self.error!r}")
        return "\n".join(lines)


def _short(args: tuple[Any, ...]) -> str:
    def one(a: Any) -> str:
        if isinstance(a, Ref):
            return f"%{a.i}"
        if isinstance(a, np.ndarray):
            return f"array({a.dtype}{list(a.shape)}, C={a.flags.c_contiguous})"
        if type(a) in (list, tuple):
            inner = ", ".join(one(v) for v in a)
            return f"[{inner}]" if type(a) is list else f"({inner},)"
        return repr(a)

    return "(" + ", ".join(one(a) for a in args) + ")"


def interpret(
    program: Program, inputs: Sequence[Any], reference: bool, failed: list[int] | None = None
) -> Any:
    """Run ``program`` on ``inputs`` (numpy's functions, or each step's dataflow form); the
    index of a step that raises goes to ``failed``."""
    values = list(inputs)
    for k, step in enumerate(program.steps):
        try:
            values.append(call(step, values, reference))
        except Exception:
            if failed is not None:
                failed.append(k)
            raise
    return STRUCTURES[program.structure]([values[i] for i in program.outputs])


async def interpret_forking(
    program: Program, inputs: Sequence[Any], failed: list[int] | None = None
) -> Any:
    """:func:`interpret` with each step's dataflow form, the steps drawn with ``fork`` run in
    a forked ``async def`` or plain function (model code: awaiting one gives its pending
    value, which the next ops take as it is)."""
    values = list(inputs)

    def one(k: int, step: Step) -> Any:
        try:
            return call(step, values, False)
        except Exception:
            if failed is not None:
                failed.append(k)
            raise

    async def one_async(k: int, step: Step) -> Any:
        return one(k, step)

    with dataflow.model_code():
        for k, step in enumerate(program.steps):
            if step.fork:
                fn: Any = one_async if step.fork == "async" else one
                values.append(await dataflow.wait(dataflow.fork(fn, k, step)))
            else:
                values.append(one(k, step))
    return STRUCTURES[program.structure]([values[i] for i in program.outputs])


# How a program returns its outputs (a traced graph must give the same structure back).
STRUCTURES: dict[str, Callable[[list[Any]], Any]] = {
    "tuple": tuple,
    "single": lambda v: v[0],
    "list": list,
    "dict": lambda v: {f"out{k}": x for k, x in enumerate(v)},
    "nested": lambda v: (v[0], {"rest": list(v[1:])}),
}


def flatten(value: Any) -> tuple[Any, ...]:
    """A program's outputs in order, whatever their structure."""
    if isinstance(value, dict):
        return tuple(x for v in value.values() for x in flatten(v))
    if type(value) in (list, tuple):
        return tuple(x for v in value for x in flatten(v))
    return (value,)


def numpy_outcome(step: Step, values: Sequence[Any]) -> tuple[Any, BaseException | None]:
    """numpy's value of ``step`` (floating-point warnings ignored), or what it raised."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call(step, values, True), None
    except Exception as exc:
        return None, exc


# --------------------------------------------------------------------------- drawing
_KINDS = {
    "binary": 26, "unary": 14, "where": 4, "clip": 3, "reduce": 12, "matmul": 6,
    "reshape": 5, "transpose": 5, "flip": 2, "getitem": 8, "join": 6, "split": 3,
    "astype": 5, "softmax": 4, "repeat": 6,
}  # fmt: skip


def _twin(a: Any) -> Any:
    """A literal equal to ``a`` that is not the same (CSE must keep them apart: 0.0 and -0.0
    divide 1 into inf and -inf; 2 and 2.0 give int and float), or None."""
    if type(a) is bool:
        return int(a)
    if type(a) is int:
        return bool(a) if a in (0, 1) else float(a) if abs(a) < 2**53 else None
    if type(a) is float:
        return -a if a == 0 else int(a) if a.is_integer() else None
    return None


_BINARY = [n for n in _UFUNCS[:13]]
_UNARY = [*_UFUNCS[13:], "sigmoid", "relu"]
NUMPY_ELEMENTWISE = {*_UFUNCS, "where", "clip"}  # (a float where an int goes: refused on purpose)
_REDUCE = ["sum", "mean", "var", "max", "min", "argmax", "argmin"]


class Gen:
    """Draws a program from ``seed`` while running it as numpy (see the module docstring)."""

    def __init__(self, seed: int, *, error_rate: float = 0.1) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.error_rate = error_rate
        self.values: list[Any] = []
        self.steps: list[Step] = []
        self.error: BaseException | None = None

    # -- arrays and shapes
    def _size(self) -> int:
        return int(self.rng.choice([1, 2, 3, 4, 0], p=[0.25, 0.3, 0.25, 0.13, 0.07]))

    def shape(self) -> tuple[int, ...]:
        ndim = int(self.rng.choice(4, p=[0.15, 0.3, 0.35, 0.2]))
        return tuple(self._size() for _ in range(ndim))

    def like(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts with ``shape`` (now and then one that does not)."""
        rng = self.rng
        out = list(shape[int(rng.integers(0, len(shape) + 1)) :] if rng.random() < 0.4 else shape)
        for k in range(len(out)):
            r = rng.random()
            if r < 0.2:
                out[k] = 1
            elif r < 0.23:
                out[k] = self._size()
        if rng.random() < 0.1:
            out.insert(0, int(rng.integers(1, 3)))
        return tuple(out)

    def array(self, shape: tuple[int, ...], dtype: Any = None) -> np.ndarray[Any, Any]:
        dtype = DTYPES[self.rng.integers(len(DTYPES))] if dtype is None else dtype
        a = np.asarray(_array(self.rng, shape, dtype))  # (Fortran order, reversed, NaN, inf)
        if a.ndim and self.rng.random() < 0.15:  # every other row of a larger array
            big = np.asarray(_array(self.rng, (2 * shape[0], *shape[1:]), dtype))
            a = big[::2]
        return a

    # -- operands
    def pick(self, ok: Callable[[Any], bool] = lambda v: True) -> Ref | None:
        """A value (recent ones more often) that ``ok`` accepts, or None."""
        candidates = [i for i, v in enumerate(self.values) if ok(v)]
        if not candidates:
            return None
        if self.rng.random() < 0.6:
            candidates = candidates[-3:]
        return Ref(int(candidates[self.rng.integers(len(candidates))]))

    def operand(self, shape: tuple[int, ...]) -> Any:
        r = self.rng.random()
        if r < 0.5:
            ref = self.pick(lambda v: np.ndim(v) <= len(shape) + 1)
            if ref is not None:
                return ref
        if r < 0.75:
            return SCALARS[self.rng.integers(len(SCALARS))]
        return self.array(self.like(shape))

    def value(self, arg: Any) -> Any:
        return self.values[arg.i] if isinstance(arg, Ref) else arg

    def form(self, op: str) -> str:
        forms = list(FORMS[op])
        return forms[self.rng.integers(len(forms))]

    def axis(self, ndim: int, *, tuples: bool = True, none: bool = True) -> Any:
        r = self.rng.random()
        if (none and r < 0.25) or not ndim:
            return None
        if tuples and r < 0.4 and ndim >= 2:
            pair = self.rng.choice(np.arange(-ndim, ndim), 2, replace=False)
            return tuple(int(a) for a in pair)
        lo, hi = (-ndim - 1, ndim + 1) if self.rng.random() < 0.1 else (-ndim, ndim)
        return int(self.rng.integers(lo, hi))

    # -- steps, one drawer per kind
    def _binary(self) -> Step | None:
        op = _BINARY[self.rng.integers(len(_BINARY))]
        x: Any = self.pick()
        assert x is not None
        if self.rng.random() < 0.1:  # a node of constants only, for constant folding
            x = self.array(np.shape(self.value(x)))
            return Step(op, "ops", (x, self.operand(x.shape)))
        y = self.operand(np.shape(self.value(x)))
        args = (x, y) if self.rng.random() < 0.7 else (y, x)
        return Step(op, self.form(op), args)

    def _unary(self) -> Step | None:
        op = _UNARY[self.rng.integers(len(_UNARY))]
        x = self.pick(lambda v: op != "relu" or np.asarray(v).dtype != bool)
        return None if x is None else Step(op, self.form(op), (x,))

    def _where(self) -> Step | None:
        c = self.pick()
        assert c is not None
        shape = np.shape(self.value(c))
        return Step("where", self.form("where"), (c, self.operand(shape), self.operand(shape)))

    def _clip(self) -> Step | None:
        x = self.pick(lambda v: np.asarray(v).dtype != bool)
        if x is None:
            return None
        shape = np.shape(self.value(x))
        lo = self.operand(shape) if self.rng.random() < 0.7 else None
        hi = self.operand(shape) if self.rng.random() < 0.7 or lo is None else None
        return Step("clip", self.form("clip"), (x, lo, hi))

    def _reduce(self, x: Ref | None = None, axis: Any = "draw") -> Step | None:
        op = _REDUCE[self.rng.integers(len(_REDUCE))]
        x = self.pick() if x is None else x
        assert x is not None
        ndim = np.ndim(self.value(x))
        if axis == "draw":  # (a 0-d input along an axis: refused on purpose, docs/ops.md)
            axis = self.axis(ndim, tuples=not op.startswith("arg")) if ndim else None
        kwargs: dict[str, Any] = {"axis": axis}
        if self.rng.random() < 0.3:
            kwargs["keepdims"] = True
        if op == "var" and self.rng.random() < 0.3:
            kwargs["ddof"] = int(self.rng.integers(0, 3))
        form = self.form(op)
        if form == "method" and op == "max" and isinstance(axis, tuple):
            form = "ops"
        return Step(op, form, (x,), kwargs)

    def _matmul(self) -> Step | None:
        x = self.pick(lambda v: np.ndim(v) >= 1 or self.rng.random() < 0.05)
        if x is None:
            return None
        shape = np.shape(self.value(x))
        k = shape[-1] if shape else 2

        def fits(v: Any) -> bool:
            s = np.shape(v)
            return (len(s) == 1 and s[0] == k) or (len(s) >= 2 and s[-2] == k)

        y: Any = self.pick(fits) if self.rng.random() < 0.5 else None
        if y is None:
            m = self._size() or 1
            if self.rng.random() < 0.05:
                k += 1
            options = [(k,), (k, m), (int(self.rng.integers(1, 3)), k, m)]
            y = self.array(options[self.rng.integers(3)], DTYPES[self.rng.integers(1, 5)])
        return Step("matmul", self.form("matmul"), (x, y))

    def _reshape(self) -> Step | None:
        x = self.pick()
        assert x is not None
        n = int(np.size(self.value(x)))
        shapes: list[Any] = [(n,), (-1,), (1, n), (n, 1, -1), n, (-1, 1)]
        shapes += [(2, -1), (n // 2, 2)] if n % 2 == 0 else [(n + 1,)]
        if n == 1:
            shapes.append(())
        new = shapes[self.rng.integers(len(shapes))]
        return Step("reshape", self.form("reshape"), (x, new))

    def _transpose(self) -> Step | None:
        x = self.pick()
        assert x is not None
        ndim = np.ndim(self.value(x))
        if self.rng.random() < 0.3:
            return Step("transpose", self.form("transpose"), (x,))
        perm = tuple(int(a) for a in self.rng.permutation(ndim))
        form = self.form("transpose")
        return Step("transpose", form, (x, perm))

    def _flip(self) -> Step | None:
        x = self.pick(lambda v: np.ndim(v) >= 1)
        if x is None:
            return None
        return Step("flip", "ops", (x, self.axis(np.ndim(self.value(x)))))

    def _key_item(self, n: int) -> Any:
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            return int(rng.integers(-n - 1, n + 1)) if rng.random() < 0.1 else (
                int(rng.integers(-n, n)) if n else 0)  # fmt: skip
        if r < 0.7:
            ends = [None, *range(-n - 1, n + 2)]
            step = [None, 1, 2, -1, -2][rng.integers(5)]
            return slice(ends[rng.integers(len(ends))], ends[rng.integers(len(ends))], step)
        if r < 0.85 and n:
            return [int(i) for i in rng.integers(-n, n, int(rng.integers(1, 4)))]
        if r < 0.95:
            return rng.random(n) < 0.5
        return None

    def _getitem(self) -> Step | None:
        x = self.pick()
        assert x is not None
        shape = np.shape(self.value(x))
        items: list[Any] = [
            self._key_item(n) for n in shape[: int(self.rng.integers(len(shape) + 1))]
        ]
        if self.rng.random() < 0.2:
            items.insert(int(self.rng.integers(len(items) + 1)), None)
        if self.rng.random() < 0.15:
            items.insert(int(self.rng.integers(len(items) + 1)), ...)
        if shape and self.rng.random() < 0.2:  # an index Tensor, its values in range
            n = shape[0]

            def fits(v: Any) -> bool:
                a = np.asarray(v)
                return a.dtype.kind in "iu" and a.size > 0 and -n <= a.min() and a.max() < n

            ref = self.pick(fits)
            if ref is not None:
                items[:1] = [ref]
                # (ops.getitem: an ndarray value indexed by a pending Tensor, x[t], is numpy's
                # own indexing, which asks the Tensor for its array: NotReadyError, as docs)
                return Step("getitem", "ops", (x, tuple(items)))
        key: Any = tuple(items) if len(items) != 1 or self.rng.random() < 0.3 else items[0]
        if isinstance(key, list):  # (numpy reads a list of ints as one index array)
            key = (key,)
        return Step("getitem", self.form("getitem"), (x, key))

    def _join(self) -> Step | None:
        x = self.pick()
        assert x is not None
        v = self.value(x)
        stack = self.rng.random() < 0.5
        axis = self.axis(np.ndim(v) + stack, tuples=False, none=not stack)
        items: list[Any] = [x]
        for _ in range(int(self.rng.integers(0, 3))):
            same = self.pick(lambda w: np.shape(w) == np.shape(v))
            if same is not None and self.rng.random() < 0.5:
                items.append(same)
                continue
            shape = list(np.shape(v))
            if shape and not stack and isinstance(axis, int) and -len(shape) <= axis < len(shape):
                shape[axis] = self._size()
            items.append(self.array(tuple(shape)))
        self.rng.shuffle(items)
        op = "stack" if stack else "concatenate"
        return Step(op, self.form(op), (items,), {"axis": 0 if axis is None else axis} if stack
                    else {"axis": axis})  # fmt: skip

    def _split(self) -> Step | None:
        x = self.pick(lambda v: np.ndim(v) >= 1)
        if x is None:
            return None
        ndim = np.ndim(self.value(x))
        ios: Any = int(self.rng.integers(1, 4)) if self.rng.random() < 0.6 else [1]
        axis = int(self.rng.integers(-ndim, ndim))
        pieces = ios if isinstance(ios, int) else len(ios) + 1
        return Step("split", "ops", (x, ios, axis), pick=int(self.rng.integers(pieces)))

    def _astype(self) -> Step | None:
        x = self.pick()
        assert x is not None
        dtype = DTYPES[self.rng.integers(len(DTYPES))]
        r = self.rng.random()
        if r < 0.3:
            dtype = np.dtype(dtype)
        elif r < 0.4:
            dtype = np.dtype(dtype).name  # ("int32": a string)
        return Step("astype", self.form("astype"), (x, dtype))

    def _repeat(self) -> Step | None:
        """An earlier step again (CSE merges it), or with a literal that is equal but not the
        same, or a copy of a constant array, or the same bytes in another dtype."""
        if not self.steps:
            return None
        step = self.steps[int(self.rng.integers(len(self.steps)))]
        args = list(step.args)
        k = int(self.rng.integers(len(args)))
        a = args[k]
        r = self.rng.random()
        if r < 0.4 and _twin(a) is not None and step.op in NUMPY_ELEMENTWISE:
            args[k] = _twin(a)
        elif r < 0.7 and isinstance(a, np.ndarray):
            args[k] = a.copy()
        elif r < 0.85 and isinstance(a, np.ndarray) and a.dtype.itemsize in (4, 8) and a.size:
            other: list[Any] = (
                [np.int32, np.float32] if a.dtype.itemsize == 4 else [np.int64, np.float64]
            )
            args[k] = np.ascontiguousarray(a).view(other[int(self.rng.integers(2))])
        # (a step of constants only keeps its ops form: in another, numpy would compute it)
        form = self.form(step.op) if _reads_a_value(args) else step.form
        return Step(step.op, form, tuple(args), dict(step.kwargs), step.pick)

    def _softmax(self) -> Step | None:  # (an empty input gives an empty output on purpose)
        x = self.pick(lambda v: np.size(v) > 0)
        if x is None:
            return None
        op = "softmax" if self.rng.random() < 0.6 else "log_softmax"
        ndim = np.ndim(self.value(x))
        return Step(op, "ops", (x, self.axis(ndim, none=ndim > 0) if ndim else None))

    # -- a whole program
    def _step(self, kind: str, allow_error: bool) -> bool:
        """Draw a step of ``kind`` that numpy runs (or, if allowed, one it refuses: the
        program ends there); True when the program ended."""
        for _ in range(20):
            step = getattr(self, "_" + kind)()
            if step is None:
                return False
            value, exc = numpy_outcome(step, self.values)
            if exc is not None:
                if allow_error and not _value_dependent(step, exc):
                    if self.rng.random() < 0.2:
                        step = dataclasses.replace(
                            step, fork=("async", "plain")[self.rng.integers(2)]
                        )
                    self.steps.append(step)
                    self.error = exc
                    return True
                continue
            if _comparison_warns(step, self.values):
                continue
            if any(np.size(v) > 3000 for v in (value if isinstance(value, tuple) else (value,))):
                continue
            if self.rng.random() < 0.1:
                step = dataclasses.replace(step, fork=("async", "plain")[self.rng.integers(2)])
            self.steps.append(step)
            self.values.append(value)
            if step.op == "stack" and self.rng.random() < 0.5:  # what stack folding rewrites
                x = Ref(len(self.values) - 1)
                self._fold(self._reduce(x, axis=step.kwargs["axis"]))
            return False
        return False

    def _fold(self, step: Step | None) -> None:
        if step is None or step.op.startswith("arg") or step.op == "var":
            return
        step.kwargs.pop("keepdims", None)
        value, exc = numpy_outcome(step, self.values)
        if exc is None:
            self.steps.append(step)
            self.values.append(value)

    def draw(self) -> Program:
        rng = self.rng
        base = self.shape()
        inputs = [
            self.array(base if k == 0 else self.like(base)) for k in range(rng.integers(1, 4))
        ]
        self.values = list(inputs)
        count = int(rng.integers(5, 31))
        kinds, weights = list(_KINDS), np.array(list(_KINDS.values()), float)
        allow_error = bool(rng.random() < self.error_rate)
        for _ in range(3 * count):
            if len(self.steps) >= count:
                break
            kind = str(rng.choice(kinds, p=weights / weights.sum()))
            if self._step(kind, allow_error and len(self.steps) >= count // 2):
                break
        outputs = [len(self.values) - 1]
        for _ in range(int(rng.integers(0, 3))):
            outputs.append(int(rng.integers(len(self.values))))
        structure = str(rng.choice(list(STRUCTURES), p=[0.6, 0.1, 0.1, 0.1, 0.1]))
        outputs = outputs[:1] if structure == "single" else outputs
        expected = None if self.error else tuple(self.values[i] for i in outputs)
        return Program(self.seed, inputs, self.steps, outputs, expected, self.error, structure)

    def other_inputs(self, program: Program) -> list[np.ndarray[Any, Any]]:
        """Fresh inputs of the program's shapes and dtypes (other values, other layouts)."""
        return [self.array(x.shape, x.dtype) for x in program.inputs]


def _reads_a_value(arg: Any) -> bool:
    if isinstance(arg, Ref):
        return True
    return type(arg) in (list, tuple) and any(_reads_a_value(a) for a in arg)


def _value_dependent(step: Step, exc: BaseException) -> bool:
    """numpy's error depends on the values, not on shapes and dtypes (never drawn)."""
    return step.op == "power" and "negative integer powers" in str(exc)


def draw(seed: int) -> tuple[Program, list[np.ndarray[Any, Any]]]:
    """Program ``seed``, and a second set of inputs for it."""
    gen = Gen(seed)
    program = gen.draw()
    return program, gen.other_inputs(program)


_COMPARISONS = ("greater", "less", "equal", "not_equal", "greater_equal", "less_equal")


def _comparison_warns(step: Step, values: Sequence[Any]) -> bool:
    """A comparison numpy warns about (a Python int cast to float16 overflows): its kernel is
    the raw ufunc (no ``quiet``, for speed), so under ``filterwarnings = error`` the task
    fails, where a fused graph's kernel is quiet. Known, left out (as tests/test_ops_fuzz.py
    leaves out complex ordering comparisons)."""
    if step.op not in _COMPARISONS:
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            call(step, values, True)
    except RuntimeWarning:
        return True
    except Exception:
        return False
    return False
