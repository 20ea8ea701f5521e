"""Mixed (Cube + Vector) kernels, grid barriers and the synchronisation checker: how the entry of a kernel that uses
``ASCEND_IS_AIC`` / ``ASCEND_IS_AIV``, ``GetSubBlockIdx()``, ``CrossCoreSetFlag`` / ``CrossCoreWaitFlag``,
``UBTensor`` or ``SyncAll()`` is emitted, and the checker's versions of SetFlag / WaitFlag / PipeBarrier.

A mixed kernel's body runs on three sub-cores per logical core (AIC = 0, AIV0 = 1, AIV1 = 2): it becomes a numba
generator ``_<entry>_subcore[_p<i>](core, sub, cross-core state, params)`` in which a CrossCoreWaitFlag is
``while not <flag ready>: yield 1``. ``_<entry>_core[_p<i>](core, params)`` holds the three generators in locals,
resumes them round-robin until all finish, and raises KernelDeadlockError (kernel, core, sub-core, flag id, line)
when a whole round passes with every live sub-core waiting and no flag set. No CPU thread spins or blocks.
``SyncAll()`` may stand only at the top level of the entry body: it splits the kernel into phases, each launched
over all cores (``<entry>_p<i>``, in order); state crosses a SyncAll() only through GM.
With DG_SYNC_CHECK the SetFlag / WaitFlag / PipeBarrier calls (also inside helpers) record into per-sub-core state
that is checked when the core ends (device/synccheck.py).
"""

from __future__ import annotations

import functools

import numpy as np
from tree_sitter import Node

from .. import enums
from ..errors import TranslateError
from .ctype import BOOL, UNKNOWN, VOID, CType, Expr, int_value
from .emitter import CANCEL, CORES, POOL

# Hidden names of the generated code (template identifiers may not start with _dg)
SUB = "_dg_sub"
CROSS = "_dg_xflags, _dg_xlines, _dg_xinfo, _dg_ub"
CHECK = "_dg_pe, _dg_chk"
LOCAL = "_dg_local"  # the sub-cores' local memory (L1, L0A/L0B, L0C, their AllocTensor buffers): uint8 [3, bytes]
LOCAL_ALIGN = 64
LOCAL_PAGE, LOCAL_COLOUR = 4096, 17 * LOCAL_ALIGN
# Device functions a constant AllocTensor size may call (plain arithmetic in Python too: their py_func is evaluated)
LOCAL_SIZE_HELPERS = ("l0a_size", "l0b_size")
MIXED_BUILTINS = ("GetSubBlockIdx", "CrossCoreSetFlag", "CrossCoreWaitFlag", "UBTensor")
MIXED_IDENTIFIERS = {"ASCENDISAIC": f"({SUB} == 0)", "ASCENDISAIV": f"({SUB} != 0)"}
SYNC_CALLS = ("SetFlag", "WaitFlag", "PipeBarrier")
DEFAULT_UB_BYTES = 253952


@functools.cache
def _local_size_helpers() -> dict[str, object]:
    """LOCAL_SIZE_HELPERS as plain Python (their py_func) for the translator's constant evaluation."""
    from ...device import cube

    return {name: getattr(cube, name).py_func for name in LOCAL_SIZE_HELPERS}


