"""/v2/attributes: key/value facts about deployables (drivers write ``rc`` and ``trait<N>``)."""

from __future__ import annotations

import uuid as uuidlib

import falcon
from sqlalchemy.exc import IntegrityError

from acceld.api import errors, wire
from acceld.api.schemas import attributes as schemas
from acceld.db import attributes as db

COLLECTION = "attributes"


def to_wire(req: falcon.Request, row) -> dict:  # type: ignore[no-untyped-def]
    return {
        "uuid": row.uuid,
        "deployable_id": row.deployable_id,
        "key": row.key,
        "value": row.value,
        "created_at": wire.timestamp(row.created_at),
        "updated_at": wire.timestamp(row.updated_at),
        "links": wire.self_link(req, COLLECTION, row.uuid),
    }


def list_attributes(req: falcon.Request, resp: falcon.Response) -> None:
    api = req.context.api
    api.policy.authorize("cyborg:attribute:get_all", req.context.ctx)
    params = wire.query_params(req, db.FILTERS)
    wire.validate(schemas.LIST_QUERY, params, "query string")
    filters: dict[str, object] = dict(params)
    if "deployable_id" in filters:
        filters["deployable_id"] = wire.int_id(params["deployable_id"],
                                               "query parameter deployable_id")
    with api.db.read() as conn:
        rows = db.list_attributes(conn, filters)
    wire.respond(resp, {"attributes": [to_wire(req, r) for r in rows]})


def show_attribute(req: falcon.Request, resp: falcon.Response, uuid: str) -> None:
    api = req.context.api
    api.policy.authorize("cyborg:attribute:get_one", req.context.ctx)
    wire.query_params(req, ())
    with api.db.read() as conn:
        row = db.get_by_uuid(conn, wire.canonical_uuid(uuid))
    if row is None:
        raise _not_found(uuid)
    wire.respond(resp, to_wire(req, row))


def create_attribute(req: falcon.Request, resp: falcon.Response) -> None:
    """The bare attribute (upstream) or ``{"attribute": {...}}`` (the SDK): 201."""
    api = req.context.api
    api.policy.authorize("cyborg:attribute:create", req.context.ctx)
    wire.query_params(req, ())
    body = wire.read_json(req)
    if isinstance(body, dict) and set(body) == {"attribute"}:
        body = body["attribute"]
    wire.validate(schemas.CREATE, body)
    uuid = str(uuidlib.UUID(body["uuid"])) if body.get("uuid") else str(uuidlib.uuid4())
    dep_id, key = int(body["deployable_id"]), body["key"]
    if dep_id > wire.MAX_ID:
        raise errors.BadRequest(f"Invalid request body at 'deployable_id': {dep_id} is too large.")
    try:
        with api.db.write() as conn:
            if not db.deployable_exists(conn, dep_id):
                raise errors.BadRequest(f"Deployable with id {dep_id} does not exist.")
            clash = db.taken(conn, dep_id, key, uuid)
            if clash:
                raise errors.Conflict(_duplicate_message(clash, dep_id, key, uuid))
            values = db.create(conn, deployable_id=dep_id, key=key, value=body["value"],
                               uuid=uuid)
    except IntegrityError:
        # A concurrent request took the key or the uuid, or deleted the deployable, first.
        raise errors.Conflict(f"Attribute {key!r} could not be created on deployable {dep_id}: "
                              "a concurrent request changed it; try again.") from None
    wire.respond(resp, to_wire(req, _Row(values)), status=201)


def delete_attribute(req: falcon.Request, resp: falcon.Response, uuid: str) -> None:
    api = req.context.api
    api.policy.authorize("cyborg:attribute:delete", req.context.ctx)
    wire.query_params(req, ())
    with api.db.write() as conn:
        if not db.delete_by_uuid(conn, wire.canonical_uuid(uuid)):
            raise _not_found(uuid)
    wire.no_content(resp)


def _duplicate_message(which: str, dep_id: int, key: str, uuid: str) -> str:
    if which == "uuid":
        return f"An attribute with uuid {uuid} already exists."
    return f"Deployable {dep_id} already has an attribute {key!r}."


def _not_found(uuid: str) -> errors.NotFound:
    return errors.NotFound(f"Attribute {uuid} could not be found.")


class _Row:
    """Attribute access over the values just inserted, to share to_wire with query rows."""

    def __init__(self, values: dict) -> None:
        self.__dict__.update(values)
