"""DeepGEMM-Ascend's locality-domain helpers. The 950 has one locality domain, so, as upstream on Ascend, they are
no-ops: one domain, localization unavailable, ``localize`` returns its input."""

from __future__ import annotations


def get_num_locality_domains() -> int:
    return 1


def is_localization_available() -> bool:
    return False


def localize(x, *args, **kwargs):
    """Returns ``x`` unchanged (one domain: nothing to move)."""
    return x


def is_localized(x) -> bool:
    return False


def destroy_localizer() -> None:
    return None
