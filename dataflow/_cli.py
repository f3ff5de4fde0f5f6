"""The ``dataflow`` command: run scripts under the runtime, report settings.

Exit codes: the script's own ``SystemExit`` passes through; an uncaught exception prints its
traceback and exits 1; bad usage (including a missing script, or a bad ``$DATAFLOW_LOOP``
or ``$DATAFLOW_NUM_INTEROP_THREADS``) exits 2 before the script runs; Ctrl-C cancels the
tasks, joins the threads and exits 130; a script that succeeded but whose ``--trace`` could
not be written exits 1.

Design note: this module is the ``dataflow`` command group, its ``run`` command (the script
run as ``__main__`` under dataflow's settings, with the CLI's logging configuration) and
``info``. What hangs off them lives apart: the hooks that wrap the script (``--trace``,
``--log-tasks``, ``--progress``) in ``_cli_hooks``, the ``trace`` subcommands in
``_cli_trace`` and the ``graph`` subcommands in ``dataflow.graph._commands``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO, cast

import click

from ._cli_hooks import run_hooks
from ._cli_script import (
    module_problem,
    overwrites_program,
    print_user_traceback,
    run_target,
    target_problem,
)
from ._cli_trace import trace_group
from ._defaults import resolve_loop_factory
from ._errors import DataflowError
from ._threads import (
    MAX_THREADS,
    _version,
    default_interop_threads,
    parallel_info,
    set_num_interop_threads,
    set_num_threads,
)
from .graph._commands import graph_group

__all__ = ["configure_logging", "main"]


def configure_logging(fmt: str, level: str) -> None:
    """Configure structlog for the CLI process (the library itself never does)."""
    import structlog

    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        raise click.BadParameter(f"unknown log level {level!r}", param_hint="--log-level")
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info if fmt == "json" else _identity,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, _CurrentStderr())),
        cache_logger_on_first_use=False,
    )


def _identity(_: Any, __: str, event: Any) -> Any:
    return event


class _CurrentStderr:
    """Writes to ``sys.stderr`` as it is at each write (so --progress's wrapper sees logs)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _Group(click.Group):
    """The ``dataflow`` group: Ctrl-C in any command exits 130, as ``dataflow run`` does.

    (click's own handling prints "Aborted!" and exits 1: `dataflow graph run` interrupted
    looked like a failed run to a shell that tests for 130.)
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            command = " ".join(filter(None, ("dataflow", ctx.invoked_subcommand)))
            click.echo(f"{command}: interrupted", err=True)
            _forget_keyboard_interrupt()
            sys.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), "--version", prog_name="dataflow")
def cli() -> None:
    """dataflow: run numpy model code with inter-op parallelism."""


class _RunCommand(click.Command):
    """``dataflow run``: as in ``python -m MODULE ARGS``, ``-m MODULE`` ends the options.

    Everything after the module is its own argv (``-h``, ``--trace`` included), as everything
    after a SCRIPT is (``allow_interspersed_args=False`` stops at the script).
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        takes_value = {
            opt
            for param in self.params
            if isinstance(param, click.Option) and not param.is_flag
            for opt in param.opts
        }
        args = list(args)
        i = 0
        while i < len(args) and args[i].startswith("-") and args[i] not in ("-", "--"):
            if args[i] == "-m":
                if i + 1 < len(args):
                    args.insert(i + 2, "--")
                break
            if args[i].startswith("-m") and not args[i].startswith("--"):  # -mMODULE
                args.insert(i + 1, "--")
                break
            i += 2 if args[i] in takes_value else 1
        return super().parse_args(ctx, args)


@cli.command(cls=_RunCommand, context_settings={"allow_interspersed_args": False})
@click.option(
    "-m",
    "module",
    metavar="MODULE",
    help="Run a module as a script (like python -m); what follows it is the module's argv.",
)
@click.option("--interop-threads", type=click.IntRange(1, MAX_THREADS), help="Inter-op pool size.")
@click.option(
    "--intraop-threads",
    type=click.IntRange(1, MAX_THREADS),
    help="BLAS threads per op (process-wide).",
)
@click.option(
    "--loop",
    type=click.Choice(["auto", "asyncio", "uvloop"]),
    default="auto",
    show_default=True,
    help="Event loop for dataflow.run().",
)
@click.option(
    "--log-format", type=click.Choice(["console", "json"]), default="console", show_default=True
)
@click.option("--log-level", default="warning", show_default=True, help="debug, info, warning...")
@click.option(
    "--trace",
    "trace_path",
    metavar="PATH",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the run's timeline (Chrome Trace JSON), also if the script fails.",
)
@click.option("--log-tasks", is_flag=True, help="Log every task's start and end (debug level).")
@click.option("--progress", is_flag=True, help="Show tasks done / created on a terminal.")
@click.option(
    "--dask",
    "dask_address",
    metavar="ADDRESS",
    help="Run the ops on the Dask cluster whose scheduler is at ADDRESS (tcp://host:8786); "
    "sets $DATAFLOW_DASK_ADDRESS. Needs the dask extra.",
)
@click.argument("script", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(
    module: str | None,
    interop_threads: int | None,
    intraop_threads: int | None,
    loop: str,
    log_format: str,
    log_level: str,
    trace_path: str | None,
    log_tasks: bool,
    progress: bool,
    dask_address: str | None,
    script: str | None,
    args: Sequence[str],
) -> None:
    """Run SCRIPT (or -m MODULE) as __main__ with ARGS, under dataflow's settings.

    The options become the process defaults, so a script that calls
    ``dataflow.run(main)`` under ``if __name__ == "__main__":`` picks them up.

    Options go before SCRIPT: everything after it is the script's own argv
    (dataflow run --trace t.json script.py --epochs 3).
    """
    if module is None and script is None:
        raise click.UsageError("give a SCRIPT to run, or -m MODULE")
    if module is not None and script is not None:
        # With -m, the first positional is the module's first argument, not a script.
        args, script = (script, *args), None
    _warn_about_late_options(list(args), script or module or "")
    if trace_path is not None:  # found now, not after the whole run
        if not trace_path.strip():  # `--trace "$UNSET"`: the run wrote no trace, silently
            raise click.BadParameter("the path is empty", param_hint="--trace")
        folder = os.path.dirname(os.path.abspath(trace_path))
        if not os.path.isdir(folder):
            raise click.BadParameter(f"the folder {folder} does not exist", param_hint="--trace")
        if not os.access(folder, os.W_OK):
            raise click.BadParameter(f"the folder {folder} is not writable", param_hint="--trace")
    level = logging.getLevelName(log_level.upper())
    if log_tasks and isinstance(level, int) and level > logging.DEBUG:
        log_level = "debug"  # --log-tasks lines are debug lines
    configure_logging(log_format, log_level)
    if interop_threads is not None:
        set_num_interop_threads(interop_threads)
    if intraop_threads is not None:
        set_num_threads(intraop_threads)
    # $DATAFLOW_LOOP chooses the loop where --loop is not given (the option's default must not
    # override it); a --loop given on the command line wins.
    given = click.get_current_context().get_parameter_source("loop")
    if given is not click.core.ParameterSource.DEFAULT or "DATAFLOW_LOOP" not in os.environ:
        os.environ["DATAFLOW_LOOP"] = loop
    try:  # a bad setting in the environment: one line before the script, not its traceback
        if interop_threads is None:
            default_interop_threads()  # $DATAFLOW_NUM_INTEROP_THREADS
        resolve_loop_factory("auto")  # $DATAFLOW_LOOP, as --loop set it or not
    except DataflowError as exc:
        click.echo(f"dataflow run: error: {type(exc).__name__}: {exc}", err=True)
        sys.exit(2)
    if dask_address is not None:
        if not dask_address.strip():  # `--dask "$UNSET"`: it ran on the local backend, silently
            raise click.BadParameter("the scheduler's address is empty", param_hint="--dask")
        _use_dask(dask_address)
    options = {
        "module": module,
        "script": script,
        "args": list(args),
        "trace": trace_path,
        "log_tasks": log_tasks,
        "progress": progress,
        "dask": dask_address,
    }
    status = _run_main(module, script, list(args), options)
    if status == 0 and options.get("hook_failed"):  # the trace asked for was not written
        status = 1
    sys.exit(status)


def _warn_about_late_options(args: list[str], target: str) -> None:
    """Say so when an option of ``dataflow run`` comes after the script: it is the script's."""
    ours = {opt for param in run.params for opt in param.opts if opt.startswith("--")}
    late = sorted({a.split("=", 1)[0] for a in args} & ours)
    if late:
        verb = "go" if len(late) > 1 else "goes"
        click.echo(
            f"dataflow run: warning: {', '.join(late)} after {target} {verb} to the script, "
            "not to dataflow run: put dataflow's options before the script",
            err=True,
        )


def _use_dask(address: str) -> None:
    """--dask ADDRESS: make the Dask backend the default of every Runtime the script creates."""
    import importlib.util

    if importlib.util.find_spec("distributed") is None:
        raise click.UsageError(
            "--dask needs dask.distributed, which is not installed: pip install "
            "'dask[distributed]>=2024.1' (in a checkout: pip install -e '.[dask]')"
        )
    from . import _backend

    os.environ[_backend.DASK_ADDRESS_ENV] = address

    def connected(where: str) -> None:  # said once, by the first runtime that connects
        _backend.on_dask_connected = None
        click.echo(f"dataflow run: ops run on the Dask cluster at {where}", err=True)

    _backend.on_dask_connected = connected


def _run_main(module: str | None, script: str | None, args: list[str], options: Any) -> int:
    from contextlib import ExitStack

    if script is not None:
        problem = target_problem(script)
        if problem is not None:
            message, status = problem
            click.echo(
                message if message.startswith("  File") else f"dataflow run: error: {message}",
                err=True,
            )
            return status
    elif module is not None:
        # As `python -m`: the current folder first on sys.path (the `dataflow` console
        # script's own folder is there instead).
        cwd = os.getcwd()
        if sys.path[:1] != [cwd]:
            sys.path.insert(0, cwd)
        try:
            problem_line = module_problem(module)
        except Exception as exc:  # a parent package's own code failed as it was imported
            print_user_traceback(exc)
            return 1
        if problem_line is not None:
            click.echo(f"dataflow run: error: {problem_line}", err=True)
            return 2
    trace = options.get("trace")
    if trace and (mine := overwrites_program(trace, module, script)) is not None:
        click.echo(
            f"dataflow run: error: --trace {trace} is the program's own file ({mine}): the "
            "trace would overwrite it; give another path (e.g. trace.json)",
            err=True,
        )
        return 2
    sys.argv = [script if script is not None else str(module), *args]
    try:
        with ExitStack() as stack:
            for hook in run_hooks:
                stack.enter_context(hook(options))
            run_target(module, script)
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            return code or 0
        click.echo(str(code), err=True)
        return 1
    except KeyboardInterrupt:
        click.echo("dataflow run: interrupted", err=True)
        _forget_keyboard_interrupt()
        return 130
    except ImportError as exc:
        if module is not None and getattr(exc, "name", None) == module:
            click.echo(f"dataflow run: error: no module named {module!r}", err=True)
            return 2
        print_user_traceback(exc)
        return 1
    except BaseException as exc:
        address = options.get("dask")
        if address and getattr(exc, "dask_address", None) == address:
            # --dask's address is wrong, not the script: one line, as for bad usage.
            click.echo(f"dataflow run: error: {type(exc).__name__}: {exc}", err=True)
            return 1
        print_user_traceback(exc)
        return 1
    return 0


def _forget_keyboard_interrupt() -> None:
    """Keep ``python -m dataflow run`` exiting with 130 once Ctrl-C has been handled.

    CPython remembers a KeyboardInterrupt that ended any string ``exec``/``eval`` (library code
    may be inside one when a second Ctrl-C lands) and, under ``python -m``, kills the process
    with SIGINT at exit although the interrupt was caught. Each string eval resets that flag.
    """
    exec("None", {})


@cli.command()
def info() -> None:
    """Print the thread settings, BLAS and event loop (parallel_info())."""
    try:
        text = parallel_info()
    except DataflowError as exc:  # a bad setting in the environment: say which, no traceback
        click.echo(f"dataflow info: error: {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)
    click.echo(text)


# `dataflow trace summary/render`: saved trace files (_cli_trace).
cli.add_command(trace_group)
# `dataflow graph show/run`: saved graph files (dataflow.graph._commands).
cli.add_command(graph_group)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``dataflow`` console script and ``python -m dataflow``."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="dataflow")
    except OSError as exc:
        # The commands catch what they read and write themselves; what is left is mostly
        # their output failing (`dataflow info > /dev/full`): one line, not a traceback.
        # (click already ends a closed pipe, `| head`, quietly with exit 1.)
        _drop_unwritten_output()
        click.echo(f"dataflow: error: {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)


def _drop_unwritten_output() -> None:
    """Point stdout at /dev/null, so the exit does not try the failed write again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real stdout: nothing to flush at exit
        pass
