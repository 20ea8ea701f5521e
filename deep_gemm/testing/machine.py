"""The machine the benches run on: a description (CPU model, the ISA features that set the FMA rate, cores, numpy's
BLAS and its threads) and the measured fp32 FMA peak (independent vector FMAs on every CPU thread at once).

The peak is the physical limit every GEMM row is a fraction of; it is measured, not looked up, because VMs and
shared hosts rarely run at the nominal clock. Not here: timing of library calls (bench.py).
"""

from __future__ import annotations

import os
import platform
import threading
import time
from dataclasses import dataclass

import numpy as np

# ISA features that decide how many fp32 FMAs a core can issue per cycle (LLVM's names).
ISA_FEATURES = ("sse4.2", "avx", "avx2", "fma", "avx512f", "avx512bf16", "amx-bf16")


# ---------------------------------------------------------------------------------------------------------------
# Description
# ---------------------------------------------------------------------------------------------------------------
def cpu_model() -> str:
    """The CPU's marketing name (/proc/cpuinfo on Linux, else platform.processor()), or 'unknown'."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def isa_features() -> dict[str, bool]:
    """{feature: present} for ``ISA_FEATURES``, as LLVM (hence numba) sees the host."""
    import llvmlite.binding as llvm

    flags = set(llvm.get_host_cpu_features().flatten().split(","))
    return {name: f"+{name}" in flags for name in ISA_FEATURES}


def blas_info() -> list[dict[str, object]]:
    """numpy's BLAS libraries: [{'name', 'version', 'threads', 'source'}]. Threads come from threadpoolctl when it
    is importable (the live setting); otherwise from numpy.show_config and the usual environment variables."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        threadpool_info = None
    if threadpool_info is not None:
        found = [
            {"name": f"{p.get('internal_api')} ({os.path.basename(str(p.get('filepath', '')))})",
             "version": p.get("version"), "threads": p.get("num_threads"),
             "arch": p.get("architecture"), "source": "threadpoolctl"}
            for p in threadpool_info() if p.get("user_api") == "blas"
        ]
        if found:
            return found
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name, version = blas.get("name"), blas.get("version")
    except Exception:  # NOTES: show_config's layout differs across numpy releases; describing is best effort
        name, version = "unknown", None
    env = next((f"{v}={os.environ[v]}" for v in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
                if v in os.environ), f"default (likely {os.cpu_count()})")
    return [{"name": name, "version": version, "threads": env, "arch": None, "source": "numpy.show_config"}]


