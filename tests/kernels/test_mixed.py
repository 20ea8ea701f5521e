"""Mixed Cube + Vector kernels: the ReLU example (templates/examples/mixed_relu) against numpy and against the BF16
GEMM kernel of the same config, bitwise equal on 1, 7 and 32 logical cores and 1 and 2 CPU threads; a deliberately
deadlocking example reports KernelDeadlockError naming kernel, core, sub-core, flag and line instead of hanging
(on 1 and 32 cores);
SyncAll() splits a kernel into phases ordered across cores."""

from __future__ import annotations

import re

import numba
import numpy as np
import pytest
from kernel_data import as_float, bf16_operand, output

from deep_gemm import runtime
from deep_gemm.device import capacity
from deep_gemm.device.crosscore import KernelDeadlockError
from deep_gemm.heuristics.config import GemmConfig, GemmDesc
from deep_gemm.jit import build
from deep_gemm.kernels.bf16_gemm import launch_bf16_gemm
from deep_gemm.kernels.common import gemm_constants, gm_view, out_storage_dtype
from deep_gemm.testing import calc_diff

CONFIG = dict(block_m=64, block_n=64, block_k=64, mad_m=32, mad_n=32, mad_k=32, num_l1_stages=2, num_l0_stages=2,
              num_l0c_stages=2, path="cube")
UB_BYTES = 253952
CORES = 7


def mixed_relu_kernel(m, n, k, cores, out_dtype, template="examples/mixed_relu", name="mixed_relu"):
    desc = GemmDesc(m=m, n=n, k=k, a_dtype="bf16", b_dtype="bf16", out_dtype=out_dtype, num_ai_cores=cores)
    config = GemmConfig(num_ai_cores=cores, **CONFIG)
    capacity.check_buffer_capacity(desc, config, runtime.get_arch_spec())
    constants = gemm_constants(desc, config, "nk", resident_a=False)
    constants.update(NUM_UB_STAGES=2, UB_BYTES=UB_BYTES)
    return build(name, constants, template=template), config


def run_mixed_relu(rng, m, n, k, cores, out_dtype="fp32", **kw):
    a, b = bf16_operand(rng, m, k, "k"), bf16_operand(rng, n, k, "k")
    d, _ = output(rng, m, n, out_dtype, with_c=False)
    kernel, config = mixed_relu_kernel(m, n, k, cores, out_dtype, **kw)
    flat_a, sa = gm_view(a.storage, np.uint16)
    flat_b, sb = gm_view(b.storage, np.uint16)
    flat_d, sd = gm_view(d, out_storage_dtype(out_dtype))
    kernel(flat_a, sa, flat_b, sb, flat_d, sd, m, n, k)
    return d, a, b, config


@pytest.mark.parametrize("out_dtype", ["fp32", "bf16"])
def test_mixed_relu_matches_numpy_and_the_gemm(rng, out_dtype):
    m, n, k = 100, 96, 80  # ragged M and K: partial tiles, partial MAD tiles, AIV1 halves with 0 rows
    # NOTES: N, K and 7 cores as the next test's, so its fp32 kernel is this one (compiled once per session)
    d, a, b, config = run_mixed_relu(rng, m, n, k, cores=CORES, out_dtype=out_dtype)
    ref = np.maximum(a.values @ b.values.T, 0)
    got = as_float(d)
    assert not np.isnan(got).any()
    assert calc_diff(got, ref) < 1e-5
    assert ((got == 0) == (ref <= 0)).mean() > 0.99
    # bit-exact: the AIVs' ReLU of the AIC's fp32 tiles == ReLU of the BF16 GEMM kernel's fp32 output, same config
    d_gemm = np.empty((m, n), np.float32)
    with runtime.runtime_scope(num_ai_cores=CORES):
        launch_bf16_gemm(a.storage, "k", b.storage, "k", d_gemm, m, n, k, with_accumulation=False, alpha=1.0,
                         compiled_dims="nk", config=config)
    relu = np.where(d_gemm < 0, np.float32(0), d_gemm)
    if out_dtype == "bf16":
        from deep_gemm.utils import fp32_to_bf16_bits

        np.testing.assert_array_equal(d, fp32_to_bf16_bits(relu))
    else:
        np.testing.assert_array_equal(d.view(np.uint32), relu.view(np.uint32))


