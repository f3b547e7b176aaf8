"""/v2/devices: the inventory's physical accelerators; operators enable and disable them.

Disabling stores ``maintaining`` (upstream's word; the seed's ``disabled``):
binding then refuses the device (a bind in flight too: it locks the device row
and checks again before taking a handle, acceld.conductor.bind_target.lock_device,
so the ``UPDATE`` here either commits first or waits for that bind), ARQs
already bound to it stay bound, and the
device's Placement providers are flagged for the sync to reserve their
inventory (acceld.db.placement_flags.mark_dirty); enabling frees it.
"""

from __future__ import annotations


import falcon

from acceld.api import errors, wire
from acceld.api.microversion import Version
from acceld.api.schemas import devices as schemas
from acceld.db import devices as db
from acceld.db import placement_flags

COLLECTION = "devices"
STATUS_VERSION = Version(2, 3)
# Why a device is maintaining, and whether its hardware is ready (the seed's acc_status).
REASON_VERSION = Version(2, 4)


def to_wire(req: falcon.Request, row) -> dict:  # type: ignore[no-untyped-def]
    body = {
        "uuid": row.uuid,
        "type": row.type,
        "vendor": row.vendor,
        "model": row.model,
        "std_board_info": row.std_board_info,
        "vendor_board_info": row.vendor_board_info,
        "hostname": row.hostname,
    }
    if req.context.version >= STATUS_VERSION:
        body["status"] = row.status
    if req.context.version >= REASON_VERSION:
        body["status_reason"] = row.status_reason
        body["acc_status"] = row.acc_status
    body["links"] = wire.self_link(req, COLLECTION, row.uuid)
    body["created_at"] = wire.timestamp(row.created_at)
    body["updated_at"] = wire.timestamp(row.updated_at)
    return body


def list_devices(req: falcon.Request, resp: falcon.Response) -> None:
    api = req.context.api
    api.policy.authorize("cyborg:device:get_all", req.context.ctx)
    params = wire.query_params(req, db.FILTERS)
    wire.validate(schemas.LIST_QUERY, params, "query string")
    with api.db.read() as conn:
        rows = db.list_devices(conn, params)
    wire.respond(resp, {"devices": [to_wire(req, r) for r in rows]})


def show_device(req: falcon.Request, resp: falcon.Response, uuid: str) -> None:
    api = req.context.api
    api.policy.authorize("cyborg:device:get_one", req.context.ctx)
    wire.query_params(req, ())
    with api.db.read() as conn:
        row = db.get_by_uuid(conn, wire.canonical_uuid(uuid))
    if row is None:
        raise _not_found(uuid)
    wire.respond(resp, to_wire(req, row))


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
    try:
        api.policy.authorize("cyborg:device:enable", req.context.ctx)
    except errors.Forbidden:
        api.policy.authorize("cyborg:device:disable", req.context.ctx)
    wire.query_params(req, ())
    body = wire.read_json(req)
    wire.validate(schemas.STATUS_PATCH, body)
    op = body[0]
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


def _not_found(uuid: str) -> errors.NotFound:
    return errors.NotFound(f"Device {uuid} could not be found.")
