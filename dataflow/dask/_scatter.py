"""The arrays scattered to the cluster (:class:`Scattered`), and which of a task's arguments
to scatter (:func:`scattered_arrays`).

numpy arrays of at least ``scatter_bytes`` among a task's arguments (client-side values
included) are scattered once per runtime and found again by identity: a weakref checks that
the array is still the same object (an array is treated as immutable once passed to an op),
and a future that is no longer ``"finished"`` means the array was lost with its worker, so it
is sent again. The keys of the arrays held are kept too, to recognise them among what a lost
worker held (``_revive``); an entry and its key go with its array. Plain data and a pure walk
of the arguments; the scattering itself (``client.scatter``) is ``_ship``'s.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from .._task import DONE, Pending
from .._walk import leaves

__all__ = ["Scattered", "scattered_arrays"]


class Scattered:
    """numpy arrays scattered to the cluster, by identity: each is sent once per runtime."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[Any], Any]] = {}
        # The keys of the arrays held (to recognise them among what lost workers held).
        self.keys: set[str] = set()
        self.sent = 0
        self.bytes_sent = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, arr: np.ndarray[Any, Any]) -> Any:
        """The future of ``arr`` on the cluster; None if it was not sent, or was lost there
        (with its worker: scattered data is not recomputable, so it must be sent again)."""
        entry = self._entries.get(id(arr))
        if entry is not None and entry[0]() is arr and entry[1].status == "finished":
            return entry[1]
        return None

    def put(self, arr: np.ndarray[Any, Any], future: Any) -> None:
        key = id(arr)
        entries = self._entries
        keys = self.keys
        scattered = future.key

        def forget(_: Any, key: int = key) -> None:
            entry = entries.get(key)
            if entry is not None and entry[0]() is None:
                del entries[key]
                # (a long-lived runtime scattering each request's input kept every key)
                keys.discard(scattered)

        self._entries[key] = (weakref.ref(arr, forget), future)
        keys.add(scattered)
        self.sent += 1
        self.bytes_sent += arr.nbytes

    def clear(self) -> None:
        self._entries.clear()
        self.keys.clear()


def scattered_arrays(args: Any, kwargs: Any, threshold: int) -> list[np.ndarray[Any, Any]]:
    """The numpy arrays to scatter among a task's arguments (client-side values included)."""
    out: list[np.ndarray[Any, Any]] = []
    stack: list[Any] = [args, kwargs] if kwargs else [args]
    while stack:
        for v in leaves(stack.pop()):
            if isinstance(v, Pending):
                if v._t.state == DONE:
                    stack.append(v.result())
            elif isinstance(v, np.ndarray) and v.nbytes >= threshold:
                out.append(v)
    return out
