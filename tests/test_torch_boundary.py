"""CPU torch tensors at the boundary of every public function (deep_gemm/_torch.py): each API family called with
tensors gives results bitwise equal to the numpy path, writes its outputs into the caller's tensor memory (the
data pointer unchanged), hands the kernels views of the caller's operands (no copy: the pointers the launchers
receive are the tensors' own), and returns torch tensors where it returns arrays; bad tensors (another device,
requires_grad, strides the numpy path refuses) are refused naming the argument, before anything is written; and
``import deep_gemm`` never imports torch.

NOTES: shapes are those of tests/api and tests/attention, so in a full run the kernels come from the session cache.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import types

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import deep_gemm  # noqa: E402
import deep_gemm.testing as dg_testing  # noqa: E402
import deep_gemm.utils as dg_utils  # noqa: E402
from deep_gemm._torch import accepts_torch, to_numpy, to_torch  # noqa: E402
from deep_gemm.epilogue import FP8Quantization  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
N, K = 64, 256  # the grouped GEMMs' shapes in tests/api/test_grouped.py

# numpy dtype -> (same-size int dtype, torch dtype): the test's own conversions, independent of deep_gemm._torch
_VIEWS = {BF16: (np.int16, torch.bfloat16), E4M3: (np.uint8, torch.float8_e4m3fn)}


def tt(a: np.ndarray) -> torch.Tensor:
    """A torch tensor owning a contiguous copy of ``a`` (what a torch user holds; never numpy's memory)."""
    a = np.ascontiguousarray(a)
    if a.dtype in _VIEWS:
        int_dtype, t_dtype = _VIEWS[a.dtype]
        return torch.from_numpy(a.view(int_dtype).copy()).view(t_dtype)
    return torch.from_numpy(a.copy())


def tt_pair(pair):
    return tuple(tt(x) for x in pair)


def nb(t: torch.Tensor) -> np.ndarray:
    """The bytes of ``t`` as numpy uint8 (last axis widened by the item size), for bitwise comparisons."""
    return t.contiguous().view(torch.uint8).numpy()


def same_bits(t: torch.Tensor, a: np.ndarray) -> bool:
    a = np.ascontiguousarray(a)
    return tuple(t.shape) == a.shape and t.element_size() == a.itemsize and np.array_equal(nb(t), a.view(np.uint8))


def ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.fixture
def spy(monkeypatch):
    """spy(module, name): record the positional arguments each call of the launcher ``module.name`` receives."""
    def install(module, name):
        calls = []
        real = getattr(module, name)

        def recording(*args, **kwargs):
            calls.append(args)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, recording)
        return calls
    return install


# ------------------------------------------------------------------------------------------------------------------
# The package: no torch import, every public function wrapped, aliases one object, picklable


