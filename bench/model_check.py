"""Check the Ascend cost model against DeepGEMM-Ascend's published 950DT measurements, row by row.

Prints each published row beside the modelled time, the error, the model's terms (what binds, Cube / MTE2 / L2 /
HBM / fill / launch time of the chosen config, the copy overhead) and the modelled achieved HBM bandwidth, then the
median and the largest absolute error; exits non-zero when the model misses the bar (median <= 3 %, every row
<= 10 %). Writes a plot (``--plot``, default sweep_out/model_check.png) of modelled against published time, and of the
modelled achieved HBM bandwidth against M for the DeepSeek (N, K) pairs. ``--sensitivity`` moves each figure the
model rests on by -20 % and +20 % (re-choosing configs, as the heuristic would) and prints how far each row moves.
The published numbers are copied here as data; nothing outside the package is read at run time.

    python bench/model_check.py [--arch 950DT] [--plot sweep_out/model_check.png] [--sensitivity]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# Source: DeepGEMM-Ascend README (release 2026-09-30): Ascend 950DT, CANN 9.20, bench_msprof, cold L2 (a buffer of
# twice the L2 size zeroed before each of 30 timed runs, after 10 warm-ups). The vendor's figures, not reproduced.
# (kind, A x B dtypes, M, N, K, microseconds, TFLOPS, GB/s or None), in the README's order; the M = 128 rows last.
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
    ("dense", "fp8xfp8", 128, 2112, 7168, 15.0, 258, 1205),
    ("dense", "fp8xfp8", 128, 32768, 512, 10.4, 415, 1829),
    ("dense", "fp8xfp8", 128, 7168, 16384, 54.8, 549, 2456),
)
ARCH = "950DT"
MAX_MEDIAN_ERROR = 0.03
MAX_ROW_ERROR = 0.10
SENSITIVITY_STEP = 0.20
PLOT_MS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

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
    measured_gbs: float | None = None
    terms_us: dict[str, float] = dataclasses.field(default_factory=dict)  # the model's per-resource times
    hbm_bytes: int = 0
    modelled_hbm_gbs: float = 0.0  # modelled achieved HBM bandwidth: HBM bytes / modelled time
    active_cores: int = 0

    @property
    def error(self) -> float:
        """Signed relative error of the modelled time against the measured one."""
        return self.modelled_us / self.measured_us - 1.0


def _desc(dtypes: str, m: int, n: int, k: int, kind: str = "dense", arch=None):
    from deep_gemm.heuristics import GemmDesc, get_arch

    a_dtype, b_dtype = dtypes.split("x")
    spec = get_arch(arch or ARCH)
    return GemmDesc(m, n, k, a_dtype, b_dtype, gemm_type=_KIND_TO_GEMM_TYPE[kind], num_ai_cores=spec.num_ai_cores)


def check(arch: str = ARCH) -> list[CheckRow]:
    """Model every published row on ``arch`` with all its AI cores (the config ``get_best_config`` picks)."""
    from deep_gemm.heuristics import get_arch
    from deep_gemm.heuristics.select import get_best_config_and_cost

    spec = get_arch(arch)
    rows = []
    for kind, dtypes, m, n, k, us, tflops, gbs in PUBLISHED:
        c, cost = get_best_config_and_cost(_desc(dtypes, m, n, k, kind, spec), spec)
        config = f"{c.block_m}x{c.block_n}x{c.block_k} mad {c.mad_m}x{c.mad_n}x{c.mad_k} L1x{c.num_l1_stages}"
        terms = {"cube": cost.cube_s, "mte2": cost.mte2_s, "l2": cost.l2_s, "hbm": cost.hbm_s, "fill": cost.fill_s,
                 "launch": cost.launch_s, "overhead": cost.copy_overhead_s}
        rows.append(CheckRow(kind, dtypes, m, n, k, us, tflops, cost.time_s * 1e6, cost.flops / cost.time_s / 1e12,
                             cost.bound, config, gbs, {key: v * 1e6 for key, v in terms.items()}, cost.hbm_bytes,
                             cost.achieved_hbm_bytes_per_s / 1e9, cost.active_cores))
    return rows


def summarize(rows: list[CheckRow]) -> tuple[float, float]:
    """(median, max) absolute relative error over the rows."""
    errors = [abs(row.error) for row in rows]
    return statistics.median(errors), max(errors)


def print_rows(rows: list[CheckRow], arch: str) -> None:
    print(f"Published DeepGEMM-Ascend 950DT measurements vs the cost model (modelled on {arch}, all cores)")
    print("terms: modelled busy time (us) of the busiest core's Cube and MTE2 (GM -> L1), the chip's L2 and HBM "
          "traffic, pipeline fill + drain, launch; ovh = MTE2 copy issue + exposed latency; HBM GB/s = HBM bytes / "
          "time (published: the README's GB/s column)")
    header = (f"{'dtype':<10} {'M':>5} {'N':>6} {'K':>6} {'meas us':>8} {'model us':>8} {'error':>7}  {'bound':<7} "
              f"{'cube':>7} {'mte2':>7} {'l2':>7} {'hbm':>7} {'fill':>5} {'ovh':>5} {'cores':>5} "
              f"{'HBM GB/s':>8} {'pub GB/s':>8}  config")
    print(header)
    print("-" * len(header))
    for r in rows:
        t = r.terms_us
        pub = f"{r.measured_gbs:>8.0f}" if r.measured_gbs else f"{'':>8}"
        print(f"{r.dtypes:<10} {r.m:>5} {r.n:>6} {r.k:>6} {r.measured_us:>8.1f} {r.modelled_us:>8.1f} "
              f"{100 * r.error:>+6.1f}%  {r.bound:<7} {t['cube']:>7.1f} {t['mte2']:>7.1f} {t['l2']:>7.1f} "
              f"{t['hbm']:>7.1f} {t['fill']:>5.1f} {t['overhead']:>5.1f} {r.active_cores:>5} "
              f"{r.modelled_hbm_gbs:>8.0f} {pub}  {r.config}")


# Public 950 measurements (shared reference ascend_memory_latency.md) ------------------------------------------

# (what, M, N, K, cores of the measured box, measured figure, unit). The 8192^3 case: asc-devkit matmul_high_performance
# README, a 950PR-class box with 32 cores (fp16; bf16 has the same Cube rate): 2558.2 us against a Cube bound of
# 2542 us. The bandwidths: torch bf16 matmul on a 950PR, L2 evicted, wall clock minus a ~26 us floor; bytes =
# (MK + NK + MN) x 2. The torch kernel is not DeepGEMM-style and its floor is an estimate, so these bound the
# model's bandwidth regime loosely; the 950PR model has 28 cores, the "32-core box" variant the server tier's 32.
PUBLIC_950: tuple[tuple[str, int, int, int, float, str], ...] = (
    ("8192^3 fp16, fraction of the Cube bound", 8192, 8192, 8192, 2542.0 / 2558.2, "frac"),
    ("torch bf16 M=1, K=N=16384", 1, 16384, 16384, 1.62e12, "B/s"),
    ("torch bf16 M=128, K=N=16384", 128, 16384, 16384, 1.51e12, "B/s"),
    ("torch bf16 M=128, K=N=8192", 128, 8192, 8192, 1.39e12, "B/s"),
    ("torch bf16 M=128, K=N=4096", 128, 4096, 4096, 0.84e12, "B/s"),
)


def check_public_950() -> list[tuple[str, float, float, float, str]]:
    """(what, measured, modelled on the 28-core 950PR, modelled on a 32-core 950PR box, unit) per public figure.
    Bandwidths are modelled kernel times (launch included); the fraction is the Cube bound over the time."""
    from deep_gemm.arch import MiB
    from deep_gemm.heuristics import GemmDesc, get_arch
    from deep_gemm.heuristics.select import get_best_config_and_cost

    pr = get_arch("950PR")
    box = dataclasses.replace(pr, name="950PR-32", num_ai_cores=32, l2_bytes=128 * MiB)
    out = []
    for what, m, n, k, measured, unit in PUBLIC_950:
        modelled = []
        for arch in (pr, box):
            desc = GemmDesc(m, n, k, "bf16", "bf16", num_ai_cores=arch.num_ai_cores)
            _, cost = get_best_config_and_cost(desc, arch)
            if unit == "frac":
                modelled.append(cost.flops / arch.peak_flops("bf16") / cost.time_s)
            else:
                modelled.append((m * k + n * k + m * n) * 2 / cost.time_s)
        out.append((what, measured, modelled[0], modelled[1], unit))
    return out


def print_public_950(rows) -> None:
    print("\nPublic 950 measurements (ascend_memory_latency.md) vs the modelled 950PR (28 cores) and a 32-core box")
    print(f"{'measurement':<42} {'measured':>9} {'950PR 28c':>10} {'32c box':>9}")
    for what, measured, pr, box, unit in rows:
        scale, fmt = (100, "{:>8.1f}%") if unit == "frac" else (1e-12, "{:>5.2f}TB/s")
        cells = " ".join(fmt.format(v * scale) for v in (measured, pr, box))
        print(f"{what:<42} {cells}")


# Sensitivity ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One figure the model rests on, and how to run the model with it scaled."""

    name: str
    kind: str  # "sourced" or "judgement"
    source: str


