"""Thread settings at the two levels, mirroring torch.

* inter-op: the threads of dataflow's pool, which run independent ops side by side;
* intra-op: the threads *inside* one op, i.e. BLAS's own (OpenBLAS, MKL, BLIS), set through
  threadpoolctl. For OpenBLAS the setting is process-wide: choose it once per process.

The product of the two should not exceed the cores, or the threads fight for them.
:func:`parallel_info` warns when a count someone *chose* (a call, a ``run``/CLI option or an
environment variable) makes it exceed them. The defaults (inter-op: the cores; intra-op:
BLAS's own default, the cores) never warn: where BLAS is OpenBLAS's pthreads build, which runs
one multithreaded call at a time, a runtime on the defaults gives BLAS one thread while
long or BLAS-calling kernels run side by side and its own count otherwise (see ``_blas``).
"""

from __future__ import annotations

import os
import platform
import re
import sys
from typing import Any

import numpy as np

from . import _blas, _intraop
from ._errors import DataflowRuntimeError, DataflowTypeError, DataflowValueError
from ._pool import shared_pool_size

__all__ = [
    "default_interop_threads",
    "get_num_interop_threads",
    "get_num_threads",
    "parallel_info",
    "set_num_interop_threads",
    "set_num_threads",
]

_ENV_INTEROP = "DATAFLOW_NUM_INTEROP_THREADS"
_interop_default: int | None = None
# Environment variables that choose BLAS's thread count.
_ENV_INTRAOP = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
_intraop_chosen = False  # set_num_threads was called
#: The largest thread count a setting takes: a C int, as BLAS's setters (and torch's) take. A
#: larger one failed inside the C call (ctypes' ArgumentError from set_num_threads), or was
#: taken as the size of an inter-op pool whose start went on making threads until the system
#: refused one.
MAX_THREADS = 2**31 - 1


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def _check_count(n: object, what: str) -> int:
    """``n`` if it is a positive int up to :data:`MAX_THREADS`: another type is a
    DataflowTypeError, an int out of that range a DataflowValueError (the rule of
    ``_errors``), both naming ``what``."""
    if isinstance(n, bool | np.bool_) or not isinstance(n, int | np.integer):
        raise DataflowTypeError(f"{what} must be a positive int, got {type(n).__name__}: {n!r}")
    n = int(n)  # (a numpy integer, as torch's setters take: os.cpu_count() // np.int64(2))
    if n < 1:
        raise DataflowValueError(f"{what} must be a positive int, got {n!r}")
    if n > MAX_THREADS:
        raise DataflowValueError(
            f"{what} must be a thread count of at most {MAX_THREADS} (a C int), got {n!r}"
        )
    return n


def default_interop_threads() -> int:
    """The inter-op thread count a runtime uses when none is given.

    In order: :func:`set_num_interop_threads`, ``$DATAFLOW_NUM_INTEROP_THREADS``, the cores
    this process may run on.
    """
    if _interop_default is not None:
        return _interop_default
    env = os.environ.get(_ENV_INTEROP)
    if env:
        try:
            n = int(env)
        except ValueError:
            raise DataflowValueError(
                f"${_ENV_INTEROP} must be a positive int, got {env!r}"
            ) from None
        return _check_count(n, f"${_ENV_INTEROP}")
    return _cores()


def set_num_interop_threads(n: int) -> None:
    """Set the process default for the inter-op pool's size (like torch's).

    Call it at start-up: the shared pool cannot be resized while a runtime uses it.

    Raises:
        TypeError: ``n`` is not an int.
        ValueError: ``n`` is below 1.
        RuntimeError: the shared pool is running with another size.
    """
    global _interop_default
    n = _check_count(n, "set_num_interop_threads(n)")
    running = shared_pool_size()
    if running is not None and running != n:
        raise DataflowRuntimeError(
            f"set_num_interop_threads({n}): the shared inter-op pool is running with {running} "
            "thread(s); call it before any runtime starts (or pass interop_threads= to run/Runtime)"
        )
    _interop_default = n


def get_num_interop_threads() -> int:
    """The shared pool's size while it runs, else the size the next runtime will use."""
    running = shared_pool_size()
    return running if running is not None else default_interop_threads()


def _blas_info() -> list[dict[str, Any]]:
    from threadpoolctl import threadpool_info

    return [i for i in threadpool_info() if i.get("user_api") == "blas"]