def smt_threads_per_core() -> int:
    """Hardware threads per core as the OS reports them (sysfs thread_siblings_list of CPU 0, else /proc/cpuinfo's
    siblings / cpu cores); 1 when unknown. The threads of one core share its AMX tile unit.
    NOTES: a VM may show its vCPUs as separate cores while they are SMT siblings on the host; measure_amx_peak's
    one-thread vs all-threads figures (tile_unit_sharing) tell what the tile unit actually does."""
    try:
        with open("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list", encoding="utf-8") as f:
            text = f.read().strip()
        count = 0
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            count += int(hi) - int(lo) + 1 if hi else 1
        return max(count, 1)
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            fields = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
        return max(int(fields["siblings\t"]) // int(fields["cpu cores\t"]), 1)
    except (OSError, KeyError, ValueError, ZeroDivisionError):
        return 1


def amx_present() -> bool:
    """Whether the host has the AMX-BF16 tile unit (LLVM's amx-bf16 feature, as numba sees the host)."""
    return isa_features()["amx-bf16"]


def describe_amx() -> str:
    """'AMX-BF16 present (one tile unit per core, shared by its N threads as the OS reports them)' or 'absent'."""
    if not amx_present():
        from ..jit.cpu_features import dpbf16_supported

        units = "the AVX512-BF16 dot products (VDPBF16PS)" if dpbf16_supported() else "the FMA units"
        return f"AMX-BF16 absent (no tile unit: BF16 and FP8 run on {units})"
    n = smt_threads_per_core()
    return (f"AMX-BF16 present (one tile unit per core, shared by its {n} hardware thread{'s' if n > 1 else ''} as "
            f"the OS reports them)")


def tile_unit_sharing(amx_peak: FmaPeak) -> float:
    """How many of the measured threads share one tile unit, from measure_amx_peak's figures: threads divided by
    the all-threads / one-thread speedup (1.0: every thread has its own unit; ``threads``: all share one)."""
    scale = amx_peak.gflops / amx_peak.gflops_one_thread if amx_peak.gflops_one_thread > 0 else float("nan")
    return amx_peak.threads / scale if scale > 0 else float("nan")


def describe_machine() -> str:
    """One paragraph: CPU model, logical CPUs usable by this process, ISA features, whether AMX is present and how
    many threads share its tile unit, numba threads, numpy + BLAS."""
    import numba

    isa = isa_features()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    blas = "; ".join(
        f"{b['name']} {b['version'] or ''} threads {b['threads']}" + (f" arch {b['arch']}" if b["arch"] else "")
        for b in blas_info())
    return (f"CPU {cpu_model()} ({platform.machine()}), {os.cpu_count()} logical CPUs ({usable} usable, "
            f"{smt_threads_per_core()} thread(s) per core); ISA "
            + " ".join(f"{k}{'+' if v else '-'}" for k, v in isa.items())
            + f"; {describe_amx()}; numba {numba.__version__} ({numba.config.NUMBA_NUM_THREADS} threads); numpy "
            f"{np.__version__}, BLAS {blas}")


# ---------------------------------------------------------------------------------------------------------------
# FMA peak
# ---------------------------------------------------------------------------------------------------------------
# NOTES: 12 independent vector accumulators: enough to cover FMA latency x issue width on current x86 (4 x 2 on
# Intel, 5 x 2 on AMD), few enough to stay in 16 ymm registers on AVX2 without spilling.
NUM_ACCUMULATORS = 12

_kernel = None
_kernel_lanes = 0


def _build_kernel():
    """The njit(nogil) FMA loop ``f(n_iters, x) -> float32``: NUM_ACCUMULATORS vector chains of width LANES, each
    step ``acc = fma(acc, x, c)``; returns a sum of the accumulators so the loop cannot be removed."""
    global _kernel, _kernel_lanes
    if _kernel is not None:
        return _kernel, _kernel_lanes
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from ..device.cube_fma import _register_loop
    from ..jit.numba_setup import apply_numba_settings, vector_width_bits

    apply_numba_settings()  # the same vector width the stand-in's micro-kernel gets
    lanes = max(vector_width_bits() // 32, 4)
    f32 = ir.FloatType()
    vty = ir.VectorType(f32, lanes)

    @intrinsic
    def fma_chains(typingctx, n_iters, x):
        def codegen(context, builder, signature, args):
            n = context.cast(builder, args[0], signature.args[0], types.intp)
            x32 = context.cast(builder, args[1], signature.args[1], types.float32)
            xs = builder.insert_element(ir.Constant(vty, ir.Undefined), x32, ir.Constant(ir.IntType(32), 0))
            xs = builder.shuffle_vector(xs, ir.Constant(vty, ir.Undefined), ir.Constant(
                ir.VectorType(ir.IntType(32), lanes), [0] * lanes))
            c = ir.Constant(vty, [1e-7] * lanes)
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty, vty, vty]),
                                                 f"llvm.fma.v{lanes}f32")
            init = [ir.Constant(vty, [1.0 + 0.01 * i] * lanes) for i in range(NUM_ACCUMULATORS)]
            finals = _register_loop(builder, n, init, "fma.loop",
                                    lambda i, accs: [builder.call(fma, [acc, xs, c]) for acc in accs])
            total = finals[0]
            for v in finals[1:]:
                total = builder.fadd(total, v)
            out = builder.extract_element(total, ir.Constant(ir.IntType(32), 0))
            for j in range(1, lanes):
                out = builder.fadd(out, builder.extract_element(total, ir.Constant(ir.IntType(32), j)))
            return out

        if not (isinstance(n_iters, types.Integer) and isinstance(x, types.Float)):
            return None
        return types.float32(n_iters, x), codegen

    @njit(nogil=True)
    def fma_loop(n_iters, x):
        return fma_chains(n_iters, x)

    fma_loop(np.intp(1), np.float32(0.999))  # compile
    _kernel, _kernel_lanes = fma_loop, lanes
    return _kernel, _kernel_lanes