def test_mixed_relu_bitwise_equal_over_cores_and_threads(rng):
    # 7 x 2 output tiles (N and K as the test above: the same kernels): all 14 on 1 core, two on each of 7 cores,
    # idle cores on 32
    m, n, k = 400, 96, 80
    state = rng.bit_generator.state
    saved = numba.get_num_threads()
    outs = {}
    try:
        for cores in (1, CORES, 32):
            for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
                numba.set_num_threads(threads)
                rng.bit_generator.state = state
                d, a, b, _ = run_mixed_relu(rng, m, n, k, cores)
                outs[cores, threads] = d.copy()
    finally:
        numba.set_num_threads(saved)
    first = next(iter(outs.values()))
    for key, d in outs.items():
        np.testing.assert_array_equal(d.view(np.uint32), first.view(np.uint32), err_msg=str(key))
    ref = np.maximum(a.values @ b.values.T, 0)
    assert calc_diff(first.astype(np.float64), ref) < 1e-5


# NOTES: 1 core (the one with the tile) and 32 (one core with it, 31 without): 7 cores showed nothing 32 does not,
# and each count is a compile of its own.
@pytest.mark.parametrize("cores", [1, 32])
def test_deadlocking_example_reports_instead_of_hanging(rng, cores):
    m, n, k = 64, 64, 64
    with pytest.raises(KernelDeadlockError) as info:
        run_mixed_relu(rng, m, n, k, cores, template="examples/mixed_deadlock", name="mixed_deadlock")
    err = info.value
    # every core deadlocks alike; the launcher reports the first error any CPU thread raised
    assert 0 <= err.core < cores and err.sub_core == "AIC" and err.event_id == 2  # FREE_FLAG + stage 0, never armed
    text = str(err)
    assert "mixed_deadlock" in text and "AIC" in text and "CrossCoreWaitFlag(2)" in text
    assert err.where and err.where.startswith("lib/mixed.asc.j2:") and err.where in text  # the template line too
    # the AIC's wait for a FREE flag: in the hand-off (a core with tiles) or in the drain after its loop (a core
    # without tiles, most of them at 32 cores); which core's thread reports first is up to the OS scheduler
    source = (err_path := _kernel_asc("mixed_deadlock")).read_text().splitlines()
    assert source[err.line - 1].strip() in ("CrossCoreWaitFlag(FREE_FLAG + ub_stage);",
                                           "CrossCoreWaitFlag(FREE_FLAG + s);"), err_path


def _kernel_asc(name):
    from deep_gemm.jit import compile as jit_compile

    return next(k.path for k in jit_compile._by_digest.values() if k.name == name) / "kernel.asc"


@pytest.mark.parametrize("threads", [1, 2])
def test_sync_all_phases_order_cores(rng, monkeypatch, threads):
    from deep_gemm.jit import launch

    monkeypatch.setattr(launch, "num_threads", lambda: threads)
    cores, width = 5, 7
    kernel = build("sync_all", {"NUM_AI_CORES": cores, "WIDTH": width}, template="examples/sync_all",
                   device_module="deep_gemm.jit.example_device")
    assert kernel.phases == ("sync_all_p0", "sync_all_p1")
    x = rng.standard_normal(cores * width).astype(np.float32)
    work = np.full_like(x, np.nan)
    out = np.full_like(x, np.nan)
    kernel(x, work, out)
    sq = (x * x).reshape(cores, width)
    np.testing.assert_array_equal(out.reshape(cores, width), np.roll(sq, 1, axis=0) + np.roll(sq, -1, axis=0))


SYNC_ALL_ERRORS = {
    "used after": ("const int32_t c = GetBlockIdx(); x[c] = 1.0f; SyncAll(); x[c] = 2.0f;",
                   "'c' was declared before SyncAll()"),
    "nested": ("if (GetBlockIdx() == 0) { SyncAll(); }", "top level of the kernel entry"),
    "return before": ("if (GetBlockIdx() == 0) { return; } SyncAll(); x[0] = 1.0f;", "waiting at the barrier"),
    "mode 0": ("if ASCEND_IS_AIV { CrossCoreSetFlag<0, PIPE_MTE3>(1); }", "use SyncAll() across cores"),
    "wait in helper": (None, "available in the kernel entry only"),
}


@pytest.mark.parametrize("case", sorted(SYNC_ALL_ERRORS))
def test_mixed_and_sync_all_translate_errors(case):
    from deep_gemm.jit.errors import TranslateError
    from deep_gemm.jit.translate import translate

    body, message = SYNC_ALL_ERRORS[case]
    helper = ""
    if body is None:
        helper = "__aicore__ inline void h() { CrossCoreWaitFlag(1); }\n"
        body = "if ASCEND_IS_AIC { h(); }"
    source = (f"constexpr int32_t NUM_AI_CORES = 2;\n{helper}"
              f'extern "C" __global__ __aicore__ void k(GlobalTensor<float> x) {{\n    {body}\n}}\n')
    with pytest.raises(TranslateError, match=re.escape(message)):
        translate(source, template="case.asc")


