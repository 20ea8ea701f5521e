"""CPU mode of the sweep: this machine's ceiling and bandwidth, operand generation, the numpy baseline a user would
write, the deep_gemm stand-in runner (swappable, so tests need not wait for kernels), and per-shape timing.

Measures only; decides nothing about shapes or output files (sweep.py does).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from deep_gemm.testing.numeric import calc_diff  # chunked: no float64 copy of a whole output

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
SF_GRAN_K = 32
# NOTES: operands are generated, quantized and compared in row chunks of about this many elements, so no fp32 or
# fp64 temporary of a whole 16384 x 36864 tensor is ever alive.
_CHUNK_ELEMS = 1 << 23


# ---------------------------------------------------------------------------------------------------------------
# This machine: free memory
# ---------------------------------------------------------------------------------------------------------------

# NOTES: the ceiling, FMA peak and bandwidth are measured by _sweep_ceiling (shared with the Dask workers).


def mem_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else free physical pages; bytes."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def mem_total_bytes() -> int:
    """Physical memory: MemTotal from /proc/meminfo (Linux), else all physical pages; bytes."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def shape_memory_bytes(dtype: str, m: int, n: int, k: int) -> int:
    """Peak bytes one CPU-mode shape needs: A, B (and fp32 scales), D, the baseline's fp32 copies of A and B, its
    fp32 product and the product's bf16 cast, plus chunk temporaries and 10 % for the stand-in's own buffers."""
    kb = math.ceil(k / SF_GRAN_K)
    if dtype == "bf16":
        operands = 2 * (m + n) * k
    else:
        operands = (m + n) * k + 4 * (m + n) * kb
    d = 2 * m * n
    baseline = 4 * (m + n) * k + 4 * m * n + 2 * m * n
    if dtype == "fp8" and k % SF_GRAN_K:
        baseline += 4 * max(m, n) * k  # the repeated-scale temporary of an unaligned K
    chunks = 4 * 8 * _CHUNK_ELEMS
    return int(1.1 * (operands + d + baseline) + chunks)


# ---------------------------------------------------------------------------------------------------------------
# Operands
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class GemmCase:
    """One shape's operands as the public API takes them. bf16: a [m, k], b [n, k] bfloat16, sfa = sfb = None.
    fp8: a, b float8_e4m3fn codes, sfa [m, ceil(k/32)], sfb [n, ceil(k/32)] fp32 powers of two. d: bf16 [m, n]."""

    dtype: str
    m: int
    n: int
    k: int
    a: np.ndarray
    b: np.ndarray
    d: np.ndarray
    sfa: np.ndarray | None = None
    sfb: np.ndarray | None = None
    extra: dict = field(default_factory=dict)