@dataclass(frozen=True)
class FmaPeak:
    """Measured fp32 FMA throughput: GFLOP/s (2 flops per FMA lane) on ``threads`` threads at once and on one."""

    gflops: float  # all threads at once
    gflops_one_thread: float
    threads: int
    vector_bits: int  # width of the FMAs measured (the stand-in's micro-kernel uses the same)
    # NOTES: per second of the thread's own CPU time: what a core does while it runs the loop, which other
    # processes on the machine lower far less than the wall figures (read it when the load average is high).
    gflops_per_cpu_second: float = float("nan")

    def fraction(self, gflops: float) -> float:
        """``gflops`` as a fraction of the all-threads peak."""
        return gflops / self.gflops


def _run_threads(fn, n_iters: int, threads: int, cpu_times: list[float] | None = None) -> float:
    """Wall seconds for ``threads`` threads each running fn(n_iters) from one barrier to the last join; each
    thread's CPU seconds are appended to ``cpu_times`` when given."""
    barrier = threading.Barrier(threads + 1)
    sink = []

    def work():
        barrier.wait()
        c0 = time.thread_time()
        sink.append(fn(np.intp(n_iters), np.float32(0.999999)))
        if cpu_times is not None:
            cpu_times.append(time.thread_time() - c0)

    workers = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    start = time.perf_counter()
    for w in workers:
        w.join()
    return time.perf_counter() - start


