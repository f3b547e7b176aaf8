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
# The rule itself lives below the API and the conductor (explain judges by it too).
from acceld.placement_model import (DesiredProvider, Record, inventories_for,  # noqa: F401
                                    operator_reserved, own_traits, traits_for)


@dataclasses.dataclass
class Written:
    """The outcome of one provider's write (or of finding it already right)."""

    generation: int
    changes: list[str]  # what acceld changed, one phrase each (empty: nothing)
    operator: str  # what of the operator's is kept ("" when nothing)
    record: dict[str, Any]  # the ownership columns to store


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
