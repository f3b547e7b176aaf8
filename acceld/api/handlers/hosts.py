"""/v2/hosts (microversion 2.4, admin only): the node agents and whether they are alive.

Below 2.4 the resource does not exist: 404, as for any unknown path, so a
client pinned to an older version sees the API it expects. An agent that
reported before and fell silent shows ``"state": "down"`` with its last
contact: the seed's alert for an agent that vanished.

From 2.5 ``DELETE /v2/hosts/{hostname}[?force=true]`` retires a host whose agent will
never return (acceld.db.host_retire); at 2.4 the method is not allowed (405).
"""

from __future__ import annotations

import falcon

from acceld.api import errors, wire
from acceld.api.microversion import Version
from acceld.db import agents as db
from acceld.db import host_retire

COLLECTION = "hosts"
HOSTS_VERSION = Version(2, 4)
DELETE_VERSION = Version(2, 5)
RULE = "acceld:host:get_all"
DELETE_RULE = "acceld:host:delete"
FLAGS = {"true": True, "false": False}
STATES = ("up", "down")


def _require_version(req: falcon.Request) -> None:
    if req.context.version < HOSTS_VERSION:
        raise errors.NotFound("The resource could not be found.")


def to_wire(req: falcon.Request, row, device_count: int) -> dict:  # type: ignore[no-untyped-def]
    return {
        "hostname": row.hostname,
        "state": row.state,
        "endpoint": row.endpoint,
        "heartbeat_interval": row.heartbeat_interval,
        "last_seen_at": wire.timestamp(row.last_seen_at),
        "devices": device_count,
        "links": wire.self_link(req, COLLECTION, row.hostname),
        "created_at": wire.timestamp(row.created_at),
        "updated_at": wire.timestamp(row.updated_at),
    }


def list_hosts(req: falcon.Request, resp: falcon.Response) -> None:
    _require_version(req)
    api = req.context.api
    api.policy.authorize(RULE, req.context.ctx)
    params = wire.query_params(req, ("state",))
    state = params.get("state")
    if state is not None and state not in STATES:
        raise errors.BadRequest(f"Invalid state {state!r}: choose up or down.")
    with api.db.read() as conn:
        rows = db.list_agents(conn, state)
        counts = db.device_counts(conn)
    wire.respond(resp, {"hosts": [to_wire(req, r, counts.get(r.hostname, 0)) for r in rows]})


def show_host(req: falcon.Request, resp: falcon.Response, hostname: str) -> None:
    _require_version(req)
    api = req.context.api
    api.policy.authorize(RULE, req.context.ctx)
    wire.query_params(req, ())
    with api.db.read() as conn:
        row = db.get_agent(conn, hostname)
        counts = db.device_counts(conn, hostname) if row is not None else {}
    if row is None:
        raise errors.NotFound(f"Host {hostname} has no agent that reported.")
    wire.respond(resp, to_wire(req, row, counts.get(hostname, 0)))


def delete_host(req: falcon.Request, resp: falcon.Response, hostname: str) -> None:
    """Retire a host: 204; 404 unknown; 409 while its agent is up or ARQs are bound there
    (naming them), unless ``?force=true``."""
    _require_version(req)
    if req.context.version < DELETE_VERSION:
        raise errors.MethodNotAllowed(f"Method DELETE is not allowed on {req.path}; allowed: "
                                      "GET", headers={"Allow": "GET"})
    api = req.context.api
    api.policy.authorize(DELETE_RULE, req.context.ctx)
    force = wire.query_params(req, ("force",)).get("force", "false")
    if force.lower() not in FLAGS:
        raise errors.BadRequest(f"Invalid force {force!r}: choose true or false.")
    try:
        retired = host_retire.retire(api.db, hostname, force=FLAGS[force.lower()])
    except host_retire.HostNotFound as exc:
        raise errors.NotFound(str(exc)) from None
    except host_retire.HostInUse as exc:
        raise errors.Conflict(exc.message) from None
    if retired.failed_arqs and api.conductor is not None:
        api.conductor.wake_binds()  # Nova hears 'failed' for the binds that were in flight
    wire.no_content(resp)
