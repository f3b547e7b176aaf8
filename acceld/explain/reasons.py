"""acceld's view: every reason that keeps one provider from serving one request group.

The checks are the bind's (acceld.conductor.binding.target) and the Placement sync's
(acceld.conductor.placement.sync), asked all at once instead of stopping at the first:
an operator fixing one reason should not discover the next only on the next boot.
Each reason is ``(code, message)``; the codes are part of the API (docs/explain.md).
"""

from __future__ import annotations

import datetime as dt
from typing import Iterable, NamedTuple

from acceld import placement_model as pm
from acceld.placement_model import IMPLICIT_TRAITS, DesiredProvider, desired_provider
from acceld.db import deployables as dep_db
from acceld.db.explain import Provider
from acceld.explain.groups import RequestGroup



class Reason(NamedTuple):
    code: str
    message: str
    label: str = ""  # short, for one-line summaries ("missing trait CUSTOM_X")

    def summary(self) -> str:
        return self.label or LABELS.get(self.code, self.code)

    def to_wire(self) -> dict:
        return {"code": self.code, "message": self.message}


RESOURCE_CLASS = "resource_class"
CAPACITY = "capacity"
TRAIT_MISSING = "trait_missing"
TRAIT_FORBIDDEN = "trait_forbidden"
NO_FREE_HANDLE = "no_free_handle"
VANISHED = "vanished"
DISABLED = "disabled"
QUARANTINED = "quarantined"
AGENT_DOWN = "agent_down"
NOT_READY = "not_ready"
PROGRAMMING = "programming"
PLACEMENT_DRIFT = "placement_drift"
OPERATOR_RESERVED = "operator_reserved"

# The short label of each code, for one-line summaries ("2 lack trait CUSTOM_X").
LABELS = {
    RESOURCE_CLASS: "wrong resource class", CAPACITY: "too few accelerators",
    TRAIT_MISSING: "missing trait", TRAIT_FORBIDDEN: "forbidden trait",
    NO_FREE_HANDLE: "no free handle", VANISHED: "vanished", DISABLED: "disabled",
    QUARANTINED: "quarantined", AGENT_DOWN: "agent down", NOT_READY: "not ready",
    PROGRAMMING: "being programmed", PLACEMENT_DRIFT: "Placement differs from acceld",
    OPERATOR_RESERVED: "reserved by an operator in Placement",
}
# Reasons that say the provider is another kind of accelerator, not that it is unavailable.
MISMATCH = frozenset({RESOURCE_CLASS, CAPACITY, TRAIT_MISSING, TRAIT_FORBIDDEN})
# How many holders of a provider's handles a reason names before "and N more".
HOLDERS_SHOWN = 5


def _stamp(value: dt.datetime | None) -> str:
    return value.isoformat(timespec="seconds") + "Z" if value is not None else "never"


def free(provider: Provider) -> int:
    """Handles a new bind may take: those not in use, less one promised to each bind in
    flight (a BindStarted ARQ that has not taken its handle yet). Explain and a claim
    count by this one rule."""
    return max(0, sum(1 for h in provider.handles if not h.in_use) - int(provider.pending))


def of_kind(providers: list[Provider], reasons: dict[int, list[Reason]]) -> list[Provider]:
    """The providers that are of the kind a group asks (no MISMATCH reason): the ones whose
    reasons answer "why not", before those of another kind."""
    return [p for p in providers if not any(r.code in MISMATCH for r in reasons[p.id])]


def blockers(provider: Provider, group: RequestGroup, now: dt.datetime) -> list[Reason]:
    """Every reason in acceld's own records that ``provider`` cannot serve ``group`` now: its
    kind, its availability and its free handles. Placement's answer aside, this is what
    decides for explain and for a claim alike."""
    out = mismatch(provider, group)
    kind_ok = not out
    out += availability(provider, now)
    if kind_ok:
        out += handles(provider, group)
    return out


def record(provider: Provider) -> pm.Record:
    """What acceld recorded of the provider's ownership in Placement (its sync row)."""
    return pm.Record(
        reserved=provider.sync_reserved, operator_reserved=provider.sync_operator_reserved or 0,
        traits=frozenset((provider.sync_traits or "").split()))


def desired(provider: Provider, reserve_down_agents: bool) -> DesiredProvider:
    """What the Placement sync writes for this provider (the same function decides)."""
    attrs = {f"trait{n}": t for n, t in enumerate(sorted(provider.traits))}
    if provider.resource_class is not None:
        attrs["rc"] = provider.resource_class
    return desired_provider(provider.row, attrs, reserve_down_agents)


