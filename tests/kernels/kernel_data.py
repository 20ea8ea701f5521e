"""Test data for the kernel launchers, built in numpy the way DeepGEMM-Ascend's tests build it: FP8 codes over all
non-NaN e4m3 values, FP4 codes over all 16 e2m1 values, per-32-K power-of-two scales, physical storage in either
major with non-tight rows, and float64 references."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

FP8_CODES = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=np.uint8)
FP8_EXPONENTS = (118, 119, 120)  # scales 2^-9, 2^-8, 2^-7
FP4_EXPONENTS = (125, 126, 127)  # scales 1/4, 1/2, 1
PAD = 3  # extra elements per physical row: non-tight outer strides everywhere


@dataclass
class Operand:
    """One GEMM operand: the physical storage the launcher takes, its scales, and its fp64 logical values."""

    storage: np.ndarray  # 2-D, unit last stride, non-tight rows
    sf: np.ndarray | None  # int16 [ceil(K/64), MN] required layout
    values: np.ndarray  # float64 [mn, k], scales applied


def _store(logical: np.ndarray, major: str, dtype) -> np.ndarray:
    """[rows, cols] logical -> non-tight physical storage: K-major rows = logical rows, MN-major rows = K."""
    phys = logical if major == "k" else logical.T
    buf = np.zeros((phys.shape[0], phys.shape[1] + PAD), dtype)
    buf[:, : phys.shape[1]] = phys
    return buf[:, : phys.shape[1]]


def _required_sf(exps: np.ndarray) -> np.ndarray:
    """uint8 exponents [mn, ceil(k/32)] -> int16 [ceil(k/64), mn]: low byte = even 32-block, high byte = odd."""
    mn, blocks = exps.shape
    padded = np.zeros((mn, blocks + blocks % 2), np.uint16)
    padded[:, :blocks] = exps
    return np.ascontiguousarray((padded[:, 0::2] | (padded[:, 1::2] << 8)).T).view(np.int16)


def _scales(exps: np.ndarray, k: int) -> np.ndarray:
    return np.repeat(np.ldexp(1.0, exps.astype(np.int64) - 127), 32, axis=1)[:, :k]


def fp8_operand(rng: np.random.Generator, mn: int, k: int, major: str) -> Operand:
    codes = rng.choice(FP8_CODES, size=(mn, k))
    exps = rng.choice(np.array(FP8_EXPONENTS, np.uint8), size=(mn, -(-k // 32)))
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * _scales(exps, k)
    return Operand(_store(codes, major, np.uint8), _required_sf(exps), values)


def fp4_operand(rng: np.random.Generator, mn: int, k: int, major: str) -> Operand:
    """Packed two codes per byte along the contiguous axis (K for K-major, MN for MN-major), even one low."""
    codes = rng.integers(0, 16, size=(mn, k), dtype=np.uint8)
    exps = rng.choice(np.array(FP4_EXPONENTS, np.uint8), size=(mn, -(-k // 32)))
    values = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float64) * _scales(exps, k)
    phys = codes if major == "k" else codes.T.copy()
    if phys.shape[1] % 2:
        phys = np.concatenate([phys, np.zeros((phys.shape[0], 1), np.uint8)], axis=1)
    packed = phys[:, 0::2] | (phys[:, 1::2] << 4)
    buf = np.zeros((packed.shape[0], packed.shape[1] + PAD), np.uint8)
    buf[:, : packed.shape[1]] = packed
    return Operand(buf[:, : packed.shape[1]], _required_sf(exps), values)


def bf16_operand(rng: np.random.Generator, mn: int, k: int, major: str) -> Operand:
    logical = rng.standard_normal((mn, k)).astype(ml_dtypes.bfloat16)
    return Operand(_store(logical.view(np.uint16), major, np.uint16), None, logical.astype(np.float64))


def operand(rng: np.random.Generator, dtype: str, mn: int, k: int, major: str) -> Operand:
    return {"fp8": fp8_operand, "fp4": fp4_operand, "bf16": bf16_operand}[dtype](rng, mn, k, major)


def output(rng: np.random.Generator, m: int, n: int, out_dtype: str, with_c: bool) -> tuple[np.ndarray, np.ndarray]:
    """(D storage [m, n] with non-tight rows, its fp64 values). With C, D holds random C values; else NaN bits,
    so any element the kernel fails to write shows up."""
    if with_c:
        c = rng.standard_normal((m, n)).astype(np.float32)
    else:
        c = np.full((m, n), np.nan, np.float32)
    if out_dtype == "bf16":
        bits = c.astype(ml_dtypes.bfloat16).view(np.uint16)
        buf = np.full((m, n + PAD), 0x7FC1, np.uint16)
        buf[:, :n] = bits
        return buf[:, :n], bits.view(ml_dtypes.bfloat16).astype(np.float64)
    buf = np.full((m, n + PAD), -7.0, np.float32)
    buf[:, :n] = c
    return buf[:, :n], c.astype(np.float64)


def as_float(d: np.ndarray) -> np.ndarray:
    """D storage -> float64 values."""
    if d.dtype == np.uint16:
        return d.view(ml_dtypes.bfloat16).astype(np.float64)
    return d.astype(np.float64)
