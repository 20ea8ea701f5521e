"""``estimate_mega_moe``: the modelled Ascend 950 time per rank of one ``fp8_fp4_mega_moe`` call (no NPU needed), its
parts and what binds it, and the vendor's published EP8 rows beside it. The model is heuristics/mega_moe.py's.

``python -m deep_gemm.estimate.mega_moe E H I T [--topk 6 --shared 1 --ranks 8]`` prints one estimate;
``--published`` prints the published rows with their errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..arch import ArchSpec
from ..heuristics.mega_moe import MegaMoeDesc, check_mega_moe_desc, model_mega_moe
from ._target import check_size, resolve_target
from .published import PublishedCheck


@dataclass(frozen=True)
class MegaMoeEstimate:
    """Modelled (not measured) time per rank of one mega MoE call; ``*_us`` are busy times (``gemm_us`` the AIC's four
    GEMM phases, ``link_us`` the pull + push over the UB link, ``aiv1_us`` the epilogue + combine vector work; these
    overlap), ``prologue_us`` / ``tail_us`` the exposed ends. ``tflops`` counts the vendor's way:
    2 * T * (K + S) * H * I * 3 over the time."""

    num_experts: int
    hidden: int
    intermediate_hidden: int
    num_tokens: int
    num_topk: int
    num_shared_experts: int
    num_ranks: int
    arch: str
    num_ai_cores: int
    time_us: float
    tflops: float
    bound: str
    gemm_us: float
    phases_us: tuple[tuple[str, float], ...]
    link_us: float
    pull_us: float
    push_us: float
    aiv1_us: float
    prologue_us: float
    tail_us: float
    launch_us: float
    weight_bytes: int
    routed_rows_per_expert: int

    def __str__(self) -> str:
        phases = ", ".join(f"{name} {us:.1f}" for name, us in self.phases_us)
        return "\n".join([
            f"modelled Ascend {self.arch} ({self.num_ai_cores} AI cores) per rank, "
            f"fp8_fp4_mega_moe EP{self.num_ranks}: "
            f"E={self.num_experts} H={self.hidden} I={self.intermediate_hidden} T={self.num_tokens} "
            f"top-{self.num_topk} + {self.num_shared_experts} shared",
            f"  time {self.time_us:.1f} us (modelled), {self.tflops:.1f} TFLOPS; bound: {self.bound}",
            f"  busy (us, overlapped): gemm {self.gemm_us:.1f} ({phases}), link {self.link_us:.1f} "
            f"(pull {self.pull_us:.1f}, push {self.push_us:.1f}), aiv1 {self.aiv1_us:.1f}",
            f"  exposed (us): launch {self.launch_us:.1f}, prologue {self.prologue_us:.1f}, tail {self.tail_us:.1f}; "
            f"{self.routed_rows_per_expert} routed rows per local expert, weights {self.weight_bytes / 1e6:.1f} MB",
        ])


def estimate_mega_moe(num_experts: int, hidden: int, intermediate_hidden: int, num_tokens: int, num_topk: int = 6,
                      num_shared_experts: int = 1, num_ranks: int = 8, *, num_max_tokens_per_rank: int | None = None,
                      arch: str | ArchSpec | None = None, num_ai_cores: int | None = None) -> MegaMoeEstimate:
    """Modelled chip time per rank of ``fp8_fp4_mega_moe`` with ``num_tokens`` tokens on each of ``num_ranks`` ranks,
    routes spread evenly over ``num_experts`` (top-``num_topk``) plus ``num_shared_experts``; ``hidden`` /
    ``intermediate_hidden`` as the kernel's (upstream's checks apply). ``arch`` / ``num_ai_cores`` default to the
    runtime's (env DG_NPU_ARCH, DG_NUM_AI_CORES), as ``estimate_gemm``."""
    # Argument checks
    values = {}
    for name, value in (("num_experts", num_experts), ("hidden", hidden), ("intermediate_hidden", intermediate_hidden),
                        ("num_tokens", num_tokens), ("num_topk", num_topk), ("num_ranks", num_ranks)):
        values[name] = check_size(name, value)
    if isinstance(num_shared_experts, bool) or not isinstance(num_shared_experts, int):
        raise TypeError(f"num_shared_experts must be an int, got {num_shared_experts!r}")
    t_max = values["num_tokens"] if num_max_tokens_per_rank is None else check_size(
        "num_max_tokens_per_rank", num_max_tokens_per_rank)
    if values["num_tokens"] > t_max:
        raise ValueError(f"num_tokens={values['num_tokens']} must be <= num_max_tokens_per_rank={t_max}")
    desc = MegaMoeDesc(values["num_ranks"], values["num_experts"], num_shared_experts, t_max, values["num_topk"],
                       values["hidden"], values["intermediate_hidden"])
    check_mega_moe_desc(desc)
    spec, cores = resolve_target(arch, num_ai_cores)
    if not spec.has_fp8:
        raise ValueError(f"arch={spec.name} has no FP8 Cube: fp8_fp4_mega_moe needs one")

    # Model
    cost = model_mega_moe(desc, spec, cores, values["num_tokens"])
    return MegaMoeEstimate(
        num_experts=desc.num_experts, hidden=desc.hidden, intermediate_hidden=desc.intermediate_hidden,
        num_tokens=values["num_tokens"], num_topk=desc.num_topk, num_shared_experts=num_shared_experts,
        num_ranks=desc.num_ranks, arch=spec.name, num_ai_cores=cores, time_us=cost.time_s * 1e6,
        tflops=cost.flops / cost.time_s / 1e12, bound=cost.bound, gemm_us=cost.gemm_s * 1e6,
        phases_us=tuple((name, s * 1e6) for name, s in cost.phases_s), link_us=cost.link_s * 1e6,
        pull_us=cost.pull_s * 1e6, push_us=cost.push_s * 1e6, aiv1_us=cost.aiv1_s * 1e6,
        prologue_us=cost.prologue_s * 1e6, tail_us=cost.tail_s * 1e6, launch_us=cost.launch_s * 1e6,
        weight_bytes=cost.weight_bytes, routed_rows_per_expert=cost.routed_rows_per_expert,
    )