def set_num_threads(n: int) -> None:
    """Set the intra-op thread count: the threads BLAS uses inside one op.

    For OpenBLAS this is process-wide (every inter-op thread shares it), so choose it once
    per process, usually ``cores // interop_threads``.
    """
    global _intraop_chosen
    n = _check_count(n, "set_num_threads(n)")
    _blas.stop()
    _intraop.limit_every(n)
    _intraop.chosen(n)
    _intraop_chosen = True


def intraop_chosen() -> bool:
    """Whether the program chose the intra-op count: :func:`set_num_threads` was called, or
    an environment variable sets BLAS's threads."""
    return _intraop_chosen or any(_env_sets_count(var) for var in _ENV_INTRAOP)


def _env_sets_count(var: str) -> bool:
    """Whether ``$var`` sets a thread count: one that starts with a positive int. BLAS
    libraries read an empty value, 0 or no number as unset (OpenBLAS's ``readenv_atoi``): a
    count left to them, which the runtime may adapt (``OMP_NUM_THREADS=`` in a shell made
    the count chosen, and BLAS ungoverned)."""
    digits = _LEADING_INT.match(os.environ.get(var, ""))  # (atoi's rule: "4,2" is 4)
    return digits is not None and int(digits.group(1)) > 0


_LEADING_INT = re.compile(r"\s*\+?(\d+)")


def get_num_threads() -> int:
    """The intra-op (BLAS) thread count: numpy's BLAS's (another library's own BLAS, such as
    scipy's, runs none of numpy's products); 1 when no threaded BLAS is loaded."""
    from threadpoolctl import ThreadpoolController

    lib = _blas.numpy_blas(ThreadpoolController().select(user_api="blas").lib_controllers)
    return 1 if lib is None else int(lib.num_threads)


def _chosen(interop: int, cores: int, own: bool = False) -> list[str]:
    """Which levels' counts were chosen rather than left at their defaults (``own``: the
    inter-op count is the calling runtime's own pool's, see :func:`_own_pool`)."""
    out = []
    running = interop if own else shared_pool_size()
    if (
        _interop_default is not None
        or _ENV_INTEROP in os.environ
        or (running is not None and running != cores)
    ):
        out.append("inter-op")
    if intraop_chosen() or _intraop.held():  # (held: an open runtime's intraop_threads=)
        out.append("intra-op")
    return out


def _own_pool(rt: Any) -> tuple[int, str] | None:
    """Where the runtime ``rt`` the calling code belongs to (on its loop, or in one of its
    kernels) runs its ops elsewhere than on the shared pool: that pool's size and what it
    is; None otherwise (the shared pool's figures apply). parallel_info reported the shared
    pool's default inside a runtime with a private pool of 3 threads (no warning for 3 x 2 on
    2 cores), and 2 inter-op threads in the synchronous mode, which has none."""
    if rt is None or rt.host is None or rt._closed or rt.backend.name != "local":
        return None
    if rt.interop_threads == 0:
        return 0, "this runtime's synchronous mode: every op runs on the thread that calls it"
    if rt.private_pool:
        return rt.interop_threads, "this runtime's private pool"
    return None


def _loop_name(rt: Any) -> str:
    """The event loop the calling code runs on, else the calling runtime's (in one of its
    kernels), else the one new runs get."""
    import asyncio

    from ._loop import running_library

    if running_library() == "trio":  # (first: a trio guest run has an asyncio loop too)
        return "trio"
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        host = None if rt is None or rt._closed else rt.host
        if host is not None and host.library == "trio":
            return "trio"
        if host is not None and isinstance(host.key, asyncio.AbstractEventLoop):
            loop = host.key
        else:
            from ._defaults import resolve_loop_factory

            factory = resolve_loop_factory("auto")
            return "uvloop (default for new runs)" if factory is not None else "asyncio"
    mod = type(loop).__module__
    return "uvloop" if mod.startswith("uvloop") else f"asyncio ({type(loop).__name__})"


