"""What ``dataflow run`` runs, as ``python`` would: a file, a folder or zip, stdin, a module.

``python TARGET`` runs a script file, a folder or a zip archive (a ``.pyz``) that holds a
``__main__.py``, a pipe (``python <(...)``) or stdin (``-``); ``python -m MODULE`` a module, or
a package's ``__main__``. ``dataflow run`` takes the same targets. Before anything runs,
:func:`target_problem` and :func:`module_problem` say in one line why a target cannot run (no
such file, a folder or archive without ``__main__.py``, a syntax error, a package without
``__main__``): a mistake in the command line is not a traceback. :func:`run_target` then runs
it as ``__main__`` and :func:`print_user_traceback` prints what it raised as python would.

Design note: runpy runs folders, zips and modules. A script file (or its ``.pyc``), a pipe or
stdin is read once, by :func:`target_problem`, which compiles it and so reports a syntax error
(a pipe can be read only once), and runs here in a fresh ``__main__`` module as runpy would
run it, with what python gives a script and runpy does not: an absolute ``__file__`` (and
file name in tracebacks) and ``sys.argv[0]`` as typed. The exit codes belong to ``_cli``.
"""

from __future__ import annotations

import builtins
import importlib.util
import marshal
import os
import runpy
import stat
import sys
import traceback
import types
import zipfile
from types import CodeType

__all__ = ["module_problem", "print_user_traceback", "run_target", "target_problem"]

#: What python runs in a folder or a zip archive.
_MAINS = ("__main__.py", "__main__.pyc")

#: A script file's code, as target_problem compiled it (read once: a pipe can be read only
#: once), with its ``__file__`` and its ``sys.path`` entry, for run_target.
_compiled: dict[str, tuple[CodeType, str, str]] = {}


def target_problem(script: str) -> tuple[str, int] | None:
    """Why SCRIPT cannot run, as (one line, exit code), or None when it can."""
    if script == "-":  # as python: __file__ '<stdin>', the current folder ('') on sys.path
        return _compile_once(script, sys.stdin.buffer.read(), "<stdin>", "")
    if os.path.isdir(script):
        if not any(os.path.exists(os.path.join(script, main)) for main in _MAINS):
            return (
                f"{script!r} is a folder with no __main__.py: give a Python file, a folder "
                "or .pyz archive with a __main__.py, or -m PACKAGE",
                2,
            )
        return None
    if not os.path.exists(script):
        return f"no such script: {script!r} (check the path; to run a module use -m MODULE)", 2
    try:
        if zipfile.is_zipfile(script):
            with zipfile.ZipFile(script) as archive:
                if not set(_MAINS) & set(archive.namelist()):
                    return f"the archive {script!r} has no __main__.py: nothing to run", 2
            return None
        with open(script, "rb") as f:  # once: a pipe, <(...), can be read only once
            source = f.read()
    except (OSError, zipfile.BadZipFile) as exc:
        return f"cannot read {script}: {type(exc).__name__}: {exc}", 1
    # As python: __file__ (and the code's file name) absolute, and the folder of the file,
    # symbolic links resolved, first on sys.path (a pipe's: /dev/fd).
    regular = stat.S_ISREG(os.stat(script).st_mode)
    folder = os.path.dirname(os.path.realpath(script) if regular else os.path.abspath(script))
    return _compile_once(script, source, os.path.abspath(script), folder)


def _too_deep(exc: BaseException, script: str) -> tuple[str, int]:
    return f"cannot compile {script}: {type(exc).__name__} (its code nests too deep)", 1


def _syntax_error(exc: SyntaxError, script: str) -> tuple[str, int]:
    """As python shows it: file, line, the source and a caret; a file that is no source at
    all (null bytes: a binary) has no line to show, so the line names the file."""
    if exc.lineno is None:
        return f"cannot run {script}: not Python source ({type(exc).__name__}: {exc.msg})", 1
    return "".join(traceback.format_exception_only(SyntaxError, exc)).rstrip("\n"), 1


