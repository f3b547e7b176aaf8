"""/v2/devices: the inventory's physical accelerators; operators enable and disable them.

Disabling stores ``maintaining`` (upstream's word; the seed's ``disabled``):
binding then refuses the device (a bind in flight too: it locks the device row
and checks again before taking a handle, acceld.conductor.binding.target.lock_device,
so the ``UPDATE`` here either commits first or waits for that bind), ARQs
already bound to it stay bound, and the
device's Placement providers are flagged for the sync to reserve their
inventory (acceld.db.placement_flags.mark_dirty); enabling frees it. Each change is
a device event naming the user and the reason given (acceld.db.device_events).

From 2.6, to callers the ``acceld:device:get_health`` rule allows (administrators by
default), devices show ``health``, ``health_reason``, ``health_since`` and ``quarantined``
(acceld.quarantine), lists filter by ``?health=`` and ``?quarantined=``, and a shown
device lists the ARQs and instances bound to it (``bound_arqs``) so they can be moved off a
failing device. ``GET /v2/devices/{uuid}/events`` is the device's history, newest first,
paginated like ARQ lists; ``PATCH /v2/devices/{uuid}`` with ``/quarantined`` ``false``
returns a quarantined device to service. Below 2.6 nothing of this exists.
"""

from __future__ import annotations

from typing import Callable

import falcon

from acceld.api import errors, pagination, wire
from acceld.api.microversion import Version
from acceld.api.schemas import devices as schemas
from acceld import quarantine
from acceld.db import device_events
from acceld.db import devices as db
from acceld.db import placement_flags

COLLECTION = "devices"
STATUS_VERSION = Version(2, 3)
# Why a device is maintaining, and whether its hardware is ready (the seed's acc_status).
REASON_VERSION = Version(2, 4)
HEALTH_VERSION = Version(2, 6)
HEALTH_RULE = "acceld:device:get_health"
EVENTS_RULE = "acceld:device_event:get_all"
RETURN_RULE = "acceld:device:return_to_service"


def _sees_health(req: falcon.Request) -> bool:
    return req.context.version >= HEALTH_VERSION and req.context.api.policy.allows(
        HEALTH_RULE, req.context.ctx)


def serializer(req: falcon.Request, sees_health: bool = False) -> Callable:  # type: ignore[type-arg]
    """A row -> dict function for this request (microversion and link base looked up once).

    Rows are tuples in the order of ``db.COLUMNS``: a list's driver tuples
    (acceld.db.rows), or the Row of one device; timestamps come as text or datetimes,
    ``quarantined`` as a bool or SQLite's 0/1 (acceld.api.wire.timestamp, bool())."""
    with_status = req.context.version >= STATUS_VERSION
    with_reason = req.context.version >= REASON_VERSION
    base = f"{wire.base_url(req)}/accelerator/v2/{COLLECTION}/"
    stamp = wire.timestamp

    def to_wire(row) -> dict:  # type: ignore[no-untyped-def]
        (_id, uuid, type_, vendor, model, std_board_info, vendor_board_info, hostname,
         status, status_reason, acc_status, created_at, updated_at, health, health_reason,
         health_since, quarantined) = row
        body = {
            "uuid": uuid,
            "type": type_,
            "vendor": vendor,
            "model": model,
            "std_board_info": std_board_info,
            "vendor_board_info": vendor_board_info,
            "hostname": hostname,
        }
        if with_status:
            body["status"] = status
        if with_reason:
            body["status_reason"] = status_reason
            body["acc_status"] = acc_status
        if sees_health:
            body["health"] = health
            body["health_reason"] = health_reason
            body["health_since"] = stamp(health_since)
            body["quarantined"] = bool(quarantined)
        body["links"] = [{"href": base + uuid, "rel": "self"}]
        body["created_at"] = stamp(created_at)
        body["updated_at"] = stamp(updated_at)
        return body

    return to_wire