def parallel_info() -> str:
    """A readable report of the thread settings, like ``torch.__config__.parallel_info()``.

    Lists the inter-op and intra-op thread counts, the BLAS library and its version, the event
    loop in use, and warns when inter-op x intra-op threads exceed the cores because of a
    count someone chose (the defaults never warn; see the module docstring). Left unset,
    where a runtime adapts BLAS's count (``_blas``), the intra-op line says so ("1 while
    long or BLAS kernels run side by side"); where a chosen count gives OpenBLAS (pthreads)
    several threads beside several inter-op threads, a note says that its multithreaded calls
    run one at a time (docs/getting-started.md, section 5).
    """
    import numpy as np

    from ._lookup import current_runtime

    cores = _cores()
    rt = current_runtime()
    pool = _own_pool(rt)
    interop = get_num_interop_threads() if pool is None else pool[0]
    shared = shared_pool_size()
    own = _blas.governed()  # a governed runtime runs: BLAS's count now may be its 1
    intra = get_num_threads() if own is None else own
    chosen = _chosen(interop, cores, pool is not None)
    if pool is None:
        where = (" (shared pool running)" if shared is not None else "") + (
            "" if "inter-op" in chosen else " (default: the cores)"
        )
    else:
        beside = "" if shared is None else f"; the shared pool: {shared}, running"
        where = f" ({pool[1]}{beside})"
    lines = [
        f"dataflow {_version()} on Python {platform.python_version()} ({sys.platform})",
        f"numpy {np.__version__}",
        f"cores available: {cores}",
        f"inter-op threads: {interop}{where}",
    ]
    blas = _blas_info()  # (threadpoolctl inspects the loaded libraries: read once)
    serial = any(_serial_blas(info) for info in blas)
    adaptive = "intra-op" not in chosen and serial and intra > 1 and interop > 1
    lines.append(
        f"intra-op threads (BLAS): {intra}"
        + ("" if "intra-op" in chosen else " (default: BLAS's own")
        + (
            f", 1 while {_blas.crowd(intra)}+ long or BLAS kernels run side by side)"
            if adaptive
            else ""
        )
        + ("" if "intra-op" in chosen or adaptive else ")")
    )
    for info in blas:
        lines.append(
            f"BLAS: {info.get('internal_api')} {info.get('version')} "
            f"threading={info.get('threading_layer')} architecture={info.get('architecture')} "
            f"threads={info.get('num_threads')}"
        )
    if not blas:
        lines.append("BLAS: none found by threadpoolctl")
    # Every variable that makes a count chosen (BLIS_NUM_THREADS warned unseen), and the
    # kernels OpenBLAS runs.
    for var in (*_ENV_INTRAOP, "OPENBLAS_CORETYPE", _ENV_INTEROP):
        if var in os.environ:
            lines.append(f"{var}={os.environ[var]}")
    lines.append(f"event loop: {_loop_name(rt)}")
    if interop > 1 and intra > 1 and serial and "intra-op" in chosen:
        lines.append(
            "note: OpenBLAS runs one multithreaded call at a time, so GEMMs on several "
            "inter-op threads wait for each other unless BLAS has one thread: for a program "
            "with parallel branches, set_num_threads(1) (or intraop_threads=1), or leave the "
            "count unset (a runtime then gives BLAS one thread while many kernels run side by "
            "side)."
        )
    if interop * intra > cores and chosen:
        # A fix that fits: fewer BLAS threads while the inter-op threads fit the cores; past
        # them, no intra-op count can (3 x 1 on 2 cores), so fewer inter-op threads.
        fix = (
            f"set_num_threads({cores // interop})"
            if interop <= cores
            else f"set_num_interop_threads({max(1, cores // intra)})"
            if pool is None
            else f"interop_threads={max(1, cores // intra)}"
        )
        lines.append(
            f"WARNING: inter-op x intra-op threads = {interop} x {intra} = {interop * intra} "
            f"exceeds the {cores} cores: threads will compete. Lower one of them, e.g. {fix}."
        )
    return "\n".join(lines)


def _serial_blas(info: dict[str, Any]) -> bool:
    """Whether this BLAS runs one multithreaded call at a time: OpenBLAS's pthreads (and
    Windows) builds serialize parallel level-3 calls from several caller threads (its own
    ``level3_lock``). Measured on 16 cores: the seed ensemble on 8 inter-op threads took
    2.1-2.7 s a forward with two BLAS threads against 0.89 s with one."""
    return info.get("internal_api") == "openblas" and info.get("threading_layer") != "openmp"


#: The distribution that installs the `dataflow` and `ops` packages (PyPI's "dataflow" is
#: another project).
DISTRIBUTION = "numpy-dataflow"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # pragma: no cover - running from a checkout
        return "unknown"
