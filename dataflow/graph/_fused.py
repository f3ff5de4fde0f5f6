"""The fused op: several elementwise ops run as one task, and its kernels.

The pass (``_fusion``: which ops are elementwise, and what is fused) turns a tree of
elementwise nodes into one node whose op is a :class:`FusedOp`. This module holds that op: its
steps (:class:`FusedStep`, whose arguments are :class:`Arg` and :class:`Tmp` references and
literals), the kernels it runs and the rules (``meta``, ``cost``, ``handle``) it composes from
its steps'. It is apart from the pass because it is what a graph file holds and what runs:
reading, writing, printing and running a graph (``_read``, ``_format``, ``_printer``,
``_execute``) use the op without the pass.

**The kernels.** ``engine="numpy"`` (the default) runs the ops' own kernels one after the other
in one task, but calls a ufunc with ``out=`` an intermediate it already owns whenever shape and
dtype match, so a chain of n ops allocates one buffer instead of n. Results are bit-for-bit the
eager ones. ``engine="numexpr"`` evaluates the whole tree as one numexpr expression when every
op has a numexpr form and every value has the same floating dtype, and falls back to the numpy
kernel otherwise; numexpr releases the GIL, and is pinned to one thread
(``numexpr.set_num_threads(1)``, process-wide, on first use) because the inter-op pool is the
parallelism. Measured on our 2-vCPU machines numpy's own SIMD loops are faster (float32
``tanh`` several times), hence the default; see ``docs/graph.md``.

Floating-point warnings are handled as ``ops`` kernels do: if the warning filters turn one into
an exception, the fused kernel runs again under ``np.errstate(all="ignore")`` (it only ever
writes into its own intermediates, so running twice is safe).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import DataflowValueError
from .._scheduler import get_inline_threshold
from .._signature import Signature
from .._task import Cost, Task, checked_cost, estimate_seconds
from ._ir import OpLike, UnresolvedOp, ValueType

__all__ = ["ENGINES", "Arg", "FusedOp", "FusedStep", "Tmp", "ufunc_of"]

ENGINES = ("numpy", "numexpr")


@dataclass(frozen=True, slots=True)
class Arg:
    """Inside a fused op: its ``index``-th argument."""

    index: int


@dataclass(frozen=True, slots=True)
class Tmp:
    """Inside a fused op: the value of step ``index``."""

    index: int


@dataclass(frozen=True, slots=True)
class FusedStep:
    """One op of a fused group; ``args`` hold :class:`Arg`, :class:`Tmp` and literals."""

    op: OpLike
    args: tuple[Any, ...]
    type: ValueType | None


def ufunc_of(op: OpLike) -> np.ufunc | None:
    """The elementwise ufunc an op's kernel is, or stands for (a wrapper that calls it
    unchanged says so with a ``dataflow_ufunc`` attribute), else None.

    A wrapper made with ``functools.wraps`` alone does not count: it may do more than the
    ufunc (clip, cast, check), which fusion, calling the ufunc with ``out=``, would skip."""
    kernel: Any = op.kernel
    if not isinstance(kernel, np.ufunc):
        kernel = getattr(kernel, "dataflow_ufunc", None)
    if isinstance(kernel, np.ufunc) and kernel.signature is None and kernel.nout == 1:
        return kernel
    return None


# -- numexpr ---------------------------------------------------------------------------------

# numexpr's spelling of the ufuncs whose semantics it shares (maximum/minimum are not here:
# numexpr has no NaN-propagating form of them).
_NUMEXPR_FORMS: dict[np.ufunc, str] = {
    np.add: "({0} + {1})",
    np.subtract: "({0} - {1})",
    np.multiply: "({0} * {1})",
    np.true_divide: "({0} / {1})",
    np.negative: "(-{0})",
    np.exp: "exp({0})",
    np.log: "log({0})",
    np.tanh: "tanh({0})",
    np.sqrt: "sqrt({0})",
    np.sin: "sin({0})",
    np.cos: "cos({0})",
    np.absolute: "abs({0})",
}

_numexpr_lock = threading.Lock()
_numexpr_state: list[Any] = []  # [module or None], filled on first use


def _numexpr() -> Any:
    """The numexpr module pinned to one thread, or None when it is not installed."""
    if not _numexpr_state:
        with _numexpr_lock:
            if not _numexpr_state:
                try:
                    import numexpr
                except ImportError:
                    _numexpr_state.append(None)
                else:
                    numexpr.set_num_threads(1)
                    _numexpr_state.append(numexpr)
    return _numexpr_state[0]


def _numexpr_form(op: OpLike) -> str | None:
    ufunc = ufunc_of(op)
    if ufunc is not None:
        return _NUMEXPR_FORMS.get(ufunc)
    form = getattr(op, "numexpr", None)
    return form if isinstance(form, str) else None


def _numexpr_plan(steps: Sequence[FusedStep]) -> tuple[str, np.dtype[Any], dict[str, Any]] | None:
    """(expression, dtype, constant variables) when the whole group can run in numexpr."""
    dtypes = {s.type.dtype if s.type is not None else None for s in steps}
    if len(dtypes) != 1:
        return None
    dtype = dtypes.pop()
    if dtype is None or dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    consts: dict[str, Any] = {}
    texts: list[str] = []
    for step in steps:
        form = _numexpr_form(step.op)
        if form is None:
            return None
        operands: list[str] = []
        for a in step.args:
            if type(a) is Arg:
                operands.append(f"a{a.index}")
            elif type(a) is Tmp:
                operands.append(texts[a.index])
            elif type(a) in (int, float) or (isinstance(a, np.generic) and a.dtype == dtype):
                # A Python scalar is weak (NEP 50): numpy computes in the array's dtype.
                name = f"k{len(consts)}"
                consts[name] = np.asarray(a, dtype=dtype)
                operands.append(name)
            else:
                return None
        texts.append(form.format(*operands))
    return texts[-1], dtype, consts


# -- the fused op ----------------------------------------------------------------------------


def _numpy_runner(steps: Sequence[FusedStep]) -> Callable[..., Any]:
    """Run the steps' kernels in order, reusing intermediates as ufunc outputs.

    An intermediate made by a ufunc is a fresh array that only this kernel sees and that is
    read exactly once (groups are trees), so the step reading it may write its own result into
    it (``out=``) when its type is the intermediate's: the same ufunc loop runs, minus an
    allocation. Types are the graph's static ones, which the inputs' check at dispatch makes
    true.
    """
    plan: list[tuple[Callable[..., Any], np.ufunc | None, tuple[Any, ...], int | None]] = []
    for step in steps:
        ufunc = ufunc_of(step.op)
        reuse: int | None = None
        if ufunc is not None and step.type is not None and step.type.shape != ():
            for position, a in enumerate(step.args):
                if (
                    type(a) is Tmp
                    and ufunc_of(steps[a.index].op) is not None
                    and steps[a.index].type == step.type
                ):
                    reuse = position
                    break
        plan.append((step.op.kernel, ufunc, step.args, reuse))

    def run(*args: Any) -> Any:
        tmps: list[Any] = []
        for kernel, ufunc, spec, reuse in plan:
            values = [
                args[a.index] if type(a) is Arg else tmps[a.index] if type(a) is Tmp else a
                for a in spec
            ]
            if reuse is not None and isinstance(values[reuse], np.ndarray):
                assert ufunc is not None
                tmps.append(ufunc(*values, out=values[reuse]))
            else:
                tmps.append(kernel(*values))
        return tmps[-1]

    return run


def _quiet(run: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(*args: Any) -> Any:
        try:
            return run(*args)
        except RuntimeWarning:
            with np.errstate(all="ignore"):
                return run(*args)

    return kernel


class FusedOp:
    """Several elementwise ops run as one task (made by :func:`fuse_elementwise`).

    It behaves as an op: ``kernel`` computes the group's result from the node's arguments,
    ``meta`` and ``cost`` compose the steps' rules, ``handle`` is the last step's.
    """

    name = "fused"
    qualname = "dataflow.graph:fused"
    inline: bool | None = None

    def __init__(
        self,
        steps: Sequence[FusedStep],
        engine: str = "numpy",
        step_seconds: float | None = None,
    ) -> None:
        if engine not in ENGINES:
            raise DataflowValueError(f"fusion engine must be one of {ENGINES}, got {engine!r}")
        if not steps:
            raise DataflowValueError("a fused op needs at least one step")
        self.steps = tuple(steps)
        self.engine = engine
        # The estimated time of the slowest step: where the steps would each have run inline,
        # the group runs inline too (see `runs_inline`), however long their sum.
        self.step_seconds = step_seconds
        self.kernel: Callable[..., Any] = self._build()

    def runs_inline(self) -> bool | None:
        """True when every step alone would run inline at dispatch (else: decide by cost)."""
        if self.step_seconds is not None and self.step_seconds < get_inline_threshold():
            return True
        return None

    @property
    def handle(self) -> Callable[[Task, int | None, Any], Any]:
        """The last step's handle factory (a fused op returns what its last op returns)."""
        return self.steps[-1].op.handle

    @property
    def check(self) -> Callable[[Any, Any], str | None] | None:
        """The last step's value check (a fused op's value is its last step's)."""
        return getattr(self.steps[-1].op, "check", None)

    def __repr__(self) -> str:
        names = ", ".join(s.op.name for s in self.steps)
        return f"<FusedOp {self.engine} [{names}]>"

    def _build(self) -> Callable[..., Any]:
        if any(isinstance(s.op, UnresolvedOp) for s in self.steps):
            return UnresolvedOp.kernel
        fallback = _quiet(_numpy_runner(self.steps))
        if self.engine != "numexpr":
            return fallback
        planned = _numexpr_plan(self.steps)
        if planned is None:
            return fallback
        expression, dtype, consts = planned

        def numexpr_kernel(*args: Any) -> Any:
            ne = _numexpr()
            # (An empty operand: numexpr broadcasts (1, 0) with (3, 0) to (1, 0), and there
            # is nothing to compute.)
            if ne is None or not all(
                isinstance(a, np.ndarray) and a.dtype == dtype and a.size for a in args
            ):
                return fallback(*args)
            local = {f"a{i}": a for i, a in enumerate(args)}
            local.update(consts)
            out = ne.evaluate(expression, local_dict=local)
            return out if out.dtype == dtype else out.astype(dtype)

        return numexpr_kernel

    def _abstract(self, args: Sequence[Any]) -> tuple[Any, Cost, float]:
        """(spec, cost, slowest step's seconds) from the steps' rules on stand-in handles."""
        handles: list[Any] = []
        flops = nbytes = slowest = 0.0
        spec: Any = None
        for step in self.steps:
            op = step.op
            values = [
                args[a.index] if type(a) is Arg else handles[a.index] if type(a) is Tmp else a
                for a in step.args
            ]
            spec = op.meta(*values)
            cost = checked_cost(op.cost(*values), op.name) if op.cost is not None else None
            slowest = max(slowest, estimate_seconds(cost))
            if cost is not None:
                flops += cost.flops
                nbytes += cost.bytes
            stand_in = Task(Signature(op.name, spec, cost), op.kernel, (), None, None)
            handles.append(op.handle(stand_in, None, spec))
        return spec, Cost(flops, nbytes), slowest

    def meta(self, *args: Any) -> Any:
        """The last step's spec, from the steps' meta rules (raises as they do)."""
        return self._abstract(args)[0]

    def cost(self, *args: Any) -> Cost:
        """The sum of the steps' costs (and, as a side effect, ``step_seconds``)."""
        _, cost, self.step_seconds = self._abstract(args)
        return cost
