"""The torch boundary: CPU torch tensors in and out of every public function, zero-copy, never importing torch.

``accepts_torch(fn)`` hands ``fn`` numpy views of its tensor arguments (so outputs are written in the caller's memory)
and returns its arrays as tensors over the same memory. Checks of shapes and strides stay the numpy path's.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
import types

__all__ = ["accepts_torch", "is_torch_tensor", "to_numpy", "to_torch"]

# torch dtype name -> (same-size integer dtype name of the view, ml_dtypes name): the dtypes whose .numpy() torch
# refuses. Built lazily (torch and ml_dtypes are imported by then); names torch or ml_dtypes lack are left out.
_VIEWED_DTYPES = {
    "bfloat16": ("int16", "bfloat16"),
    "float8_e4m3fn": ("uint8", "float8_e4m3fn"),
    "float8_e5m2": ("uint8", "float8_e5m2"),
    "float8_e4m3fnuz": ("uint8", "float8_e4m3fnuz"),
    "float8_e5m2fnuz": ("uint8", "float8_e5m2fnuz"),
    "float8_e8m0fnu": ("uint8", "float8_e8m0fnu"),
}
_TO_NUMPY: dict | None = None  # torch dtype -> (torch int dtype, numpy dtype)
_TO_TORCH: dict | None = None  # numpy dtype -> (numpy int dtype, torch dtype)
_SUPPORTED = ("bfloat16, float8_e4m3fn, float8_e8m0fnu, float32, int8 (packed FP4), uint8, int16 / int32 (UE8M0), "
              "int64, and numpy's other dtypes")
_EPILOGUE = None  # deep_gemm.epilogue.Epilogue, imported on the first call that sees torch


def _tables(torch) -> tuple[dict, dict]:
    global _TO_NUMPY, _TO_TORCH
    if _TO_NUMPY is None:
        import ml_dtypes
        import numpy as np

        to_numpy, to_torch = {}, {}
        for name, (int_name, ml_name) in _VIEWED_DTYPES.items():
            t_dtype, ml_dtype = getattr(torch, name, None), getattr(ml_dtypes, ml_name, None)
            if t_dtype is None or ml_dtype is None:
                continue
            to_numpy[t_dtype] = (getattr(torch, int_name), np.dtype(ml_dtype))
            to_torch[np.dtype(ml_dtype)] = (np.dtype(int_name), t_dtype)
        _TO_NUMPY, _TO_TORCH = to_numpy, to_torch
    return _TO_NUMPY, _TO_TORCH


def is_torch_tensor(x: object) -> bool:
    """Whether ``x`` is a torch.Tensor (False, at the cost of a dict lookup, in a process without torch)."""
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)
    return tensor is not None and isinstance(x, tensor)


# ------------------------------------------------------------------------------------------------------------------
# One tensor <-> one array


def to_numpy(t, name: str = "tensor"):
    """A numpy view of the CPU tensor ``t`` (same memory, same shape and strides; bf16 and float8 as ml_dtypes).

    TypeError for a tensor on another device, a non-strided (sparse, mkldnn) layout or a dtype numpy has no view
    of; ValueError for one that requires grad or carries a lazy negation / conjugation bit. ``name`` is the
    argument's name in those messages."""
    torch = sys.modules["torch"]
    if t.device.type != "cpu":
        raise TypeError(f"{name} is a torch tensor on device '{t.device}'; deep_gemm runs on the CPU cores standing "
                        f"in for the NPU: pass a CPU tensor ({name}.cpu())")
    if t.layout != torch.strided:
        raise TypeError(f"{name} is a torch tensor with layout {t.layout}; deep_gemm reads dense strided tensors "
                        f"({name}.to_dense())")
    if t.requires_grad:
        raise ValueError(f"{name} requires grad; deep_gemm's functions are not differentiable (they read and write "
                         f"tensor memory directly): pass {name}.detach()")
    if t.is_neg() or t.is_conj():
        raise ValueError(f"{name} is a lazy negated or conjugated view (is_neg={t.is_neg()}, "
                         f"is_conj={t.is_conj()}); pass {name}.resolve_neg().resolve_conj()")
    to_np, _ = _tables(torch)
    viewed = to_np.get(t.dtype)
    try:
        # NOTES: torch refuses .numpy() on bf16 and float8: view the tensor as a same-size int dtype (any strides
        # allow that), take numpy's view of it, and view that as the ml_dtypes dtype. Never a copy.
        return t.view(viewed[0]).numpy().view(viewed[1]) if viewed else t.numpy()
    except (TypeError, RuntimeError) as e:
        raise TypeError(f"{name}: a torch tensor of dtype {t.dtype} has no numpy view ({e}); deep_gemm takes "
                        f"{_SUPPORTED}") from None


def to_torch(a):
    """A torch tensor over the memory of the numpy array ``a`` (bf16 and float8 as torch's dtypes), zero-copy;
    copied only when torch cannot view it (negative or non-itemsize strides) or it is read-only. An array of a dtype
    torch lacks is returned as it is."""
    import numpy as np

    torch = sys.modules["torch"]
    _, to_t = _tables(torch)
    if not a.flags.writeable or any(s < 0 or s % a.itemsize for s in a.strides):
        a = np.array(a)  # NOTES: from_numpy would share read-only memory writably, or refuses these strides
    viewed = to_t.get(a.dtype)
    if viewed is not None:
        return torch.from_numpy(a.view(viewed[0])).view(viewed[1])
    try:
        return torch.from_numpy(a)
    except TypeError:
        return a


