"""Reading a graph file's zip archive without trusting what it declares (zip bombs).

A graph file is untrusted input. Every size is checked before anything is inflated, then again
on what is read (bounded reads: never more than the limit plus one byte, whatever a header
says):

* the archive has at most :data:`MAX_MEMBERS` members, counted from its end record before
  zipfile reads its directory, no two of one name; members are stored or deflated (bzip2 and
  lzma reach far higher ratios, and the format never writes them);
* ``graph.json`` inflates to at most :data:`MAX_GRAPH_JSON` bytes and nests at most
  :data:`MAX_JSON_DEPTH` arrays and objects deep (checked without recursion);
* a shape has at most :data:`MAX_NDIM` dimensions and describes less than :data:`MAX_NBYTES`
  bytes (``_decoder`` checks each one it decodes);
* the constants' declared shapes fix how much data ``params.npz`` may hold: in total at most
  :data:`MAX_EXPANSION` times the file's size on disk, plus :data:`FREE_BYTES`. One layer of
  deflate compresses at most 1032:1, so only an archive inside an archive (``params.npz``
  deflated around deflated members) can exceed it, and such a file is refused before it is
  opened. ``params.npz`` and each member may declare no more than those arrays (plus their
  headers) need; each array's ``.npy`` header must match what ``graph.json`` declares before
  its data is read, in 1 MiB chunks, straight into the array.

So loading a file costs about its declared arrays in memory, and a bomb is refused at once.
Each problem raises :class:`Problem`, which ``_read`` turns into a ``GraphFormatError``
naming the file.
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
import zipfile
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from ._ir import ValueType

__all__ = [
    "FREE_BYTES",
    "MAX_EXPANSION",
    "MAX_GRAPH_JSON",
    "MAX_JSON_DEPTH",
    "MAX_MEMBERS",
    "MAX_NBYTES",
    "MAX_NDIM",
    "Problem",
    "check_expansion",
    "nbytes",
    "open_zip",
    "read_json",
    "read_params",
]

#: Members of the archive (a graph file has 2).
MAX_MEMBERS = 64
#: graph.json's size once inflated: about 250,000 nodes.
MAX_GRAPH_JSON = 128 * 2**20
#: How deep graph.json's arrays and objects may nest.
MAX_JSON_DEPTH = 256
#: The constants' declared bytes per byte of file: one layer of deflate reaches at most 1032.
MAX_EXPANSION = 1100
#: Declared constant bytes any file may hold, whatever its size.
FREE_BYTES = 2**20
#: A shape's dimensions (numpy's own limit).
MAX_NDIM = 64
#: A shape's bytes: well below what an index can address.
MAX_NBYTES = 2**62
# Room for one .npy member besides its data: the header (numpy reads at most 10,000 bytes of
# it) and the member's zip records (twice its name, zip64 fields).
_NPY_ROOM = 16 * 2**10
_CHUNK = 2**20


class Problem(Exception):
    """A problem found while reading; becomes a GraphFormatError naming the file."""


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def _member_count(fileobj: Any) -> int | None:
    """The member count a zip archive's end record declares (None: no end record found).

    Read from the last 64 KiB of the file, so a huge directory is refused before zipfile
    builds an entry for each of its members.
    """
    fileobj.seek(0, os.SEEK_END)
    size = fileobj.tell()
    fileobj.seek(max(0, size - 22 - 0xFFFF))
    tail = fileobj.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) < at + 22:
        return None
    count: int = struct.unpack_from("<H", tail, at + 10)[0]
    locator = at - 20  # a zip64 archive keeps the true count in its zip64 end record
    if count == 0xFFFF and locator >= 0 and tail[locator : locator + 4] == b"PK\x06\x07":
        (offset,) = struct.unpack_from("<Q", tail, locator + 8)
        fileobj.seek(offset)
        record = fileobj.read(40)
        if len(record) == 40 and record[:4] == b"PK\x06\x06":
            (count,) = struct.unpack_from("<Q", record, 32)
    return count


def open_zip(fileobj: Any, what: str, max_members: int) -> zipfile.ZipFile:
    """The zip archive in ``fileobj``, its member count checked before its directory is read."""
    count = _member_count(fileobj)
    if count is not None and count > max_members:
        raise Problem(
            f"{what} has {count} members, more than the {max_members} it may have "
            "(MAX_MEMBERS): refused"
        )
    try:
        zf = zipfile.ZipFile(fileobj)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError) as exc:
        if what == "the file":
            raise Problem(f"not a graph file (not a zip archive, or truncated): {exc}") from exc
        raise Problem(f"{what} is not a zip archive, or is truncated: {exc}") from exc
    names = zf.namelist()
    if len(set(names)) != len(names):
        # zipfile reads the last of them, other tools (unzip, a reviewer's) the first: what
        # is inspected would not be what runs.
        twice = next(n for n in names if names.count(n) > 1)
        zf.close()
        raise Problem(f"{what} holds two members named {twice!r:.80}: refused")
    return zf


def _member(zf: zipfile.ZipFile, name: str, what: str, limit: int, why: str) -> zipfile.ZipInfo:
    """The member's entry, refused unless stored or deflated and declared within ``limit``."""
    info = zf.getinfo(name)
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise Problem(
            f"{what} is compressed with method {info.compress_type}: a graph file uses only "
            "stored or deflated members"
        )
    if info.file_size > limit:
        raise Problem(
            f"{what} declares {_size(info.file_size)} uncompressed, more than the "
            f"{_size(limit)} {why}: refused unopened"
        )
    return info


