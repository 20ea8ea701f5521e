"""jit/translate/: each construct of the subset translates to the expected Python and behaves like C (run here as
plain Python, no numba); anything outside the subset is a TranslateError with template, line:col and a caret."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from jit_helpers import EXAMPLE_DEVICE, snippet

from deep_gemm.jit import enums
from deep_gemm.jit.errors import TranslateError
from deep_gemm.jit.translate import translate

ENTRY = 'extern "C" __global__ __aicore__ void k() {}'


def c_trunc_div(a: int, b: int) -> int:
    return int(a / b) if abs(a) < 2**52 else -(-a // b)


def c_mod(a: int, b: int) -> int:
    return int(math.fmod(a, b))


# Arithmetic -----------------------------------------------------------------------------------------------------


def test_integer_division_and_modulo_truncate_like_c():
    ns, t = snippet("""
        __aicore__ inline int32_t q(int32_t a, int32_t b) { return a / b; }
        __aicore__ inline int32_t r(int32_t a, int32_t b) { return a % b; }
        __aicore__ inline int32_t qa(int32_t a, int32_t b) { int32_t x = a; x /= b; return x; }
        __aicore__ inline int32_t ra(int32_t a, int32_t b) { int32_t x = a; x %= b; return x; }
    """)
    assert "c_div(a, b)" in t.python and "c_mod(a, b)" in t.python
    for a, b in itertools.product(range(-9, 10), (-4, -3, -1, 1, 2, 3, 7)):
        assert ns["q"](a, b) == c_trunc_div(a, b), (a, b)
        assert ns["r"](a, b) == c_mod(a, b), (a, b)
        assert ns["qa"](a, b) == c_trunc_div(a, b) and ns["ra"](a, b) == c_mod(a, b)
    assert ns["q"](-7, 2) == -3 and ns["r"](-7, 2) == -1  # Python's // and % would give -4 and 1


def test_provably_non_negative_division_uses_floor_ops():
    _, t = snippet("""
        constexpr int32_t TILE = 16;
        __aicore__ inline uint32_t f(uint32_t a) { return a / TILE + a % 8; }
    """)
    assert "(a // TILE) + (a % 8)" in t.python


def test_float32_arithmetic_keeps_c_conversions():
    ns, t = snippet("""
        __aicore__ inline float f(float x, int32_t i) { return x * i + 0.5f; }
        __aicore__ inline double g(float x) { return x * 0.1; }
        __aicore__ inline float h(int32_t a, int32_t b) { return a / b; }
    """)
    assert "x * np.float32(i)" in t.python
    r = ns["f"](np.float32(1.5), 3)
    assert isinstance(r, np.float32) and r == np.float32(5.0)
    assert ns["g"](np.float32(2)) == pytest.approx(0.2)
    assert ns["h"](7, 2) == np.float32(3.0)  # integer division first, as in C


def test_casts_literals_and_operators():
    ns, t = snippet("""
        __aicore__ inline int32_t cast_neg() { return (int32_t)(-2.7f) + static_cast<int32_t>(2.9f); }
        __aicore__ inline int64_t lits() { return 0x7F + 010 + 0b11 + 10u + 5LL + sizeof(float) + sizeof(half); }
        __aicore__ inline int32_t bits(int32_t a, int32_t b) {
            return ((a & b) | (a ^ b)) + (~a) + (a << 2) + (b >> 1);
        }
        __aicore__ inline bool logic(int32_t a, int32_t b) { return !(a < b) || (a == 3 && b != 4); }
        __aicore__ inline int32_t tern(int32_t a) { return a > 0 ? a : -a; }
        __aicore__ inline float tern_f(bool c) { return c ? 1.0f : 2; }
        __aicore__ inline int32_t mm(int32_t a, int32_t b) { return std::min(a, b) * 100 + max(a, b) + abs(a - b); }
        __aicore__ inline float fl() { return 1e-3f + 2.f + .5f; }
        __aicore__ inline bool tf() { return true && !false; }
    """)
    assert ns["cast_neg"]() == -2 + 2
    assert ns["lits"]() == 0x7F + 8 + 3 + 10 + 5 + 4 + 2
    for a, b in itertools.product((-5, 0, 3, 12), (-2, 1, 4)):
        assert ns["bits"](a, b) == ((a & b) | (a ^ b)) + (~a) + (a << 2) + (b >> 1)
        assert ns["logic"](a, b) == ((not (a < b)) or (a == 3 and b != 4))
        assert ns["mm"](a, b) == min(a, b) * 100 + max(a, b) + abs(a - b)
    assert ns["tern"](-4) == 4 and ns["tern"](5) == 5
    assert ns["tern_f"](False) == np.float32(2.0) and isinstance(ns["tern_f"](False), np.float32)
    assert ns["fl"]() == np.float32(np.float32(1e-3) + np.float32(2.0) + np.float32(0.5))
    assert ns["tf"]() is True
    assert "np.float32(-2.7)" in t.python or "np.float32(2.7)" in t.python


def test_enum_constants_and_template_argument_calls():
    _, t = snippet("""
        __aicore__ inline int32_t ev() { return HardEvent::MTE2_MTE1 + Major::MN + PIPE_ALL; }
    """, entry="""extern "C" __global__ __aicore__ void k() {
        SetFlag<HardEvent::MTE2_MTE1>(1);
        AscendC::WaitFlag<HardEvent::MTE2_MTE1>(1);
        PipeBarrier<PIPE_MTE2>();
    }""")
    py = t.python
    assert f"HardEvent_MTE2_MTE1 = {enums.SCOPED['HardEvent']['MTE2_MTE1']}  # HardEvent::MTE2_MTE1" in py
    # constant arguments go to device functions as int64 values, not numba literals (one overload for every id)
    assert "SetFlag(np.int64(HardEvent_MTE2_MTE1), np.int64(1))" in py
    assert "WaitFlag(np.int64(HardEvent_MTE2_MTE1), np.int64(1))" in py
    assert "PipeBarrier(np.int64(PIPE_MTE2))" in py
    assert f"from {EXAMPLE_DEVICE} import PipeBarrier, SetFlag, WaitFlag" in py


def test_constant_arguments_of_device_calls_are_not_numba_literals():
    """A number or a named constant passed to a device function goes as np.int64 (numba would type it as a literal
    and compile the function once per value and config); an expression (numba types it int64) and a runtime value
    go as they are, and the call still computes the same."""
    ns, t = snippet("""
        constexpr int32_t TILE = 4;
        __aicore__ inline int32_t run(LocalTensor<float> dst, LocalTensor<float> a, int32_t start) {
            fill(dst, 0.0f);
            return add_span(dst, a, a, 2, TILE) + add_span(dst, a, a, start, TILE - 2);
        }
    """)
    py = t.python
    assert "add_span(dst, a, a, np.int64(2), np.int64(TILE))" in py
    assert "add_span(dst, a, a, start, TILE - 2)" in py
    dst, a = np.full(8, 9.0, np.float32), np.arange(8, dtype=np.float32)
    assert ns["run"](dst, a, 6) == 6
    np.testing.assert_array_equal(dst, [0, 0, 4, 6, 8, 10, 12, 14])


# Statements -----------------------------------------------------------------------------------------------------


def test_counted_for_becomes_range_and_general_for_a_while_with_update_before_continue():
    ns, t = snippet("""
        __aicore__ inline int32_t counted(int32_t n) {
            int32_t s = 0;
            for (int32_t i = 0; i < n; ++i) { s += i; }
            for (int32_t i = n; i >= 1; i -= 2) { s += 100 * i; }
            for (int32_t i = 1; i <= n; i += 3) { s += 10000 * i; }
            return s;
        }
        __aicore__ inline int32_t general(int32_t n) {
            int32_t s = 0;
            for (int32_t i = 0, j = n; i < j; i++, j--) {
                if (i % 2 == 0) continue;
                s += i * j;
            }
            for (int32_t i = 1; i < n; i *= 2) { s += i; }
            return s;
        }
    """)
    assert "for i in range(n):" in t.python and "for i in range(n, 1 - 1, -2):" in t.python
    assert "for i in range(1, n + 1, 3):" in t.python
    assert "while i < j:" in t.python and "while i < n:" in t.python

    def counted(n):
        s = sum(range(n)) + sum(100 * i for i in range(n, 0, -2)) + sum(10000 * i for i in range(1, n + 1, 3))
        return s

    def general(n):
        s, i, j = 0, 0, n
        while i < j:
            if i % 2:
                s += i * j
            i, j = i + 1, j - 1
        i = 1
        while i < n:
            s, i = s + i, i * 2
        return s

    for n in range(0, 12):
        assert ns["counted"](n) == counted(n) and ns["general"](n) == general(n), n


def test_loop_whose_bound_changes_in_the_body_stays_a_while():
    _, t = snippet("""
        __aicore__ inline int32_t f(int32_t n) {
            int32_t s = 0;
            for (int32_t i = 0; i < n; i++) { n -= 1; s += 1; }
            for (int32_t i = 0; i < n; i++) { i += 1; }
            return s;
        }
    """)
    assert "range(" not in t.python.split("def f")[1].split("def ")[0]


def test_while_break_continue_if_chain_and_declarations():
    ns, t = snippet("""
        __aicore__ inline int32_t f(int32_t n) {
            int32_t a = 0, b = 1, c;
            const int32_t limit = 50;
            auto steps = 0;
            while (true) {
                steps++;
                if (steps > n) { break; }
                else if (steps % 3 == 0) { continue; }
                else { c = a + b; a = b; b = c; }
                if (b > limit) break;
            }
            a = b = 7 + a;
            return a + b + steps;
        }
    """)
    assert "elif" in t.python and "while True:" in t.python and "c = 0" in t.python

    def ref(n):
        a, b, steps = 0, 1, 0
        while True:
            steps += 1
            if steps > n:
                break
            elif steps % 3 == 0:
                continue
            else:
                a, b = b, a + b
            if b > 50:
                break
        a = b = 7 + a
        return a + b + steps

    for n in range(15):
        assert ns["f"](n) == ref(n)


def test_local_arrays_tensors_and_subscripts():
    ns, t = snippet("""
        __aicore__ inline int32_t arrays(int32_t i) {
            int32_t blk[2];
            int32_t init[3] = {4, 5};
            float grid[2][3] = {{1.0f, 2.0f}, {3.0f}};
            blk[1] = init[0] + init[2];
            return blk[0] + blk[1] + (int32_t)grid[1][0] + (int32_t)grid[0][1];
        }
        __aicore__ inline float tensors(int32_t n) {
            LocalTensor<float> a = AllocTensor<float>(n);
            LocalTensor<float> m = AllocTensor<float>(2, n);
            for (int32_t i = 0; i < n; i++) { a[i] = i; m[1][i] = 2 * i; }
            a.SetValue(0, 10.0f);
            return a.GetValue(0) + a[n - 1] + m[1][n - 1] + a.GetSize();
        }
        __aicore__ inline float view(GlobalTensor<float> g, int32_t off) { return tail(g + off); }
        __aicore__ inline float tail(GlobalTensor<float> g) { return g[0]; }
    """)
    py = t.python
    assert "blk = np.zeros(2, np.int32)" in py and "init = np.array([4, 5, 0], np.int32)" in py
    assert "grid = np.array([[np.float32(1.0), np.float32(2.0), 0], [np.float32(3.0), 0, 0]], np.float32)" in py
    assert "a = np.empty(n, np.float32)" in py and "m = np.empty((2, n), np.float32)" in py
    assert "m[1, i]" in py and "a[0] = np.float32(10.0)" in py and "g[off:]" in py
    assert ns["arrays"](0) == 0 + 4 + 3 + 2
    assert ns["tensors"](4) == pytest.approx(10 + 3 + 6 + 4)
    assert ns["view"](np.arange(5, dtype=np.float32), 3) == 3.0


def test_if_constexpr_translates_only_the_taken_branch():
    _, t = snippet("""
        constexpr bool FAST = {FAST};
        __aicore__ inline int32_t f() {
            if constexpr (FAST) { return 1; } else { return undeclared_thing(); }
        }
    """.replace("{FAST}", "true"))
    assert "undeclared_thing" not in t.python and "return 1" in t.python


def test_file_scope_constants_and_static_assert():
    ns, t = snippet("""
        constexpr int32_t BLOCK = 64;
        constexpr int32_t HALF = BLOCK / 2 - 1;
        const float SCALE = 0.25f;
        constexpr bool ON = BLOCK > 8;
        static_assert(HALF * 2 < BLOCK, "fits");
        __aicore__ inline float f() { return SCALE * HALF; }
    """)
    assert "BLOCK = 64" in t.python and "HALF = 31" in t.python and "SCALE = np.float32(0.25)" in t.python
    assert "ON = True" in t.python and t.constants["HALF"] == 31
    assert ns["f"]() == np.float32(0.25 * 31)


def test_kernel_entry_runs_body_once_per_core():
    ns, t = snippet("", entry="""extern "C" __global__ __aicore__ void k(GlobalTensor<int32_t> seen, int32_t n) {
        if (GetBlockIdx() >= n) return;
        for (int32_t t = GetBlockIdx(); t < n; t += GetBlockNum()) { seen[t] += GetBlockIdx() + 1; }
    }""", constants={"NUM_AI_CORES": 3})
    py = t.python
    assert "def k(seen, n, _dg_cancel, _dg_cores):" in py and "@njit(nogil=True, cache=True)" in py
    assert "_block_idx = claim_core(_dg_cores)" in py
    assert "@njit(parallel=True, cache=True)" in py and "for _block_idx in prange(NUM_AI_CORES):" in py
    assert "for t in range(_block_idx, n, NUM_AI_CORES):" in py and "NUM_AI_CORES = 3" in py
    never = np.zeros(1, np.uint8)
    seen = np.zeros(7, np.int32)
    cores = np.zeros(2, np.int64)  # [cores claimed, entry calls finished]
    ns["k"](seen, 7, never, cores)  # one thread claims every core, then counts itself finished
    assert seen.tolist() == [1, 2, 3, 1, 2, 3, 1] and cores.tolist() == [4, 1]  # 4: the claim that found none left
    seen[:] = 0
    cores = np.array([2, 0], np.int64)  # cores 0 and 1 already claimed (by other threads): core 2 is left
    ns["k"](seen, 7, never, cores)
    assert seen.tolist() == [0, 0, 3, 0, 0, 3, 0] and cores[1] == 1
    seen[:] = 0
    ns["k"](seen, 7, never, cores)  # a thread that comes after every core was claimed runs none
    assert seen.tolist() == [0] * 7 and cores[1] == 2
    cores = np.zeros(2, np.int64)
    ns["k"](seen, 7, np.ones(1, np.uint8), cores)  # a cancelled launch: no core runs (the call still counts)
    assert seen.tolist() == [0] * 7 and cores[1] == 1
    ns["k_prange"](seen, 7, never)
    assert seen.tolist() == [1, 2, 3, 1, 2, 3, 1]
    assert t.entry == "k" and "# L" in py


def test_persistent_tile_loops_check_the_cancel_flag():
    """A loop stepping by GetBlockNum() (the persistent tile loop) leaves at its next tile once the launch's cancel
    flag is set; other loops are left alone."""
    ns, t = snippet("", entry="""extern "C" __global__ __aicore__ void k(GlobalTensor<int32_t> seen,
                                                                    GlobalTensor<uint8_t> flag, int32_t n) {
        for (int32_t t = GetBlockIdx(); t < n; t += GetBlockNum()) {
            for (int32_t i = 0; i < 2; ++i) { seen[t] += 1; }
            if (t == 2) { flag[0] = 1; }
        }
    }""", constants={"NUM_AI_CORES": 1})
    py = t.python
    # per core claimed in the threads entry, and the tile loop (not the inner loop) in the threads and prange entries
    assert py.count("or cancel_requested(_dg_cancel):") == 1 and py.count("if cancel_requested(_dg_cancel):") == 2
    seen = np.zeros(6, np.int32)
    flag = np.zeros(1, np.uint8)
    ns["k"](seen, flag, 6, flag, np.zeros(2, np.int64))  # the kernel sets its own cancel flag at tile 2
    assert seen.tolist() == [2, 2, 2, 0, 0, 0]


def test_generated_lines_carry_template_line_numbers():
    _, t = snippet("""
        __aicore__ inline int32_t f(int32_t a) {
            int32_t b = a * 2;
            return b;
        }
    """)
    lines = t.python.splitlines()
    assert any(line.strip() == "b = a * 2  # L3" for line in lines)
    assert any(line.strip() == "return b  # L4" for line in lines)


# Errors ---------------------------------------------------------------------------------------------------------


def translate_error(source: str, **kw) -> TranslateError:
    with pytest.raises(TranslateError) as info:
        translate(source, template="bad.asc.j2", constants={"NUM_AI_CORES": 2}, device_module=EXAMPLE_DEVICE, **kw)
    return info.value


def test_unknown_node_type_reports_template_line_col_and_caret():
    source = ENTRY + "\n__aicore__ inline int32_t f(int32_t a) {\n    switch (a) { default: return 1; }\n}\n"
    err = translate_error(source)
    text = str(err)
    assert "bad.asc.j2:3:5: unsupported statement: switch_statement" in text
    assert "    3 |     switch (a)" in text
    caret_line = text.splitlines()[-1]
    assert caret_line.index("^") == text.splitlines()[-2].index("switch")
    assert err.phase == "translate"


@pytest.mark.parametrize("body, message, line_col", [
    ("int32_t x = 1\n    return x;", "expected ';'", None),
    ("int32_t x = (1 +* ;", "syntax error", "3:15"),
    ("return nope(1);", "unknown function 'nope'", "3:12"),
    ("return y;", "undeclared identifier 'y'", "3:12"),
    ("int32_t a = 2; return a;", "shadows", None),
    ("int32_t lambda = 1; return lambda;", None, None),
    ("int32_t x = 0; return x++;", "++/-- inside an expression", None),
    ("const int32_t c = 1; c = 2; return c;", "cannot assign to const", None),
    ("return GetBlockIdx();", "kernel entry only", None),
    ("float f = 1.0f; return f % 2;", "floating-point", None),
    ("static_assert(1 > 2, \"never\"); return 0;", "static_assert failed", None),
    ("do { } while (0); return 0;", "do_statement", None),
    ("auto f = [](int32_t x) { return x; }; return 0;", "lambda_expression", None),
    ("int32_t* p = nullptr; return 0;", None, None),
    ("return Unknown::X;", "unknown qualified name", None),
])
def test_unsupported_constructs_are_translate_errors(body, message, line_col):
    source = f"{ENTRY}\n__aicore__ inline int32_t fn(int32_t a) {{\n    {body}\n}}\n"
    err = translate_error(source)
    text = str(err)
    if message is not None:
        assert message in text, text
    if line_col is not None:
        assert f"bad.asc.j2:{line_col}:" in text, text
    assert "^" in text.splitlines()[-1] and "bad.asc.j2:" in text


def test_entry_and_constant_rules():
    assert "no kernel entry" in str(translate_error("__aicore__ inline int32_t f() { return 0; }\n"))
    two = ENTRY + '\nextern "C" __global__ __aicore__ void k2() {}\n'
    assert "a second kernel entry" in str(translate_error(two))
    with pytest.raises(TranslateError, match="NUM_AI_CORES"):
        translate(ENTRY, template="t", constants={}, device_module=EXAMPLE_DEVICE)
    mismatch = "constexpr int32_t NUM_AI_CORES = 5;\n" + ENTRY
    assert "disagrees" in str(translate_error(mismatch))
    assert "read-only" in str(translate_error("int32_t g = 1;\n" + ENTRY))


def test_type_tracking_edges():
    ns, t = snippet("""
        __aicore__ inline uint32_t unsigned_floor(uint32_t a) { uint32_t q = a; q = q / 4; return q % 3; }
        __aicore__ inline int64_t wide(int32_t a) { return static_cast<uint64_t>(a) + 1; }
        __aicore__ inline float pick(GlobalTensor<float> a, GlobalTensor<float> b, bool first) {
            LocalTensor<float> t = first ? a : b;
            return t[0];
        }
        __aicore__ inline int32_t bool_div(bool b) { return b / 1 + b % 2; }
    """, entry="""extern "C" __global__ __aicore__ void k(GlobalTensor<float> g) {
        LocalTensor<float> v = fill_and_view(g);
        v[0][1] = 2.0f;
    }""".replace("fill_and_view(g)", "g"))
    py = t.python
    assert "q = q // 4" in py and "return q % 3" in py  # unsigned: floor ops are exact
    assert "return a + 1" in py  # int32 -> uint64 -> int64 round trip: modular in int64, nothing emitted
    assert ns["unsigned_floor"](17) == (17 // 4) % 3 and ns["wide"](5) == 6 and ns["wide"](-1) == 0
    a, b = np.array([1.0], np.float32), np.array([2.0], np.float32)
    assert ns["pick"](a, b, True) == 1.0 and ns["pick"](a, b, False) == 2.0
    assert ns["bool_div"](True) == 2
    assert "v[0, 1] = np.float32(2.0)" in py  # a tensor of unknown rank takes two indices


def test_entry_params_are_the_entry_abi():
    from deep_gemm.jit.translate import EntryParam, entry_params

    source = """
        __aicore__ inline int32_t helper(int32_t a) { return a; }
        extern "C" __global__ __aicore__ void k(GM_ADDR ws, const float* __restrict__ x, GlobalTensor<float> y,
                                               const LocalTensor<int16_t>& z, uint32_t n, float alpha) {}
    """
    expected = [EntryParam("ws", "GM_ADDR", "pointer", "uint8", ndim=1),
                EntryParam("x", "const float*", "pointer", "float32", ndim=1),  # macros blanked
                EntryParam("y", "GlobalTensor<float>", "pointer", "float32"),  # a tensor: any rank (ndim 0)
                EntryParam("z", "const LocalTensor<int16_t>&", "pointer", "int16"),
                EntryParam("n", "uint32_t", "scalar", "uint32"), EntryParam("alpha", "float", "scalar", "float32")]
    assert entry_params(source) == expected
    translation = translate(source, template="t", constants={"NUM_AI_CORES": 2}, device_module=EXAMPLE_DEVICE)
    assert list(translation.params) == expected
    with pytest.raises(TranslateError, match="no kernel entry"):
        entry_params("__aicore__ inline int32_t f() { return 0; }\n")
