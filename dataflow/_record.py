"""Span recorders: one compact record per task, written by the scheduler when the task ends.

A :class:`Recorder` attached to a runtime (``rt.add_instrument(rec)``) or to the process
(``dataflow.add_instrument(rec)``, or ``dataflow.profile()``) receives, per task that ran, one
tuple: its id, op, output spec, cost, the ids of its inputs, the thread it ran on, and when it
became ready, started and ended. Forked coroutines and waits give one record each too, and a
task that failed or was cancelled before running bumps a counter. That is all the profiler
needs (``Recorder.trace()`` turns the records into a :class:`~dataflow._trace.Trace`, whose
summary, op table and Chrome/Perfetto export are ``_summary``'s and ``_tracewrite``'s), and it
costs the runtime two clock reads and a list append per task instead of a Python call per
event.

**Bounded.** ``Recorder(max_spans=N)`` keeps the last N task records (a ring buffer), and
``max_seconds=T`` drops records older than T seconds; either way memory stays bounded, so a
server can keep a recorder on for hours and dump what it holds when asked
(:meth:`Recorder.dump`: a trace file of the buffer as it is, the recorder going on).
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ._errors import DataflowError, DataflowTypeError, DataflowValueError
from ._trace import Span, TaskSpan, Trace, describe_spec, thread_label
from ._tracewrite import save

if TYPE_CHECKING:
    from ._task import Task

__all__ = ["Recorder"]

# Task record fields, by position. SIG names the op's Signature (shared by every call with the
# same argument signature: name, spec and cost are read from it when the trace is built): its
# int ``rid`` (see ``NAMED``), the Signature itself, or a str (a record made by hand). INPUTS
# is the input task's id (one input) or a tuple of ids.
ID, SIG, INPUTS, THREAD, READY, START, END, FAILED = range(8)

# The signatures that records name by int. A record that holds only ints is not tracked by the
# garbage collector (it is untracked at the first collection it meets), so a long trace costs
# the collector nothing; a record holding the Signature object would be walked again at every
# collection of its generation: about as much as the rest of recording a tiny op. Signatures
# are few (the ops' signature caches are bounded), but this table keeps them alive: past
# ``_MAX_NAMED`` of them, records hold the Signature itself.
NAMED: dict[int, Any] = {}
_MAX_NAMED = 1 << 14
_next_rid = itertools.count(1).__next__


def name_signature(sig: Any) -> Any:
    """What stands for ``sig`` in a record: its int ``rid`` (given now if it has none), or the
    Signature itself once ``NAMED`` is full."""
    rid: int = sig.rid
    if rid:
        return rid
    if len(NAMED) >= _MAX_NAMED:
        return sig
    rid = sig.rid = _next_rid()
    NAMED[rid] = sig
    return rid


def signature_of(field: Any) -> Any:
    """The Signature (or hand-made str) a record's SIG field stands for."""
    return NAMED[field] if type(field) is int else field


def input_ids(field: Any) -> tuple[int, ...]:
    """A record's INPUTS field as a tuple of task ids."""
    return (field,) if type(field) is int else field


# Outcome flags of a task record.
OK, FAILED_RUN = 0, 1
_FIELDS = 8


class FlatRecords:
    """The task records of an unbounded recorder, kept flat: the fields of every record one
    after the other in one list, so the scheduler's ``list.extend(record)`` keeps no tuple
    per task (a kept tuple was the largest part of what a profile cost a tiny op: the
    memory, and the collector's passes until the tuple is untracked). Reads as a sequence
    of record tuples: ``len``, iteration (of the records there when it began), ``append``.
    """

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data: list[Any] = []

    def __len__(self) -> int:
        return len(self.data) // _FIELDS

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        data = self.data
        stop = len(data) - len(data) % _FIELDS  # (extend is atomic: never a part record)
        return (tuple(data[i : i + _FIELDS]) for i in range(0, stop, _FIELDS))

    def append(self, record: tuple[Any, ...]) -> None:
        """Add one record (a tuple of the 8 fields)."""
        self.data.extend(record)

    def __repr__(self) -> str:
        return f"<FlatRecords {len(self)}>"


#: The longest age bound a recorder takes (``max_seconds``), in ns: about 292 years, the most a
#: signed 64-bit count of ns holds (``time.perf_counter_ns`` differences).
_MAX_WINDOW_NS = (1 << 63) - 1

#: The lane label of each thread that wrote an inline run's span record (its native id ->
#: ``thread_label()`` at first sight, ``note_thread``): such a record carries the native id
#: only, and the thread may have ended by the time the trace is built (each run's pool).
LABELS: dict[int, str] = {}
_MAX_LABELS = 4096


def note_thread(native: int) -> None:
    """Remember the calling thread's lane label under its native id (``LABELS``)."""
    if len(LABELS) >= _MAX_LABELS:
        LABELS.clear()
    LABELS[native] = thread_label()


