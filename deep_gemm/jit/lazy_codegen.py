"""Machine code only for the functions that run: deep_gemm's device functions and a kernel's inner functions are
compiled to LLVM IR (and optimized) as numba always does, but turned into machine code only if something calls them
from Python. The kernel entries, which the launcher and the native library run, are compiled as before.

NOTES: numba compiles every jitted function into its own library: optimize the module, link in the optimized IR of
every callee, then hand the module to LLVM's MCJIT, which generates machine code for all of it (callees included)
right away, so that the function can be called from Python. A kernel entry links the IR of every device function
and inner kernel function it reaches and gets all their code in its own machine code; the machine code of those
callees' own libraries is never run (a kernel never calls a device function from Python, and the native library is
the entry's object code alone). That was a quarter to a third of a cold compile: 5.1 s of MCJIT code generation in
the first tf32_hc_prenorm_gemm of a process (16.5 s; 2.9 s of it for the kernel's entries and inner functions, which
repeat each other's code), 1.5 s of the first FP8 GEMM's (6 s).

How it is done (numba's private internals, installed only for the release they were read from, numba_internals_known;
DG_JIT_LAZY_CODEGEN=0 or DG_JIT_FAST_MATH_SETUP=0 leaves numba alone):
- ``CPUContext.get_executable`` (numba asks it for a Python-callable wrapper once a function is compiled) returns a
  ``LazyEntry`` for deep_gemm's functions (modules ``deep_gemm.*`` and generated kernel modules) other than kernel
  entries (``keep_eager``): the library is marked lazy and stays unfinalized.
- Finalizing a deferred library (when a caller links it) optimizes it as before but leaves it out of the execution
  engine; ``materialize`` adds it and generates its code when a pointer into it is first needed (numba's
  ``get_pointer_to_function``, a ``LazyEntry`` call).
- A ``LazyEntry`` is not registered in the dispatcher's C table (which needs a real compiled wrapper): a Python call
  of the function finds no match there, numba's slow path calls the ``LazyEntry``, which materializes the library,
  registers the real wrapper for the next calls and runs it.
- numba's disk cache stores a library as object code; a deferred library has none, so it is stored as LLVM bitcode
  (numba's own other format, which numba loads too) and loaded deferred again.
- A function's Environment pointer (which its code reads to box the values of an exception it raises) is set once a
  module defining its symbol reaches the engine: its own library, or a caller that linked its IR (_set_pending_envs).
- Nor do such functions get numba's two wrappers at compile time (the CPython wrapper a Python call goes through and
  the C wrapper of a first-class function pointer): numba lowers both into the function's library, so every caller
  linked, optimized and generated code for the wrappers of all its callees. They are built on first need, in a small
  library of their own that links the function's (``_wrapper_library``); what they need (numba's function and
  generator descriptors, whether the call releases the GIL, the NRT setting) is kept with the library and in numba's
  disk cache, under an index key of its own (``cache_tag``).
"""

from __future__ import annotations

import copy
import threading
import weakref

from .. import envs
from .numba_facts import KERNEL_MODULE_MARK, code_owner, numba_internals_known

_installed = False
_lock = threading.Lock()
_eager: set[tuple[str, str]] = set()  # (module, qualname) of the kernel entries: machine code at once
_pending_envs: dict[str, object] = {}  # environment symbol -> numba Environment, for libraries not generated yet
_originals: dict[str, object] = {}
stats = {"deferred": 0, "materialized": 0, "wrappers": 0}


def keep_eager(py_func) -> None:
    """Generate machine code for ``py_func`` (a kernel entry) as soon as it is compiled, as numba does."""
    _eager.add((py_func.__module__, py_func.__qualname__))


def _deferrable(fndesc) -> bool:
    module = fndesc.modname or ""
    if module.startswith("deep_gemm.") or KERNEL_MODULE_MARK in module:
        return (module, fndesc.qualname) not in _eager
    return False


