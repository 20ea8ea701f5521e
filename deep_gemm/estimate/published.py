"""The vendor's published chip measurements, each beside what the model predicts for the same call.

Every estimator module with published figures exposes ``published_checks() -> list[PublishedCheck]`` (its rows as
data, the modelled side computed on demand); ``bench/model_check.py`` prints them all. A module joins by being named
in ``FAMILY_MODULES``. The figures are the vendor's, copied as data with their source; nothing is reproduced.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

# NOTES: one entry per kernel family with published figures, in model_check's print order.
FAMILY_MODULES = ("gemm", "mqa_logits", "hc_prenorm", "mega_moe", "flash_mla")


@dataclass(frozen=True)
class PublishedCheck:
    """One published row: ``family`` (the public function's stem), ``problem`` (the configuration, one line),
    ``published_us`` (the vendor's time), ``modelled_us`` and ``bound`` (the model's time and binding unit for the
    same call), ``source`` (where the figure is published) and ``terms`` (the model's per-unit busy times, us)."""

    family: str
    problem: str
    published_us: float
    modelled_us: float
    bound: str
    source: str
    terms: tuple[tuple[str, float], ...] = ()

    @property
    def error(self) -> float:
        """Signed relative error of the model: (modelled - published) / published."""
        return (self.modelled_us - self.published_us) / self.published_us


def published_checks(arch: str = "950DT") -> list[PublishedCheck]:
    """Every family's published rows for ``arch`` (the vendor publishes 950DT figures), in FAMILY_MODULES order."""
    rows: list[PublishedCheck] = []
    for name in FAMILY_MODULES:
        module = importlib.import_module(f".{name}", __package__)
        if hasattr(module, "published_checks"):
            rows.extend(module.published_checks(arch))
    return rows
