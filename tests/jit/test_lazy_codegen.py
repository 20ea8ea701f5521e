"""Deferred machine code (jit/lazy_codegen.py): a kernel's callees get none until called from Python, the entry gets
its own at once; a deferred function called from Python works (and raises) like any numba function; numba's disk cache
keeps deferred libraries as bitcode and loads them deferred again; DG_JIT_LAZY_CODEGEN=0 restores numba's behaviour.
And the module passes (jit/numba_setup.py): thin device wrappers get numba's cheap pipeline only, other code both.
Each case runs in a child process with a fresh cache root, so every function compiles cold."""

from __future__ import annotations

from jit_helpers import EXAMPLE_DEVICE, run_child

# Builds the helpers example (TILE from the environment: one specialization per value) and runs it, then reports on
# its device callee fill (never called from Python until then), calls fill from Python and reports again.
CHILD = f"""
import json, os
import numpy as np
from deep_gemm.jit import build, lazy_codegen
from deep_gemm.jit.numba_setup import apply_numba_settings
from deep_gemm.jit.example_device import fill
tile = int(os.environ["TEST_TILE"])
k = build("helpers", {{"NUM_AI_CORES": 3, "TILE": tile}}, template="examples/helpers", device_module={EXAMPLE_DEVICE!r})
n = 3 * tile + 5
x = np.arange(n, dtype=np.float32); y = np.ones(n, np.float32); tiles = np.zeros(4, np.int32)
k(x, y, tiles, n, 2.0)
sign = np.where((np.arange(n) // tile) % 2 == 1, -1.0, 1.0).astype(np.float32)
ok = bool(np.array_equal(y, (2 * np.arange(n, dtype=np.float32) + 1) * sign))
(cres,) = fill.overloads.values()
callee_deferred = bool(getattr(cres.library, "_dg_deferred", False))
wrapper_names = [cres.fndesc.llvm_cpython_wrapper_name, cres.fndesc.llvm_cfunc_wrapper_name]
def defined(library, name):  # in the library's IR (a library numba loaded as object code keeps it in _shared_module)
    for module in (library._final_module, getattr(library, "_shared_module", None)):
        try:
            if module is not None and not module.get_function(name).is_declaration:
                return True
        except NameError:
            pass
    return False
callee_wrappers = [defined(cres.library, name) for name in wrapper_names]
entry_libs = [c.library for fn in k.phase_fns for c in fn.dispatcher.overloads.values()]
dst = np.zeros(3, np.float32)
fill(dst, np.float32(1.5))  # the types the kernel compiled fill for
print(json.dumps({{
    "lazy": apply_numba_settings()["lazy_codegen"], "ok": ok,
    "callee_deferred": callee_deferred, "callee_cache_hits": sum(fill.stats.cache_hits.values()),
    "entries_deferred": [bool(getattr(lib, "_dg_deferred", False)) for lib in entry_libs],
    "after_call_deferred": bool(getattr(cres.library, "_dg_deferred", False)),
    "callee_wrappers": callee_wrappers,
    "wrapper_library": [defined(cres.library._dg_wrapper_library, name) for name in wrapper_names]
    if hasattr(cres.library, "_dg_wrapper_library") else None,
    "call": dst.tolist(), "stats": dict(lazy_codegen.stats),
}}))
"""


def test_callees_get_machine_code_only_when_called_from_python(tmp_path):
    first = run_child(CHILD, tmp_path, extra_env={"TEST_TILE": "16"})
    assert first["lazy"] is True and first["ok"]
    assert first["callee_deferred"] and first["callee_cache_hits"] == 0
    assert first["entries_deferred"] == [False]  # the launcher runs it: generated at once
    # numba's two wrappers (Python call, C function pointer) are not in the callee's library: the Python call built
    # both in a library of its own (linking the callee's IR); the callee's library itself stays without machine code
    assert first["callee_wrappers"] == [False, False]
    assert first["wrapper_library"] == [True, True] and first["after_call_deferred"] is True
    assert first["stats"]["wrappers"] >= 1
    assert first["call"] == [1.5] * 3

    # A new specialization in a new process: fill comes from numba's disk cache (stored as bitcode), deferred
    second = run_child(CHILD, tmp_path, extra_env={"TEST_TILE": "8"})
    assert second["ok"]
    assert second["callee_cache_hits"] == 1 and second["callee_deferred"]
    assert second["callee_wrappers"] == [False, False] and second["wrapper_library"] == [True, True]
    assert second["call"] == [1.5] * 3


