#!/usr/bin/env python
"""Start-up: a fresh process to its first cached GEMM (issue 28: <= 0.3 s, `import ml_dtypes` included), the median
of several fresh processes, with the per-import breakdown (`python -X importtime`) and the first call's own parts.

    python bench/startup_bench.py                     # 5 processes per setting, a 256^3 FP8 GEMM, a fresh cache
    python bench/startup_bench.py --runs 3 --size 128 --cache-dir /tmp/dg-cache

What is timed: every child runs `import numpy`, `import ml_dtypes`, builds its operands (not counted), then
`import deep_gemm` and one `fp8_gemm_nt` whose kernel is already in the cache (an untimed child fills it first).
The figure is the wall time from the parent's spawn of the child to the end of that call (interpreter start
included; perf_counter is the system-wide monotonic clock on Linux), less the operand set-up. Two settings:
  bytecode cached   Python's .pyc files exist, as after `pip install` (PYTHONPYCACHEPREFIX in a temporary
                    directory, filled by the warm-up child): what a user's process does
  as inherited      the environment as it is (e.g. PYTHONDONTWRITEBYTECODE=1 in a sandbox: every package module
                    compiled from source in every process)
The breakdown: the top-level imports before the first call (cumulative ms) and those the first call itself makes,
the biggest self times, and the first call's time outside imports (config selection, cache index and native
library load, the GEMM), and which heavy modules were imported (the cached path needs none of numba, llvmlite,
jinja2 or tree_sitter). Loaded machines skew every figure: the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from jit_bench import FP8_OPERANDS  # noqa: E402  (bench/ is not a package)

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 0.3
HEAVY_MODULES = ("numba", "llvmlite", "jinja2", "tree_sitter", "tree_sitter_cpp", "torch", "jax", "scipy")
# stderr marks between the child's phases, so -X importtime's lines can be told apart
MARKS = {"operands": "### operands (not counted)", "deep_gemm": "### import deep_gemm",
         "first_call": "### deep_gemm first call"}

# NOTES: the operands are made with numpy and ml_dtypes only (a user's process has them anyway) and their set-up
# time is reported so the parent can leave it out; everything else from interpreter start to the end of the first
# call counts.
CHILD = """
import time
t_main = time.perf_counter()
import json, sys
import numpy as np
t_numpy = time.perf_counter()
import ml_dtypes
t_ml = time.perf_counter()
print({marks[operands]!r}, file=sys.stderr, flush=True)
""" + FP8_OPERANDS + """print({marks[deep_gemm]!r}, file=sys.stderr, flush=True)
t_operands = time.perf_counter()
import deep_gemm
t_import = time.perf_counter()
print({marks[first_call]!r}, file=sys.stderr, flush=True)
deep_gemm.fp8_gemm_nt(a, b, d)
t_first = time.perf_counter()
deep_gemm.fp8_gemm_nt(a, b, d)
t_second = time.perf_counter()
from deep_gemm.jit import stats
print(json.dumps({{"main": t_main, "numpy": t_numpy, "ml_dtypes": t_ml, "operands": t_operands,
                  "import": t_import, "first": t_first, "second": t_second,
                  "modules": {{name: name in sys.modules for name in {heavy!r}}}, "stats": stats()}}))
