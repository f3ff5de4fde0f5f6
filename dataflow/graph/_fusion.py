"""Fusion of elementwise chains into one task, and the fused op's kernels.

**Which ops are elementwise.** ``dataflow`` knows no op library, so it recognises them by what
they are: an op whose kernel is a numpy ufunc (or wraps one, via ``functools.wraps``) with one
output and no core dimensions (``np.add``, ``np.tanh``, ``np.greater`` ..., not ``np.matmul``),
called with one positional argument per ufunc input. An op whose kernel is something else can
declare itself with attributes: ``op.elementwise = True`` (same shapes in, broadcast shape
out, each element on its own) and, optionally, ``op.numexpr = "tanh({0})"``.

**What is fused.** Trees: a producer is merged into its consumer when both are elementwise and
the consumer is the producer's only reader (and the producer is not a graph output). So every
intermediate of a fused group is read exactly once, inside the group, and nothing outside it
ever sees it; values other nodes also read stay separate nodes.

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
from ._builder import Builder
from ._ir import (
    ConstRef,
    Graph,
    InputRef,
    Node,
    NodeRef,
    OpLike,
    UnresolvedOp,
    ValueType,
    iter_refs,
)

__all__ = ["ENGINES", "Arg", "FusedOp", "FusedStep", "Tmp", "fuse_elementwise"]

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
    """The elementwise ufunc an op's kernel is (or wraps), else None."""
    kernel = op.kernel
    kernel = getattr(kernel, "__wrapped__", kernel)
    if isinstance(kernel, np.ufunc) and kernel.signature is None and kernel.nout == 1:
        return kernel
    return None


def is_elementwise(node: Node) -> bool:
    """Whether a node may join a fused group (see the module docstring)."""
    op = node.op
    if node.multi or node.kwargs or isinstance(op, (FusedOp, UnresolvedOp)):
        return False
    for a in node.args:  # references and plain scalars only: no lists hiding references
        if type(a) in (list, tuple, dict) and any(True for _ in iter_refs(a)):
            return False
    ufunc = ufunc_of(op)
    if ufunc is not None:
        return ufunc.nin == len(node.args)
    return getattr(op, "elementwise", False) is True


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
            if ne is None or not all(isinstance(a, np.ndarray) and a.dtype == dtype for a in args):
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


# -- the pass --------------------------------------------------------------------------------


def fuse_elementwise(graph: Graph, *, engine: str = "numpy") -> Graph:
    """Merge trees of elementwise nodes into single fused nodes (one task each).

    See the module docstring for what is fused. Graphs without two adjacent elementwise nodes
    come back unchanged (an equal graph).

    Args:
        graph: the graph.
        engine: "numpy" (default, exact) or "numexpr" (one expression per group, when it can).
    """
    if engine not in ENGINES:
        raise DataflowValueError(f"fusion engine must be one of {ENGINES}, got {engine!r}")
    nodes = graph.nodes
    uses: dict[NodeRef, int] = {}
    for node in nodes:
        for r in node.refs():
            if type(r) is NodeRef:
                uses[r] = uses.get(r, 0) + 1
    outputs = {r for r in iter_refs(graph.outputs) if type(r) is NodeRef}
    elementwise = [is_elementwise(n) for n in nodes]
    # absorbed[p] = c: node p becomes a step of its only reader c.
    absorbed: dict[int, int] = {}
    for c, node in enumerate(nodes):
        if not elementwise[c]:
            continue
        for r in node.args:
            if type(r) is NodeRef and elementwise[r.node] and uses.get(r) == 1 and r not in outputs:
                absorbed[r.node] = c
    if not absorbed:
        return graph
    roots = set(absorbed.values()) - set(absorbed)
    b = Builder(graph)
    for i, node in enumerate(nodes):
        if i in absorbed:
            continue  # its only reader, later, carries it as a step
        if i not in roots:
            b.keep(i)
            continue
        steps, external, cost, slowest = _group(nodes, i, absorbed)
        fused = Node(
            FusedOp(steps, engine, slowest),
            tuple(b.remap(external)),
            {},
            node.spec,
            node.types,
            False,
            cost,
            node.location,
        )
        b.add(fused, replaces=i)
    return b.finish()


def _group(
    nodes: Sequence[Node], root: int, absorbed: dict[int, int]
) -> tuple[list[FusedStep], list[Any], Cost, float]:
    """The steps of the tree rooted at ``root`` (post-order), its external values, its cost and
    its slowest member's estimated seconds.

    A depth-first walk with an explicit stack (a chain of thousands of ops is one deep tree):
    each frame is a member, the index of its next argument and the arguments built so far; a
    member's step is written once all its arguments are, so steps come in post-order and
    external values are numbered in the order the walk meets them.
    """
    steps: list[FusedStep] = []
    external: list[Any] = []
    position: dict[Any, int] = {}
    flops = nbytes = slowest = 0.0
    stack: list[tuple[int, int, list[Any]]] = [(root, 0, [])]
    while stack:
        n, k, args = stack[-1]
        member = nodes[n]
        if k < len(member.args):
            stack[-1] = (n, k + 1, args)
            a = member.args[k]
            if type(a) is NodeRef and absorbed.get(a.node) == n:
                stack.append((a.node, 0, []))  # its Tmp joins `args` when it is done
            elif type(a) in (NodeRef, InputRef, ConstRef):
                if a not in position:
                    position[a] = len(external)
                    external.append(a)
                args.append(Arg(position[a]))
            else:
                args.append(a)
            continue
        stack.pop()
        if member.cost is not None:
            flops += member.cost.flops
            nbytes += member.cost.bytes
        slowest = max(slowest, estimate_seconds(member.cost))
        steps.append(FusedStep(member.op, tuple(args), member.types[0]))
        if stack:
            stack[-1][2].append(Tmp(len(steps) - 1))
    return steps, external, Cost(flops, nbytes), slowest
