"""The Dask backend: the same program, its ops run as tasks on a ``distributed`` cluster.

``dataflow.Runtime(backend="dask", address="tcp://host:8786")`` (or ``client=``, or
``dataflow run --dask ADDRESS``) runs ops on the cluster; see :mod:`dataflow.dask._backend`
for the placement policy and docs/dask.md for how to use it. Importing this package registers
the ``"dask"`` backend (``Runtime(backend="dask")`` imports it by name). The worker side
(``_worker``) is apart from the client side (``_backend``): workers import only it.
"""

from __future__ import annotations

from .._backend import register_backend as _register_backend
from ._backend import DaskBackend as DaskBackend
from ._backend import place as place
from ._lost import WorkerLostError as WorkerLostError
from ._worker import Call as Call
from ._worker import KernelFailed as KernelFailed
from ._worker import Ref as Ref
from ._worker import fill as fill
from ._worker import run_op as run_op

_register_backend("dask", DaskBackend)

del annotations  # the `from __future__` feature, not part of the API (dir())

__all__ = (
    "Call",
    "DaskBackend",
    "KernelFailed",
    "Ref",
    "WorkerLostError",
    "fill",
    "place",
    "run_op",
)
