"""Sweep reporting: summary.json, the printed summary in the terms of the SemiAnalysis study (best and median
fraction, over all shapes and over the compute-bound subset), and PNG plots (matplotlib, Agg backend).

Reads typed rows (``_sweep_csv.read_results``); measures nothing.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

DEFINITIONS = {
    "intensity": "I = 2MNK / bytes, bytes = A and B read once at their dtype (bf16: 2 B, fp8: 1 B per element, "
                 "plus one UE8M0 byte per 32 K elements per row for fp8) + D written once in bf16 (2 B) [FLOP/B]",
    "ridge": "ridge = peak FLOP/s / bandwidth of the machine [FLOP/B]. CPU: peak = the best fp32 GFLOP/s numpy "
             "reaches on large squares here, bandwidth = one large numpy copy (read + write bytes); chip: the "
             "arch's Cube peak for the dtype on the cores used, and its HBM bandwidth",
    "compute_bound": "shapes with I > ridge of that machine (CPU or modelled chip)",
    "frac_peak": "achieved (or predicted) FLOP/s / peak FLOP/s of that machine",
    "frac_attainable": "achieved FLOP/s / min(peak, I x bandwidth) (the roofline)",
    "speedup": "numpy baseline time / stand-in time, both medians in the same run (CPU mode)",
}
# calc_diff thresholds of the numerics contract (stand-in vs the fp32 baseline).
CALC_DIFF_TOL = {"bf16": 1e-5, "fp8": 1e-3}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _best(values: list[float]) -> float | None:
    return max(values) if values else None


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _shape(row: dict) -> list[int]:
    return [row["m"], row["n"], row["k"]]


def summarize_group(rows: list[dict]) -> dict:
    """Counts and best/median fractions for the rows of one (mode, dtype)."""
    ok = [r for r in rows if r["status"] == "ok" and r["frac_peak"] is not None]
    bound = [r for r in ok if r["compute_bound"]]
    fracs = [r["frac_peak"] for r in ok]
    out: dict = {
        "shapes": len(rows),
        "ok": len(ok),
        "skipped": sum(r["status"] == "skipped" for r in rows),
        "failed": sum(r["status"] == "failed" for r in rows),
        "arch": sorted({r["arch"] for r in rows}),
        "num_ai_cores": sorted({r["num_ai_cores"] for r in rows if r["num_ai_cores"] is not None}),
        "peak_gflops": _median([r["peak_gflops"] for r in rows if r["peak_gflops"]]),
        "bandwidth_gbs": _median([r["bandwidth_gbs"] for r in rows if r["bandwidth_gbs"]]),
        "ridge": _median([r["ridge"] for r in rows if r["ridge"]]),
        "all": {
            "count": len(ok),
            "best_frac_peak": _best(fracs),
            "median_frac_peak": _median(fracs),
            "median_frac_attainable": _median([r["frac_attainable"] for r in ok]),
            "best_gflops": _best([r["gflops"] for r in ok]),
            "median_gflops": _median([r["gflops"] for r in ok]),
        },
        "compute_bound": {
            "count": len(bound),
            "best_frac_peak": _best([r["frac_peak"] for r in bound]),
            "median_frac_peak": _median([r["frac_peak"] for r in bound]),
        },
    }
    if ok:
        best = max(ok, key=lambda r: r["frac_peak"])
        worst = min(ok, key=lambda r: r["frac_peak"])
        out["best_shape"] = {"mnk": _shape(best), "frac_peak": best["frac_peak"], "gflops": best["gflops"]}
        out["worst_shape"] = {"mnk": _shape(worst), "frac_peak": worst["frac_peak"], "gflops": worst["gflops"]}
    # NOTES: a fraction above 1 means the peak was measured while the machine was busier (a shared CPU); on the
    # modelled chip it would be a model bug. Either way the summary says so rather than hiding it.
    out["over_peak"] = sum(f > 1.0 for f in fracs)
    repeats = [r["repeats"] for r in ok if r.get("repeats")]
    spreads = [r["spread"] for r in ok if r.get("spread") is not None]
    if repeats:
        out["spread"] = {"median_repeats": _median(repeats), "max_repeats": max(repeats),
                         "median_spread": _median(spreads), "max_spread": max(spreads) if spreads else None}
    speedups = [r["speedup"] for r in ok if r["speedup"] is not None]
    if speedups:
        diffs = [r["calc_diff"] for r in ok if r["calc_diff"] is not None]
        tol = CALC_DIFF_TOL.get(rows[0]["dtype"])
        out["baseline"] = {
            "median_frac_peak": _median([r["baseline_frac_peak"] for r in ok if r["baseline_frac_peak"] is not None]),
            "median_gflops": _median([r["baseline_gflops"] for r in ok if r["baseline_gflops"] is not None]),
            "median_speedup": _median(speedups),
            "geomean_speedup": _geomean(speedups),
            "faster_than_baseline": sum(s > 1 for s in speedups),
            "max_calc_diff": max(diffs) if diffs else None,
            "calc_diff_tolerance": tol,
            "over_tolerance": sum(d >= tol for d in diffs) if tol is not None else None,
        }
    problems = [f"{r['status']}: {r['error']}" for r in rows if r["status"] != "ok"]
    if problems:
        counts = {p: problems.count(p) for p in set(problems)}
        out["top_errors"] = dict(sorted(counts.items(), key=lambda item: -item[1])[:3])
    bounds = [r["bound"] for r in ok if r["bound"]]
    if bounds:
        out["bound_counts"] = {b: bounds.count(b) for b in sorted(set(bounds))}
    return out


def summarize(rows: list[dict], *, machine: dict, run: dict) -> dict:
    """summary.json content: definitions, the machines, the run's settings, and one group per (mode, dtype)."""
    groups: dict[str, dict] = {}
    for mode in ("model", "cpu"):
        for dtype in ("bf16", "fp8"):
            sel = [r for r in rows if r["mode"] == mode and r["dtype"] == dtype]
            if sel:
                groups[f"{mode}/{dtype}"] = summarize_group(sel)
    return {"definitions": DEFINITIONS, "machine": machine, "run": run, "groups": groups}