# ------------------------------------------------------------------------------------------------------------------
# Arguments and results


def _epilogue_type():
    global _EPILOGUE
    if _EPILOGUE is None:
        from .epilogue import Epilogue

        _EPILOGUE = Epilogue
    return _EPILOGUE


# type -> 0 (holds no tensor), 1 (a tensor), 2 (a tuple or list: look inside), 3 (an Epilogue: look at its sfd);
# the scan of a call with no tensor is then one dict lookup per argument
_KINDS: dict[type, int] = {}


def _kind(t: type, tensor, epilogue) -> int:
    kind = _KINDS[t] = (1 if issubclass(t, tensor) else 2 if issubclass(t, (tuple, list))
                        else 3 if issubclass(t, epilogue) else 0)
    return kind


def _has_tensor(x, tensor, epilogue) -> bool:
    kind = _KINDS.get(type(x))
    if kind is None:
        kind = _kind(type(x), tensor, epilogue)
    if kind == 0:
        return False
    if kind == 1:
        return True
    if kind == 2:
        for v in x:
            if _has_tensor(v, tensor, epilogue):
                return True
        return False
    return isinstance(getattr(x, "sfd", None), tensor)


class _Call:
    """The conversions of one call: tensor -> array (memoised, so one tensor passed twice is one array and ``c is d``
    still holds) and array -> the caller's tensor (so an argument returned as it came goes back as itself)."""

    def __init__(self, tensor, epilogue):
        self.tensor, self.epilogue = tensor, epilogue
        self.arrays: dict[int, object] = {}
        self.tensors: dict[int, object] = {}

    def arg(self, x, name: str):
        if isinstance(x, self.tensor):
            a = self.arrays.get(id(x))
            if a is None:
                a = self.arrays[id(x)] = to_numpy(x, name)
                self.tensors[id(a)] = x
            return a
        if isinstance(x, (tuple, list)):
            items = [self.arg(v, f"{name}[{i}]") for i, v in enumerate(x)]
            if all(new is old for new, old in zip(items, x, strict=True)):
                return x
            return x._make(items) if hasattr(x, "_make") else type(x)(items)
        if isinstance(x, self.epilogue) and isinstance(getattr(x, "sfd", None), self.tensor):
            viewed = copy.copy(x)
            viewed.sfd = self.arg(x.sfd, f"{name}.sfd")
            return viewed
        return x

    def result(self, x):
        import numpy as np

        if isinstance(x, np.ndarray):
            own = self.tensors.get(id(x))
            return own if own is not None else to_torch(x)
        if type(x) in (tuple, list):
            return type(x)(self.result(v) for v in x)
        return x


def _positional_names(fn) -> tuple[list[str], str | None]:
    names, star = [], None
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind is p.VAR_POSITIONAL:
            star = p.name
    return names, star


_WRAPPERS: dict[object, object] = {}


def accepts_torch(fn, home: str | None = None):
    """``fn`` taking CPU torch tensors wherever it takes numpy arrays: by position or keyword, inside tuples and
    lists, and as an FP8Quantization epilogue's ``sfd``, each viewed as numpy (``to_numpy``: no copy, its errors
    name the argument). When any argument was a tensor, the numpy arrays ``fn`` returns (inside tuples and lists too)
    come back as tensors over the same memory, an argument returned as it came as the caller's own tensor.

    Without a tensor argument a call costs one dict lookup (torch never imported) or a type scan of the arguments:
    torch is looked up in ``sys.modules`` only, since no tensor exists before its caller imported torch. Anything
    but a plain function is returned unchanged; one wrapper per function, so aliases stay one object. ``home``: a
    package exporting ``fn`` under its own ``__name__``, recorded as the wrapper's module so that pickle (the workers
    of par_compile) finds the wrapper by name.
    """
    if not isinstance(fn, types.FunctionType) or getattr(fn, "__deep_gemm_torch__", False):
        return fn
    wrapper = _WRAPPERS.get(fn)
    if wrapper is None:
        wrapper = _WRAPPERS[fn] = _wrap(fn)
    if home is not None and wrapper.__module__ == fn.__module__:
        wrapper.__module__ = home
    return wrapper


def _wrap(fn):
    signature: list = []  # (positional parameter names, the *args name), read on the first call with a tensor

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        tensor = getattr(sys.modules.get("torch"), "Tensor", None)  # None: no torch, or torch half imported
        if tensor is None:
            return fn(*args, **kwargs)
        epilogue = _epilogue_type()
        for x in args:
            if _has_tensor(x, tensor, epilogue):
                break
        else:
            for x in kwargs.values():
                if _has_tensor(x, tensor, epilogue):
                    break
            else:
                return fn(*args, **kwargs)
        if not signature:
            signature.append(_positional_names(fn))
        positional, star = signature[0]
        call = _Call(tensor, epilogue)
        args = tuple(call.arg(x, positional[i] if i < len(positional) else f"{star or 'args'}[{i - len(positional)}]")
                     for i, x in enumerate(args))
        kwargs = {k: call.arg(v, k) for k, v in kwargs.items()}
        return call.result(fn(*args, **kwargs))

    wrapper.__deep_gemm_torch__ = True
    return wrapper


def wrap_exports(namespace: dict, names, home: str) -> None:
    """Replace every plain function among ``names`` in a package's ``namespace`` by its ``accepts_torch`` wrapper
    (``home``: the package's name)."""
    names = set(names)
    for name in names:
        value = namespace.get(name)
        if isinstance(value, types.FunctionType):
            namespace[name] = accepts_torch(value, home if value.__name__ in names else None)