def _rows_per_chunk(cols: int) -> int:
    return max(1, _CHUNK_ELEMS // max(cols, 1))


def random_bf16(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Uniform values in [-1, 1) as a bfloat16 [rows, cols] array, generated in row chunks."""
    out = np.empty((rows, cols), BF16)
    step = _rows_per_chunk(cols)
    for r0 in range(0, rows, step):
        x = rng.random((min(step, rows - r0), cols), dtype=np.float32)
        x *= 2.0
        x -= 1.0
        out[r0:r0 + x.shape[0]] = x.astype(BF16)
    return out


def random_fp8(rng: np.random.Generator, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Uniform [-1, 1) values quantized per token (1 x 32 blocks, UE8M0 scales): (e4m3fn codes, fp32 scales)."""
    from deep_gemm.utils import per_token_cast_to_fp8

    codes = np.empty((rows, cols), FP8)
    sf = np.empty((rows, math.ceil(cols / SF_GRAN_K)), np.float32)
    step = _rows_per_chunk(cols)
    for r0 in range(0, rows, step):
        x = rng.random((min(step, rows - r0), cols), dtype=np.float32)
        x *= 2.0
        x -= 1.0
        c, s = per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=SF_GRAN_K)
        codes[r0:r0 + x.shape[0]] = c
        sf[r0:r0 + x.shape[0]] = s
    return codes, sf


def shape_rng(seed: int, dtype: str, m: int, n: int, k: int) -> np.random.Generator:
    """The operand RNG of one shape: seeded by (seed, dtype, m, n, k), so a shape gets the same operands whatever
    ran before it, in one process or on any Dask worker, fresh or resumed."""
    return np.random.default_rng([seed, ("bf16", "fp8").index(dtype), m, n, k])


def make_case(dtype: str, m: int, n: int, k: int, rng: np.random.Generator) -> GemmCase:
    """Random operands for one shape; D is zero-filled bf16."""
    d = np.zeros((m, n), BF16)
    if dtype == "bf16":
        return GemmCase(dtype, m, n, k, random_bf16(rng, m, k), random_bf16(rng, n, k), d)
    if dtype == "fp8":
        a, sfa = random_fp8(rng, m, k)
        b, sfb = random_fp8(rng, n, k)
        return GemmCase(dtype, m, n, k, a, b, d, sfa, sfb)
    raise ValueError(f"{dtype=} must be 'bf16' or 'fp8'")


# ---------------------------------------------------------------------------------------------------------------
# The numpy baseline a user would otherwise write
# ---------------------------------------------------------------------------------------------------------------

def dequantize(codes: np.ndarray, sf: np.ndarray) -> np.ndarray:
    """FP8 codes [r, c] times their per-32-block scales [r, ceil(c/32)] -> fp32 [r, c]."""
    x = codes.astype(np.float32)
    rows, cols = x.shape
    if cols % SF_GRAN_K == 0:
        x.reshape(rows, cols // SF_GRAN_K, SF_GRAN_K)[...] *= sf[:, :, None]
    else:
        x *= np.repeat(sf, SF_GRAN_K, axis=1)[:, :cols]
    return x


def baseline_product(case: GemmCase) -> np.ndarray:
    """The baseline's fp32 product: bf16 -> fp32 then ``a @ b.T``; fp8 -> decode, scale, ``a @ b.T``."""
    if case.dtype == "bf16":
        return case.a.astype(np.float32) @ case.b.astype(np.float32).T
    return dequantize(case.a, case.sfa) @ dequantize(case.b, case.sfb).T


# ---------------------------------------------------------------------------------------------------------------
# Runners: deep_gemm on this machine, and what tests swap in
# ---------------------------------------------------------------------------------------------------------------

class DeepGemmRunner:
    """Runs the stand-in through the public API: ``bf16_gemm_nt(a, b, d)`` or ``fp8_gemm_nt((a, sfa), (b, sfb), d)``
    under ``runtime_scope(arch=, num_ai_cores=)``; precompiles kernels in parallel with ``testing.par_compile``."""

    name = "deep_gemm"

    def __init__(self, arch: str | None = None, num_ai_cores: int | None = None, max_workers: int | None = None,
                 precompile: bool = True) -> None:
        self.arch = arch
        self.num_ai_cores = num_ai_cores
        self.max_workers = max_workers
        self.use_precompile = precompile

    def check_available(self) -> None:
        """Raise RuntimeError naming what is missing if the public GEMMs cannot be resolved."""
        import deep_gemm

        missing = []
        for name in ("bf16_gemm_nt", "fp8_gemm_nt", "runtime_scope"):
            try:
                getattr(deep_gemm, name)
            except Exception as e:  # noqa: BLE001
                missing.append(f"deep_gemm.{name} ({type(e).__name__}: {e})")
        if missing:
            raise RuntimeError("cpu mode needs " + "; ".join(missing))

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        import deep_gemm

        with deep_gemm.runtime_scope(arch=self.arch, num_ai_cores=self.num_ai_cores):
            yield

    def target(self) -> tuple[str, int]:
        """(arch name, logical AI cores) the kernels are built for."""
        import deep_gemm

        with self.scope():
            return deep_gemm.get_npu_arch(), deep_gemm.get_num_ai_cores()

    def run(self, case: GemmCase) -> object:
        import deep_gemm

        if case.dtype == "bf16":
            return deep_gemm.bf16_gemm_nt(case.a, case.b, case.d)
        return deep_gemm.fp8_gemm_nt((case.a, case.sfa), (case.b, case.sfb), case.d)

    def config(self, dtype: str, m: int, n: int, k: int) -> object | None:
        """The heuristic's config for a shape (what the kernel would be built with), or None if unavailable."""
        try:
            from deep_gemm.heuristics import get_best_config
            from deep_gemm.heuristics.config import GemmDesc
        except ImportError:
            return None
        import deep_gemm

        with self.scope():
            desc = GemmDesc(m, n, k, a_dtype=dtype, b_dtype=dtype, out_dtype="bf16",
                            num_ai_cores=deep_gemm.get_num_ai_cores())
            return get_best_config(desc, deep_gemm.get_arch_spec())

    def precompile(self, tasks: list[tuple[str, int, int, int]]) -> dict:
        """Build every kernel the tasks need, in parallel worker processes (dry run: nothing launches).

        Tasks sharing (dtype, n, k, config) share a kernel (M is a runtime argument under compiled_dims="nk"), so
        one representative each is built. Returns {"kernels": count, "seconds": wall time, "error": str|None}."""
        if not self.use_precompile or not tasks:
            return {"kernels": 0, "seconds": 0.0, "error": None}
        try:
            from deep_gemm.testing import par_compile
        except (ImportError, AttributeError) as e:
            return {"kernels": 0, "seconds": 0.0, "error": f"no deep_gemm.testing.par_compile ({e}); warm-up compiles"}
        unique: dict[tuple, tuple[str, int, int, int]] = {}
        for task in tasks:
            unique.setdefault(kernel_key(self, *task), task)
        callables = [functools.partial(_dry_run_one, dtype, m, n, k, self.arch, self.num_ai_cores)
                     for dtype, m, n, k in unique.values()]
        start = time.perf_counter()
        error = None
        try:
            par_compile(callables, max_workers=self.max_workers, progress=True)
        except Exception as e:  # noqa: BLE001 (each shape's warm-up call compiles and records its own error)
            error = f"{type(e).__name__}: {e}"
        return {"kernels": len(callables), "seconds": time.perf_counter() - start, "error": error}


    def build(self, dtype: str, m: int, n: int, k: int) -> float:
        """Build (or load from the disk cache) the kernel a shape needs, in this process, launching nothing;
        returns the seconds it took. A Dask worker calls this before it takes the machine for timing."""
        import deep_gemm

        start = time.perf_counter()
        with deep_gemm.dry_run():
            _dry_run_one(dtype, m, n, k, self.arch, self.num_ai_cores)
        return time.perf_counter() - start


def kernel_key(runner, dtype: str, m: int, n: int, k: int) -> tuple:
    """What identifies a shape's kernel: (dtype, n, k, config) under compiled_dims="nk" (M is a runtime argument),
    or the whole shape when the runner has no config for it. Shapes with one key share one compiled kernel."""
    try:
        config = runner.config(dtype, m, n, k)
    except Exception:  # noqa: BLE001 (the shape's own run reports the real error)
        config = None
    return (dtype, n, k, repr(config)) if config is not None else (dtype, m, n, k)


def _dry_run_one(dtype: str, m: int, n: int, k: int, arch: str | None, num_ai_cores: int | None) -> None:
    """One precompile task (runs in a par_compile worker, inside dry_run): the call a shape makes, on zero-filled
    operands of the right shapes (numpy maps zeros lazily, so even 16384^2 operands cost no memory here)."""
    import deep_gemm

    d = np.zeros((m, n), BF16)
    with deep_gemm.runtime_scope(arch=arch, num_ai_cores=num_ai_cores):
        if dtype == "bf16":
            deep_gemm.bf16_gemm_nt(np.zeros((m, k), BF16), np.zeros((n, k), BF16), d)
        else:
            kb = math.ceil(k / SF_GRAN_K)
            deep_gemm.fp8_gemm_nt((np.zeros((m, k), FP8), np.ones((m, kb), np.float32)),
                                  (np.zeros((n, k), FP8), np.ones((n, kb), np.float32)), d)


class NumpyRunner:
    """A stand-in substitute for tests and dry plumbing runs: the baseline's math written into ``d``. Its config is
    None. Not a benchmark of anything."""

    name = "numpy"
    compile_s = 0.0  # planning: nothing to compile

    def __init__(self, arch: str = "950DT", num_ai_cores: int = 32, fail_on: Iterable[tuple] = (),
                 die_once_on: tuple | None = None, die_marker: str | None = None, hold_after: int | None = None,
                 hold_dir: str | None = None) -> None:
        self.arch = arch
        self.num_ai_cores = num_ai_cores
        self.fail_on = set(fail_on)  # (dtype, m, n, k) shapes whose run raises, to exercise error rows
        # (dtype, m, n, k) whose first run kills its own process (SIGKILL), once per existing-free `die_marker`
        # file: a worker dying mid-shape, for the Dask backend's tests.
        self.die_once_on = tuple(die_once_on) if die_once_on is not None else None
        self.die_marker = die_marker
        # Only the first `hold_after` distinct shapes (each claims a slot file in `hold_dir`, shared by the
        # processes of one host) run; any later shape never returns, so an interrupt lands mid-sweep with exactly
        # `hold_after` rows written, whatever the machine's load (the Dask backend's Ctrl-C test).
        self.hold_after = hold_after
        self.hold_dir = hold_dir
        self.calls: list[tuple[str, int, int, int]] = []
        self.builds: list[tuple[str, int, int, int]] = []

    def check_available(self) -> None:
        return None

    def scope(self):
        return contextlib.nullcontext()

    def target(self) -> tuple[str, int]:
        return self.arch, self.num_ai_cores

    def run(self, case: GemmCase) -> None:
        shape = (case.dtype, case.m, case.n, case.k)
        self.calls.append(shape)
        if shape == self.die_once_on and self.die_marker is not None:
            try:
                fd = os.open(self.die_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, f"{os.getpid()}\n".encode())
                os.close(fd)
                import signal

                os.kill(os.getpid(), signal.SIGKILL)
        if self.hold_after is not None and self.hold_dir is not None:
            self._maybe_hold(shape)
        if shape in self.fail_on:
            raise RuntimeError(f"injected failure for {shape}")
        case.d[...] = baseline_product(case).astype(BF16)

    def _maybe_hold(self, shape: tuple) -> None:
        """Return if ``shape`` owns one of the ``hold_after`` slot files (claiming a free one), else hold forever."""
        name = "-".join(map(str, shape))
        for i in range(self.hold_after):
            slot = os.path.join(self.hold_dir, f"slot-{i}")
            try:
                fd = os.open(slot, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                with open(slot) as f:
                    if f.read() == name:
                        return
                continue
            os.write(fd, name.encode())
            os.close(fd)
            return
        with open(os.path.join(self.hold_dir, f"held-{name}"), "w"):
            pass
        while True:  # until the process is closed or killed
            time.sleep(0.05)

    def config(self, dtype: str, m: int, n: int, k: int) -> None:
        return None

    def precompile(self, tasks: list) -> dict:
        return {"kernels": 0, "seconds": 0.0, "error": None}

    def build(self, dtype: str, m: int, n: int, k: int) -> float:
        self.builds.append((dtype, m, n, k))
        return 0.0


# ---------------------------------------------------------------------------------------------------------------
# Timing one shape
# ---------------------------------------------------------------------------------------------------------------

def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@dataclass
class Timing:
    time_s: float  # median of the timed runs of the stand-in
    baseline_time_s: float  # median of the baseline's
    repeats: int  # timed runs per side
    config: object
    calc_diff: float
    spread: float | None = None  # max over both sides of (max - min) / median of the timed runs; None for 1 run
    stopped_by: str = ""  # "spread", "budget" or "max_repeats": why the repeats stopped


def relative_spread(times: list[float]) -> float | None:
    """(max - min) / median of the timed runs, None for fewer than two."""
    if len(times) < 2:
        return None
    return (max(times) - min(times)) / statistics.median(times)


WARMUP_ROWS = 256  # rows of A the light warm-up's baseline call multiplies


def _first_rows(case: GemmCase, rows: int) -> GemmCase:
    """A view of ``case`` cut to its first ``rows`` rows of A (and of D, and of A's scales)."""
    rows = min(rows, case.m)
    return GemmCase(case.dtype, rows, case.n, case.k, case.a[:rows], case.b, case.d[:rows],
                    None if case.sfa is None else case.sfa[:rows], case.sfb)


def time_shape(runner, case: GemmCase, *, min_repeats: int = 2, max_repeats: int = 10, target_s: float = 0.5,
               spread_tol: float = 0.05, light_warmup_gflop: float | None = None) -> Timing:
    """Warm both sides once (untimed: loads or compiles the kernel, faults pages in), then time stand-in and
    baseline alternately, one pair at a time, until after at least ``min_repeats`` pairs either the spread of both
    sides is within ``spread_tol`` (run-to-run: (max - min) / median) or each side has had ``target_s`` seconds of
    timed work, and never more than ``max_repeats`` pairs.

    A shape of at least ``light_warmup_gflop`` GFLOP (2MNK) gets the light warm-up instead of a whole untimed pair:
    the stand-in's kernel is built or loaded in this process with nothing launched (``runner.build``), D's pages
    are written once, and the baseline runs on the first WARMUP_ROWS rows of A (numpy's threads and paths awake).

    NOTES: a long shape stops at ``min_repeats`` (its budget is spent by then), a quiet short one as soon as its
    runs agree; a noisy short one repeats up to ``max_repeats``. The reported times stay medians. The light
    warm-up leaves the first timed call nothing a second call would not also pay (the kernel loaded, D mapped,
    the baseline allocates its product on every call anyway), and saves a third of a long shape's wall time at
    --repeats 1.

    The baseline's timed work includes its decode and the cast of its product to bf16 (what a user's code pays);
    calc_diff compares the stand-in's D with the baseline's fp32 product."""
    held: list[np.ndarray] = []

    configs: list[object] = []

    def stand_in() -> None:
        configs[:] = [runner.run(case)]

    def baseline() -> None:
        held.clear()  # NOTES: drop the previous product first, so two fp32 M x N products are never alive at once
        product = baseline_product(case)
        product.astype(BF16)
        held.append(product)

    if light_warmup_gflop is not None and 2.0 * case.m * case.n * case.k >= light_warmup_gflop * 1e9:
        runner.build(case.dtype, case.m, case.n, case.k)
        case.d[...] = 0
        baseline_product(_first_rows(case, WARMUP_ROWS))
    else:
        stand_in()
        baseline()
    # NOTES: a kernel compiled by the warm-up links its native library on a background thread: wait for it, so
    # the timed calls never overlap the C compiler.
    from deep_gemm.jit.compile import wait_native_builds

    wait_native_builds()
    ours, theirs = [], []
    stopped_by = "max_repeats"
    while len(ours) < max_repeats:
        ours.append(_timed(stand_in))
        theirs.append(_timed(baseline))
        if len(ours) < min_repeats:
            continue
        spreads = (relative_spread(ours), relative_spread(theirs))
        if all(s is not None and s <= spread_tol for s in spreads):
            stopped_by = "spread"
            break
        if min(sum(ours), sum(theirs)) >= target_s:
            stopped_by = "budget"
            break
    diff = calc_diff(case.d, held[0])
    spreads = [s for s in (relative_spread(ours), relative_spread(theirs)) if s is not None]
    return Timing(statistics.median(ours), statistics.median(theirs), len(ours), configs[0], diff,
                  max(spreads) if spreads else None, stopped_by)


def run_shape(row: dict, runner, rng: np.random.Generator, *, min_repeats: int, max_repeats: int, target_s: float,
              spread_tol: float, mem_budget_bytes: float | None, mem_available: Callable[[], int],
              make_case_fn: Callable = None, time_fn: Callable = None, mem_fraction: float = 0.85,
              light_warmup_gflop: float | None = None) -> dict:
    """Fill one CPU row (new_row's roofline columns already set): skipped if the shape needs more than
    ``mem_fraction`` of MemAvailable (or ``mem_budget_bytes``), else timed; any error is recorded in the row.
    Used by the single-process sweep and by each Dask worker."""
    from _sweep_csv import config_to_str, describe_error, set_performance

    make_case_fn = make_case_fn or make_case
    time_fn = time_fn or time_shape
    dtype, m, n, k = row["dtype"], row["m"], row["n"], row["k"]
    need = shape_memory_bytes(dtype, m, n, k)
    avail = mem_available()
    budget = mem_fraction * avail
    if mem_budget_bytes is not None:
        budget = min(budget, mem_budget_bytes)
    if need > budget:
        row.update(status="skipped", error=f"needs {need / 2**30:.2f} GiB > budget {budget / 2**30:.2f} GiB "
                                            f"(MemAvailable {avail / 2**30:.2f} GiB)")
        return row
    case = None
    try:
        case = make_case_fn(dtype, m, n, k, rng)
        timing = time_fn(runner, case, min_repeats=min_repeats, max_repeats=max_repeats, target_s=target_s,
                         spread_tol=spread_tol, light_warmup_gflop=light_warmup_gflop)
        set_performance(row, timing.time_s, timing.baseline_time_s)
        config = timing.config if timing.config is not None else runner.config(dtype, m, n, k)
        row.update(calc_diff=timing.calc_diff, repeats=timing.repeats, spread=timing.spread,
                   config=config_to_str(config))
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 (recorded in the row; the sweep goes on)
        row.update(status="failed", error=describe_error(e))
    finally:
        del case
    return row