def test_import_deep_gemm_does_not_import_torch():
    code = ("import sys, numpy as np, deep_gemm, deep_gemm.utils, deep_gemm.testing, deep_gemm.epilogue; "
            "deep_gemm.fp8_gemm_nt; deep_gemm.fp8_fp4_mqa_logits; "
            "deep_gemm.utils.per_token_cast_to_fp8(np.ones((4, 64), np.float32), use_ue8m0=True, gran_k=32); "
            "deep_gemm.testing.calc_diff(np.ones(3), np.ones(3)); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]


def _public_functions():
    out = []
    for name in deep_gemm.__all__:
        if deep_gemm._EXPORTS[name] not in deep_gemm._NO_ARRAYS:
            out.append((f"deep_gemm.{name}", getattr(deep_gemm, name)))
    for pkg in (dg_utils, dg_testing):
        out += [(f"{pkg.__name__}.{name}", getattr(pkg, name)) for name in pkg.__all__]
    return [(label, fn) for label, fn in out if isinstance(fn, types.FunctionType)]


def test_every_public_function_takes_torch_tensors():
    functions = _public_functions()
    assert len(functions) > 100
    missing = [label for label, fn in functions if not getattr(fn, "__deep_gemm_torch__", False)]
    assert not missing, missing
    # aliases stay one object; a wrapper pickles by name (par_compile sends partials of them to worker processes)
    assert deep_gemm.fp8_gemm_nt is deep_gemm.fp8_fp4_gemm_nt
    assert deep_gemm.cublaslt_gemm_nt is deep_gemm.aclnn_bf16_gemm_nt
    assert deep_gemm.transform_sf_into_required_layout is dg_utils.transform_sf_into_required_layout
    for label, fn in functions:
        assert pickle.loads(pickle.dumps(fn)) is fn, label
    # the runtime controls take no arrays and are the runtime's own functions
    assert deep_gemm.set_num_ai_cores is deep_gemm.runtime.set_num_ai_cores


def test_numpy_in_numpy_out_with_torch_imported():
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    codes, sf = dg_utils.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
    assert type(codes) is np.ndarray and type(sf) is np.ndarray


# ------------------------------------------------------------------------------------------------------------------
# One tensor <-> one array: zero-copy for every dtype the API takes


DTYPES = [
    (torch.bfloat16, BF16), (torch.float8_e4m3fn, E4M3), (torch.float8_e8m0fnu, np.dtype(ml_dtypes.float8_e8m0fnu)),
    (torch.float32, np.dtype(np.float32)), (torch.int8, np.dtype(np.int8)), (torch.uint8, np.dtype(np.uint8)),
    (torch.int16, np.dtype(np.int16)), (torch.int32, np.dtype(np.int32)), (torch.int64, np.dtype(np.int64)),
]


def _int_view(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@pytest.mark.parametrize("t_dtype,np_dtype", DTYPES, ids=lambda x: str(x))
def test_views_share_memory_both_ways(t_dtype, np_dtype):
    base = torch.arange(6 * 8, dtype=torch.float32).reshape(6, 8).to(t_dtype)
    for t in (base, base.t(), base[1:, ::2], base[2:4]):  # transposed, strided with an offset, a row slice
        a = to_numpy(t, "x")
        assert a.dtype == np_dtype and a.shape == tuple(t.shape)
        assert a.strides == tuple(s * t.element_size() for s in t.stride())
        assert ptr(a) == t.data_ptr()
        back = to_torch(a)
        assert back.dtype == t_dtype and back.data_ptr() == t.data_ptr() and back.stride() == t.stride()
        assert torch.equal(_int_view(back), _int_view(t))


def test_decorator_converts_by_position_keyword_and_inside_containers():
    seen = {}

    def probe(a, b, *rest, d=None, epilogue=None):
        seen.update(a=a, b=b, rest=rest, d=d, epilogue=epilogue)
        return a, [b[0]], np.zeros(2, np.int32)

    wrapped = accepts_torch(probe)
    a = torch.zeros(4, 8, dtype=torch.bfloat16)
    b = (torch.zeros(8, 8, dtype=torch.float8_e4m3fn), torch.ones(8, 1))
    sfd = torch.zeros(1, 4, dtype=torch.int16)
    ep = FP8Quantization(sfd)
    out = wrapped(a, b, [a, 3], d=a, epilogue=ep)
    assert isinstance(seen["a"], np.ndarray) and ptr(seen["a"]) == a.data_ptr()
    assert isinstance(seen["b"], tuple) and ptr(seen["b"][0]) == b[0].data_ptr() and seen["b"][1].dtype == np.float32
    # one tensor passed three times is one array (so ``c is d`` holds in the numpy path)
    assert seen["d"] is seen["a"] and seen["rest"][0][0] is seen["a"] and seen["rest"][0][1] == 3
    # the epilogue is a copy holding the view; the caller's keeps its tensor
    assert ptr(seen["epilogue"].sfd) == sfd.data_ptr() and ep.sfd is sfd
    # results: an argument returned as it came is the caller's tensor; a new array becomes a tensor
    assert out[0] is a and out[1][0].data_ptr() == b[0].data_ptr() and out[2].dtype == torch.int32
    # no tensor: the function's own results, untouched
    assert probe(1, (2,))[2].dtype == np.int32 and type(wrapped(np.ones(2), (2,))[2]) is np.ndarray


# ------------------------------------------------------------------------------------------------------------------
# Dense GEMMs


def _fp8_problem(rng, m, n, k):
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    return x, w


def test_dense_fp8_gemm_with_torch_quantized_operands(rng, spy):
    import deep_gemm.kernels.fp8_gemm as fp8_kernels

    m, n, k = 17, 72, 96
    x, w = _fp8_problem(rng, m, n, k)
    # numpy path
    a_np = dg_utils.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
    b_np = dg_utils.per_token_cast_to_fp8(w, use_ue8m0=True, gran_k=32)
    d_np = np.full((m, n), np.nan, BF16)
    deep_gemm.fp8_gemm_nt(a_np, b_np, d_np)
    # torch path: the casts take and return tensors, the GEMM writes d in place
    a = dg_utils.per_token_cast_to_fp8(torch.from_numpy(x), use_ue8m0=True, gran_k=32)
    b = dg_utils.per_token_cast_to_fp8(torch.from_numpy(w), use_ue8m0=True, gran_k=32)
    assert a[0].dtype == torch.float8_e4m3fn and a[1].dtype == torch.float32
    assert same_bits(a[0], a_np[0]) and same_bits(a[1], a_np[1])
    d = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    d_ptr = d.data_ptr()
    launches = spy(fp8_kernels, "launch_fp8_gemm")
    config = deep_gemm.fp8_gemm_nt(a, b, d)
    assert config is not None and d.data_ptr() == d_ptr
    assert same_bits(d, d_np)
    # no copy: the kernel read the caller's operands and wrote the caller's d
    (args,) = launches
    assert ptr(args[0]) == a[0].data_ptr() and ptr(args[4]) == b[0].data_ptr() and ptr(args[8]) == d_ptr


def test_dense_fp8_gemm_fp8_output_epilogue(rng):
    m, n, k = 150, 192, 160  # tests/api/test_epilogue.py's shape and core count: its kernel
    x, w = _fp8_problem(rng, m, n, k)
    a_np = dg_utils.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
    b_np = dg_utils.per_token_cast_to_fp8(w, use_ue8m0=True, gran_k=32)
    d_np, sfd_np = np.zeros((m, n), E4M3), np.zeros((n // 64, m), np.int16).T
    d = torch.zeros(m, n, dtype=torch.float8_e4m3fn)
    sfd = torch.zeros(n // 64, m, dtype=torch.int16).t()  # strides (1, M), as upstream
    ptrs = d.data_ptr(), sfd.data_ptr()
    with deep_gemm.runtime_scope(num_ai_cores=7):
        deep_gemm.fp8_gemm_nt(a_np, b_np, d_np, epilogue=FP8Quantization(sfd_np))
        deep_gemm.fp8_gemm_nt(tt_pair(a_np), tt_pair(b_np), d, epilogue=FP8Quantization(sfd))
    assert (d.data_ptr(), sfd.data_ptr()) == ptrs
    assert same_bits(d, d_np) and same_bits(sfd, sfd_np)


def test_dense_bf16_gemm_and_accumulation_in_place(rng):
    m, n, k = 17, 72, 96
    a_np = rng.standard_normal((m, k)).astype(BF16)
    b_np = rng.standard_normal((n, k)).astype(BF16)
    c_np = rng.standard_normal((m, n)).astype(np.float32)
    d_np = c_np.copy()
    deep_gemm.bf16_gemm_nt(a_np, b_np, d_np, c=d_np)  # c=d: accumulate in place
    a, b = tt(a_np), tt(b_np)
    d = torch.from_numpy(c_np.copy())
    d_ptr = d.data_ptr()
    assert deep_gemm.bf16_gemm_nt(a, b, d, c=d) is not None
    assert d.data_ptr() == d_ptr and same_bits(d, d_np)
    # the tn form through torch's transposed views (MN-major operands, no copy)
    d_tn_np = np.zeros((m, n), np.float32)
    deep_gemm.bf16_gemm_tn(np.ascontiguousarray(a_np.T), np.ascontiguousarray(b_np.T), d_tn_np)
    d_tn = torch.zeros(m, n)
    deep_gemm.bf16_gemm_tn(a.t().contiguous(), b.t().contiguous(), d_tn)
    assert same_bits(d_tn, d_tn_np)
    # the numpy reference GEMMs take tensors too
    d_ref = torch.zeros(m, n)
    deep_gemm.aclnn_bf16_gemm_nt(a, b, d_ref)
    d_ref_np = np.zeros((m, n), np.float32)
    deep_gemm.aclnn_bf16_gemm_nt(a_np, b_np, d_ref_np)
    assert same_bits(d_ref, d_ref_np)


# ------------------------------------------------------------------------------------------------------------------
# Grouped GEMMs, bmm, einsum


def _stack_fp8(rng, g, mn, k):
    ops = [dg_testing.fp8_operand(rng, mn, k) for _ in range(g)]
    return np.stack([o[0] for o in ops]), np.stack([o[1] for o in ops])


def test_m_grouped_contiguous(rng, spy):
    import deep_gemm.kernels.fp8_gemm as fp8_kernels

    sizes = [5, 0, 1, 300]
    psum_np, per_row_np, m = dg_testing.grouped_layouts(sizes, extra_rows=3)
    a_np = dg_testing.fp8_operand(rng, m, K)
    b_np = _stack_fp8(rng, len(sizes), N, K)
    d_np = np.full((m, N), np.nan, BF16)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(a_np, b_np, d_np, psum_np)
    # the layout helper returns tensors for a tensor of group sizes
    psum, per_row, m_t = dg_testing.grouped_layouts(torch.tensor(sizes), extra_rows=3)
    assert psum.dtype == torch.int32 and m_t == m and same_bits(psum, psum_np) and same_bits(per_row, per_row_np)
    a, b = tt_pair(a_np), tt_pair(b_np)
    d = torch.full((m, N), float("nan"), dtype=torch.bfloat16)
    launches = spy(fp8_kernels, "launch_fp8_gemm")
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, psum)
    assert same_bits(d, d_np)
    assert ptr(launches[0][0]) == a[0].data_ptr() and ptr(launches[0][4]) == b[0].data_ptr()
    # CUDA DeepGEMM's per-row layout, as a tensor too
    d_rows = torch.full((m, N), float("nan"), dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d_rows, per_row, use_psum_layout=False)
    assert torch.equal(d_rows.view(torch.int16), d.view(torch.int16))


def test_m_grouped_masked(rng):
    max_m, masked_np = 40, np.array([0, 40, 1, 17], np.int32)
    g = len(masked_np)
    a_np = rng.standard_normal((g, max_m, K)).astype(BF16)
    b_np = rng.standard_normal((g, N, K)).astype(BF16)
    d_np = np.full((g, max_m, N), 7.0, BF16)
    deep_gemm.m_grouped_bf16_gemm_nt_masked(a_np, b_np, d_np, masked_np, 16)
    d = torch.full((g, max_m, N), 7.0, dtype=torch.bfloat16)
    d_ptr = d.data_ptr()
    deep_gemm.m_grouped_bf16_gemm_nt_masked(tt(a_np), tt(b_np), d, tt(masked_np), 16)
    assert d.data_ptr() == d_ptr and same_bits(d, d_np)
    assert (d[0] == 7).all() and (d[3, 17:] == 7).all()  # rows at or past masked_m never written


def test_k_grouped(rng):
    ks = [256, 256]
    m = 48
    psum_np, _, k_total = dg_testing.grouped_layouts(ks)
    a_np = rng.standard_normal((k_total, m)).astype(BF16)  # [K_total, M], MN-major as upstream
    b_np = rng.standard_normal((k_total, N)).astype(BF16)
    c_np = rng.standard_normal((len(ks), m, N)).astype(np.float32)
    d_np = np.zeros_like(c_np)
    deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a_np, b_np, d_np, ks, psum_np, c=c_np)
    d, c = torch.zeros(len(ks), m, N), tt(c_np)
    d_ptr = d.data_ptr()
    deep_gemm.k_grouped_bf16_gemm_tn_contiguous(tt(a_np), tt(b_np), d, ks, tt(psum_np), c=c)
    assert d.data_ptr() == d_ptr and same_bits(d, d_np) and same_bits(c, c_np)


def test_bmm_and_einsum(rng):
    nb_, m = 3, 20
    a_np, b_np = _stack_fp8(rng, nb_, m, K), _stack_fp8(rng, nb_, N, K)
    d_np = np.zeros((nb_, m, N), BF16)
    deep_gemm.fp8_bmm(a_np, b_np, d_np)
    d = torch.zeros(nb_, m, N, dtype=torch.bfloat16)
    deep_gemm.fp8_bmm(tt_pair(a_np), tt_pair(b_np), d)
    assert same_bits(d, d_np)

    bsz, h, dim, r = 24, 3, 64, 128
    x_np = rng.standard_normal((bsz, h, r)).astype(BF16)
    y_np = rng.standard_normal((h, dim, r)).astype(BF16)
    e_np = np.zeros((bsz, h, dim), np.float32)
    deep_gemm.einsum("bhr,hdr->bhd", x_np, y_np, e_np)
    e = torch.zeros(bsz, h, dim)
    e_ptr = e.data_ptr()
    deep_gemm.einsum("bhr,hdr->bhd", tt(x_np), tt(y_np), e)
    assert e.data_ptr() == e_ptr and same_bits(e, e_np)


# ------------------------------------------------------------------------------------------------------------------
# MQA logits (ragged, paged with its metadata) and the HC pre-norm GEMM


def test_mqa_logits_ragged(rng, spy):
    import deep_gemm.kernels.mqa_logits as mqa_kernels

    seq_len, seq_len_kv, num_heads, head_dim = 9, 300, 4, 64
    q = rng.standard_normal((seq_len, num_heads, head_dim)).astype(np.float32).astype(E4M3)
    kv8, kv_sf = dg_utils.per_token_cast_to_fp8(rng.standard_normal((seq_len_kv, head_dim)).astype(np.float32),
                                                use_ue8m0=False, gran_k=head_dim)
    kv_sf = np.ascontiguousarray(kv_sf[:, 0])
    w = rng.standard_normal((seq_len, num_heads)).astype(BF16)
    ks = rng.integers(0, 100, seq_len).astype(np.int32)
    ke = (ks + rng.integers(0, 200, seq_len)).astype(np.int32)
    ref = deep_gemm.fp8_fp4_mqa_logits((q, None), (kv8, kv_sf), w, ks, ke)
    kv_t = tt(kv8)
    launches = spy(mqa_kernels, "launch_mqa_logits")
    logits = deep_gemm.fp8_fp4_mqa_logits((tt(q), None), (kv_t, tt(kv_sf)), tt(w), tt(ks), tt(ke))
    assert isinstance(logits, torch.Tensor) and logits.dtype == torch.bfloat16
    # the row stride padded to 512 bytes, as upstream (a view of the padded buffer, not a copy)
    assert logits.stride() == (ref.strides[0] // 2, 1) and same_bits(logits, ref)
    assert ptr(launches[0][2]) == kv_t.data_ptr()


def _block_table(rng, batch, max_pages, num_blocks):
    return rng.permutation(num_blocks)[:batch * max_pages].reshape(batch, max_pages).astype(np.int32)


def test_paged_mqa_logits_with_metadata(rng, spy):
    import deep_gemm.kernels.mqa_logits as mqa_kernels

    # tests/attention's test_paged_next_n_2 shape, at test_mqa_conventions' 3 cores: its paged kernel
    with deep_gemm.runtime_scope(num_ai_cores=3):
        _paged_mqa_logits_with_metadata(rng, spy, mqa_kernels)


def _paged_mqa_logits_with_metadata(rng, spy, mqa_kernels):
    batch, next_n, num_heads, head_dim, page = 4, 2, 8, 64, 64
    ctx_np = np.array([[65, 66], [129, 130], [0, 1], [400, 401]], np.int32)
    length = int(ctx_np.max())
    q_np = rng.standard_normal((batch, next_n, num_heads, head_dim)).astype(np.float32).astype(E4M3)
    k8, ksf = dg_utils.per_token_cast_to_fp8(rng.standard_normal((batch * length, head_dim)).astype(np.float32),
                                             use_ue8m0=False, gran_k=head_dim)
    kv_np = (k8.reshape(batch, length, head_dim), ksf[:, 0].reshape(batch, length).copy())
    w_np = rng.standard_normal((batch * next_n, num_heads)).astype(BF16)
    max_pages = -(-length // page) + 1
    num_blocks = batch * max_pages + 3
    table_np = _block_table(rng, batch, max_pages, num_blocks)
    cache_np = deep_gemm.build_paged_kv_cache(kv_np, table_np, num_blocks, page)
    meta_np = deep_gemm.get_paged_mqa_logits_metadata(ctx_np, num_heads)
    ref = deep_gemm.fp8_fp4_paged_mqa_logits((q_np, None), cache_np, w_np, ctx_np, table_np, meta_np, length)

    ctx, table = tt(ctx_np), tt(table_np)
    cache = deep_gemm.build_paged_kv_cache(tt_pair(kv_np), table, num_blocks, page)
    meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, num_heads)
    assert cache.dtype == torch.uint8 and same_bits(cache, cache_np)
    assert meta.dtype == torch.int32 and same_bits(meta, meta_np)
    launches = spy(mqa_kernels, "launch_paged_mqa_logits")
    logits = deep_gemm.fp8_fp4_paged_mqa_logits(tt(q_np), cache, tt(w_np), ctx, table, meta, length)
    assert isinstance(logits, torch.Tensor) and logits.shape == ref.shape
    for i, n in enumerate(ctx_np.reshape(-1)):  # entries past a token's context are left as allocated
        assert same_bits(logits[i, :n], ref[i, :n])
    assert ptr(launches[0][2]) == cache.data_ptr()


def test_tf32_hc_prenorm_gemm(rng, spy):
    import deep_gemm.kernels.hc_prenorm as hc_kernels

    m, n, k = 37, 24, 2048  # tests/api/test_hc_prenorm.py's shape
    a_np = rng.standard_normal((m, k)).astype(BF16)
    b_np = rng.standard_normal((n, k)).astype(np.float32)
    d_np, s_np = np.full((m, n), np.nan, np.float32), np.full(m, np.nan, np.float32)
    with deep_gemm.runtime_scope(num_ai_cores=5):
        deep_gemm.tf32_hc_prenorm_gemm(a_np, b_np, d_np, s_np)
        a, b = tt(a_np), tt(b_np)
        d, s = torch.full((m, n), float("nan")), torch.full((m,), float("nan"))
        ptrs = d.data_ptr(), s.data_ptr()
        launches = spy(hc_kernels, "launch_hc_prenorm")
        assert deep_gemm.tf32_hc_prenorm_gemm(a, b, d, s) is None
    assert (d.data_ptr(), s.data_ptr()) == ptrs and same_bits(d, d_np) and same_bits(s, s_np)
    assert [ptr(x) for x in launches[0][:4]] == [a.data_ptr(), b.data_ptr(), *ptrs]


# ------------------------------------------------------------------------------------------------------------------
# Layout transforms, casts and the testing helpers


def _casts(rng):
    x = rng.standard_normal((256, 128)).astype(np.float32)
    sf = np.exp2(rng.integers(-8, 8, (5, 3))).astype(np.float32)  # mn=5, k=96 -> 3 blocks of 32
    sf4 = np.exp2(rng.integers(-8, 8, (5, 4))).astype(np.float32)
    sf16 = dg_utils.transform_sf_into_required_layout(sf, 5, 96, (1, 1, 32), is_sfa=True)
    packed = dg_utils.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)
    return [
        ("per_token_cast_to_fp8", lambda f: dg_utils.per_token_cast_to_fp8(f(x), use_ue8m0=True, gran_k=32)),
        ("per_token_cast_to_fp8 packed", lambda f: dg_utils.per_token_cast_to_fp8(f(x), True, 32, True)),
        ("per_channel_cast_to_fp8", lambda f: dg_utils.per_channel_cast_to_fp8(f(x), use_ue8m0=False)),
        ("per_block_cast_to_fp8", lambda f: dg_utils.per_block_cast_to_fp8(f(x), use_ue8m0=True)),
        ("per_custom_dims_cast_to_fp8", lambda f: dg_utils.per_custom_dims_cast_to_fp8(f(x), (0,), False)),
        ("per_token_cast_to_fp4", lambda f: dg_utils.per_token_cast_to_fp4(f(x), use_ue8m0=True, gran_k=32)),
        ("cast_back_from_fp4", lambda f: dg_utils.cast_back_from_fp4(f(packed[0]), f(packed[1]), gran_k=32)),
        ("transpose_packed_fp4", lambda f: dg_utils.transpose_packed_fp4(f(packed[0]))),
        ("pack_ue8m0_to_int", lambda f: dg_utils.pack_ue8m0_to_int(f(sf4))),
        ("transform_sf_into_required_layout",
         lambda f: deep_gemm.transform_sf_into_required_layout(f(sf), 5, 96, (1, 1, 32), is_sfa=True)),
        ("transform_sf (grouped, psum)",
         lambda f: deep_gemm.transform_sf_into_required_layout(f(sf), 5, 96, (1, 1, 32), psum_layout=f(
             np.array([5], np.int32)))),
        ("transform_k_grouped_sf_into_required_layout",
         lambda f: deep_gemm.transform_k_grouped_sf_into_required_layout(
             f(np.ones((4, 16), np.float32)), 4, 512, (1, 1, 32), True, f(np.array([256, 512], np.int32)))),
        ("unpack_sf_from_required_layout", lambda f: deep_gemm.unpack_sf_from_required_layout(f(sf16), 5, 96)),
        ("unpack_ue8m0_from_int", lambda f: dg_utils.unpack_ue8m0_from_int(f(dg_utils.pack_ue8m0_to_int(sf4)))),
        ("encode/decode_e4m3", lambda f: dg_utils.decode_e4m3(dg_utils.encode_e4m3(f(x[:4])))),
        ("fp32_to_bf16_bits", lambda f: dg_utils.fp32_to_bf16_bits(f(x[:4]))),
        ("round_to_tf32", lambda f: dg_utils.round_to_tf32(f(x[:4]))),
        ("dequantize_fp8", lambda f: dg_testing.dequantize_fp8(*(f(v) for v in dg_utils.per_token_cast_to_fp8(
            x, use_ue8m0=True, gran_k=32)))),
    ]


def _flat(result):
    return list(result) if isinstance(result, tuple) else [result]


@pytest.mark.parametrize("index", range(18))
def test_layout_transforms_and_casts_return_tensors(rng, index):
    label, call = _casts(rng)[index]
    numpy_out = _flat(call(lambda v: v))
    torch_out = _flat(call(lambda v: tt(v) if isinstance(v, np.ndarray) else v))
    assert len(numpy_out) == len(torch_out), label
    for got, want in zip(torch_out, numpy_out, strict=True):
        assert isinstance(got, torch.Tensor), label
        assert same_bits(got, want), label
        assert tuple(s * got.element_size() for s in got.stride()) == want.strides or want.size <= 1, label


def test_zero_copy_results_and_an_input_returned_as_is(rng):
    x = torch.zeros(8, 64, dtype=torch.float8_e4m3fn)
    codes = dg_utils.fp8_codes(x)  # a uint8 view of x, both ways zero-copy
    assert codes.dtype == torch.uint8 and codes.data_ptr() == x.data_ptr()
    # an int16 sf already in the required layout comes back as the caller's own tensor
    sf16 = dg_utils.transform_sf_into_required_layout(
        np.exp2(rng.integers(-8, 8, (5, 3))).astype(np.float32), 5, 96, (1, 1, 32), is_sfa=True)
    sf_t = torch.from_numpy(np.ascontiguousarray(sf16.T)).t()  # strides (1, MN)
    assert deep_gemm.transform_sf_into_required_layout(sf_t, 5, 96, (1, 1, 32), is_sfa=True) is sf_t
    assert dg_utils.is_required_sf_layout(sf_t, 5, 96) and dg_utils.is_fp8(x) and not dg_utils.is_bf16(x)


def test_testing_helpers_take_tensors(rng):
    x = rng.standard_normal((16, 32)).astype(np.float32)
    y = x + rng.standard_normal((16, 32)).astype(np.float32) * 1e-3
    assert dg_testing.calc_diff(tt(x), tt(y)) == dg_testing.calc_diff(x, y)
    assert dg_testing.count_bytes(tt(x), (tt(y.astype(BF16)), None)) == x.nbytes + x.nbytes // 2
    dg_testing.assert_bitwise_equal(tt(x), x)
    with pytest.raises(AssertionError, match="bitwise mismatch"):
        dg_testing.assert_bitwise_equal(tt(x), tt(y))
    ref = dg_testing.reference_gemm(tt(x.astype(BF16)), tt(y.astype(BF16)))
    assert ref.dtype == torch.float64 and same_bits(ref, dg_testing.reference_gemm(x.astype(BF16), y.astype(BF16)))


# ------------------------------------------------------------------------------------------------------------------
# Refused tensors: named, before anything is written


def _bf16_call_args(rng, m=17, n=72, k=96):
    a = tt(rng.standard_normal((m, k)).astype(BF16))
    b = tt(rng.standard_normal((n, k)).astype(BF16))
    d = torch.full((m, n), 3.0)
    return a, b, d


def test_non_cpu_tensor_is_refused_naming_the_argument(rng):
    a, b, d = _bf16_call_args(rng)
    with pytest.raises(TypeError, match=r"^b is a torch tensor on device 'meta'.*b\.cpu\(\)"):
        deep_gemm.bf16_gemm_nt(a, b.to("meta"), d)
    with pytest.raises(TypeError, match=r"^d is a torch tensor on device 'meta'"):
        deep_gemm.bf16_gemm_nt(a, b, d=d.to("meta"))
    a8 = dg_utils.per_token_cast_to_fp8(torch.randn(17, 96), use_ue8m0=True, gran_k=32)
    with pytest.raises(TypeError, match=r"^a\[1\] is a torch tensor on device 'meta'"):
        deep_gemm.fp8_gemm_nt((a8[0], a8[1].to("meta")), a8, d)
    with pytest.raises(TypeError, match=r"^epilogue\.sfd is a torch tensor on device 'meta'"):
        deep_gemm.bf16_gemm_nt(a, b, torch.zeros(17, 128, dtype=torch.float8_e4m3fn),
                               epilogue=FP8Quantization(torch.zeros(17, 2, dtype=torch.int16, device="meta")))
    with pytest.raises(TypeError, match=r"^context_lens is a torch tensor on device 'meta'"):
        deep_gemm.get_paged_mqa_logits_metadata(torch.ones(4, 1, dtype=torch.int32, device="meta"), 8)
    with pytest.raises(TypeError, match=r"^arrays\[1\] is a torch tensor on device 'meta'"):
        dg_testing.count_bytes(a, b.to("meta"))
    assert (d == 3.0).all()


def test_requires_grad_is_refused(rng):
    a, b, d = _bf16_call_args(rng)
    with pytest.raises(ValueError, match=r"^a requires grad.*a\.detach\(\)"):
        deep_gemm.bf16_gemm_nt(a.float().requires_grad_().bfloat16(), b, d)
    with pytest.raises(ValueError, match=r"^d requires grad"):
        deep_gemm.bf16_gemm_nt(a, b, torch.zeros(17, 72, requires_grad=True))
    with pytest.raises(ValueError, match=r"^x requires grad"):
        dg_utils.per_token_cast_to_fp8(torch.ones(4, 64, requires_grad=True), use_ue8m0=True)
    assert (d == 3.0).all()


def test_bad_strides_layouts_and_dtypes_are_refused(rng):
    a, b, d = _bf16_call_args(rng)
    wide = tt(rng.standard_normal((17, 192)).astype(BF16))
    with pytest.raises(ValueError, match=r"^a must be contiguous along one of its last two axes"):
        deep_gemm.bf16_gemm_nt(wide[:, ::2], b, d)  # no unit stride on either axis
    with pytest.raises(ValueError, match=r"^d must have unit stride along N"):
        deep_gemm.bf16_gemm_nt(a, b, torch.zeros(72, 17).t())  # a column-major D
    with pytest.raises(ValueError, match="d rows must not overlap"):
        deep_gemm.bf16_gemm_nt(a, b, torch.zeros(1, 72).expand(17, 72))  # stride 0: every row the same memory
    with pytest.raises(ValueError, match=r"^a must have a unit-stride last dim"):
        deep_gemm.tf32_hc_prenorm_gemm(torch.zeros(128, 4, dtype=torch.bfloat16).t(), torch.zeros(8, 128),
                                       torch.zeros(4, 8), torch.zeros(4))
    with pytest.raises(ValueError, match=r"^kv_cache\.strides=.* must be C-contiguous"):
        cache = torch.zeros(2, 64, 1, 136, dtype=torch.uint8)[:, :, :, :68]
        deep_gemm.fp8_fp4_paged_mqa_logits(torch.zeros(1, 1, 8, 64, dtype=torch.float8_e4m3fn), cache,
                                           torch.zeros(1, 8), torch.ones(1, 1, dtype=torch.int32),
                                           torch.zeros(1, 1, dtype=torch.int32), torch.zeros(33, 2, dtype=torch.int32),
                                           1)
    with pytest.raises(TypeError, match=r"^b is a torch tensor with layout torch\.sparse_coo"):
        deep_gemm.bf16_gemm_nt(a, b.float().to_sparse().bfloat16(), d)
    fp4x2 = torch.zeros(72, 48, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)  # packed FP4 is int8 here
    with pytest.raises(TypeError, match=r"^b: a torch tensor of dtype torch\.float4_e2m1fn_x2 has no numpy view"):
        deep_gemm.bf16_gemm_nt(a, fp4x2, d)
    with pytest.raises(ValueError, match=r"^b is a lazy negated or conjugated view"):
        deep_gemm.bf16_gemm_nt(a, torch._neg_view(b), d)
    assert (d == 3.0).all()
