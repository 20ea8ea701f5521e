"""A kernel entry's parameters as the template declares them, and the binding of launch arguments to them by name.

The translator reads the entry's signature (``__gm__ uint8_t* gm_a, int64_t stride_a, ...``); build() records it
in the cache entry's meta.json ("params"); CompiledKernel binds every launch through an EntrySignature, which
refuses a missing, extra or mistyped argument with an error naming the parameter and the kernel. Knows nothing of
GEMM and imports neither numba nor the translator.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from .errors import JITError

# Scalar C types as the translator spells them (numpy names) -> the value range a launch argument must fit.
_INT_RANGES = {name: (int(np.iinfo(name).min), int(np.iinfo(name).max))
               for name in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")}


class ArgumentError(JITError, TypeError, ValueError):
    """A launch argument does not fit the kernel entry's signature: missing, extra, wrong kind, dtype, rank or
    value range. A TypeError (and a ValueError, for values out of the parameter's range); names the parameter."""

    phase = "launch"


@dataclass(frozen=True)
class Param:
    """One entry parameter as the binder checks it.

    kind: "array" (a GM pointer or tensor: a numpy array), "int", "float" or "bool"; dtype: numpy name of the
    scalar or element type ("uint8", "float32", ...; None: any element type); ndim: the array rank (pointers 1,
    tensors 0 = any rank); c_type: the C spelling of the declaration without the name, for messages.
    """

    name: str
    kind: str
    dtype: str | None
    ndim: int = 0
    c_type: str = ""

    @classmethod
    def from_abi(cls, record: dict) -> Param:
        """From the translator's record of the parameter (translate.EntryParam as stored in meta.json: name,
        c_type, kind "pointer"/"scalar", dtype, ndim)."""
        name, kind, dtype = str(record["name"]), record["kind"], record.get("dtype")
        if kind == "pointer":
            return cls(name, "array", dtype, int(record.get("ndim", 0)), record.get("c_type", ""))
        if kind != "scalar" or dtype is None:
            raise ValueError(f"parameter {name!r}: unknown kind {kind!r} / dtype {dtype!r}")
        scalar = "bool" if dtype == "bool_" else "float" if dtype.startswith("float") else "int"
        return cls(name, scalar, dtype, 0, record.get("c_type", ""))

    def describe(self) -> str:
        if self.kind == "array":
            rank = f"{self.ndim}-D " if self.ndim else ""
            return f"a {rank}{self.dtype or ''} numpy array".replace("  ", " ")
        return {"int": f"an integer ({self.dtype})", "float": f"a real number ({self.dtype})",
                "bool": "a bool"}[self.kind]


def _got(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array of shape {value.shape}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


class EntrySignature:
    """The parameters of one kernel entry and their binding. ``bind(args, kwargs)`` returns the positional tuple
    the compiled entry takes; the per-parameter checks are built once, so a bind costs a few microseconds.

    Scalars are normalised to Python int / float / bool (so every launch hits one numba specialization); arrays are
    passed as they are (no copy, no conversion) once their dtype and rank match.
    """

    def __init__(self, kernel: str, params: list[Param] | tuple[Param, ...], entry: str | None = None):
        self.kernel = kernel
        self.entry = entry or kernel
        self.params = tuple(params)
        self.names = tuple(p.name for p in self.params)
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"kernel {kernel}: duplicate parameter names in {self.names}")
        self._index = {name: i for i, name in enumerate(self.names)}
        self._checks = tuple(self._make_check(p) for p in self.params)
        self._fast = self._make_fast()

    @classmethod
    def from_abi(cls, kernel: str, records: list[dict], entry: str | None = None) -> EntrySignature:
        """From the entry's parameter records as meta.json keeps them ("params"). ``kernel``: the build name (the
        errors' kernel); ``entry``: the entry function's name (the messages say ``entry()``)."""
        return cls(kernel, [Param.from_abi(r) for r in records], entry)

    def __repr__(self) -> str:
        return f"EntrySignature({self.entry}: {', '.join(f'{p.c_type} {p.name}'.strip() for p in self.params)})"

    # -- binding ------------------------------------------------------------------------------------------------

    def bind(self, args: tuple = (), kwargs: dict | None = None) -> tuple:
        """The entry's positional arguments from ``args`` (in signature order) and ``kwargs`` (by name).

        Raises ArgumentError (a TypeError) naming the kernel and the parameter for a missing, extra, repeated or
        mistyped argument, and (a ValueError) for an integer outside its C type's range.
        """
        try:
            return self._fast(*args, **(kwargs or {}))
        except ArgumentError:
            raise
        except TypeError:  # Python's own binding failed: missing, extra or repeated; say which, by name
            return self._bind_slow(args, kwargs or {})

    def _make_fast(self):
        """A binder function generated once per kernel: Python binds the names (in C), each parameter is checked
        inline by type identity (``type(v) is int``, ``a.dtype is uint16``), and only an argument that fails the
        quick test goes through its full check (which accepts numpy scalars, subclasses and equal dtypes, and
        raises otherwise). NOTES: generic per-parameter closures with isinstance(v, numbers.Integral) cost ~45 us
        for a GEMM's 14 parameters on a loaded machine; this costs a few microseconds."""
        env: dict[str, object] = {"_dg_ndarray": np.ndarray, "_dg_int": int, "_dg_float": float, "_dg_bool": bool}
        lines = [f"def _dg_bind({', '.join(self.names)}):"]
        for i, p in enumerate(self.params):
            env[f"_dg_check{i}"] = self._checks[i]
            v = p.name
            if p.kind == "array":
                quick = [f"type({v}) is not _dg_ndarray"]
                if p.dtype:
                    env[f"_dg_dtype{i}"] = np.dtype(p.dtype)
                    quick.append(f"{v}.dtype is not _dg_dtype{i}")
                if p.ndim:
                    quick.append(f"{v}.ndim != {p.ndim}")
                test = " or ".join(quick)
            elif p.kind == "int":
                lo, hi = _INT_RANGES.get(p.dtype, _INT_RANGES["int64"])
                test = f"type({v}) is not _dg_int or {v} < {lo} or {v} > {hi}"
            else:
                test = f"type({v}) is not _dg_{p.kind}"
            lines.append(f"    if {test}:\n        {v} = _dg_check{i}({v})")
        lines.append(f"    return ({''.join(name + ', ' for name in self.names)})")
        if any(name.startswith("_dg_") for name in self.names):
            raise ValueError(f"kernel {self.kernel}: parameter names may not start with _dg_: {self.names}")
        exec(compile("\n".join(lines), f"<binder of {self.entry}>", "exec"), env)  # noqa: S102 - our own text
        return env["_dg_bind"]

    def _bind_slow(self, args: tuple, kwargs: dict) -> tuple:
        names = self.names
        if len(args) > len(names):
            raise self._error(f"takes {len(names)} arguments ({', '.join(names)}), got {len(args)} positional")
        values = list(args) + [_MISSING] * (len(names) - len(args))
        for key, value in kwargs.items():
            i = self._index.get(key)
            if i is None:
                raise self._error(f"has no parameter {key!r} (parameters: {', '.join(names)})")
            if i < len(args):
                raise self._error(f"got parameter {key!r} both by position and by name")
            values[i] = value
        missing = [name for name, v in zip(names, values, strict=True) if v is _MISSING]
        if missing:
            raise self._error(f"missing argument{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} "
                              f"(parameters: {', '.join(names)})")
        return tuple(check(v) for check, v in zip(self._checks, values, strict=True))

    def placeholders(self) -> dict[str, object]:
        """One argument per parameter with the numba type a real launch binds to (1-element arrays, 1, 1.0, False):
        for compiling the entry without data."""
        out: dict[str, object] = {}
        for p in self.params:
            if p.kind == "array":
                out[p.name] = np.zeros((1,) * max(p.ndim, 1), p.dtype or np.uint8)
            else:
                out[p.name] = {"int": 1, "float": 1.0, "bool": False}[p.kind]
        return out

    def _error(self, message: str) -> ArgumentError:
        return ArgumentError(f"{self.entry}() {message}", kernel=self.kernel)

    def _bad(self, param: Param, value: object, why: str = "") -> ArgumentError:
        decl = f" (`{param.c_type} {param.name}`)" if param.c_type else ""
        return self._error(f"argument {param.name!r}{decl} must be {param.describe()}, got {_got(value)}"
                           + (f": {why}" if why else ""))

    def _make_check(self, p: Param):
        # NOTES: one closure per parameter, built once per kernel: the per-launch cost is a call and two
        # attribute compares per argument.
        bad = self._bad
        if p.kind == "array":
            dtype, ndim = (np.dtype(p.dtype) if p.dtype else None), p.ndim

            def check_array(v):
                if not isinstance(v, np.ndarray):
                    raise bad(p, v)
                if dtype is not None and v.dtype != dtype:
                    raise bad(p, v, f"dtype {v.dtype} is not {dtype}")
                if ndim and v.ndim != ndim:
                    raise bad(p, v, f"{v.ndim} dimensions, not {ndim}")
                return v

            return check_array
        if p.kind == "int":
            lo, hi = _INT_RANGES.get(p.dtype, _INT_RANGES["int64"])

            def check_int(v):
                if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
                    raise bad(p, v)
                v = int(v)
                if not lo <= v <= hi:
                    raise bad(p, v, f"outside {p.dtype}'s range [{lo}, {hi}]")
                return v

            return check_int
        if p.kind == "float":

            def check_float(v):
                if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
                    raise bad(p, v)
                return float(v)

            return check_float

        def check_bool(v):
            if not isinstance(v, (bool, np.bool_)):
                raise bad(p, v)
            return bool(v)

        return check_bool


_MISSING = object()
