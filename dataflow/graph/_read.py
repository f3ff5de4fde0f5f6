"""Reading a graph file (``load``, ``read``): the document, the constants, then every node.

The format is described in ``_format``; turning its values back into Python values, and
resolving the names a file gives, in ``_decoder``. This module reads in order: graph.json (its
format and version), the constants' declared types, ``params.npz`` (``_archive``), then each
node, whose types it checks against what its op computes.

A graph file is read as untrusted input: every size it declares (members, graph.json, the
constants' shapes, each array) is checked against limits before anything is inflated, and
every read is bounded (see ``_archive``).

Every node's spec and cost are then recomputed by its op's meta and cost rules on stand-in
inputs (zero-stride arrays of the recorded shapes), which checks the file against the ops as
they are now. Any problem is a :class:`~dataflow.GraphFormatError`
naming the file and the problem.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterable
from typing import Any, cast

import numpy as np

from .._errors import DataflowTypeError, DataflowValueError
from .._signature import Signature
from .._task import Task, checked_cost
from ._archive import (
    MAX_MEMBERS,
    Problem,
    check_expansion,
    open_zip,
    read_json,
    read_params,
)
from ._decoder import Decoder
from ._errors import GraphFormatError
from ._format import FORMAT_NAME, FORMAT_VERSION, FUSED, _path
from ._fused import ENGINES, Arg, FusedOp, FusedStep, Tmp
from ._ir import (
    ConstRef,
    Graph,
    GraphInput,
    InputRef,
    Node,
    NodeRef,
    OpLike,
    ValueType,
    type_of,
)

__all__ = ["load", "read"]


def _field(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in doc:
        raise Problem(f"{where}: missing {key!r}")
    value = doc[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise Problem(f"{where}: {key!r} has the wrong type ({type(value).__name__})")
    return value


def _text(value: str, what: str, name: bool = False) -> str:
    """A name or location from the file, refused unless it prints as itself: ``read`` and
    ``dataflow graph show`` print the file (a newline or a terminal escape in a location
    could show a reader another graph than the one that runs), and ``graph.code`` writes the
    graph's, inputs' and keywords' names into Python source (``name``: a Python name)."""
    if not value.isprintable() or (name and not value.isidentifier()):
        kind = "a Python name" if name else "printable text"
        raise Problem(f"{what} {value!r:.80} is not {kind}")
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
        producer = str(doc.get("producer", "unknown"))
        raise Problem(
            f"format version {version} was written by a newer dataflow "
            f"({producer if producer.isprintable() else repr(producer)}); this one reads version "
            f"{FORMAT_VERSION} and earlier: upgrade dataflow"
        )
    return doc


def _declared_constants(doc: dict[str, Any], dec: Decoder, file_size: int) -> dict[str, ValueType]:
    """Each constant's declared type, their total checked against the file's size on disk."""
    declared: dict[str, ValueType] = {}
    for entry in _field(doc, "constants", list, "graph.json"):
        if type(entry) is not dict:
            raise Problem("constants: expected objects")
        cname = _text(_field(entry, "name", str, "a constant"), "a constant's name")
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


def _decode(doc: dict[str, Any], arrays: dict[str, Any], dec: Decoder) -> Graph:
    name = _text(_field(doc, "name", str, "graph.json"), "the graph's name", name=True)
    inputs = []
    for k, entry in enumerate(_field(doc, "inputs", list, "graph.json")):
        where = f"input {k}"
        if type(entry) is not dict:
            raise Problem(f"{where}: expected an object")
        vt = dec.type({"shape": entry.get("shape"), "dtype": entry.get("dtype")}, where)
        assert vt is not None
        inputs.append(GraphInput(_text(_field(entry, "name", str, where), where, name=True), vt))
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
        qualname = _text(_field(entry, "op", str, where), f"{where}: op")
        where = f"node %{i} ({qualname})"
        args = tuple(dec.value(_field(entry, "args", list, where), where))
        kwargs_doc = _field(entry, "kwargs", dict, where)
        kwargs = {_text(k, f"{where}: keyword", name=True): dec.value(v, where)
                  for k, v in kwargs_doc.items()}  # fmt: skip
        types = tuple(dec.type(t, where) for t in _field(entry, "outputs", list, where))
        multi = _field(entry, "multi", bool, where)
        location = entry.get("location")
        if isinstance(location, str):
            _text(location, f"{where}: location")
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
    dec = Decoder(resolve, trusted)
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