def _figures() -> list[Figure]:
    return [
        Figure("hbm_bytes_per_s", "sourced", "ArchSpec: 950DT HBM (press 4.0 TB/s; 3.5 effective)"),
        Figure("l2_bytes_per_s", "sourced", "ArchSpec: L2 -> L1 bandwidth of the chip"),
        Figure("l2_bytes", "sourced", "ArchSpec: L2 capacity (CANN INI)"),
        Figure("l1_to_l0_bytes_per_cycle", "sourced", "ArchSpec: MTE1 rate (NPU arch 3510 spec)"),
        Figure("mte2_theory_s", "sourced", "8192^3 MTE2 theory 1832 us -> per-core GM -> L1 rate (scaled inversely)"),
        Figure("nd2nz_chip_bytes_per_s", "sourced", "8 KB ND2NZ on 32 AIC 1.24 TB/s -> GM latency (inversely)"),
        Figure("small_copy_chip_bytes_per_s", "sourced", "128 B copies on 64 AIV 0.34 TB/s -> copy issue (inversely)"),
        Figure("same_address_slowdown", "sourced", "32 AIC same-order 370 us vs staggered 187 us"),
        Figure("short_row_slowdown", "sourced", "128 B rows 1.35-1.57x slower than 512 B rows"),
        Figure("gm_request_bytes", "sourced", "GM requests in 512 B units"),
        Figure("fixpipe_elems_per_cycle", "sourced", "FixPipe 64 elements/cycle for bf16 output"),
        Figure("MAD_ISSUE_CYCLES", "sourced", "DeepGEMM-Ascend heuristics: least cycles of one MAD"),
        Figure("LAUNCH_S", "judgement", "2 us launch + end synchronisation"),
    ]


