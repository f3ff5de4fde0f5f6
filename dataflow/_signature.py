"""Signatures: what dispatch knows about one way of calling an op.

An op caches one :class:`Signature` per *argument signature* (``_op``'s docstring,
"Signatures"), so a repeated call costs a dictionary lookup: its output spec(s), its cost, and
its kernel time as measured, which is what the scheduler places tasks by (``_scheduler``),
with the GIL lane's measurements (``_scheduler._placement``). Every task points at the
signature it came from (``_task``).

Output specs are interned as small ints (:func:`spec_key`): a handle on a task's output puts
that int in the signature key of the ops it is passed to, which hashes at once where a shape
tuple would be hashed again on every call.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._errors import OpOutputError
from ._task import estimate_seconds

if TYPE_CHECKING:
    from ._task import Cost, Task

__all__ = ["Signature", "spec_key", "spec_keys"]


# Interned specs: spec -> a small int standing for it in signature keys (an int hashes at once;
# a shape tuple would be hashed again on every call). Restarted (with new ints) past its limit.
_spec_ids: dict[Any, int] = {}
_spec_counter = itertools.count(1).__next__
_MAX_SPECS = 1 << 16


# An op's output spec(s) -> their keys (:func:`spec_keys`): one lookup for a call that misses
# its op's signature cache (``op(x, i)`` with a new ``i`` each call) instead of two calls and
# a tuple. Cleared with ``_spec_ids``, whose ints it holds.
_keys_of: dict[Any, tuple[int | None, ...]] = {}


def spec_key(spec: Any) -> int | None:
    """The interned int of a spec (None for an unhashable one)."""
    try:
        found = _spec_ids.get(spec)
    except TypeError:
        return None
    if found is None:
        if len(_spec_ids) >= _MAX_SPECS:
            _spec_ids.clear()
            _keys_of.clear()
        found = _spec_ids[spec] = _spec_counter()
    return found


def spec_keys(spec: Any) -> tuple[int | None, ...]:
    """The interned ints of an op's output specs (one per output; None for an unhashable
    one)."""
    try:
        found = _keys_of.get(spec)
    except TypeError:  # an unhashable spec, or a tuple with one
        found = None
    if found is not None:
        return found
    keys = tuple([spec_key(s) for s in spec]) if type(spec) is tuple else (spec_key(spec),)
    if None not in keys:
        if len(_keys_of) >= _MAX_SPECS:
            _keys_of.clear()
        _keys_of[spec] = keys
    return keys


class Signature:
    """One way of calling an op: its output spec(s), cost, and kernel time as measured.

    Dispatch looks this up by the call's argument signature (see ``_op``), so the meta and
    cost rules run once per signature. ``seconds`` starts as the cost rule's estimate
    (:func:`estimate_seconds`) and becomes a running average of measured kernel times
    (sampled), which is what the scheduler places tasks by (see ``_scheduler``).

    Attributes:
        name: the op's name (``"matmul"``), or a forked function's qualified name.
        spec: the output's spec, or a tuple of specs for an op with several outputs.
        cost: the cost rule's estimate, or None.
        seconds: estimated (then measured) kernel time in seconds; infinite (the pool) when
            there is no cost rule and the kernel has not been timed yet.
        runs: how many times a kernel with this signature was timed.
        inline: the op's declared placement: True (always inline when ready), False (always
            on the pool) or None (decided by ``seconds``).
        best: the best kernel time measured on the pool (0 until measured).
        gil: the estimated fraction of the kernel that holds the GIL (0 for GIL-free BLAS,
            1 for a pure Python loop), from the last overlapped pool runs (``overlaps``).
        serial: the kernel is GIL-bound: the pool runs such kernels one at a time.
        cpu_share: the share of its wall time a kernel's thread was on a CPU in its recent
            overlapped pool runs (running average; 1 until measured): near 1 for a kernel
            that releases the GIL, about 1 / (1 + o) for one that holds it beside o others.
        runner: the task runs other nodes' kernels (a plan's runner, ``graph._lean``): not
            measured for the GIL lane (its overlap says nothing) and not recorded as a span
            (its nodes are).
        op: the declared op (``dataflow.Op``), or None for forked functions.
        measure: its pool runs are measured for the GIL lane (``gil``, ``serial``). False for a
            forked plain function: each fork has a signature of its own, so what its one run
            measured would be thrown away, and the measurement costs a worker two system
            calls and more Python than a small function's run.
    """

    __slots__ = (
        "awaited",
        "best",
        "calls",
        "check",
        "cost",
        "cpu_share",
        "folds",
        "gil",
        "inline",
        "intraop",
        "keys",
        "light",
        "measure",
        "name",
        "op",
        "overlaps",
        "rid",
        "runner",
        "runs",
        "seconds",
        "serial",
        "spec",
    )

    def __init__(
        self,
        name: str,
        spec: Any = None,
        cost: Cost | None = None,
        inline: bool | None = None,
        op: Any = None,
    ) -> None:
        self.name = name
        self.spec = spec
        self.cost = cost
        self.inline = inline
        self.op = op
        # No cost rule: unknown, so the pool until a kernel has been timed.
        self.seconds = estimate_seconds(cost) if cost is not None else float("inf")
        self.runs = 0
        self.calls = 0
        # Its tasks in a row that the event loop ran itself on awaiting them (reset when a
        # worker runs one): the program awaits this op at once (see _scheduler).
        self.awaited = 0
        # The best kernel time of pool runs, the last overlapped runs as (seconds, kernels
        # overlapping on average, GIL fraction by the cores the process used or 0), and the
        # GIL fraction they give (see _scheduler, "the GIL lane").
        self.best = 0.0
        self.overlaps: list[tuple[float, float, float]] = []
        self.gil = 0.0
        self.serial = False
        self.cpu_share = 1.0
        self.runner = False
        self.measure = True
        # The op's kernel calls BLAS (``Op.intraop``), so it counts toward a crowd for the
        # adaptive intra-op count however short it is (``_blas``). (getattr: a graph's fused
        # op is not an Op.)
        self.intraop = op is not None and getattr(op, "intraop", False) is True
        # The op reduces a pending stack as a fold of its binary op (``_fold``).
        self.folds = op is not None and getattr(op, "stack_fold", None) is not None
        # check(spec, value) -> error message | None (the op's; see dataflow.op).
        self.check: Callable[[Any, Any], str | None] | None = getattr(op, "check", None)
        # Each output spec as a small int (equal specs, equal ints): what a handle on this
        # task's output puts in the signature key of the ops it is passed to.
        self.keys = spec_keys(spec)
        # The int that names it in span records (0 until first recorded: ``_record``).
        self.rid = 0
        # The done task shared by the handles of its calls that ran at dispatch while
        # nothing observed (their values are in the handles: see Pending). Made on first use.
        self.light: Task | None = None

    def check_value(self, value: Any) -> None:
        """Raise OpOutputError when a kernel's value does not match the declared spec(s)."""
        check = self.check
        if check is None:
            return
        spec = self.spec
        if type(spec) is tuple:
            if type(value) not in (tuple, list) or len(value) != len(spec):
                raise OpOutputError(
                    f"op {self.name!r}: the kernel returned {type(value).__name__}, but the "
                    f"meta rule declared a tuple of {len(spec)} outputs"
                )
            for i, s in enumerate(spec):  # (not zip: this runs at every multi-output call)
                problem = check(s, value[i])
                if problem is not None:
                    raise OpOutputError(f"op {self.name!r}: output {i}: {problem}")
            return
        problem = check(spec, value)
        if problem is not None:
            raise OpOutputError(f"op {self.name!r}: {problem}")

    def __repr__(self) -> str:
        return f"<Signature {self.name} {self.spec!r} ~{self.seconds * 1e6:.1f}us runs={self.runs}>"
