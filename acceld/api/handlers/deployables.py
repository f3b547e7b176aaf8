"""/v2/deployables: offerable units of devices, and programming them (bitstreams, firmware).

A program request goes API -> conductor -> the node's agent -> the
deployable's driver, synchronously; ``bitstream_id`` changes only when the
driver succeeded. Two request forms:

- upstream's ``PATCH /{uuid}/program`` (also at the SDK's ``/{uuid}/program/{uuid}``)
  with ``[{"path": "/program", "op": "replace", "value": [{"image_uuid": ...}]}]``:
  200 with the deployable;
- the seed's ``PATCH /{uuid}`` with one ``/bitstream`` or ``/firmware`` operation:
  204, no body.

From microversion 2.5 the upstream form is asynchronous: 202 with the
deployable as soon as the conductor has found it and its agent, the program
running in the conductor; the deployable shows ``program_status``
(PROGRAMMING, SUCCEEDED, FAILED) and ``program_reason``. Below 2.5 nothing
changes: the request answers when the program is done.
"""

from __future__ import annotations

import json
import uuid as uuidlib

import falcon
import orjson
import requests

from acceld.api import errors, wire
from acceld.api.microversion import Version
from acceld.api.schemas import deployables as schemas
from acceld.clients.internal import InternalError
from acceld.db import deployables as db

COLLECTION = "deployables"
# Programs can be started asynchronously (202) and followed on the deployable.
ASYNC_PROGRAM_VERSION = Version(2, 5)


def to_wire(req: falcon.Request, row, attrs: list[tuple[str, str]]) -> dict:  # type: ignore[no-untyped-def]
    base = wire.base_url(req)
    body = {
        "uuid": row.uuid,
        "parent_id": row.parent_id,
        "root_id": row.root_id,
        "name": row.name,
        "num_accelerators": row.num_accelerators,
        "device_id": row.device_id,
        # A JSON string of one-key objects, in creation order, formatted as upstream's.
        "attributes_list": json.dumps([{k: v} for k, v in attrs]),
        "rp_uuid": row.rp_uuid,
        "driver_name": row.driver_name,
        "bitstream_id": row.bitstream_id,
        "links": [
            {"href": f"{base}/accelerator/v2/{COLLECTION}/{row.uuid}", "rel": "self"},
            {"href": f"{base}/accelerator/{COLLECTION}/{row.uuid}", "rel": "bookmark"},
        ],
        "created_at": wire.timestamp(row.created_at),
        "updated_at": wire.timestamp(row.updated_at),
    }
    if req.context.version >= ASYNC_PROGRAM_VERSION:
        body["program_status"] = row.program_status
        body["program_reason"] = row.program_reason
    return body


def list_deployables(req: falcon.Request, resp: falcon.Response) -> None:
    api = req.context.api
    api.policy.authorize("cyborg:deployable:get_all", req.context.ctx)
    params = wire.query_params(req, db.FILTERS)
    wire.validate(schemas.LIST_QUERY, params, "query string")
    filters: dict[str, object] = dict(params)
    if "device_id" in filters:
        filters["device_id"] = wire.int_id(params["device_id"], "query parameter device_id")
    if "rp_uuid" in filters:
        filters["rp_uuid"] = str(uuidlib.UUID(params["rp_uuid"]))
    with api.db.read() as conn:
        rows, attrs = db.list_deployables(conn, filters)
    wire.respond(resp, {"deployables": [to_wire(req, r, attrs.get(r.id, [])) for r in rows]})


def show_deployable(req: falcon.Request, resp: falcon.Response, uuid: str) -> None:
    api = req.context.api
    api.policy.authorize("cyborg:deployable:get_one", req.context.ctx)
    wire.query_params(req, ())
    wire.respond(resp, _load(req, uuid))