class LazyEntry:
    """The Python-callable wrapper of a deferred function: generates its library's machine code on the first call
    (numba's real wrapper is then registered with each dispatcher that holds this entry)."""

    __slots__ = ("context", "library", "fndesc", "env", "real", "bound", "__weakref__")

    def __init__(self, context, library, fndesc, env):
        self.context, self.library, self.fndesc, self.env = context, library, fndesc, env
        self.real = None
        self.bound: list[tuple[object, list, bool]] = []  # (dispatcher, signature codes, object mode)

    def materialize(self):
        if self.real is None:
            from numba.core.compiler_lock import global_compiler_lock

            from .interrupt import HeldSigint

            with global_compiler_lock, HeldSigint():
                if self.real is None:
                    self.real = _originals["get_executable"](self.context, self.library, self.fndesc, self.env)
                    for dispatcher, sig, objectmode in self.bound:
                        dispatcher._insert(sig, self.real, objectmode)
                    self.bound = []
        return self.real

    def __call__(self, *args, **kwargs):
        return self.materialize()(*args, **kwargs)


def materialize(library) -> None:
    """Generate the machine code of a deferred library (no-op for any other); call with numba's compiler lock held."""
    if not getattr(library, "_dg_deferred", False):
        return
    from .interrupt import HeldSigint

    with HeldSigint():  # half done, the module would be in the engine but never generated
        library._codegen._add_module(library._final_module)
        library._finalize_specific()
        library._dg_deferred = False
        stats["materialized"] += 1
        _set_pending_envs(library._codegen)


def _set_pending_envs(codegen) -> None:
    """Point the environment globals that are now in the engine at their numba Environments.

    NOTES: a function's code reads its Environment through a global that numba sets once the code is generated
    (get_executable). A deferred function's global is in its own module and in each caller that linked its IR (a
    raise with runtime arguments reads it to box them); the first of these modules the engine gets defines the symbol
    every other one binds to, so it is set when that module arrives, whichever it is."""
    if not _pending_envs:
        return
    engine = codegen._engine
    for name in [name for name in _pending_envs if engine.is_symbol_defined(name)]:
        _originals["set_env"](codegen, name, _pending_envs.pop(name))


class WrapperRecipe:
    """What numba needs to build a deferred function's wrappers later: its descriptor and Environment (set when
    numba asks for the function's executable), the generator descriptor of a generator function, whether the CPython
    wrapper releases the GIL (``nogil``), whether the function's arrays are NRT-managed (how the wrapper boxes them)
    and which of the two wrappers numba would have built."""

    __slots__ = ("cpython", "cfunc", "release_gil", "gendesc", "nrt", "context", "fndesc", "env")

    def __init__(self, cpython=False, cfunc=False, release_gil=False, gendesc=None, nrt=True):
        self.cpython, self.cfunc, self.release_gil, self.gendesc = cpython, cfunc, release_gil, gendesc
        self.nrt = nrt
        self.context = self.fndesc = self.env = None

    def names(self) -> tuple[str, ...]:
        if self.fndesc is None:
            return ()
        out = []
        if self.cpython:
            out.append(self.fndesc.llvm_cpython_wrapper_name)
            if self.gendesc is not None:
                out.append(self.gendesc.llvm_cpython_wrapper_name)
        if self.cfunc:
            out.append(self.fndesc.llvm_cfunc_wrapper_name)
        return tuple(out)

    def state(self) -> tuple:
        """For numba's disk cache (pickled with the library): the descriptor without its typing maps, as numba
        stores a function's own."""
        gendesc = None
        if self.gendesc is not None:
            gendesc = copy.copy(self.gendesc)
            gendesc.typemap = gendesc.calltypes = None
        return (self.cpython, self.cfunc, self.release_gil, gendesc, self.nrt)


