"""The explain document as text, for ``acceld explain``: the verdict first, then per group
Placement's view and acceld's, one provider a line and one reason a line under it.

Providers of another kind (another resource class, a missing or forbidden trait) are
counted, not listed, unless no provider is of the group's kind: then their reasons are
the answer, and each is shown.
"""

from __future__ import annotations

from typing import Any

from acceld.explain import reasons as rs

PLACEMENT_WORDS = {
    "ok": "answered", "not_configured": "not configured", "unavailable": "unreachable",
    "refused": "refused the query", "no_compute_node": "has no compute node for the host",
}


def _provider_line(p: dict[str, Any]) -> str:
    handles = f"{p['handles']['free']}/{p['handles']['total']} handles free" + (
        f", {p['handles']['promised']} promised to binds in progress"
        if p["handles"]["promised"] else "")
    placement = {"offered": ", Placement offers it", "not_offered": ", Placement does not offer it",
                 "unknown": ""}[p["placement"]]
    state = "usable" if p["usable"] else "not usable"
    return f"  {p['hostname']}  {p['deployable']}  {state} ({handles}{placement})"


def render(doc: dict[str, Any]) -> str:
    lines = [doc["verdict"], ""]
    profile = doc["device_profile"]
    where = f" on host {doc['hostname']}" if doc["hostname"] else ""
    lines.append(f"Device profile {profile['name']} ({profile['uuid']}){where}")
    overall = doc["placement"]
    lines.append(f"Placement: {PLACEMENT_WORDS.get(overall['status'], overall['status'])}"
                 + (f": {overall['message']}" if overall["message"] else ""))
    limit = doc["quota"]
    if limit is not None:
        lines.append(f"Project {limit['project_id']}: "
                     + (limit["refusal"] or f"may create the profile's {limit['arqs']} ARQ(s)"))
    for group in doc["groups"]:
        lines += ["", f"Group {group['group_id']}: {group['description']}"]
        view = group["placement"]
        if view["status"] == "ok":
            lines.append(f"  Placement: {len(view['candidates'])} candidate(s) for "
                         f"{view['query']}")
            for c in view["candidates"]:
                if not c["known_to_acceld"]:
                    lines.append(f"    {c['rp_uuid']}: a provider acceld does not know")
        elif view["status"] == "refused":
            lines.append(f"  Placement refused {view['query']}: {view['message']}")
        providers = group["acceld"]["providers"]
        kind = [p for p in providers
                if not any(r["code"] in rs.MISMATCH for r in p["reasons"])]
        shown = kind or providers
        lines.append(f"  acceld: {sum(p['usable'] for p in providers)} usable of "
                     f"{len(kind)} provider(s) of this kind"
                     + (f"; {len(providers) - len(kind)} of another kind not shown"
                        if kind and len(kind) < len(providers) else ""))
        for p in shown:
            lines.append(_provider_line(p))
            lines += [f"      - {r['code']}: {r['message']}" for r in p["reasons"]]
            lines += [f"      ~ {w['code']} (warning): {w['message']}" for w in p["warnings"]]
    return "\n".join(lines) + "\n"