def list_devices(req: falcon.Request, resp: falcon.Response) -> None:
    """The whole list, built one batch of driver rows at a time (acceld.api.wire.list_body):
    10,000 devices never exist at once as Row objects, dicts and one document."""
    api = req.context.api
    api.policy.authorize("cyborg:device:get_all", req.context.ctx)
    sees_health = _sees_health(req)
    if req.context.version >= HEALTH_VERSION:
        params = wire.query_params(req, db.FILTERS + db.HEALTH_FILTERS)
        if not sees_health and any(name in params for name in db.HEALTH_FILTERS):
            api.policy.authorize(HEALTH_RULE, req.context.ctx)  # 403: a health filter
        wire.validate(schemas.LIST_QUERY_V2_6, params, "query string")
    else:
        params = wire.query_params(req, db.FILTERS)
        wire.validate(schemas.LIST_QUERY, params, "query string")
    filters: dict = dict(params)
    if "quarantined" in filters:
        filters["quarantined"] = filters["quarantined"] == "true"
    to_wire = serializer(req, sees_health)
    with api.db.read() as conn:
        body = wire.list_body(COLLECTION, db.list_devices(conn, filters), to_wire)
    wire.respond_pieces(resp, body)


def show_device(req: falcon.Request, resp: falcon.Response, uuid: str) -> None:
    api = req.context.api
    api.policy.authorize("cyborg:device:get_one", req.context.ctx)
    wire.query_params(req, ())
    sees_health = _sees_health(req)
    with api.db.read() as conn:
        row = db.get_by_uuid(conn, wire.canonical_uuid(uuid))
        bound = db.bound_instances(conn, row.id) if row is not None and sees_health else []
    if row is None:
        raise _not_found(uuid)
    body = serializer(req, sees_health)(row)
    if sees_health:
        body["bound_arqs"] = [{"uuid": b.uuid, "instance_uuid": b.instance_uuid,
                               "state": b.state, "deployable_uuid": b.deployable_uuid}
                              for b in bound]
    wire.respond(resp, body)


def list_events(req: falcon.Request, resp: falcon.Response, uuid: str) -> None:
    """GET /v2/devices/{uuid}/events (2.6): newest first, ``limit``/``marker`` pages."""
    if req.context.version < HEALTH_VERSION:
        raise errors.NotFound("The resource could not be found.")
    api = req.context.api
    api.policy.authorize(EVENTS_RULE, req.context.ctx)
    params = wire.query_params(req, pagination.PARAMS)
    page = pagination.requested(req, params)
    device_uuid = wire.canonical_uuid(uuid)
    with api.db.read() as conn:
        if db.get_by_uuid(conn, device_uuid) is None and device_events.newest_first(
                conn, device_uuid, 1) == []:
            raise _not_found(uuid)  # a removed device's history stays readable
        before = None
        if page.marker is not None:
            before = device_events.marker_id(conn, device_uuid, _event_uuid(page.marker))
            if before is None:
                raise errors.BadRequest(f"Marker {page.marker} could not be found.")
        rows = device_events.newest_first(conn, device_uuid, page.limit + 1, before)
    more = len(rows) > page.limit
    rows = rows[:page.limit]
    body: dict = {"events": [{"uuid": r.uuid, "device_uuid": r.device_uuid,
                              "hostname": r.hostname, "kind": r.kind, "detail": r.detail,
                              "actor": r.actor, "created_at": wire.timestamp(r.created_at)}
                             for r in rows]}
    if more:
        body["events_links"] = pagination.next_links(
            req, f"{COLLECTION}/{device_uuid}/events", params, rows[-1].uuid)
    wire.respond(resp, body)


def _event_uuid(marker: str) -> str:
    value = wire.canonical_uuid(marker)
    if not value:
        raise errors.BadRequest(f"Invalid marker {marker!r}: expected an event uuid.")
    return value


