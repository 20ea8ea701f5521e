"""The command line of bench/sweep.py: its options (build_parser) and the checks across them (check_args). A
bench/ helper module (imported by bare name, like the other _sweep_*.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from _sweep_plan import LIGHT_WARMUP_GFLOP

# NOTES: leave room for the other processes of a shared machine; a shape needing more than this share of
# MemAvailable is skipped, not attempted.
MEM_FRACTION = 0.85


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse with bad arguments reported on one line (no usage block, no traceback), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")



def build_parser(description: str) -> argparse.ArgumentParser:
    """The sweep's argument parser (``description``: the first paragraph of sweep.py's docstring)."""
    p = _OneLineErrorParser(description=description, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mode", choices=("model", "cpu", "both"), default="model",
                   help="model (default): predict for the NPU, seconds; cpu: run deep_gemm here (hours for all shapes)")
    p.add_argument("--dtype", choices=("bf16", "fp8", "both"), default="both", help="operand dtype (default both)")
    p.add_argument("--quick", action="store_true", help="the stratified 11-shape subset (bench/shapes.py)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N shapes of the selection")
    p.add_argument("--shapes", type=Path, default=None, metavar="FILE",
                   help='shape file: CSV with m,n,k columns, or "M N K" lines')
    p.add_argument("--out", type=Path, default=Path("sweep_out"), metavar="DIR",
                   help="output directory (default sweep_out/)")
    p.add_argument("--resume", action="store_true", help="append to DIR/results.csv, skipping finished rows")
    p.add_argument("--arch", default=None, help="modelled NPU / kernel target: 950DT (default), 950PR, 910B2")
    p.add_argument("--num-ai-cores", type=int, default=None, help="logical AI cores (default: all of the arch's)")
    p.add_argument("--repeats", type=int, default=2, help="cpu: minimum timed runs per side (default 2)")
    p.add_argument("--max-repeats", type=int, default=10, help="cpu: maximum timed runs per side (default 10)")
    p.add_argument("--target-seconds", type=float, default=0.5,
                   help="cpu: time budget per side and shape: stop repeating once each side had this much timed work")
    p.add_argument("--light-warmup-gflop", type=float, default=LIGHT_WARMUP_GFLOP, metavar="G",
                   help="cpu: shapes of at least G GFLOP (2MNK) are warmed up without an untimed run: the kernel is "
                        f"loaded, D's pages written, the baseline run on 256 rows (default {LIGHT_WARMUP_GFLOP:g}; "
                        "0 for every shape, inf for none)")
    p.add_argument("--spread-tol", type=float, default=0.05,
                   help="cpu: stop repeating once (max - min) / median of both sides' runs is within this "
                        "(default 0.05)")
    p.add_argument("--budget-hours", type=float, default=None, metavar="H",
                   help="cpu: run a stratified subset of the selection planned to fit H hours (estimated from "
                        "measured rows in --out when resuming, else from default rates)")
    p.add_argument("--seed", type=int, default=0, help="cpu: operand RNG seed")
    p.add_argument("--max-mem-gb", type=float, default=None,
                   help=f"cpu: memory budget per shape in GiB (default {MEM_FRACTION * 100:.0f}%% of MemAvailable, "
                        "read before each shape)")
    p.add_argument("--workers", type=int, default=None, help="cpu: precompile worker processes (default: CPUs)")
    p.add_argument("--no-precompile", action="store_true", help="cpu: compile in each shape's untimed warm-up")
    p.add_argument("--ceiling-gflops", type=float, default=None, help="cpu: use this ceiling instead of measuring")
    p.add_argument("--bandwidth-gbs", type=float, default=None, help="cpu: use this bandwidth instead of measuring")
    p.add_argument("--plan-only", action="store_true",
                   help="cpu: print the estimated time of the pending shapes (and --budget-hours' plan), run nothing")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="cpu: run the shapes on this Dask scheduler (tcp://HOST:8786); workers need --resources "
                        "timing=1 (the distributed extra)")
    p.add_argument("--local-cluster", type=int, default=None, metavar="N",
                   help="cpu: start a local Dask cluster of N worker processes and run the shapes there")
    p.add_argument("--worker-cache-dir", type=Path, default=None, metavar="DIR",
                   help="Dask: one DG_JIT_CACHE_DIR shared by all workers (default: each worker its own); the "
                        "sweep refuses to start unless every worker can create and write it")
    # NOTES: "numpy" swaps the stand-in for _sweep_cpu.NumpyRunner: plumbing runs and the tests, never figures.
    p.add_argument("--runner", choices=("deep_gemm", "numpy"), default="deep_gemm", help=argparse.SUPPRESS)
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    return p


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """``args`` checked across options (parser.error, exit status 2, on a bad combination), paths made absolute
    where the Dask workers need them."""
    if args.quick and args.shapes is not None:
        parser.error("--quick selects from the built-in set; it cannot be combined with --shapes")
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1, got {args.limit}")
    if args.repeats < 1 or args.max_repeats < args.repeats:
        parser.error(f"need 1 <= --repeats <= --max-repeats, got {args.repeats=} {args.max_repeats=}")
    if args.scheduler is not None and args.local_cluster is not None:
        parser.error(f"--scheduler {args.scheduler} and --local-cluster {args.local_cluster}: choose one")
    if (args.scheduler is not None or args.local_cluster is not None) and args.mode == "model":
        parser.error("--scheduler/--local-cluster run the cpu mode; --mode model needs neither")
    if args.local_cluster is not None and args.local_cluster < 1:
        parser.error(f"--local-cluster must be >= 1, got {args.local_cluster}")
    if args.worker_cache_dir is not None:
        if args.scheduler is None and args.local_cluster is None:
            parser.error(f"--worker-cache-dir {args.worker_cache_dir}: it is the Dask workers' kernel cache; it "
                         "needs --scheduler or --local-cluster (set DG_JIT_CACHE_DIR for this process's)")
        if args.scheduler is not None and not args.worker_cache_dir.expanduser().is_absolute():
            parser.error(f"--worker-cache-dir {args.worker_cache_dir}: must be an absolute path with --scheduler "
                         "(the workers do not share this client's working directory)")
        # NOTES: a local cluster's workers run here, in this working directory: the same path for all of them.
        args.worker_cache_dir = args.worker_cache_dir.expanduser().absolute()
    if args.plan_only and args.mode == "model":
        parser.error("--plan-only estimates the cpu mode; use --mode cpu")
    if args.spread_tol < 0:
        parser.error(f"--spread-tol must be >= 0, got {args.spread_tol}")
    if not args.light_warmup_gflop >= 0:
        parser.error(f"--light-warmup-gflop must be >= 0, got {args.light_warmup_gflop}")
    for name in ("ceiling_gflops", "bandwidth_gbs", "max_mem_gb", "target_seconds", "budget_hours"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {value}")
    if args.shapes is not None:
        if not args.shapes.exists():
            parser.error(f"--shapes {args.shapes}: no such file")
        if args.shapes.is_dir():
            parser.error(f"--shapes {args.shapes}: is a directory, not a shapes file")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out}: is a file, not a directory (results.csv, summary.json and plots go inside)")
    return args
