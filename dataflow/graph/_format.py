"""The graph file format (``.dfg``), version 1: save, load, read.

A graph file is a zip archive with two members:

* ``graph.json``: ``{"format": "dataflow.graph", "version": 1, "producer": ..., "name": ...,
  "inputs": [...], "constants": [...], "nodes": [...], "outputs": ...}``. Each input and
  constant has a ``name``, a ``shape`` and a numpy ``dtype`` string (``"<f4"``); a constant has
  a ``kind`` (``"parameter"`` or ``"constant"``). A node has ``op`` (the op's qualified name
  ``module:name``), ``args``, ``kwargs``, ``outputs`` (one ``{shape, dtype}`` or null per
  output), ``multi`` and ``location``; a fused node (``op`` ``"dataflow.graph:fused"``) also
  has ``engine`` and ``steps`` (``{op, args, output}``). Values are JSON with tags:
  ``{"node": 3}`` / ``{"node": 3, "out": 1}`` / ``{"input": 0}`` / ``{"const": "name"}`` are
  references; ``{"tuple": [...]}``, ``{"dict": {...}}``, ``{"slice": [a, b, c]}``,
  ``{"ellipsis": true}``, ``{"dtype": "<f4"}``, ``{"scalar": "<f4", "value": 1.5}``,
  ``{"scalar_type": "<f8"}`` (``np.float64`` itself), ``{"python_type": "float"}``,
  ``{"float": "nan"}``, ``{"complex": [re, im]}``, ``{"namedtuple": "module:Class",
  "fields": [...]}``, and inside fused steps ``{"arg": i}`` / ``{"tmp": j}``; JSON lists,
  strings, numbers, booleans and null stand for themselves.
* ``params.npz``: every constant, by name, as ``np.savez`` writes them (``.npy`` members).

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

A graph file is read as untrusted input: every size it declares (members, graph.json, the
constants' shapes, each array) is checked against limits before anything is inflated, and
every read is bounded (see ``_archive``).

Every node's spec and cost are then recomputed by its op's meta and cost rules on stand-in
inputs (zero-stride arrays of the recorded shapes), which checks the file against the ops as
they are now. Any problem is a :class:`~dataflow.GraphFormatError`
naming the file and the problem.

A reader refuses a file whose ``version`` is newer than its own; a later version that adds
fields keeps the old ones, so version 1 files stay readable.
"""

from __future__ import annotations

import importlib
import io
import json
import math
import os
import secrets
import stat
import sys
import types
import zipfile
from collections.abc import Iterable
from typing import Any, cast

import numpy as np

from .._errors import DataflowTypeError, DataflowValueError
from .._registry import declaring_modules, lookup_op
from .._task import Signature, Task, checked_cost
from ._archive import (
    MAX_MEMBERS,
    MAX_NBYTES,
    MAX_NDIM,
    Problem,
    check_expansion,
    open_zip,
    read_json,
    read_params,
)
from ._errors import GraphFormatError
from ._fusion import ENGINES, Arg, FusedOp, FusedStep, Tmp
from ._ir import (
    ConstRef,
    Graph,
    GraphInput,
    InputRef,
    Node,
    NodeRef,
    OpLike,
    UnresolvedOp,
    ValueType,
    type_of,
)

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "load", "read", "save"]

FORMAT_NAME = "dataflow.graph"
FORMAT_VERSION = 1
FUSED = FusedOp.qualname

#: How deep tuples, lists and dicts may nest in a saved argument or output (within what
#: ``_archive.MAX_JSON_DEPTH`` lets a reader take: each level is two JSON levels).
MAX_VALUE_DEPTH = 100

# Python types an op may take as an argument (``astype(x, float)``), by name.
_PYTHON_TYPES: dict[str, type] = {"bool": bool, "int": int, "float": float, "complex": complex}


# -- saving -----------------------------------------------------------------------------------