#: The calling thread's native id once :func:`native_here` has run on it (``HERE.native``).
HERE = threading.local()


def native_here() -> int:
    """The calling thread's native id, kept in :data:`THREAD` (``get_native_id()`` is a system
    call; a thread-local, unlike a ``get_ident()`` key, dies with its thread, whose ident Python
    may give a later thread), its lane label noted (:func:`note_thread`): an inline run's span
    record names its thread by native id only. The scheduler reads ``HERE.native`` first."""
    native = HERE.native = threading.get_native_id()
    note_thread(native)
    return native


class Recorder:
    """Keeps span records of the tasks run while attached (see the module docstring).

    Args:
        max_spans: keep at most this many task records (the last ones); None: all.
        max_seconds: keep only records that ended in the last this many seconds; None: all.

    Example:
        >>> rec = dataflow.Recorder(max_seconds=60)      # the last minute, always
        >>> rt.add_instrument(rec)                      # one runtime (a server's)
        >>> rec.dump("last-minute.json")                # on demand: ui.perfetto.dev
    """

    def __init__(self, *, max_spans: int | None = None, max_seconds: float | None = None) -> None:
        if max_spans is not None:
            if isinstance(max_spans, bool) or not isinstance(max_spans, int | np.integer):
                raise DataflowTypeError(
                    f"Recorder(max_spans=) must be a positive int or None, got "
                    f"{type(max_spans).__name__}: {max_spans!r}"
                )
            max_spans = int(max_spans)
            if max_spans < 1:
                raise DataflowValueError(
                    f"Recorder(max_spans=) must be a positive int or None, got {max_spans!r}"
                )
        if max_seconds is not None:
            if isinstance(max_seconds, bool) or not isinstance(
                max_seconds, int | float | np.integer | np.floating
            ):
                raise DataflowTypeError(
                    f"Recorder(max_seconds=) must be a number of seconds or None, got "
                    f"{type(max_seconds).__name__}: {max_seconds!r}"
                )
            if not max_seconds > 0:
                raise DataflowValueError(f"Recorder(max_seconds=) must be > 0, got {max_seconds!r}")
            if max_seconds == math.inf:  # no age bound: as None
                max_seconds = None
            else:
                max_seconds = float(max_seconds)
                if max_seconds * 1e9 > _MAX_WINDOW_NS:
                    raise DataflowValueError(
                        f"Recorder(max_seconds=) must be at most {_MAX_WINDOW_NS / 1e9:g} "
                        f"seconds (or math.inf or None: no age bound), got {max_seconds!r}"
                    )
        self.max_spans = max_spans
        self.max_seconds = max_seconds
        self._window = None if max_seconds is None else int(max_seconds * 1e9)
        # Unbounded: flat (FlatRecords); bounded: a deque of tuples (a ring buffer, or
        # trimmed by age). ``_sink`` adds one record: what the scheduler calls per task.
        self.tasks: collections.deque[tuple[Any, ...]] | FlatRecords
        if max_spans is None and max_seconds is None:
            self.tasks = FlatRecords()
            self._sink: Callable[[tuple[Any, ...]], None] = self.tasks.data.extend
        else:
            self.tasks = collections.deque(maxlen=max_spans)
            self._sink = self.tasks.append
        self.spans: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=max_spans)
        self.unrun_failed = 0
        self.unrun_cancelled = 0
        self.threads: dict[int, str] = {}
        # The calling thread's native id, once registered (a thread-local: a get_ident() key
        # would be inherited by a later thread, which Python gives the ident of one that
        # ended, and that thread's tasks then showed on the old thread's lane and label).
        self._local = threading.local()
        self._appends = 0
        self._trimming = threading.Lock()
        self.t0 = time.perf_counter_ns()
        self.t1 = 0

    def __repr__(self) -> str:
        bound = []
        if self.max_spans is not None:
            bound.append(f"max_spans={self.max_spans}")
        if self.max_seconds is not None:
            bound.append(f"max_seconds={self.max_seconds:g}")
        return f"<Recorder tasks={len(self.tasks)} {' '.join(bound) or 'unbounded'}>"

    # -- recording (called by the runtime; keep these short) --------------------------------

    def thread(self) -> int:
        """The calling thread's native id, registering its label on first sight."""
        native: int | None = getattr(self._local, "native", None)
        if native is None:
            native = threading.get_native_id()
            label = thread_label()
            if label == "loop" and "loop" in self.threads.values():  # a second event loop
                label = f"loop ({threading.current_thread().name})"
            self.threads[native] = label
            self._local.native = native
        return native

    def task(
        self,
        task: Task,
        ready: int,
        start: int,
        end: int,
        failed: bool,
        inputs: tuple[Task, ...] | None = None,
    ) -> None:
        """One task ran on the calling thread (times: ``time.perf_counter_ns``); ``inputs``
        when the task record does not hold them (an inline run's lean record)."""
        if inputs is None:
            inputs = task.inputs
        native = getattr(self._local, "native", None)
        if native is None:
            native = self.thread()
        sig = task.sig
        self._sink(
            (
                task.id,
                sig.rid or name_signature(sig),
                (inputs[0].id if len(inputs) == 1 else tuple([t.id for t in inputs]))
                if inputs
                else (),
                native,
                ready or start,
                start,
                end,
                failed,
            )
        )
        if self._window is not None:
            self._appends += 1
            if not self._appends & 255:
                self.trim(end)

    def unrun(self, cancelled: bool) -> None:
        """A task failed (an input failed) or was cancelled without running."""
        if cancelled:
            self.unrun_cancelled += 1
        else:
            self.unrun_failed += 1

    def span(self, kind: str, name: str, start: int, end: int, parent: str | None) -> None:
        """A forked coroutine's lifetime, or a wait, ended on the calling (loop) thread."""
        self.spans.append((kind, name, self.thread(), start, end, parent))

    def trim(self, now: int) -> None:
        """Drop the records that ended before ``now`` minus ``max_seconds``."""
        assert self._window is not None
        oldest = now - self._window
        tasks = self.tasks
        assert isinstance(tasks, collections.deque)  # (windowed: never flat)
        # One trim at a time: the pool's threads trim as they record, and a dump on another
        # thread. Two at once could both see the same old record first, and the second's
        # popleft then took a fresh one, or (the buffer emptied) raised IndexError, which
        # switched the recorder off.
        with self._trimming:
            while tasks and tasks[0][END] < oldest:
                tasks.popleft()
            spans = self.spans
            while spans and spans[0][4] < oldest:
                spans.popleft()

    # -- results ----------------------------------------------------------------------------

    def trace(self) -> Trace:
        """What the recorder holds now, as a :class:`~dataflow._trace.Trace`."""
        stop = self.t1 or time.perf_counter_ns()
        if self._window is not None:
            self.trim(stop)
        tasks = list(self.tasks)
        threads = dict(self.threads)
        unnamed = {rec[THREAD] for rec in tasks} - threads.keys()
        if unnamed:  # an inline run's record names its thread by native id only
            alive = {t.native_id: t.name for t in threading.enumerate()}
            for native in unnamed:
                threads[native] = LABELS.get(native) or alive.get(native, f"thread {native}")
        return build(
            tasks,
            list(self.spans),
            threads,
            self.t0,
            stop,
            self.unrun_failed,
            self.unrun_cancelled,
        )

    def dump(self, path: str | os.PathLike[str]) -> Trace:
        """Write what the recorder holds as a Chrome trace file (it keeps recording)."""
        trace = self.trace()
        if not trace.tasks and not trace.spans:
            raise DataflowError(f"{self!r} holds nothing to dump: is it attached to a runtime?")
        save(trace, path)
        return trace


