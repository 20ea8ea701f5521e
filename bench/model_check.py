"""Check the Ascend cost model against DeepGEMM-Ascend's published 950DT measurements, row by row.

Prints each published row beside the modelled time (``deep_gemm.estimate_gemm``) and the error, then the median and
the largest absolute error; exits non-zero when the model misses the bar (median <= 5 %, every row <= 15 %).
The published numbers are copied here as data; nothing outside the package is read at run time.

    python bench/model_check.py [--arch 950DT]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass

# Source: DeepGEMM-Ascend README (release 2026-09-30): Ascend 950DT, CANN 9.20, bench_msprof, cold L2 (a buffer of
# twice the L2 size zeroed before each of 30 timed runs, after 10 warm-ups). The vendor's figures, not reproduced.
# (kind, A x B dtypes, M, N, K, microseconds, TFLOPS, GB/s or None), in the README's order.
PUBLISHED: tuple[tuple[str, str, int, int, int, float, float, float | None], ...] = (
    ("dense", "fp4xfp4", 4096, 7168, 16384, 565.6, 1701, None),
    ("dense", "fp8xfp4", 4096, 7168, 16384, 1117.8, 861, None),
    ("dense", "fp8xfp8", 4096, 7168, 16384, 1117.6, 861, None),
    ("dense", "bf16xbf16", 4096, 7168, 16384, 2229.9, 431, None),
    ("dense", "fp8xfp8", 4096, 2112, 7168, 156.9, 790, 319),
    ("dense", "fp8xfp8", 4096, 576, 7168, 54.6, 619, 689),
    ("dense", "fp8xfp8", 4096, 24576, 1536, 362.2, 854, 137),
    ("dense", "fp8xfp8", 4096, 32768, 512, 164.3, 837, 129),
    ("dense", "fp8xfp8", 4096, 7168, 16384, 1117.6, 861, 186),
    ("dense", "fp8xfp8", 4096, 4096, 7168, 282.9, 850, 234),
    ("dense", "fp8xfp8", 4096, 7168, 2048, 143.4, 838, 181),
)
ARCH = "950DT"
MAX_MEDIAN_ERROR = 0.05
MAX_ROW_ERROR = 0.15

_KIND_TO_GEMM_TYPE = {"dense": "normal"}


@dataclass(frozen=True)
class CheckRow:
    kind: str
    dtypes: str
    m: int
    n: int
    k: int
    measured_us: float
    measured_tflops: float
    modelled_us: float
    modelled_tflops: float
    bound: str
    config: str

    @property
    def error(self) -> float:
        """Signed relative error of the modelled time against the measured one."""
        return self.modelled_us / self.measured_us - 1.0


def check(arch: str = ARCH) -> list[CheckRow]:
    """Model every published row on ``arch`` with all its AI cores."""
    from deep_gemm.estimate import estimate_gemm

    rows = []
    for kind, dtypes, m, n, k, us, tflops, _ in PUBLISHED:
        a_dtype, b_dtype = dtypes.split("x")
        est = estimate_gemm(m, n, k, a_dtype, b_dtype, gemm_type=_KIND_TO_GEMM_TYPE[kind], arch=arch)
        c = est.config
        config = f"{c.block_m}x{c.block_n}x{c.block_k} mad {c.mad_m}x{c.mad_n}x{c.mad_k} L1x{c.num_l1_stages}"
        rows.append(CheckRow(kind, dtypes, m, n, k, us, tflops, est.time_us, est.tflops, est.bound, config))
    return rows


def summarize(rows: list[CheckRow]) -> tuple[float, float]:
    """(median, max) absolute relative error over the rows."""
    errors = [abs(row.error) for row in rows]
    return statistics.median(errors), max(errors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default=ARCH, help="modelled NPU (the published rows are 950DT)")
    args = parser.parse_args(argv)
    rows = check(args.arch)
    print(f"Published DeepGEMM-Ascend 950DT measurements vs the cost model (modelled on {args.arch}, all cores)")
    header = (f"{'kind':<6} {'dtype':<10} {'M':>5} {'N':>6} {'K':>6} {'meas us':>9} {'model us':>9} {'error':>7} "
              f"{'meas TF':>8} {'model TF':>9}  {'bound':<8} config")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.kind:<6} {r.dtypes:<10} {r.m:>5} {r.n:>6} {r.k:>6} {r.measured_us:>9.1f} {r.modelled_us:>9.1f} "
              f"{100 * r.error:>+6.1f}% {r.measured_tflops:>8.0f} {r.modelled_tflops:>9.0f}  {r.bound:<8} {r.config}")
    median, worst = summarize(rows)
    ok = median <= MAX_MEDIAN_ERROR and worst <= MAX_ROW_ERROR
    print(f"median |error| {100 * median:.2f} % (bar {100 * MAX_MEDIAN_ERROR:.0f} %), "
          f"max |error| {100 * worst:.2f} % (bar {100 * MAX_ROW_ERROR:.0f} %): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
