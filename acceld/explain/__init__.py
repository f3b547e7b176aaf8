"""Why can (or can't) a device profile get an accelerator? Placement's view beside acceld's.

:func:`explain` answers ``GET /v2/device_profiles/{ident}/explain`` and ``acceld explain``:
for each request group of the profile, Placement's allocation candidates for it (asked as
Nova asks, acceld.explain.placement_view) and, for every provider acceld knows, whether it
could serve the group and every reason it cannot (acceld.explain.reasons); then per host
whether every group can be served there, and a one-line verdict first.

A provider is usable for a group by the rule a claim uses (acceld.explain.reasons.blockers,
handles promised to binds in flight not free) and, when Placement answered, only if
Placement offers it. Placement differing from acceld on a provider it offers is a
warning, not a reason: a bind there succeeds. What Placement holds is judged by the
Placement sync's ownership rule (acceld.conductor.placement.ownership): an operator's
``reserved`` beyond acceld's, and traits acceld did not write, are the operator's.

The database is read once, in a constant number of queries whatever the fleet size
(acceld.db.explain), before any call to Placement (no transaction waits on HTTP).
docs/explain.md describes the answer and its reason codes.
"""

from __future__ import annotations

import uuid as uuidlib
from collections import Counter
from typing import Any, Callable

import orjson
from sqlalchemy import Connection

from acceld.clients import placement as pl
from acceld import placement_model as pm
from acceld.db import device_profiles as profiles_db
from acceld.db import explain as fleet_db
from acceld.db.engine import Database
from acceld.explain import groups as groups_mod
from acceld.explain import placement_view as pv
from acceld.explain import reasons as rs

# Providers acceld would bind but Placement does not offer, read back one by one from
# Placement to say how it differs; beyond this many only that it does (keeps explain fast).
DETAIL_READS = 10
HOSTS_NAMED = 5


class ProfileNotFound(Exception):
    pass


def _find_profile(conn: Any, ident: str) -> Any:
    try:
        return profiles_db.get_by_uuid(conn, str(uuidlib.UUID(ident)))
    except ValueError:
        return profiles_db.get_by_name(conn, ident)


# Why a project could not create this many more ARQs now, or None (acceld.api.arq_limits).
Quota = Callable[[Connection, int], "str | None"]


def explain(db: Database, client: pl.PlacementClient | None, ident: str,
            hostname: str | None = None, member_of: tuple[str, ...] = (),
            reserve_down_agents: bool = True, project_id: str | None = None,
            quota: Quota | None = None) -> dict[str, Any]:
    """The explain document for the profile named (or with uuid) ``ident``; with
    ``project_id`` and ``quota``, also whether that project may create its ARQs."""
    with db.read() as conn:
        profile = _find_profile(conn, ident)
        if profile is None:
            raise ProfileNotFound(f"Device profile {ident} could not be found.")
        fleet = fleet_db.read_fleet(conn, hostname)
    groups = groups_mod.parse(orjson.loads(profile.profile_json), member_of)
    limit = None
    if project_id is not None and quota is not None:
        arqs = sum(g.amount for g in groups)
        with db.read() as conn:  # its own transaction (a unified limit was read before)
            limit = {"project_id": project_id, "arqs": arqs, "refusal": quota(conn, arqs)}
    views = pv.ask(client, groups, hostname)
    by_rp = {p.rp_uuid: p for p in fleet.providers}
    detail_budget = [DETAIL_READS]
    out_groups = []
    judged: list[dict[int, list[rs.Reason]]] = []  # per group: deployable id -> reasons
    for group, view in zip(groups, views):
        per_rp: dict[int, list[rs.Reason]] = {}
        providers = []
        for provider in fleet.providers:
            reasons, warnings, offered = _judge(provider, group, view, fleet.now,
                                                client is not None, reserve_down_agents,
                                                client, detail_budget)
            per_rp[provider.id] = reasons
            providers.append({
                "rp_uuid": provider.rp_uuid, "deployable": provider.name,
                "deployable_uuid": provider.uuid, "device_uuid": provider.device_uuid,
                "device_type": provider.type, "hostname": provider.hostname,
                "resource_class": provider.resource_class,
                "traits": sorted(provider.traits | rs.IMPLICIT_TRAITS),
                "handles": {"total": len(provider.handles), "free": rs.free(provider),
                            "promised": int(provider.pending)},
                "usable": not reasons, "placement": offered,
                "reasons": [r.to_wire() for r in reasons],
                "warnings": [w.to_wire() for w in warnings]})
        judged.append(per_rp)
        out_groups.append({
            **group.to_wire(), "description": group.describe(),
            "placement": {"status": view.status, "message": view.message,
                          "query": view.query, "candidates": _candidates(view, by_rp)},
            "acceld": {"providers": providers}})
    hosts = _hosts(fleet.providers, judged)
    verdict, satisfiable = _verdict(groups, fleet.providers, judged, hosts, views, hostname)
    if limit is not None and limit["refusal"]:
        verdict, satisfiable = f"not satisfiable for project {project_id}: " \
            f"{limit['refusal']}", False
    return {"device_profile": {"uuid": profile.uuid, "name": profile.name},
            "hostname": hostname, "verdict": verdict, "satisfiable": satisfiable,
            "quota": limit, "placement": _overall(views), "hosts": hosts,
            "groups": out_groups}


