"""/v2/device_profiles: named requests for accelerators, in request groups."""

from __future__ import annotations

import uuid as uuidlib

import falcon
import orjson
from sqlalchemy.exc import IntegrityError

from acceld.api import errors, microversion, wire
from acceld.api.schemas import device_profiles as schemas
from acceld.db import device_profiles as db

COLLECTION = "device_profiles"


def is_uuid(value: str) -> bool:
    try:
        uuidlib.UUID(value)
    except ValueError:
        return False
    return True


def to_wire(req: falcon.Request, row) -> dict:  # type: ignore[no-untyped-def]
    return _serializer(req)(row)


def _serializer(req: falcon.Request):  # type: ignore[no-untyped-def]
    """A row-to-dict function for this request: the link base is computed once, and rows are
    unpacked as tuples (attribute access on result rows cost more than the rest together)."""
    base = f"{wire.base_url(req)}/accelerator/v2/{COLLECTION}/"
    fragment = orjson.Fragment
    stamp = wire.timestamp

    def serialize(row) -> dict:  # type: ignore[no-untyped-def]
        _id, uuid, name, description, profile_json, created_at, updated_at = row
        return {
            "uuid": uuid,
            "name": name,
            "description": description,
            # Stored as JSON text and sent as is: no parse, no re-encode.
            "groups": fragment(profile_json),
            "created_at": stamp(created_at),
            "updated_at": stamp(updated_at),
            "links": [{"href": base + uuid, "rel": "self"}],
        }

    return serialize


def list_profiles(req: falcon.Request, resp: falcon.Response) -> None:
    api = req.context.api
    api.policy.authorize("cyborg:device_profile:get_all", req.context.ctx)
    params = wire.query_params(req, ("name",))
    names = _split_names(params["name"]) if "name" in params else None
    with api.db.read() as conn:
        rows = db.list_profiles(conn, names)
    serialize = _serializer(req)
    wire.respond(resp, {"device_profiles": [serialize(r) for r in rows]})


def show_profile(req: falcon.Request, resp: falcon.Response, ident: str) -> None:
    """By uuid at any version; by name from 2.2."""
    api = req.context.api
    api.policy.authorize("cyborg:device_profile:get_one", req.context.ctx)
    wire.query_params(req, ())
    with api.db.read() as conn:
        if is_uuid(ident):
            row = db.get_by_uuid(conn, str(uuidlib.UUID(ident)))
        else:
            microversion.require(req.context.version, "2.2")
            row = db.get_by_name(conn, ident)
    if row is None:
        raise errors.NotFound(f"Device profile {ident} could not be found.")
    wire.respond(resp, {"device_profile": to_wire(req, row)})


def create_profile(req: falcon.Request, resp: falcon.Response) -> None:
    """POST a one-item list; 201 with the bare profile."""
    api = req.context.api
    api.policy.authorize("cyborg:device_profile:create", req.context.ctx)
    wire.query_params(req, ())
    body = wire.read_json(req)
    if isinstance(body, list):
        body = [_strip_group_keys(item) for item in body]
    _check_group_keys(body)
    wire.validate(schemas.CREATE, body)
    profile = body[0]
    uuid = str(uuidlib.UUID(profile["uuid"])) if profile.get("uuid") else None
    groups_json = orjson.dumps(profile["groups"]).decode()
    try:
        with api.db.write() as conn:
            values = db.create(conn, name=profile["name"], groups_json=groups_json,
                               description=profile.get("description"), uuid=uuid)
    except IntegrityError:
        # The unique constraints on name and uuid decide, also between concurrent creates, in
        # the one INSERT; which of the two was hit is looked up only now, for the message.
        with api.db.read() as conn:
            taken = db.name_or_uuid_taken(conn, profile["name"], uuid or "")
        raise errors.Conflict(_duplicate_message(taken or "name", profile["name"], uuid)) \
            from None
    row = (None, values["uuid"], values["name"], values["description"], values["profile_json"],
           values["created_at"], values["updated_at"])  # as db.list_profiles returns rows
    wire.respond(resp, to_wire(req, row), status=201)


def delete_profiles(req: falcon.Request, resp: falcon.Response, ident: str) -> None:
    """DELETE /{uuid}, /{name} or /{name1,name2}: all or nothing."""
    wire.query_params(req, ())
    _delete(req, resp, _split_names(ident))


def delete_by_query(req: falcon.Request, resp: falcon.Response) -> None:
    """DELETE ?value=name1,name2 (what python-cyborgclient sends)."""
    params = wire.query_params(req, ("value",))
    if not params.get("value"):
        raise errors.BadRequest("Name the device profiles to delete: ?value=<name>[,<name>...]")
    _delete(req, resp, _split_names(params["value"]))


def _delete(req: falcon.Request, resp: falcon.Response, idents: list[str]) -> None:
    api = req.context.api
    api.policy.authorize("cyborg:device_profile:delete", req.context.ctx)
    if not idents:
        raise errors.BadRequest("Name at least one device profile to delete.")
    wanted = {str(uuidlib.UUID(i)) if is_uuid(i) else i for i in idents}
    with api.db.write() as conn:
        rows = db.find(conn, list(wanted))
        found = {r.uuid for r in rows} | {r.name for r in rows}
        missing = sorted(wanted - found)
        if missing:
            raise errors.NotFound(f"Device profile(s) {', '.join(missing)} could not be found.")
        ids = [r.id for r in rows]
        if db.count_in_use(conn, ids):
            raise errors.Conflict("Device profile(s) are in use by accelerator requests; "
                                  "delete those first.")
        db.delete_ids(conn, ids)
    wire.no_content(resp)


def _split_names(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _strip_group_keys(item):  # type: ignore[no-untyped-def]
    """Spaces around group keys and values are not meaningful; upstream strips them. Two keys
    that become one are refused: keeping either would silently drop the other's value."""
    if not isinstance(item, dict) or not isinstance(item.get("groups"), list):
        return item
    groups = []
    for index, group in enumerate(item["groups"]):
        if isinstance(group, dict):
            stripped = {k.strip(): (v.strip() if isinstance(v, str) else v)
                        for k, v in group.items()}
            if len(stripped) < len(group):
                raise errors.BadRequest(f"Invalid request body at 'groups/{index}': two keys are "
                                        "the same once surrounding spaces are removed.")
            group = stripped
        groups.append(group)
    return {**item, "groups": groups}


def _check_group_keys(body) -> None:  # type: ignore[no-untyped-def]
    """Precise messages for bad group keys, before the schema's generic ones."""
    if not isinstance(body, list):
        return
    for item in body:
        groups = item.get("groups") if isinstance(item, dict) else None
        for index, group in enumerate(groups if isinstance(groups, list) else []):
            for key in group if isinstance(group, dict) else ():
                problem = schemas.group_key_problem(key)
                if problem:
                    raise errors.BadRequest(f"Invalid request body at 'groups/{index}': {problem}")


def _duplicate_message(which: str, name: str, uuid: str | None) -> str:
    if which == "uuid":
        return f"A device profile with uuid {uuid} already exists."
    return f"A device profile named {name} already exists."
