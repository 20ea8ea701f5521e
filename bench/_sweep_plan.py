"""Planning the CPU sweep: per-shape time estimates (fitted from measured rows when there are some), kernel groups
(shapes sharing one compiled kernel), and the stratified subset ``--budget-hours`` runs.

Pure Python (no numpy, no deep_gemm): decides what to run, measures nothing.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterable

from shapes import gemm_flops

Task = tuple[str, int, int, int]  # (dtype, m, n, k)

# NOTES: used only until measured rows exist (a resumed file, or --plan-from). Stand-in 60 and numpy 110 GFLOP/s are
# the middle of what the quick sweep and perf_check measured on the project's 2-core machine (stand-in 30-120,
# numpy 80-150); a new kernel compiles in 3-11 s there (jit_bench, the quick sweep), 8 s is the planning figure.
DEFAULT_RATES_GFLOPS = {"stand_in": 60.0, "baseline": 110.0}
DEFAULT_COMPILE_S = 8.0
# Operand generation, calc_diff and bookkeeping, per byte of A + B + D (measured ~0.3-0.5 GB/s of operands here).
SETUP_S_PER_BYTE = 1 / 0.3e9
SETUP_S = 0.02
LIGHT_WARMUP_S = 0.5  # loading a cached kernel in this process, and the baseline on 256 rows
LIGHT_WARMUP_GFLOP = 50.0  # sweep.py's default --light-warmup-gflop


def fit_rates(rows: Iterable[dict]) -> dict[str, dict[str, float]]:
    """Median stand-in and baseline GFLOP/s per dtype over the ok CPU rows of a results file (typed rows); dtypes
    without rows are absent. {"bf16": {"stand_in": .., "baseline": .., "rows": n}, ...}"""
    out: dict[str, dict[str, float]] = {}
    for dtype in ("bf16", "fp8"):
        sel = [r for r in rows if r["mode"] == "cpu" and r["dtype"] == dtype and r["status"] == "ok"
               and r.get("gflops") and r.get("baseline_gflops")]
        if sel:
            out[dtype] = {"stand_in": statistics.median(r["gflops"] for r in sel),
                          "baseline": statistics.median(r["baseline_gflops"] for r in sel), "rows": len(sel)}
    return out


def shape_seconds(task: Task, rates: dict[str, float], *, min_repeats: int, max_repeats: int,
                  target_s: float, light_warmup_gflop: float | None = None) -> float:
    """Expected wall seconds of one shape, compile excluded: setup + one untimed warm-up pair (LIGHT_WARMUP_S
    instead for a shape of at least ``light_warmup_gflop`` GFLOP: _sweep_cpu.time_shape) + the timed pairs.

    The timed pairs are bounded above the way time_shape stops: ``min_repeats`` pairs for a shape whose
    ``min_repeats`` runs already exceed ``target_s``, else up to ``max_repeats`` pairs or about ``target_s`` of
    work per side, whichever is less (the spread rule can only stop earlier)."""
    dtype, m, n, k = task
    flops = gemm_flops(m, n, k)
    ours = flops / (rates["stand_in"] * 1e9)
    theirs = flops / (rates["baseline"] * 1e9)
    per_side = max(ours, theirs)
    timed = max(min_repeats, min(max_repeats, math.ceil(target_s / max(per_side, 1e-9))))
    operand_bytes = (2 if dtype == "bf16" else 1) * (m + n) * k + 2 * m * n
    light = light_warmup_gflop is not None and flops >= light_warmup_gflop * 1e9
    warm_up = LIGHT_WARMUP_S if light else ours + theirs
    return SETUP_S + operand_bytes * SETUP_S_PER_BYTE + warm_up + timed * (ours + theirs)


def kernel_groups(tasks: Iterable[Task], key: Callable[[Task], tuple]) -> dict[tuple, list[Task]]:
    """Tasks grouped by the kernel they need (``key``: _sweep_cpu.kernel_key bound to a runner), groups in the
    order of their first task, tasks in their given order."""
    groups: dict[tuple, list[Task]] = {}
    for task in tasks:
        groups.setdefault(key(task), []).append(task)
    return groups


def stratum(task: Task) -> tuple:
    """A shape's stratum: dtype, M class (decode-like <= 512, mid <= 4096, prefill-like above) and its FLOPs within a
    factor of 8 (log8 of 2MNK), so a subset keeps thin, mid and huge problems of every M class."""
    dtype, m, n, k = task
    m_class = 0 if m <= 512 else 1 if m <= 4096 else 2
    return (dtype, m_class, int(math.log(gemm_flops(m, n, k), 8)))


def plan_budget(tasks: list[Task], budget_s: float, cost: Callable[[Task], float], key: Callable[[Task], tuple],
                *, compile_s: float = DEFAULT_COMPILE_S, workers: int = 1, seed: int = 0) -> dict:
    """A stratified subset of ``tasks`` whose estimated cost fits ``budget_s`` seconds on ``workers`` workers.

    Each stratum's tasks are taken in a seeded random order, one stratum at a time in turn (round robin), so every
    stratum is represented before any gets a second shape; a task costs ``cost(task)`` plus ``compile_s`` if its
    kernel (``key``) is not yet in the plan; a task that no longer fits is passed over. The capacity is
    ``budget_s * workers`` (perfect packing: the real wall time on many workers is longer by the last shapes' tail).

    Returns {"tasks": chosen in their given order, "estimated_s": planned cost (one-worker seconds), "capacity_s",
    "strata": number of strata, "strata_covered", "dropped": tasks left out, "kernels": distinct kernels chosen}."""
    if budget_s <= 0:
        raise ValueError(f"budget_s={budget_s} must be > 0")
    capacity = budget_s * workers
    queues: dict[tuple, list[Task]] = {}
    for task in tasks:
        queues.setdefault(stratum(task), []).append(task)
    rng = random.Random(seed)
    for name in sorted(queues):
        rng.shuffle(queues[name])
    chosen: set[Task] = set()
    kernels: set[tuple] = set()
    used = 0.0
    covered = set()
    active = sorted(queues)
    while active:
        still = []
        for name in active:
            queue = queues[name]
            while queue:
                task = queue.pop(0)
                kernel = key(task)
                price = cost(task) + (0.0 if kernel in kernels else compile_s)
                if used + price <= capacity:
                    chosen.add(task)
                    kernels.add(kernel)
                    used += price
                    covered.add(name)
                    break
            if queue:
                still.append(name)
        active = still
    ordered = [t for t in tasks if t in chosen]
    return {"tasks": ordered, "estimated_s": used, "capacity_s": capacity, "strata": len(queues),
            "strata_covered": len(covered), "dropped": len(tasks) - len(ordered), "kernels": len(kernels)}


def estimate_total(tasks: list[Task], cost: Callable[[Task], float], key: Callable[[Task], tuple], *,
                   compile_s: float = DEFAULT_COMPILE_S) -> dict:
    """Estimated one-worker seconds of ``tasks``: their costs plus one compile per distinct kernel."""
    kernels = {key(t) for t in tasks}
    run = sum(cost(t) for t in tasks)
    return {"seconds": run + compile_s * len(kernels), "run_s": run, "kernels": len(kernels)}


def extrapolate(rows: list[dict], selection: list[Task], walls: list[dict], key: Callable[[Task], tuple], *,
                min_repeats: int, max_repeats: int, target_s: float, compile_s: float | None,
                light_warmup_gflop: float | None = None) -> dict:
    """The whole selection's expected time, from what this run measured.

    Model: shape_seconds with the stand-in and baseline rates fitted to the file's ok rows (fit_rates), scaled by
    the ratio measured / modelled seconds over the shapes timed in this run (``walls``: {"task", "seconds",
    "compile_s"}; seconds include the compile), plus one compile per distinct kernel at ``compile_s`` (measured
    per kernel in this run, else DEFAULT_COMPILE_S). On N machines: the one-machine figure / N (perfect split,
    the last shapes' tail not counted)."""
    fitted = fit_rates(rows)
    rates = {d: fitted.get(d, DEFAULT_RATES_GFLOPS) for d in ("bf16", "fp8")}

    def cost(task: Task) -> float:
        return shape_seconds(task, rates[task[0]], min_repeats=min_repeats, max_repeats=max_repeats,
                             target_s=target_s, light_warmup_gflop=light_warmup_gflop)

    measured = sum(max(0.0, w["seconds"] - w["compile_s"]) for w in walls)
    modelled = sum(cost(tuple(w["task"])) for w in walls)
    ratio = measured / modelled if walls and modelled > 0 else None
    per_kernel = compile_s if compile_s is not None else DEFAULT_COMPILE_S
    total = estimate_total(selection, cost, key, compile_s=per_kernel)
    run_s = total["run_s"] * (ratio if ratio is not None else 1.0)
    return {"shapes": len(selection), "kernels": total["kernels"], "compile_s_per_kernel": per_kernel,
            "compile_from": "measured" if compile_s is not None else "default",
            "rates_gflops": {d: {k: round(v, 1) for k, v in rates[d].items()} for d in rates},
            "rates_from": {d: f"{int(fitted[d]['rows'])} measured rows" if d in fitted else "defaults"
                           for d in rates},
            "measured_s": measured, "modelled_s": modelled, "measured_over_modelled": ratio,
            "one_machine_hours": (run_s + per_kernel * total["kernels"]) / 3600}
