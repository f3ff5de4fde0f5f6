"""``dataflow graph``: show and run saved graph files from the shell.

* ``dataflow graph show model.dfg [--code]`` prints the IR (or the Python code) of a file. It
  only reads the file: no module is imported, nothing runs.
* ``dataflow graph run model.dfg --input x.npy [--input y.npy] [-o out.npz] [--trust ops]``
  loads the graph (importing only trusted modules), runs it on the inputs and prints the
  outputs, or saves them as one ``.npz`` (keys ``output`` for a single array, else
  ``output0``, ``output1``, ... following the output structure: ``output1.key``). The ``-o``
  path must end in ``.npz`` (``np.savez`` would otherwise write ``PATH.npz``): another name is
  a usage error, refused before the graph is loaded.

Errors print ``dataflow graph <command>: error: Type: message`` and exit 1 (2 for bad usage).
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import click
import numpy as np

from .._cli_trace import printable
from .._errors import DataflowValueError

__all__ = ["graph_group"]


def _fail(command: str, exc: BaseException) -> NoReturn:
    click.echo(f"dataflow graph {command}: error: {type(exc).__name__}: {exc}", err=True)
    sys.exit(1)


@click.group("graph")
def graph_group() -> None:
    """Show or run a graph file saved by Graph.save (dataflow.trace(...).save(path))."""


@graph_group.command("show")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--code", is_flag=True, help="Print equivalent Python source instead of the IR.")
def show(path: str, code: bool) -> None:
    """Print the IR of the graph in PATH (reads the file only: imports and runs nothing)."""
    from ._errors import GraphFormatError
    from ._read import read

    try:
        graph = read(path)
    except GraphFormatError as exc:
        _fail("show", exc)
    click.echo(graph.code if code else str(graph))


def _flatten(prefix: str, value: Any, out: list[tuple[str, Any]]) -> None:
    if isinstance(value, (tuple, list)):
        for k, v in enumerate(value):
            _flatten(f"{prefix}{k}" if prefix == "output" else f"{prefix}.{k}", v, out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}", v, out)
    else:
        out.append((prefix, value))


def _npz_members(flat: list[tuple[str, Any]]) -> dict[str, Any]:
    """The .npz members: one array per output, none lost to a shared key, none pickled."""
    members: dict[str, Any] = {}
    for key, value in flat:
        if key in members:  # a dict key with a dot: {"a.b": x, "a": {"b": y}}
            raise DataflowValueError(
                f"two outputs would be saved under the same key {key!r} (a dict key that "
                "contains a dot); print them (no -o) or rename the keys"
            )
        array = np.asarray(value)
        if array.dtype.kind == "O":
            raise DataflowValueError(
                f"output {key} is {type(value).__name__}, not an array: it could only be "
                "saved as a pickle; print the outputs (no -o) instead"
            )
        members[key] = array
    return members


def _npz_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # np.savez appends ".npz" to any other name: refuse it rather than write another file.
    if value is not None and not value.endswith(".npz"):
        raise click.BadParameter(
            f"{value!r} does not end in .npz (the outputs are saved as one .npz file)"
        )
    if value is not None:  # found now, not after the graph ran
        folder = os.path.dirname(os.path.abspath(value))
        if not os.path.isdir(folder):
            raise click.BadParameter(f"the folder {folder} does not exist")
        if not os.access(folder, os.W_OK):  # (as `dataflow run --trace` checks its folder)
            raise click.BadParameter(f"the folder {folder} is not writable")
    return value


@graph_group.command("run")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "-i",
    "--input",
    "inputs",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="An input array (.npy), once per graph input, in order.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    callback=_npz_path,
    help="Save the outputs to this .npz file (the name must end in .npz) instead of printing them.",
)
@click.option(
    "--trust",
    multiple=True,
    metavar="MODULE",
    help="A module (or package) the graph's ops come from that may be imported (e.g. ops).",
)
@click.option("--interop-threads", type=click.IntRange(min=1), help="Inter-op pool size.")
def run(
    path: str,
    inputs: tuple[str, ...],
    output: str | None,
    trust: tuple[str, ...],
    interop_threads: int | None,
) -> None:
    """Run the graph in PATH on the --input arrays."""
    from .._errors import DataflowError
    from ._read import load

    try:
        graph = load(path, trust=trust)
    except DataflowError as exc:
        _fail("run", exc)
    if len(inputs) != len(graph.inputs):
        names = ", ".join(f"{i.name}: {i.type}" for i in graph.inputs)
        raise click.UsageError(
            f"{path} takes {len(graph.inputs)} input(s) ({names}); got {len(inputs)} --input"
        )
    arrays = []
    for name in inputs:
        try:
            loaded = np.load(name, allow_pickle=False)
        except (OSError, ValueError) as exc:
            _fail("run", ValueError(f"{name}: not a .npy array file without pickles ({exc})"))
        if not isinstance(loaded, np.ndarray):  # an .npz archive: several arrays, not one
            loaded.close()
            _fail(
                "run",
                ValueError(
                    f"{name}: an .npz archive, not one array: save each input "
                    "with np.save (a .npy file) and pass it as an --input"
                ),
            )
        arrays.append(loaded)
    try:
        result = graph.run(*arrays, interop_threads=interop_threads)
    except (DataflowError, TypeError, ValueError) as exc:
        _fail("run", exc)
    flat: list[tuple[str, Any]] = []
    _flatten("output", result, flat)
    if output is not None:
        savez: Any = np.savez  # (its stub types **kwds as its own options)
        try:
            members = _npz_members(flat)
            savez(output, **members)
        except (OSError, ValueError) as exc:
            _fail("run", exc)
        click.echo(printable(f"wrote {output} ({', '.join(members)})"))
        return
    for key, value in flat:
        array = np.asarray(value)
        # A key is the graph file's (a dict key of its outputs): escaped, so a crafted file
        # cannot drive the terminal, as `dataflow trace summary` prints a trace's names.
        click.echo(printable(f"{key} : {array.dtype}{list(array.shape)}"))
        click.echo(np.array2string(array, threshold=50, edgeitems=2, precision=5))
