"""Run a translated kernel over its logical AI cores on the CPU threads: a tiny persistent worker pool.

The kernel entry is a ``nogil`` numba function ``entry(*args, cores)`` that runs logical cores one after the other,
each claimed from ``cores`` (the launch's int64[3] counter, jit/cruntime.py claim_core) until every core is claimed,
and then counts itself finished in ``cores[1]``. A launch on T threads is one job of T parts, each one call of the
entry; the calling thread starts at once and the pool's workers join as they wake, so a worker that wakes late finds
less (or nothing) left and the caller never waits for it to start. Once its own calls are done the caller watches
``cores[1]`` for a short while before it blocks. A launch shape (entry, counts, int arguments) that runs faster on
the caller alone, as short launches do where a woken thread starts late, is learned and then launched without waking
the pool (see _SOLO_PROBE_S). A core's result never depends on which thread ran it (each core starts from its own
state), so the output is the same bits whatever the thread count or claim order.

NOTES: parts were fixed strides of cores (part i: cores i, i + T, ...) and the caller blocked on a lock until the
last one ended. On a VM whose idle vCPUs halt at once a blocked thread is woken 20-60 us late: a worker started that
long after the launch and the caller returned that long after the worker's part, more than a small launch's work.
A caller that returns on the counter may leave a worker still returning from its call: that worker holds the
arguments (it runs no kernel code) until it next gets the GIL, within the interpreter's switch interval (5 ms) or at
the caller's next blocking or nogil call.

NOTES: this replaces a numba ``parallel=True`` wrapper (still generated as ``<entry>_prange``, DG_JIT_LAUNCHER=prange)
because numba re-optimizes and re-generates every linked callee in each library that links it: the parfor adds
two such libraries (the gufunc and its wrapper) and tripled the compile time of a GEMM specialization. A Python
handoff costs ~20-40 us, about what numba's workqueue layer costs, and does not degrade when other processes load
the CPU (OpenMP's spinning barrier took milliseconds there).

Guarantees (the reliability contract):
- A launch either completes (every part ran) or raises; nothing a later launch does or sees depends on an earlier
  one: each launch is its own ``_Job`` object with its own completion count, never a slot shared by launches. (Only
  the choice of threads or the caller alone is learned from earlier launches' times; no result depends on it.)
- Ctrl-C: a kernel part is native code that Python cannot stop halfway. In a cancellable call (jit/interrupt.py:
  a long one) the parts all run on workers while the main thread waits, and a SIGINT sets the kernels' cancel flag:
  they stop at their next tile, the launch raises KeyboardInterrupt and the call restores its outputs. Otherwise, on
  the main thread, SIGINT is held for the few milliseconds of a launch and delivered to the previous handler
  (KeyboardInterrupt by default) once every part has finished: the caller gets KeyboardInterrupt with a complete
  output. A launch on one thread (or on the caller alone) is one native call, which Python does not interrupt: a
  SIGINT to a Python handler is handled once it has returned. Either way the pool survives.
- Several Python threads may launch at once: their jobs share the pool's workers, and each caller also runs parts
  of its own job, so no launch waits for another one to finish and every CPU thread stays in use.
"""

from __future__ import annotations

import functools
import os
import queue
import sys
import threading
import time
import weakref

import numpy as np

from . import interrupt


def num_threads() -> int:
    """CPU threads kernels use: numba's thread count (NUMBA_NUM_THREADS, numba.set_num_threads) without starting
    numba's own thread pool."""
    numba = sys.modules.get("numba")
    if numba is not None:
        parallel = sys.modules.get("numba.np.ufunc.parallel")
        if parallel is not None and getattr(parallel, "_is_initialized", False):
            return max(1, numba.get_num_threads())
        return max(1, int(numba.config.NUMBA_NUM_THREADS))
    return _cpu_count()


