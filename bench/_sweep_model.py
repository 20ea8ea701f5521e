"""Model mode of the sweep: one results row per shape from the chip cost model (``deep_gemm.estimate_gemm``).

Every figure in these rows is a prediction for the modelled NPU, never a measurement.
"""

from __future__ import annotations

from collections.abc import Callable

from _sweep_csv import config_to_str, describe_error, new_row, set_performance

Estimator = Callable[..., object]


def resolve_estimator() -> Estimator:
    """``deep_gemm.estimate_gemm``; RuntimeError saying so if it cannot be imported yet."""
    import deep_gemm

    try:
        return deep_gemm.estimate_gemm
    except Exception as e:  # noqa: BLE001 (ImportError or AttributeError from the lazy export table)
        raise RuntimeError(f"model mode needs deep_gemm.estimate_gemm ({type(e).__name__}: {e})") from e


def chip_roofline(arch: str | None, num_ai_cores: int | None, dtype: str) -> dict:
    """The modelled chip's name, core count, peak FLOP/s for ``dtype`` on those cores, and HBM bandwidth (B/s).

    Defaults: the runtime's arch (DG_NPU_ARCH, 950DT) and all of its AI cores."""
    from deep_gemm.arch import get_arch
    from deep_gemm.runtime import get_npu_arch

    spec = get_arch(arch if arch is not None else get_npu_arch())
    cores = spec.num_ai_cores if num_ai_cores is None else num_ai_cores
    if not 0 < cores <= spec.num_ai_cores:
        raise ValueError(f"{num_ai_cores=} must be in [1, {spec.num_ai_cores}] for arch {spec.name}")
    return {"arch": spec.name, "num_ai_cores": cores, "peak_flops": spec.peak_flops(dtype, cores),
            "bandwidth_bytes_s": spec.hbm_bytes_per_s}


def model_row(estimator: Estimator, dtype: str, m: int, n: int, k: int, roofline: dict) -> dict:
    """Predict one shape: time, GFLOP/s, fraction of peak and of the attainable roofline, bound, config.

    Any error of the estimator becomes a "failed" row carrying its message."""
    row = new_row("model", dtype, m, n, k, arch=roofline["arch"], num_ai_cores=roofline["num_ai_cores"],
                  peak_flops=roofline["peak_flops"], bandwidth_bytes_s=roofline["bandwidth_bytes_s"])
    try:
        est = estimator(m, n, k, a_dtype=dtype, b_dtype=dtype, out_dtype="bf16", arch=roofline["arch"],
                        num_ai_cores=roofline["num_ai_cores"])
        time_us = float(est.time_us)
        if not time_us > 0:
            raise ValueError(f"estimate_gemm returned time_us={time_us!r} for {m=} {n=} {k=} {dtype=}")
        set_performance(row, time_us * 1e-6)
        row["bound"] = str(getattr(est, "bound", "") or "")
        row["config"] = config_to_str(getattr(est, "config", None))
    except Exception as e:  # noqa: BLE001 (recorded in the row; the sweep goes on)
        row.update(status="failed", error=describe_error(e))
    return row
