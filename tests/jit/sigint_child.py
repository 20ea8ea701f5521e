"""Child process of the Ctrl-C tests: interrupts FP8 GEMMs with timed SIGINTs and checks every later result.

Usage: python sigint_child.py ITERATIONS [solo]. Prints one JSON line: iterations, interrupted (KeyboardInterrupt
caught), torn (a GEMM output that was neither untouched nor completely right), wrong_after (a later GEMM whose output
was not exactly right), solo_shapes / other_shapes (launch shapes whose launches run on the caller alone / threaded:
with ``solo`` every shape ends on the caller alone, jit/launch.py). A hang is the parent's timeout.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import ml_dtypes
import numpy as np

import deep_gemm
from deep_gemm.utils import per_token_cast_to_fp8


def operands(rng, m, n, k):
    a = per_token_cast_to_fp8(rng.standard_normal((m, k), dtype=np.float32), use_ue8m0=True, gran_k=32)
    b = per_token_cast_to_fp8(rng.standard_normal((n, k), dtype=np.float32), use_ue8m0=True, gran_k=32)
    return a, b


def main(iterations: int, solo: bool = False) -> dict:
    from deep_gemm.jit import launch

    if solo:  # limits no launch can miss: every shape ends on the caller alone
        launch._SOLO_PROBE_S = launch._SOLO_MARGIN = launch._SOLO_STOP = 1e9
    rng = np.random.default_rng(0)
    big_a, big_b = operands(rng, 256, 512, 1024)
    small_a, small_b = operands(rng, 64, 64, 128)
    garbage = np.frombuffer(np.full(2, 0x7FC1, np.uint16).tobytes(), ml_dtypes.bfloat16)[0]  # a NaN payload

    d_big = np.empty((256, 512), ml_dtypes.bfloat16)
    deep_gemm.fp8_gemm_nt(big_a, big_b, d_big)
    expected_big = d_big.view(np.uint16).copy()
    d_small = np.empty((64, 64), ml_dtypes.bfloat16)
    deep_gemm.fp8_gemm_nt(small_a, small_b, d_small)
    expected_small = d_small.view(np.uint16).copy()

    t0 = time.perf_counter()
    for _ in range(3):
        deep_gemm.fp8_gemm_nt(big_a, big_b, d_big)
    duration = (time.perf_counter() - t0) / 3

    interrupted = torn = wrong_after = 0
    for _ in range(iterations):
        d_big.fill(garbage)
        timer = threading.Timer(rng.uniform(0.0, 1.2 * duration), os.kill, (os.getpid(), signal.SIGINT))
        try:
            timer.start()
            deep_gemm.fp8_gemm_nt(big_a, big_b, d_big)
            timer.join()
            time.sleep(0.002)  # a signal that landed after the call is handled here, inside the try
        except KeyboardInterrupt:
            interrupted += 1
            timer.join()
        bits = d_big.view(np.uint16)
        if not ((bits == expected_big).all() or (bits == np.uint16(0x7FC1)).all()):
            torn += 1
        d_small.fill(garbage)
        deep_gemm.fp8_gemm_nt(small_a, small_b, d_small)
        if not (d_small.view(np.uint16) == expected_small).all():
            wrong_after += 1
    # NOTES: a shape still learning runs alone once its threaded samples are in (an interrupted launch adds none)
    alone = [way.alone is True or (way.alone is None and len(way.threaded) >= launch._SAMPLES)
             for way in launch.LAUNCHER._ways.values()]
    return {"iterations": iterations, "interrupted": interrupted, "torn": torn, "wrong_after": wrong_after,
            "launch_ms": round(duration * 1e3, 3), "solo_shapes": alone.count(True), "other_shapes": alone.count(False)}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), solo=sys.argv[2:] == ["solo"])))