def _judge(provider: fleet_db.Provider, group: groups_mod.RequestGroup, view: pv.GroupView,
           now: Any, placement_configured: bool, reserve_down_agents: bool,
           client: pl.PlacementClient | None, budget: list[int],
           ) -> tuple[list[rs.Reason], list[rs.Reason], str]:
    """Every reason ``provider`` cannot serve ``group``, the warnings (Placement differing
    from acceld where that does not stop a bind), and whether Placement offers it."""
    reasons = rs.blockers(provider, group, now)
    kind_ok = not any(r.code in rs.MISMATCH for r in reasons)
    offered = "unknown"
    if not placement_configured:
        return reasons, [], offered
    want = rs.desired(provider, reserve_down_agents)
    record = rs.record(provider)
    stale = rs.sync_drift(provider, want)
    if not view.answered:  # a claim would bind on acceld's view alone: a warning
        return reasons, stale, offered
    summary = view.candidates.get(provider.rp_uuid)
    offered = "offered" if summary is not None else "not_offered"
    seen = _summary_drift(summary, want, record, provider, client, budget) \
        if summary is not None else []
    if seen and stale:  # one fact: what Placement shows, and why (the sync is behind)
        seen = [r._replace(message=r.message + " (the conductor's sync has not written "
                                               "acceld's change yet)") for r in seen]
    if summary is None and kind_ok and not reasons:
        # acceld would bind it and Placement says no: that decides, as for a claim.
        reasons.append(_not_offered(view, provider, want, record, client, budget))
    return reasons, seen or stale, offered


def _summary_drift(summary: dict[str, Any], want: Any, record: pm.Record,
                   provider: fleet_db.Provider, client: pl.PlacementClient | None,
                   budget: list[int]) -> list[rs.Reason]:
    """How Placement's offer differs from what the sync would write (the operator's part
    kept, by the ownership rule). A capacity below acceld's may be an operator's reserved
    the sync has not seen yet: read back (within the budget) and judged by that rule."""
    out = []
    have = pv.capacity_of(summary, want.resource_class)
    theirs = record.operator_reserved
    reserved = min(want.total, max(want.reserved, theirs, 0))
    expected = want.total - reserved
    if have is not None and have[0] < expected and client is not None and budget[0] > 0:
        budget[0] -= 1
        try:
            inventories = client.get_inventories(provider.rp_uuid)
        except pl.PlacementError:
            inventories = {}
        if inventories and not _inventory_drift(want, record, inventories):
            have = None  # the operator's reserved, kept by the sync: not drift
    if have is not None and have[0] != expected:
        note = f" ({theirs} reserved by an operator)" if theirs > want.reserved else ""
        out.append(rs.Reason(rs.PLACEMENT_DRIFT, f"Placement offers a capacity of {have[0]} "
                                                 f"{want.resource_class}; acceld's is "
                                                 f"{expected}{note}"))
    traits = set(summary.get("traits") or ())
    if traits:
        own = pm.own_traits(want)
        if _ours(traits, own, record) != own:
            out.append(rs.Reason(rs.PLACEMENT_DRIFT, _trait_difference(
                _ours(traits, own, record), own)))
    return out