def test_off_switch_keeps_numba_eager(tmp_path):
    out = run_child(CHILD, tmp_path, extra_env={"TEST_TILE": "16", "DG_JIT_LAZY_CODEGEN": "0"})
    assert out["lazy"] is False and out["ok"]
    assert not out["callee_deferred"] and out["stats"] == {"deferred": 0, "materialized": 0, "wrappers": 0}
    assert out["callee_wrappers"] == [True, True] and out["wrapper_library"] is None
    assert out["call"] == [1.5] * 3


def test_a_deferred_function_raises_on_its_first_python_call(tmp_path):
    # check_same_shape raises with its own runtime values; DataCopyPad's callee (gm_to_ub, linked into DataCopyPad,
    # its own library never generated) raises with runtime values, which are boxed through that callee's Environment
    out = run_child("""
        import json
        import numpy as np
        from deep_gemm import device
        from deep_gemm.device import vector
        from deep_gemm.jit import lazy_codegen
        errors = []
        for _ in range(2):  # the first call materializes the library, the second goes through numba's C dispatch
            try:
                vector.check_same_shape(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
            except ValueError as e:
                errors.append(str(e))
        vector.check_same_shape(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32))
        out, ub = np.zeros(200, np.float32), np.ones((6, 16), np.float32)
        try:
            device.DataCopyPad(out, ub, 100, 40, 4, 13, 0)
        except IndexError as e:
            errors.append(str(e))
        print(json.dumps({"errors": errors, "untouched": not out.any(), "stats": dict(lazy_codegen.stats)}))
    """, tmp_path)
    assert len(out["errors"]) == 3 and out["errors"][0] == out["errors"][1], out
    assert "GM" in out["errors"][2] and out["untouched"], out
    assert out["stats"]["wrappers"] >= 2


def test_a_deferred_generator_called_from_python_gets_its_wrappers(tmp_path):
    # A generator of a deep_gemm module (a kernel's sub-core generators are the real ones): its wrappers, the
    # generator's and its next()'s, are built on the first Python call, like a plain function's
    out = run_child("""
        import json
        from numba import njit
        from deep_gemm.jit import lazy_codegen
        from deep_gemm.jit.numba_setup import apply_numba_settings
        apply_numba_settings()

        def evens(n):
            for i in range(n):
                yield 2 * i

        evens.__module__ = "deep_gemm.jit._test_generator"
        evens = njit(nogil=True)(evens)
        first = list(evens(4))
        (cres,) = evens.overloads.values()
        print(json.dumps({"first": first, "again": list(evens(2)), "stats": dict(lazy_codegen.stats),
                          "deferred": bool(getattr(cres.library, "_dg_deferred", False))}))
    """, tmp_path)
    assert out["first"] == [0, 2, 4, 6] and out["again"] == [0, 2], out
    assert out["deferred"] and out["stats"]["wrappers"] == 1, out


def test_a_deferred_function_loaded_from_numbas_cache_returns_arrays_to_python(tmp_path):
    # The wrappers of a function numba's disk cache loaded are built with the function's own NRT setting: a returned
    # array is boxed as the new array it is (once built with numba's base context, NRT off: a crash on first use)
    child = """
        import json
        import numpy as np
        from deep_gemm.device.crosscore import new_cross_state
        flags, lines, info, ub = new_cross_state(64)
        print(json.dumps({"shapes": [list(a.shape) for a in (flags, lines, info, ub)], "ub_zero": not ub.any(),
                          "hits": sum(new_cross_state.stats.cache_hits.values())}))
    """
    first, second = run_child(child, tmp_path), run_child(child, tmp_path)
    assert first["hits"] == 0 and second["hits"] == 1, (first, second)
    assert first["shapes"] == second["shapes"] and second["shapes"][3] == [2, 64] and second["ub_zero"]


