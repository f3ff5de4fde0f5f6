"""Decoding a graph file's values, and the one place its names are resolved (or refused).

``_read`` reads the document; every value in it (arguments, outputs, types, dtypes, op and
NamedTuple names) becomes a Python value here, in :class:`Decoder`. A name is the only way a
file could reach code, so the checks that keep loading from running any are all in this module,
apart from the reading itself:

Loading never unpickles (an array of Python objects is refused by its ``.npy`` header, unread)
and never runs code a file names. Ops are looked up in this process's op registry
(:func:`dataflow.Op` records every op by ``module:name``); a module that is not imported yet is
imported only when the caller trusts it (``trust=["ops"]`` trusts ``ops`` and its
submodules). A NamedTuple class is built only from an allow-list: classes defined by dataflow
itself, by a package that declared one of the registered ops (``ops``, ``ops._tensor``), or by a
trusted module. It is
found in that module's own namespace (``vars``, never ``getattr``, so no module-level
``__getattr__`` runs and nothing is imported along the way), and must be a NamedTuple class
defined in that module; any other name (``platform:uname_result``, ``numpy:testing.X``) is
refused before anything is imported or built.

Read for inspection (``read``), nothing is looked up at all: an op is an ``UnresolvedOp`` and a
NamedTuple an :class:`Opaque`.
"""

from __future__ import annotations

import importlib
import math
import sys
import types
from typing import Any

import numpy as np

from .._registry import declaring_modules, lookup_op
from ._archive import MAX_NBYTES, MAX_NDIM, Problem
from ._format import _PYTHON_TYPES
from ._fused import Arg, Tmp
from ._ir import (
    ConstRef,
    InputRef,
    NodeRef,
    OpLike,
    UnresolvedOp,
    ValueType,
)

__all__ = ["Decoder", "Opaque"]


# -- reading ----------------------------------------------------------------------------------


class Opaque:
    """A NamedTuple value from a file read for inspection (its class is not looked up)."""

    __slots__ = ("fields", "qualname")

    def __init__(self, qualname: str, fields: list[Any]) -> None:
        self.qualname = qualname
        self.fields = fields

    def __repr__(self) -> str:
        return f"{self.qualname.rpartition(':')[2]}({', '.join(map(repr, self.fields))})"


def _qualname(qualname: Any) -> bool:
    """Whether ``qualname`` is a ``module:name`` (a dotted module, a printable name: a file
    read for inspection prints it as it is)."""
    if not isinstance(qualname, str) or ":" not in qualname or not qualname.isprintable():
        return False
    module = qualname.partition(":")[0]
    return all(part.isidentifier() for part in module.split("."))


def _trusted(module: str, trust: tuple[str, ...]) -> bool:
    return any(module == t or module.startswith(t + ".") for t in trust)


def _import(module: str, what: str, trust: tuple[str, ...]) -> Any:
    """The module, imported only if it already is, is dataflow's own, or is trusted."""
    found = sys.modules.get(module)
    if found is not None:
        return found
    if not (_trusted(module, trust) or _trusted(module, ("dataflow",))):
        raise Problem(
            f"{what} needs module {module!r}, which is not imported and not trusted: import "
            f"it first, or pass trust=[{module.split('.')[0]!r}] to dataflow.load "
            f"(--trust {module.split('.')[0]} on the command line) if you trust it"
        )
    try:
        return importlib.import_module(module)
    except Exception as exc:
        raise Problem(f"{what}: importing {module!r} failed: {type(exc).__name__}: {exc}") from exc