# NOTES: the DeepGEMM-Ascend release's EP8 figures (Ascend 950DT, top-6 routed + 1 shared expert), four of its eight
# rows as the shared reference mega_moe_and_ep.md lists them: (experts, hidden, intermediate, tokens per rank, us).
PUBLISHED_EP8 = (
    (96, 5120, 2304, 64, 138.7),
    (96, 7168, 3072, 256, 359.2),
    (384, 5120, 2304, 4096, 2567.7),
    (384, 7168, 3072, 16384, 17904.2),
)
PUBLISHED_SOURCE = "DeepGEMM-Ascend release, EP8 mega MoE on 950DT (shared reference mega_moe_and_ep.md)"


def published_checks(arch: str = "950DT") -> list[PublishedCheck]:
    """The published EP8 rows beside the model's time for the same configuration on ``arch`` (all its cores)."""
    rows = []
    for e, h, i, t, us in PUBLISHED_EP8:
        est = estimate_mega_moe(e, h, i, t, 6, 1, 8, arch=arch, num_ai_cores=None if arch is None else _all(arch))
        terms = (("gemm", est.gemm_us), ("link", est.link_us), ("aiv1", est.aiv1_us),
                 ("prologue", est.prologue_us), ("tail", est.tail_us))
        rows.append(PublishedCheck("fp8_fp4_mega_moe", f"EP8 E={e} H={h} I={i} T={t} top-6 + 1 shared", us,
                                   est.time_us, est.bound, PUBLISHED_SOURCE, terms))
    return rows


def _all(arch: str) -> int:
    from ..arch import get_arch

    return get_arch(arch).num_ai_cores


def main(argv: list[str] | None = None) -> int:
    """``python -m deep_gemm.estimate.mega_moe E H I T``: print the modelled per-rank time of one mega MoE call."""
    from .gemm import _cli_int, _OneLineErrorParser

    parser = _OneLineErrorParser(prog="python -m deep_gemm.estimate.mega_moe",
                                 description="Modelled Ascend time per rank of fp8_fp4_mega_moe (a prediction).")
    parser.add_argument("num_experts", type=_cli_int("E"), nargs="?", help="routed experts over all ranks")
    parser.add_argument("hidden", type=_cli_int("H"), nargs="?")
    parser.add_argument("intermediate_hidden", type=_cli_int("I"), nargs="?")
    parser.add_argument("num_tokens", type=_cli_int("T"), nargs="?", help="tokens per rank")
    parser.add_argument("--topk", type=_cli_int("--topk"), default=6)
    parser.add_argument("--shared", type=_cli_int("--shared"), default=1)
    parser.add_argument("--ranks", type=_cli_int("--ranks"), default=8)
    parser.add_argument("--arch", default=None)
    parser.add_argument("--cores", type=_cli_int("--cores"), default=None)
    parser.add_argument("--published", action="store_true", help="print the published EP8 rows and their errors")
    args = parser.parse_args(argv)
    try:
        if args.published:
            for row in published_checks(args.arch or "950DT"):
                print(f"{row.problem}: published {row.published_us:.1f} us, modelled {row.modelled_us:.1f} us "
                      f"({100 * row.error:+.1f} %), bound {row.bound}")
            return 0
        if None in (args.num_experts, args.hidden, args.intermediate_hidden, args.num_tokens):
            parser.error("E H I T are required (or --published)")
        print(estimate_mega_moe(args.num_experts, args.hidden, args.intermediate_hidden, args.num_tokens, args.topk,
                                args.shared, args.ranks, arch=args.arch, num_ai_cores=args.cores))
    except (ValueError, TypeError) as e:
        parser.error(str(e))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
