"""Command line: show what the JIT makes of a template, or open a cache entry (and reproduce its compile).

    python -m deep_gemm.jit.dump --template examples/vadd --const NUM_AI_CORES=4 --const TILE=16 --const SCALE=2.0
    python -m deep_gemm.jit.dump --entry jit_cache/cache/vadd.<digest> [--import] [--compile "(float32[::1], int64)"]

scripts/dump_kernel.py is the same tool.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parse_const(text: str) -> tuple[str, object]:
    """KEY=VALUE with VALUE an int, float, true/false, a comma list of those, or a string."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--const expects KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)

    def scalar(s: str):
        if s.lower() in ("true", "false"):
            return s.lower() == "true"
        for kind in (int, float):
            try:
                return kind(s)
            except ValueError:
                pass
        return s

    value = tuple(scalar(s) for s in raw.split(",")) if "," in raw else scalar(raw)
    return key, value


def _section(title: str, text: str) -> None:
    print(f"===== {title} " + "=" * max(0, 100 - len(title)))
    print(text.rstrip())


def dump_template(args) -> int:
    from .compile import DEFAULT_DEVICE_MODULE
    from .render import render_lines
    from .translate import translate

    constants = dict(args.const or [])
    rendered, line_map = render_lines(args.template, constants, args.template_dir)
    if args.what in ("asc", "both"):
        _section(f"{args.template} (rendered)", rendered)
    translation = translate(rendered, template=f"{args.template} (rendered)", constants=constants,
                            device_module=args.device_module or DEFAULT_DEVICE_MODULE, line_map=line_map)
    if args.what in ("py", "both"):
        _section("kernel.py (translated)", translation.python)
    return 0


def dump_entry(args) -> int:
    path = Path(args.entry)
    for name in ("meta.json", "kernel.asc", "kernel.py"):
        f = path / name
        if args.what == "asc" and name == "kernel.py" or args.what == "py" and name == "kernel.asc":
            continue
        _section(name, f.read_text() if f.is_file() else f"(missing: {f})")
    if args.do_import or args.compile:
        from .compile import _import_kernel

        meta = json.loads((path / "meta.json").read_text())
        module = _import_kernel(path, meta["name"], meta["digest"])
        print(f"imported {path / 'kernel.py'} as {module.__name__}")
        if args.compile:
            from .compile import EntryFunction, launcher_mode

            launcher = launcher_mode()
            name = meta["entry"] if launcher == "threads" else meta["entry"] + "_prange"
            fn = EntryFunction(getattr(module, name), launcher)
            from numba import types
            from numba.core import sigutils

            # NOTES: the entry's hidden trailing arguments: a mixed kernel's pool of cross-core states
            # (compiled_kernel.cross_pool), the launch's cancel flag (jit/interrupt.py)
            pool = (types.Array(types.uint8, 2, "C"),) if meta.get("is_mixed") else ()
            sig = (*sigutils.normalize_signature(args.compile)[0], *pool, types.Array(types.uint8, 1, "C"))
            fn.compile(sig)  # raises numba's own error, with its full traceback
            print(f"compiled {name}{args.compile}: {fn.stats}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--template", help="template name (fp8_gemm, examples/vadd) or a .asc.j2 path")
    src.add_argument("--entry", help="a cache entry directory")
    parser.add_argument("--const", action="append", type=parse_const, metavar="KEY=VALUE", help="template constant")
    parser.add_argument("--template-dir", help="templates directory (default: the checkout's or packaged)")
    parser.add_argument("--device-module", help="device module the template calls (default deep_gemm.device)")
    parser.add_argument("--what", choices=("asc", "py", "both"), default="both", help="what to print")
    parser.add_argument("--import", dest="do_import", action="store_true", help="with --entry: import kernel.py")
    parser.add_argument("--compile", metavar="SIG",
                        help='with --entry: numba-compile the entry for SIG, e.g. "(float32[::1], int64)"')
    args = parser.parse_args(argv)
    from .errors import JITError

    try:
        return dump_template(args) if args.template else dump_entry(args)
    except JITError as e:
        print(str(e), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