def _dtype_text(dtype: np.dtype[Any], where: str) -> str:
    if dtype.fields is not None or dtype.kind in "OVMm" or dtype.subdtype is not None:
        raise DataflowTypeError(
            f"{where}: dtype {dtype} cannot be saved (numeric and bool dtypes only)"
        )
    return dtype.str


def _class_name(cls: type, where: str) -> str:
    qualname = cls.__qualname__
    if "<locals>" in qualname:
        raise DataflowTypeError(
            f"{where}: {cls.__name__} is defined inside a function, so a file cannot name it"
        )
    return f"{cls.__module__}:{qualname}"


def _encode(value: Any, where: str, depth: int = 0) -> Any:
    if depth > MAX_VALUE_DEPTH:
        raise DataflowTypeError(
            f"{where}: a value nests tuples, lists or dicts more than {MAX_VALUE_DEPTH} levels "
            "deep, more than a graph file may hold (MAX_VALUE_DEPTH)"
        )
    depth += 1
    t = type(value)
    if t is NodeRef:
        if value.index is None:
            return {"node": value.node}
        return {"node": value.node, "out": value.index}
    if t is InputRef:
        return {"input": value.index}
    if t is ConstRef:
        return {"const": value.name}
    if t is Arg:
        return {"arg": value.index}
    if t is Tmp:
        return {"tmp": value.index}
    if value is None or t is bool or t is str or t is int:
        return value
    if t is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if t is complex:
        return {"complex": [_encode(value.real, where, depth), _encode(value.imag, where, depth)]}
    if t is list:
        return [_encode(v, where, depth) for v in value]
    if t is tuple:
        return {"tuple": [_encode(v, where, depth) for v in value]}
    if t is dict:
        if not all(type(k) is str for k in value):
            raise DataflowTypeError(f"{where}: only dicts with str keys can be saved")
        return {"dict": {k: _encode(v, where, depth) for k, v in value.items()}}
    if isinstance(value, tuple) and hasattr(t, "_fields"):
        return {
            "namedtuple": _class_name(t, where),
            "fields": [_encode(v, where, depth) for v in value],
        }
    if t is slice:
        return {"slice": [_encode(v, where, depth) for v in (value.start, value.stop, value.step)]}
    if value is Ellipsis:
        return {"ellipsis": True}
    if isinstance(value, np.dtype):
        return {"dtype": _dtype_text(value, where)}
    if isinstance(value, type) and issubclass(value, np.generic):
        return {"scalar_type": _dtype_text(np.dtype(value), where)}
    if value in _PYTHON_TYPES.values():
        return {"python_type": value.__name__}
    if isinstance(value, np.generic):
        return {
            "scalar": _dtype_text(value.dtype, where),
            "value": _encode(value.item(), where, depth),
        }
    raise DataflowTypeError(
        f"{where}: an argument of type {t.__name__} ({value!r:.60}) has no representation in a "
        "graph file (arrays become constants; numbers, strings, tuples, lists, dicts, slices, "
        "dtypes and NamedTuples are saved)"
    )


def _type_json(vt: ValueType | None, where: str) -> Any:
    if vt is None:
        return None
    return {"shape": list(vt.shape), "dtype": _dtype_text(vt.dtype, where)}


def _op_name(op: OpLike, where: str) -> str:
    if isinstance(op, UnresolvedOp):
        raise DataflowTypeError(f"{where}: the graph was read for inspection; load it to save it")
    if lookup_op(op.qualname) is not op:
        raise DataflowTypeError(
            f"{where}: the op {op.qualname} is not the one registered under that name (another "
            "op with the same name was declared in that module since, or it was declared "
            "without dataflow.Op): give ops distinct names to save graphs that use them"
        )
    return op.qualname


