"""The 1,055-shape GEMM sweep (bench/shapes.py), measured on this CPU (the deep_gemm stand-in against the numpy
baseline a user would write) and/or predicted for the modelled Ascend NPU (deep_gemm.estimate_gemm), for BF16 and
FP8 operands; writes DIR/results.csv row by row, DIR/summary.json and PNG plots, and prints a summary.

    python bench/sweep.py --mode model --dtype both          # 2,110 predictions for the 950DT, in seconds
    python bench/sweep.py --mode both --quick                 # the 11-shape stratified subset, both modes
    python bench/sweep.py --mode cpu --out sweep_out --resume # continue an interrupted CPU sweep
    python bench/sweep.py --mode cpu --scheduler tcp://HOST:8786  # on a Dask cluster (the "distributed" extra)
    python bench/sweep.py --mode cpu --budget-hours 2         # a stratified subset planned to fit 2 hours

Numbers from ``mode=cpu`` are measured on this machine; numbers from ``mode=model`` are predictions for the chip.

results.csv schema (one row per (mode, dtype, m, n, k); the same columns for every mode; empty = not applicable):
    mode              "cpu" (measured here) or "model" (predicted for the modelled NPU)
    dtype             operand dtype, "bf16" or "fp8" (e4m3 with 1x32 UE8M0 scales); D is always bf16
    m, n, k           D[m, n] = A[m, k] @ B[n, k]^T
    arch              cpu: the arch the stand-in's kernels are built for; model: the modelled NPU
    num_ai_cores      logical AI cores of the kernel (cpu) or of the modelled chip (model)
    status            "ok", "skipped" (reason in error, e.g. not enough free memory) or "failed" (error)
    error             why the row is skipped or failed; empty when ok
    flops             2MNK
    bytes             compulsory traffic: A + B at their dtype (+ fp8 scales) + D in bf16
    intensity         flops / bytes [FLOP/B]
    peak_gflops       the machine's peak: cpu = the numpy fp32 ceiling of the machine (Dask: of the worker) that
                      timed the row, best of several samples (or --ceiling-gflops); model = Cube peak [GFLOP/s]
    bandwidth_gbs     cpu = measured copy bandwidth; model = the arch's HBM bandwidth [GB/s]
    ridge             peak / bandwidth [FLOP/B]
    compute_bound     1 if intensity > ridge, else 0
    time_us           cpu: median stand-in time (warm, compile excluded); model: predicted time [us]
    gflops            flops / time [GFLOP/s]
    frac_peak         gflops / peak_gflops
    frac_attainable   gflops / min(peak_gflops, intensity * bandwidth_gbs)
    bound             model: the binding unit the model reports ("cube", "l2", "hbm", "fixpipe", ...); cpu: empty
    baseline_time_us  cpu: median time of the numpy baseline (decode + fp32 a @ b.T + cast to bf16) [us]
    baseline_gflops   cpu: flops / baseline time
    baseline_frac_peak  cpu: baseline_gflops / peak_gflops
    speedup           cpu: baseline_time_us / time_us (> 1: the stand-in is faster)
    calc_diff         cpu: 1 - 2 sum(xy) / sum(x^2 + y^2) of the stand-in's D against the baseline's fp32 product
    repeats           cpu: timed runs per side (after one untimed warm-up each, or the light warm-up for shapes of
                      at least --light-warmup-gflop GFLOP); stops once the spread is within --spread-tol or each
                      side had --target-seconds, between --repeats and --max-repeats
    config            the kernel config, "field=value ..." (GemmConfig fields)
    spread            cpu: run-to-run spread, (max - min) / median of the timed runs, the larger of the two sides;
                      empty for a single run
    over_peak         1 if frac_peak > 1 (faster than the ceiling: the ceiling was measured busier, or the stand-in's
                      Cube ran on the AMX unit, which can beat numpy's fp32 GEMM), else 0
    host              cpu: host name of the machine that timed the row
    cpu_model         cpu: its CPU model name (/proc/cpuinfo)

Resume: ``--resume`` appends to DIR/results.csv and skips keys whose last row is ok or skipped; failed rows are
retried, and the newest row of a key is the one that counts: when the run ends (finished, interrupted or stopped)
the file is rewritten with one row per key, a retried shape's new row replacing its failed one (written beside
it and renamed over it, so either file is whole). Without it an existing results.csv is moved to
results.csv.bak. Ctrl-C keeps every finished row (each is written whole and fsynced) and still writes the summary.
A failed write (a full disk) leaves results.csv ending with the last finished row, prints where the sweep stopped
and the summary of the rows so far, and exits with status 1; bad arguments and paths are one-line errors. Rows are
the same whichever backend wrote them, so a sweep started on one machine can be resumed on a cluster and back.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

# NOTES: bench/ is a folder of scripts, not a package; its helpers import each other by bare name.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import shapes as shapes_mod  # noqa: E402
from _sweep_cli import MEM_FRACTION, check_args  # noqa: E402
from _sweep_cli import build_parser as _build_parser  # noqa: E402
from _sweep_csv import (  # noqa: E402
    COLUMNS,
    STATUSES,
    ResultsWriteError,
    ResultsWriter,
    compact_results,
    describe_error,
    done_keys,
    new_row,
    read_results,
    row_key,
)
from _sweep_report import format_summary, summarize, write_plots, write_summary  # noqa: E402

DTYPES = ("bf16", "fp8")
MODES = ("model", "cpu")
CEILING_SIZES = (1024, 2048, 3072, 4096)


def build_parser() -> argparse.ArgumentParser:
    """The sweep's options (bench/_sweep_cli.py), described by this module's first paragraph."""
    return _build_parser(__doc__.split("\n\n")[0])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line parsed and checked across options (exit status 2 with one line on a bad one)."""
    parser = build_parser()
    return check_args(parser, parser.parse_args(argv))


