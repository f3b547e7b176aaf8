"""Where a standalone claim (API 2.8) goes: a provider per ARQ, all on one host.

Decided before the claim's write transaction from explain's reading of the fleet (four
queries, acceld.db.explain) by explain's rule (acceld.explain.reasons.blockers): a provider
serves a group when it is of the kind the group asks, its device enabled, healthy and
ready, its agent up, nothing programming it, and enough of its handles free, those
promised to binds in flight not counted (reasons.free). With Placement configured, only
the providers Placement offers for the group count too (its allocation candidates, asked
as Nova asks them, within the host's tree when a host is named; hosts in the order
Placement answers).

The choice is judged again in the claim's transaction (:func:`confirm`), under the
chosen deployables' row locks: a claim that another claim's ARQs overtook between the
choice and the transaction is a 409 before anything is created. That is still not a
reservation against what does not take those locks (a Nova bind's PATCH, a disable, the
Placement allocation): the bind (in the conductor) checks everything again and takes the
handle atomically, and loses cleanly (BindFailed, saying why) if another took it first.

Why no host fits is told in full (explain's reasons: other projects' ARQs, instances and
consumers, hosts, devices, operators' and drivers' words) only to who may explain. Anyone
else reads one sentence that is the same whether the host named is unknown, has no such
accelerator, or has them all held, disabled or sick, and the caller's own ARQs that hold
accelerators of the profile's kind there (:func:`_why_member`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from acceld.db import explain as fleet_db
from acceld.db.claims import HOLDING
from acceld.db.engine import Database
from acceld.db.models import accelerator_requests as arqs
from acceld.db.models import deployables
from acceld.explain import groups as groups_mod
from acceld.explain import placement_view as pv
from acceld.explain import reasons as rs

REASONS_SHOWN = 3


class UnknownHost(Exception):
    """acceld knows no accelerator on the host named."""


class NoCapacity(Exception):
    """No host can take every group of the profile now; the message says why."""


Target = tuple[int, str, str]  # (group index, hostname, provider uuid), one per ARQ


def choose(db: Database, client: Any, profile_name: str, groups: list[dict[str, str]],
           hostname: str | None, project_id: str | None, full: bool) -> list[Target]:
    """One target per ARQ the profile asks for (group by group, as ARQs are created).

    ``full``: the caller may explain (NoCapacity gives explain's reasons, an unknown host is
    UnknownHost); otherwise NoCapacity says only what is ``project_id``'s."""
    parsed = groups_mod.parse(groups)
    with db.read() as conn:
        fleet = fleet_db.read_fleet(conn, hostname)
    if hostname is not None and not fleet.providers and full:
        raise UnknownHost(f"Host {hostname} has no accelerator acceld knows.")
    # Anyone else goes the whole way for an unknown host too (Placement asked as for a
    # known one), to the same answer as for a host with nothing free.
    views = pv.ask(client, parsed, hostname) if client is not None else \
        [None for _ in parsed]
    judged = _judged(fleet, parsed)
    offered = [set(v.candidates) if v is not None and v.answered else None for v in views]
    hosts = _host_order(fleet.providers, views)
    for host in hosts:
        targets = _fit(host, fleet.providers, parsed, judged, offered)
        if targets is not None:
            return targets
    if not full:
        with db.read() as conn:
            raise NoCapacity(_why_member(conn, profile_name, hostname, fleet.providers,
                                         parsed, project_id))
    raise NoCapacity(_why(profile_name, hostname, fleet.providers, parsed, judged, offered,
                          views))


def confirm(conn: Connection, profile_name: str, groups: list[dict[str, str]],
            targets: list[Target], hostname: str | None, project_id: str | None,
            full: bool) -> None:
    """In the claim's write transaction, before its ARQs are inserted: lock the chosen
    deployables' rows and judge the choice again from what is committed now (NoCapacity,
    worded as :func:`choose`'s, when it no longer holds). Two claims for one provider are
    judged one after the other, so the second sees the first's binds in flight.
    ``hostname``: the one the caller named (a member's answer names no other)."""
    if not targets:
        return
    parsed = groups_mod.parse(groups)
    host = targets[0][1]
    chosen = sorted({rp for _, _, rp in targets})
    conn.execute(select(deployables.c.id).where(deployables.c.rp_uuid.in_(chosen))
                 .order_by(deployables.c.id).with_for_update()).all()
    fleet = fleet_db.read_fleet(conn, host)
    providers = [p for p in fleet.providers if p.rp_uuid in chosen]
    judged = _judged(fleet, parsed)
    allowed: list[set[str] | None] = [
        {rp for g, _, rp in targets if g == group.index} or None for group in parsed]
    if _fit(host, providers, parsed, judged, allowed) is not None:
        return
    if not full:
        raise NoCapacity(_why_member(conn, profile_name, hostname, fleet.providers, parsed,
                                     project_id))
    raise NoCapacity(_why(profile_name, host, providers, parsed, judged,
                          [None for _ in parsed], [None for _ in parsed]))


