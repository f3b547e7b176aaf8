"""Where a standalone claim (API 2.8) goes: a provider per ARQ, all on one host.

Decided before the claim's write transaction from explain's reading of the fleet (four
queries, acceld.db.explain) and its reasons (acceld.explain.reasons): a provider serves a
group when it is of the kind the group asks, its device enabled, healthy and ready, its
agent up, nothing programming it, and enough of its handles free. With Placement
configured, only the providers Placement offers for the group count too (its allocation
candidates, asked as Nova asks them, within the host's tree when a host is named; hosts in
the order Placement answers). This is a choice, not a reservation: the bind (in the
conductor) checks everything again and takes the handle atomically, and loses cleanly
(BindFailed, saying why) if another bind took the last handle first.

Why no host fits is told in full (explain's reasons: other projects' ARQs, instances and
consumers, hosts, devices, operators' and drivers' words) only to who may explain. Anyone
else reads one sentence that is the same whether the host named is unknown, has no such
accelerator, or has them all held, disabled or sick, and the caller's own ARQs that hold
accelerators of the profile's kind there (:func:`_why_member`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, select

from acceld.db import explain as fleet_db
from acceld.db.claims import HOLDING
from acceld.db.engine import Database
from acceld.db.models import accelerator_requests as arqs
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
        pending = _pending(conn)
    if hostname is not None and not fleet.providers and full:
        raise UnknownHost(f"Host {hostname} has no accelerator acceld knows.")
    # Anyone else goes the whole way for an unknown host too (Placement asked as for a
    # known one), to the same answer as for a host with nothing free.
    views = pv.ask(client, parsed, hostname) if client is not None else \
        [None for _ in parsed]
    # Per group: provider id -> every reason it cannot serve it (Placement's answer aside).
    judged = [{p.id: rs.mismatch(p, g) + rs.availability(p, fleet.now) for p in fleet.providers}
              for g in parsed]
    offered = [set(v.candidates) if v is not None and v.answered else None for v in views]
    hosts = _host_order(fleet.providers, views)
    for host in hosts:
        targets = _fit(host, fleet.providers, parsed, judged, offered, pending)
        if targets is not None:
            return targets
    if not full:
        raise NoCapacity(_why_member(db, profile_name, hostname, fleet.providers, parsed,
                                     project_id))
    raise NoCapacity(_why(profile_name, hostname, fleet.providers, parsed, judged, offered,
                          views, pending))


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


def _pending(conn: Connection) -> dict[str, int]:
    """Provider uuid -> binds in progress that have not taken their handle yet (Nova's and
    claims'): the handles they will take are not free for a new claim."""
    return {rp: int(n) for rp, n in conn.execute(select(
        arqs.c.device_rp_uuid, func.count()).where(
        arqs.c.state == "BindStarted", arqs.c.attach_handle_id.is_(None),
        arqs.c.device_rp_uuid.is_not(None)).group_by(arqs.c.device_rp_uuid))}


def _free(provider: fleet_db.Provider, pending: dict[str, int]) -> int:
    free = sum(1 for h in provider.handles if not h.in_use)
    return max(0, free - pending.get(provider.rp_uuid, 0))


def _fit(host: str, providers: list[fleet_db.Provider],
         groups: list[groups_mod.RequestGroup], judged: list[dict[int, list]],
         offered: list[set[str] | None], pending: dict[str, int]) -> list[Target] | None:
    """Targets for every group on ``host`` (handles counted across groups), or None."""
    free = {p.id: _free(p, pending) for p in providers if p.hostname == host}
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
         offered: list[set[str] | None], views: list, pending: dict[str, int]) -> str:
    """The 409's message: for the first group no provider can take, why each cannot."""
    where = f"on host {hostname}" if hostname else "on any host"
    parts = []
    for group, reasons, allowed, view in zip(groups, judged, offered, views):
        lines = []
        for p in providers:
            why = [r.message for r in reasons[p.id]]
            if not why:
                why = [r.message for r in rs.handles(p, group)]
            if not why and _free(p, pending) < max(1, group.amount):
                why = [f"its free attach handles are promised to "
                       f"{pending.get(p.rp_uuid, 0)} bind(s) in progress"]
            if not why and allowed is not None and p.rp_uuid not in allowed:
                why = ["Placement offers no candidate on it for this group"
                       + (f" ({view.message})" if view.message else "")]
            if why:
                lines.append(f"{p.name} on {p.hostname}: {'; '.join(why)}")
        if lines:
            shown = lines[:REASONS_SHOWN]
            more = f"; and {len(lines) - REASONS_SHOWN} more" if len(lines) > REASONS_SHOWN \
                else ""
            parts.append(f"group {group.index} ({group.describe()}): {' | '.join(shown)}{more}")
    detail = "; ".join(parts) or "no single host can take every group together"
    return (f"No accelerator can be claimed for device profile {profile_name} {where} now: "
            f"{detail}. GET /v2/device_profiles/{profile_name}/explain says more.")


def _why_member(db: Database, profile_name: str, hostname: str | None,
                providers: list[fleet_db.Provider], groups: list[groups_mod.RequestGroup],
                project_id: str | None) -> str:
    """The 409's message for who may not explain. It names the profile and host the caller
    gave, and the caller's own ARQs (Bound or binding) on providers of the profile's kind
    there, which they may read anyway; nothing of other projects, of the hardware or of
    operators, and the same words for an unknown host as for a busy, disabled or sick one."""
    where = f"on host {hostname}" if hostname else "on any host"
    kind = sorted({p.rp_uuid for p in providers
                   if any(not rs.mismatch(p, g) for g in groups)})
    own = _own(db, project_id, kind)
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


def _own(db: Database, project_id: str | None, rp_uuids: list[str]) -> list[Any]:
    """The project's ARQs Bound or binding on these providers, oldest first."""
    if not rp_uuids or project_id is None:
        return []
    with db.read() as conn:
        return list(conn.execute(select(
            arqs.c.uuid, arqs.c.state, arqs.c.hostname, arqs.c.instance_uuid,
            arqs.c.consumer_uuid).where(
            arqs.c.project_id == project_id, arqs.c.state.in_(HOLDING),
            arqs.c.device_rp_uuid.in_(rp_uuids)).order_by(arqs.c.id)).all())