_ARCH_FIELDS = ("hbm_bytes_per_s", "l2_bytes_per_s", "l2_bytes", "l1_to_l0_bytes_per_cycle")


@contextmanager
def _scaled(figure: Figure, factor: float, arch) -> Iterator[tuple[object, object]]:
    """(arch, memory figures) with ``figure`` scaled by ``factor``; module constants are restored on exit."""
    from deep_gemm.heuristics import model

    figures = model.MEMORY_FIGURES
    saved = (model.LAUNCH_S, dict(model.MAD_ISSUE_CYCLES))
    try:
        if figure.name in _ARCH_FIELDS:
            value = getattr(arch, figure.name) * factor
            arch = dataclasses.replace(arch, **{figure.name: type(getattr(arch, figure.name))(value)})
        elif figure.name == "LAUNCH_S":
            model.LAUNCH_S = saved[0] * factor
        elif figure.name == "MAD_ISSUE_CYCLES":
            model.MAD_ISSUE_CYCLES.update({k: v * factor for k, v in saved[1].items()})
        else:
            value = getattr(figures, figure.name) * factor
            figures = dataclasses.replace(figures, **{figure.name: type(getattr(figures, figure.name))(value)})
        yield arch, figures
    finally:
        model.LAUNCH_S = saved[0]
        model.MAD_ISSUE_CYCLES.clear()
        model.MAD_ISSUE_CYCLES.update(saved[1])


def _best_time_us(desc, arch, figures) -> float:
    """The fastest modelled time over every candidate config (the heuristic's choice under these figures)."""
    from deep_gemm.heuristics import candidate_configs, model

    return min(model.model_gemm(desc, c, arch, figures).time_s for c in candidate_configs(desc, arch)) * 1e6


def sensitivity(rows: list[CheckRow], arch_name: str, step: float = SENSITIVITY_STEP,
                progress: Callable[[str], None] | None = None) -> list[tuple[Figure, list[tuple[float, float]]]]:
    """For each figure: per row, (relative change of the modelled time at -step, at +step)."""
    from deep_gemm.heuristics import get_arch

    spec = get_arch(arch_name)
    out = []
    for figure in _figures():
        if progress:
            progress(figure.name)
        moves = []
        for r in rows:
            desc = _desc(r.dtypes, r.m, r.n, r.k, r.kind, spec)
            pair = []
            for factor in (1.0 - step, 1.0 + step):
                with _scaled(figure, factor, spec) as (arch, figures):
                    pair.append(_best_time_us(desc, arch, figures) / r.modelled_us - 1.0)
            moves.append((pair[0], pair[1]))
        out.append((figure, moves))
    return out