def _node_json(i: int, node: Node) -> dict[str, Any]:
    where = f"node %{i} ({node.op.name})"
    entry: dict[str, Any] = {}
    op = node.op
    if isinstance(op, FusedOp):
        entry["op"] = FUSED
        entry["engine"] = op.engine
        entry["steps"] = [
            {
                "op": _op_name(s.op, where),
                "args": _encode(list(s.args), where),
                "output": _type_json(s.type, where),
            }
            for s in op.steps
        ]
    else:
        entry["op"] = _op_name(op, where)
    entry["args"] = _encode(list(node.args), where)
    entry["kwargs"] = {k: _encode(v, where) for k, v in node.kwargs.items()}
    entry["outputs"] = [_type_json(t, where) for t in node.types]
    entry["multi"] = node.multi
    entry["location"] = node.location
    return entry


def _producer() -> str:
    from .._threads import _version

    return f"dataflow {_version()}"


def save(graph: Graph, path: str | os.PathLike[str]) -> None:
    """Write ``graph`` to ``path`` (format version 1; see the module docstring).

    The file is written next to ``path`` and renamed into place, so a failed save leaves no
    half-written file.

    Raises:
        TypeError: the graph holds something a file cannot represent (an op that is not
            registered under its name, an argument of an unknown type, an object array), or
            ``path`` is not a str or os.PathLike.
    """
    file = _path(path, "Graph.save")
    constants = []
    for name, array in graph.constants.items():
        where = f"constant {name}"
        constants.append(
            {
                "name": name,
                "kind": "parameter" if name in graph.parameters else "constant",
                "shape": list(array.shape),
                "dtype": _dtype_text(array.dtype, where),
            }
        )
    doc = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "producer": _producer(),
        "name": graph.name,
        "inputs": [{"name": i.name, **_type_json(i.type, f"input {i.name}")} for i in graph.inputs],
        "constants": constants,
        "nodes": [_node_json(i, node) for i, node in enumerate(graph.nodes)],
        "outputs": _encode(graph.outputs, "the outputs"),
    }
    text = json.dumps(doc, indent=1, allow_nan=False)
    params = io.BytesIO()
    with zipfile.ZipFile(params, "w", zipfile.ZIP_STORED) as npz:
        for name, array in graph.constants.items():
            with npz.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
    fd, tmp = _create_beside(file)
    try:
        with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("graph.json", text)
            zf.writestr("params.npz", params.getvalue(), compress_type=zipfile.ZIP_STORED)
        os.replace(tmp, file)
    except BaseException:
        os.unlink(tmp)
        raise


def _path(path: object, call: str) -> str:
    """A file path given to ``call`` as a str (or os.PathLike); anything else is refused
    naming the argument (``os.fspath``'s own error names neither)."""
    if isinstance(path, str):
        return path
    if isinstance(path, os.PathLike):
        fs = os.fspath(path)
        if isinstance(fs, str):
            return fs
    raise DataflowTypeError(
        f"{call}(path=...) must be a file path (str or os.PathLike of str), got "
        f"{type(path).__name__}: {path!r:.60}"
    )