def _bounded_read(zf: zipfile.ZipFile, info: zipfile.ZipInfo, what: str, limit: int) -> bytes:
    """The member's bytes, reading at most ``limit`` + 1 of them whatever its header says."""
    try:
        with zf.open(info) as member:
            data = member.read(limit + 1)
    except (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, NotImplementedError) as exc:
        raise Problem(f"{what} is corrupted: {exc}") from exc
    if len(data) > limit:
        raise Problem(f"{what} inflates to more than the {_size(limit)} it declares: refused")
    return data


def _json_depth(doc: Any) -> int:
    """How deep lists and dicts nest in ``doc`` (iterative: any depth)."""
    deepest = 0
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if type(value) is list:
            children: Iterable[Any] = value
        elif type(value) is dict:
            children = value.values()
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def read_json(zf: zipfile.ZipFile) -> Any:
    """graph.json, parsed, within the size and depth limits."""
    if "graph.json" not in zf.namelist():
        raise Problem("not a graph file: the archive has no graph.json")
    info = _member(
        zf,
        "graph.json",
        "graph.json",
        MAX_GRAPH_JSON,
        "a graph file's graph.json may hold (MAX_GRAPH_JSON)",
    )
    data = _bounded_read(zf, info, "graph.json", info.file_size)
    too_deep = (
        f"graph.json nests arrays and objects more than {MAX_JSON_DEPTH} deep "
        "(MAX_JSON_DEPTH): refused"
    )
    try:
        doc = json.loads(data.decode("utf-8"))
    except RecursionError as exc:  # deeper than the C parser goes: far beyond the limit
        raise Problem(too_deep) from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise Problem(f"graph.json is not valid JSON: {exc}") from exc
    if _json_depth(doc) > MAX_JSON_DEPTH:
        raise Problem(too_deep)
    return doc


def nbytes(vt: ValueType) -> int:
    """The bytes an array of that type holds."""
    return math.prod(vt.shape) * vt.dtype.itemsize


def check_expansion(declared: dict[str, ValueType], file_size: int) -> None:
    """Refuse constants that declare more data than the file could hold (see above)."""
    total = sum(nbytes(vt) for vt in declared.values())
    if total > MAX_EXPANSION * file_size + FREE_BYTES:
        raise Problem(
            f"the constants declare {_size(total)} of data, but the file is {_size(file_size)}: "
            f"more than {MAX_EXPANSION}x its size (MAX_EXPANSION; one layer of deflate reaches "
            "1032x), as only a zip bomb (an archive inside an archive) could hold: refused"
        )


def _npy(npz: zipfile.ZipFile, name: str, vt: ValueType) -> np.ndarray[Any, Any]:
    """Constant ``name`` from params.npz: header checked against ``vt``, then read in chunks."""
    what = f"params.npz member {name}.npy"
    info = _member(
        npz, f"{name}.npy", what, nbytes(vt) + _NPY_ROOM, f"constant {name} ({vt}) needs"
    )
    try:
        with npz.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise Problem(f"{what}: .npy format version {version} is not read by dataflow")
            if dtype.hasobject:
                raise Problem(
                    f"params.npz: array {name!r} holds Python objects (a pickle), which a graph "
                    "file may not contain: refused unopened"
                )
            if tuple(shape) != vt.shape or dtype != vt.dtype:
                raise Problem(
                    f"constant {name}: params.npz holds {dtype}{list(shape)}, graph.json says {vt}"
                )
            flat = np.empty(math.prod(vt.shape), dtype=vt.dtype)
            raw = flat.view(np.uint8)
            filled = 0
            while filled < raw.size:
                chunk = f.read(min(_CHUNK, raw.size - filled))
                if not chunk:
                    raise Problem(f"{what} is truncated: {filled} of {raw.size} data bytes")
                raw[filled : filled + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
                filled += len(chunk)
            if f.read(1):  # (also reaches the end, where zipfile checks the CRC)
                raise Problem(f"{what} holds more bytes than {vt} needs")
    except Problem:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, NotImplementedError) as exc:
        raise Problem(f"{what} is corrupted: {exc}") from exc
    except ValueError as exc:  # a malformed .npy header
        raise Problem(f"{what} is not a valid .npy array: {exc}") from exc
    return flat.reshape(vt.shape, order="F" if fortran else "C")


def read_params(
    zf: zipfile.ZipFile, declared: dict[str, ValueType]
) -> dict[str, np.ndarray[Any, Any]]:
    """The declared constants, by name, from params.npz.

    Members graph.json does not name are never read; a constant the archive lacks is left out
    (the caller reports it missing).
    """
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    if "params.npz" not in zf.namelist():
        return arrays
    need = sum(nbytes(vt) + _NPY_ROOM + 2 * len(n) for n, vt in declared.items()) + _NPY_ROOM
    info = _member(zf, "params.npz", "params.npz", need, "graph.json's constants need")
    data = _bounded_read(zf, info, "params.npz", info.file_size)
    with open_zip(io.BytesIO(data), "params.npz", len(declared) + MAX_MEMBERS) as npz:
        held = set(npz.namelist())
        for name, vt in declared.items():
            if f"{name}.npy" in held:
                arrays[name] = _npy(npz, name, vt)
    return arrays