def print_sensitivity(rows: list[CheckRow], table, step: float) -> None:
    print(f"\nSensitivity: each figure scaled by {1 - step:.2f} and {1 + step:.2f} (configs re-chosen); change of the "
          f"modelled time per row in %, as (-{100 * step:.0f} % / +{100 * step:.0f} %)")
    labels = [f"{r.m}x{r.n}x{r.k} {r.dtypes.split('x')[0]}" for r in rows]
    print(f"{'figure':<28} {'kind':<9} {'largest move':>12}  per row")
    for figure, moves in table:
        worst = max(max(abs(lo), abs(hi)) for lo, hi in moves)
        per_row = ", ".join(f"{label} {100 * lo:+.1f}/{100 * hi:+.1f}"
                            for label, (lo, hi) in zip(labels, moves, strict=True) if max(abs(lo), abs(hi)) >= 0.005)
        print(f"{figure.name:<28} {figure.kind:<9} {100 * worst:>11.1f}%  {per_row or '(every row < 0.5 %)'}")
        print(f"{'':<28} {'':<9} {'':>12}  source: {figure.source}")


# Plot ------------------------------------------------------------------------------------------------------------


def write_plot(rows: list[CheckRow], path: str | Path, arch_name: str) -> Path:
    """Left: modelled vs published time (log-log, the y = x line and +-10 %). Right: modelled achieved HBM
    bandwidth (HBM bytes / modelled time) against M for the DeepSeek (N, K) pairs, FP8, with the published rows'
    bandwidth (the model's HBM bytes over the published time) as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from shapes import DEEPSEEK_NK

    from deep_gemm.heuristics import get_arch
    from deep_gemm.heuristics.select import get_best_config_and_cost

    spec = get_arch(arch_name)
    fig, (ax_t, ax_bw) = plt.subplots(1, 2, figsize=(14, 6))
    meas = [r.measured_us for r in rows]
    lo, hi = min(meas) / 1.5, max(meas) * 1.5
    ax_t.plot([lo, hi], [lo, hi], "k-", lw=1, label="modelled = published")
    ax_t.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.9", label="+-10 %")
    for dtypes in sorted({r.dtypes for r in rows}):
        sel = [r for r in rows if r.dtypes == dtypes]
        ax_t.scatter([r.measured_us for r in sel], [r.modelled_us for r in sel], label=dtypes, zorder=3)
    for r in rows:
        ax_t.annotate(f"{r.m}x{r.n}x{r.k}", (r.measured_us, r.modelled_us), fontsize=6, xytext=(3, -8),
                      textcoords="offset points")
    ax_t.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="published time (us)",
             ylabel=f"modelled time (us), {spec.name}", title="Modelled vs published (DeepGEMM-Ascend 950DT)")
    ax_t.legend(fontsize=8)

    for n, k in DEEPSEEK_NK:
        bws = []
        for m in PLOT_MS:
            _, cost = get_best_config_and_cost(_desc("fp8xfp8", m, n, k, arch=spec), spec)
            bws.append(cost.achieved_hbm_bytes_per_s / 1e12)
        ax_bw.plot(PLOT_MS, bws, marker=".", lw=1, label=f"N={n} K={k}")
    for r in rows:
        if r.dtypes == "fp8xfp8" and (r.n, r.k) in DEEPSEEK_NK:
            ax_bw.scatter([r.m], [r.hbm_bytes / (r.measured_us * 1e-6) / 1e12], marker="x", color="k", zorder=3)
    ax_bw.axhline(spec.hbm_bytes_per_s / 1e12, color="k", ls="--", lw=1, label="HBM in the model")
    ax_bw.set(xscale="log", xlabel="M", ylabel="modelled achieved HBM bandwidth (TB/s)",
              title=f"FP8, DeepSeek (N, K) pairs, modelled {spec.name} (x: published time)")
    ax_bw.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default=ARCH, help="modelled NPU (the published rows are 950DT)")
    parser.add_argument("--plot", default="sweep_out/model_check.png", help="where to write the plot ('' for none)")
    parser.add_argument("--sensitivity", action="store_true", help="scale each figure by -+20 %% and show the moves")
    args = parser.parse_args(argv)
    rows = check(args.arch)
    print_rows(rows, args.arch)
    median, worst = summarize(rows)
    ok = median <= MAX_MEDIAN_ERROR and worst <= MAX_ROW_ERROR
    print(f"median |error| {100 * median:.2f} % (bar {100 * MAX_MEDIAN_ERROR:.0f} %), "
          f"max |error| {100 * worst:.2f} % (bar {100 * MAX_ROW_ERROR:.0f} %): {'PASS' if ok else 'FAIL'}")
    print_public_950(check_public_950())
    if args.plot:
        print(f"wrote {write_plot(rows, args.plot, args.arch)}")
    if args.sensitivity:
        print_sensitivity(rows, sensitivity(rows, args.arch), SENSITIVITY_STEP)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