@functools.cache
def _cpu_count() -> int:
    """os.cpu_count(), read once: on Linux each call reads /sys (about 7 us, a quarter of a launch's dispatch)."""
    return max(1, os.cpu_count() or 1)


# NOTES: how long a caller that finished its own entry calls watches the counter for the other threads' calls to
# finish before it blocks (a blocked caller is woken 20-60 us late here). Longer launches block as before.
_WATCH_S = 100e-6

# NOTES: short launches on the caller alone. A worker woken for a launch of a few tens of microseconds joins when the
# caller is nearly done and takes the GIL for its claim; the caller, back from its entry, then waits for the GIL and
# is woken late in turn (traced: the HC pre-norm GEMM's reduction phase, 17 us on one thread, took 50 us with the
# worker: the caller's own entry call 36 us, the worker's part 1.5 us, skipped). So the launcher learns, per launch
# shape (the entry, the core and thread counts, the arguments that are ints: the shape and strides), which way is
# faster: after a first launch (threaded, not timed: its caches are cold) the next _SAMPLES are threaded, and when
# their median is below _SOLO_PROBE_S the next _SAMPLES run on the caller alone; the shape then stays solo when the
# solo median is below _SOLO_MARGIN times the threaded one (a threaded launch's time has a long tail: the worker's
# wake-up), else threaded (FP8 GEMM 4 x 1024 x 512 here: 89 us threaded, 121 us alone). A solo sample over _SOLO_STOP
# times the threaded median ends the trial at once (many threads: a solo launch costs up to T times more). Work can
# depend on the data, not only on the ints (masked rows, context lengths): a solo launch slower than _SOLO_SLOW times
# the solo median (or than _SOLO_PROBE_S) adds 1 to the shape's slow score, which decays by _SLOW_DECAY a launch, and
# at _SLOW_PIN the shape is threaded for good, as every launch was before; isolated hiccups of the machine decay away.
# Results do not depend on any of it: a core's result never depends on which thread ran it.
_SOLO_PROBE_S = 200e-6
_SAMPLES = 3
_SOLO_MARGIN = 1.1
_SOLO_STOP = 2.0
_SOLO_SLOW = 3.0
_SLOW_DECAY = 0.99
_SLOW_PIN = 2.5
_MAX_SHAPES = 4096  # learned shapes kept (all forgotten past it)
_clock = time.perf_counter  # the learning's clock (tests replace it)