def mismatch(provider: Provider, group: RequestGroup) -> list[Reason]:
    """Is it the kind of accelerator the group asks for (class, amount, traits)?"""
    out: list[Reason] = []
    rc = provider.resource_class
    if rc not in group.resources:
        out.append(Reason(RESOURCE_CLASS, f"offers {rc or 'no resource class'}; the group asks "
                                          f"for {', '.join(sorted(group.resources))}",
                          f"offering {rc or 'no resource class'}"))
    elif group.resources[rc] > int(provider.num_accelerators or 0):
        out.append(Reason(CAPACITY, f"has {provider.num_accelerators} {rc}; the group asks for "
                              f"{group.resources[rc]} from one provider"))
    present = provider.traits | IMPLICIT_TRAITS
    for trait in group.required:
        if trait not in present:
            out.append(Reason(TRAIT_MISSING, f"lacks trait {trait}, which the group requires",
                              f"missing trait {trait}"))
    for trait in group.forbidden:
        if trait in present:
            out.append(Reason(TRAIT_FORBIDDEN, f"has trait {trait}, which the group forbids",
                              f"forbidden trait {trait}"))
    return out


def _holders(provider: Provider) -> Iterable[str]:
    for handle in provider.handles:
        if not handle.in_use:
            continue
        if handle.arq_uuid is not None:
            instance = f", instance {handle.instance_uuid}" if handle.instance_uuid else (
                f", claimed for consumer {handle.consumer_uuid}" if handle.consumer_uuid
                else "")
            yield f"ARQ {handle.arq_uuid} ({handle.arq_state}{instance})"
        elif handle.release_queued:
            yield f"handle {handle.uuid} (released, its host step still queued)"
        else:
            yield f"handle {handle.uuid} (in use, no ARQ holds it)"


def handles(provider: Provider, group: RequestGroup) -> list[Reason]:
    """Fewer handles :func:`free` than the group needs: who holds them, how many promised."""
    free_now = free(provider)
    need = max(1, group.amount)
    if free_now >= need:
        return []
    if not provider.handles:
        return [Reason(NO_FREE_HANDLE, "has no attach handle at all")]
    holders = list(_holders(provider))
    why = []
    if holders:
        named = "; ".join(holders[:HOLDERS_SHOWN])
        if len(holders) > HOLDERS_SHOWN:
            named += f"; and {len(holders) - HOLDERS_SHOWN} more"
        why.append(f"held by {named}")
    if provider.pending:
        promised = min(int(provider.pending), len(provider.handles) - len(holders))
        why.append(f"{promised} promised to {provider.pending} bind(s) in progress")
    return [Reason(NO_FREE_HANDLE, f"{free_now} of {len(provider.handles)} attach handles free, "
                                   f"the group needs {need}: {'; '.join(why)}")]


def availability(provider: Provider, now: dt.datetime) -> list[Reason]:
    """Device, agent and programming state: why a bind would be refused (or wait) now."""
    out: list[Reason] = []
    p = provider
    if p.vanished:
        out.append(Reason(VANISHED, f"device {p.device_uuid} is no longer reported by host "
                              f"{p.hostname} (held while in use)"))
    elif p.status != "enabled":
        out.append(Reason(DISABLED, f"device {p.device_uuid} is disabled by an operator: "
                              f"{p.status_reason or 'no reason given'}"))
    if p.quarantined:
        out.append(Reason(QUARANTINED, f"device {p.device_uuid} is quarantined since "
                                 f"{_stamp(p.quarantined_at)} for its health (health {p.health}"
                                 f"{': ' + p.health_reason if p.health_reason else ''})"))
    if p.agent_state is not None and p.agent_state != "up":  # never reported: not down
        out.append(Reason(AGENT_DOWN, f"the agent of host {p.hostname} is down, last heard from "
                                f"{_stamp(p.agent_last_seen)}"))
    if p.acc_status != "ready":
        out.append(Reason(NOT_READY, f"device {p.device_uuid} is {p.acc_status}: "
                               f"{p.status_reason or 'the driver gave no reason'}",
                          p.acc_status))
    if dep_db.programming_now(p.row, now):
        out.append(Reason(PROGRAMMING, f"deployable {p.name} is being programmed "
                                 f"({p.programming_owner}, until "
                                 f"{_stamp(p.programming_until)})"))
    return out


def sync_drift(provider: Provider, want: DesiredProvider) -> list[Reason]:
    """What acceld's own records say about Placement: written, and still what it wants?"""
    if provider.sync_rp is None or provider.sync_digest is None:
        return [Reason(PLACEMENT_DRIFT, "acceld has not written this provider to Placement yet "
                                  "(the conductor's sync has not reached it, or its "
                                  "compute node is not in Placement)")]
    if provider.sync_dirty or provider.sync_digest != want.digest:
        return [Reason(PLACEMENT_DRIFT, "Placement holds an older inventory or traits for this "
                                  "provider than acceld's (the conductor's next sync "
                                  "writes it)")]
    return []
