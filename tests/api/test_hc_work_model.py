"""The HC pre-norm cost model and its kernel stay in step: a dry run of the real generated kernel (its translated
kernel.py executed in plain Python with every device intrinsic replaced by a counter, nothing compiled by numba)
counts, per core and AIV, the bytes each copy moves, the L0 loads, the MADs, the FixPipe elements and the Vector
unit's half-tile passes (one Cast per half tile), and heuristics/hc_prenorm.py's ``unit_work`` must give the same
figures for that core's units."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

from deep_gemm import runtime
from deep_gemm.arch import get_arch
from deep_gemm.heuristics.hc_prenorm import HcPrenormDesc, num_units, unit_work
from deep_gemm.kernels.hc_prenorm import prepare_hc_prenorm


class _Counting:
    """The device intrinsics the kernel calls, as counters: ``counts[(core, sub, what)]``."""

    def __init__(self, gm_a):
        self.counts = Counter()
        self.core = self.sub = 0
        self.gm_a = gm_a

    def add(self, what, value=1):
        self.counts[self.core, self.sub, what] += value

    def names(self):
        def copy_gm_to_l1_tf32(l1, gm, stride, mn_major, mn0, k0, mn, k):
            self.add("b_gm_bytes", min(l1.shape[0], mn - mn0) * min(l1.shape[1], k - k0) * 4)

        def load_l0a(l0, l1, sf, row0, k0, rows, depth, with_sf):
            self.add("l0a_bytes", rows * depth * 4)

        def load_l0b(l0, l1, sf, row0, k0, rows, depth, with_sf):
            self.add("l0b_bytes", l1.shape[0] * depth * 4)

        def mmad(acc, a, b, rows, cols, depth, init):
            self.add("mads")

        def fixpipe(gm, stride, l0c, row0, col0, rows, cols, m, n, alpha, acc):
            self.add("fixpipe_elems", max(0, min(rows, m - row0)) * max(0, min(cols, n - col0)))

        def data_copy_pad(dst, src, offset, stride, rows, row_len, pad):
            if src is self.gm_a:
                self.add("a_gm_bytes", rows * row_len * 2)

        def vector(name):
            def op(*args):
                self.add("vector_instructions")
                if name == "CastReduceSumSquares":
                    self.add("half_tiles")
            return op

        def ub_tensor(ub, info, aiv, offset, rows, cols, dtype):
            return np.zeros((rows, cols), dtype)

        def noop(*args):
            return None

        names = {name: vector(name) for name in ("Add", "CastReduceSumSquares", "Duplicate")}
        names.update(copy_gm_to_l1_tf32=copy_gm_to_l1_tf32, load_l0a=load_l0a, load_l0b=load_l0b, mmad=mmad,
                     Fixpipe=fixpipe, DataCopyPad=data_copy_pad, ub_tensor=ub_tensor, SetFlag=noop, WaitFlag=noop,
                     cross_core_set=noop, cross_core_try_wait=lambda *args: True, cancel_requested=lambda c: False,
                     borrow=lambda arr: arr, keep_alive=noop,
                     local_tensor=lambda local, sub, offset, shape, dtype: np.zeros(shape, dtype),
                     slot_view=lambda buf, s, rows: buf[s * rows:(s + 1) * rows],
                     tile_view=lambda buf, r0, rows, c0, cols: buf[r0:r0 + rows, c0:c0 + cols],
                     l0a_size=lambda rows, k: rows * k, l0b_size=lambda rows, k: rows * k,
                     njit=lambda *a, **kw: (lambda f: f) if not (a and callable(a[0])) else a[0], np=np)
        return names


def _dry_run(m, n, k, num_splits, deterministic, cores):
    """(config, counts) of a dry run of the kernel the call would launch."""
    with runtime.runtime_scope(num_ai_cores=cores):
        prepared = prepare_hc_prenorm(m, n, k, num_splits, deterministic)
    source = (prepared.kernel.path / "kernel.py").read_text()
    source = "\n".join(line for line in source.splitlines()
                       if not re.match(r"(from |import |@njit|apply_numba_settings\(\))", line))
    gm_a = np.zeros(m * k, np.uint16)
    counting = _Counting(gm_a)
    namespace = counting.names()
    exec(compile(source, "hc_kernel_dry_run", "exec"), namespace)  # noqa: S102 - the project's own generated code
    subcore = namespace["_tf32_hc_prenorm_gemm_subcore"]
    s = max(1, num_splits or prepared.config.num_splits)
    args = dict(gm_a=gm_a, stride_a=k, gm_b=np.zeros(n * k, np.float32), stride_b=k,
                gm_d=np.zeros(s * m * n, np.float32), stride_d=n, split_stride_d=m * n,
                gm_sqr=np.zeros(s * m, np.float32), split_stride_sqr=m, shape_m=m, shape_n=n, shape_k=k)
    for core in range(cores):
        for sub in range(3):
            counting.core, counting.sub = core, sub
            for _ in subcore(core, sub, None, None, None, None, None, *args.values()):
                pass
    return prepared.config, counting.counts


@pytest.mark.parametrize("m,n,k,num_splits,deterministic,cores", [
    (300, 24, 2048, 3, False, 8),  # caller split: 3 splits x 2 cores, the last token block all on AIV0
    (300, 24, 2112, 0, True, 4),  # kernel split for 32 cores (8) on 4 cores: two rounds; a short hidden block
    (2200, 24, 512, 0, False, 2),  # two chunks of 16 token blocks on each of 2 cores
    (70, 128, 512, 2, False, 3),  # N = 128: B's K slices reloaded per token block (they do not stay in L0B)
])
def test_modelled_work_matches_a_dry_run_of_the_kernel(m, n, k, num_splits, deterministic, cores):
    config, counts = _dry_run(m, n, k, num_splits, deterministic, cores)
    desc = HcPrenormDesc(m, n, k, num_splits, cores, deterministic)
    arch = get_arch("950DT")
    units = num_units(m, config)
    assert units > 0 and (config.keep_l0b == (n <= 64))
    total = Counter()
    for core in range(cores):
        work = [unit_work(desc, config, arch, u) for u in range(core, units, cores)]
        got = {what: counts[core, 0, what] for what in ("b_gm_bytes", "l0a_bytes", "l0b_bytes", "mads",
                                                          "fixpipe_elems")}
        want = {"b_gm_bytes": sum(w.b_gm_bytes for w in work), "l0a_bytes": sum(w.l0a_bytes for w in work),
                "l0b_bytes": sum(w.l0b_bytes for w in work), "mads": sum(w.mads for w in work),
                "fixpipe_elems": sum(w.fixpipe_elems for w in work)}
        assert got == want, (core, got, want)
        for v in range(2):
            assert counts[core, 1 + v, "a_gm_bytes"] == sum(w.a_gm_bytes[v] for w in work), (core, v)
            assert counts[core, 1 + v, "half_tiles"] == sum(w.half_tiles[v] for w in work), (core, v)
            total["a"] += counts[core, 1 + v, "a_gm_bytes"]
        # the AIC's L0A loads read exactly the fp32 tiles the AIVs handed over (UB -> L1 on the chip)
        assert counts[core, 0, "l0a_bytes"] == sum(w.a_ub_to_l1_bytes for w in work)
    # A crosses GM once: every element of every K split exactly once
    assert total["a"] == m * k * 2
