"""The lean plan executor: a launched plan's nodes run by a few *runners*, not one task each.

A plan's nodes are known in advance, so running them needs none of what eager dispatch pays
for per op (a task record, a handle, a trip through the pool's queue and the graph lock). A
:class:`LeanRun` keeps one launch's state as plain lists indexed by node: the values, how
many inputs each node still waits for, how many readers each value still has, and a heap of
ready nodes ordered by the static critical-path rank. A *runner* (a pool task whose kernel is
:meth:`LeanRun.work`) pops the best ready node, runs its kernel, and, under the run's own lock,
marks the readers whose last input this was ready and drops the values nobody reads any more;
then it goes on with the next ready node. So a plan of small ops runs back to back on one
thread, as the same numpy code run plainly would, at well under a microsecond of scheduling
per node (``python -m benchmarks --only overhead``, the plan row). (A short plan that would run
on the launching thread anyway skips all of this: ``_here.run_here``.)

Parallelism and fairness, decided between nodes:

* **More runners only for work that can use them.** While ready work waits that is big (its
  signature's measured kernel time is over the runtime's inline threshold) and not GIL-bound
  (not ``Signature.serial``, and its kernels keep their thread on a CPU while others run:
  ``Signature.cpu_share`` at least ``SPAWN_CPU_SHARE``, 0.5; a kernel waiting for the GIL is
  off the CPU, 0.05 of the time for 16 GIL-bound ones side by side), and the run has fewer
  runners than the pool has threads, a runner
  queues another runner on the pool; a runner whose heap is empty ends. Small or GIL-bound
  work stays on the thread that has it: elsewhere it would only take turns for the GIL.
* **The oldest request first.** A runner's pool entry carries the run's priority (the
  request's age). When the pool's queue holds older work and no worker is idle, the runner
  queues a runner in its place and ends, so a long plan cannot hold a thread against an
  older request (``dataflow._scheduler``, "Ready order, and requests").
* **Cancellation.** The run ends, dropping the nodes not started, when its request is
  cancelled (its gather task is dropped: ``dataflow._scheduler``, "Work belongs to whoever
  still wants it") or the runtime is closing; awaiting it raises
  :class:`~dataflow.CancelledTaskError`.
* **Failures.** A kernel that raises ends the run: the gather task fails with a
  :class:`~dataflow.TaskError` naming the node (its op, its index in the graph, and where it
  was traced), chained to the original exception.

Kernel times are sampled as the scheduler samples them (the first runs of a signature, then
one in ``SAMPLE``; on a pool thread a sampled run also measures the GIL, and so does every run
of a kernel longer than ``MIN_MEASURED``, 50 us: a GIL-bound node is then known as such, and
gets no second runner), and a kernel's value
is checked against its meta rule on those same runs: a plan's shapes are fixed, so its first
runs show a kernel that breaks its meta rule.

**Timelines.** While recorders observe the runtime (``dataflow.profile()``, a server's rolling
``Recorder``), each node gives them the span record an eager op would (its id, op, inputs,
thread, start and end), and dropped or failed-unrun nodes are counted, so a profile of a
compiled forward shows every node at two clock reads and a tuple a node. An instrument with
hooks (events per task) sees tasks, so while one observes, a launch creates one task per node
instead (``_planrun.PlanRun``). Whether a launch records is decided when it is launched.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._errors import CancelledTaskError, task_failed
from .._instrument import GENERATION
from .._pool import GRAPH_LOCK
from .._protect import thaw
from .._record import name_signature
from .._scheduler._placement import FIRST_RUNS, MIN_MEASURED, SAMPLE, SPAWN_CPU_SHARE
from .._task import PENDING, READY, Task, _next_id
from ._ir import map_refs
from ._slots import NODE, NODE_OUT, output_value, ref_value

if TYPE_CHECKING:
    from .._runtime import Runtime
    from ._launch import Program

__all__ = ["LeanRun"]

_heappush = heapq.heappush
_heappop = heapq.heappop
_now = time.perf_counter_ns
get_native_id = threading.get_native_id


class LeanRun:
    """One launch of a program on the lean executor (see the module docstring)."""

    __slots__ = (
        "base",
        "gather",
        "ids",
        "inputs",
        "ins",
        "left",
        "lock",
        "prog",
        "ready",
        "record",
        "rt",
        "runners",
        "stopped",
        "todo",
        "values",
        "waiting",
    )

    def __init__(
        self, prog: Program, rt: Runtime, gather: Task, base: float, record: bool = False
    ) -> None:
        self.prog = prog
        self.rt = rt
        self.gather = gather
        self.inputs: Sequence[Any] = gather.args  # type: ignore[assignment]
        self.base = base
        # Made by the first runner (the launching thread's work stays O(1)).
        self.values: list[Any] = []
        self.waiting: list[int] = []
        self.left: list[int] = []
        self.ready: list[int] = []
        self.lock = threading.Lock()
        self.runners = 0
        self.todo = prog.size
        self.stopped = False
        self.record = record
        # Recording only: per node, the id its span record carries, and its inputs' ids.
        self.ids: list[int] = []
        self.ins: list[Any] = []

    def __repr__(self) -> str:
        return (
            f"<LeanRun {self.prog.graph.name} left={self.todo}/{self.prog.size} "
            f"runners={self.runners}>"
        )

    # -- runners -------------------------------------------------------------------------------

    def runner_locked(self) -> Task:
        """A new runner task, READY, counted in flight (queue it or run it). Holds GRAPH_LOCK."""
        rt = self.rt
        task = Task(self.prog.runner_sig, self.work, (), None, rt)
        task.priority = self.base
        task.state = READY
        task.dependents = [self.gather]  # if it fails unrun (the runtime closing), so does the run
        rt._sched.inflight += 1
        self.runners += 1  # (the run's lock is not needed: every change holds GRAPH_LOCK too)
        return task

    def _spawn(self) -> None:
        """Queue one more runner on the pool (big work is ready that this thread cannot take)."""
        pool = self.rt._sched.pool
        assert pool is not None
        with GRAPH_LOCK:
            if self.stopped or self.runners >= pool.num_threads:
                return
            pool.push_locked(self.runner_locked())

    def _yield(self) -> None:
        """Older work waits for a thread: queue a runner in this one's place (it then ends)."""
        pool = self.rt._sched.pool
        assert pool is not None
        with GRAPH_LOCK:
            self.runners -= 1
            if not self.stopped:
                pool.push_locked(self.runner_locked())

    def work(self) -> None:
        """A runner: run ready nodes until none is left (the kernel of a runner task)."""
        prog = self.prog
        if self.todo == prog.size and not self.values and not self.stopped:  # the first runner
            if not prog.size:
                self._finish()
                return
            self.values = [None] * prog.size
            self.waiting = list(prog.waits)
            self.left = list(prog.nreaders)
            self.ready = list(prog.root_keys)  # sorted: a valid heap
            if self.record:
                ids = self.ids = [_next_id() for _ in range(prog.size)]
                # Per node, its span record's inputs field (as an eager op's record has it).
                self.ins = [
                    (ids[r[0]] if len(r) == 1 else tuple([ids[j] for j in r])) if r else ()
                    for r in prog.inputs
                ]
        sched = self.rt._sched
        pool = sched.pool
        heap = pool._heap if pool is not None else None
        idle = pool._idle if pool is not None else None
        threads = pool.num_threads if pool is not None else 1  # (no second runner without one)
        threshold = sched.inline_threshold
        kernels = prog.kernels
        sigs = prog.sigs
        slots_of = prog.slots
        args_of = prog.args
        readers_of = prog.readers
        inputs_of = prog.inputs
        rank = prog.rank
        by_rank = prog.by_rank
        is_output = prog.is_output
        values = self.values
        waiting = self.waiting
        left = self.left
        ready = self.ready
        inputs = self.inputs
        gather = self.gather
        base = self.base
        lock = self.lock
        record = self.record
        if record:
            native = self._thread()
            ids = self.ids
            ins = self.ins
            appends = sched._appends
            windowed = sched._windowed
            gen = sched._sinks_gen
        lock.acquire()
        while True:
            if not ready or self.stopped:
                lock.release()
                with GRAPH_LOCK:
                    self.runners -= 1
                return
            i = by_rank[_heappop(ready)]
            more = ready and self.runners < threads and _big(ready, by_rank, sigs, threshold)
            lock.release()
            if gather.state != PENDING or sched.cancelling:
                self._stop(None, taken=1)  # (node i was taken, and is not run)
                return
            if more:
                self._spawn()
            slots = slots_of[i]
            if slots is None:
                args = map_refs(args_of[i], self._value)
                kwargs = prog.kwargs[i]
                if kwargs:
                    kwargs = map_refs(kwargs, self._value)
            else:
                args = list(args_of[i])
                for pos, kind, src, index in slots:
                    if kind == NODE:
                        args[pos] = values[src]
                    elif kind == NODE_OUT:
                        args[pos] = values[src][index]
                    else:
                        args[pos] = inputs[src]
                kwargs = None
            sig = sigs[i]
            fn = kernels[i]
            n = sig.calls = sig.calls + 1
            sampled = n <= FIRST_RUNS or not n % SAMPLE
            if record:
                start = _now()
            try:
                # On the pool a sampled run, and every run of a long kernel, measures the GIL.
                if pool is not None and (sampled or sig.seconds >= MIN_MEASURED):
                    value = sched._measured(sig, fn, args, kwargs)
                elif sampled:
                    value = sched._timed(sig, fn, args, kwargs)
                else:
                    value = fn(*args, **kwargs) if kwargs else fn(*args)
                if sampled and sig.check is not None:
                    sig.check_value(value)
            except BaseException as exc:
                if record:
                    self._record(i, native, start, _now(), True)
                self._stop(task_failed(prog.node_name(i), sig.name, exc))
                return
            if record:
                end = _now()
                if GENERATION[0] != gen:  # the recorders changed
                    sched.sinks()
                    appends = sched._appends
                    windowed = sched._windowed
                    gen = sched._sinks_gen
                span = (ids[i], sig.rid or name_signature(sig), ins[i], native, start, start, end,
                        False)  # fmt: skip
                for append in appends:
                    append(span)
                if windowed:  # windowed recorders forget the old records, every 256th
                    # (counted per runtime, as ``_record_inline`` counts: a count per runner
                    # call never reached 256 on a plan of a few nodes, so nothing was trimmed)
                    n = sched._recorded = sched._recorded + 1
                    if not n & 255:
                        for rec in windowed:
                            rec.trim(end)
            args = None
            lock.acquire()
            values[i] = value
            for j in readers_of[i]:
                w = waiting[j] - 1
                waiting[j] = w
                if not w:
                    _heappush(ready, rank[j])
            for j in inputs_of[i]:
                w = left[j] - 1
                left[j] = w
                if not w and not is_output[j]:
                    values[j] = None
            value = None
            self.todo -= 1
            if not self.todo:
                lock.release()
                self._finish()
                return
            if heap and heap[0][0] < base and not idle:
                # Older work waits for a thread: give this one up (the lock is released first).
                lock.release()
                self._yield()
                return

    # -- span records (only while recorders observe) ------------------------------------------

    def _thread(self) -> int:
        """The calling thread's native id, its label registered with every recorder."""
        for _, rec in self.rt._sched.sinks():
            rec.thread()
        return get_native_id()

    def _record(self, i: int, native: int, start: int, end: int, failed: bool) -> None:
        """Node ``i``'s span record, for the recorders (as ``submit`` writes an inline op's;
        the runner's loop writes a successful node's itself)."""
        sched = self.rt._sched
        if GENERATION[0] != sched._sinks_gen:
            sched.sinks()
        sig = self.prog.sigs[i]
        span = (self.ids[i], sig.rid or name_signature(sig), self.ins[i], native, start, start,
                end, failed)  # fmt: skip
        for append in sched._appends:
            append(span)

    def _value(self, ref: Any) -> Any:
        return ref_value(ref, self.inputs, self.prog.constants, self.values.__getitem__)

    def _output(self, ref: Any) -> Any:
        return output_value(ref, self.inputs, self.prog.constants, self.values.__getitem__)

    # -- the end of a run ----------------------------------------------------------------------

    def _finish(self) -> None:
        """Every node ran: build the outputs and finish the gather task (the last runner)."""
        try:
            out = map_refs(self.prog.outputs, self._output)
        except BaseException as exc:  # (an output of the wrong structure: a kernel's fault)
            self._stop(task_failed(self.prog.graph.name, self.prog.graph.name, exc))
            return
        self.values = []
        sched = self.rt._sched
        gather = self.gather
        with GRAPH_LOCK:
            self.runners -= 1
            self.stopped = True
            sched.tasks_run += self.prog.size
            if gather.state != PENDING:  # dropped as the last node ran
                return
            thaw(gather)
            mine = sched.finish_outside_locked(gather, out)
        if mine is not None:  # the synchronous mode: what the outputs made ready runs here
            for task in mine:
                sched.execute(task, go_on=False)

    def _stop(self, err: BaseException | None, taken: int = 0) -> None:
        """End the run early: a kernel failed (``err``), or it was cancelled (None);
        ``taken``: nodes the calling runner took from the ready heap and will not run."""
        sched = self.rt._sched
        gather = self.gather
        with GRAPH_LOCK:
            self.runners -= 1
            if self.stopped:
                return
            self.stopped = True
            self.values = []
            ran = self.prog.size - self.todo
            sched.tasks_run += ran
            unrun = self._never_started() + taken
            if err is None:
                if sched.cancelling and gather.state == PENDING:
                    err = CancelledTaskError(f"{gather.name} was not run: its runtime was closing")
                else:  # dropped with its request: count the nodes that never ran
                    sched.dropped += unrun
            if self.record:
                cancelled = err is None or isinstance(err, CancelledTaskError)
                for _ in range(unrun):
                    sched.record_unrun(cancelled)
            if err is not None and gather.state == PENDING:
                if not isinstance(err, CancelledTaskError):
                    sched.failures.append(err)
                # ran=True: the gather is the run's bookkeeping, not one of its nodes, which
                # are accounted for above (it used to add one more "never ran" to a profile).
                sched._fail_locked(gather, err, ran=True)

    def _never_started(self) -> int:
        """How many nodes no runner took: neither done nor running (another runner's node
        still runs, and gives its span record, after a failure or a cancellation ends the
        run; the failed node ran). Called once, when the run stops."""
        if not self.waiting:  # no runner began: nothing started
            return self.prog.size
        with self.lock:
            return len(self.ready) + sum(1 for w in self.waiting if w)


def _big(ready: list[int], by_rank: list[int], sigs: Sequence[Any], threshold: float) -> bool:
    """Whether the best ready nodes (the heap's top three) hold big, GIL-free work: a kernel
    over the inline threshold, not serial, and keeping its thread on a CPU beside others
    (``Signature.cpu_share``: a GIL-bound kernel waits off the CPU)."""
    for k in range(min(len(ready), 3)):
        sig = sigs[by_rank[ready[k]]]
        if sig.seconds >= threshold and not sig.serial and sig.cpu_share >= SPAWN_CPU_SHARE:
            return True
    return False
