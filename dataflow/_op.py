"""The public op API: declare an op from a numpy kernel, a meta rule and a cost rule.

An op is three plain functions:

* the **kernel** computes the value from numpy arrays;
* the **meta rule** takes the call's arguments as given (pending handles included: they carry
  whatever the handle type knows, e.g. ``shape`` and ``dtype``) and returns the output's *spec*
  (for ``ops``: shape and dtype) or a tuple of specs for an op with several outputs, without
  running the kernel. It validates the inputs and raises (``OpInputError``, ``OpTypeError``) at
  the call site, in the caller's frame, naming the op and what was expected;
* the optional **cost rule** returns a :class:`~dataflow.Cost` (flops, bytes): the first
  estimate of the kernel's time, until the scheduler has timed it.

**Signatures.** Both rules run once per *argument signature*: for each argument, a pending
handle's producing signature and output index, an array's shape and dtype, a Python scalar's
type and value, containers (list, tuple, NamedTuple, dict) element by element. The result (a
:class:`~dataflow._signature.Signature`: spec, cost, measured kernel time) is cached on the op, so a
repeated call costs one dictionary lookup. A bad call is never cached: it raises again, from
the meta rule, every time. So a meta rule must depend only on its arguments' shapes, dtypes
and types and on the values of non-array arguments (never on array contents); arguments of
other types (and unhashable values) make the call uncacheable, and the rules run every time.

Calling the op returns handles at once, built by the ``handle`` factory from the task, the
output's index (None for a single output) and its spec. Outside a runtime an op runs eagerly on
the calling thread, so the same code also works as plain synchronous numpy. ``check(spec,
value)`` (by default the handle type's ``check_value``) verifies that a kernel's value matches
its declared spec (it returns an error message, or None); a mismatch fails the task with
:class:`~dataflow.OpOutputError` on every path: inline, pool, graph runs, Dask workers.

Example:
    >>> import numpy as np, dataflow
    >>> def softplus_meta(x): return ops.TensorSpec(x.shape, x.dtype)
    >>> softplus = dataflow.op("softplus", meta=softplus_meta, handle=ops.Tensor,
    ...                        cost=lambda x: dataflow.Cost(flops=4 * x.size))(
    ...     lambda x: np.log1p(np.exp(x)))
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

import numpy as np

from ._args import resolve
from ._errors import DataflowTypeError, DataflowValueError, NotReadyError, task_failed
from ._fold import fold_stack
from ._keys import scan_arguments
from ._lookup import _current, loop_runtime
from ._registry import declaring_module, register
from ._signature import Signature, spec_keys
from ._task import DONE, LIGHT, Cost, Pending, Task, checked_cost
from ._timeout import check_timeout
from ._walk import ATOMS as _ATOMS

__all__ = ["Op", "op"]

P = ParamSpec("P")
R = TypeVar("R")
H = TypeVar("H", bound=Pending[Any])

HandleFactory = Callable[[Task, "int | None", Any], H]

# Argument types whose (type, value) goes into a signature key as it is.
_ndarray = np.ndarray
_NO_RETURN = inspect.Signature.empty
# An op keeps at most this many signatures; past it the cache starts over.
_MAX_SIGNATURES = 4096


class Op(Generic[P, R]):
    """A declared op. Call it like the kernel; it returns pending handle(s) at once.

    ``intraop``: set it to True after declaring an op whose kernel calls BLAS (a GEMM, however
    small): with the intra-op count left unset, its kernels then count toward the crowd that
    gives BLAS one thread (``dataflow._blas``) however short they are. False by default.
    """

    __slots__ = (
        "__dict__",
        "__weakref__",
        "_outcomes",
        "_sigs",
        "check",
        "cost",
        "handle",
        "inline",
        "intraop",
        "kernel",
        "meta",
        "module",
        "name",
        "timeout",
    )

    def __init__(
        self,
        name: str,
        kernel: Callable[..., Any],
        meta: Callable[P, Any],
        handle: HandleFactory[Any],
        cost: Callable[..., Cost] | None = None,
        inline: bool | None = None,
        timeout: float | None = None,
        check: Callable[[Any, Any], str | None] | None = None,
    ) -> None:
        _check_name(name)
        for what, fn, optional in (
            ("kernel", kernel, False),
            ("meta", meta, False),
            ("handle", handle, False),
            ("cost", cost, True),
            ("check", check, True),
        ):
            if not (callable(fn) or (optional and fn is None)):
                none = " (or None)" if optional else ""
                raise DataflowTypeError(
                    f"op {name!r}: {what} must be a function{none}, got {type(fn).__name__}: {fn!r}"
                )
        if check is None:  # the handle type's own check, e.g. ops.Tensor.check_value
            check = getattr(handle, "check_value", None)
        if inline is not None and type(inline) is not bool:
            raise DataflowTypeError(
                f"op {name!r}: inline must be True, False or None, got "
                f"{type(inline).__name__}: {inline!r}"
            )
        self.timeout = check_timeout(timeout, f"op {name!r}: timeout")
        self.name = name
        self.kernel = kernel
        self.meta = meta
        self.cost = cost
        self.handle = handle
        self.inline = inline
        self.intraop = False
        self.check = check
        self._sigs: dict[Any, Signature] = {}
        self._outcomes: dict[Any, Signature] = {}
        self.__name__ = name
        self.__qualname__ = name
        self.__doc__ = kernel.__doc__
        with contextlib.suppress(TypeError, ValueError):  # (none: inspect reads __call__)
            # help(op), inspect.signature(op): how to call it, the meta rule's parameters
            self.__signature__ = inspect.signature(meta).replace(return_annotation=_NO_RETURN)
        # The module whose import declared the op: a saved graph names it, so `load` can
        # import it (when trusted) and find the op again under `module:name`.
        self.module = declaring_module()
        register(self)

    @property
    def qualname(self) -> str:
        """``module:name``, the op's name in the registry and in saved graphs."""
        return f"{self.module}:{self.name}"

    def __repr__(self) -> str:
        return f"<dataflow.Op {self.name}>"

    def signature(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Signature:
        """The signature of a call: the meta and cost rules run now.

        Calls with the same outcome (output specs and cost) share one Signature, so the
        kernel times measured for them add up even when the arguments could not be keyed.
        """
        meta: Callable[..., Any] = self.meta
        rule = self.cost
        if kwargs:
            spec = meta(*args, **kwargs)
            cost = rule(*args, **kwargs) if rule is not None else None
        else:  # (no empty dict to unpack: a call that misses the key cache pays this)
            spec = meta(*args)
            cost = rule(*args) if rule is not None else None
        if type(cost) is not Cost and rule is not None:
            cost = checked_cost(cost, self.name)
        keys = spec_keys(spec)
        if None in keys:
            return Signature(self.name, spec, cost, self.inline, self)
        # A known outcome is found before a Signature is built: calls that differ only in a
        # scalar's value (``op(x, i)`` in a loop) miss the key cache but pay no new record.
        outcome = (keys, cost)
        try:
            found = self._outcomes.get(outcome)
        except TypeError:  # a cost rule that returned something unhashable
            return Signature(self.name, spec, cost, self.inline, self)
        if found is not None:
            return found
        sig = Signature(self.name, spec, cost, self.inline, self)
        if len(self._outcomes) >= _MAX_SIGNATURES:
            self._outcomes.clear()
        self._outcomes[outcome] = sig
        return sig

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        # One pass over the arguments: the call's signature key, its pending inputs, whether
        # all of them are done, and the argument values for a kernel run right away. This is
        # the hot path of every op: positional arrays, scalars and handles, flat lists and
        # tuples of those, and keywords with plain values, are handled here; other
        # containers and types take ``_scan`` (``_keys.scan_arguments``).
        key: list[Any] | None
        inputs: list[Task]
        values: list[Any] | None
        keyed: list[Any] = []
        inputs = []
        got: list[Any] = []
        ready = True
        general = False
        for a in args:
            ta = type(a)
            if ta is _ndarray:
                keyed.append(a.shape)  # type: ignore[attr-defined]
                keyed.append(a.dtype)  # type: ignore[attr-defined]
                got.append(a)
            elif ta in _ATOMS:
                keyed.append(ta)
                keyed.append(a)
                got.append(a)
            elif isinstance(a, Pending):
                t = a._t
                i = a._index
                inputs.append(t)
                if t.state != DONE:
                    ready = False
                else:
                    v = t.value
                    if v is LIGHT:  # the value is in the handle (see Pending)
                        got.append(a._v)
                    else:
                        got.append(v if i is None else v[i])
                k = t.sig.keys[i or 0]
                if k is None:
                    general = True
                    break
                keyed.append(k)
            elif ta is list or ta is tuple:
                # A flat sequence of arrays, handles and scalars (``concatenate([a, b])``,
                # ``stack(outs)``): keyed as ``_keys.nested_key`` keys it, its values read here.
                # (The element cases repeat the argument cases above, inline on purpose: a
                # helper call per element would cost what this path saves.)
                sub: list[Any] = [ta]
                vals: list[Any] = []
                n_in = len(inputs)
                for v in a:  # type: ignore[attr-defined]
                    tv = type(v)
                    if tv is _ndarray:
                        sub.append(v.shape)
                        sub.append(v.dtype)
                        vals.append(v)
                    elif tv in _ATOMS:
                        sub.append(tv)
                        sub.append(v)
                        vals.append(v)
                    elif isinstance(v, Pending):
                        t = v._t
                        i = v._index
                        k = t.sig.keys[i or 0]
                        if k is None:
                            general = True
                            break
                        sub.append(k)
                        inputs.append(t)
                        if t.state != DONE:
                            ready = False
                        elif ready:
                            w = t.value
                            vals.append(v._v if w is LIGHT else w if i is None else w[i])
                    else:
                        general = True
                        break
                if general:
                    break
                keyed.append(tuple(sub))
                # (No handle in it: the caller's own object, as the general path passes it.)
                got.append(a if len(inputs) == n_in else vals if ta is list else tuple(vals))
            else:
                general = True
                break
        if kwargs and not general:
            # Keywords with plain values (axis=0, keepdims=True) keep the fast path: the
            # key gets what ``_scan`` would give them, so both paths share signatures.
            keyed.append(None)
            for name, a in kwargs.items():
                ta = type(a)
                if ta not in _ATOMS:
                    general = True
                    break
                keyed.append(name)
                keyed.append((list, ta, a))
        if general:  # a container, another type, an unkeyed input: the general scan
            key, inputs, values, ready = self._scan(args, kwargs)
        else:
            key, values = keyed, got
        if key is None:
            sig = self.signature(args, kwargs)
        else:
            full = tuple(key)
            try:
                found = self._sigs.get(full)
            except TypeError:  # an unhashable value in the key (an argument's own type)
                sig = self.signature(args, kwargs)
            else:
                if found is None:  # (no KeyError: raising one costs more than the lookup)
                    sig = self.signature(args, kwargs)
                    if len(self._sigs) >= _MAX_SIGNATURES:
                        self._sigs.clear()
                    self._sigs[full] = sig
                else:
                    sig = found
        rt = _current.get() or loop_runtime()
        if rt is None:
            out: Any = _run_eagerly(self, sig, args, kwargs)
        else:
            if not ready and sig.folds and rt.folds:  # a reduction of a pending stack
                folded = fold_stack(self, sig, args, kwargs)
                if folded is not None:
                    return folded  # type: ignore[no-any-return]
            timeout = self.timeout
            out = rt.dispatch(
                sig,
                self.kernel,
                args,
                kwargs or None,
                tuple(inputs),
                ready,
                None,
                timeout if timeout is not None else rt.op_timeout,
                values if ready else None,
                type(sig.spec) is not tuple,
            )
        spec = sig.spec
        if type(out) is tuple:  # it ran now, unobserved: a light handle (see Pending)
            light = sig.light
            if light is None:
                light = sig.light = Task.done(sig, LIGHT, None)
            handle = self.handle(light, None, spec)
            try:
                handle._v = out[0]
            except AttributeError:  # not a Pending (a factory of its own): a task of its own
                handle = self.handle(Task.done(sig, out[0], rt), None, spec)
            return handle  # type: ignore[no-any-return]
        if type(out) is list:  # it ran now, and a profile recorded it: light, with its id
            # (apart from the branch above, so that the unobserved path tests nothing more)
            light = sig.light
            if light is None:
                light = sig.light = Task.done(sig, LIGHT, None)
            handle = self.handle(light, None, spec)
            try:
                handle._v = out[0]
                handle._id = out[1]
            except AttributeError:  # not a Pending (a factory of its own): a task of its own
                own = Task.done(sig, out[0], rt)
                own.id = out[1]
                handle = self.handle(own, None, spec)
            return handle  # type: ignore[no-any-return]
        task: Task = out
        if type(spec) is tuple:
            make = self.handle
            handles = tuple([make(task, i, s) for i, s in enumerate(spec)])
            if task.state < DONE:
                task.handles = list(handles)  # (not the tuple returned: the caller's own)
            return handles  # type: ignore[return-value]
        handle = self.handle(task, None, spec)
        if task.state < DONE:
            # Deferred: whether someone else still holds the handle decides its fate if its
            # request is cancelled. Held strongly until the task ends, so that is a count of
            # references (``_requests.handles_held``), not a weak reference to collect.
            task.handles = handle
        return handle  # type: ignore[no-any-return]

    # ``__call__``'s general pass over its arguments (``_keys``); an attribute, so a test
    # can count the calls that take it.
    _scan = staticmethod(scan_arguments)


def _check_name(name: object) -> None:
    """An op's name: a non-empty str (DataflowTypeError for another type, DataflowValueError
    for the empty string)."""
    if not isinstance(name, str):
        raise DataflowTypeError(
            f"dataflow.op(name): the op's name must be a non-empty str, got "
            f"{type(name).__name__}: {name!r}"
        )
    if not name:
        raise DataflowValueError("dataflow.op(name): the op's name must be a non-empty str, got ''")


def _run_eagerly(
    op: Op[..., Any], sig: Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Task:
    """Outside a runtime: run the kernel now, on this thread, raising its error here."""
    task = Task(sig, op.kernel, args, kwargs or None, None)
    try:
        value = op.kernel(*resolve(args), **{k: resolve((v,))[0] for k, v in kwargs.items()})
        if sig.check is not None:
            sig.check_value(value)
    except NotReadyError:
        raise
    except Exception as exc:
        raise task_failed(task.name, op.name, exc) from exc
    task.value = value
    task.state = DONE
    task.fn = task.args = task.kwargs = None
    return task


def op(
    name: str,
    *,
    meta: Callable[P, Any],
    handle: HandleFactory[H],
    cost: Callable[..., Cost] | None = None,
    inline: bool | None = None,
    timeout: float | None = None,
    check: Callable[[Any, Any], str | None] | None = None,
) -> Callable[[Callable[..., Any]], Op[P, H]]:
    """Declare an op from a numpy kernel (decorator).

    Args:
        name: the op's name, used in errors, traces and the profiler's table.
        meta: ``meta(*args, **kwargs) -> spec | tuple[spec, ...]``; validates and raises.
        handle: ``handle(task, index, spec) -> Pending`` builds the returned handle(s).
        cost: ``cost(*args, **kwargs) -> Cost``: the kernel time's first estimate; without
            it the op goes to the pool until its kernel has been timed.
        inline: force inline (True) or pool (False) execution instead of deciding by time.
        timeout: seconds the kernel may run in a runtime before its task (and every task
            depending on it) fails with :class:`~dataflow.OpTimeoutError`; overrides the
            runtime's ``op_timeout``. A timed op never runs inline on the event loop. The
            kernel itself cannot be interrupted: it runs on, its result is discarded
            (docs/hardening.md). Outside a runtime (eager mode) the timeout does not apply.
        check: ``check(spec, value) -> str | None``: an error message when the kernel's value
            does not match the declared spec; default: the handle type's ``check_value``, if
            it has one (``ops.Tensor``'s compares shape and dtype).

    Example:
        >>> @dataflow.op("scale", meta=lambda x, k: ops.TensorSpec(x.shape, x.dtype),
        ...              handle=ops.Tensor, cost=lambda x, k: dataflow.Cost(x.size, 8 * x.size))
        ... def scale(x, k):
        ...     return x * k
    """
    _check_name(name)
    checked = check_timeout(timeout, f"op {name!r}: timeout")

    def decorate(kernel: Callable[..., Any]) -> Op[P, H]:
        if not callable(kernel):
            raise DataflowTypeError(
                f"dataflow.op({name!r}) decorates the kernel function, got "
                f"{type(kernel).__name__}: {kernel!r}"
            )
        return Op(name, kernel, meta, handle, cost, inline, checked, check)

    return decorate
