"""Placement's view: the allocation candidates of each request group, as Nova asks them.

One ``GET /allocation_candidates`` per group (plus, with a hostname, one lookup of the
host's compute-node provider to ask ``in_tree``), through acceld's Placement client and
so under its ``[placement] timeout`` and ``deadline``. Placement being away is an
answer, not a failure: the view then says so (``unavailable``, with the client's
message) and explain goes on with acceld's view alone. Placement's own text (webob's
"The server could not comply ...", blank lines, at times markup) is cleaned to one line
(:func:`clean`) before explain or a claim's 409 quotes it.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any

from acceld.clients import placement as pl
from acceld.explain.groups import RequestGroup

OK = "ok"
NOT_CONFIGURED = "not_configured"
UNAVAILABLE = "unavailable"
REFUSED = "refused"  # Placement answered with a 4xx (an unknown trait or class, ...)
NO_COMPUTE_NODE = "no_compute_node"

_MARKUP = re.compile(r"<[^>]*>")


def clean(text: str) -> str:
    """Placement's (or any HTTP error's) text as one line: markup and blank lines gone,
    entities decoded, runs of white space one space."""
    return " ".join(html.unescape(_MARKUP.sub(" ", text)).split())


@dataclass
class GroupView:
    status: str
    message: str | None = None
    query: str | None = None
    # rp uuid -> its summary in the answer (capacity and use per class, traits)
    candidates: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def answered(self) -> bool:
        """Whether Placement's answer says which providers it offers (possibly none)."""
        return self.status in (OK, REFUSED, NO_COMPUTE_NODE)


def ask(client: pl.PlacementClient | None, groups: list[RequestGroup],
        hostname: str | None) -> list[GroupView]:
    """Placement's candidates for each group (only within ``hostname``'s tree when given)."""
    if client is None:
        return [GroupView(NOT_CONFIGURED, "Placement is not configured ([placement] "
                                          "auth_type is unset): acceld's view alone")
                for _ in groups]
    in_tree = None
    try:
        if hostname is not None:
            compute = client.find_provider_by_name(hostname)
            if compute is None:
                return [GroupView(NO_COMPUTE_NODE, f"host {hostname} has no compute-node "
                                                   "resource provider in Placement (Nova "
                                                   "creates it when nova-compute starts)")
                        for _ in groups]
            in_tree = compute.uuid
        return [_ask_group(client, group, in_tree) for group in groups]
    except pl.PlacementUnavailable as exc:
        return [GroupView(UNAVAILABLE, f"Placement unreachable: {clean(str(exc))}")
                for _ in groups]


def _ask_group(client: pl.PlacementClient, group: RequestGroup,
               in_tree: str | None) -> GroupView:
    query = group.placement_query(in_tree)
    try:
        body = client.allocation_candidates(query)
    except pl.PlacementUnavailable:
        raise
    except pl.PlacementError as exc:
        return GroupView(REFUSED, clean(str(exc)), query)
    summaries = body.get("provider_summaries") or {}
    offered: dict[str, dict[str, Any]] = {}
    for request in body.get("allocation_requests") or []:
        for rp_uuid, alloc in (request.get("allocations") or {}).items():
            # The group's resources land on the accelerator's provider, not on the root.
            if set(alloc.get("resources") or {}) & set(group.resources):
                offered[rp_uuid] = summaries.get(rp_uuid, {})
    return GroupView(OK, None, query, offered)


def capacity_of(summary: dict[str, Any], resource_class: str | None) -> tuple[int, int] | None:
    """(capacity, used) of a class in a provider summary; None when it has none."""
    resource = (summary.get("resources") or {}).get(resource_class or "")
    if resource is None:
        return None
    return int(resource.get("capacity", 0)), int(resource.get("used", 0))
