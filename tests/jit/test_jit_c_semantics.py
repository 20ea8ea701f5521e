"""jit/translate/: the translated code computes what C computes for the integer subset, one test per rule
(narrowing, unsigned wrap-around, the usual arithmetic conversions, integer promotion, shifts, literals, loops),
against hand-derived C values (always) and against the same snippet compiled by gcc (when gcc is installed); the
constructs the subset refuses raise a TranslateError with a caret. A few cases also run under numba, whose integer
typing (uint op uint -> uint64) differs from Python's."""

from __future__ import annotations

import shutil
import subprocess
import textwrap

import numpy as np
import pytest
from jit_helpers import EXAMPLE_DEVICE, snippet

from deep_gemm.jit.errors import TranslateError
from deep_gemm.jit.translate import translate

# rule -> (C functions, [(function, args, the C value)]); every function returns int64_t or bool
CASES: dict[str, tuple[str, list[tuple[str, tuple, int]]]] = {
    "narrowing_on_initialisation": ("""
        constexpr uint8_t NARROW = 300;
        constexpr int8_t NEG = 200;
        __aicore__ inline int64_t consts() { return NARROW + NEG; }
        __aicore__ inline int64_t init_u8(uint32_t a) { uint8_t x = a + 250; return x; }
        __aicore__ inline int64_t init_i8(int32_t a) { int8_t x = a; return x; }
        __aicore__ inline int64_t init_u16_const(int32_t a) { const uint16_t x = a * 1000; return x; }
        """, [("consts", (), 44 - 56), ("init_u8", (10,), 4), ("init_u8", (5,), 255), ("init_u8", (0,), 250),
              ("init_i8", (200,), -56), ("init_i8", (-129,), 127), ("init_i8", (-128,), -128),
              ("init_u16_const", (70,), 70000 - 65536), ("init_u16_const", (-1,), 65536 - 1000)]),
    "narrowing_on_assignment": ("""
        __aicore__ inline int64_t assign_i8(int32_t a) { int8_t x = 0; x = a; return x; }
        __aicore__ inline int64_t add_u16(int32_t a) { uint16_t y = 65535; y += a; return y; }
        __aicore__ inline int64_t inc_u8(uint8_t a) { uint8_t y = a; ++y; y++; return y; }
        __aicore__ inline int64_t chain(int32_t a) { int32_t w = 0; uint8_t n = 0; w = n = a; return w; }
        __aicore__ inline int64_t ret_u8(int32_t a) { return static_cast<int64_t>(id_u8(a)); }
        __aicore__ inline uint8_t id_u8(uint8_t x) { return x; }
        """, [("assign_i8", (200,), -56), ("add_u16", (2,), 1), ("add_u16", (-65535,), 0),
              ("inc_u8", (254,), 0), ("inc_u8", (3,), 5), ("chain", (300,), 44), ("chain", (-1,), 255),
              ("ret_u8", (300,), 44), ("ret_u8", (-2,), 254)]),
    # NOTES: an element store narrows by numba's truncating store (C's modular conversion); numpy in plain Python
    # refuses out-of-range values, so this rule runs under numba.
    "array_stores_narrow": ("""
        __aicore__ inline int64_t store_u8(int32_t a) { uint8_t buf[2] = {0, 0}; buf[0] = a; buf[1] = a + 1;
                                                        return buf[0] + buf[1]; }
        __aicore__ inline int64_t store_i16(uint32_t a, uint32_t b) { int16_t buf[1] = {0}; buf[0] = a - b;
                                                                      buf[0] += 1; return buf[0]; }
        """, [("store_u8", (255,), 255 + 0), ("store_u8", (257,), 1 + 2), ("store_i16", (1, 2), 0),
              ("store_i16", (40000, 0), 40000 - 65536 + 1)]),
    "unsigned_wrap_around": ("""
        __aicore__ inline int64_t sub_u32(uint32_t a, uint32_t b) { const uint32_t d = a - b; return d; }
        __aicore__ inline int64_t sub_div(uint32_t a, uint32_t b) { return (a - b) / 2; }
        __aicore__ inline int64_t mul_u32(uint32_t a, uint32_t b) { return a * b; }
        __aicore__ inline int64_t neg_u32(uint32_t a) { return -a; }
        __aicore__ inline int64_t not_u32(uint32_t a) { return ~a; }
        __aicore__ inline int64_t sub_mod(uint32_t a, uint32_t b) { return (a - b) % 10; }
        __aicore__ inline int64_t sub_min(uint32_t a, uint32_t b, uint32_t c) { return std::min(a - b, c); }
        __aicore__ inline int64_t sub_u64(uint64_t a, uint64_t b) { return a - b; }
        __aicore__ inline int64_t count_wrap(uint8_t start) {
            int64_t n = 0;
            for (uint8_t i = start; i != 4; ++i) { n += 1; }
            return n;
        }
        """, [("sub_u32", (1, 2), 2**32 - 1), ("sub_u32", (7, 2), 5), ("sub_div", (1, 2), (2**32 - 1) // 2),
              ("mul_u32", (65536, 65536), 0), ("mul_u32", (65537, 65537), (65537 * 65537) % 2**32),
              ("neg_u32", (1,), 2**32 - 1), ("neg_u32", (0,), 0), ("not_u32", (0,), 2**32 - 1),
              ("sub_mod", (0, 1), (2**32 - 1) % 10), ("sub_min", (1, 2, 9), 9), ("sub_min", (5, 2, 9), 3),
              ("sub_u64", (1, 2), -1), ("count_wrap", (250,), 10), ("count_wrap", (0,), 4)]),
    "usual_conversions_in_comparisons": ("""
        __aicore__ inline bool minus_one_lt(uint32_t u) { return -1 < u; }
        __aicore__ inline bool int_lt_uint(int32_t a, uint32_t u) { return a < u; }
        __aicore__ inline bool long_lt_uint(int64_t a, uint32_t u) { return a < u; }
        __aicore__ inline bool sub_gt(uint32_t a, uint32_t b) { return a - b > 5; }
        __aicore__ inline bool u8_sub_lt(uint8_t a, uint8_t b) { return a - b < 0; }
        __aicore__ inline int64_t branch(int32_t a, uint32_t u) { if (a < u) { return 1; } return 2; }
        __aicore__ inline int64_t loop_int_vs_uint(int32_t start, uint32_t u) {
            int64_t n = 0;
            for (int32_t i = start; i < u; ++i) { n += 1; }
            return n;
        }
        """, [("minus_one_lt", (0,), False), ("minus_one_lt", (2**32 - 1,), False),
              ("int_lt_uint", (-1, 0), False), ("int_lt_uint", (3, 4), True),
              ("long_lt_uint", (-1, 0), True), ("sub_gt", (1, 2), True), ("sub_gt", (9, 2), True),
              ("sub_gt", (3, 2), False), ("u8_sub_lt", (1, 2), True), ("branch", (-1, 5), 2), ("branch", (1, 5), 1),
              ("loop_int_vs_uint", (-1, 5), 0), ("loop_int_vs_uint", (2, 5), 3)]),
    "usual_conversions_in_arithmetic": ("""
        __aicore__ inline int64_t int_plus_uint(int32_t a, uint32_t u) { return a + u; }
        __aicore__ inline int64_t int_div_uint(int32_t a, uint32_t b) { return a / b; }
        __aicore__ inline int64_t int_mod_uint(int32_t a, uint32_t b) { return a % b; }
        __aicore__ inline int64_t long_plus_uint(int64_t a, uint32_t u) { return a + u; }
        __aicore__ inline int64_t pick(bool c, int32_t a, uint32_t u) { return c ? a : u; }
        __aicore__ inline float to_float(uint32_t a, uint32_t b) { return a - b; }
        """, [("int_plus_uint", (-2, 1), 2**32 - 1), ("int_plus_uint", (2, 1), 3),
              ("int_div_uint", (-6, 3), (2**32 - 6) // 3), ("int_div_uint", (-7, 2), (2**32 - 7) // 2),
              ("int_mod_uint", (-1, 10), (2**32 - 1) % 10), ("long_plus_uint", (-2, 1), -1),
              ("pick", (True, -1, 7), 2**32 - 1), ("pick", (False, -1, 7), 7),
              ("to_float", (1, 2), float(np.float32(2**32 - 1)))]),
    "integer_promotion": ("""
        __aicore__ inline int64_t u8_minus(uint8_t a, uint8_t b) { return a - b; }
        __aicore__ inline int64_t u16_times(uint16_t a, uint16_t b) { return a * b; }
        __aicore__ inline int64_t bools(bool a, bool b) { return a + b; }
        __aicore__ inline int64_t u8_shift(uint8_t a) { return a << 4; }
        __aicore__ inline int64_t u8_not(uint8_t a) { return ~a; }
        __aicore__ inline int64_t u8_neg(uint8_t a) { return -a; }
        __aicore__ inline int64_t u8_loads(int32_t a) { uint8_t v[2] = {0, 0}; v[0] = a; v[1] = 200;
                                                         return v[0] - v[1]; }
        """, [("u8_minus", (1, 2), -1), ("u16_times", (300, 200), 60000), ("bools", (True, True), 2),
              ("u8_shift", (200,), 3200), ("u8_not", (0,), -1), ("u8_neg", (5,), -5), ("u8_loads", (10,), -190)]),
    "shifts": ("""
        __aicore__ inline int64_t top_bit() { return 1u << 31; }
        __aicore__ inline int64_t u32_shl(uint32_t a) { return a << 4; }
        __aicore__ inline int64_t i32_shr(int32_t a) { return a >> 2; }
        __aicore__ inline int64_t wrapped_shr(uint32_t a, uint32_t b) { return (a - b) >> 28; }
        __aicore__ inline int64_t u32_shl_shr(uint32_t a) { return (a << 8) >> 8; }
        __aicore__ inline int64_t shift_type_is_left(uint8_t a, uint32_t s) { return a >> s; }
        """, [("top_bit", (), 2**31), ("u32_shl", (0x10000000,), 0), ("u32_shl", (3,), 48),
              ("i32_shr", (-16,), -4), ("i32_shr", (-1,), -1), ("wrapped_shr", (1, 2), 15),
              ("u32_shl_shr", (0xFF000001,), 1), ("shift_type_is_left", (255, 4), 15)]),
    "literal_types": ("""
        __aicore__ inline bool hex_is_unsigned() { return -1 < 0x80000000; }
        __aicore__ inline bool decimal_is_long() { return -1 < 2147483648; }
        __aicore__ inline bool u_suffix() { return -1 < 1u; }
        __aicore__ inline int64_t casts(int32_t a) { return (int8_t)a + static_cast<uint16_t>(a - 1); }
        """, [("hex_is_unsigned", (), False), ("decimal_is_long", (), True), ("u_suffix", (), False),
              ("casts", (200,), -56 + 199), ("casts", (0,), 0 + 65535)]),
}


NUMBA_RULES = {"array_stores_narrow"}


def _run_numba(body: str):
    source = textwrap.dedent(body) + '\nextern "C" __global__ __aicore__ void k() {}\n'
    t = translate(source, template="c.asc.j2", constants={"NUM_AI_CORES": 2}, device_module=EXAMPLE_DEVICE)
    ns: dict = {}
    exec(compile(t.python.replace("cache=True", "cache=False"), "<numba snippet>", "exec"), ns)
    return ns, t


def _run(rule: str):
    body, calls = CASES[rule]
    ns, _ = _run_numba(body) if rule in NUMBA_RULES else snippet(body)
    return [ns[name](*args) for name, args, _ in calls]


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_against_hand_derived_c_values(rule):
    _, calls = CASES[rule]
    for (name, args, expected), value in zip(calls, _run(rule), strict=True):
        if isinstance(expected, bool):
            assert bool(value) is expected, (name, args, value)
        else:
            assert value == expected, (name, args, value, expected)


def _c_program(rule: str) -> str:
    body, calls = CASES[rule]
    lines = [f'    printf("%.17g\\n", (double){name}({", ".join(_c_arg(a) for a in args)}));'
             for name, args, _ in calls]
    names = {name for name, _, _ in calls}
    protos = [line.split("{")[0].replace("__aicore__ inline", "").strip() + ";"
              for line in textwrap.dedent(body).splitlines() if "__aicore__" in line]
    return "\n".join(["#include <cstdint>", "#include <cstdio>", "#include <algorithm>", "#define __aicore__",
                      *protos, textwrap.dedent(body), "int main() {", *lines, "    return 0;", "}"]) \
        if names else ""


def _c_arg(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value}LL" if value < 2**63 else f"{value}ULL"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed: the hand-derived C values still run")
@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_against_gcc(rule, tmp_path):
    body, calls = CASES[rule]
    source = tmp_path / f"{rule}.cpp"
    source.write_text(_c_program(rule))
    exe = tmp_path / rule
    subprocess.run(["gcc", "-x", "c++", "-std=c++17", "-O0", "-w", str(source), "-o", str(exe), "-lstdc++"],
                   check=True, capture_output=True, text=True)
    printed = [float(x) for x in subprocess.run([str(exe)], check=True, capture_output=True,
                                               text=True).stdout.split()]
    for (name, args, expected), c_value, value in zip(calls, printed, _run(rule), strict=True):
        assert float(value) == c_value == float(expected), (name, args, value, c_value, expected)


def test_no_mask_where_the_types_say_it_cannot_differ():
    _, t = snippet("""
        constexpr uint32_t TILE = 16;
        __aicore__ inline uint32_t blocks(uint32_t m) { return m / TILE + (m % TILE != 0); }
        __aicore__ inline uint32_t inner(uint32_t m) {
            uint32_t total = 0;
            for (uint32_t i = 0; i < 8; ++i) { const uint32_t row = i * TILE; total = row + m / 2; }
            return total;
        }
        __aicore__ inline int32_t signed_sum(int32_t a, int32_t b) { return a + b; }  // overflow: undefined in C
    """)
    py = t.python
    assert "return (m // TILE) + ((m % TILE) != 0)" in py and "row = i * TILE" in py
    assert "total = row + (m // 2)" in py and "return a + b" in py and "0xffffffff" not in py


def test_masks_only_where_unsigned_wraps():
    _, t = snippet("""
        __aicore__ inline uint32_t f(uint32_t a, uint32_t b) { const uint32_t d = a - b + 1; return d / 2; }
    """)
    assert "d = ((a - b) + 1) & 0xffffffff" in t.python  # one mask, where the value is needed
    assert t.python.count("0xffffffff") == 1


def translate_error(body: str) -> TranslateError:
    source = textwrap.dedent(body) + '\nextern "C" __global__ __aicore__ void k() {}\n'
    with pytest.raises(TranslateError) as info:
        translate(source, template="c.asc.j2", constants={"NUM_AI_CORES": 2}, device_module=EXAMPLE_DEVICE)
    text = str(info.value)
    assert "c.asc.j2:" in text and "^" in text.splitlines()[-1], text
    return info.value


@pytest.mark.parametrize("body, message", [
    ("__aicore__ inline bool f(uint64_t a, uint64_t b) { return a - b < 5; }", "uint64_t value that may have wrapped"),
    ("__aicore__ inline int32_t f() { return 1 << 40; }", "shift count 40 is out of range"),
    ("__aicore__ inline int32_t f(uint32_t n) { int32_t c = 0; for (uint32_t i = n; i >= 0; --i) { c += 1; } "
     "return c; }", "never ends in C"),
])
def test_refused_constructs_raise_with_a_caret(body, message):
    assert message in str(translate_error(body))


def test_numba_typing_matches_c():
    """The generated code under numba (not only as Python): unsigned loads and masks keep int64 arithmetic."""
    import numba

    calls = [c for rule in ("integer_promotion", "unsigned_wrap_around") for c in CASES[rule][1]
             if c[0] in ("u8_loads", "u8_minus", "sub_u32", "sub_div", "count_wrap", "mul_u32")]
    ns, _ = _run_numba(CASES["integer_promotion"][0] + CASES["unsigned_wrap_around"][0])
    for name, args, expected in calls:
        assert isinstance(ns[name], numba.core.registry.CPUDispatcher)
        assert ns[name](*args) == expected, (name, args)
