"""Intra-op counts the program chose: set from any thread, and held by the runtimes that chose one.

``set_num_threads(n)`` and ``Runtime(intraop_threads=n)`` set every BLAS loaded to ``n``
threads through threadpoolctl (:func:`limit_every`), from whichever thread calls
(:func:`_in_control`). A runtime's count is the process's while it is open (:func:`hold`):
runtimes side by side (in several threads) close in any order, and the last to close puts
back the counts from before the first. While one is open no runtime adapts BLAS's count
(``_blas``, the governor of the counts nobody chose).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from . import _blas

__all__ = ["chosen", "held", "hold", "limit_every", "restore_every", "unhold"]

_lock = threading.Lock()

# The open runtimes that chose an intra-op count (``intraop_threads=``), with that count, in
# the order they opened; and what puts BLAS's counts back when the last of them closes: the
# threadpoolctl limiter the first one made (each library's count before it), or the count the
# program chose meanwhile (set_num_threads).
_holders: list[tuple[object, int]] = []
_before: Any = None
_chosen_since: int | None = None


def limit_every(n: int) -> Any:
    """Set every BLAS loaded to ``n`` threads, from whichever thread calls; the threadpoolctl
    limiter that restores the counts from before (:func:`restore_every`)."""
    from threadpoolctl import threadpool_limits

    with _in_control():
        return threadpool_limits(limits=n, user_api="blas")


def restore_every(limiter: Any) -> None:
    """Put back the counts from before :func:`limit_every` made ``limiter``."""
    with _in_control():
        limiter.restore_original_limits()


@contextlib.contextmanager
def _in_control() -> Iterator[None]:
    """Let the calling thread set a pthreads OpenBLAS's count through threadpoolctl.

    threadpoolctl (3.8 here) lets one thread at a time set such a count, its "controlling
    thread": the first to set one, until it exits or its ``with threadpool_limits()`` block
    ends. Elsewhere the call silently did nothing: ``set_num_threads(1)`` in the main
    thread, then ``set_num_threads(2)`` (or ``intraop_threads=2``) in another left BLAS at 1;
    two runtimes in two threads restored nothing from the second. The count is the
    process's, and these calls are the program's own: the calling thread takes control for
    the call, and gives it up after (a ``with threadpool_limits()`` block still open in
    another thread takes it back to restore its counts). Older threadpoolctl versions have
    no controlling thread.
    """
    import threadpoolctl

    clear = getattr(getattr(threadpoolctl, "OpenBLASController", None), "clear_controlling_thread",
                    None)  # fmt: skip
    if clear is not None:
        clear(force=True)
    try:
        yield
    finally:
        if clear is not None:
            clear()  # (only if this thread still controls it)


def hold(owner: object, n: int) -> None:
    """The runtime ``owner`` chose ``n`` intra-op threads and opens: every BLAS loaded gets
    ``n`` (as ``set_num_threads`` sets them) until it closes (:func:`unhold`).

    The counts are process-wide and runtimes close in any order (runtimes in two threads):
    each one restoring the counts it found when it opened, the second found the first's and
    put it back after the first had restored the original, for good. So the first to open
    keeps the counts from before, the last to close puts them back, and one closing between
    leaves the latest open one's count. While any is open no runtime adapts BLAS's count
    (``_blas.acquire``): a governor running stops, putting BLAS's own count back first (the
    count the last one restores: it restored the governor's 1, once the governor had
    stepped aside from the chosen count); once the last closes, governed runtimes still
    open adapt it again (``_blas.resume``).
    """
    global _before, _chosen_since
    with _lock:
        first = not _holders
        _holders.append((owner, n))  # (first: a governor starting now sees it, see acquire)
        try:
            if first:
                _blas.stop(restore=True)
                _before, _chosen_since = limit_every(n), None
            else:
                limit_every(n)
        except BaseException:  # (the runtime does not open: it holds nothing)
            _holders.pop()
            raise


def unhold(owner: object) -> None:
    """The runtime ``owner`` that :func:`hold` a count closes: the latest open one's count
    where it was the latest, else nothing changes; the last one puts back the counts from
    before the first (or the count the program chose since)."""
    global _before, _chosen_since
    with _lock:
        index = next((i for i, (o, _) in enumerate(_holders) if o is owner), None)
        if index is None:
            return
        _, n = _holders.pop(index)
        if _holders:
            latest = _holders[-1][1]
            if index == len(_holders) and latest != n:
                limit_every(latest)
            return
        before, chosen, _before, _chosen_since = _before, _chosen_since, None, None
        if chosen is not None:
            limit_every(chosen)
        elif before is not None:
            restore_every(before)
            _blas.resume()  # governed runtimes still open are governed again


def held() -> bool:
    """Whether an open runtime chose the intra-op count (:func:`hold`)."""
    return bool(_holders)


def chosen(n: int) -> None:
    """The program chose ``n`` intra-op threads (``set_num_threads``) while runtimes that
    chose theirs are open: the last of them to close leaves ``n``, not the count from
    before."""
    global _chosen_since
    with _lock:
        if _holders:
            _chosen_since = n


def _after_fork_in_child() -> None:
    """In a child made by ``os.fork()``: no runtime is open here, so none holds a count: the
    counts from before the first that held one back (as ``_blas`` puts BLAS's own back),
    the lock free."""
    global _before, _chosen_since
    _lock._at_fork_reinit()  # type: ignore[attr-defined]
    before, chosen, _before, _chosen_since = _before, _chosen_since, None, None
    _holders.clear()
    with contextlib.suppress(Exception):  # (threadpoolctl failing in the child: leave it)
        if chosen is not None:
            limit_every(chosen)
        elif before is not None:
            restore_every(before)


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
