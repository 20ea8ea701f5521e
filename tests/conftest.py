"""Test session setup: one kernel cache directory for the whole session (kernels compile once and are shared by
every test), a seeded RNG, and fixtures for tests that need a cache of their own."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile

import numpy as np
import pytest

# NOTES: set before deep_gemm.jit reads it. A user-provided DG_JIT_CACHE_DIR is respected (handy for reruns).
_SESSION_CACHE = None
if not os.environ.get("DG_JIT_CACHE_DIR"):
    _SESSION_CACHE = tempfile.mkdtemp(prefix="dg-test-cache-")
    os.environ["DG_JIT_CACHE_DIR"] = _SESSION_CACHE


# NOTES: a shell starts a background job (and a CI runner may start the suite) with SIGINT ignored, and children
# inherit an ignored signal; then Python installs no KeyboardInterrupt handler and the Ctrl-C tests would test
# nothing. Restore Python's default handler here, so this process and every child it starts handle SIGINT as a
# user's interpreter does.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionfinish(session, exitstatus):
    if _SESSION_CACHE is not None:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture
def session_cache_dir() -> str:
    return os.environ["DG_JIT_CACHE_DIR"]
