#!/usr/bin/env python
"""Render and translate a template for given constants and print both, or open a cache entry.

    python scripts/dump_kernel.py --template examples/vadd --const NUM_AI_CORES=4 --const TILE=16 --const SCALE=2.0
    python scripts/dump_kernel.py --entry jit_cache/cache/vadd.<digest> [--import] [--compile "(float32[::1], int64)"]
"""

import sys

from deep_gemm.jit.dump import main

if __name__ == "__main__":
    sys.exit(main())
