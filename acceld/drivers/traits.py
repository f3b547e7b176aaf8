"""Deployable attributes as every driver writes them: ``rc``, ``trait0..N``, extras.

Placement takes custom traits matching ``CUSTOM_[A-Z0-9_]+``; :func:`trait_part`
turns a free-form name (a product, a vGPU type, a physnet) into such a part.
"""

from __future__ import annotations

import re


def trait_part(text: str) -> str:
    """Upper-case a free-form name into a trait component: 'GRID T4-2B' -> 'GRID_T4_2B'."""
    cleaned = re.sub(r"[^A-Z0-9]+", "_", text.upper()).strip("_")
    return cleaned or "UNKNOWN"


def attributes(rc: str, traits: list[str], **extra: str) -> dict[str, str]:
    """``{"rc": rc, "trait0": ..., "traitN": ..., **extra}``, traits deduplicated in order."""
    attrs = {"rc": rc}
    unique = list(dict.fromkeys(traits))
    attrs.update({f"trait{i}": trait for i, trait in enumerate(unique)})
    attrs.update({k: v for k, v in extra.items() if v is not None})
    return attrs
