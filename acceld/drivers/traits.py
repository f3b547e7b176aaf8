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


# Upstream Cyborg's vendor map (cyborg/accelerator/common/utils.py get_vendor_maps), used
# where upstream builds a trait from a vendor name: CUSTOM_PCI_<VENDOR>, CUSTOM_SSD_<VENDOR>.
# Upstream's table, not the PCI-SIG one (1099 is its "samsung"), so the traits match.
UPSTREAM_VENDOR_NAMES = {"0x10de": "NVIDIA", "0x102b": "MATROX", "0x1bd4": "INSPUR",
                         "0x8086": "INTEL", "0x1099": "SAMSUNG", "0x1cf2": "ZTE"}


def upstream_vendor(vendor_id: str) -> str | None:
    """'0x8086' (or '8086') -> 'INTEL' as upstream names it; None for a vendor it does not."""
    text = vendor_id.lower()
    return UPSTREAM_VENDOR_NAMES.get(text if text.startswith("0x") else f"0x{text}")


def product_id_part(device_id: str) -> str:
    """'0x09c4' -> '09C4': a product id as upstream's traits carry it."""
    text = device_id.lower()
    return (text[2:] if text.startswith("0x") else text).upper()