def enable_device(req: falcon.Request, resp: falcon.Response, uuid: str) -> None:
    """Upstream's POST /{uuid}/enable: 200, empty body (as upstream)."""
    _set_status(req, uuid, db.ENABLED, None)
    wire.no_content(resp, 200)


def disable_device(req: falcon.Request, resp: falcon.Response, uuid: str) -> None:
    """Upstream's POST /{uuid}/disable: 200, empty body (as upstream)."""
    _set_status(req, uuid, db.MAINTAINING, None)
    wire.no_content(resp, 200)


def patch_device(req: falcon.Request, resp: falcon.Response, uuid: str) -> None:
    """The seed's PATCH /{uuid} on /status, with an optional reason: 204, no body.

    A caller who may neither enable nor disable gets 403 before the body is read (a
    malformed body must not tell them more than "forbidden"); the rule for the
    status asked is checked once the body is valid.
    """
    api = req.context.api
    v2_6 = req.context.version >= HEALTH_VERSION
    rules = ["cyborg:device:enable", "cyborg:device:disable"] + ([RETURN_RULE] if v2_6 else [])
    if not any(api.policy.allows(rule, req.context.ctx) for rule in rules):
        api.policy.authorize(rules[1], req.context.ctx)  # 403, before the body is read
    wire.query_params(req, ())
    body = wire.read_json(req)
    wire.validate(schemas.PATCH_V2_6 if v2_6 else schemas.STATUS_PATCH, body)
    op = body[0]
    if op["path"] == "/quarantined":
        api.policy.authorize(RETURN_RULE, req.context.ctx)
        _return_to_service(req, uuid, op.get("reason"))
        wire.no_content(resp)
        return
    enable = op["value"] == "enabled"
    api.policy.authorize("cyborg:device:enable" if enable else "cyborg:device:disable",
                         req.context.ctx)
    _set_status(req, uuid, db.ENABLED if enable else db.MAINTAINING, op.get("reason"),
                authorized=True)
    wire.no_content(resp)


def _set_status(req: falcon.Request, uuid: str, status: str, reason: str | None,
                authorized: bool = False) -> None:
    api = req.context.api
    if not authorized:
        rule = "cyborg:device:enable" if status == db.ENABLED else "cyborg:device:disable"
        api.policy.authorize(rule, req.context.ctx)
        wire.query_params(req, ())
    with api.db.write() as conn:
        row = db.get_by_uuid(conn, wire.canonical_uuid(uuid))
        if row is None:
            raise _not_found(uuid)
        if db.set_status(conn, row.id, status, reason):
            # The Placement sync reserves a disabled device's inventory, and frees it again.
            placement_flags.mark_dirty(conn, device_uuid=row.uuid)
            kind = device_events.ENABLED if status == db.ENABLED else device_events.DISABLED
            device_events.record(conn, row.uuid, row.hostname, kind,
                                 f"{'Enabled' if status == db.ENABLED else 'Disabled'} by an "
                                 f"operator{': ' + reason if reason else ''}",
                                 actor=req.context.ctx.user_id)


def _return_to_service(req: falcon.Request, uuid: str, reason: str | None) -> None:
    """An operator's word ends a quarantine (any [conductor] health_recovery); 409 while
    the device's last report is unhealthy, or when it is not quarantined."""
    api = req.context.api
    with api.db.write() as conn:
        row = db.get_by_uuid(conn, wire.canonical_uuid(uuid))
        if row is None:
            raise _not_found(uuid)
        try:
            quarantine.release_by_operator(conn, row.id, req.context.ctx.user_id, reason)
        except quarantine.NotQuarantined:
            raise errors.Conflict(f"Device {uuid} is not quarantined.") from None
        except quarantine.StillUnhealthy as still:
            raise errors.Conflict(
                f"Device {uuid} still reports unhealthy ({still.args[0] or 'no reason given'});"
                " it is returned to service once its node reports it healthy.") from None


def _not_found(uuid: str) -> errors.NotFound:
    return errors.NotFound(f"Device {uuid} could not be found.")