def _median(times: list[float]) -> float:
    return sorted(times)[len(times) // 2]


class _Way:
    """What the launcher learned of one launch shape (the NOTES above): ``alone`` None while it learns (``threaded``
    and ``solo`` sample lists), then True (on the caller alone; ``slow_after`` the time over which a launch counts
    as slow, ``slow`` its decaying count of slow launches) or False (threaded for good). ``entry`` a weak reference
    to the shape's entry: a key holds its id, which a freed kernel's successor may get again."""

    __slots__ = ("entry", "threaded", "solo", "alone", "slow_after", "slow")

    def __init__(self, entry):
        try:
            self.entry = weakref.ref(entry)
        except TypeError:  # an entry without weak references (none of the kernels'): held, at most _MAX_SHAPES
            self.entry = lambda: entry
        self.threaded: list[float] = []
        self.solo: list[float] = []
        self.alone: bool | None = None
        self.slow_after = 0.0
        self.slow = 0.0


def _core_counter() -> np.ndarray:
    """A launch's core counter (the entry's hidden trailing argument): [0] logical cores claimed, [1] entry calls
    finished, [2] entry calls started (jit/cruntime.py claim_slot); zeros."""
    return np.zeros(3, np.int64)


class _Job:
    """One launch: parts 0..parts-1, each one call ``fn(*args, cores)`` on whichever thread claims it; the calls
    share ``cores``, the launch's counter of claimed logical cores (``num_cores`` in all)."""

    __slots__ = ("fn", "args", "parts", "cores", "num_cores", "skipped", "error", "_done", "_next", "_pending",
                 "_lock")

    def __init__(self, fn, args: tuple, parts: int, num_cores: int):
        self.fn = fn
        self.cores = _core_counter()
        self.num_cores = num_cores
        self.args = (*args, self.cores)
        self.parts = parts
        self.skipped = 0  # parts claimed after every core was (their entry call skipped)
        self.error: BaseException | None = None
        # NOTES: a lock held until the last part ends (cheaper to make than an Event: dispatch is microseconds).
        self._done = threading.Lock()
        self._done.acquire()
        self._next = 0
        self._pending = parts
        self._lock = threading.Lock()

    def wait(self) -> None:
        """Return once every part has finished."""
        self._done.acquire()
        self._done.release()

    def watch(self, seconds: float) -> bool:
        """True once every part's entry call has finished (it counts itself in cores[1], without the GIL) or was
        skipped, watched for up to ``seconds``; False when that did not happen in time (a part still runs, or one
        raised: an entry that raised never counts itself)."""
        deadline = time.perf_counter() + seconds
        cores = self.cores
        while cores[1] + self.skipped < self.parts:
            if time.perf_counter() > deadline:
                return False
        return True

    def claim(self) -> int:
        """The next unclaimed part, or -1 when every part is taken."""
        with self._lock:
            part = self._next
            if part >= self.parts:
                return -1
            self._next = part + 1
            return part

    def run(self, part: int) -> None:
        try:
            # NOTES: a part claimed after every core was (a worker that woke late) has nothing to run: skip the call
            # (a numba dispatch and, for a mixed kernel, a fresh cross-core state). A stale read only costs the call.
            if self.cores[0] < self.num_cores:
                self.fn(*self.args)
            else:
                with self._lock:
                    self.skipped += 1
        except BaseException as e:  # noqa: BLE001 - handed to the launching thread
            if self.error is None:
                self.error = e
        finally:
            with self._lock:
                self._pending -= 1
                last = self._pending == 0
            if last:
                self._done.release()

    def run_all(self) -> None:
        """Run parts on this thread until none is left unclaimed."""
        while (part := self.claim()) >= 0:
            self.run(part)


def _worker_loop(jobs: queue.SimpleQueue) -> None:
    while True:
        job = jobs.get()
        # NOTES: a job whose parts the caller (or another worker) already took claims -1 here and is dropped.
        part = job.claim()
        if part >= 0:
            job.run(part)


class CoreLauncher:
    """Runs ``entry(*args, cores)`` on up to T threads (the caller first), which share the launch's logical cores, and
    returns when all have finished; the first exception of any call is re-raised on the caller."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()
        # What is learned of each launch shape (module NOTES), and the lock of its samples
        self._ways: dict[tuple, _Way] = {}
        self._learn_lock = threading.Lock()

    def _ensure(self, count: int) -> None:
        if len(self._workers) >= count:
            return
        with self._lock:
            while len(self._workers) < count:
                thread = threading.Thread(target=_worker_loop, args=(self._jobs,),
                                          name=f"deep_gemm-core-{len(self._workers) + 1}", daemon=True)
                thread.start()
                self._workers.append(thread)

    def launch(self, entry, num_cores: int, args: tuple) -> None:
        threads = min(num_threads(), num_cores)
        call = interrupt.current()
        if call is not None and call.cancellable:
            self._launch_cancellable(entry, num_cores, threads, args, call)
            return
        if threads <= 1:
            # NOTES: one native call: Python handles a SIGINT only after it returns, so it is atomic already.
            entry(*args, _core_counter())
            return
        # NOTES: the entry's id (a native phase function is not hashable); _Way checks that it is still this entry.
        shape = (id(entry), num_cores, threads, *[a for a in args if type(a) is int])
        way = self._ways.get(shape)
        if way is None or way.entry() is not entry:
            self._launch_threaded(entry, num_cores, threads, args)
            if len(self._ways) >= _MAX_SHAPES:
                self._ways.clear()
            self._ways[shape] = _Way(entry)  # a first launch is not a sample (cold caches)
            return
        alone = way.alone
        if alone is False:
            self._launch_threaded(entry, num_cores, threads, args)
            return
        threaded_sample = alone is None and len(way.threaded) < _SAMPLES
        start = _clock()
        if threaded_sample:
            self._launch_threaded(entry, num_cores, threads, args)
        else:
            # NOTES: one native call, as a one-thread launch: a SIGINT is handled once it has returned.
            entry(*args, _core_counter())
        took = _clock() - start
        if alone is None:
            self._learn(way, threaded_sample, took)
        elif took > way.slow_after:
            way.slow = way.slow * _SLOW_DECAY + 1.0
            if way.slow >= _SLOW_PIN:
                way.alone = False
        else:
            way.slow *= _SLOW_DECAY

    def _learn(self, way: _Way, threaded: bool, took: float) -> None:
        """Add a learning launch's time to the shape's threaded or solo samples; decide when they are complete, or
        as soon as a solo sample shows the caller alone is slower."""
        with self._learn_lock:
            samples = way.threaded if threaded else way.solo
            if way.alone is not None or len(samples) >= _SAMPLES:
                return  # another Python thread's launch of this shape completed them
            samples.append(took)
            if threaded:
                if len(samples) == _SAMPLES and _median(samples) >= _SOLO_PROBE_S:
                    way.alone = False
                return
            limit = _median(way.threaded)
            if took > _SOLO_STOP * limit:
                way.alone = False
            elif len(samples) == _SAMPLES:
                solo = _median(samples)
                way.slow_after = min(_SOLO_SLOW * solo, _SOLO_PROBE_S)
                way.alone = solo < _SOLO_MARGIN * limit

    def _launch_threaded(self, entry, num_cores: int, threads: int, args: tuple) -> None:
        """The launch on ``threads`` threads: the caller and the pool's workers, SIGINT held on the main thread."""
        job = _Job(entry, args, threads, num_cores)
        with interrupt.HeldSigint():
            finished = False
            try:
                self._ensure(threads - 1)
                for _ in range(threads - 1):
                    self._jobs.put(job)
                job.run_all()
                finished = job.watch(_WATCH_S)
            finally:
                # NOTES: whatever happened above, no part of this job may still run kernel code once launch returns
                # (after a watch, a worker may still be returning from a finished call: see the module's NOTES).
                if not finished:
                    job.run_all()
                    job.wait()
                job.args = ()  # stale queue entries must not keep the caller's arrays alive
        if job.error is not None:
            raise job.error

    def _launch_cancellable(self, entry, num_cores: int, threads: int, args: tuple, call) -> None:
        """A launch of a cancellable call (jit/interrupt.py): every part runs on a worker while this thread waits,
        so a SIGINT is handled at once (it sets the kernels' cancel flag; they stop at their next tile)."""
        job = _Job(entry, args, threads, num_cores)
        self._ensure(threads)
        call.in_launch = True
        try:
            for _ in range(threads):
                self._jobs.put(job)
        finally:
            # NOTES: a lock wait returns to Python for each signal (the handler runs, then the wait goes on).
            job.wait()
            call.in_launch = False
            job.args = ()
        if job.error is not None:
            raise job.error
        call.raise_if_cancelled()

    def _reset_after_fork(self) -> None:
        self._jobs = queue.SimpleQueue()
        self._workers = []
        self._lock = threading.Lock()
        self._ways = {}
        self._learn_lock = threading.Lock()


LAUNCHER = CoreLauncher()
if hasattr(os, "register_at_fork"):
    # NOTES: threads do not survive fork; a forked child (multiprocessing) starts an empty pool.
    os.register_at_fork(after_in_child=LAUNCHER._reset_after_fork)
