"""Translate rendered Ascend-C-style C++ (a documented subset) into Python source for numba.

tree-sitter-cpp parses the macro-expanded source (macros.py); tables map each node type to one short handler;
any node outside the subset, any ERROR/MISSING node, any unknown name raises TranslateError with the template
name, line:col and a caret excerpt. Nothing is emitted silently. See SUBSET below and
tests/jit/test_jit_translate.py.
Knows nothing of GEMM: device intrinsics are whatever the device module exports.

Layout (each module one concern; Translator mixes them): ctype (C types and conversions), diagnostics (errors with
a caret), tree (parsing and node queries), statements, expressions, emitter (the generated module's text), entry
(function signatures and the kernel entry's ABI), translator (file scope and translate()).
"""

from __future__ import annotations

from .ctype import SCALAR_TYPES, SIZEOF_ONLY, TENSOR_TYPES, CType, Expr, parse_number
from .diagnostics import caret_excerpt
from .emitter import Translation, strip_parens
from .symbols import EntryParam, FuncSig
from .translator import RESERVED, Translator, device_exports, entry_params, translate
from .tree import find_error_node, parse

SUBSET = """
File scope: `constexpr`/`const` scalar constants (int*/uint*/float/double/bool, evaluated at translate time),
  functions `[__aicore__] [inline] T name(params) {...}` (-> @njit(inline="always") helpers), exactly one kernel
  entry `[extern "C"] __global__ __aicore__ void name(params) {...}` (-> `_name_core(_block_idx, params)`, inlined
  into `name(params, _dg_cancel, _dg_cores)` (nogil, cache=True: runs the cores < NUM_AI_CORES it claims from the
  launch's counter; jit/launch.py runs it on every thread) and into `name_prange(params, _dg_cancel)` (parallel=True,
  cache=True: prange over NUM_AI_CORES)), static_assert, #include and `using namespace` (ignored), comments (kept).
Parameters: scalars, GlobalTensor<T>, LocalTensor<T>, T*, GM_ADDR, references to tensors (numpy arrays).
Statements: declarations (several declarators, const/constexpr, auto, fixed arrays `T a[N]`, `T a[N][M]`, `= {..}`
  initializers, `LocalTensor<T> x = AllocTensor<T>(n)` / `(rows, cols)`), expression statements, assignments and
  compound assignments (chained `a = b = c`), ++/-- statements, if / else if / else, `if constexpr`, for (counted
  loops -> range, others -> while with the update before every continue), while, break, continue, return, nested
  blocks, static_assert.
Expressions: + - * / % (C truncating integer division), comparisons, && || !, & | ^ << >> ~, ?:, casts
  `(T)x` / static_cast<T>(x), literals (1.0f, 0x7F, 10u, true), a[i], a[i][j] (-> a[i, j]), array + int
  (-> a view a[int:]), std::min/max, min/max, abs, sizeof(type), Scope::NAME enum constants and PIPE_*
  (enums.py), GetBlockIdx()/GetBlockNum(), t.GetValue(i) / t.SetValue(i, v) / t.GetSize(), calls of template
  functions and of device exports, with template arguments passed first: F<HardEvent::X, float>(a) -> F(HardEvent_X,
  np.float32, a).
Integers follow C (ctype.py): literals take C's type (int, unsigned, long, by value, suffix and base); operands are
  promoted and brought to a common type by the usual arithmetic conversions (so `-1 < u` is false for an unsigned
  u); unsigned results wrap modulo 2**bits and initialisation, assignment, compound assignment, ++/--, arguments,
  returns and casts narrow modulo 2**bits (gcc's rule for signed targets). The generated code computes in int64
  and tracks each value's bounds: it masks (`& 0xffffffff`) only where C's value can differ from the int64 one,
  and lazily (at a comparison, /, %, >>, a conversion, an index or a call). Signed overflow is undefined in C and
  left as the int64 value. Array stores narrow by numba's truncating store. Refused with a caret: a uint64_t value
  that may wrap or reach 2**63 where its exact value matters, a constant shift count outside the type's width, an
  unsigned counted loop that can never end (`i >= 0`). A counted `for` becomes `range` only when that is exact.
"""

__all__ = [
    "translate", "Translation", "Translator", "entry_params", "EntryParam", "FuncSig", "parse", "find_error_node",
    "caret_excerpt", "device_exports", "CType", "Expr", "SCALAR_TYPES", "SIZEOF_ONLY", "TENSOR_TYPES", "RESERVED",
    "SUBSET", "parse_number", "strip_parens",
]