def build(
    tasks: list[tuple[Any, ...]],
    spans: list[tuple[Any, ...]],
    threads: dict[int, str],
    t0: int,
    stop: int,
    unrun_failed: int = 0,
    unrun_cancelled: int = 0,
) -> Trace:
    """A Trace from task and span records (times in ns since ``t0``)."""
    stop -= t0
    by_id: dict[int, TaskSpan] = {}
    inputs: dict[int, tuple[int, ...]] = {}
    for rec in tasks:
        sig = rec[SIG]
        if type(sig) is int:
            sig = NAMED[sig]
        op = sig if type(sig) is str else sig.name  # a str: a record made by hand
        args = describe_spec(getattr(sig, "spec", None))
        cost = getattr(sig, "cost", None)
        if cost is not None:
            args["flops"] = cost[0]
            args["bytes"] = cost[1]
        task_id = rec[ID]
        start = rec[START] - t0
        by_id[task_id] = TaskSpan(
            f"{op}#{task_id}",
            op,
            rec[THREAD],
            start,
            rec[END] - t0,
            min(rec[READY] - t0, start),
            (),
            args,
            bool(rec[FAILED]),
        )
        if rec[INPUTS]:
            inputs[task_id] = input_ids(rec[INPUTS])
    for task_id, ids in inputs.items():  # inputs that ran before recording have no op
        by_id[task_id].inputs = tuple(by_id[i].name if i in by_id else f"?#{i}" for i in ids)
    out_spans = [
        Span(kind, name, thread, start - t0, end - t0, parent)
        for kind, name, thread, start, end, parent in spans
    ]
    ordered = sorted(by_id.values(), key=lambda t: (t.start, t.id))
    return Trace(
        tasks=ordered,
        threads=threads,
        spans=sorted(out_spans, key=lambda s: s.start),
        wall=max([stop] + [t.end for t in ordered]),
        pid=os.getpid(),
        unrun_failed=unrun_failed,
        unrun_cancelled=unrun_cancelled,
    )
