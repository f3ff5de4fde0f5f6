"""``Module``: the base of models, with an async forward, parameters and state dicts.

Parameters and submodules are found the way torch finds them, by attribute, but without any
registration: a module's *parameters* are its public attributes holding numpy arrays, and its
*children* are its public attributes holding a :class:`Module`, or a list, tuple or dict of
them (named ``models.0``, ``heads.key``). Everything is read lazily from ``vars(self)``, in
assignment order, so a subclass need not call ``super().__init__()``, and a parameter replaced
by assignment (or by :meth:`Module.load_state_dict`) is what the next forward reads.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from types import CoroutineType
from typing import Any, NamedTuple

import numpy as np

import dataflow
from dataflow import DataflowError

__all__ = [
    "IncompatibleKeys",
    "Module",
    "StateDictError",
    "check_flag",
    "check_positive",
    "float_dtype",
    "make_rng",
    "uniform",
]


class StateDictError(DataflowError, ValueError):
    """A state dict does not fit the module: keys missing or unexpected, or shapes/dtypes."""


class IncompatibleKeys(NamedTuple):
    """What :meth:`Module.load_state_dict` did not match (only non-empty with strict=False)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def make_rng(seed: int | None, rng: np.random.Generator | None, where: str) -> np.random.Generator:
    """The generator a module initialises its parameters from (``seed`` xor ``rng``)."""
    if seed is not None and rng is not None:
        raise dataflow.DataflowValueError(f"{where}: give seed or rng, not both")
    if rng is not None:
        if not isinstance(rng, np.random.Generator | np.random.RandomState):  # (both draw alike)
            raise dataflow.DataflowTypeError(
                f"{where}: rng must be a numpy.random.Generator, got {type(rng).__name__}: "
                f"{rng!r:.60} (make one with np.random.default_rng(seed), or pass seed=)"
            )
        return rng
    try:
        return np.random.default_rng(seed)
    except (TypeError, ValueError) as exc:  # numpy's: "SeedSequence expects int or ..."
        kind = (
            dataflow.DataflowTypeError
            if isinstance(exc, TypeError)
            else dataflow.DataflowValueError
        )
        raise kind(
            f"{where}: seed must be None or a non-negative int, got {type(seed).__name__}: "
            f"{seed!r:.60} ({exc})"
        ) from exc


def check_flag(where: str, name: str, value: Any) -> bool:
    """``value`` as a bool, or a DataflowTypeError naming the argument.

    Only a real bool (or numpy's) is accepted: ``bias='False'`` is a non-empty string, so
    truthiness would read it as True.
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise dataflow.DataflowTypeError(
        f"{where}: {name} must be True or False, got {type(value).__name__}: {value!r}"
    )


def check_positive(where: str, name: str, v: object) -> int:
    """``v`` as a positive int (a numpy integer too, as torch takes ``np.prod(shape)``), or a
    DataflowTypeError / DataflowValueError naming the argument."""
    if isinstance(v, bool) or not isinstance(v, int | np.integer):
        raise dataflow.DataflowTypeError(
            f"{where}: {name} must be a positive int, got {type(v).__name__}: {v!r}"
        )
    if v < 1:
        raise dataflow.DataflowValueError(f"{where}: {name} must be a positive int, got {v!r}")
    return int(v)


def float_dtype(where: str, dtype: Any) -> np.dtype[Any]:
    """``dtype`` as a floating numpy dtype, or a DataflowTypeError naming the argument.

    Parameters are drawn from U(-bound, bound) with bound < 1, so an integer dtype would
    silently make them all zero.
    """
    try:
        dt: np.dtype[Any] = np.dtype(dtype)
    except TypeError as exc:
        raise dataflow.DataflowTypeError(
            f"{where}: dtype {dtype!r} is not a numpy dtype ({exc}); use np.float32"
        ) from exc
    if dt.kind != "f":
        raise dataflow.DataflowTypeError(
            f"{where}: dtype must be a floating dtype (float16, float32 or float64), got "
            f"{dt}: parameters drawn from U(-1/sqrt(n), 1/sqrt(n)) would not survive it"
        )
    return dt


def uniform(
    rng: np.random.Generator, bound: float, shape: tuple[int, ...], dtype: np.dtype[Any]
) -> np.ndarray[Any, Any]:
    """U(-bound, bound) samples of ``dtype``, torch's default init for Linear and RNN weights."""
    out: np.ndarray[Any, Any] = rng.uniform(-bound, bound, size=shape).astype(dtype)
    return out


def _fmt(a: Any) -> str:
    return f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__


# How many times a load_state_dict replaced parameters (Module.parameter_version).
_loads = [0]


