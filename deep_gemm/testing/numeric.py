"""Correctness metrics: DeepGEMM's ``calc_diff``, byte counts for bandwidth figures, and a bitwise-equality check."""

from __future__ import annotations

import numpy as np

# NOTES: the sums run over chunks of this many elements, so no float64 copy of a whole (e.g. 16384 x 36864) output
# is ever alive; the sweep compares its largest shapes with this function.
_CHUNK_ELEMS = 1 << 23


def calc_diff(x: np.ndarray, y: np.ndarray) -> float:
    """1 - 2 sum(x*y) / sum(x^2 + y^2) in float64 (0 when both are all zeros); x and y have the same shape.

    0 means identical; DeepGEMM's thresholds are 1e-5 (BF16), 1e-3 (FP8), 1e-2 (one FP4 operand), 2e-2 (both FP4).
    """
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape:
        raise ValueError(f"calc_diff needs equal shapes, got {x.shape=} {y.shape=}")
    xf, yf = x.reshape(-1), y.reshape(-1)
    sxy = sxx = 0.0
    for start in range(0, xf.size, _CHUNK_ELEMS):
        xs = xf[start:start + _CHUNK_ELEMS].astype(np.float64)
        ys = yf[start:start + _CHUNK_ELEMS].astype(np.float64)
        sxy += float(np.dot(xs, ys))
        sxx += float(np.dot(xs, xs)) + float(np.dot(ys, ys))
    if sxx == 0.0:
        return 0.0
    return 1.0 - 2.0 * sxy / sxx


def count_bytes(*arrays: object) -> int:
    """Total bytes (elements x item size) of the given arrays; tuples and lists are walked, None is skipped."""
    total = 0
    for a in arrays:
        if a is None:
            continue
        if isinstance(a, (tuple, list)):
            total += count_bytes(*a)
        elif isinstance(a, np.ndarray):
            total += a.size * a.itemsize
        else:
            raise TypeError(f"count_bytes takes numpy arrays (or tuples/lists of them), got {type(a).__name__}")
    return total


def assert_bitwise_equal(x: np.ndarray, y: np.ndarray, label: str = "") -> None:
    """Raise AssertionError unless x and y have the same dtype, shape and bits (NaNs compare by their bits).

    The message gives the number of mismatches and the first one: its index, both values and both bit patterns.
    """
    x, y = np.asarray(x), np.asarray(y)
    where = f" [{label}]" if label else ""
    if x.dtype != y.dtype:
        raise AssertionError(f"dtype mismatch{where}: {x.dtype} vs {y.dtype}")
    if x.shape != y.shape:
        raise AssertionError(f"shape mismatch{where}: {x.shape} vs {y.shape}")
    if x.size == 0:
        return
    bits = np.dtype(f"V{x.itemsize}") if x.itemsize not in (1, 2, 4, 8) else np.dtype(f"u{x.itemsize}")
    xb, yb = np.ascontiguousarray(x).view(bits), np.ascontiguousarray(y).view(bits)
    diff = xb != yb
    if not diff.any():
        return
    idx = tuple(int(i) for i in np.argwhere(diff)[0])
    bx, by = xb[idx], yb[idx]
    hx = bx.tobytes()[::-1].hex() if isinstance(bx, np.void) else f"{int(bx):0{2 * x.itemsize}x}"
    hy = by.tobytes()[::-1].hex() if isinstance(by, np.void) else f"{int(by):0{2 * x.itemsize}x}"
    raise AssertionError(
        f"bitwise mismatch{where}: {int(diff.sum())} of {x.size} elements differ; first at {idx}: "
        f"{x[idx]!r} (0x{hx}) vs {y[idx]!r} (0x{hy})"
    )