def _check_peak_args(threads: int | None, seconds: float, repeats: int) -> int:
    """The thread count to measure on (default: the CPUs this process may use), after checking the arguments."""
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an int >= 1, got threads={threads!r}")
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got seconds={seconds!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got repeats={repeats!r}")
    return threads


def measure_fma_peak(threads: int | None = None, seconds: float = 0.2, repeats: int = 5) -> FmaPeak:
    """Measure the fp32 FMA peak: every thread runs NUM_ACCUMULATORS independent vector FMA chains for about
    ``seconds``; the best of ``repeats`` runs (other load only ever lowers it) on ``threads`` threads (default:
    the CPUs this process may use) and on one thread. Compiles a small numba kernel on first use."""
    threads = _check_peak_args(threads, seconds, repeats)
    fn, lanes = _build_kernel()
    one, all_threads, per_cpu = _measure_loop(fn, 2 * lanes * NUM_ACCUMULATORS, threads, seconds, repeats)
    return FmaPeak(all_threads, one, threads, 32 * lanes, per_cpu)


def _measure_loop(fn, flops_per_iter: int, threads: int, seconds: float, repeats: int) -> tuple[float, float, float]:
    """(GFLOP/s on one thread, on ``threads`` threads at once, per CPU-second of a thread) of the nogil loop
    fn(n_iters, x), best of ``repeats`` runs of about ``seconds`` each."""
    # Calibrate on one thread: grow the loop until it runs for a measurable time, then scale to ``seconds``.
    n_iters = 1 << 10
    while True:
        t = _run_threads(fn, n_iters, 1)
        if t > 0.02 or n_iters > 1 << 34:
            break
        n_iters *= 4
    n_iters = max(1, int(n_iters * seconds / t))

    cpu_times: list[float] = []

    def best(num: int) -> float:
        return max(flops_per_iter * n_iters * num / _run_threads(fn, n_iters, num, cpu_times)
                   for _ in range(repeats)) / 1e9

    one = best(1)
    per_cpu = flops_per_iter * n_iters / min(t for t in cpu_times if t > 0) / 1e9 if any(cpu_times) else float("nan")
    return one, best(threads) if threads > 1 else one, per_cpu


# The AMX loop: one 2 x 2 block of C tiles over AMX_STEPS 32-K steps per iteration, operands L1-resident.
AMX_STEPS = 8


def _build_amx_kernel():
    """The njit(nogil) loop ``f(n_iters, x) -> float32`` running the Cube's own AMX block (2 x 2 C tiles, 16 KiB of
    A and of B, L1-resident) n_iters times; None when the host has no AMX-BF16."""
    from ..device import cube

    if not cube.AMX_SUPPORTED:
        return None
    from numba import njit

    steps, t = AMX_STEPS, cube.AMX_T

    @njit(nogil=True)
    def amx_loop(n_iters, x):
        a = np.full(2 * t * steps * cube.AMX_K, 0x3F80, dtype=np.uint16)  # bf16 1.0
        b = np.full(2 * t * steps * cube.AMX_K, 0x3F80, dtype=np.uint16)
        c = np.zeros((2 * t, 2 * t), dtype=np.float32)
        cube._amx_load_config(cube._data_ptr(cube.AMX_CONFIG))
        for _ in range(n_iters):
            cube._amx_block(2, 2, steps, cube._data_ptr(a), steps * cube.AMX_K, cube._data_ptr(b),
                            steps * cube.AMX_K * t, cube._data_ptr(c), 2 * t, False)
        # every element of C gained 32 * steps per iteration (A = B = 1): the work was done
        return c[0, 0] * x

    amx_loop(np.intp(1), np.float32(1.0))  # compile
    return amx_loop


def measure_amx_peak(threads: int | None = None, seconds: float = 0.2, repeats: int = 5) -> FmaPeak | None:
    """Measure the AMX-BF16 tile unit through the Cube's own block (TDPBF16PS, 2 flops per multiply-add, operands
    in L1): the best of ``repeats`` runs on ``threads`` threads (default: the usable CPUs) and on one, as an
    FmaPeak (vector_bits 0). None when the host has no AMX-BF16. Compiles a small numba kernel on first use."""
    threads = _check_peak_args(threads, seconds, repeats)
    fn = _build_amx_kernel()
    if fn is None:
        return None
    flops = 2 * (2 * 16) * (2 * 16) * 32 * AMX_STEPS
    one, all_threads, per_cpu = _measure_loop(fn, flops, threads, seconds, repeats)
    return FmaPeak(all_threads, one, threads, 0, per_cpu)


# The AVX512-BF16 loop: the Cube's own 8 x 32 VDPBF16PS micro-kernel over DPBF16_PAIRS K pairs per iteration,
# operands L1-resident (A 8 rows x 256 bf16 = 4 KiB, B two 16-row panels = 16 KiB).
DPBF16_PAIRS = 128


def _build_dpbf16_kernel():
    """The njit(nogil) loop ``f(n_iters, x) -> float32`` running the Cube's AVX512-BF16 micro-kernel (MR x 32 C,
    accumulating) n_iters times on L1-resident operands; None when the host (or its LLVM) has no AVX512-BF16."""
    from ..device import cube, cube_dpbf16

    if not cube.DPBF16_SUPPORTED:
        return None
    from numba import njit

    pairs, mr, cols = DPBF16_PAIRS, cube.MR, cube_dpbf16.DP_COLS

    @njit(nogil=True)
    def dpbf16_loop(n_iters, x):
        a = np.full(mr * 2 * pairs, 0x3F80, dtype=np.uint16)  # bf16 1.0
        b = np.full(cols * 2 * pairs, 0x3F80, dtype=np.uint16)
        c = np.zeros((mr, cols), dtype=np.float32)
        for _ in range(n_iters):
            cube_dpbf16._dp_kernel(mr, pairs, cube._data_ptr(a), 2 * pairs, cube._data_ptr(b), 16 * 2 * pairs,
                                   cube._data_ptr(c), cols, cols, False)
        # every element of C gained 2 * pairs per iteration (A = B = 1): the work was done
        return c[mr - 1, cols - 1] * x

    dpbf16_loop(np.intp(1), np.float32(1.0))  # compile
    return dpbf16_loop


def measure_dpbf16_peak(threads: int | None = None, seconds: float = 0.2, repeats: int = 5) -> FmaPeak | None:
    """Measure the AVX512-BF16 dot products through the Cube's own micro-kernel (VDPBF16PS, 2 flops per bf16
    multiply-add, operands in L1): the best of ``repeats`` runs on ``threads`` threads (default: the usable CPUs)
    and on one, as an FmaPeak (vector_bits 512). None when the host has no AVX512-BF16 path. Compiles a small
    numba kernel on first use."""
    threads = _check_peak_args(threads, seconds, repeats)
    fn = _build_dpbf16_kernel()
    if fn is None:
        return None
    from ..device import cube, cube_dpbf16

    flops = 2 * cube.MR * cube_dpbf16.DP_COLS * 2 * DPBF16_PAIRS
    one, all_threads, per_cpu = _measure_loop(fn, flops, threads, seconds, repeats)
    return FmaPeak(all_threads, one, threads, 512, per_cpu)