class MixedKernels:
    """Mixin of Translator: mixed-kernel builtins, SyncAll phases, the checker's sync calls, the mixed entry."""

    sync_check: bool = False
    local_bytes: int = 0  # the current phase's local memory per sub-core (local_allocation)
    local_count: int = 0  # its buffers so far
    subcore_generator: bool = True  # the current phase's sub-cores wait on flags: a generator each (else a function)

    # -- analysis ---------------------------------------------------------------------------------------------

    def analyse_mixed(self) -> None:
        """Decide, before emitting, whether the entry is mixed, how it splits at SyncAll(), which helpers need the
        checker's state (check mode)."""
        entry = self.entry
        body = entry.node.child_by_field_name("body")
        called = self.callees(body)
        idents = self.identifiers_in(body)
        self.is_mixed = bool(called & set(MIXED_BUILTINS) or idents & set(MIXED_IDENTIFIERS))
        for sig in self.functions.values():
            if sig.is_entry:
                continue
            inner = self.callees(sig.node) & (set(MIXED_BUILTINS) | {"SyncAll"})
            if inner or self.identifiers_in(sig.node) & set(MIXED_IDENTIFIERS):
                what = sorted(inner)[0] if inner else "ASCEND_IS_AIC / ASCEND_IS_AIV"
                raise self.error(sig.node.child_by_field_name("declarator"),
                                 f"{what} is available in the kernel entry only (helpers run inside one sub-core; "
                                 "pass GetSubBlockIdx() and UB tensors as arguments)")
        self.phases = self.split_phases(body)
        # Helpers that (transitively) call SetFlag / WaitFlag / PipeBarrier get the checker's state in check mode
        calls = {name: self.callees(sig.node) for name, sig in self.functions.items() if not sig.is_entry}
        sync = {name for name, c in calls.items() if c & set(SYNC_CALLS)}
        changed = True
        while changed:
            new = {name for name, c in calls.items() if c & sync} - sync
            sync |= new
            changed = bool(new)
        self.sync_helpers = sync if self.sync_check else set()
        self.sync_lines: set[int] = set()
        self.phase_dead: dict[str, int] = {}

    def identifiers_in(self, node: Node) -> set[str]:
        out, stack = set(), [node]
        while stack:
            n = stack.pop()
            if n.type == "identifier":
                out.add(self.text(n))
            stack.extend(n.children)
        return out

    def split_phases(self, body: Node) -> list[list[Node]]:
        """The entry body's statements split at top-level `SyncAll();` statements (one list per phase)."""
        phases: list[list[Node]] = [[]]
        for child in body.named_children:
            if self.is_sync_all_statement(child):
                phases.append([])
            else:
                phases[-1].append(child)
        for phase in phases[:-1]:
            for stmt in phase:
                if self.contains(stmt, "return_statement"):
                    raise self.error(stmt, "a return before SyncAll() would leave the other cores waiting at the "
                                           "barrier; restructure with if/else")
        return phases

    def is_sync_all_statement(self, node: Node) -> bool:
        if node.type != "expression_statement" or not node.named_children:
            return False
        call = node.named_children[0]
        if call.type != "call_expression":
            return False
        fn = call.child_by_field_name("function")
        if fn.type == "template_function":
            fn = fn.child_by_field_name("name")
        return fn.type == "identifier" and self.text(fn) == "SyncAll"

    # -- names and builtins -----------------------------------------------------------------------------------

    def in_subcore(self) -> bool:
        return self.func is not None and self.func.sig.is_entry and self.is_mixed

    def local_allocation(self, dims: list[str], np_type: str, node: Node) -> Expr | None:
        """``AllocTensor<T>(dims)`` in a sub-core body whose sizes are compile-time constants: a view of the
        sub-core's row of the launch thread's local memory (crosscore.local_tensor: borrowed, no reference count),
        at an offset fixed here (64-byte aligned, declaration order); None when a size is known only at run time.

        NOTES: an np.empty per buffer made every view of it counted (numba increments the buffer's count
        atomically for each view: per MAD in an AIC's loops, 13% of a small HC pre-norm call) and allocated per
        logical core; a borrowed view of an owner kept alive in the generator (borrowed_allocation, still the form of
        run-time sizes) grew its state: the HC kernel's cold compile took 0.2-0.3 s longer."""
        sizes = []
        for code in dims:
            try:
                value = self.evaluate(code, node, "AllocTensor size", _local_size_helpers())
            except TranslateError:
                return None
            if not isinstance(value, (int, np.integer)) or value < 0:
                return None
            sizes.append(int(value))
        # NOTES: each buffer also starts at its own offset within a 4 KiB page (a colour of LOCAL_COLOUR bytes per
        # buffer): laid end to end, power-of-two buffers shared their low 12 address bits, and the Cube's loads from
        # L0A and L0B and FlashMLA's L1 tiles aliased (4K aliasing, the same L1D sets): its prefill ran 8% slower.
        base = -(-self.local_bytes // LOCAL_ALIGN) * LOCAL_ALIGN
        offset = base + (self.local_count * LOCAL_COLOUR - base) % LOCAL_PAGE
        self.local_count += 1
        self.local_bytes = offset + int(np.prod(sizes)) * np.dtype(np_type).itemsize
        self.used_runtime.add("local_tensor")
        shape = ", ".join(f"np.int64({n})" for n in sizes)
        return Expr(f"local_tensor({LOCAL}, {SUB}, np.int64({offset}), ({shape},), np.{np_type})",
                    CType("array", np_type, len(sizes)))

    def has_check_state(self) -> bool:
        return self.sync_check and self.func is not None and (
            self.func.sig.is_entry or self.func.sig.name in self.sync_helpers)

    def mixed_identifier(self, node: Node) -> Expr:
        name = self.text(node)
        if name in MIXED_IDENTIFIERS:
            if not self.in_subcore():
                raise self.error(node, "ASCEND_IS_AIC / ASCEND_IS_AIV are available in the kernel entry only")
            return Expr(MIXED_IDENTIFIERS[name], BOOL)
        if self.lookup_local(name) is None and name in self.phase_dead and self.func is not None \
                and self.func.sig.is_entry:
            raise self.error(node, f"{name!r} was declared before SyncAll() (line {self.phase_dead[name]}); state "
                                   "crosses SyncAll() only through GM (recompute it or store it in a GM tensor)")
        return self.identifier(node)

    def call_sub_block_idx(self, node: Node, template_args) -> Expr:
        if self.call_args(node) or template_args:
            raise self.error(node, "GetSubBlockIdx() takes no arguments")
        if not self.in_subcore():
            raise self.error(node, "GetSubBlockIdx() is available in the kernel entry only; pass it to helpers")
        # NOTES: 0 on the AIC, as on the chip; 0 / 1 on AIV0 / AIV1.
        return Expr(f"max({SUB} - 1, 0)", int_value("int64", 0, 1))  # Ascend C: int64_t GetSubBlockIdx()

    def constant_template_arg(self, node: Node, what: str) -> int:
        code = self.template_argument(node)
        value = self.evaluate(code, node, what)
        return int(value)

    def call_cross_set(self, node: Node, template_args) -> Expr:
        args = self.call_args(node)
        if len(args) != 1 or len(template_args) not in (1, 2):
            raise self.error(node, "CrossCoreSetFlag<mode, pipe>(flag_id) takes a mode, a pipe and one flag id")
        if not self.in_subcore():
            raise self.error(node, "CrossCoreSetFlag is available in the kernel entry only")
        mode = self.constant_template_arg(template_args[0], "the CrossCoreSetFlag mode")
        if mode not in (1, 2):
            raise self.error(template_args[0], f"CrossCoreSetFlag mode {mode} is not supported: 1 (the two AIVs of "
                                               "a core) or 2 (AIC <-> AIVs); use SyncAll() across cores")
        if len(template_args) == 2:
            pipe = self.constant_template_arg(template_args[1], "the CrossCoreSetFlag pipe")
            if pipe not in enums.BARE.values():
                raise self.error(template_args[1], f"unknown pipe {pipe}")
        self.check_flag_id_constant(node, args[0], 16)
        self.used_runtime.add("cross_core_set")
        return Expr(f"cross_core_set({CROSS.rsplit(', ', 1)[0]}, {SUB}, np.int64({mode}), "
                    f"{self.runtime_int_arg(args[0].code)}, np.int64({self.sync_line(node)}))", VOID)

    def call_cross_wait(self, node: Node, template_args) -> Expr:
        args = self.call_args(node)
        if len(args) != 1:
            raise self.error(node, "CrossCoreWaitFlag(flag_id) takes one flag id")
        if not self.in_subcore():
            raise self.error(node, "CrossCoreWaitFlag is available in the kernel entry only")
        if node.parent is None or node.parent.type != "expression_statement":
            raise self.error(node, "CrossCoreWaitFlag(...) must be a statement of its own")
        self.check_flag_id_constant(node, args[0], 16)
        self.used_runtime.add("cross_core_try_wait")
        flags = "_dg_xflags, _dg_xinfo"
        # NOTES: the scheduler resumes this sub-core after other sub-cores ran; the loop re-tests the flag.
        self.emit(f"while not cross_core_try_wait({flags}, {SUB}, {self.runtime_int_arg(args[0].code)}, "
                  f"np.int64({self.sync_line(node)})):", node)
        self.indent += 1
        self.emit("yield 1", node)
        self.indent -= 1
        return Expr("pass", VOID)

    def check_flag_id_constant(self, node: Node, arg: Expr, limit: int) -> None:
        value = self.try_evaluate(arg.code)
        if isinstance(value, int) and not 0 <= value < limit:
            raise self.error(node, f"flag id {value} is out of range 0..{limit - 1}")

    def call_ub_tensor(self, node: Node, template_args) -> Expr:
        args = self.call_args(node)
        if len(template_args) != 1 or len(args) != 4:
            raise self.error(node, "UBTensor<T>(aiv, byte_offset, rows, cols)")
        if not self.in_subcore():
            raise self.error(node, "UBTensor is available in the kernel entry of a mixed kernel only")
        inner = template_args[0].child_by_field_name("type") if template_args[0].type == "type_descriptor" \
            else template_args[0]
        elem = self.type_of(inner, node)
        if elem.kind not in ("int", "float", "bool"):
            raise self.error(node, "UBTensor needs a scalar element type")
        self.used_runtime.add("ub_tensor")
        codes = ", ".join(self.runtime_int_arg(a.code) for a in args)
        return Expr(f"ub_tensor(_dg_ub, _dg_xinfo, {codes}, np.{elem.np})", CType("array", elem.np, 2))

    def call_sync_all(self, node: Node, template_args) -> Expr:
        raise self.error(node, "SyncAll() may stand only at the top level of the kernel entry body (the stand-in "
                               "runs the code between SyncAll()s as one launch over all cores)")

    def call_sync(self, node: Node, template_args) -> Expr:
        """SetFlag / WaitFlag / PipeBarrier: the device no-ops, or the checker's recording calls."""
        fn = node.child_by_field_name("function")
        while fn.type in ("qualified_identifier", "template_function"):
            fn = fn.child_by_field_name("name")
        name = self.text(fn)
        args = self.call_args(node)
        leading = [self.template_argument(t) for t in template_args]
        codes = [self.runtime_int_arg(code) for code in leading] + [self.runtime_int_arg(a.code) for a in args]
        if not self.has_check_state():
            if name not in self.device_exports:
                raise self.error(node, f"unknown function {name!r}")
            self.used_device.add(name)
            return Expr(f"{name}({', '.join(codes)})", UNKNOWN)
        line = f"np.int64({self.sync_line(node)})"
        if name == "PipeBarrier":
            if len(codes) != 1:
                raise self.error(node, "PipeBarrier<PIPE_X>() takes one pipe")
            self.used_check.add("check_pipe_barrier")
            return Expr(f"check_pipe_barrier(_dg_chk, {codes[0]}, {line}, {SUB})", VOID)
        if len(codes) != 2:
            raise self.error(node, f"{name}<HardEvent::X>(event_id) takes one event and one id")
        fn_name = "check_set_flag" if name == "SetFlag" else "check_wait_flag"
        self.used_check.add(fn_name)
        return Expr(f"{fn_name}({CHECK}, {codes[0]}, {codes[1]}, {line}, {SUB})", VOID)

    def sync_line(self, node: Node) -> int:
        """The kernel.asc line of a synchronisation call, remembered so errors can also name its template line."""
        line = self.line(node)
        self.sync_lines.add(line)
        return line

    def hidden_params(self, sig) -> list[str]:
        """Extra leading parameters of a helper in check mode (the caller's checker state)."""
        if sig.name in self.sync_helpers:
            return ["_dg_pe", "_dg_chk", SUB]
        return []

    def mixed_return(self, node: Node) -> None:
        if self.in_subcore():
            if [c for c in node.named_children if c.type != "comment"]:
                raise self.error(node, "the kernel entry returns no value")
            if self.subcore_generator:
                self.emit("yield 0", node)  # finished: the scheduler never resumes it
            self.emit("return", node)
            return
        self.return_statement(node)

    # -- emission ---------------------------------------------------------------------------------------------

    def needs_mixed_entry(self) -> bool:
        return self.is_mixed or len(self.phases) > 1 or self.sync_check

    def emit_mixed_entry(self, sig, node: Node) -> None:
        """The entry of a mixed / phased / checked kernel: per phase a per-core function (a plain core body, or the
        sub-core generator plus its scheduler) and a launch loop; the prange launcher runs the phases in order."""
        params = [name for name, _ in sig.params]
        args = [f"np.{ctype.np}({name})" if ctype.kind == "float" else name for name, ctype in sig.params]
        self.kernel_label_used = True
        phase_names = []
        phase_local = []
        for index, phase in enumerate(self.phases):
            suffix = f"_p{index}" if len(self.phases) > 1 else ""
            self.func.scopes = [self.func.scopes[0]]
            self.func.const_values = {}
            if self.is_mixed:
                self.emit_subcore(sig, node, phase, suffix, params)
                self.emit_scheduler(sig, node, suffix, params)
                phase_local.append(self.local_bytes)
            else:
                self.emit_plain_core(sig, node, phase, suffix, params)
            for name, sym in list(self.func.scopes[0].items()):
                if name not in params:
                    self.phase_dead[name] = sym.line
                    del self.func.scopes[0][name]
            # the launch loop of this phase (the launcher's entry ABI)
            entry = f"{sig.name}{suffix}"
            phase_names.append(entry)
            self.emit("", None)
            self.emit("@njit(nogil=True, cache=True)", node)
            self.emit(f"def {entry}({', '.join([*params, *self.entry_hidden_params(), CORES])}):", node)
            self.indent += 1
            core_args = ["_block_idx", *args]
            if self.is_mixed:
                # NOTES: one cross-core state per thread of a launch, reused (reset) by each core it claims: a fresh
                # UB per core (2 x UB_BYTES, above glibc's mmap threshold) page-faulted in every call, ~0.3 ms a core;
                # and kept across launches in the caller's pool (a new one per launch zeroed both UBs every time)
                self.emit(f"{CROSS} = cross_state_from_pool({POOL}, claim_slot({CORES}), {self.ub_bytes()})", node)
                self.emit(self.local_memory(self.local_bytes), node)
                core_args = ["_block_idx", CROSS, LOCAL, CANCEL, *args]
            self.emit_claim_loop(f"_{sig.name}_core{suffix}({', '.join(core_args)})", node)
            self.indent -= 1
        self.phase_entries = phase_names
        self.emit("", None)
        self.emit("@njit(parallel=True, cache=True)", node)
        self.emit(f"def {sig.name}_prange({', '.join([*params, *self.entry_hidden_params()])}):", node)
        self.indent += 1
        for index in range(len(self.phases)):
            suffix = f"_p{index}" if len(self.phases) > 1 else ""
            self.emit(f"for _block_idx in prange(NUM_AI_CORES):  # phase {index}", node)
            self.indent += 1
            core_args = ["np.int64(_block_idx)", *args]
            if self.is_mixed:
                self.emit(f"{CROSS} = new_cross_state({self.ub_bytes()})", node)
                self.emit(self.local_memory(phase_local[index]), node)
                core_args = ["np.int64(_block_idx)", CROSS, LOCAL, CANCEL, *args]
            self.emit(f"_{sig.name}_core{suffix}({', '.join(core_args)})", node)
            self.indent -= 1
        self.indent -= 1

    @staticmethod
    def local_memory(nbytes: int) -> str:
        """The statement that allocates the sub-cores' local memory of a launch thread (one row per sub-core, each
        row holding every local_allocation of the phase; not zeroed, as AllocTensor's memory is not)."""
        row = max(-(-nbytes // LOCAL_ALIGN) * LOCAL_ALIGN, LOCAL_ALIGN)
        return f"{LOCAL} = np.empty((3, {row}), np.uint8)"

    def emit_body(self, stmts: list[Node], node: Node) -> None:
        self.indent += 1
        before = len(self.lines)
        self.statements(stmts)
        self.close_owners()  # the body's top-level allocations
        if not any(ind == self.indent and not t.startswith("#") for ind, t, _ in self.lines[before:]):
            self.emit("pass", node)
        self.indent -= 1

    def emit_plain_core(self, sig, node: Node, stmts: list[Node], suffix: str, params: list[str]) -> None:
        """One core of a plain kernel (no sub-cores): the body, then in check mode the end-of-core check."""
        self.emit("", None)
        self.emit('@njit(inline="always")', node)
        self.emit(f"def _{sig.name}_body{suffix}({', '.join(['_block_idx', *self.check_params(), SUB, *params])}):",
                  node)
        self.emit_body(stmts, node)
        self.emit("", None)
        self.emit("@njit(cache=True)", node)
        self.emit(f"def _{sig.name}_core{suffix}({', '.join(['_block_idx', *params])}):", node)
        self.indent += 1
        if self.sync_check:
            self.emit("_dg_pe, _dg_chk = new_check_state()", node)
        self.emit(f"_{sig.name}_body{suffix}({', '.join(['_block_idx', *self.check_params(), '0', *params])})", node)
        if self.sync_check:
            self.emit("check_end(_dg_pe, _dg_chk, 0)", node)
            self.emit_raise_findings()
            self.used_check.update({"new_check_state", "check_end"})
        self.indent -= 1

    def check_params(self, sub: str = "") -> list[str]:
        """The checker's state parameters (CHECK; the scheduler's of sub-core ``sub``), none without DG_SYNC_CHECK.

        NOTES: the state was made for every core of every launch, checked or not: six zeroed arrays per logical core
        of a mixed kernel, in its fixed cost, and two more arguments every sub-core generator keeps."""
        return [f"{name}{sub}" for name in CHECK.split(", ")] if self.sync_check else []

    def emit_subcore(self, sig, node: Node, stmts: list[Node], suffix: str, params: list[str]) -> None:
        """The phase's sub-core body: a generator when it waits on a cross-core flag, else a plain function (its
        sub-cores then run one after another, which is what the round-robin did: without a wait a sub-core runs to
        its end at once; a generator costs numba far more to compile and to resume)."""
        self.emit("", None)
        self.subcore_generator = any(self.calls_named(stmt, "CrossCoreWaitFlag") for stmt in stmts)
        # NOTES: the sub-core generator is not cached on disk. numba lowers a call to a generator only with the
        # generator compiled in the same process: loaded from its cache, a caller that still has to compile fails
        # (KeyError naming the generator type). A process that found the generator's cache entry but not its
        # caller's (another process still compiling the same kernel, or a compile interrupted between the two
        # writes) failed that way, every time. Cached callers carry the generator's code, so nothing is lost.
        self.emit(f"@njit(cache={not self.subcore_generator})", node)
        signature = ['_block_idx', SUB, CROSS, LOCAL, *self.check_params(), *params]
        self.emit(f"def _{sig.name}_subcore{suffix}({', '.join(signature)}):", node)
        self.local_bytes = self.local_count = 0
        self.emit_body(stmts, node)
        if self.subcore_generator:
            self.indent += 1
            self.emit("yield 0", node)
            self.indent -= 1

    def entry_hidden_params(self) -> list[str]:
        """The hidden parameters the kernel's caller adds (jit/compiled_kernel.py): the cross-core state pool of a
        mixed kernel (the prange launcher ignores it), then the cancel flag."""
        return [POOL, CANCEL] if self.is_mixed else [CANCEL]

    def ub_bytes(self) -> int:
        """One AIV's UB bytes: the kernel's UB_BYTES constant, else the default."""
        return int(self.module_values.get("UB_BYTES", DEFAULT_UB_BYTES))

    def emit_scheduler(self, sig, node: Node, suffix: str, params: list[str]) -> None:
        self.emit("", None)
        self.emit("@njit(cache=True)", node)
        self.emit(f"def _{sig.name}_core{suffix}({', '.join(['_block_idx', CROSS, LOCAL, CANCEL, *params])}):", node)
        self.indent += 1
        self.emit("# The AIC and the two AIVs of this core: generators resumed round-robin until all finish (run one",
                  None)
        self.emit("# after another when the phase has no cross-core wait). The", None)
        self.emit("# cross-core state (flags, UB) comes from the launch loop, reset here: each core starts afresh",
                  None)
        self.emit(f"reset_cross_state({CROSS})", node)
        if self.sync_check:
            for s in range(3):
                self.emit(f"{', '.join(self.check_params(str(s)))} = new_check_state()", node)
        # NOTES: the generators get borrowed views of every array (crosscore.borrow: numba never releases what a
        # generator captured); this function holds the real references until its sub-cores have finished.
        arrays = {name for name, ctype in sig.params if ctype.kind == "array"}
        arrays |= set(CROSS.split(", ")) | {LOCAL} | {name for s in range(3) for name in self.check_params(str(s))}
        for name in sorted(arrays):
            self.emit(f"_dg_b{name} = borrow({name})", node)
        lent = lambda names: [f"_dg_b{n}" if n in arrays else n for n in names]  # noqa: E731
        # NOTES: the sub-core index goes in as a plain int64 (np.int64(s)), not a literal: numba compiles a function
        # once per literal argument, so literal 0, 1, 2 compiled the sub-core generator (the bulk of a mixed kernel)
        # three times; one compile serves all three, ASCENDISAIC / ASCENDISAIV becoming runtime tests of _dg_sub.
        calls = []
        for s in range(3):
            names = ['_block_idx', f'np.int64({s})', *CROSS.split(", "), LOCAL, *self.check_params(str(s)), *params]
            calls.append(f"_{sig.name}_subcore{suffix}({', '.join(lent(names))})")
        self.used_runtime.update({"new_cross_state", "reset_cross_state", "borrow", "cross_state_from_pool"})
        if not self.subcore_generator:
            for call in calls:
                self.emit(f"if cancel_requested({CANCEL}):", node)
                self.emit("    return", node)
                self.emit(call, node)
            self.emit_scheduler_check_end(node)
            self.indent -= 1
            return
        for s, call in enumerate(calls):
            self.emit(f"_dg_g{s} = {call}", node)
        self.emit("_dg_live0 = True", node)
        self.emit("_dg_live1 = True", node)
        self.emit("_dg_live2 = True", node)
        self.emit("while _dg_live0 or _dg_live1 or _dg_live2:", node)
        self.indent += 1
        # NOTES: a cancelled launch abandons the core between rounds (its sub-cores stopped at waits); its outputs
        # are discarded by the caller (deep_gemm.api.guard).
        self.emit(f"if cancel_requested({CANCEL}):", node)
        self.emit("    return", node)
        self.emit("_dg_sets = _dg_xinfo[0]", node)
        self.emit("_dg_waiting = 0", node)
        for s in range(3):
            self.emit(f"if _dg_live{s}:", node)
            self.indent += 1
            self.emit(f"if next(_dg_g{s}) == 0:", node)
            self.emit(f"    _dg_live{s} = False", node)
            self.emit("else:", node)
            self.emit("    _dg_waiting += 1", node)
            self.indent -= 1
        self.emit("if _dg_waiting > 0 and _dg_waiting == _dg_live0 + _dg_live1 + _dg_live2 and "
                  "_dg_xinfo[0] == _dg_sets:", node)
        self.indent += 1
        self.emit("# every live sub-core waits and no flag was set this round: no wait can ever return", None)
        self.emit("_dg_who = 0 if _dg_live0 else (1 if _dg_live1 else 2)", node)
        self.emit("raise KernelDeadlockError(_DG_KERNEL, _block_idx, _dg_who, _dg_xinfo[1 + 2 * _dg_who], "
                  "_dg_xinfo[2 + 2 * _dg_who], _dg_waiting, _DG_MODULE)", node)
        self.indent -= 2
        self.used_runtime.add("KernelDeadlockError")
        self.emit_scheduler_check_end(node)
        self.indent -= 1

    def emit_scheduler_check_end(self, node: Node) -> None:
        """In check mode, the end of a core: each sub-core's findings, then the cross-core flags'."""
        if self.sync_check:
            self.used_check.add("new_check_state")
            self.emit("_dg_chk = np.zeros(_dg_chk0.size, np.int64)", node)
            for s in range(3):
                self.emit(f"check_end(_dg_pe{s}, _dg_chk{s}, {s})", node)
                self.emit(f"merge_findings(_dg_chk, _dg_chk{s})", node)
            self.emit("check_cross_end(_dg_xflags, _dg_xlines, _dg_chk)", node)
            self.emit_raise_findings()
            self.used_check.update({"check_end", "merge_findings", "check_cross_end"})

    def emit_raise_findings(self) -> None:
        self.emit("if _dg_chk[0] > 0:", None)
        self.emit("    raise SyncCheckError(_DG_KERNEL, _block_idx, _dg_chk[5], _dg_chk[1], _dg_chk[2], _dg_chk[3], "
                  "_dg_chk[4], _dg_chk[0], _DG_MODULE)", None)
        self.used_check.add("SyncCheckError")

    def mixed_header(self) -> list[str]:
        """Imports and constants the mixed / checked entry uses (added to the module header)."""
        out = []
        if self.used_runtime:
            out.append(f"from deep_gemm.device.crosscore import {', '.join(sorted(self.used_runtime))}  "
                       "# noqa: E402")
        if self.used_check:
            out.append(f"from deep_gemm.device.synccheck import {', '.join(sorted(self.used_check))}  # noqa: E402")
        if getattr(self, "kernel_label_used", False):
            out.append(f"_DG_KERNEL = {self.entry.name + ' (' + self.template + ')'!r}")
            out.append("_DG_MODULE = __name__")
            # NOTES: where each synchronisation call of kernel.asc came from in the templates, for the messages of
            # KernelDeadlockError / SyncCheckError (plain Python: numba code never reads it).
            where = {}
            for line in sorted(self.sync_lines):
                if self.line_map is not None and line <= len(self.line_map.lines):
                    file, template_line = self.line_map.lines[line - 1]
                    where[line] = f"{file}:{template_line}"
            out.append(f"_DG_WHERE = {where!r}")
        return out
