"""Launch arguments bound by name to the template's entry signature (jit/signature.py): the signature is read by
the translator and kept in meta.json; a missing, extra or mistyped argument is refused with an error naming the
parameter and the kernel, before anything runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from jit_helpers import vadd_args, vadd_reference

from deep_gemm.jit import ArgumentError, EntrySignature

# The ABI records of `k(GM_ADDR ws, __gm__ float* x, GlobalTensor<int16_t> t, uint32_t n, int64_t s, float alpha,
# bool flag)` as the translator writes them into meta.json.
RECORDS = [
    {"name": "ws", "c_type": "GM_ADDR", "kind": "pointer", "dtype": "uint8", "ndim": 1},
    {"name": "x", "c_type": "float*", "kind": "pointer", "dtype": "float32", "ndim": 1},
    {"name": "t", "c_type": "GlobalTensor<int16_t>", "kind": "pointer", "dtype": "int16", "ndim": 0},
    {"name": "n", "c_type": "uint32_t", "kind": "scalar", "dtype": "uint32", "ndim": 0},
    {"name": "s", "c_type": "int64_t", "kind": "scalar", "dtype": "int64", "ndim": 0},
    {"name": "alpha", "c_type": "float", "kind": "scalar", "dtype": "float32", "ndim": 0},
    {"name": "flag", "c_type": "bool", "kind": "scalar", "dtype": "bool_", "ndim": 0},
]


@pytest.fixture
def sig() -> EntrySignature:
    return EntrySignature.from_abi("k", RECORDS)


def _good() -> dict:
    return dict(ws=np.zeros(4, np.uint8), x=np.ones(3, np.float32), t=np.zeros((2, 5), np.int16), n=7, s=-3,
                alpha=0.5, flag=True)


def test_binds_by_name_in_signature_order(sig):
    args = _good()
    bound = sig.bind((), dict(reversed(list(args.items()))))  # any keyword order
    assert sig.names == ("ws", "x", "t", "n", "s", "alpha", "flag")
    assert all(b is args[name] for b, name in zip(bound[:3], sig.names, strict=False))  # arrays: no copy
    assert bound[3:] == (7, -3, 0.5, True)
    positional = sig.bind(tuple(args.values()))
    mixed = sig.bind((args["ws"], args["x"]), {k: v for k, v in args.items() if k not in ("ws", "x")})
    for other in (positional, mixed):
        assert all(a is b for a, b in zip(other[:3], bound[:3], strict=True)) and other[3:] == bound[3:]


def test_scalars_are_normalised(sig):
    bound = sig.bind((), {**_good(), "n": np.uint32(9), "s": np.int8(-2), "alpha": np.float16(0.25), "flag": np.True_})
    assert bound[3:] == (9, -2, 0.25, True)
    assert [type(v) for v in bound[3:]] == [int, int, float, bool]  # one numba specialization whatever came in
    assert sig.bind((), {**_good(), "alpha": 2})[5] == 2.0  # an int is a real number


@pytest.mark.parametrize("change, match", [
    ({"n": None}, r"k\(\) missing argument 'n'"),
    ({"n": None, "flag": None}, r"missing arguments 'n', 'flag'"),
    ({"extra": 1}, r"k\(\) has no parameter 'extra' \(parameters: ws, x, t, n, s, alpha, flag\)"),
    ({"x": np.ones(3, np.float64)}, r"argument 'x' \(`float\* x`\) must be a 1-D float32 numpy array, got a float64 "
                                    r"array of shape \(3,\): dtype float64 is not float32"),
    ({"x": np.ones((3, 1), np.float32)}, r"'x' .* got a float32 array of shape \(3, 1\): 2 dimensions, not 1"),
    ({"x": [1.0, 2.0]}, r"argument 'x' .* must be a 1-D float32 numpy array, got list \[1.0, 2.0\]"),
    ({"t": np.zeros(3, np.int32)}, r"argument 't' .* dtype int32 is not int16"),
    ({"n": 2.5}, r"argument 'n' \(`uint32_t n`\) must be an integer \(uint32\), got float 2.5"),
    ({"n": 3.0}, r"argument 'n' .* got float 3.0"),
    ({"s": True}, r"argument 's' .* must be an integer \(int64\), got bool True"),
    ({"n": "7"}, r"argument 'n' .* got str '7'"),
    ({"alpha": "0.5"}, r"argument 'alpha' \(`float alpha`\) must be a real number \(float32\), got str"),
    ({"alpha": True}, r"argument 'alpha' .* got bool True"),
    ({"flag": 1}, r"argument 'flag' \(`bool flag`\) must be a bool, got int 1"),
])
def test_refuses_missing_extra_and_mistyped(sig, change, match):
    args = _good()
    for key, value in change.items():
        if value is None:
            del args[key]
        else:
            args[key] = value
    with pytest.raises(ArgumentError, match=match) as info:
        sig.bind((), args)
    assert isinstance(info.value, TypeError) and info.value.kernel == "k" and info.value.phase == "launch"


def test_integers_must_fit_their_c_type(sig):
    for value in (-1, 2**32):
        with pytest.raises(ValueError, match=rf"argument 'n' .* got int {value}: outside uint32's range"):
            sig.bind((), {**_good(), "n": value})
    assert sig.bind((), {**_good(), "n": 2**32 - 1})[3] == 2**32 - 1


def test_positional_misuse(sig):
    args = list(_good().values())
    with pytest.raises(ArgumentError, match=r"takes 7 arguments .* got 8 positional"):
        sig.bind((*args, 1))
    with pytest.raises(ArgumentError, match="'ws' both by position and by name"):
        sig.bind((args[0],), {"ws": args[0]})


def test_placeholders_bind(sig):
    bound = sig.bind((), sig.placeholders())
    assert [getattr(v, "dtype", type(v)) for v in bound] == [np.uint8, np.float32, np.int16, int, int, float, bool]


def test_kernel_records_its_signature_and_launches_by_name(vadd_kernel, rng):
    meta = json.loads((vadd_kernel.path / "meta.json").read_text())
    assert [(p["name"], p["c_type"], p["kind"], p["dtype"], p["ndim"]) for p in meta["params"]] == [
        ("unused", "GM_ADDR", "pointer", "uint8", 1), ("x", "GlobalTensor<float>", "pointer", "float32", 0),
        ("y", "GlobalTensor<float>", "pointer", "float32", 0), ("z", "GlobalTensor<float>", "pointer", "float32", 0),
        ("n", "int32_t", "scalar", "int32", 0)]
    assert vadd_kernel.params == ("unused", "x", "y", "z", "n")
    unused, x, y, z, n = vadd_args(37, rng)
    vadd_kernel.launch(n=n, z=z, y=y, x=x, unused=unused)
    np.testing.assert_array_equal(z, vadd_reference(x, y, 2.0))


def test_kernel_refuses_a_bad_argument_before_running(vadd_kernel, rng):
    unused, x, y, z, n = vadd_args(37, rng)
    z[:] = 42.0
    with pytest.raises(ArgumentError, match=r"vadd\(\) argument 'z' .* dtype float64 is not float32"):
        vadd_kernel(unused=unused, x=x, y=y, z=z.astype(np.float64), n=n)
    with pytest.raises(ArgumentError, match=r"vadd\(\) missing argument 'n'"):
        vadd_kernel(unused=unused, x=x, y=y, z=z)
    with pytest.raises(ArgumentError, match=r"vadd\(\) has no parameter 'm'"):
        vadd_kernel(unused=unused, x=x, y=y, z=z, n=n, m=n)
    with pytest.raises(ArgumentError, match=r"vadd\(\) argument 'n' .* got float 37.0"):
        vadd_kernel(unused, x, y, z, float(n))
    assert (z == 42.0).all()
