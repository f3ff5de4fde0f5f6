"""The local scheduler: where each task runs, and when. Its policy:

* **Dispatch returns at once.** Calling an op (or forking a plain function) creates a task
  and returns a pending handle; the meta and cost rules ran once for the call's signature
  (``_op``), so a repeated call costs a dictionary lookup plus what follows.
* **Small work runs where it is needed; big work goes to the pool.** Each op signature's
  kernel time is estimated from its cost rule, then measured (a running average of sampled
  runs, ``Signature.seconds``), as TensorFlow's executor splits inexpensive from expensive
  kernels. A kernel faster than the *inline threshold* (default 50 us, about what handing a
  task to another thread and back costs on a 2-vCPU VM) is not worth a hand-off, and in
  CPython it would hold the GIL anyway (numpy releases the GIL only in BLAS calls and in
  loops over large arrays), so running it elsewhere buys no parallelism:

  - a small task whose inputs are ready runs inline on the dispatching thread;
  - a small task that waits for inputs runs on the thread that finishes its last input,
    right after it: chains of small ops run back to back on one thread, with no wake-up.
    Except while the loop is dispatching work that waits (its last such dispatch under
    ``_placement.HANDBACK_SECONDS``, 50 us, ago): then a worker hands the small task back
    to the loop, which runs it (and the small work it makes ready) at its next such dispatch,
    or in a drain posted to it. A chain of tiny ops dispatched behind a big one had the
    worker run it while the loop dispatched the rest: the two took turns on the GIL and the
    graph lock at every op, and the chain never caught up (100,000 ``ops.add`` behind a
    matmul: 14.5 us an op, against 2.7 us with the hand-back, which lets the loop's next
    dispatch find its input done and run inline);
  - an awaited task that is queued and not started is run by the awaiting thread itself
    instead of waiting for a worker, if it is small or expected under 1 ms
    (``_placement.AWAIT_HERE_SECONDS``, the longest it holds the event loop for): the loop
    would only wait meanwhile, and it saves two wake-ups (the worker's, then the loop's:
    ~60-70 us together on a 2-vCPU VM). To make that likely, a task under 1 ms dispatched
    by the loop wakes no worker at once: the wake-up is posted to the loop, to run when the
    current callback ends (the coroutine awaits, or returns), and then wakes a worker for
    each ready task; a loop that goes on dispatching such tasks for over
    ``_placement.QUIET_SECONDS`` (1 ms) wakes them at its next one, and one that awaits
    wakes them at once for all the queued tasks but one (which it may run itself, beside
    them: the tutorial ensemble's first forward otherwise ran its directions one after
    another on the loop, helping, while the workers slept). A worker woken while
    the loop dispatches waits for the GIL the loop holds at every step of its kernel that
    needs it: the numba engine's (50, 1, 128) ensemble, its eight direction kernels woken
    from the second on, had one kernel of 0.35 ms take 2.3 ms and the loop dispatch in
    0.9 ms instead of 0.4. Code that awaits each op as it
    goes (a single LSTM at (10, 1, 32), one op of 65 us a call) went from 2.2x plain
    numpy's time to 1.4x; a worker woken anyway only took the GIL from the kernel running
    on the loop. A kernel's first timed run, which pays one-off costs (calibration, cold
    caches), is replaced by its second where that is faster, so such a kernel is not
    taken for a slow one for hundreds of calls (``_placement.note_seconds``); after that one
    run counts as at most 4x the estimate (``_placement.OUTLIER``: noise only adds time, and
    one preempted sample of a 1 us op had sent a chain of tiny ops to the pool for good).
    Once the loop has run four tasks of a signature in a row this way
    (``_placement.AWAITED_AT_ONCE``:
    the program awaits that op at once), its next calls under 1 ms run inline at dispatch,
    on the small ops' lean path; one call in 256 takes the usual way, and a worker running
    it (the program went on without awaiting it) unlearns the pattern. Measured, the single
    LSTM at (10, 1, 32): 1.4x numpy's time with the steal alone, 1.15x with this (0.95x
    once its kernel made fewer numpy calls: ``python -m benchmarks --only awaited``);
  - the loop awaiting a task that still waits for its inputs runs the queued, not yet
    started tasks it waits for (its ancestors, the first issued first) itself, while they
    fit in that same 1 ms together (``Scheduler._help``, a bounded walk up the pending
    tasks): it would only wait for them meanwhile. Only while at most one request (a task
    on the loop) has deferred work: in a server, the loop helping one request delays every
    other (loop lag max 159 ms at 32 clients, against 21 ms without). Code that awaits
    each module as it goes (``await gru(x)`` at the top level materializes the output: the
    two directions and their concatenation are dispatched, then awaited at once) otherwise
    left both directions to the one worker woken, which ran them one after the other while
    the loop idled; never side by side, they were never measured GIL-bound either, and
    stayed there: 2.3x numpy's time at (10, 1, 32), against 1.03x now. What the tasks it
    runs make ready is queued waking workers for all but one (the next it takes, in a
    chain): a worker woken for it found it taken, and took the GIL and a core from the
    loop's kernels meanwhile; a wake-up posted to the loop starts what is left. A task it
    runs while nothing else runs or waits (a chain) counts as awaited at once, as below,
    so the chain's ops then run as they are dispatched: an MLP of (32, 256) ``linear`` and
    ``relu`` layers ran 1.4-1.9x numpy's time on two inter-op threads (1.1x on one),
    1.0-1.1x now. A task measured
    GIL-free, of 100 us or more, it leaves to the pool while the pool has other work
    queued or running (``_placement.leave_to_pool``): the workers keep the cores busy, and
    the loop would only add a thread to share them (the numba engine's (50, 1, 128)
    ensemble on 2 cores: 1.78 ms a forward, against 2.2 ms with the loop running a third
    of the directions). The CPU share that measures it leaves out pool runs beside a kernel
    the loop ran itself (``loop_kernels``): three threads on two cores read GIL-free
    kernels under the mark, and the loop went on taking them;
  - with a single inter-op thread, a ready task under that same 1 ms runs inline at
    dispatch, whatever its GIL use: the lone worker could only start it once the
    dispatching thread lets go of the GIL (when it next waits), so it would run after the
    dispatcher's Python rather than beside it, plus two wake-ups. (Measured, the seed
    ensemble at (10, 1, 32) on one inter-op thread: the first kernel started 440 us after
    it was queued, when the forward's dispatch ended; 1.35 ms a forward before, 0.80 ms
    after, numpy's 0.61 ms.) Longer kernels still go to the worker;
  - a big task goes to the pool. A worker that finishes a task goes on with the first big
    task it made ready (and with every small one), and queues the others for idle workers.

  So more inter-op threads only ever add parallelism for kernels that can use it, and a
  program of small ops runs like the same numpy code run plainly.
* **The GIL lane.** A big kernel can still be GIL-bound: a Python loop of small numpy calls
  (a whole LSTM direction at batch 1) holds the GIL nearly all the time, and two of them on
  two threads only take turns, slower than one after the other. The scheduler measures it:
  each pool integrates the number of kernels running over time, so every pool run of a
  kernel estimated at 25 us or more (shorter runs say nothing: clock resolution, start-up;
  they are sampled like any run) knows how many others overlapped it on average (``o``) and,
  against the signature's best time
  ``b``, how much they slowed it: ``g = (w / b - 1) / o``, near 0 for BLAS and large ufuncs
  (they release the GIL) on free cores, 1 or more for a kernel that holds it. Only time off
  the CPU can have been a wait for the GIL (a waiting thread sleeps), so what the run's
  thread spent on a CPU beyond ``b`` is taken out of ``w`` (a slower core beside a
  neighbour, not the GIL: the numba engine's GIL-free loops read ``g`` 1.2-1.6 that way in
  some processes and were run one after another). Two such
  kernels side by side give ``2 / (1 + g)`` times the throughput of one after the other;
  once the median over its last 12 to 16 overlapped runs passes 1.15 (under 0.93x the
  throughput: the noise of a shared machine blurs the break-even) a signature is *serial*:
  its kernels take the pool's GIL lane, one at a time (the thread holding the lane runs the
  next waiting one when it ends), while GIL-free kernels keep running in parallel beside it.
  One run in 256 of a serial signature skips the lane to measure again; under 0.85 the
  mark is lifted. (A serial kernel run on the dispatching thread counts among the pool's
  running kernels while it runs, as a pool run does, so a probe beside it reads the overlap:
  most of a serial signature's runs happen there, and a probe that saw none measured
  nothing.) On many cores every run can be contended, its best time too, and ``g`` then
  reads low for kernels that only take turns (16 GIL-bound LSTM directions on 16 cores: g =
  0.1, each 20x slower than alone); so a run beside two or more others on a machine of four
  or more cores also reads the process's CPU time: GIL-bound kernels keep the process on
  about one core however many run (1.4-2.3 measured on a 16-core VM, where taking turns
  costs CPU time), and a run whose process used under 30% of the extra cores it could have
  counts as past the serial mark (``_placement.parallel_gil``); the higher of the two estimates
  counts. Only a wait for the GIL counts: the run's thread must have blocked (its voluntary
  context switches; a GIL-free thread starved of cores by other processes is preempted
  instead), run at least a quarter of an even share, and the process must have been busy
  (kernels that sleep or wait for I/O beside each other are not GIL-bound). With one inter-op
  thread no kernel overlaps another, but the dispatching thread runs Python beside the lone
  worker, and a GIL-bound kernel waits for it off the CPU: there the share of a run the
  process's other threads were on a CPU while the worker was not is the overlap
  (``_placement.dispatcher_overlap``; time the whole process lost to other processes does not
  count), so the kernels of a
  small model dispatched on one inter-op thread are learnt GIL-bound and then run on the
  dispatching thread instead of taking turns with it (measured at (20, 1, 64): 1.8x numpy's
  time before, 1.1x after).
  A serial kernel shorter than the interpreter's GIL switch interval (5 ms by
  default) runs on the thread that needs it, like a small one: on a worker it would hold the
  GIL that long before the dispatching thread got it back, so the hand-off buys nothing and
  costs a wake-up (``_placement.runs_inline``). When the lane is free it runs at dispatch on
  the small ops' lean path (no task record until its value exists, no lock); when a serial
  kernel holds the lane on a worker it waits for the lane instead.
* **Ready order, and requests.** Work dispatched from a coroutine on the loop belongs to
  that coroutine's task (a request, in a server): its tasks take the request's age as their
  priority, so the oldest request's ready work runs first and a burst of new requests cannot
  starve an old one (a captured graph run adds its static critical-path rank). The age is
  aged (``_requests.AGING_TASKS``): a task takes the later of its request's start and its own
  id less 4096, so a request that streams work for good (a long job, another runtime's whole
  run on the shared pool) cannot starve a newer one either. Otherwise the
  queue is FIFO by issue order. The continuation above keeps a worker on the chain it is on
  (its data is in cache, and a chain's intermediate arrays die young).
* **Work belongs to whoever still wants it.** When a request's task is cancelled (the client
  went away, a timeout), every task it dispatched that has not started is dropped, unless
  someone still wants its value: a live coroutine awaiting it, a handle on it held anywhere
  but in the cancelled coroutine's own variables, or an unfinished task of someone else that
  reads it. (The cancelled coroutine's frames are released for that: its CancelledError's
  traceback would keep its variables alive.) Awaiting a dropped value raises
  :class:`~dataflow.CancelledTaskError`. A cancellation the request catches (a timeout
  scope) leaves its task running; the ``await`` it interrupted reports it
  (``Requests.await_interrupted``), and what the request dispatched that nobody wants any
  more is dropped the same way once the scope has unwound (what it dispatched from the first
  unfinished task the await waited for up to that await: its work before and after is its own
  as usual). Under trio a request is a trio
  task too, but trio does not say how a task ended: its work is dropped when a cancellation
  interrupted one of its awaits on a pending value (the usual case: the request awaited its
  model's output), and runs to completion when it was cancelled while waiting for
  something else (``TrioLoop``). So does a request that ``asyncio.gather`` or an anyio task
  group cancels: they take its CancelledError first and keep it, and its frames with it (the
  interrupted await's cancellation releases them: ``Requests.await_interrupted``). The
  bookkeeping costs no object per op for the garbage collector to track: a request keeps its
  unstarted tasks in a dict by id (each leaves it when it starts), and an unstarted task
  keeps its handles, so whether anyone else holds one is whether it has more references
  than the task's own (``Requests``' ``handles_held``).
* **Failures propagate, never hang.** A kernel that raises fails its task with a
  :class:`~dataflow.TaskError` chained to the original exception, and every task that depends
  on it fails with that same error, whatever runtime owns it; independent tasks are not
  affected. Every transition is accounted to the runtime that owns the task.
* **Timeouts.** A task with a timeout (``dataflow.op(timeout=)``, ``Runtime(op_timeout=)``)
  never runs inline on the loop; if its kernel outlives the timeout a watchdog thread fails
  it and its dependents with :class:`~dataflow.OpTimeoutError` and the stuck worker is
  replaced (see ``_timeout``).
* **Backpressure.** Past ``max_pending`` tasks in flight, ``submit`` makes the dispatching
  thread help run queued tasks until the count is 10% under the limit; with nothing to run it
  waits for the pool, unless all that is in flight waits on dispatching threads themselves
  (then it lets the dispatch through rather than deadlock). On the loop thread, a cancelled
  dispatching task stops at its next op.

The graph's rules are the pure transitions of ``_graphstate``; this module makes them under
:data:`~dataflow._pool.GRAPH_LOCK` and acts on what they return. The executor is injected: an
:class:`~dataflow._pool.InteropPool`, or none (``interop_threads=0``, the synchronous mode:
every task runs inline at dispatch, in program order, on the calling thread, like dask's
``get_sync``, for debugging).

The layers, each a module and a class built on the one before:

* ``_placement``: the inline threshold, kernel-time sampling, the GIL measurement;
* ``_base``: :class:`SchedulerBase`, the state, observers, and the start / end / fail
  transitions under the lock;
* ``_requests``: ownership of work by requests, and dropping it on cancel;
* ``_execution``: running kernels and placing what they made ready;
* ``_awaiting``: what the loop runs when it awaits a task, and the work workers hand back
  to it;
* ``_limits``: op timeouts (the watchdog) and backpressure;
* ``_dispatch``: :class:`Scheduler`: ``submit`` (the hot path) and closing.
"""

from __future__ import annotations

from .._args import resolve, scan
from ._dispatch import Scheduler
from ._execution import running_task
from ._placement import (
    DEFAULT_INLINE_THRESHOLD,
    get_inline_threshold,
    note_overlap,
    set_inline_threshold,
)

__all__ = [
    "DEFAULT_INLINE_THRESHOLD",
    "Scheduler",
    "get_inline_threshold",
    "note_overlap",
    "resolve",
    "running_task",
    "scan",
    "set_inline_threshold",
]
