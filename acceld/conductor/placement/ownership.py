"""What acceld owns on a provider it manages, and what it keeps of the operator's.

acceld derives a provider's resource class, ``total`` (and the units and ratio that go
with it), its own reservation (``0``, or ``total`` while the device cannot be used) and
its own traits (the deployable's ``trait*`` attributes and ``OWNER_CYBORG``). An
operator may add to that: a ``reserved`` to drain a card, a custom trait that flavors
require. Both are kept (docs/placement.md, "Ownership"):

- ``reserved``: Placement's value is the operator's when it differs from the one acceld
  last wrote or read (``placement_sync.reserved``; for a provider acceld never wrote, an
  adopted one, from the one acceld derives). acceld writes the larger of its own and
  the operator's (at most ``total``) and remembers the operator's
  (``placement_sync.operator_reserved``), so that it comes back when acceld's own full
  reservation ends;
- traits: acceld records every trait it has written on the provider
  (``placement_sync.traits``); a trait on the provider outside that record is the
  operator's and stays, one in it that acceld no longer derives is removed (also when a
  restored Placement backup brings it back). A provider acceld never wrote (an adopted
  one) counts its current traits beyond acceld's set as the operator's.

Each write is read first and carries the generation read; a provider changed meanwhile
(409) is read and merged again, so an edit made between the two is kept too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from acceld.clients import placement as pl
from acceld.placement_model import DesiredProvider


@dataclasses.dataclass(frozen=True)
class Record:
    """What acceld remembers of a provider (a ``placement_sync`` row's ownership columns)."""

    reserved: int | None = None  # the inventory's reserved as acceld last wrote or read it
    operator_reserved: int = 0
    traits: frozenset[str] = frozenset()  # every trait acceld has written on the provider

    @classmethod
    def of(cls, row: Any) -> "Record":
        if row is None:
            return cls()
        return cls(reserved=row.reserved, operator_reserved=row.operator_reserved or 0,
                   traits=frozenset((row.traits or "").split()))


@dataclasses.dataclass
class Written:
    """The outcome of one provider's write (or of finding it already right)."""

    generation: int
    changes: list[str]  # what acceld changed, one phrase each (empty: nothing)
    operator: str  # what of the operator's is kept ("" when nothing)
    record: dict[str, Any]  # the ownership columns to store


def own_traits(want: DesiredProvider) -> set[str]:
    return set(want.traits) | {pl.OWNER_TRAIT}


def operator_reserved(want: DesiredProvider, inventories: dict[str, dict[str, Any]],
                      record: Record) -> int:
    """The operator's reserved on the provider, from what Placement holds now."""
    current = inventories.get(want.resource_class or "")
    if current is None:
        return record.operator_reserved
    last = record.reserved if record.reserved is not None else want.reserved
    return int(current["reserved"]) if current["reserved"] != last else record.operator_reserved


def inventories_for(want: DesiredProvider, operator: int) -> dict[str, dict[str, Any]]:
    """The inventories the provider should hold: acceld's, with the operator's reserved."""
    if not want.resource_class or want.total <= 0:
        return {}
    return {want.resource_class: {
        "total": want.total, "max_unit": want.total, "min_unit": 1, "step_size": 1,
        "reserved": min(want.total, max(want.reserved, operator, 0)), "allocation_ratio": 1.0}}


def traits_for(want: DesiredProvider, current: set[str], record: Record) -> set[str]:
    """The traits the provider should hold: acceld's own and the operator's."""
    own = own_traits(want)
    return own | (current - own - record.traits)


def inventory_text(inventories: dict[str, dict[str, Any]]) -> str:
    if not inventories:
        return "none"
    return ", ".join(f"{rc} total={inv.get('total')} reserved={inv.get('reserved')}"
                     for rc, inv in sorted(inventories.items()))


def trait_text(have: set[str], want: set[str]) -> str:
    parts = []
    if want - have:
        parts.append("missing " + " ".join(sorted(want - have)))
    if have - want:
        parts.append("unexpected " + " ".join(sorted(have - want)))
    return ", ".join(parts)


def write(client: pl.PlacementClient, want: DesiredProvider, record: Record) -> Written:
    """Read the provider, then write what differs of acceld's part, keeping the operator's.

    Raises PlacementError (404: the provider does not exist) and GenerationConflict when
    the provider kept changing between the read and the write.
    """
    for _ in range(pl.CONFLICT_RETRIES):
        try:
            return _write_once(client, want, record)
        except pl.GenerationConflict:
            continue  # changed between our read and our write: read and merge again
    raise pl.GenerationConflict(f"Provider {want.rp_uuid} kept changing; gave up after "
                                f"{pl.CONFLICT_RETRIES} attempts", 409)


def _write_once(client: pl.PlacementClient, want: DesiredProvider, record: Record) -> Written:
    changes: list[str] = []
    inventories, generation = client.read_inventories(want.rp_uuid)
    operator = operator_reserved(want, inventories, record)
    wanted = inventories_for(want, operator)
    reserved = wanted.get(want.resource_class or "", {}).get("reserved", 0)
    if inventories != wanted:
        changes.append(f"{want.rp_uuid} inventory {inventory_text(inventories)} "
                       f"(want {inventory_text(wanted)})")
        generation = client.set_inventory(want.rp_uuid, want.resource_class, want.total,
                                          reserved, generation, attempts=1)
    current, generation = client.read_traits(want.rp_uuid)
    traits = traits_for(want, current, record)
    if current != traits:
        changes.append(f"{want.rp_uuid} traits {trait_text(current, traits)}")
        generation = client.set_traits(want.rp_uuid, traits, generation, attempts=1)
    kept_traits = sorted(traits - own_traits(want))
    kept = ([f"reserved={operator}"] if operator else []) + \
        ([f"traits {' '.join(kept_traits)}"] if kept_traits else [])
    return Written(generation, changes, ", ".join(kept),
                   {"reserved": reserved, "operator_reserved": operator,
                    "traits": " ".join(sorted(own_traits(want) | record.traits))})