def test_processes_with_and_without_deferred_code_share_a_cache_root(tmp_path):
    # What numba caches differs (bitcode without wrappers vs object code with them): each kind is filed under its
    # own index key, so a process with DG_JIT_LAZY_CODEGEN=0 never loads a wrapperless library (its Python call of
    # the callee would have no wrapper to run) and the two kinds coexist in one root
    # (no native libraries, and the second process of each kind a new specialization: every process compiles the
    # kernel's entry through numba, and so compiles the callee or loads it from numba's cache)
    def env(tile, lazy):
        return {"TEST_TILE": str(tile), "DG_JIT_NATIVE": "0", "DG_JIT_LAZY_CODEGEN": "1" if lazy else "0"}

    lazy, eager, again, lazy_again = (run_child(CHILD, tmp_path, extra_env=env(tile, on))
                                      for tile, on in ((16, True), (16, False), (8, False), (8, True)))
    assert lazy["ok"] and eager["ok"] and again["ok"] and lazy_again["ok"]
    assert [out["callee_cache_hits"] for out in (lazy, eager, again, lazy_again)] == [0, 0, 1, 1]
    assert eager["callee_wrappers"] == again["callee_wrappers"] == [True, True]
    assert lazy_again["callee_wrappers"] == [False, False] and lazy_again["callee_deferred"]
    assert all(out["call"] == [1.5] * 3 for out in (lazy, eager, again, lazy_again))


# Compiles deep_gemm's DataCopyPad (GM -> UB: a wrapper that checks its arguments and calls the copy loop) and load_l0b
# (its packing core has loops of its own) from Python in a fresh cache, and a user's own numba wrapper, and reports
# which module passes each library got (jit/numba_setup.py).
THIN_CHILD = """
import json
import numpy as np
from numba import njit
from deep_gemm.device import DataCopyPad, cube

def passes(dispatcher):
    (cres,) = dispatcher.overloads.values()
    return getattr(cres.library, "_dg_module_passes", None)

ub = np.zeros((4, 64), np.uint16)
DataCopyPad(ub, np.arange(1000, dtype=np.uint16), 0, 64, 4, 64, 0)
l1 = np.arange(24 * 64, dtype=np.float32).reshape(24, 64)
l0 = np.zeros(cube.l0b_size(24, 64), np.float32)
cube.load_l0b(l0, l1, np.zeros((1, 1), np.uint8), 0, 0, 24, 64, False)

@njit
def user_sum(x):
    s = 0.0
    for v in x:
        s += v
    return s

@njit
def user_wrapper(x):
    return user_sum(x) + user_sum(x[1:])

user_wrapper(np.ones(8))
print(json.dumps({"wrapper": passes(DataCopyPad), "core": passes(cube._load_b_core), "user": passes(user_wrapper),
                  "copied": bool((ub == np.arange(256).reshape(4, 64)).all()), "packed": bool(l0[:24].any())}))
"""


def test_thin_device_wrappers_skip_the_second_module_pass_and_user_code_does_not(tmp_path):
    out = run_child(THIN_CHILD, tmp_path)
    assert out["copied"] and out["packed"]
    # the wrapper's own code is a small part of its library (the copy loop is linked in): numba's cheap pipeline
    # only; the packing core, with loops of its own, keeps numba's two module passes
    assert out["wrapper"] == "cheap" and out["core"] == "numba"
    # code outside deep_gemm in the same process is optimized as numba always does
    assert out["user"] == "numba"
    off = run_child(THIN_CHILD, tmp_path / "full", extra_env={"DG_JIT_KERNEL_OPT": "full"})
    assert off["wrapper"] is None and off["core"] is None and off["copied"] and off["packed"]
