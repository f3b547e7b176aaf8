"""Which resource an attach handle names, whatever else its attach_info says.

The inventory matches reported attach handles to its rows by their whole attach_info. That
breaks when a driver changes what it writes there for the same resource:

- nvidia_gpu first wrote an MDEV handle as ``{"parent": "<pci address>", "asked_type",
  "vgpu_mark", "uuid"}`` and now writes upstream Cyborg's ``domain``/``bus``/``device``/
  ``function`` instead of ``parent``;
- the nic driver's PCI handles gained ``physical_network`` (upstream's NIC handles carry it),
  and an operator may map a PF to another physnet; drivers may add informational keys later.

Matched by info alone, a handle bound under the earlier info would come back from the next
discovery as a new, free row beside the one in use, and could be handed out twice. So each
attach type has one identity, the resource itself, within its deployable:

- MDEV: the mdev's uuid on its parent PCI device (:func:`mdev_identity`), in either shape;
- PCI and TEST_PCI: the PCI function, from ``domain``/``bus``/``device``/``function``
  (:func:`pci_identity`); every other key is information about it.

:func:`handle_identity` gives the identity of any handle, and :func:`pair_by_identity` finds
the stored row a reported handle must update instead of adding a second (acceld.db.inventory).
"""

from __future__ import annotations

import re
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import orjson

from acceld.drivers.sysfs import is_pci_address

MdevIdentity = tuple[str, str]  # (parent PCI address, mdev uuid), both normalised
Identity = tuple[str, Any]  # (attach type, that type's identity)

_PCI_TYPES = frozenset({"PCI", "TEST_PCI"})
_PCI_PARTS = (("domain", re.compile(r"[0-9a-fA-F]{1,4}\Z"), "04x"),
              ("bus", re.compile(r"[0-9a-fA-F]{1,2}\Z"), "02x"),
              ("device", re.compile(r"[0-9a-fA-F]{1,2}\Z"), "02x"),
              ("function", re.compile(r"[0-7]\Z"), "x"))


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


def pci_identity(attach_type: str, info: Mapping[str, Any]) -> str | None:
    """The PCI function a PCI or TEST_PCI handle names, as a normalised address
    (``0000:5e:02.1``: ``5E`` and ``5e``, ``0`` and ``00`` are one function); None for any
    other handle, or one whose info lacks a valid domain, bus, device or function. Other
    keys (``physical_network``, ``vgpu_type``...) say something about the function; they
    are not part of what it is."""
    if attach_type not in _PCI_TYPES:
        return None
    numbers = []
    for key, pattern, form in _PCI_PARTS:
        part = info.get(key)
        if not isinstance(part, str) or not pattern.match(part):
            return None
        numbers.append(format(int(part, 16), form))
    domain, bus, device, function = numbers
    return f"{domain}:{bus}:{device}.{function}"


_IDENTITIES: dict[str, Callable[[str, Mapping[str, Any]], Any]] = {
    "MDEV": mdev_identity, "PCI": pci_identity, "TEST_PCI": pci_identity}


def handle_identity(attach_type: str, info: Mapping[str, Any]) -> Identity | None:
    """(attach type, what the handle names) for any handle; None when its type has no
    identity rule or its info names nothing valid (such a handle is matched by its whole
    info only). A PCI and a TEST_PCI handle of one address are different handles."""
    identify = _IDENTITIES.get(attach_type)
    found = identify(attach_type, info) if identify is not None else None
    return None if found is None else (attach_type, found)


@dataclass(frozen=True)
class Pairing:
    """A stored row whose info differs from the reported handle naming the same resource."""

    row: Any  # the attach_handles row to update in place (keeps its id and binding)
    key: str  # the reported handle's key
    handle: Any  # the reported AttachHandle
    duplicate: Any | None  # a row already stored under the reported key (see pair_by_identity)


def _unreported(reported_keys: set[str], existing: Mapping[str, Any]) -> dict[Identity, Any]:
    """Stored rows whose key is not reported, by identity; of two, the one in use."""
    unreported: dict[Identity, Any] = {}
    for key, row in existing.items():
        if key in reported_keys:
            continue
        ident = handle_identity(row.attach_type, orjson.loads(row.attach_info))
        if ident is not None and (ident not in unreported or row.in_use):
            unreported[ident] = row
    return unreported


def renamed(reported: Iterable[tuple[str, Any]], existing: Mapping[str, Any]) -> bool:
    """Whether a stored row whose key is not reported names the resource of a reported
    handle: the case :func:`pair_by_identity` decides (which rows are in use, so the
    inventory reads them again under the device's lock first). Costs nothing while every
    stored key is reported."""
    reported = list(reported)
    unreported = _unreported({key for key, _ in reported}, existing)
    return bool(unreported) and any(
        handle_identity(h.attach_type, h.attach_info) in unreported for _, h in reported)


def pair_by_identity(reported: Iterable[tuple[str, Any]], existing: Mapping[str, Any]
                     ) -> list[Pairing]:
    """Pair reported ``(key, handle)``s with stored rows (``existing``: key -> row) that name
    the same resource under another key.

    Only rows whose key is not reported are candidates (a reported key keeps its row as
    before). Of two such rows naming one resource the one in use wins. A reported key may
    already have a row of its own (``duplicate``): a split that an earlier reconcile made
    beside a row in use; only a pairing with a row in use is then returned, since a free
    unreported row is simply removed. Costs nothing while every stored key is reported.
    """
    reported = list(reported)
    unreported = _unreported({key for key, _ in reported}, existing)
    if not unreported:
        return []
    pairings = []
    for key, handle in reported:
        row = unreported.pop(handle_identity(handle.attach_type, handle.attach_info), None)
        if row is None:
            continue
        duplicate = existing.get(key)
        if duplicate is None or row.in_use:
            pairings.append(Pairing(row, key, handle, duplicate))
    return pairings
