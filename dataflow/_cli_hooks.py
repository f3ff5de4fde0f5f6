"""The hooks that wrap ``dataflow run``'s script: ``--trace``, ``--log-tasks``, ``--progress``.

Each hook is a context manager factory taking the ``run`` command's options (a ``RunHook``);
the run command (``_cli``) enters every hook in ``run_hooks`` around the script, so a hook
sees the script end however it ends (the trace is written also when the script fails). A hook
that could not do its work (a trace that cannot be written) sets ``options["hook_failed"]``:
the command then exits 1 where the script succeeded.

Design note: these are the CLI's features built on the instruments (a Profiler, a
TaskLogger, a Progress line, and the terminal handling a status line needs), kept apart from
running the script and its exit codes (``_cli``), which knows them only as the list it
enters. The options themselves are declared with the ``run`` command.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO, cast

import click

from ._instrument import add_instrument, remove_instrument
from ._logging import Progress, TaskLogger
from ._profile import Profiler

__all__ = ["RunHook", "run_hooks"]

# Hooks other CLI features (tracing, progress) wrap the script run with: each is a context
# manager factory taking the `run` command's options.
RunHook = Callable[[dict[str, Any]], Any]
run_hooks: list[RunHook] = []


# -- run hooks: --trace, --log-tasks, --progress ---------------------------------------------


@contextmanager
def _trace_hook(options: dict[str, Any]) -> Iterator[None]:
    """--trace PATH: profile the script; write the trace however the script ends."""
    path = options.get("trace")
    if not path:
        yield
        return
    target = os.path.abspath(path)  # where the user said: the script may chdir
    prof = Profiler()
    prof.start()
    try:
        yield
    finally:
        prof.stop()
        try:
            prof.export_chrome_trace(target)
        except OSError as exc:
            click.echo(
                f"dataflow run: error: cannot write the trace: {type(exc).__name__}: {exc}",
                err=True,
            )
            options["hook_failed"] = True  # a run that asked for a trace and got none: exit 1
        else:
            click.echo(
                f"dataflow run: trace of {len(prof.trace().tasks)} tasks written to {path} "
                f"(open it in ui.perfetto.dev, or `dataflow trace summary {path}`)",
                err=True,
            )


@contextmanager
def _log_tasks_hook(options: dict[str, Any]) -> Iterator[None]:
    """--log-tasks: a TaskLogger for the script's run."""
    if not options.get("log_tasks"):
        yield
        return
    inst = TaskLogger()
    add_instrument(inst)
    try:
        yield
    finally:
        remove_instrument(inst)


class _StatusLine:
    """Keeps --progress's status line and the script's own output apart on one terminal.

    The status line is drawn with no newline at the end, so a line the script printed after
    it would start on the same screen line. So the script's writes (through
    :class:`_Clearing`) first clear the status line, and the status line is not drawn over a
    line the script has not finished; it comes back at the next redraw.
    """

    def __init__(self, terminal: TextIO) -> None:
        self.terminal = terminal
        self.lock = threading.RLock()
        self._shown = False  # the status line is on the screen
        self._partial = False  # the script's last write left its line unfinished

    # Progress draws through these two.
    def write(self, text: str) -> int:
        with self.lock:
            if self._partial:
                if not text.endswith("\n"):
                    return len(text)  # not over the script's unfinished line
                self.terminal.write("\n")
                self._partial = False
            self.terminal.write(text)
            self._shown = not text.endswith("\n")
            return len(text)

    def flush(self) -> None:
        with self.lock:
            self.terminal.flush()

    def script_write(self, stream: TextIO, text: str) -> int:
        """Write the script's ``text`` to ``stream``, clearing the status line first."""
        with self.lock:
            if self._shown:
                self.terminal.write("\r\x1b[K")
                self.terminal.flush()
                self._shown = False
            n = stream.write(text)
            stream.flush()
            if text:
                self._partial = not text.endswith("\n")
            return n


class _Clearing:
    """The script's sys.stdout or sys.stderr while a status line is shown (see _StatusLine)."""

    def __init__(self, stream: TextIO, status: _StatusLine) -> None:
        self._stream = stream
        self._status = status

    def write(self, text: str) -> int:
        return self._status.script_write(self._stream, text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer, flush ...
        return getattr(self._stream, name)


@contextmanager
def _progress_hook(options: dict[str, Any]) -> Iterator[None]:
    """--progress: a status line on stderr, only when it is a terminal."""
    if not options.get("progress") or not sys.stderr.isatty():
        yield
        return
    stdout, stderr = sys.stdout, sys.stderr
    status = _StatusLine(stderr)
    inst = Progress(cast(TextIO, status))
    sys.stderr = cast(TextIO, _Clearing(stderr, status))
    if stdout.isatty():  # the same screen: keep the script's lines clear of the status line
        sys.stdout = cast(TextIO, _Clearing(stdout, status))
    add_instrument(inst)
    try:
        yield
    finally:
        remove_instrument(inst)
        sys.stdout, sys.stderr = stdout, stderr
        inst.close()


run_hooks.extend((_trace_hook, _log_tasks_hook, _progress_hook))