class Module:
    """Base class of models: ``async def forward``, parameters by attribute, state dicts.

    Subclasses assign numpy arrays (parameters) and modules (children) as attributes and define
    ``async def forward(self, ...)``; ``await module(x)`` calls it. Forward only dispatches ops,
    so it returns pending tensors quickly, and the runtime overlaps whatever is independent.

    Example:
        >>> class TwoLayer(ops.nn.Module):
        ...     def __init__(self):
        ...         self.fc1 = ops.nn.Linear(8, 16)
        ...         self.fc2 = ops.nn.Linear(16, 4)
        ...     async def forward(self, x):
        ...         return await self.fc2(ops.tanh(await self.fc1(x)))
        >>> sorted(TwoLayer().state_dict())
        ['fc1.bias', 'fc1.weight', 'fc2.bias', 'fc2.weight']
    """

    async def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Compute the module's output; subclasses define it (``async def``)."""
        raise NotImplementedError(
            f"{type(self).__name__} has no forward(): define `async def forward(self, ...)`"
        )

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run ``forward``: one ``await`` gives arrays, except inside another forward.

        At the top level (a script, a request handler) ``await model(x)`` gives the forward's
        outputs as numpy arrays. Inside a module's forward (model code) it gives them as
        pending tensors, at once, so the ops of every submodule overlap
        (:func:`dataflow.model_code`). ``await model.forward(x)`` always gives them pending.
        """
        with dataflow.model_code() as nested:
            result = self.forward(*args, **kwargs)
            # A plain `def forward` works too: await the coroutine or awaitable it returns,
            # but not a pending tensor or future, which it returns as an async forward would
            # (awaited here, it was computed then: the model lost its overlap and could not
            # be traced).
            if type(result) is CoroutineType or (
                not isinstance(result, dataflow.Future) and inspect.isawaitable(result)
            ):
                result = await result
        if nested:
            return result
        return await dataflow.materialize(result)

    # -- structure ------------------------------------------------------------------------

    def _own_parameters(self) -> Iterator[tuple[str, np.ndarray[Any, Any]]]:
        for name, value in vars(self).items():
            if not name.startswith("_") and isinstance(value, np.ndarray):
                yield name, value

    def _parameter_layout(self, name: str, value: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The array to store for parameter ``name`` (a hook: a module may lay a loaded
        parameter out in another memory order; values, shape and dtype must not change)."""
        return value

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """The direct submodules with their attribute names (``models.0`` for list items),
        each once (torch's: a submodule held by two attributes is listed under the first)."""
        seen: set[int] = set()
        for name, child in self._every_child():
            if id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def _every_child(self) -> Iterator[tuple[str, Module]]:
        """The direct submodules under every name that holds one (a shared one repeated)."""
        for name, value in vars(self).items():
            if name.startswith("_"):
                continue
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, list | tuple):
                for i, item in enumerate(value):
                    if isinstance(item, Module):
                        yield f"{name}.{i}", item
            elif isinstance(value, dict):
                for key, item in value.items():
                    if isinstance(item, Module):
                        yield f"{name}.{key}", item

    def children(self) -> Iterator[Module]:
        """The direct submodules."""
        for _, m in self.named_children():
            yield m

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module and every submodule, depth first, each once (``""`` names this one)."""
        seen: set[int] = set()
        stack: list[tuple[str, Module]] = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            kids = [(f"{name}.{k}" if name else k, m) for k, m in module.named_children()]
            stack.extend(reversed(kids))

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray[Any, Any]]]:
        """Every parameter with its dotted name (own ones first), each array once."""
        seen: set[int] = set()
        for mod_name, module in self.named_modules(prefix):
            for name, p in module._own_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self) -> Iterator[np.ndarray[Any, Any]]:
        """Every parameter array (each once)."""
        for _, p in self.named_parameters():
            yield p

    # -- state dicts ----------------------------------------------------------------------

    def _slots(self) -> dict[str, tuple[Module, str]]:
        """Dotted parameter name -> (owning module, attribute), for every name it has.

        Like torch's state dict, a submodule held under two names (``self.b = self.a``) has
        its parameters under both (``a.weight`` and ``b.weight``), so a torch model's state
        dict loads; a module that holds one of its ancestors is not entered again."""
        slots: dict[str, tuple[Module, str]] = {}
        stack: list[tuple[str, Module, frozenset[int]]] = [("", self, frozenset((id(self),)))]
        while stack:
            prefix, module, path = stack.pop()
            for name, _ in module._own_parameters():
                slots[prefix + name] = (module, name)
            kids = [
                (f"{prefix}{name}.", child, path | {id(child)})
                for name, child in module._every_child()
                if id(child) not in path
            ]
            stack.extend(reversed(kids))
        return slots

    def state_dict(self) -> dict[str, np.ndarray[Any, Any]]:
        """A copy of every parameter, by dotted name (torch's names for torch-like modules).

        The arrays are copies, so the dict is a snapshot: changing it does not change the model.
        """
        return {k: getattr(m, a).copy() for k, (m, a) in self._slots().items()}

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True
    ) -> IncompatibleKeys:
        """Replace parameters with copies of the arrays in ``state_dict``.

        A torch model's weights load directly once converted to numpy:
        ``model.load_state_dict({k: v.detach().numpy() for k, v in torch_model.state_dict()
        .items()})``. Nothing is changed unless everything fits. Forward calls already
        dispatched keep the arrays they were given.

        Args:
            state_dict: dotted name -> numpy array (anything ``np.asarray`` accepts).
            strict: missing and unexpected keys are errors (with False they are returned).

        Returns:
            The missing and unexpected keys.

        Raises:
            StateDictError: with every problem listed: missing or unexpected keys (strict),
                a shape or dtype that differs from the parameter's.
            DataflowTypeError: ``state_dict`` is not a mapping, or ``strict`` not a bool.
        """
        if not isinstance(state_dict, Mapping):
            raise dataflow.DataflowTypeError(
                f"{type(self).__name__}.load_state_dict: state_dict must be a mapping of "
                f"parameter names to arrays (as state_dict() returns), got "
                f"{type(state_dict).__name__}"
            )
        strict = check_flag(f"{type(self).__name__}.load_state_dict", "strict", strict)
        slots = self._slots()
        missing = [k for k in slots if k not in state_dict]
        unexpected = [k for k in state_dict if k not in slots]
        problems: list[str] = []
        if strict and missing:
            problems.append(f"missing keys: {', '.join(missing)}")
        if strict and unexpected:
            problems.append(f"unexpected keys: {', '.join(map(str, unexpected))}")
        # Every slot that holds each array (tied parameters: two names for one array).
        holders: dict[int, list[tuple[Module, str]]] = {}
        for module, attr in slots.values():
            found = holders.setdefault(id(getattr(module, attr)), [])
            if not any(m is module and a == attr for m, a in found):
                found.append((module, attr))
        loaded: dict[int, np.ndarray[Any, Any]] = {}  # id(current array) -> its replacement
        for key, (module, attr) in slots.items():
            if key not in state_dict:
                continue
            current = getattr(module, attr)
            value = state_dict[key]
            if not isinstance(value, np.ndarray):
                try:
                    value = np.asarray(value)
                except Exception as exc:
                    problems.append(
                        f"{key}: cannot convert {type(value).__name__} to a numpy array "
                        f"({type(exc).__name__}: {exc}); for torch tensors use "
                        ".detach().numpy()"
                    )
                    continue
            if value.shape != current.shape or value.dtype != current.dtype:
                problems.append(
                    f"{key}: the model has {_fmt(current)}, the state dict has {_fmt(value)}"
                )
                continue
            if id(current) in loaded:  # a tied parameter's other name: the later wins, as torch
                np.copyto(loaded[id(current)], value)
                continue
            copy = np.array(value, order="C", copy=True)
            loaded[id(current)] = module._parameter_layout(attr, copy)
        if problems:
            hint = " (pass strict=False to ignore missing and unexpected keys)" if strict else ""
            raise StateDictError(
                f"error(s) loading the state dict into {type(self).__name__}{hint}:\n  "
                + "\n  ".join(problems)
            )
        # One new array for every name of a tied parameter (loaded under any of them), so
        # they stay tied, as torch's in-place load keeps them.
        for old, new in loaded.items():
            for module, attr in holders[old]:
                setattr(module, attr, new)
        if loaded:
            _loads[0] += 1  # (parameter_version: compiled forwards look for replaced arrays)
        return IncompatibleKeys(missing, [str(k) for k in unexpected])

    @property
    def parameter_version(self) -> int:
        """Changes whenever ``load_state_dict`` replaces parameters (of any module: a cheap
        check, not a per-module count). ``dataflow.compile`` reads it at each call and, when
        it changed, traces again the plans that read a replaced array."""
        return _loads[0]

    # -- repr -----------------------------------------------------------------------------

    def extra_repr(self) -> str:
        """The text between the parentheses of this module's repr (subclasses override)."""
        return ""

    def __repr__(self) -> str:
        lines = []
        for name, child in self._every_child():  # (torch's repr shows a shared one twice)
            text = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {text}")
        extra = self.extra_repr()
        if not lines:
            return f"{type(self).__name__}({extra})"
        head = f"{type(self).__name__}({extra}" if extra else f"{type(self).__name__}("
        return head + "\n" + "\n".join(lines) + "\n)"