def check_fits_machine(shapes: list[shapes_mod.Shape], dtypes: tuple[str, ...], source: str) -> None:
    """Refuse, before any work, a shape of a --shapes file that could never run on this machine in cpu mode: its
    operands, output and baseline need more than the machine's physical memory (MemTotal)."""
    from _sweep_cpu import mem_total_bytes, shape_memory_bytes

    total = mem_total_bytes()
    for m, n, k in shapes:
        for dtype in dtypes:
            need = shape_memory_bytes(dtype, m, n, k)
            if need > total:
                raise ValueError(f"{source}: shape {m} {n} {k} ({dtype}) needs {need / 2**30:.3g} GiB, more than this "
                                 f"machine's {total / 2**30:.1f} GiB of memory: it can never run in cpu mode")


def select_shapes(args: argparse.Namespace) -> list[shapes_mod.Shape]:
    """The shapes of this run: --shapes FILE, else --quick's subset, else all 1,055; then the first --limit."""
    if args.shapes is not None:
        selected = shapes_mod.load_shapes(args.shapes)
    elif args.quick:
        selected = shapes_mod.quick_shapes()
    else:
        selected = shapes_mod.all_shapes()
    return selected[: args.limit] if args.limit is not None else selected


def _progress(total: int, desc: str, unit: str, enabled: bool, scale: float = 1.0):
    from tqdm import tqdm

    # NOTES: redrawn 10x a second on a terminal, every 30 s into a log file (a redirected stderr).
    interval = 0.1 if sys.stderr.isatty() else 30.0
    # NOTES: totals are integers (shapes, or FLOPs shown as GFLOP through unit_scale) so the updates add up to the
    # total exactly.
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=scale, disable=not enabled, dynamic_ncols=True,
                smoothing=0.1, mininterval=interval, maxinterval=max(10.0, interval), file=sys.stderr,
                bar_format="{l_bar}{bar}| {n:.4g}/{total:.4g} {unit} [{elapsed}<{remaining}]{postfix}")


def _check_resume_target(existing: list[dict], mode: str, arch: str, num_ai_cores: int, path: Path) -> None:
    """A resumed file must hold rows for the same target; mixing archs or core counts in one file is refused."""
    other = {(r["arch"], r["num_ai_cores"]) for r in existing if r["mode"] == mode} - {(arch, num_ai_cores)}
    if other:
        raise SystemExit(f"{path} holds {mode} rows for {sorted(other)} but this run targets {(arch, num_ai_cores)}:"
                         " use another --out")