def _recipe(lower) -> WrapperRecipe:
    """The recipe of the library ``lower`` (numba's lowering of a deferred function) fills, created at its first
    wrapper with the NRT setting of the context the function compiles in."""
    recipe = getattr(lower.library, "_dg_wrappers", None)
    if recipe is None:
        recipe = lower.library._dg_wrappers = WrapperRecipe(nrt=bool(lower.context.enable_nrt))
    return recipe


def _create_cpython_wrapper(self, release_gil=False):
    if not _deferrable(self.fndesc):
        return _originals["create_cpython_wrapper"](self, release_gil)
    recipe = _recipe(self)
    recipe.cpython, recipe.release_gil = True, bool(release_gil)
    recipe.gendesc = self.genlower.gendesc if self.genlower else None
    return None


def _create_cfunc_wrapper(self):
    if not _deferrable(self.fndesc) or self.genlower:
        return _originals["create_cfunc_wrapper"](self)
    _recipe(self).cfunc = True
    return None


def _wrapper_library(library):
    """The library holding ``library``'s wrappers, built (and its machine code generated) on first use: numba's
    wrappers for the recorded function, linked with the function's own optimized IR."""
    wrappers = getattr(library, "_dg_wrapper_library", None)
    if wrappers is not None:
        return wrappers
    from numba.core.compiler_lock import global_compiler_lock

    from .interrupt import HeldSigint

    recipe = library._dg_wrappers
    context, fndesc, env = recipe.context, recipe.fndesc, recipe.env
    if context.enable_nrt != recipe.nrt:
        # NOTES: numba compiles a function in a sub-target of its flags (NRT on for nopython functions) but rebuilds
        # a cached one with the dispatcher's base context (NRT off): the wrappers box arrays as the function was
        # compiled, or a returned array would be boxed as a view of its (absent) parent object
        context = context.subtarget(enable_nrt=recipe.nrt)
    # NOTES: held SIGINT: a half-built wrapper library would stay attached to the function's library
    with global_compiler_lock, HeldSigint():
        wrappers = getattr(library, "_dg_wrapper_library", None)
        if wrappers is not None:
            return wrappers
        wrappers = library.codegen.create_library(f"{library.name}.wrappers")
        if recipe.cpython:
            if recipe.gendesc is not None:
                # boxing the generator a Python call returns reads its descriptor from the context (registered
                # when a generator is lowered; not after numba's disk cache loaded it)
                if fndesc.restype not in context._generators:
                    context.insert_generator(fndesc.restype, recipe.gendesc, (library,))
                context.create_cpython_wrapper(wrappers, recipe.gendesc, env, None, release_gil=recipe.release_gil)
            context.create_cpython_wrapper(wrappers, fndesc, env, None, release_gil=recipe.release_gil)
        if recipe.cfunc:
            context.create_cfunc_wrapper(wrappers, fndesc, env, None)
        wrappers.add_linking_library(library)
        wrappers.finalize()
        library._dg_wrapper_library = wrappers
        stats["wrappers"] += 1
        _set_pending_envs(library.codegen)
    return wrappers


def _get_executable(self, library, fndesc, env):
    recipe = getattr(library, "_dg_wrappers", None)
    if recipe is not None:  # compiled or loaded without its wrappers: what building them takes
        recipe.context, recipe.fndesc, recipe.env = self, fndesc, env
    if getattr(library, "_dg_lazy", False) or (not library._finalized and _deferrable(fndesc)):
        library._dg_lazy = True
        _pending_envs[self.get_env_name(fndesc)] = env
        return LazyEntry(self, library, fndesc, env)
    return _originals["get_executable"](self, library, fndesc, env)


def _finalize_final_module(self):
    if not getattr(self, "_dg_lazy", False):
        _originals["finalize_final_module"](self)
        _set_pending_envs(self._codegen)
        return None
    # numba's steps less the engine's: adding the module and generating its code wait for materialize()
    self._finalize_dynamic_globals()
    self._verify_declare_only_symbols()
    self._final_module._CPUCodeLibrary__library = weakref.proxy(self)  # for numba's object-cache hooks
    self._dg_deferred = True
    self._finalized = True
    stats["deferred"] += 1
    return None


