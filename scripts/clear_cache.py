#!/usr/bin/env python
"""Remove deep_gemm kernel cache entries (all, or one kernel's) and leftover temporary builds.

    python scripts/clear_cache.py                  # the root in force (DG_JIT_CACHE_DIR, jit_cache/, user cache)
    python scripts/clear_cache.py --name fp8_gemm  # only fp8_gemm.<digest> entries
    python scripts/clear_cache.py --root DIR --dry-run
"""

import argparse
import sys
from pathlib import Path

from deep_gemm.jit import cache


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, help="cache root (default: the one in force)")
    parser.add_argument("--name", help="only entries of this kernel name")
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed")
    args = parser.parse_args(argv)
    root = args.root or cache.cache_root()
    removed = cache.clear(root, name=args.name, dry_run=args.dry_run)
    for path in removed:
        print(("would remove " if args.dry_run else "removed ") + str(path))
    print(f"{len(removed)} item(s) {'to remove' if args.dry_run else 'removed'} under {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
