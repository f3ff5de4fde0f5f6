"""The graph file format (``.dfg``), version 1, and writing it: save.

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

Reading a file is in two modules of their own: ``_read`` (``load``, ``read``: the document, the
constants, every node checked against its op) and ``_decoder`` (graph.json values back into
Python values, and every name a file gives resolved, or refused, there). This module holds what
both sides share (the format's name and version, the Python types a value may name) and the
writer, which trusts its input (a graph in this process) and refuses what a file cannot hold.

A reader refuses a file whose ``version`` is newer than its own; a later version that adds
fields keeps the old ones, so version 1 files stay readable.
"""

from __future__ import annotations

import io
import json
import math
import os
import secrets
import stat
import zipfile
from typing import Any

import numpy as np

from .._errors import DataflowTypeError, DataflowValueError
from .._registry import lookup_op
from ._fused import Arg, FusedOp, Tmp
from ._ir import (
    ConstRef,
    Graph,
    InputRef,
    Node,
    NodeRef,
    OpLike,
    UnresolvedOp,
    ValueType,
)

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "save"]

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
    half-written file. A symlink is followed, as ``open(path, "w")`` follows it: the file it
    points to is replaced (written beside it, in its own directory), and the link stays.

    Raises:
        TypeError: the graph holds something a file cannot represent (an op that is not
            registered under its name, an argument of an unknown type, an object array), or
            ``path`` is not a str or os.PathLike.
        ValueError: the graph's or an input's name is not a Python name, or a constant's
            name is not printable text (``load`` would refuse the file).
    """
    file = _path(path, "Graph.save")
    _check_names(graph)
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
    target = _follow_links(file)
    fd, tmp = _create_beside(target)
    try:
        with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("graph.json", text)
            zf.writestr("params.npz", params.getvalue(), compress_type=zipfile.ZIP_STORED)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def _check_names(graph: Graph) -> None:
    """Refuse, at the save, the names ``load`` would refuse (``_read._text``): the graph's and
    its inputs' names are Python names (``graph.code`` writes them into source), and the
    constants' print as themselves. A file saved must load."""
    names = [("the graph's name", graph.name, True)]
    names += [(f"input {k}'s name", i.name, True) for k, i in enumerate(graph.inputs)]
    names += [("a constant's name", name, False) for name in graph.constants]
    for what, name, python in names:
        if not name.isprintable() or (python and not name.isidentifier()):
            kind = "a Python name" if python else "printable text"
            raise DataflowValueError(
                f"Graph.save: {what} {name!r:.80} is not {kind}, and load would refuse the "
                "file: rename it"
            )


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


def _follow_links(path: str) -> str:
    """``path`` with its symlinks resolved: the file ``open(path, "w")`` would write.

    A dangling link gives the path it points to (``open`` creates that file); a loop is
    ``open``'s own error (ELOOP), not a plain file put in place of the link.
    """
    if not os.path.islink(path):
        return path
    target = os.path.realpath(path)
    if os.path.islink(target):  # realpath stops at a loop: the file system's own error
        os.stat(path)  # (OSError ELOOP, naming the path), as open(path, "w") would raise
    return target


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
