"""Which mdev an MDEV attach handle names, whatever shape its attach_info was stored in.

The inventory matches reported attach handles to its rows by their whole attach_info. That
breaks when a driver changes the shape of an mdev's info: nvidia_gpu first wrote
``{"parent": "<pci address>", "asked_type", "vgpu_mark", "uuid"}`` and now writes upstream
Cyborg's ``domain``/``bus``/``device``/``function`` instead of ``parent``. Matched by info
alone, an mdev bound under the earlier shape would come back from the next discovery as a
new, free row beside the one in use, and could be handed out twice. An mdev is one thing
whatever its info looks like: its uuid on its parent device. :func:`mdev_identity` gives that
pair, and :func:`pair_by_mdev` finds the stored row a reported handle must update instead of
adding a second (acceld.db.inventory).
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import orjson

from acceld.drivers.sysfs import is_pci_address

MdevIdentity = tuple[str, str]  # (parent PCI address, mdev uuid), both normalised


def mdev_identity(attach_type: str, info: Mapping[str, Any]) -> MdevIdentity | None:
    """(parent address, mdev uuid) of an MDEV handle in either shape; None for any other
    handle, or one whose info names no valid parent address or uuid."""
    if attach_type != "MDEV":
        return None
    if "domain" in info:
        parts = [info.get(k) for k in ("domain", "bus", "device", "function")]
        if not all(isinstance(p, str) for p in parts):
            return None
        parent: Any = f"{parts[0]}:{parts[1]}:{parts[2]}.{parts[3]}"
    else:
        parent = info.get("parent")
    mdev = info.get("uuid")
    if not isinstance(parent, str) or not isinstance(mdev, str):
        return None
    parent = parent.lower()
    if not is_pci_address(parent):
        return None
    try:
        return parent, str(uuidlib.UUID(mdev))
    except ValueError:
        return None


@dataclass(frozen=True)
class Pairing:
    """A stored row whose info differs from the reported handle naming the same mdev."""

    row: Any  # the attach_handles row to update in place (keeps its id and binding)
    key: str  # the reported handle's key
    handle: Any  # the reported AttachHandle
    duplicate: Any | None  # a row already stored under the reported key (see pair_by_mdev)


def pair_by_mdev(reported: Iterable[tuple[str, Any]], existing: Mapping[str, Any]
                 ) -> list[Pairing]:
    """Pair reported ``(key, handle)``s with stored rows (``existing``: key -> row) that name
    the same mdev under another key.

    Only rows whose key is not reported are candidates (a reported key keeps its row as
    before). Of two such rows naming one mdev the one in use wins. A reported key may
    already have a row of its own (``duplicate``): a split that an earlier reconcile made
    beside a row in use; only a pairing with a row in use is then returned, since a free
    unreported row is simply removed. Costs nothing while every stored key is reported.
    """
    reported = list(reported)
    keys = {key for key, _ in reported}
    unreported: dict[MdevIdentity, Any] = {}
    for key, row in existing.items():
        if key in keys:
            continue
        ident = mdev_identity(row.attach_type, orjson.loads(row.attach_info))
        if ident is not None and (ident not in unreported or row.in_use):
            unreported[ident] = row
    if not unreported:
        return []
    pairings = []
    for key, handle in reported:
        row = unreported.pop(mdev_identity(handle.attach_type, handle.attach_info), None)
        if row is None:
            continue
        duplicate = existing.get(key)
        if duplicate is None or row.in_use:
            pairings.append(Pairing(row, key, handle, duplicate))
    return pairings