def _get_pointer_to_function(self, name):
    self._ensure_finalized()
    recipe = getattr(self, "_dg_wrappers", None)
    if recipe is not None and name in recipe.names():
        return _wrapper_library(self).get_pointer_to_function(name)
    materialize(self)
    return _originals["get_pointer_to_function"](self, name)


def _add_overload(self, cres):
    entry = cres.entry_point
    if not isinstance(entry, LazyEntry) or entry.real is not None:
        return _originals["add_overload"](self, cres)
    args = tuple(cres.signature.args)
    entry.bound.append((self, [a._code for a in args], cres.objectmode))
    self.overloads[args] = cres
    return None


def _serialize_using_object_code(self):
    self._ensure_finalized()
    if getattr(self, "_dg_deferred", False):
        state = (self.name, "bitcode", self._final_module.as_bitcode())
    else:
        state = _originals["serialize_using_object_code"](self)
    recipe = getattr(self, "_dg_wrappers", None)
    # NOTES: a fourth item, the wrappers' recipe, which numba's own _unserialize would refuse: such entries are
    # filed under their own index key (numba_cache.py, cache_tag), so a process without this never reads them.
    return state if recipe is None else (*state, recipe.state())


def _unserialize(cls, codegen, state):
    recipe = None
    if len(state) == 4:
        *state, recipe = state
        state = tuple(state)
    name, kind, data = state
    if kind != "bitcode":
        library = _originals["unserialize"](cls, codegen, state)
    else:
        import llvmlite.binding as ll

        module = ll.parse_bitcode(data)
        library = codegen.create_library(name)
        library._dg_lazy = code_owner(module) is not None
        library._final_module = module
        library._finalize_final_module()
    if recipe is not None:
        library._dg_wrappers = WrapperRecipe(*recipe)
    return library


def cache_tag() -> str:
    """Part of numba's index key for deep_gemm's functions: what the cached libraries hold depends on it (deferred
    wrappers and bitcode when installed)."""
    return "lazy-wrappers-1" if _installed else ""


def _set_env(self, env_name, env):
    if not self._engine.is_symbol_defined(env_name):
        _pending_envs[env_name] = env  # set by materialize() once its library is generated
        return
    _originals["set_env"](self, env_name, env)


def install() -> bool:
    """Install the deferred code generation (idempotent); False when it is off or numba's internals differ."""
    global _installed
    with _lock:
        if _installed:
            return True
        if not envs.DG_JIT_LAZY_CODEGEN.get() or not numba_internals_known():
            return False
        from numba.core import codegen, cpu, dispatcher, lowering

        targets = {
            "get_executable": (cpu.CPUContext, "get_executable", _get_executable),
            "finalize_final_module": (codegen.CPUCodeLibrary, "_finalize_final_module", _finalize_final_module),
            "get_pointer_to_function": (codegen.JITCodeLibrary, "get_pointer_to_function", _get_pointer_to_function),
            "add_overload": (dispatcher._DispatcherBase, "add_overload", _add_overload),
            "serialize_using_object_code": (codegen.CPUCodeLibrary, "serialize_using_object_code",
                                            _serialize_using_object_code),
            "unserialize": (codegen.CPUCodeLibrary, "_unserialize", classmethod(_unserialize)),
            "set_env": (codegen.JITCPUCodegen, "set_env", _set_env),
            "create_cpython_wrapper": (lowering.BaseLower, "create_cpython_wrapper", _create_cpython_wrapper),
            "create_cfunc_wrapper": (lowering.BaseLower, "create_cfunc_wrapper", _create_cfunc_wrapper),
        }
        for key, (cls, attr, _) in targets.items():
            original = cls.__dict__.get(attr)
            if original is None:
                return False
            _originals[key] = original.__func__ if isinstance(original, classmethod) else original
        for cls, attr, replacement in targets.values():
            setattr(cls, attr, replacement)
        _installed = True
        return True