def _create_beside(path: str) -> tuple[int, str]:
    """A new temporary file next to ``path`` (fd, name), with the mode ``open(path, "w")`` gives.

    That is the existing file's mode when ``path`` exists, else 0o666 less the umask (the
    kernel applies it: ``tempfile.mkstemp`` would leave 0o600).
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        keep: int | None = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        keep = None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".dfg-{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
        if keep is not None:
            try:
                os.chmod(tmp, keep)
            except BaseException:
                os.close(fd)
                os.unlink(tmp)
                raise
        return fd, tmp
    raise FileExistsError(f"could not create a temporary file in {directory}")


# -- reading ----------------------------------------------------------------------------------


class Opaque:
    """A NamedTuple value from a file read for inspection (its class is not looked up)."""

    __slots__ = ("fields", "qualname")

    def __init__(self, qualname: str, fields: list[Any]) -> None:
        self.qualname = qualname
        self.fields = fields

    def __repr__(self) -> str:
        return f"{self.qualname.rpartition(':')[2]}({', '.join(map(repr, self.fields))})"


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


class _Decoder:
    """Turns graph.json values back into Python values (resolving names when asked to)."""

    def __init__(self, resolve: bool, trust: tuple[str, ...]) -> None:
        self.resolve = resolve
        self.trust = trust

    def op(self, qualname: Any, where: str) -> OpLike:
        if not isinstance(qualname, str) or ":" not in qualname:
            raise Problem(f"{where}: op must be a 'module:name' string, got {qualname!r}")
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
        if not isinstance(qualname, str) or ":" not in qualname:
            raise Problem(f"{where}: bad namedtuple name {qualname!r}")
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


def _field(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in doc:
        raise Problem(f"{where}: missing {key!r}")
    value = doc[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise Problem(f"{where}: {key!r} has the wrong type ({type(value).__name__})")
    return value


def _graph_json(zf: zipfile.ZipFile) -> dict[str, Any]:
    """graph.json, parsed (within the limits of ``_archive``), of this format and version."""
    doc = read_json(zf)
    if type(doc) is not dict:
        raise Problem("graph.json is not a JSON object")
    if doc.get("format") != FORMAT_NAME:
        raise Problem(f"not a graph file: format is {doc.get('format')!r}, not {FORMAT_NAME!r}")
    version = doc.get("version")
    if type(version) is not int or version < 1:
        raise Problem(f"bad format version {version!r}")
    if version > FORMAT_VERSION:
        raise Problem(
            f"format version {version} was written by a newer dataflow "
            f"({doc.get('producer', 'unknown')}); this one reads version "
            f"{FORMAT_VERSION} and earlier: upgrade dataflow"
        )
    return doc


def _declared_constants(doc: dict[str, Any], dec: _Decoder, file_size: int) -> dict[str, ValueType]:
    """Each constant's declared type, their total checked against the file's size on disk."""
    declared: dict[str, ValueType] = {}
    for entry in _field(doc, "constants", list, "graph.json"):
        if type(entry) is not dict:
            raise Problem("constants: expected objects")
        cname = _field(entry, "name", str, "a constant")
        vt = dec.type(
            {"shape": entry.get("shape"), "dtype": entry.get("dtype")}, f"constant {cname}"
        )
        assert vt is not None
        declared[cname] = vt
    check_expansion(declared, file_size)
    return declared


def _stand_in(vt: ValueType) -> np.ndarray[Any, Any]:
    """An array of ``vt``'s shape and dtype that takes no memory (for meta rules only)."""
    return np.broadcast_to(np.zeros((), dtype=vt.dtype), vt.shape)