def _judged(fleet: fleet_db.Fleet, groups: list[groups_mod.RequestGroup],
            ) -> list[dict[int, list[rs.Reason]]]:
    """Per group: provider id -> every reason it cannot serve it (Placement's answer aside),
    by explain's rule."""
    return [{p.id: rs.blockers(p, g, fleet.now) for p in fleet.providers} for g in groups]


def _host_order(providers: list[fleet_db.Provider], views: list) -> list[str]:
    """Hosts in the order Placement offered their providers, then the others by name."""
    host_of = {p.rp_uuid: p.hostname for p in providers}
    order: list[str] = []
    for view in views:
        for rp_uuid in (view.candidates if view is not None and view.answered else {}):
            host = host_of.get(rp_uuid)
            if host is not None and host not in order:
                order.append(host)
    return order + sorted({p.hostname for p in providers} - set(order))


def _fit(host: str, providers: list[fleet_db.Provider],
         groups: list[groups_mod.RequestGroup], judged: list[dict[int, list]],
         offered: list[set[str] | None]) -> list[Target] | None:
    """Targets for every group on ``host`` (handles counted across groups), or None."""
    free = {p.id: rs.free(p) for p in providers if p.hostname == host}
    targets: list[Target] = []
    for group, reasons, allowed in zip(groups, judged, offered):
        need = max(1, group.amount)
        chosen = next((p for p in providers if p.hostname == host and not reasons[p.id]
                       and (allowed is None or p.rp_uuid in allowed)
                       and free[p.id] >= need), None)
        if chosen is None:
            return None
        free[chosen.id] -= need
        targets += [(group.index, host, chosen.rp_uuid)] * group.amount
    return targets


def _why(profile_name: str, hostname: str | None, providers: list[fleet_db.Provider],
         groups: list[groups_mod.RequestGroup], judged: list[dict[int, list]],
         offered: list[set[str] | None], views: list) -> str:
    """The 409's message: per group no provider can take, why each provider of the group's
    kind cannot (those of another kind only counted; all of them when none is of it)."""
    where = f"on host {hostname}" if hostname else "on any host"
    parts = []
    for group, reasons, allowed, view in zip(groups, judged, offered, views):
        kind = rs.of_kind(providers, reasons)
        lines = []
        for p in kind or providers:
            why = [r.message for r in reasons[p.id]]
            if not why and allowed is not None and p.rp_uuid not in allowed:
                why = ["Placement offers no candidate on it for this group"
                       + (f" ({view.message})" if view is not None and view.message else "")]
            if why:
                lines.append(f"{p.name} on {p.hostname}: {'; '.join(why)}")
        if lines:
            shown = lines[:REASONS_SHOWN]
            more = f"; and {len(lines) - REASONS_SHOWN} more" if len(lines) > REASONS_SHOWN \
                else ""
            others = len(providers) - len(kind) if kind else 0
            more += f"; and {others} provider(s) of another kind" if others else ""
            parts.append(f"group {group.index} ({group.describe()}): {' | '.join(shown)}{more}")
    detail = "; ".join(parts) or "no single host can take every group together"
    return (f"No accelerator can be claimed for device profile {profile_name} {where} now: "
            f"{detail}. GET /v2/device_profiles/{profile_name}/explain says more.")


def _why_member(conn: Connection, profile_name: str, hostname: str | None,
                providers: list[fleet_db.Provider], groups: list[groups_mod.RequestGroup],
                project_id: str | None) -> str:
    """The 409's message for who may not explain. It names the profile and host the caller
    gave, and the caller's own ARQs (Bound or binding) on providers of the profile's kind
    there, which they may read anyway; nothing of other projects, of the hardware or of
    operators, and the same words for an unknown host as for a busy, disabled or sick one."""
    where = f"on host {hostname}" if hostname else "on any host"
    kind = sorted({p.rp_uuid for p in providers
                   if any(not rs.mismatch(p, g) for g in groups)})
    own = _own(conn, project_id, kind)
    held = ""
    if own:
        shown = "; ".join(
            f"ARQ {a.uuid} ({a.state}"
            + (f", instance {a.instance_uuid}" if a.instance_uuid else "")
            + (f", consumer {a.consumer_uuid}" if a.consumer_uuid else "")
            + f") on host {a.hostname}" for a in own[:REASONS_SHOWN])
        more = f"; and {len(own) - REASONS_SHOWN} more" if len(own) > REASONS_SHOWN else ""
        held = (f" This project's own accelerator requests hold {len(own)} accelerator(s) "
                f"of this kind there: {shown}{more}.")
    return (f"No accelerator can be claimed for device profile {profile_name} {where} now."
            f"{held} Try again later or elsewhere; an administrator can say why "
            f"(GET /v2/device_profiles/{profile_name}/explain).")


def _own(conn: Connection, project_id: str | None, rp_uuids: list[str]) -> list[Any]:
    """The project's ARQs Bound or binding on these providers, oldest first."""
    if not rp_uuids or project_id is None:
        return []
    return list(conn.execute(select(
        arqs.c.uuid, arqs.c.state, arqs.c.hostname, arqs.c.instance_uuid,
        arqs.c.consumer_uuid).where(
        arqs.c.project_id == project_id, arqs.c.state.in_(HOLDING),
        arqs.c.device_rp_uuid.in_(rp_uuids)).order_by(arqs.c.id)).all())