def _ours(traits: set[str], own: set[str], record: pm.Record) -> set[str]:
    """The traits on a provider that are acceld's to judge: its own and those it wrote
    (the rest are the operator's, pm.traits_for)."""
    return traits & (own | record.traits)


def _trait_difference(have: set[str], want: set[str]) -> str:
    parts = []
    if want - have:
        parts.append("lacks " + " ".join(sorted(want - have)))
    if have - want:
        parts.append("has " + " ".join(sorted(have - want)) + " besides")
    return "Placement's traits for it differ from acceld's: it " + " and ".join(parts)


def _not_offered(view: pv.GroupView, provider: fleet_db.Provider, want: Any,
                 record: pm.Record, client: pl.PlacementClient | None,
                 budget: list[int]) -> rs.Reason:
    """Why Placement offers no candidate on a provider acceld would bind, read back."""
    base = "acceld would bind it but Placement offers no candidate on it for this group"

    def drift(text: str) -> rs.Reason:
        return rs.Reason(rs.PLACEMENT_DRIFT, base + text)

    if view.status == pv.NO_COMPUTE_NODE:
        return drift(f": {view.message}")
    if view.status == pv.REFUSED:
        return drift(f" ({view.message})")
    if client is None or budget[0] <= 0:
        return drift("")
    budget[0] -= 1
    try:
        inventories = client.get_inventories(provider.rp_uuid)
        traits = set(client.get_traits(provider.rp_uuid))
    except pl.PlacementError as exc:
        if exc.status == 404:
            return drift(": Placement has no such provider")
        return drift(f" (reading the provider back failed: {pv.clean(str(exc))})")
    inv = inventories.get(want.resource_class or "")
    if inv is None:
        return drift(f": Placement holds no {want.resource_class} inventory for it")
    holds = (f": Placement holds {want.resource_class} total={inv.get('total')} "
             f"reserved={inv.get('reserved')}")
    if _inventory_drift(want, record, inventories):
        return drift(holds + f"; acceld's is total={want.total} reserved={want.reserved}")
    theirs = pm.operator_reserved(want, inventories, record)
    own = pm.own_traits(want)
    if _ours(traits, own, record) != own:
        return drift(": " + _trait_difference(_ours(traits, own, record), own))
    if theirs > want.reserved:
        return rs.Reason(rs.OPERATOR_RESERVED, base + holds + (
            f", of which {theirs} reserved by an operator beyond acceld's {want.reserved} "
            "(the operator's, kept by acceld's sync)"))
    return drift(" (its inventory and traits match acceld's: all of it may be allocated)")


def _inventory_drift(want: Any, record: pm.Record,
                     inventories: dict[str, dict[str, Any]]) -> bool:
    """Whether Placement's inventory of the provider's class is not what the sync would
    write (acceld's total, and the larger of its reserved and the operator's)."""
    inv = inventories.get(want.resource_class or "")
    if inv is None:
        return True
    theirs = pm.operator_reserved(want, inventories, record)
    wanted = pm.inventories_for(want, theirs).get(want.resource_class or "", {})
    return inv.get("total") != want.total or inv.get("reserved") != wanted.get("reserved")