def _bind(value: Any, env: dict[Any, Any], where: str) -> Any:
    t = type(value)
    if t is NodeRef or t is InputRef or t is ConstRef:
        try:
            return env[value]
        except KeyError:
            raise Problem(f"{where} refers to a value that is not defined before it") from None
    if t is tuple or t is list:
        return t(_bind(v, env, where) for v in value)
    if t is dict:
        return {k: _bind(v, env, where) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(t, "_fields"):
        return t(*(_bind(v, env, where) for v in value))
    return value


def _decode(doc: dict[str, Any], arrays: dict[str, Any], dec: _Decoder) -> Graph:
    name = _field(doc, "name", str, "graph.json")
    inputs = []
    for k, entry in enumerate(_field(doc, "inputs", list, "graph.json")):
        where = f"input {k}"
        if type(entry) is not dict:
            raise Problem(f"{where}: expected an object")
        vt = dec.type({"shape": entry.get("shape"), "dtype": entry.get("dtype")}, where)
        assert vt is not None
        inputs.append(GraphInput(_field(entry, "name", str, where), vt))
    constants: dict[str, np.ndarray[Any, Any]] = {}
    parameters: set[str] = set()
    for entry in _field(doc, "constants", list, "graph.json"):
        if type(entry) is not dict:
            raise Problem("constants: expected objects")
        cname = _field(entry, "name", str, "a constant")
        where = f"constant {cname}"
        vt = dec.type({"shape": entry.get("shape"), "dtype": entry.get("dtype")}, where)
        assert vt is not None
        if cname not in arrays:
            raise Problem(f"{where} is missing from params.npz")
        array = arrays[cname]
        if array.shape != vt.shape or array.dtype != vt.dtype:
            raise Problem(
                f"{where}: params.npz holds {array.dtype}{list(array.shape)}, graph.json says {vt}"
            )
        constants[cname] = array
        if entry.get("kind") == "parameter":
            parameters.add(cname)

    env: dict[Any, Any] = {InputRef(k): _stand_in(i.type) for k, i in enumerate(inputs)}
    env.update({ConstRef(k): v for k, v in constants.items()})
    nodes: list[Node] = []
    for i, entry in enumerate(_field(doc, "nodes", list, "graph.json")):
        where = f"node %{i}"
        if type(entry) is not dict:
            raise Problem(f"{where}: expected an object")
        qualname = _field(entry, "op", str, where)
        where = f"node %{i} ({qualname})"
        args = tuple(dec.value(_field(entry, "args", list, where), where))
        kwargs_doc = _field(entry, "kwargs", dict, where)
        kwargs = {str(k): dec.value(v, where) for k, v in kwargs_doc.items()}
        types = tuple(dec.type(t, where) for t in _field(entry, "outputs", list, where))
        multi = _field(entry, "multi", bool, where)
        location = entry.get("location")
        if not types or (not multi and len(types) != 1):
            raise Problem(f"{where}: bad outputs")
        op: OpLike
        if qualname == FUSED:
            engine = _field(entry, "engine", str, where)
            if engine not in ENGINES:
                raise Problem(f"{where}: unknown fusion engine {engine!r}")
            steps = []
            for j, step in enumerate(_field(entry, "steps", list, where)):
                swhere = f"{where} step {j}"
                if type(step) is not dict:
                    raise Problem(f"{swhere}: expected an object")
                sop = dec.op(_field(step, "op", str, swhere), swhere)
                sargs = tuple(dec.step_arg(a, swhere) for a in _field(step, "args", list, swhere))
                for a in sargs:
                    missing_arg = type(a) is Arg and a.index >= len(args)
                    if missing_arg or (type(a) is Tmp and a.index >= j):
                        raise Problem(f"{swhere}: refers to a missing argument or step")
                steps.append(FusedStep(sop, sargs, dec.type(step.get("output"), swhere)))
            if not steps:
                raise Problem(f"{where}: a fused node needs steps")
            op = FusedOp(steps, engine)
        else:
            op = dec.op(qualname, where)
        spec: Any = None
        cost = None
        if dec.resolve:
            spec, cost, found = _infer(op, args, kwargs, env, where)
            if (type(spec) is tuple) != multi:
                raise Problem(
                    f"{where}: the op returns {'several' if not multi else 'one'} output(s)"
                )
            if len(found) != len(types) or any(
                want is not None and got != want for got, want in zip(found, types, strict=False)
            ):
                shown = ", ".join(str(t) for t in found)
                raise Problem(
                    f"{where}: the op computes ({shown}) from the recorded inputs, the file "
                    f"says ({', '.join(str(t) for t in types)})"
                )
            make = op.handle
            task = Task(Signature(op.name, spec, cost), op.kernel, (), None, None)
            if multi:
                for k, s in enumerate(spec):
                    env[NodeRef(i, k)] = make(task, k, s)
            else:
                env[NodeRef(i)] = make(task, None, spec)
        where_from = location if isinstance(location, str) else None
        nodes.append(Node(op, args, kwargs, spec, types, multi, cost, where_from))
    outputs = dec.value(doc.get("outputs"), "the outputs")
    try:
        return Graph(inputs, nodes, constants, outputs, parameters=parameters, name=name)
    except ValueError as exc:
        raise Problem(str(exc)) from exc


def _infer(
    op: OpLike, args: tuple[Any, ...], kwargs: dict[str, Any], env: dict[Any, Any], where: str
) -> tuple[Any, Any, list[ValueType | None]]:
    """(spec, cost, output types) from the op's rules on the stand-in values."""
    bound_args = _bind(args, env, where)
    bound_kwargs = _bind(kwargs, env, where)
    try:
        spec = op.meta(*bound_args, **bound_kwargs)
        cost = op.cost(*bound_args, **bound_kwargs) if op.cost is not None else None
        if op.cost is not None:
            cost = checked_cost(cost, op.name)
    except Exception as exc:
        raise Problem(
            f"{where}: the op rejects the recorded arguments: {type(exc).__name__}: {exc}"
        ) from exc
    specs = spec if type(spec) is tuple else (spec,)
    return spec, cost, [type_of(s) for s in specs]


def _read(path: str | os.PathLike[str], resolve: bool, trust: Iterable[str] | str) -> Graph:
    trusted = (trust,) if isinstance(trust, str) else tuple(trust)
    name = _path(path, "dataflow.load" if resolve else "dataflow.graph.read")
    dec = _Decoder(resolve, trusted)
    try:
        with open(name, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            with open_zip(f, "the file", MAX_MEMBERS) as zf:
                doc = _graph_json(zf)
                arrays = read_params(zf, _declared_constants(doc, dec, file_size))
        return _decode(doc, arrays, dec)
    except Problem as exc:
        raise GraphFormatError(name, str(exc)) from exc.__cause__


def load(path: str | os.PathLike[str], *, trust: Iterable[str] | str = ()) -> Graph:
    """Read a graph file written by :meth:`Graph.save`, ready to run.

    Ops are found in this process's op registry by their qualified names. A module a file
    names that is not imported yet is imported only if ``trust`` lists it (or a package it
    belongs to); nothing is ever unpickled.

    Example:
        >>> graph = dataflow.load("model.dfg", trust=["ops"])
        >>> y = graph.run(x)

    Raises:
        GraphFormatError: the file is not a graph file, is corrupted or truncated, has a newer
            format version, misses a parameter, holds a pickle, or names an op that cannot be
            found (or whose module is not trusted). Arguments an op's rules refuse, a
            ``Cost`` field that is negative or NaN, included.
        DataflowTypeError, DataflowValueError: ``trust`` is not a module name (``"ops"``) or
            an iterable of them, or ``path`` is not a str or os.PathLike (checked before the
            file is opened).
        FileNotFoundError: there is no such file.
    """
    return _read(path, True, _trust_names(trust))


def _trust_names(trust: object) -> tuple[str, ...]:
    """``load``'s ``trust``: a module name or an iterable of them; anything else is refused."""
    if isinstance(trust, str):
        names: tuple[object, ...] = (trust,)
    elif isinstance(trust, bytes | bytearray) or not isinstance(trust, Iterable):
        raise DataflowTypeError(
            "dataflow.load(trust=...) must be a module name or a list of module names (str), "
            f"got {type(trust).__name__}: {trust!r:.60}"
        )
    else:
        names = tuple(trust)
    for name in names:
        if not isinstance(name, str):
            raise DataflowTypeError(
                "dataflow.load(trust=...): each entry must be a module name (str), got "
                f"{type(name).__name__}: {name!r:.60}"
            )
        if not all(part.isidentifier() for part in name.split(".")):
            raise DataflowValueError(
                f"dataflow.load(trust=...): {name!r:.60} is not a module name (dotted "
                "identifiers, like 'ops' or 'mypackage.models')"
            )
    return cast("tuple[str, ...]", names)


def read(path: str | os.PathLike[str]) -> Graph:
    """Read a graph file for inspection only: nothing is imported or looked up.

    The graph prints (``print(graph)``, ``graph.code``) but does not run; use :func:`load`.
    """
    return _read(path, False, ())