def program(req: falcon.Request, resp: falcon.Response, uuid: str,
            again: str | None = None) -> None:
    """Upstream's PATCH /{uuid}/program (and /{uuid}/program/{uuid}): 200 with the deployable
    once programmed; from 2.5, 202 with it once the program has started."""
    api = req.context.api
    api.policy.authorize("cyborg:deployable:program", req.context.ctx)
    wire.query_params(req, ())
    if again is not None and wire.canonical_uuid(again) != wire.canonical_uuid(uuid):
        raise errors.BadRequest(f"The path names two deployables ({uuid} and {again}); "
                                "send PATCH /deployables/{uuid}/program.")
    body = wire.read_json(req)
    wire.validate(schemas.PROGRAM, body)
    run_async = req.context.version >= ASYNC_PROGRAM_VERSION
    _program(req, uuid, "bitstream", body[0]["value"][0]["image_uuid"], run_async=run_async)
    wire.respond(resp, _load(req, uuid), status=202 if run_async else 200)


def patch_deployable(req: falcon.Request, resp: falcon.Response, uuid: str) -> None:
    """The seed's PATCH /{uuid} on /bitstream or /firmware: 204, no body."""
    api = req.context.api
    api.policy.authorize("cyborg:deployable:program", req.context.ctx)
    wire.query_params(req, ())
    body = wire.read_json(req)
    wire.validate(schemas.SEED_PATCH, body)
    op = body[0]
    _program(req, uuid, op["path"].lstrip("/"), op["value"])
    wire.no_content(resp)


def _load(req: falcon.Request, uuid: str) -> dict:
    with req.context.api.db.read() as conn:
        row, attrs = db.get_by_uuid(conn, wire.canonical_uuid(uuid))
    if row is None:
        raise _not_found(uuid)
    return to_wire(req, row, attrs)


def _program(req: falcon.Request, uuid: str, kind: str, image_id: str, *,
             run_async: bool = False) -> None:
    """Ask the conductor to program (or, ``run_async``, to start programming); map its
    answer to the client's error, if any."""
    api = req.context.api
    given, uuid = uuid, wire.canonical_uuid(uuid)
    with api.db.read() as conn:
        if db.program_target(conn, uuid) is None:
            raise _not_found(given)
    if api.conductor is None:
        raise errors.ServiceUnavailable(
            "Programming needs the conductor, and this API server has no internal secret to "
            "call it with; configure [internal] shared_secret.")
    body = {"kind": kind, "image_id": str(uuidlib.UUID(image_id))}
    wait = program_wait(api.conf)
    if run_async:
        body["async"] = True
        wait = START_WAIT
    try:
        api.conductor.call("POST", f"/deployables/{uuid}/program", body, timeout=wait)
    except InternalError as exc:
        raise backend_error(exc) from None
    except requests.Timeout:
        if run_async:
            raise errors.ServiceUnavailable(
                f"The conductor did not answer within {wait:.0f} s; read the deployable's "
                "program_status to see whether the program started.") from None
        raise errors.BadGateway(f"The conductor did not finish programming deployable {uuid} "
                                f"within {wait:.0f} s; it may still complete: read the "
                                "deployable's bitstream_id later.") from None
    except requests.RequestException as exc:
        raise errors.ServiceUnavailable(f"The conductor could not be reached to program "
                                        f"deployable {uuid}: {exc.__class__.__name__}.") from None


# How long the API waits for the conductor to start an asynchronous program.
START_WAIT = 30.0


def program_wait(conf) -> float:  # type: ignore[no-untyped-def]
    """How long the API waits for a program: a wait for an earlier program of the same
    deployable (the conductor's lease) plus this one, each up to program_timeout."""
    return 2.0 * conf.conductor.program_timeout + 15


# Conductor answers passed on as they are: client mistakes and states the client can act on.
_PASSED_ON = {400: errors.BadRequest, 404: errors.NotFound, 409: errors.Conflict,
              502: errors.BadGateway, 503: errors.ServiceUnavailable}


def backend_error(exc: InternalError) -> errors.ApiError:
    """The client-facing error for a failed internal call, keeping the backend's message."""
    message = exc.message
    try:
        message = orjson.loads(exc.message)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    if exc.status == 401:
        return errors.BadGateway("The conductor refused the API's internal credential; "
                                 "check that both use the same [internal] shared_secret.")
    kind = _PASSED_ON.get(exc.status)
    if kind is None:
        kind = errors.BadRequest if exc.status < 500 else errors.BadGateway
    return kind(message)


def _not_found(uuid: str) -> errors.NotFound:
    return errors.NotFound(f"Deployable {uuid} could not be found.")