def run_model(args, shapes, dtypes, writer, existing, done, machine, *, estimator=None) -> None:
    """Predict every pending (dtype, shape) with the chip model and append its row."""
    from _sweep_model import chip_roofline, model_row, resolve_estimator

    estimator = estimator or resolve_estimator()
    for dtype in dtypes:
        roof = chip_roofline(args.arch, args.num_ai_cores, dtype)
        _check_resume_target(existing, "model", roof["arch"], roof["num_ai_cores"], writer.path)
        machine["chip"].append({"dtype": dtype, **roof, "ridge": roof["peak_flops"] / roof["bandwidth_bytes_s"]})
        pending = [s for s in shapes if ("model", dtype, *s) not in done]
        print(f"model {dtype}: {len(pending)} of {len(shapes)} shapes to predict for {roof['arch']} "
              f"({roof['num_ai_cores']} AI cores; MODELLED, not measured)", file=sys.stderr)
        with _progress(len(pending), f"model {dtype}", "shape", not args.no_progress) as bar:
            for m, n, k in pending:
                writer.write(model_row(estimator, dtype, m, n, k, roof))
                bar.update(1)


def measure_machine(args, cpu_machine: dict | None) -> dict:
    """This CPU: host and model, ceiling (--ceiling-gflops, else the best of several numpy fp32 samples taken at low
    load), FMA peak, bandwidth (--bandwidth-gbs, else measured); ``cpu_machine`` entries (tests) win."""
    from _sweep_ceiling import measure_machine as measure

    given = dict(cpu_machine or {})
    ceiling = given.get("peak_gflops", args.ceiling_gflops)
    if ceiling is None:
        print("measuring the CPU ceiling (numpy fp32 squares, best of 3 samples at low load) and FMA peak ...",
              file=sys.stderr, flush=True)
    info = measure(ceiling_gflops=ceiling, bandwidth_gbs=given.get("bandwidth_gbs", args.bandwidth_gbs),
                   sizes=CEILING_SIZES)
    info.update(given)
    info["ridge"] = info["peak_gflops"] / info["bandwidth_gbs"]
    fma = f", FMA peak {info['fma_peak_gflops']:.1f}" if info.get("fma_peak_gflops") else ""
    print(f"CPU: ceiling {info['peak_gflops']:.1f} GFLOP/s{fma}, bandwidth {info['bandwidth_gbs']:.1f} GB/s, "
          f"ridge {info['ridge']:.1f} FLOP/B", file=sys.stderr, flush=True)
    return info


def plan_cpu(args, tasks: list, existing: list[dict], runner) -> tuple:
    """(cost, key, plan): per-shape seconds (rates fitted from the file's measured rows, else defaults), the kernel
    key, and a function (tasks, machines) -> (tasks, plan info) applying --budget-hours (identity without it)."""
    from _sweep_cpu import kernel_key
    from _sweep_plan import DEFAULT_COMPILE_S, DEFAULT_RATES_GFLOPS, fit_rates, plan_budget, shape_seconds

    fitted = fit_rates(existing)
    rates = {d: fitted.get(d, DEFAULT_RATES_GFLOPS) for d in DTYPES}

    def cost(task):
        return shape_seconds(task, rates[task[0]], min_repeats=args.repeats, max_repeats=args.max_repeats,
                             target_s=args.target_seconds, light_warmup_gflop=args.light_warmup_gflop)

    def key(task):
        return kernel_key(runner, *task)

    def plan(tasks, machines: int = 1):
        if args.budget_hours is None:
            return tasks, None
        got = plan_budget(tasks, args.budget_hours * 3600, cost, key, workers=machines, seed=args.seed,
                          compile_s=getattr(runner, "compile_s", DEFAULT_COMPILE_S))
        info = {k: v for k, v in got.items() if k != "tasks"}
        info.update(budget_hours=args.budget_hours, machines=machines, selected=len(tasks), planned=len(got["tasks"]),
                    rates={d: {k: round(v, 1) for k, v in rates[d].items()} for d in rates},
                    rates_from={d: "measured rows" if d in fitted else "defaults" for d in DTYPES})
        print(f"budget {args.budget_hours} h on {machines} machine(s): {len(got['tasks'])} of {len(tasks)} shapes "
              f"planned (stratified, {got['strata_covered']}/{got['strata']} strata, {got['kernels']} kernels, "
              f"estimated {got['estimated_s'] / 3600:.2f} machine-hours)", file=sys.stderr, flush=True)
        return got["tasks"], info

    return cost, key, plan