BOOKKEEPING_CALLS = {"cross_core_set", "cross_core_try_wait", "ub_tensor", "SetFlag", "WaitFlag", "PipeBarrier"}


def _mixed_relu_python() -> str:
    """The module the translator emits for the fp32 mixed_relu kernel of these tests (translated, not compiled)."""
    from deep_gemm.jit.render import render
    from deep_gemm.jit.translate import translate

    desc = GemmDesc(m=100, n=96, k=80, a_dtype="bf16", b_dtype="bf16", out_dtype="fp32", num_ai_cores=CORES)
    constants = gemm_constants(desc, GemmConfig(num_ai_cores=CORES, **CONFIG), "nk", resident_a=False)
    constants.update(NUM_UB_STAGES=2, UB_BYTES=UB_BYTES)
    return translate(render("examples/mixed_relu", constants), template="examples/mixed_relu",
                     constants=constants).python


def test_sub_core_generators_are_not_cached_on_disk():
    """numba cannot lower a call to a generator it loaded from its disk cache: a process that found a sub-core's cache
    entry but not its caller's (another process compiling the same kernel, or an interrupted compile) raised KeyError
    on every call until the cache was cleared. Generators compile with their caller; the callers stay cached."""
    import ast

    python = _mixed_relu_python()
    functions = [f for f in ast.parse(python).body if isinstance(f, ast.FunctionDef)]

    def cached(f):
        return any(isinstance(d, ast.Call) and any(k.arg == "cache" and getattr(k.value, "value", False)
                                                   for k in d.keywords) for d in f.decorator_list)

    generators = [f for f in functions if any(isinstance(n, ast.Yield) for n in ast.walk(f))]
    assert generators and not [f.name for f in generators if cached(f)]
    assert [f.name for f in functions if cached(f)]  # the cores and the launch entries are


def test_bookkeeping_calls_pass_constants_as_int64_values():
    """A flag id, a line number or a UB offset that is a compile-time constant reaches the sync, cross-core and UB
    functions as np.int64(...), which numba types as int64, not as a literal: one compiled overload per function
    instead of one per constant (a mixed kernel's cold compile is that much shorter)."""
    import ast

    python = _mixed_relu_python()
    calls = [node for node in ast.walk(ast.parse(python))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) in BOOKKEEPING_CALLS]
    assert {c.func.id for c in calls} >= {"cross_core_set", "cross_core_try_wait", "ub_tensor", "SetFlag"}
    bare = [ast.unparse(arg) for c in calls for arg in c.args
            if isinstance(arg, ast.Constant) and isinstance(arg.value, int)
            or isinstance(arg, ast.Name) and arg.id.isupper()]
    assert not bare, f"constants passed as numba literals: {bare}"

    @numba.njit
    def callee(x):
        return x + 1

    @numba.njit
    def caller():
        return callee(np.int64(3)) + callee(np.int64(4))

    assert caller() == 9
    assert [str(t) for sig in callee.signatures for t in sig] == ["int64"]  # one overload, not Literal[int](3), (4)


