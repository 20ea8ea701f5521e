#!/usr/bin/env python
"""Remove whatever sits in a deep_gemm kernel cache: entries (or anything else at an entry path), leftover
temporary builds and moved-aside entries in tmp/, and numba's files of the device modules in numba/.

    python scripts/clear_cache.py                  # the root in force (DG_JIT_CACHE_DIR, jit_cache/, user cache)
    python scripts/clear_cache.py --name fp8_gemm  # only what sits at fp8_gemm.<digest> entry paths
    python scripts/clear_cache.py --root DIR --dry-run
"""

import argparse
import os
import sys
from pathlib import Path

from deep_gemm.jit import cache


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, help="cache root (default: the one in force)")
    parser.add_argument("--name", help="only entries of this kernel name")
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed")
    args = parser.parse_args(argv)
    try:
        root = args.root or cache.cache_root()
    except OSError as e:
        print(f"clear_cache: {e}", file=sys.stderr)
        return 1
    before = cache.clear(root, name=args.name, dry_run=True)
    removed = cache.clear(root, name=args.name, dry_run=args.dry_run)
    for path in removed:
        print(("would remove " if args.dry_run else "removed ") + str(path))
    kept = [p for p in before if os.path.lexists(p)] if not args.dry_run else []
    for path in kept:
        print(f"could not remove {path} (permissions? remove it by hand)", file=sys.stderr)
    print(f"{len(removed)} item(s) {'to remove' if args.dry_run else 'removed'} under {root}")
    return 1 if kept else 0


if __name__ == "__main__":
    sys.exit(main())