def print_plan(args, shapes, dtypes, existing, done, runner) -> None:
    """--plan-only: the estimate of the pending CPU shapes (one machine, and 2 / 4 / 16 of them), and the budget
    plan; writes nothing."""
    from _sweep_plan import DEFAULT_COMPILE_S, DEFAULT_RATES_GFLOPS, estimate_total, fit_rates

    tasks = [(dtype, *s) for dtype in dtypes for s in shapes if ("cpu", dtype, *s) not in done]
    cost, key, plan = plan_cpu(args, tasks, existing, runner)

    compile_s = getattr(runner, "compile_s", DEFAULT_COMPILE_S)
    total = estimate_total(tasks, cost, key, compile_s=compile_s)
    fitted = fit_rates(existing)
    rates = ", ".join(f"{d} stand-in {r['stand_in']:.0f} / numpy {r['baseline']:.0f} GFLOP/s"
                      f" ({'fitted to ' + str(int(r['rows'])) + ' rows' if 'rows' in r else 'defaults'})"
                      for d, r in ((d, fitted.get(d, DEFAULT_RATES_GFLOPS)) for d in dtypes))
    hours = total["seconds"] / 3600
    print(f"plan: {len(tasks)} (dtype, shape) runs, {total['kernels']} kernels; estimated {hours:.2f} h on one "
          f"machine ({total['run_s'] / 3600:.2f} h timing at {rates}, warm-up (light from "
          f"{args.light_warmup_gflop:g} GFLOP) + between --repeats "
          f"{args.repeats} and --max-repeats {args.max_repeats} pairs within --target-seconds "
          f"{args.target_seconds}; {total['kernels']} x {compile_s:.1f} s compiling); on 2 / 4 / 16 machines "
          f"{hours / 2:.2f} / {hours / 4:.2f} / {hours / 16:.2f} h (a perfect split)", file=sys.stderr, flush=True)
    if args.budget_hours is not None:
        plan(tasks, 1)