class Decoder:
    """Turns graph.json values back into Python values (resolving names when asked to)."""

    def __init__(self, resolve: bool, trust: tuple[str, ...]) -> None:
        self.resolve = resolve
        self.trust = trust

    def op(self, qualname: Any, where: str) -> OpLike:
        if not _qualname(qualname):
            raise Problem(f"{where}: op must be a 'module:name' string, got {qualname!r:.80}")
        if not self.resolve:
            return UnresolvedOp(qualname)
        found = lookup_op(qualname)
        if found is None:
            module = qualname.rpartition(":")[0]
            _import(module, f"{where}: op {qualname}", self.trust)
            found = lookup_op(qualname)
        if found is None:
            raise Problem(
                f"{where}: unknown op {qualname}: module {qualname.rpartition(':')[0]} "
                "declares no op of that name"
            )
        return found

    def named_tuple(self, qualname: Any, fields: list[Any], where: str) -> Any:
        if not _qualname(qualname):
            raise Problem(f"{where}: bad namedtuple name {qualname!r:.80}")
        if not self.resolve:
            return Opaque(qualname, fields)
        module_name, _, path = qualname.partition(":")
        allowed = (
            _trusted(module_name, self.trust)
            or _trusted(module_name, ("dataflow",))
            or _trusted(module_name, tuple({m.split(".")[0] for m in declaring_modules()}))
        )
        if not allowed:
            root = module_name.split(".")[0]
            raise Problem(
                f"{where}: NamedTuple {qualname} is not allowed: a graph file may only build "
                "NamedTuples defined by dataflow, by a module that declares ops, or by a "
                f"trusted module; pass trust=[{root!r}] to dataflow.load (--trust {root}) "
                "if you trust it"
            )
        obj: Any = _import(module_name, f"{where}: {qualname}", self.trust)
        # vars(), not getattr(): a module's __getattr__ (numpy's lazy submodules) must not run.
        for part in path.split("."):
            space = vars(obj) if isinstance(obj, (types.ModuleType, type)) else {}
            obj = space.get(part)
        if not (
            isinstance(obj, type)
            and issubclass(obj, tuple)
            and hasattr(obj, "_fields")
            and obj.__module__ == module_name
        ):
            raise Problem(f"{where}: {qualname} is not a NamedTuple class of module {module_name}")
        try:
            return obj(*fields)
        except Exception as exc:  # its own constructor checks fields: dataflow.Cost(-1.0, 0.0)
            raise Problem(f"{where}: {qualname}{tuple(fields)!r}: {exc}") from exc

    def value(self, v: Any, where: str) -> Any:
        if v is None or type(v) in (bool, int, float, str):
            return v
        if type(v) is list:
            return [self.value(x, where) for x in v]
        if type(v) is not dict or not v:
            raise Problem(f"{where}: unexpected value {v!r:.80}")
        keys = set(v)
        if keys == {"node"}:
            return NodeRef(self._int(v["node"], where))
        if keys == {"node", "out"}:
            return NodeRef(self._int(v["node"], where), self._int(v["out"], where))
        if keys == {"input"}:
            return InputRef(self._int(v["input"], where))
        if keys == {"const"} and isinstance(v["const"], str):
            return ConstRef(v["const"])
        if keys == {"arg"} or keys == {"tmp"}:
            raise Problem(f"{where}: {v!r:.40} may only be an argument of a fused step")
        if keys == {"tuple"} and type(v["tuple"]) is list:
            return tuple(self.value(x, where) for x in v["tuple"])
        if keys == {"dict"} and type(v["dict"]) is dict:
            return {str(k): self.value(x, where) for k, x in v["dict"].items()}
        if keys == {"slice"} and type(v["slice"]) is list and len(v["slice"]) == 3:
            return slice(*(self.value(x, where) for x in v["slice"]))
        if keys == {"ellipsis"}:
            return Ellipsis
        if keys == {"float"} and v["float"] in ("nan", "inf", "-inf"):
            return float(v["float"])
        if keys == {"complex"} and type(v["complex"]) is list and len(v["complex"]) == 2:
            re, im = (self.value(x, where) for x in v["complex"])
            if not all(type(part) in (int, float) for part in (re, im)):
                raise Problem(f"{where}: a complex needs two numbers, got {v!r:.80}")
            return complex(re, im)
        if keys == {"dtype"}:
            return self.dtype(v["dtype"], where)
        if keys == {"scalar_type"}:
            return self.dtype(v["scalar_type"], where).type
        if keys == {"python_type"} and v["python_type"] in _PYTHON_TYPES:
            return _PYTHON_TYPES[v["python_type"]]
        if keys == {"scalar", "value"}:
            dtype = self.dtype(v["scalar"], where)
            try:
                return dtype.type(self.value(v["value"], where))
            except (TypeError, ValueError, OverflowError) as exc:
                raise Problem(f"{where}: bad {dtype} scalar: {exc}") from exc
        if keys == {"namedtuple", "fields"} and type(v["fields"]) is list:
            fields = [self.value(x, where) for x in v["fields"]]
            return self.named_tuple(v["namedtuple"], fields, where)
        raise Problem(f"{where}: unexpected value {v!r:.80}")

    def step_arg(self, v: Any, where: str) -> Any:
        """An argument of a fused step: ``{"arg": i}``, ``{"tmp": j}`` or a value."""
        if type(v) is dict and set(v) == {"arg"}:
            return Arg(self._int(v["arg"], where))
        if type(v) is dict and set(v) == {"tmp"}:
            return Tmp(self._int(v["tmp"], where))
        return self.value(v, where)

    @staticmethod
    def _int(v: Any, where: str) -> int:
        if type(v) is not int or v < 0:
            raise Problem(f"{where}: expected a non-negative integer, got {v!r}")
        return v

    @staticmethod
    def dtype(text: Any, where: str) -> np.dtype[Any]:
        if not isinstance(text, str):
            raise Problem(f"{where}: bad dtype {text!r}")
        try:
            dtype = np.dtype(text)
        except (TypeError, ValueError) as exc:
            raise Problem(f"{where}: bad dtype {text!r}") from exc
        if dtype.kind in "OVMm" or dtype.fields is not None:
            raise Problem(f"{where}: dtype {text!r} is not allowed in a graph file")
        return dtype

    def type(self, v: Any, where: str) -> ValueType | None:
        if v is None:
            return None
        if type(v) is not dict or set(v) != {"shape", "dtype"} or type(v["shape"]) is not list:
            raise Problem(f"{where}: a type must be {{shape, dtype}}, got {v!r:.80}")
        if len(v["shape"]) > MAX_NDIM:
            raise Problem(
                f"{where}: a shape has at most {MAX_NDIM} dimensions, got {len(v['shape'])}"
            )
        shape = tuple(self._int(d, where) for d in v["shape"])
        dtype = self.dtype(v["dtype"], where)
        if math.prod(shape) * dtype.itemsize >= MAX_NBYTES:
            raise Problem(f"{where}: shape {list(shape)} of {dtype} describes 2**62 bytes or more")
        return ValueType(shape, dtype)