def test_sub_core_buffers_are_borrowed_views_of_local_memory_or_of_owners_kept_to_their_scope_end():
    """A sub-core generator addresses each AllocTensor buffer through a borrowed view (no reference count: numba
    counted every view of a counted buffer atomically, per MAD in an AIC's loops). Constant sizes: a view of the
    launch thread's local memory at an offset of its own (64-byte aligned, none overlapping, each at another place
    within a 4 KiB page; the launch loop's rows hold them all). A size known only at run time: a view of an owner
    that is named once more as the last statement of the buffer's C++ scope (top level, an AIC block, a loop body), so
    it outlives every use of the view."""
    import ast

    from deep_gemm.jit.translate import translate

    source = ("constexpr int32_t NUM_AI_CORES = 2;\n"
              "constexpr int32_t ROWS = 3;\n"
              'extern "C" __global__ __aicore__ void k(GlobalTensor<float> x, int32_t n) {\n'
              "    LocalTensor<float> top = AllocTensor<float>(n);\n"
              "    LocalTensor<uint8_t> flags = AllocTensor<uint8_t>(5);\n"
              "    if ASCEND_IS_AIC {\n"
              "        LocalTensor<float> aic = AllocTensor<float>(ROWS, n + 1);\n"
              "        LocalTensor<float> fixed = AllocTensor<float>(ROWS, l0a_size(20, 40));\n"
              "        LocalTensor<float> fixed2 = AllocTensor<float>(ROWS, l0a_size(20, 40));\n"
              "        for (int32_t i = 0; i < 3; ++i) {\n"
              "            LocalTensor<float> tmp = AllocTensor<float>(n);\n"
              "            tmp[0] = aic[i][0] + fixed[i][0] + fixed2[i][1];\n"
              "            top[0] = tmp[0] + flags[0];\n"
              "        }\n"
              "        x[0] = top[0];\n"
              "    }\n"
              "    if ASCEND_IS_AIV {\n"
              "        x[1] = top[1];\n"
              "    }\n"
              "}\n")
    python = translate(source, template="case.asc").python
    tree = ast.parse(python)
    generator = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and "_subcore" in f.name)
    owned, local = {}, {}
    for node in ast.walk(generator):
        for field in ("body", "orelse"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list):
                continue
            code = [ast.unparse(s) for s in stmts]
            for i, (stmt, line) in enumerate(zip(stmts, code, strict=True)):
                if not isinstance(stmt, ast.Assign):
                    continue
                name, value = line.split(" = ", 1)
                if value.startswith("local_tensor(_dg_local, _dg_sub, "):
                    call = stmt.value
                    shape = tuple(ast.literal_eval(ast.unparse(e.args[0])) for e in call.args[3].elts)
                    local[name] = (ast.literal_eval(ast.unparse(call.args[2].args[0])), shape, call.args[4].attr)
                if value.startswith("borrow(_dg_own_"):
                    owner = f"_dg_own_{name}"
                    assert code[i - 1].startswith(f"{owner} = np.empty(")
                    keep = f"keep_alive({owner})"
                    assert keep in code[i:], (name, code)
                    # nothing but the scope's other keep_alive calls (and the generator's final yield) after it
                    rest = code[code.index(keep) + 1:]
                    assert all(r.startswith("keep_alive(") or r == "yield 0" for r in rest), (name, rest)
                    owned[name] = True
    assert set(owned) == {"top", "aic", "tmp"}
    assert {name: (shape, dtype) for name, (_, shape, dtype) in local.items()} == {
        "flags": ((5,), "uint8"), "fixed": ((3, 32 * 64), "float32"),  # l0a_size(20, 40) = 32 * 64
        "fixed2": ((3, 32 * 64), "float32")}
    size = 3 * 32 * 64 * 4  # a multiple of 4 KiB: end to end, fixed2 would alias fixed
    offsets = [local[name][0] for name in ("flags", "fixed", "fixed2")]
    assert all(o % 64 == 0 for o in offsets) and offsets[1] >= offsets[0] + 5 and offsets[2] >= offsets[1] + size
    assert len({o % 4096 for o in offsets}) == 3  # each buffer at its own place within a page (no 4K aliasing)
    end = -(-(offsets[2] + size) // 64) * 64
    assert python.count(f"_dg_local = np.empty((3, {end}), np.uint8)") == 2  # the threads and prange launchers


def test_the_checker_state_exists_only_in_check_mode():
    """Without DG_SYNC_CHECK no core makes the checker's state (six zeroed arrays per logical core of every launch
    were the scheduler's fixed cost) and no sub-core generator takes it; with it, each sub-core gets its own."""
    import ast

    from deep_gemm.jit.render import render
    from deep_gemm.jit.translate import translate

    desc = GemmDesc(m=100, n=96, k=80, a_dtype="bf16", b_dtype="bf16", out_dtype="fp32", num_ai_cores=CORES)
    constants = gemm_constants(desc, GemmConfig(num_ai_cores=CORES, **CONFIG), "nk", resident_a=False)
    constants.update(NUM_UB_STAGES=2, UB_BYTES=UB_BYTES)
    for check in (False, True):
        python = translate(render("examples/mixed_relu", constants), template="examples/mixed_relu",
                           constants=constants, sync_check=check).python
        functions = {f.name: f for f in ast.parse(python).body if isinstance(f, ast.FunctionDef)}
        generator = next(f for name, f in functions.items() if "_subcore" in name)
        assert ("_dg_pe" in [a.arg for a in generator.args.args]) == check
        assert python.count("new_check_state()") == (3 if check else 0)


def test_a_phase_without_waits_runs_its_sub_cores_as_functions():
    """A phase whose body never waits on a cross-core flag compiles its sub-core body as a plain (cached) function,
    called for the AIC, AIV0 and AIV1 in turn; a phase that waits keeps its generator and the round-robin. (The HC
    pre-norm GEMM's split sum is such a phase: its tests run it.)"""
    import ast

    from deep_gemm.jit.translate import translate

    source = ("constexpr int32_t NUM_AI_CORES = 2;\n"
              'extern "C" __global__ __aicore__ void k(__gm__ float* x) {\n'
              "    if ASCEND_IS_AIV {\n"
              "        CrossCoreSetFlag<2, PIPE_MTE3>(1);\n"
              "    }\n"
              "    if ASCEND_IS_AIC {\n"
              "        CrossCoreWaitFlag(1);\n"
              "        x[GetBlockIdx() * 3] = 1.0f;\n"
              "    }\n"
              "    SyncAll();\n"
              "    if ASCEND_IS_AIV {\n"
              "        x[GetBlockIdx() * 3 + GetSubBlockIdx() + 1] = x[GetBlockIdx() * 3] + 1.0f + GetSubBlockIdx();\n"
              "    }\n"
              "}\n")
    python = translate(source, template="case.asc").python
    functions = {f.name: f for f in ast.parse(python).body if isinstance(f, ast.FunctionDef)}
    is_generator = {name: any(isinstance(n, ast.Yield) for n in ast.walk(f)) for name, f in functions.items()}
    assert is_generator["_k_subcore_p0"] and not is_generator["_k_subcore_p1"]
    decorator = ast.unparse(functions["_k_subcore_p1"].decorator_list[0])
    assert decorator == "njit(cache=True)"
    core = ast.unparse(functions["_k_core_p1"])
    assert "next(" not in core and [f"np.int64({s})" in core for s in range(3)] == [True] * 3


POOL_PROBE = """constexpr int32_t NUM_AI_CORES = 4;
extern "C" __global__ __aicore__ void pool_probe(GlobalTensor<float> x, int32_t write) {
    if ASCEND_IS_AIV {
        auto t = UBTensor<float>(GetSubBlockIdx(), 64, 1, 8);
        DataCopyPad(x, t, (GetBlockIdx() * 2 + GetSubBlockIdx()) * 8, 8, 1, 8, 0.0f);
        if (write != 0) {
            Duplicate(t, 5.0f, 8);
        }
    }
}
"""


@pytest.mark.parametrize("threads", [1, 2])
def test_cross_core_state_is_kept_across_launches_and_each_core_starts_clean(tmp_path, monkeypatch, threads):
    """A launch thread's cross-core state (flags, UBs) lives in the calling thread's pool (compiled_kernel.cross_pool)
    and outlives the launch, yet every logical core starts from a clean one: a UB value one core leaves is zero for
    the next core of the part and for the next launch."""
    from deep_gemm.device.crosscore import cross_pool_row_bytes
    from deep_gemm.jit.compiled_kernel import cross_pool
    from deep_gemm.jit.translate.mixed import DEFAULT_UB_BYTES

    monkeypatch.setattr(numba, "get_num_threads", lambda: threads)
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", threads)
    (tmp_path / "pool_probe.asc.j2").write_text(POOL_PROBE)
    kernel = build("pool_probe", {"NUM_AI_CORES": 4}, template_dir=tmp_path)
    assert kernel.meta["ub_bytes"] == DEFAULT_UB_BYTES
    pool = cross_pool(DEFAULT_UB_BYTES)
    assert pool.shape[0] >= threads and pool.shape[1] == cross_pool_row_bytes(DEFAULT_UB_BYTES)
    for write in (1, 1, 0):
        x = np.full(64, np.nan, np.float32)
        kernel(x, write)
        np.testing.assert_array_equal(x, np.zeros(64, np.float32))  # never a value another core or launch wrote
    assert cross_pool(DEFAULT_UB_BYTES) is pool
    kernel(np.zeros(64, np.float32), 1)
    # the pool is the memory the launches used: the last core of each launch thread left its UB values in its row
    assert (pool.view(np.float32) == 5).sum() >= 16


def test_a_pool_without_the_launch_threads_row_is_refused():
    """cross_state_from_pool raises, naming the slot and the pool, for a slot past its rows or rows of another UB
    size (cross_pool sizes the pool by the launch's thread count, so a launch never meets this)."""
    from deep_gemm.device.crosscore import cross_state_from_pool, new_cross_pool

    pool = new_cross_pool(2, 1024)
    flags, lines, info, ub = cross_state_from_pool(pool, 1, 1024)
    assert ub.shape == (2, 1024) and not flags.any() and not lines.any()
    for bad_pool, slot, ub_bytes in ((pool, 2, 1024), (pool, -1, 1024), (pool, 0, 2048)):
        with pytest.raises(ValueError, match="no row for this launch thread"):
            cross_state_from_pool(bad_pool, slot, ub_bytes)
