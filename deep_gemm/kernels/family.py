"""The kernel layer every family goes through: problem desc -> config -> template constants -> jit.build -> launch.

A family (fp8_gemm, bf16_gemm; grouped GEMMs, MQA logits, MoE next) is one KernelFamily: its name (the stem of its
template, its cache entries and its entry function), how a desc picks a config, and how desc + config (+ options
such as compiled_dims) become template constants. The launch binds arguments by name to the parameters the
template's entry declares (recorded with the cache entry; jit.EntrySignature). Importing this module imports
neither numba nor the JIT.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from .. import envs, runtime
from ..arch import ArchSpec

# Every family defined (name -> KernelFamily); tools and tests enumerate them.
FAMILIES: dict[str, KernelFamily] = {}


@dataclass(frozen=True)
class PreparedKernel:
    """What one problem resolves to: its desc, the chosen config, the template constants and the built kernel."""

    family: KernelFamily
    desc: Hashable
    config: Hashable
    constants: dict
    kernel: object  # deep_gemm.jit.CompiledKernel

    def launch(self, **args) -> None:
        """Run the kernel on ``args`` by parameter name; in dry-run mode (runtime.dry_run) compile it for their
        types instead (filling the caches, touching no array). Raises jit.ArgumentError (a TypeError) naming the
        parameter and kernel for a missing, extra or mistyped argument, before anything runs."""
        if runtime.get_dry_run():
            self.kernel.compile(**args)
        else:
            self.kernel(**args)

    def precompile(self) -> None:
        """Compile (or load from the cache) the kernel for the argument types a launch binds, without data."""
        self.kernel.compile()


class KernelFamily:
    """One kernel family: ``name`` (template ``templates/<name>.asc.j2`` unless ``template`` says otherwise, cache
    entries ``<name>.<digest>``), ``select_config(desc, arch) -> config`` (the heuristic), and
    ``template_constants(desc, config, arch, **options) -> dict`` (UPPER_CASE, NUM_AI_CORES included; raises for a
    config the chip could not hold). ``on_prepared(desc, config)`` runs once per newly prepared problem (e.g.
    DG_PRINT_CONFIGS). ``device_module``: the module whose intrinsics the template calls (None: deep_gemm.device).
    """

    def __init__(self, name: str, *, select_config: Callable[[Hashable, ArchSpec], Hashable],
                 template_constants: Callable[..., dict], template: str | None = None,
                 device_module: str | None = None, on_prepared: Callable[[Hashable, Hashable], None] | None = None):
        if not name.isidentifier():
            raise ValueError(f"kernel family name must be an identifier, got {name=!r}")
        if name in FAMILIES:
            raise ValueError(f"kernel family {name!r} is defined twice")
        self.name = name
        self.template = template or name
        self.select_config = select_config
        self.template_constants = template_constants
        self.device_module = device_module
        self.on_prepared = on_prepared
        self._prepared: dict[Hashable, PreparedKernel] = {}
        self._lock = threading.Lock()
        FAMILIES[name] = self

    def __repr__(self) -> str:
        return f"KernelFamily({self.name!r}, template={self.template!r})"

    def lookup(self, memo_key: Hashable) -> PreparedKernel | None:
        """The problem prepared earlier under ``memo_key`` (a launcher's plain tuple of its call's parameters: the
        dispatch fast path, no desc built), or None."""
        return self._prepared.get(memo_key)

    def prepare(self, desc: Hashable, *, arch: ArchSpec, config: Hashable | None = None, options: dict | None = None,
                memo_key: Hashable | None = None, sync_check: bool | None = None) -> PreparedKernel:
        """Resolve (memoized per problem) the config, the template constants and the built kernel of ``desc``.

        ``config`` overrides the heuristic (tests and benchmarks); ``options`` are extra keyword arguments of
        template_constants (e.g. compiled_dims); ``memo_key`` also files the result for lookup().
        """
        options = options or {}
        # NOTES: DG_SYNC_CHECK builds the checker's kernels (jit.build reads it): they are other kernels.
        sync_check = envs.DG_SYNC_CHECK.get() if sync_check is None else sync_check
        key = (desc, arch.name, config, tuple(sorted(options.items())), sync_check)
        prepared = self._prepared.get(key)
        if prepared is None:
            # Heavy imports only on the first call of a problem: the JIT (and, at build, numba).
            from .. import jit

            chosen = config if config is not None else self.select_config(desc, arch)
            constants = self.template_constants(desc, chosen, arch, **options)
            build_options = {"device_module": self.device_module} if self.device_module else {}
            kernel = jit.build(self.name, constants, template=self.template, **build_options)
            if self.on_prepared is not None:
                self.on_prepared(desc, chosen)
            with self._lock:
                prepared = self._prepared.setdefault(key, PreparedKernel(self, desc, chosen, constants, kernel))
        if memo_key is not None:
            self._prepared.setdefault(memo_key, prepared)
        return prepared

    def clear(self) -> None:
        """Forget the prepared problems (the JIT's caches are untouched). For tests and tools."""
        with self._lock:
            self._prepared.clear()