def run_cpu(args, shapes, dtypes, writer, existing, done, machine, *, runner=None, cpu_machine=None,
            mem_available=None, result: dict | None = None) -> dict:
    """Time every pending (dtype, shape) (or --budget-hours' subset of them) on this CPU or on a Dask cluster:
    stand-in vs numpy baseline; append one row each. Fills and returns ``result``: {"shapes_run": [[dtype, m, n,
    k], ...] in the order their rows were written, "plan": the budget plan or None} (filled as rows are written, so
    an interrupted run still says what ran)."""
    from _sweep_cpu import DeepGemmRunner, mem_available_bytes, run_shape, shape_rng

    runner = runner or DeepGemmRunner(args.arch, args.num_ai_cores, args.workers, not args.no_precompile)
    mem_available = mem_available or mem_available_bytes
    arch, cores = runner.target()
    _check_resume_target(existing, "cpu", arch, cores, writer.path)
    tasks = [(dtype, *s) for dtype in dtypes for s in shapes if ("cpu", dtype, *s) not in done]
    print(f"cpu: {len(tasks)} of {len(shapes) * len(dtypes)} (dtype, shape) runs to do; kernels built for {arch} "
          f"with {cores} logical AI cores", file=sys.stderr, flush=True)
    result = result if result is not None else {}
    result.update(shapes_run=[], plan=None, walls=[], compile_s=None)
    if not tasks:
        return result
    cost, key, plan = plan_cpu(args, tasks, existing, runner)
    result["selection"] = [(dtype, *s) for dtype in dtypes for s in shapes]
    result["key"] = key
    if getattr(runner, "compile_s", None) is not None:
        result["compile_s"] = runner.compile_s  # a runner that compiles nothing (plumbing runs)
    progress = functools.partial(_progress, desc="cpu", unit="GFLOP", enabled=not args.no_progress, scale=1e-9)

    if args.scheduler is not None or args.local_cluster is not None:
        from _sweep_dask import run_cpu_dask

        info = {"backend": "dask", "target": f"{arch}, {cores} AI cores", "runner": runner.name}
        machine["cpu"] = info

        def planned(all_tasks, machines):
            chosen, result["plan"] = plan(all_tasks, machines)
            return chosen

        run_cpu_dask(args, tasks, writer, info, runner=runner, arch=arch, num_ai_cores=cores, cost=cost,
                     kernel_key=key, plan=planned, progress=progress, written=result["shapes_run"],
                     walls=result["walls"])
        fresh = [w["compile_s"] for w in result["walls"] if w["compile_s"] > 0.5]  # loads from a cache take less
        if fresh:
            result["compile_s"] = sum(fresh) / len(fresh)
        return result

    tasks, result["plan"] = plan(tasks, 1)
    info = measure_machine(args, cpu_machine)
    info["target"] = f"{arch}, {cores} AI cores"
    info["runner"] = runner.name
    machine["cpu"] = info
    peak, bandwidth = info["peak_gflops"] * 1e9, info["bandwidth_gbs"] * 1e9
    budget = None if args.max_mem_gb is None else args.max_mem_gb * 2**30

    with runner.scope():
        pre = runner.precompile(tasks)
        if pre["kernels"] or pre["error"]:
            print(f"precompile: {pre['kernels']} kernels in {pre['seconds']:.1f} s"
                  + (f" ({pre['error']})" if pre["error"] else ""), file=sys.stderr, flush=True)
        info["precompile"] = pre
        if pre["kernels"] and not pre["error"]:
            result["compile_s"] = pre["seconds"] / pre["kernels"]  # wall per kernel, --workers processes at once
        total = sum(shapes_mod.gemm_flops(m, n, k) for _, m, n, k in tasks)
        with progress(total) as bar:
            for dtype, m, n, k in tasks:
                bar.set_postfix_str(f"{dtype} {m}x{n}x{k}")
                row = new_row("cpu", dtype, m, n, k, arch=arch, num_ai_cores=cores, peak_flops=peak,
                              bandwidth_bytes_s=bandwidth)
                row.update(host=info.get("host"), cpu_model=info.get("cpu_model"))
                start = time.perf_counter()
                run_shape(row, runner, shape_rng(args.seed, dtype, m, n, k), min_repeats=args.repeats,
                          max_repeats=args.max_repeats, target_s=args.target_seconds, spread_tol=args.spread_tol,
                          mem_budget_bytes=budget, mem_available=mem_available, mem_fraction=MEM_FRACTION,
                          light_warmup_gflop=args.light_warmup_gflop)
                writer.write(row)
                result["shapes_run"].append([dtype, m, n, k])
                result["walls"].append({"task": [dtype, m, n, k], "seconds": time.perf_counter() - start,
                                        "compile_s": 0.0})
                bar.update(shapes_mod.gemm_flops(m, n, k))
                if row["status"] == "ok":
                    bar.set_postfix_str(f"{dtype} {m}x{n}x{k}: {row['gflops']:.1f} GFLOP/s, "
                                        f"{row['speedup']:.2f}x numpy")
    if isinstance(info.get("ceiling_sizes"), list):
        # NOTES: measured again at the end (rows keep the start's figure): on a shared machine the two differ, and
        # the summary shows both so a reader can tell how much the load moved during the sweep.
        from _sweep_ceiling import measure_ceiling

        info["peak_gflops_end"] = measure_ceiling(CEILING_SIZES, samples=1, max_wait_s=0)["peak_gflops"]
    return result


