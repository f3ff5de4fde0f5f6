"""``ops.Tensor``: the pending numpy array, and ``TensorSpec``, its shape and dtype.

A Tensor is a :class:`dataflow.Pending` handle whose shape and dtype are known at once (from
the op's meta rule), before the kernel has run. ``await t`` gives the ``np.ndarray``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, ParamSpec

import numpy as np

import dataflow
from dataflow import Cost, Pending, Task

__all__ = [
    "Tensor",
    "TensorSpec",
    "check_value",
    "declare",
    "declare_multi",
    "define",
    "define_multi",
    "spec_of",
]

P = ParamSpec("P")


class TensorSpec(NamedTuple):
    """An array's shape and dtype, as a meta rule returns them."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    def __repr__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


class Tensor(Pending[np.ndarray]):
    """A pending numpy array: ``shape``, ``dtype`` and ``ndim`` now, the value when awaited.

    Arithmetic operators, comparisons, ``@``, indexing and ``.T`` build more ops; numpy arrays
    and Python scalars mix in on either side (``1 - t``, ``ndarray @ t``), and numpy's ufuncs
    and array functions that have an op return Tensors (``np.exp(t)``, ``np.stack([t, a])``).
    Nothing here ever blocks: ``np.asarray(t)`` on a pending Tensor raises NotReadyError.
    Because ``==`` builds an op, Tensors hash by identity.

    Example:
        >>> async def main(x, w):
        ...     h = ops.asarray(x) @ w.T          # pending Tensor, shape known now
        ...     return await (1 - h).sum(axis=0)  # the np.ndarray
    """

    __slots__ = ("dtype", "shape")

    # Make numpy defer to our reflected operators and __array_ufunc__ (ndarray @ t -> Tensor).
    __array_priority__ = 1000

    @staticmethod
    def check_value(spec: TensorSpec, value: Any) -> str | None:
        """What is wrong with a kernel's value for a Tensor of ``spec`` (see :func:`check_value`).

        ``dataflow.op(..., handle=ops.Tensor)`` checks every kernel's value with it.
        """
        return check_value(spec, value)

    def __init__(self, task: Task, index: int | None, spec: TensorSpec) -> None:
        # Pending's fields set here directly: a handle is made per op call (the hot path).
        self._t = task
        self._index = index
        self.shape: tuple[int, ...] = spec[0]
        self.dtype: np.dtype[Any] = spec[1]

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def spec(self) -> TensorSpec:
        """Shape and dtype together."""
        return TensorSpec(self.shape, self.dtype)

    def __len__(self) -> int:
        if not self.shape:
            raise dataflow.DataflowTypeError("len() of a 0-d tensor (shape ()): it has no axis 0")
        return self.shape[0]

    def __repr__(self) -> str:
        task = self._task
        state = ("pending", "ready", "running", "done", "failed", "cancelled")[task.state]
        return f"<Tensor {task.name} {self.dtype}{list(self.shape)} {state}>"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if not self.done():
            raise dataflow.NotReadyError(
                f"np.asarray() on pending {self!r} would block: write `await t` (or "
                "`await dataflow.wait(t)`) to get its array"
            )
        # numpy's protocol (NumPy 2): ``copy=True`` asks for a copy (``np.array(t)``), False
        # for none (an error where one is needed), None for one only where needed. Handing out
        # the value itself to ``np.array`` let writes to the "copy" change the Tensor's value.
        # A 0-d op's value may be a numpy scalar: numpy wants an array here.
        value = np.asarray(self.result())
        if dtype is not None and value.dtype != np.dtype(dtype):
            if copy is False:
                raise dataflow.DataflowValueError(  # (a ValueError, as numpy's protocol asks)
                    f"np.asarray({self!r}, dtype={np.dtype(dtype)}, copy=False): converting "
                    f"its {value.dtype} values to {np.dtype(dtype)} needs a copy"
                )
            return value.astype(dtype)
        return value.copy() if copy else value

    def _scalar(self, kind: str) -> np.ndarray:
        # float(t), int(t), complex(t): as numpy converts a done value (0-d only); numpy also
        # calls these on the 0-d array-likes in a list it converts (``ops.add([s, s], 1)``).
        if not self.done():
            raise dataflow.NotReadyError(
                f"{kind}() on pending {self!r} would block: write `await t` (or "
                "`await dataflow.wait(t)`) to get its value"
            )
        return np.asarray(self.result())

    def __float__(self) -> float:
        return float(self._scalar("float"))

    def __int__(self) -> int:
        return int(self._scalar("int"))

    def __complex__(self) -> complex:
        return complex(self._scalar("complex"))

    def __bool__(self) -> bool:
        raise dataflow.DataflowTypeError(
            f"the truth value of {self!r} is not known yet: `await` it first "
            "(Python control flow cannot depend on a pending value)"
        )

    def __iter__(self) -> Iterator[Tensor]:
        # Without this, Python would iterate through __getitem__ until an IndexError.
        for i in range(len(self)):
            yield self[i]

    # -- operators: each builds one op; unknown operand types give NotImplemented -------------

    def __add__(self, other: Any) -> Tensor:
        return _binary(_elementwise.add, self, other)

    def __radd__(self, other: Any) -> Tensor:
        return _binary(_elementwise.add, other, self)

    def __sub__(self, other: Any) -> Tensor:
        return _binary(_elementwise.subtract, self, other)

    def __rsub__(self, other: Any) -> Tensor:
        return _binary(_elementwise.subtract, other, self)

    def __mul__(self, other: Any) -> Tensor:
        return _binary(_elementwise.multiply, self, other)

    def __rmul__(self, other: Any) -> Tensor:
        return _binary(_elementwise.multiply, other, self)

    def __truediv__(self, other: Any) -> Tensor:
        return _binary(_elementwise.divide, self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return _binary(_elementwise.divide, other, self)

    def __pow__(self, other: Any) -> Tensor:
        return _binary(_elementwise.power, self, other)

    def __rpow__(self, other: Any) -> Tensor:
        return _binary(_elementwise.power, other, self)

    def __matmul__(self, other: Any) -> Tensor:
        return _binary(_linalg.matmul, self, other)

    def __rmatmul__(self, other: Any) -> Tensor:
        return _binary(_linalg.matmul, other, self)

    def __neg__(self) -> Tensor:
        out: Tensor = _elementwise.negative(self)
        return out

    def __pos__(self) -> Tensor:
        return self

    def __lt__(self, other: Any) -> Tensor:
        return _binary(_elementwise.less, self, other)

    def __le__(self, other: Any) -> Tensor:
        return _binary(_elementwise.less_equal, self, other)

    def __gt__(self, other: Any) -> Tensor:
        return _binary(_elementwise.greater, self, other)

    def __ge__(self, other: Any) -> Tensor:
        return _binary(_elementwise.greater_equal, self, other)

    def __eq__(self, other: object) -> Tensor:  # type: ignore[override]
        return _binary(_elementwise.equal, self, other)

    def __ne__(self, other: object) -> Tensor:  # type: ignore[override]
        return _binary(_elementwise.not_equal, self, other)

    # __eq__ builds an op, so identity is what hashing (dict keys, sets) goes by.
    __hash__ = object.__hash__

    def __getitem__(self, key: Any) -> Tensor:
        return _indexing.getitem(self, key)

    # -- convenience methods (numpy's names; each is the op of the same name) ---------------

    @property
    def T(self) -> Tensor:
        """The transpose (axes reversed)."""
        out: Tensor = _shape.transpose(self)
        return out

    def reshape(self, *shape: Any) -> Tensor:
        """``t.reshape(2, -1)`` or ``t.reshape((2, -1))``, like ``ndarray.reshape``."""
        new = shape[0] if len(shape) == 1 else shape
        out: Tensor = _shape.reshape(self, new)
        return out

    def transpose(self, *axes: Any) -> Tensor:
        """``t.transpose(1, 0)`` or ``t.transpose((1, 0))``; no axes reverses them."""
        perm = None if not axes else axes[0] if len(axes) == 1 else axes
        out: Tensor = _shape.transpose(self, perm)
        return out

    def astype(self, dtype: Any) -> Tensor:
        """This tensor converted to ``dtype`` (itself when the dtype is already that)."""
        return _shape.asarray(self, dtype)

    def sum(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """See :func:`ops.sum`."""
        out: Tensor = _reduce.sum(self, axis, keepdims)
        return out

    def mean(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """See :func:`ops.mean`."""
        out: Tensor = _reduce.mean(self, axis, keepdims)
        return out

    def var(self, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Tensor:
        """See :func:`ops.var`."""
        out: Tensor = _reduce.var(self, axis, keepdims, ddof)
        return out

    def max(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """See :func:`ops.max`."""
        out: Tensor = _reduce.max(self, axis, keepdims)
        return out

    def min(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """See :func:`ops.min`."""
        out: Tensor = _reduce.min(self, axis, keepdims)
        return out

    def clip(self, min: Any = None, max: Any = None) -> Tensor:
        """See :func:`ops.clip` (``t.clip(0, 1)``, ``t.clip(max=6)``)."""
        out: Tensor = _elementwise.clip(self, min, max)
        return out

    def argmax(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """See :func:`ops.argmax`."""
        out: Tensor = _reduce.argmax(self, axis, keepdims)
        return out

    def argmin(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """See :func:`ops.argmin`."""
        out: Tensor = _reduce.argmin(self, axis, keepdims)
        return out

    def __abs__(self) -> Tensor:
        out: Tensor = _elementwise.abs(self)
        return out

    # -- numpy interop: np.add(a, t), ndarray @ t, np.exp(t), np.concatenate([t, a]) ... -----

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """Route numpy ufunc calls that involve a Tensor to the ops (a pending Tensor back).

        A plain call of a ufunc that has an op (``np.sin(t)``, ``ndarray + t``) is that op.
        Keywords at numpy's defaults are accepted; ``out=``, ``where=``, ``dtype=``, ufunc
        methods (``np.add.reduce``) and ufuncs without an op raise an OpTypeError that says
        what to do instead. Nothing here waits for a pending value.
        """
        if method == "__call__" and not kwargs:
            op = _interop.UFUNCS.get(ufunc)
            if op is not None:
                return op(*inputs)
        return _interop.ufunc_fallback(ufunc, method, inputs, kwargs)

    def __array_function__(
        self, func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Route ``np.concatenate``, ``np.sum``, ``np.clip``, ``np.argmax`` ... to the ops.

        A function with no op raises an OpTypeError saying so; one whose arguments include a
        foreign array type (neither a Tensor nor an ndarray) is left to that type.
        """
        for t in types:
            if not issubclass(t, (Tensor, np.ndarray)):
                return NotImplemented
        impl = _interop.FUNCTIONS.get(func)
        if impl is None:
            _interop.function_fallback(func)
        return impl(*args, **kwargs)


def spec_of(x: Any) -> TensorSpec:
    """The spec of a Tensor or an array-like (scalars and lists are converted).

    ndarray subclasses (masked arrays, ``np.matrix`` ...) are refused with an OpTypeError,
    as every op refuses them (docs/ops.md, "ndarray subclasses").
    """
    if isinstance(x, Tensor):
        return TensorSpec(x.shape, x.dtype)
    if type(x) is np.ndarray:
        return TensorSpec(x.shape, x.dtype)
    if isinstance(x, np.ndarray):
        _checks.refuse_subclass("", "an argument", x)
    a = np.asarray(x)
    return TensorSpec(a.shape, a.dtype)


def check_value(spec: TensorSpec, value: Any) -> str | None:
    """What is wrong with a kernel's ``value`` for a Tensor of ``spec`` (None: nothing).

    The value must be an ndarray (or a numpy scalar, for a 0-d spec) of exactly the declared
    shape and dtype: a kernel that returns anything else would make ``Tensor.shape`` and
    ``dtype`` lie to every op downstream.
    """
    if type(value) is np.ndarray or isinstance(value, np.generic):
        if value.shape == spec.shape and value.dtype == spec.dtype:
            return None
        return (
            f"the kernel returned {value.dtype}{list(value.shape)}, but the meta rule declared "
            f"{spec!r}"
        )
    return (
        f"the kernel returned {type(value).__name__}, not a numpy array: the meta rule "
        f"declared {spec!r}"
    )


def define(
    name: str,
    kernel: Callable[..., Any],
    meta: Callable[P, Any],
    cost: Callable[..., Cost] | None = None,
    inline: bool | None = None,
) -> dataflow.Op[P, Tensor]:
    """Declare an op returning Tensors (``dataflow.op`` with ``handle=Tensor``).

    Its meta rule's specs are checked at the call (a dtype-like such as ``np.float32``
    becomes a ``np.dtype``; what is not a spec is refused: ``ops._specs``), and its
    kernel's values against them (:func:`check_value`).
    """
    from ._specs import checked_meta  # (imports this module)

    return _op(name, kernel, checked_meta(name, meta), cost, inline)


def _op(
    name: str,
    kernel: Callable[..., Any],
    meta: Callable[..., Any],
    cost: Callable[..., Cost] | None,
    inline: bool | None,
) -> dataflow.Op[Any, Any]:
    return dataflow.Op(name, kernel, meta, Tensor, cost, inline, check=check_value)


def declare(
    name: str,
    kernel: Callable[..., Any],
    meta: Callable[P, Any],
    cost: Callable[..., Cost] | None = None,
    inline: bool | None = None,
) -> dataflow.Op[P, Tensor]:
    """:func:`define` for the ops of this package: the meta rule also takes the op's name.

    Python names the function in its own argument errors, so ``ops.add(x)`` says
    ``add() missing 1 required positional argument: 'y'`` rather than ``meta() ...``. (Not
    done by :func:`define`: a user's function is not renamed behind their back.)
    """
    meta.__qualname__ = name
    return _op(name, kernel, meta, cost, inline)


def declare_multi(
    name: str,
    kernel: Callable[..., Any],
    meta: Callable[P, Any],
    cost: Callable[..., Cost] | None = None,
    inline: bool | None = None,
) -> dataflow.Op[P, Any]:
    """:func:`define_multi` for the ops of this package (see :func:`declare`)."""
    meta.__qualname__ = name
    return _op(name, kernel, meta, cost, inline)


def define_multi(
    name: str,
    kernel: Callable[..., Any],
    meta: Callable[P, Any],
    cost: Callable[..., Cost] | None = None,
    inline: bool | None = None,
) -> dataflow.Op[P, Any]:
    """Declare an op with several Tensor outputs: its meta rule returns a tuple of specs,
    and a call returns a tuple of Tensors (typed by the op's own wrapper function). The
    specs are checked as :func:`define` checks them."""
    return define(name, kernel, meta, cost, inline)


_OPERAND_TYPES = (Tensor, np.ndarray, np.generic, int, float, complex, list, tuple)


def _binary(op: dataflow.Op[..., Tensor], x: Any, y: Any) -> Tensor:
    """``op(x, y)`` for an operator; NotImplemented lets Python try the other operand."""
    if isinstance(x, _OPERAND_TYPES) and isinstance(y, _OPERAND_TYPES):
        out: Tensor = op(x, y)
        return out
    # NotImplemented is what binary dunders return to hand over to the other operand.
    unsupported: Tensor = NotImplemented
    return unsupported


# dataflow.trace hands a program a pending Tensor for each ndarray example input.
dataflow.set_array_handle(Tensor, spec_of)

# The op modules import this one (for Tensor and define); importing them at the end, once
# Tensor exists, breaks the cycle. The operators above look them up at call time.
from . import _checks, _elementwise, _indexing, _interop, _linalg, _reduce, _shape  # noqa: E402