def _candidates(view: pv.GroupView, by_rp: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for rp_uuid, summary in sorted(view.candidates.items()):
        provider = by_rp.get(rp_uuid)
        rc = provider.resource_class if provider is not None else None
        have = pv.capacity_of(summary, rc) if rc else None
        out.append({"rp_uuid": rp_uuid,
                    "hostname": provider.hostname if provider is not None else None,
                    "known_to_acceld": provider is not None,
                    "capacity": have[0] if have else None, "used": have[1] if have else None})
    return out


def _hosts(providers: list[fleet_db.Provider],
           judged: list[dict[int, list[rs.Reason]]]) -> list[dict[str, Any]]:
    """Per host, per group: the providers that can serve it, else why none can (of the
    providers of the right kind; of all of them when none is)."""
    by_host: dict[str, list[fleet_db.Provider]] = {}
    for p in providers:
        by_host.setdefault(p.hostname, []).append(p)
    out = []
    for host in sorted(by_host):
        on_host = by_host[host]
        per_group = []
        for index, per_rp in enumerate(judged):
            usable = [p.rp_uuid for p in on_host if not per_rp[p.id]]
            why: list[str] = []
            if not usable:
                kind = rs.of_kind(on_host, per_rp)
                why = [f"{p.name}: {r.message}" for p in (kind or on_host)
                       for r in per_rp[p.id]]
            per_group.append({"group_id": index, "usable": usable, "reasons": why})
        out.append({"hostname": host, "satisfiable": all(g["usable"] for g in per_group),
                    "groups": per_group})
    return out


def _names(hosts: list[str]) -> str:
    shown = ", ".join(hosts[:HOSTS_NAMED])
    return shown + (f" and {len(hosts) - HOSTS_NAMED} more" if len(hosts) > HOSTS_NAMED else "")


def _group_summary(group: groups_mod.RequestGroup, providers: list[fleet_db.Provider],
                   per_rp: dict[int, list[rs.Reason]]) -> str:
    """Why no provider serves the group: counted by reason."""
    matching = rs.of_kind(providers, per_rp)
    head = f"group {group.index} ({group.describe()})"
    if not matching:
        counts = Counter(r.summary() for p in providers for r in set(per_rp[p.id]))
        detail = ", ".join(f"{n} {label}" for label, n in counts.most_common())
        return f"{head}: no provider is of that kind ({len(providers)} known: {detail})"
    counts = Counter(label for p in matching
                     for label in {r.summary() for r in per_rp[p.id]})
    detail = ", ".join(f"{n} {label}" for label, n in counts.most_common())
    return (f"{head}: {len(matching)} matching provider{'s' if len(matching) != 1 else ''}, "
            f"none usable ({detail})")


def _verdict(groups: list[groups_mod.RequestGroup], providers: list[fleet_db.Provider],
             judged: list[dict[int, list[rs.Reason]]], hosts: list[dict[str, Any]],
             views: list[pv.GroupView], hostname: str | None) -> tuple[str, bool]:
    where = f" on host {hostname}" if hostname else ""
    caveat = ""
    if any(v.status == pv.UNAVAILABLE for v in views):
        caveat = " (Placement unreachable: acceld's view alone)"
    good = [h["hostname"] for h in hosts if h["satisfiable"]]
    if good:
        return (f"satisfiable on {len(good)} host{'s' if len(good) != 1 else ''}: "
                f"{_names(good)}{caveat}"), True
    if not providers:
        return f"not satisfiable: acceld knows no accelerator{where}{caveat}", False
    blocked = [_group_summary(g, providers, per_rp) for g, per_rp in zip(groups, judged)
               if not any(not reasons for reasons in per_rp.values())]
    if not blocked:  # each group can be served somewhere, but not all on one host
        served = [_names([h["hostname"] for h in hosts if h["groups"][g.index]["usable"]])
                  for g in groups]
        spread = "; ".join(f"group {g.index} only on {on}" for g, on in zip(groups, served))
        return f"not satisfiable: no host serves every group ({spread}){caveat}", False
    return f"not satisfiable{where}: " + "; ".join(blocked) + caveat, False


def _overall(views: list[pv.GroupView]) -> dict[str, Any]:
    """Placement as a whole: the worst of the groups' statuses."""
    for status in (pv.NOT_CONFIGURED, pv.UNAVAILABLE, pv.NO_COMPUTE_NODE):
        for view in views:
            if view.status == status:
                return {"status": status, "message": view.message}
    return {"status": pv.OK, "message": None}