def _cpu_rows_since(path: Path, offset: int) -> list[list]:
    """[dtype, m, n, k] of each complete cpu row in ``path`` after byte ``offset``, in file order.

    NOTES: read back from the file rather than counted as rows are written, so a Ctrl-C between a row's write and
    its bookkeeping cannot make the summary disagree with the CSV."""
    import csv
    import io

    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for cells in csv.reader(io.StringIO(text)):
        if len(cells) != len(COLUMNS):
            continue
        row = dict(zip(COLUMNS, cells, strict=True))
        if row["mode"] == "cpu" and row["status"] in STATUSES:
            try:
                out.append([row["dtype"], int(row["m"]), int(row["n"]), int(row["k"])])
            except ValueError:
                continue
    return out


def run(argv: list[str] | None = None, *, runner=None, estimator=None, cpu_machine: dict | None = None,
        mem_available=None) -> dict:
    """Run the sweep the arguments describe and return the summary (also in DIR/summary.json).

    ``runner`` (cpu mode: an object like _sweep_cpu.DeepGemmRunner), ``estimator`` (model mode: like
    deep_gemm.estimate_gemm), ``cpu_machine`` ({"peak_gflops", "bandwidth_gbs"}) and ``mem_available`` (a callable
    returning free bytes) replace the real ones, for tests."""
    args = parse_args(argv)
    shapes = select_shapes(args)
    dtypes = DTYPES if args.dtype == "both" else (args.dtype,)
    modes = MODES if args.mode == "both" else (args.mode,)
    if "cpu" in modes and args.shapes is not None:
        check_fits_machine(shapes, dtypes, str(args.shapes))
    out_dir: Path = args.out
    results = out_dir / "results.csv"

    # Fail before any work if a requested mode cannot run.
    if "model" in modes:
        from _sweep_model import chip_roofline, resolve_estimator

        for dtype in dtypes:
            chip_roofline(args.arch, args.num_ai_cores, dtype)  # unknown arch, bad core count, no FP8 Cube
        estimator = estimator or resolve_estimator()
    if "cpu" in modes and runner is None:
        from _sweep_cpu import DeepGemmRunner, NumpyRunner

        if args.runner == "numpy":
            runner = NumpyRunner(**({"arch": args.arch} if args.arch else {}),
                                 **({"num_ai_cores": args.num_ai_cores} if args.num_ai_cores else {}))
        else:
            runner = DeepGemmRunner(args.arch, args.num_ai_cores, args.workers, not args.no_precompile)
        runner.check_available()
    if "cpu" in modes and (args.scheduler is not None or args.local_cluster is not None):
        from _sweep_dask import require_distributed

        require_distributed()  # says which extra to install

    try:
        existing = read_results(results) if args.resume else []
    except OSError as e:
        raise ValueError(f"cannot read {results} to resume: {e.strerror or e}") from None
    done = done_keys(existing)
    if args.plan_only:
        print_plan(args, shapes, dtypes, existing, done, runner)
        return {"plan_only": True}
    if "cpu" in modes and args.local_cluster is not None and args.worker_cache_dir is not None:
        from _sweep_dask import check_worker_cache_dir

        # NOTES: a local cluster's workers run on this machine: refuse an unusable directory before the sweep starts
        # (deep_gemm would fall back to each worker's own cache, silently); --scheduler's workers check it themselves.
        check_worker_cache_dir(str(args.worker_cache_dir))
    machine: dict = {"chip": [], "cpu": None}
    cpu_run: dict = {}
    started = time.time()
    interrupted = False
    stopped = None
    try:
        writer = ResultsWriter(results, fresh=not args.resume)
    except ResultsWriteError as e:
        raise ValueError(f"--out {out_dir}: {e}") from None
    start_offset = results.stat().st_size  # what this invocation wrote starts here
    print(f"sweep: {len(shapes)} shapes x {list(dtypes)} x {list(modes)} -> {results}"
          + (f" (resuming: {len(done)} rows done)" if args.resume else ""), file=sys.stderr, flush=True)
    try:
        if "model" in modes:
            run_model(args, shapes, dtypes, writer, existing, done, machine, estimator=estimator)
        if "cpu" in modes:
            run_cpu(args, shapes, dtypes, writer, existing, done, machine, runner=runner, cpu_machine=cpu_machine,
                    mem_available=mem_available, result=cpu_run)
    except KeyboardInterrupt:
        interrupted = True
        print(f"\ninterrupted: finished rows are in {results}; rerun with --resume to continue", file=sys.stderr)
    except ResultsWriteError as e:
        # NOTES: the writer left the file ending with the last complete row; say where the sweep stopped.
        stopped = (f"stopped after {writer.rows_written} new rows: {e}; every finished row is intact in {results}: "
                   "free space and rerun with --resume to continue")
    finally:
        writer.close()

    # NOTES: read before compacting: start_offset is a byte offset into the file as this invocation appended to it.
    shapes_run = _cpu_rows_since(results, start_offset)
    try:
        compact_results(results)  # one row per key: a retried shape's row replaces its failed one
    except (OSError, ValueError) as e:
        print(f"could not rewrite {results} with one row per shape ({getattr(e, 'strerror', None) or e}): "
              "superseded failed rows stay in it (readers and --resume keep each shape's newest row)",
              file=sys.stderr)
    rows = read_results(results)
    selected = {(mode, dtype, *s) for mode in modes for dtype in dtypes for s in shapes}
    run_info = {
        "argv": list(argv) if argv is not None else sys.argv[1:],
        "shapes": len(shapes), "dtypes": list(dtypes), "modes": list(modes),
        "seconds": round(time.time() - started, 1), "interrupted": interrupted,
        "selected_rows": sum(row_key(r) in selected for r in rows),
        "cpu_count": os.cpu_count(),
        "backend": ("dask " + (args.scheduler or f"local cluster of {args.local_cluster}")
                    if args.scheduler is not None or args.local_cluster is not None else "single process"),
        "plan": cpu_run.get("plan"),
        # NOTES: exactly which CPU shapes this invocation ran (rows written, in order); rows of earlier runs of a
        # resumed file are in results.csv but not here.
        "shapes_run": shapes_run,
    }
    if stopped:
        run_info["stopped"] = stopped
    if cpu_run.get("walls"):
        from _sweep_plan import extrapolate

        run_info["shape_seconds"] = [{**w, "seconds": round(w["seconds"], 3), "compile_s": round(w["compile_s"], 3)}
                                     for w in cpu_run["walls"]]
        run_info["extrapolation"] = extrapolate(
            [r for r in rows if r["mode"] == "cpu"], cpu_run["selection"], cpu_run["walls"], cpu_run["key"],
            min_repeats=args.repeats, max_repeats=args.max_repeats, target_s=args.target_seconds,
            compile_s=cpu_run.get("compile_s"), light_warmup_gflop=args.light_warmup_gflop)
    summary = summarize(rows, machine=machine, run=run_info)
    if not args.no_plots and not stopped:
        try:
            plots = write_plots(rows, out_dir)
            summary["plots"] = [str(p) for p in plots]
        except Exception as e:  # noqa: BLE001 (plots are a convenience; the CSV and summary are written)
            summary["plots_error"] = describe_error(e)
    summary_error = None
    try:
        write_summary(summary, out_dir / "summary.json")
    except OSError as e:
        summary_error = f"could not write {out_dir / 'summary.json'}: {e.strerror or e} (the summary is printed above)"
    print(format_summary(summary))
    if summary_error is None:
        print(f"\nwrote {results} ({len(rows)} rows), {out_dir / 'summary.json'}"
              + "".join(f", {p}" for p in summary.get("plots", [])) + f" in {run_info['seconds']:.1f} s")
    if interrupted:
        if summary_error:
            print(summary_error, file=sys.stderr)
        raise SystemExit(130)
    if stopped or summary_error:
        raise SystemExit("sweep: " + "; ".join(x for x in (stopped, summary_error) if x))
    return summary


def main() -> None:
    try:
        run()
    except (ValueError, RuntimeError, OSError) as e:
        raise SystemExit(f"sweep: {e}") from None


if __name__ == "__main__":
    main()