def write_summary(summary: dict, path: str | Path) -> None:
    """Write summary.json whole or not at all (a temporary file renamed over it; removed if the write fails)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _machine_figures(m: dict) -> str:
    """One machine's roofline figures: ceiling (and how measured), FMA peak, bandwidth."""
    text = f"ceiling {_fmt(m.get('peak_gflops'), '.1f')} GFLOP/s"
    if m.get("ceiling_samples"):
        loads = ", ".join("-" if x is None else f"{x:.2f}" for x in m.get("ceiling_loads", []))
        text += (f" (best of numpy samples {', '.join(f'{x:.1f}' for x in m['ceiling_samples'])}; 1-min load "
                 f"before each {loads}, threshold {_fmt(m.get('ceiling_load_threshold'), '.2f')})")
    elif m.get("ceiling_sizes") == "given":
        text += " (given)"
    if m.get("fma_peak_gflops"):
        text += f", FMA peak {m['fma_peak_gflops']:.1f} GFLOP/s (independent FMAs, all threads"
        text += "; BELOW the ceiling: the FMA runs were disturbed)" if m.get("fma_below_ceiling") else ")"
    return text + f", bandwidth {_fmt(m.get('bandwidth_gbs'), '.1f')} GB/s"


def format_summary(summary: dict) -> str:
    """The printed summary: definitions, machines, then per (mode, dtype) the study's numbers."""
    lines = ["", "=== deep_gemm sweep summary ==="]
    lines.append("Definitions:")
    for key in ("intensity", "ridge", "compute_bound", "frac_peak", "frac_attainable", "speedup"):
        lines.append(f"  {key}: {DEFINITIONS[key]}")
    machine = summary.get("machine", {})
    cpu = machine.get("cpu")
    if cpu and cpu.get("backend") == "dask":
        lines.append(f"CPU: Dask cluster {cpu.get('scheduler')} ({cpu.get('workers_at_start')} workers at start, "
                     f"{cpu.get('kernel_groups')} kernel groups); each row normalised by the ceiling of the worker "
                     f"that timed it; stand-in kernels built for {cpu.get('target')}")
        for name, w in sorted(cpu.get("workers", {}).items()):
            lines.append(f"  worker {name} on {w.get('host')} ({w.get('cpu_model')}, {w.get('cpu_count')} CPUs): "
                         + _machine_figures(w) + f"; {w['shapes']} shapes, {w['gflop']:.1f} GFLOP, busy "
                         f"{w['seconds']:.1f} s ({w['compile_s']:.1f} s of it compiling; setup "
                         f"{_fmt(w.get('setup_s'), '.1f')} s, machine measured by {w.get('measured_by')}; "
                         f"{w['lock_wait_s']:.1f} s waiting for the host's timing lock); kernel cache "
                         f"{w.get('jit_cache')}")
    elif cpu:
        sizes = cpu.get("ceiling_sizes")
        how = "given" if sizes == "given" else f"numpy fp32 a @ b.T, best over squares {sizes}"
        if cpu.get("peak_gflops_end") is not None:
            how += f"; {cpu['peak_gflops_end']:.1f} when measured again at the end"
        lines.append(
            f"CPU (this machine{', ' + cpu['host'] if cpu.get('host') else ''}"
            f"{', ' + cpu['cpu_model'] if cpu.get('cpu_model') else ''}): ceiling "
            f"{_fmt(cpu.get('peak_gflops'), '.1f')} GFLOP/s ({how}), bandwidth "
            f"{_fmt(cpu.get('bandwidth_gbs'), '.1f')} GB/s (numpy copy), ridge {_fmt(cpu.get('ridge'), '.1f')} "
            f"FLOP/B; stand-in kernels built for {cpu.get('target')}"
        )
        if cpu.get("fma_peak_gflops") or cpu.get("ceiling_samples"):
            lines.append("  " + _machine_figures(cpu))
    for chip in machine.get("chip", []):
        lines.append(
            f"{chip['arch']} (MODELLED, {chip['num_ai_cores']} AI cores), {chip['dtype']}: peak "
            f"{chip['peak_flops'] / 1e12:.1f} TFLOPS, HBM {chip['bandwidth_bytes_s'] / 1e12:.2f} TB/s, "
            f"ridge {chip['ridge']:.1f} FLOP/B"
        )
    run = summary.get("run", {})
    plan = run.get("plan")
    if plan:
        lines.append(f"BUDGET: --budget-hours {plan['budget_hours']} on {plan['machines']} machine(s) planned "
                     f"{plan['planned']} of the {plan['selected']} pending (dtype, shape) runs, a stratified subset "
                     f"({plan['strata_covered']} of {plan['strata']} strata, {plan['kernels']} kernels, estimated "
                     f"{plan['estimated_s'] / 3600:.2f} machine-hours; rates from {plan['rates_from']})")
    ran = run.get("shapes_run")
    if ran is not None and "cpu" in run.get("modes", ["cpu"]):
        listed = ", ".join(f"{d} {m}x{n}x{k}" for d, m, n, k in ran)
        lines.append(f"CPU shapes run this time ({len(ran)}, {run.get('backend', 'single process')}): "
                     + (listed if len(ran) <= 60 else "listed in summary.json run.shapes_run")
                     if ran else "CPU shapes run this time: none")
    ex = run.get("extrapolation")
    if ex:
        ratio = ex["measured_over_modelled"]
        lines.append(f"EXTRAPOLATION (a model, not a measurement): all {ex['shapes']} selected CPU (dtype, shape) runs "
                     f"~{ex['one_machine_hours']:.2f} h on one machine like this one, ~"
                     f"{ex['one_machine_hours'] / 4:.2f} h on 4, ~{ex['one_machine_hours'] / 16:.2f} h on 16 "
                     f"(per-shape time from GFLOP/s fitted to {ex['rates_from']}, scaled by measured/modelled "
                     f"{_fmt(ratio, '.2f')} over the {len(run.get('shape_seconds', []))} shapes timed here; "
                     f"{ex['kernels']} kernels x {ex['compile_s_per_kernel']:.1f} s compile ({ex['compile_from']}))")
    for name, g in summary["groups"].items():
        mode, dtype = name.split("/")
        unit, scale = ("TFLOPS", 1e-3) if mode == "model" else ("GFLOP/s", 1.0)
        what = f"{'/'.join(g['arch'])} MODELLED" if mode == "model" else "CPU stand-in, measured"
        lines.append("")
        lines.append(f"[{mode} {dtype}] {what}: {g['shapes']} shapes, {g['ok']} ok, {g['skipped']} skipped, "
                     f"{g['failed']} failed; ridge {_fmt(g['ridge'], '.1f')} FLOP/B")
        a, c = g["all"], g["compute_bound"]
        lines.append(f"  fraction of peak, all shapes:          best {_fmt(a['best_frac_peak'])}  "
                     f"median {_fmt(a['median_frac_peak'])}  (n={a['count']})")
        lines.append(f"  fraction of peak, compute-bound (I > ridge): best {_fmt(c['best_frac_peak'])}  "
                     f"median {_fmt(c['median_frac_peak'])}  (n={c['count']})")
        best_g = None if a["best_gflops"] is None else a["best_gflops"] * scale
        med_g = None if a["median_gflops"] is None else a["median_gflops"] * scale
        lines.append(f"  fraction of attainable (roofline), median {_fmt(a['median_frac_attainable'])}; "
                     f"{unit}: best {_fmt(best_g, '.1f')}  median {_fmt(med_g, '.1f')}")
        if "best_shape" in g:
            lines.append(f"  best shape {g['best_shape']['mnk']} ({g['best_shape']['frac_peak']:.3f}), "
                         f"worst {g['worst_shape']['mnk']} ({g['worst_shape']['frac_peak']:.3f})")
        if "baseline" in g:
            b = g["baseline"]
            lines.append(f"  numpy baseline: median fraction {_fmt(b['median_frac_peak'])}, median "
                         f"{_fmt(b['median_gflops'], '.1f')} GFLOP/s; stand-in speedup median "
                         f"{_fmt(b['median_speedup'], '.2f')}x, geomean {_fmt(b['geomean_speedup'], '.2f')}x, "
                         f"faster on {b['faster_than_baseline']}/{a['count']}")
            lines.append(f"  calc_diff vs baseline: max {_fmt(b['max_calc_diff'], '.2e')} "
                         f"(tolerance {b['calc_diff_tolerance']}, {b['over_tolerance']} over)")
        spreads = g.get("spread")
        if spreads:
            lines.append(f"  repeats per side: median {_fmt(spreads['median_repeats'], '.0f')}, max "
                         f"{_fmt(spreads['max_repeats'], '.0f')}; run-to-run spread median "
                         f"{_fmt(spreads['median_spread'], '.3f')}, max {_fmt(spreads['max_spread'], '.3f')}")
        if g.get("over_peak"):
            lines.append(f"  WARNING: {g['over_peak']} shapes above the peak (over_peak=1 in their rows): "
                         + ("the CPU ceiling (numpy's fp32 GEMM) was measured while the machine was busier (rerun on "
                            "a quiet machine or pass --ceiling-gflops), or the stand-in's Cube ran on the AMX unit, "
                            "which can beat it" if mode == "cpu" else "the model predicts more than the peak"))
        for error, count in g.get("top_errors", {}).items():
            lines.append(f"  {count} x {error[:150]}")
        if "bound_counts" in g:
            lines.append("  bound: " + ", ".join(f"{k} {v}" for k, v in g["bound_counts"].items()))
    return "\n".join(lines)