"""

# cProfile of the first call alone (its figures are inflated by the profiler; read them as shares)
PROFILE_CHILD = """
import cProfile, json, pstats, sys
import numpy as np, ml_dtypes
import deep_gemm
m = n = k = {size}
a = (np.zeros((m, k), np.uint8).view(ml_dtypes.float8_e4m3fn), np.ones((m, k // 32), np.float32))
b = (np.zeros((n, k), np.uint8).view(ml_dtypes.float8_e4m3fn), np.ones((n, k // 32), np.float32))
d = np.empty((m, n), ml_dtypes.bfloat16)
prof = cProfile.Profile()
prof.enable()
deep_gemm.fp8_gemm_nt(a, b, d)
prof.disable()
st = pstats.Stats(prof).stats
def cum(pred):
    return max((v[3] for key, v in st.items() if pred(*key)), default=0.0)
total = cum(lambda f, line, name: name == "fp8_fp4_gemm_nt")
print(json.dumps({{"total": total,
    "config selection (heuristics get_best_config)": cum(lambda f, line, name: name == "get_best_config"),
    "kernel from the cache (jit build)": cum(lambda f, line, name: name == "build" and f.endswith("compile.py")),
    "launch": cum(lambda f, line, name: name == "launch" and f.endswith("family.py")),
}}))
"""

_IMPORTTIME = re.compile(r"^import time:\s+(\d+)\s+\|\s+(\d+)\s+\|(\s*)(\S+)\s*$")


def parse_importtime(text: str) -> dict[str, list[tuple[str, int, int, int]]]:
    """`-X importtime` stderr -> {phase: [(module, self us, cumulative us, depth), ...]} in import order, the phases
    split at the child's MARKS: "start" (interpreter, numpy, ml_dtypes), "operands" (not counted), "deep_gemm"
    (`import deep_gemm`) and "first_call" (imports the first call makes)."""
    out: dict[str, list[tuple[str, int, int, int]]] = {"start": [], **{phase: [] for phase in MARKS}}
    by_mark = {mark: phase for phase, mark in MARKS.items()}
    phase = "start"
    for line in text.splitlines():
        if line.strip() in by_mark:
            phase = by_mark[line.strip()]
            continue
        match = _IMPORTTIME.match(line)
        if match:
            self_us, cum_us, indent, name = match.groups()
            out[phase].append((name, int(self_us), int(cum_us), (len(indent) - 1) // 2))
    return out


def top_level(entries) -> list[tuple[str, int]]:
    """The depth-0 imports of a phase, (module, cumulative us), in import order."""
    return [(name, cum) for name, _, cum, depth in entries if depth == 0]


def _env(setting: str, pyc_dir: str | None, cache_dir: str) -> dict:
    env = dict(os.environ, DG_JIT_CACHE_DIR=cache_dir)
    if setting == "bytecode cached":
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pyc_dir
    return env


def run_child(code: str, env: dict, args: tuple[str, ...] = ()) -> tuple[dict, str, float]:
    """(the child's JSON, its stderr, the parent's perf_counter at spawn)."""
    spawn = time.perf_counter()
    proc = subprocess.run([sys.executable, *args, "-c", code], env=env, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"start-up child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr, spawn


def figures(record: dict, spawn: float) -> dict[str, float]:
    """Seconds per phase of one child: interpreter start, numpy, ml_dtypes, import deep_gemm, first call, and the
    total (spawn to the end of the first call, operand set-up left out); the steady second call beside it."""
    return {"interpreter": record["main"] - spawn, "numpy": record["numpy"] - record["main"],
            "ml_dtypes": record["ml_dtypes"] - record["numpy"], "deep_gemm": record["import"] - record["operands"],
            "first_call": record["first"] - record["import"],
            "total": record["first"] - spawn - (record["operands"] - record["ml_dtypes"]),
            "steady_call": record["second"] - record["first"]}


def measure(setting: str, runs: int, size: int, cache_dir: str, pyc_dir: str) -> list[dict[str, float]]:
    code = CHILD.format(size=size, marks=MARKS, heavy=HEAVY_MODULES)
    env = _env(setting, pyc_dir, cache_dir)
    run_child(code, env)  # fills the bytecode cache (and the kernel cache if empty): not timed
    return [figures(*_drop_stderr(run_child(code, env))) for _ in range(runs)]


def _drop_stderr(result):
    record, _, spawn = result
    return record, spawn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per setting (median reported)")
    parser.add_argument("--size", type=int, default=256, help="M = N = K of the cached FP8 GEMM (multiple of 128)")
    parser.add_argument("--cache-dir", default=None, help="kernel cache to use (default: a fresh temporary one)")
    parser.add_argument("--top", type=int, default=12, help="imports listed by self time")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    if args.size < 128 or args.size % 128:
        parser.error(f"--size must be a positive multiple of 128, got {args.size}")
    if args.top < 0:
        parser.error(f"--top must be >= 0, got {args.top}")

    print(f"# deep_gemm start-up: fresh process to its first cached FP8 {args.size}^3 GEMM; load average "
          f"{os.getloadavg()[0]:.2f} (loaded machine: other processes skew every figure)")
    print(f"# {sys.executable} {sys.version.split()[0]}; inherited PYTHONDONTWRITEBYTECODE="
          f"{os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}")
    with tempfile.TemporaryDirectory(prefix="dg-startup-") as tmp:
        cache_dir = args.cache_dir or str(Path(tmp) / "cache")
        pyc_dir = str(Path(tmp) / "pyc")
        code = CHILD.format(size=args.size, marks=MARKS, heavy=HEAVY_MODULES)
        first, _, _ = run_child(code, _env("as inherited", pyc_dir, cache_dir))  # compiles the kernel if needed
        print(f"# warm-up child (fills the kernel cache): jit stats {first['stats']}")
        verdict = 0
        for setting in ("bytecode cached", "as inherited"):
            rows = measure(setting, args.runs, args.size, cache_dir, pyc_dir)
            med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
            totals = ", ".join(f"{r['total']:.3f}" for r in rows)
            ok = med["total"] <= TARGET_S
            if setting == "bytecode cached" and not ok:
                verdict = 1
            print(f"{'PASS' if ok else 'FAIL'}  start-up, {setting:<16} target <= {TARGET_S:.2f} s  measured "
                  f"{med['total']:.3f} s  (median of {args.runs}: interpreter {med['interpreter']:.3f} + numpy "
                  f"{med['numpy']:.3f} + ml_dtypes {med['ml_dtypes']:.3f} + import deep_gemm {med['deep_gemm']:.3f} "
                  f"+ first call {med['first_call']:.3f} s; steady call {med['steady_call'] * 1e3:.1f} ms; all "
                  f"totals {totals}; load {os.getloadavg()[0]:.2f})",
                  flush=True)

        # Per-import breakdown (bytecode cached): one more child under -X importtime
        env = _env("bytecode cached", pyc_dir, cache_dir)
        record, stderr, _ = run_child(code, env, ("-X", "importtime"))
        phases = parse_importtime(stderr)
        for phase, title in (("start", "at start (site, numpy, ml_dtypes)"), ("deep_gemm", "by import deep_gemm"),
                             ("first_call", "by the first call")):
            tops = top_level(phases[phase])
            total_ms = sum(c for _, c in tops) / 1e3
            listed = ", ".join(f"{name} {cum / 1e3:.1f}" for name, cum in sorted(tops, key=lambda t: -t[1])[:10])
            print(f"# imports {title} (-X importtime, cumulative ms, inflated by the flag): {total_ms:.1f} ms in "
                  f"{len(tops)} top-level imports: {listed}")
        entries = phases["start"] + phases["deep_gemm"] + phases["first_call"]
        biggest = sorted(entries, key=lambda e: -e[1])[:args.top]
        print("# biggest self times (ms): " + ", ".join(f"{name} {s / 1e3:.1f}" for name, s, _, _ in biggest))
        ours = [e for e in entries if e[0].startswith("deep_gemm")]
        print(f"# deep_gemm's own modules: {len(ours)}, {sum(e[1] for e in ours) / 1e3:.1f} ms self time")
        loaded = [name for name, present in record["modules"].items() if present]
        print(f"# heavy modules imported on the cached path: {', '.join(loaded) or 'none'} (of "
              f"{', '.join(HEAVY_MODULES)}); jit stats {record['stats']}")
        prof, _, _ = run_child(PROFILE_CHILD.format(size=args.size), env)
        total = prof.pop("total")
        print(f"# first call under cProfile ({total * 1e3:.1f} ms, inflated): "
              + ", ".join(f"{name} {value * 1e3:.1f} ms ({value / total:.0%})" for name, value in prof.items()))
    print(f"# load average {os.getloadavg()[0]:.2f}")
    return verdict


if __name__ == "__main__":
    sys.exit(main())
