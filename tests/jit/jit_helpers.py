"""Shared pieces of the JIT tests: example kernel constants, a Python runner for translated snippets (no numba:
fast, and checks the translation's semantics), child processes. Fixtures live in conftest.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

from deep_gemm.jit import compile as jit_compile
from deep_gemm.jit.translate import translate

EXAMPLE_DEVICE = "deep_gemm.jit.example_device"
VADD_CONSTS = {"NUM_AI_CORES": 3, "TILE": 16, "SCALE": 2.0}
LOOPS_CONSTS = {"NUM_AI_CORES": 4, "ROWS": 6, "COLS": 9, "USE_BIAS": True}
HELPERS_CONSTS = {"NUM_AI_CORES": 3, "TILE": 8}


def snippet(body: str, entry: str = 'extern "C" __global__ __aicore__ void k() {}', constants=None):
    """Translate C++ helper functions (plus a trivial entry) and run the result as plain Python.

    Returns (namespace, translation). NOTES: the generated code is plain Python + numpy; with njit replaced by
    an identity decorator it runs in the interpreter, which checks the translation's semantics in milliseconds.
    """
    source = textwrap.dedent(body) + "\n" + entry + "\n"
    translation = translate(source, template="snippet.asc.j2", constants={"NUM_AI_CORES": 2, **(constants or {})},
                            device_module=EXAMPLE_DEVICE)
    python = translation.python.replace(
        "from numba import njit, prange", "njit = lambda *a, **k: (lambda f: f)\nprange = range")
    namespace: dict = {}
    exec(compile(python, "<translated snippet>", "exec"), namespace)
    return namespace, translation


def run_child(code: str, root, timeout: float = 300.0, extra_env=None) -> dict:
    """Run Python code in a fresh process with DG_JIT_CACHE_DIR=root; it must print one JSON line last."""
    env = dict(os.environ, DG_JIT_CACHE_DIR=str(root), **(extra_env or {}))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"child failed:\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


# A child that builds and runs vadd, then reports what the JIT did.
VADD_CHILD = f"""
import json
import numpy as np
from deep_gemm.jit import build, stats
k = build("vadd", {VADD_CONSTS!r}, template="examples/vadd", device_module={EXAMPLE_DEVICE!r})
x = np.arange(50, dtype=np.float32); y = np.ones(50, np.float32); z = np.zeros(50, np.float32)
k(np.zeros(1, np.uint8), x, y, z, 50)
print(json.dumps({{"stats": stats(), "numba": k.numba_stats(), "source": k.source, "path": str(k.path),
                  "ok": bool(np.array_equal(z, (x + y) * np.float32({VADD_CONSTS['SCALE']!r})))}}))
"""


def vadd_reference(x, y, scale):
    return (x + y) * np.float32(scale)


def vadd_args(n: int, rng):
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    return np.zeros(1, np.uint8), x, y, np.zeros(n, np.float32), n


def stats_delta(before: dict) -> dict:
    after = jit_compile.stats()
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}