def write_plots(rows: list[dict], out_dir: str | Path) -> list[Path]:
    """fraction_vs_intensity.png (one panel per mode x dtype, ridge marked), fraction_cdf.png and, with CPU rows,
    speedup_vs_numpy.png. Returns the paths written (none if there are no ok rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    out_dir = Path(out_dir)
    ok = [r for r in rows if r["status"] == "ok" and r["frac_peak"] is not None]
    panels = [(mode, dtype) for mode in ("model", "cpu") for dtype in ("bf16", "fp8")
              if any(r["mode"] == mode and r["dtype"] == dtype for r in ok)]
    if not panels:
        return []
    written: list[Path] = []
    titles = {"model": "modelled {arch}", "cpu": "CPU stand-in (measured)"}

    # Fraction of peak against arithmetic intensity.
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (mode, dtype) in zip(axes[0], panels, strict=True):
        sel = [r for r in ok if r["mode"] == mode and r["dtype"] == dtype]
        sc = ax.scatter([r["intensity"] for r in sel], [r["frac_peak"] for r in sel], s=9,
                        c=[math.log2(r["m"]) for r in sel], cmap="viridis")
        ridge = _median([r["ridge"] for r in sel])
        ax.axvline(ridge, color="red", ls="--", lw=1, label=f"ridge {ridge:.0f} FLOP/B")
        lo, hi = min(r["intensity"] for r in sel), max(r["intensity"] for r in sel)
        xs = [lo * (hi / lo) ** (i / 200) for i in range(201)] if hi > lo else [lo]
        ax.plot(xs, [min(1.0, x / ridge) for x in xs], color="gray", lw=1, label="roofline min(1, I/ridge)")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(0, max(1.05, max(r["frac_peak"] for r in sel) * 1.05))
        ax.set_xlabel("arithmetic intensity (FLOP/B)")
        ax.set_ylabel("fraction of peak")
        ax.set_title(f"{titles[mode].format(arch=sel[0]['arch'])}, {dtype} (n={len(sel)})", fontsize=9)
        ax.legend(fontsize=8, loc="lower right")
        fig.colorbar(sc, ax=ax, label="log2 M")
    fig.tight_layout()
    written.append(out_dir / "fraction_vs_intensity.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    # Distribution of the fraction of peak (CDF), all shapes solid, compute-bound dashed.
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for color, (mode, dtype) in enumerate(panels):
        sel = [r for r in ok if r["mode"] == mode and r["dtype"] == dtype]
        for subset, style in ((sel, "-"), ([r for r in sel if r["compute_bound"]], "--")):
            values = sorted(r["frac_peak"] for r in subset)
            if values:
                label = f"{mode} {dtype}" + (" compute-bound" if style == "--" else "")
                ax.step(values, [(i + 1) / len(values) for i in range(len(values))], style, where="post",
                        color=f"C{color}", label=f"{label} (n={len(values)})")
    ax.set_xlabel("fraction of peak")
    ax.set_ylabel("fraction of shapes at or below")
    ax.set_title("distribution of the fraction of peak (cpu: measured; model: predicted)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    written.append(out_dir / "fraction_cdf.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    # Stand-in against the numpy baseline.
    cpu = [r for r in ok if r["mode"] == "cpu" and r["speedup"] is not None]
    if cpu:
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        for dtype, marker in (("bf16", "o"), ("fp8", "^")):
            sel = [r for r in cpu if r["dtype"] == dtype]
            if sel:
                ax.scatter([r["flops"] / 1e9 for r in sel], [r["speedup"] for r in sel], s=14, marker=marker,
                           label=dtype)
        ax.axhline(1.0, color="gray", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("GFLOP per call (2MNK / 1e9)")
        ax.set_ylabel("numpy baseline time / stand-in time")
        ax.set_title("CPU stand-in vs the numpy baseline (measured, same run)", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(out_dir / "speedup_vs_numpy.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written