def _compile_once(script: str, source: bytes, filename: str, folder: str) -> tuple[str, int] | None:
    """Compile a script's source (or load its ``.pyc``) and keep it for :func:`run_target`."""
    try:
        if source.startswith(importlib.util.MAGIC_NUMBER):  # a .pyc: its 16-byte header
            code = marshal.loads(source[16:])
        else:
            code = compile(source, filename, "exec")
        _compiled[script] = (code, filename, folder)
    except SyntaxError as exc:
        return _syntax_error(exc, script)
    except (OSError, ValueError) as exc:
        return f"cannot read {script}: {type(exc).__name__}: {exc}", 1
    except (MemoryError, RecursionError) as exc:  # the compiler's stack: nested too deep
        return _too_deep(exc, script)
    return None


def module_problem(module: str) -> str | None:
    """Why ``-m MODULE`` cannot run, in one line, or None when it can (as ``python -m``).

    Finding a submodule imports its parent packages: what their own code raises (a failing
    ``__init__``, a dependency of theirs missing) is not a missing module, and propagates for
    the caller to report as the program's error, as ``python -m`` does.
    """
    if not all(part.isidentifier() for part in module.split(".")):
        return f"no module named {module!r}"
    try:
        spec = importlib.util.find_spec(module)
        package = spec is not None and spec.submodule_search_locations is not None
        if package and importlib.util.find_spec(f"{module}.__main__") is None:
            return (
                f"{module!r} is a package with no __main__ module: it cannot be run "
                "with -m (run one of its modules, -m PACKAGE.MODULE)"
            )
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module != missing and not module.startswith(missing + "."):
            raise  # a module the package imports, not the package
        spec = None
    except ValueError:
        if module not in sys.modules:  # (find_spec: a module already run, __spec__ None)
            raise
        spec = None
    return f"no module named {module!r}" if spec is None else None


def program_files(module: str | None, script: str | None) -> list[str]:
    """The files of the program ``dataflow run`` runs: the script, a folder's ``__main__``, or
    the module's source (and a package's ``__main__``), those that exist. Called once the
    target was found (``target_problem``, ``module_problem``: the module's parents are
    imported already)."""
    if script is not None:
        if script == "-":
            return []
        if os.path.isdir(script):
            return [p for m in _MAINS if os.path.exists(p := os.path.join(script, m))]
        return [script] if os.path.exists(script) else []
    found = []
    for name in (str(module), f"{module}.__main__"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = getattr(spec, "origin", None)
        if origin and os.path.exists(origin):
            found.append(origin)
    return found


def overwrites_program(path: str, module: str | None, script: str | None) -> str | None:
    """The program's file that writing ``path`` would overwrite, if any (``--trace``)."""
    if not os.path.exists(path):
        return None
    for file in program_files(module, script):
        try:
            if os.path.samefile(path, file):
                return file
        except OSError:
            continue
    return None


def run_target(module: str | None, script: str | None) -> None:
    """Run the module or the script as ``__main__`` (``sys.argv`` is already set)."""
    if module is not None:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    assert script is not None
    compiled = _compiled.pop(script, None)
    if compiled is None:  # a folder or an archive: runpy puts it on sys.path itself
        runpy.run_path(script, run_name="__main__")
    else:
        _run_code(*compiled)


def _run_code(code: CodeType, filename: str, folder: str) -> None:
    """Execute a script's code in a fresh ``__main__`` module, as runpy runs a file."""
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=filename,
        __cached__=None,
        __loader__=None,
        __package__=None,
        __spec__=None,
        __builtins__=builtins,
    )
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    sys.path.insert(0, folder)
    try:
        exec(code, main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def print_user_traceback(exc: BaseException) -> None:
    """Report an uncaught exception as python would: through the script's ``sys.excepthook``
    when it installed one, else the traceback without the CLI's and runpy's own frames."""
    tb = exc.__traceback__
    ours = (__file__, runpy.__file__, os.path.join(os.path.dirname(__file__), "_cli.py"))
    while tb is not None and (
        tb.tb_frame.f_code.co_filename in ours
        or tb.tb_frame.f_code.co_filename.startswith(("<frozen runpy", "<frozen importlib"))
    ):
        tb = tb.tb_next
    if sys.excepthook is not sys.__excepthook__:
        try:
            sys.excepthook(type(exc), exc, tb)
            return
        except BaseException as hook_exc:  # as python: say so, then both tracebacks
            sys.stderr.write("Error in sys.excepthook:\n")
            traceback.print_exception(type(hook_exc), hook_exc, hook_exc.__traceback__)
            sys.stderr.write("\nOriginal exception was:\n")
    traceback.print_exception(type(exc), exc, tb)
