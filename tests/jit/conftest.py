"""Fixtures of the JIT tests: the example kernels (built once per session, in the session cache) and fresh roots."""

from __future__ import annotations

import pytest
from jit_helpers import EXAMPLE_DEVICE, HELPERS_CONSTS, LOOPS_CONSTS, VADD_CONSTS

from deep_gemm.jit import build
from deep_gemm.jit import compile as jit_compile


@pytest.fixture(scope="session")
def vadd_kernel():
    return build("vadd", VADD_CONSTS, template="examples/vadd", device_module=EXAMPLE_DEVICE)


@pytest.fixture(scope="session")
def loops_kernel():
    return build("loops", LOOPS_CONSTS, template="examples/loops", device_module=EXAMPLE_DEVICE)


@pytest.fixture(scope="session")
def helpers_kernel():
    return build("helpers", HELPERS_CONSTS, template="examples/helpers", device_module=EXAMPLE_DEVICE)


@pytest.fixture
def fresh_root(tmp_path, monkeypatch):
    """A new, empty cache root in force for this test (and an empty in-process cache)."""
    root = tmp_path / "root"
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(root))
    jit_compile.clear_memory_cache()
    yield root
    jit_compile.clear_memory_cache()
