"""Argument checks the ep modules share (buffer.py, tilekernels.py): errors name the argument and its value."""

from __future__ import annotations

import numpy as np


def positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive int: {name}={value!r}")
    return int(value)


def array(value, name: str, ndim: int | None = None) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{name} must be a numpy array or CPU tensor: {type(value).__name__}")
    if ndim is not None and value.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims: {name}.shape={value.shape}")
    return value
