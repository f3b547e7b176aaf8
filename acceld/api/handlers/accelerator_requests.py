"""/v2/accelerator_requests: create ARQs from a profile, bind them to an instance, delete them.

A bind answers 202 at once: the ARQs move to BindStarted with a bind job each
in one transaction, and the conductor (woken after the commit) finishes the
bind and tells Nova. Tenants are kept apart in the queries: a non-admin only
ever sees or touches ARQs of their own project, and anything else is a 404.

Each writing responder does its writes in one transaction and answers after the
commit, so one the database rolled back as a deadlock victim or a Galera
certification conflict is run again whole (acceld.db.retry), up to 5 times.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Callable

import falcon
import orjson

from acceld import claim_owner
from acceld.api import arq_limits, claim_targets, errors, microversion, pagination, wire
from acceld.api.handlers.explain import HOSTNAME_RE
from acceld.api.handlers.explain import RULE as EXPLAIN_RULE
from acceld.api.schemas import accelerator_requests as schemas
from acceld.clients import nova
from acceld.clients import placement as pl
from acceld.db import accelerator_requests as db
from acceld.db import bind_jobs
from acceld.db import claims as claims_db
from acceld.db import device_profiles as profiles_db
from acceld.db.retry import retry_on_deadlock

COLLECTION = "accelerator_requests"
SERVICE_TOKEN_REQUIRED = ("This operation requires a service token. Use the Compute API to "
                          "manage instance accelerators.")
_V2_1 = microversion.Version(2, 1)
_V2_4 = microversion.Version(2, 4)  # bind_failure_reason appears
_V2_5 = microversion.Version(2, 5)  # lists take limit and marker
_V2_8 = microversion.Version(2, 8)  # standalone claims; ARQs show consumer_uuid
CLAIM_VERSION = "2.8"
CLAIM_RULE = "acceld:arq:claim"
RELEASE_RULE = "acceld:arq:release"
# ARQs an instance holds or is acquiring: deleting one needs the service role.
_INSTANCE_STATES = frozenset({db.BOUND, db.BIND_STARTED})
_EMPTY_INFO = orjson.Fragment(b"{}")
# Who may read a bind failure's own words (they name hosts and devices).
INVENTORY_RULE = "cyborg:device:get_all"
WITHHELD_REASON = ("The accelerator could not be bound on the chosen host. The reason names "
                   "hardware that only administrators may see; ask one for the details.")


# ---------------------------------------------------------------------------- wire

def serializer(req: falcon.Request) -> Callable:  # type: ignore[type-arg]
    """A row -> dict function for this request (link base and microversion looked up once).

    Rows are tuples in the order of ``db.WIRE_FIELDS``: unpacking one is several times
    cheaper than reading fifteen attributes, which matters for lists of thousands.
    """
    base = f"{wire.base_url(req)}/accelerator/v2/{COLLECTION}/"
    with_reason = req.context.version >= _V2_4
    with_consumer = req.context.version >= _V2_8
    # Reasons name hosts and devices: only who may read the inventory reads them.
    full_reason = with_reason and req.context.api.policy.allows(INVENTORY_RULE, req.context.ctx)
    stamp = wire.timestamp
    fragment = orjson.Fragment
    bound_state = db.BOUND

    def to_wire(row) -> dict:  # type: ignore[no-untyped-def]
        (_id, uuid, state, profile_name, group_id, hostname, rp_uuid, instance, project,
         reason, handle_uuid, handle_type, handle_info, created_at, updated_at,
         consumer) = row
        bound = state == bound_state and handle_uuid is not None
        body = {
            "uuid": uuid,
            "state": state,
            "device_profile_name": profile_name,
            "device_profile_group_id": group_id,
            "hostname": hostname,
            "device_rp_uuid": rp_uuid,
            "instance_uuid": instance,
            "project_id": project,
            "attach_handle_type": handle_type if bound else "",
            "attach_handle_uuid": handle_uuid if bound else None,
            # Stored as JSON text, sent as is.
            "attach_handle_info": fragment(handle_info) if bound else _EMPTY_INFO,
            "links": [{"href": base + uuid, "rel": "self"}],
            "created_at": stamp(created_at),
            "updated_at": stamp(updated_at),
        }
        if with_reason:
            body["bind_failure_reason"] = reason if full_reason or reason is None \
                else WITHHELD_REASON
        if with_consumer:
            body["consumer_uuid"] = consumer
        return body

    return to_wire


def _created_row(values: dict, profile_name: str) -> tuple:
    """A just-inserted ARQ as a tuple in ``db.WIRE_FIELDS`` order."""
    return tuple(profile_name if name == "device_profile_name" else values.get(name)
                 for name in db.WIRE_FIELDS)


# ---------------------------------------------------------------------------- helpers

def _scope(req: falcon.Request) -> str | None:
    """The project a caller is confined to; None for admins (every project).

    Fails closed: a non-admin without a project is refused, never given every project
    (policy refuses such tokens first; this holds even if a policy file lets one in)."""
    ctx = req.context.ctx
    if ctx.is_admin:
        return None
    if not ctx.project_id:
        raise errors.Forbidden("Accelerator requests belong to projects; use a token scoped to "
                               "a project.")
    return ctx.project_id


def _require_service(req: falcon.Request) -> None:
    api = req.context.api
    ctx = req.context.ctx
    if api.conf.api.require_service_token_for_bind and not ctx.has_service_role(
            api.conf.api.service_role):
        refused = ctx.service_token_refused  # a service token was sent, and set aside
        raise errors.Forbidden(f"{SERVICE_TOKEN_REQUIRED} {refused}" if refused
                               else SERVICE_TOKEN_REQUIRED)


def _uuid(value: str, what: str) -> str:
    """Canonical form of a uuid given by the client; 400 naming ``what`` otherwise."""
    try:
        return str(uuidlib.UUID(value))
    except (ValueError, AttributeError, TypeError):
        raise errors.BadRequest(f"Invalid value {value!r} for {what}: expected a UUID.") from None


def _uuid_or_none(value: str) -> str | None:
    try:
        return str(uuidlib.UUID(value))
    except ValueError:
        return None


def _not_found(uuids) -> errors.NotFound:  # type: ignore[no-untyped-def]
    return errors.NotFound(f"Accelerator request(s) {', '.join(sorted(uuids))} could not be "
                           "found.")


def _count_per_group(profile_json: str) -> list[int]:
    """ARQs per group: the sum of the group's ``resources:*`` amounts."""
    return [sum(int(v) for k, v in group.items() if k.startswith("resources:"))
            for group in orjson.loads(profile_json)]


# ---------------------------------------------------------------------------- handlers

@retry_on_deadlock
def create_arqs(req: falcon.Request, resp: falcon.Response) -> None:
    """POST {"device_profile_name": ...}: one Initial ARQ per accelerator the profile asks;
    from 2.8 with "claim": a standalone claim (:func:`_claim`)."""
    api = req.context.api
    api.policy.authorize("cyborg:arq:create", req.context.ctx)
    wire.query_params(req, ())
    body = wire.read_json(req)
    if isinstance(body, dict) and ("claim" in body or "consumer_uuid" in body):
        microversion.require(req.context.version, CLAIM_VERSION)
        api.policy.authorize(CLAIM_RULE, req.context.ctx)
        wire.validate(schemas.CREATE_V2_8, body)
        _claim(req, resp, body)
        return
    wire.validate(schemas.CREATE, body)
    name = body["device_profile_name"].strip()
    limit = api.conf.api.max_arqs_per_create
    project_id = req.context.ctx.project_id
    with arq_limits.write(api, project_id) as quota:
        conn = quota.conn
        profile = profiles_db.get_by_name(conn, name) if name else None
        if profile is None:
            raise errors.NotFound(f"Device profile {name!r} could not be found.")
        counts = _count_per_group(profile.profile_json)
        if sum(counts) > limit:
            raise errors.BadRequest(
                f"Device profile {name} asks for {sum(counts)} accelerators; one request may "
                f"create at most {limit} ARQs ([api] max_arqs_per_create).")
        group_ids = [g for g, count in enumerate(counts) for _ in range(count)]
        quota.check(len(group_ids))  # 403: all or nothing
        created = db.create_many(conn, profile_id=profile.id, group_ids=group_ids,
                                 project_id=project_id)
    to_wire = serializer(req)
    wire.respond(resp, {"arqs": [to_wire(_created_row(v, profile.name)) for v in created]},
                 status=201)


def _claim(req: falcon.Request, resp: falcon.Response, body: dict) -> None:
    """A standalone claim: the ARQs created BindStarted on the providers acceld chose (409
    when none can take them now), with their bind jobs and their consumer, in one
    transaction; the conductor then allocates in Placement and binds (docs/standalone-
    claims.md). 201 with the ARQs (Bound already when ``[api] bind_wait`` sufficed)."""
    api = req.context.api
    ctx = req.context.ctx
    if "claim" not in body:
        raise errors.BadRequest("consumer_uuid is given only with a claim: {\"claim\": {}} "
                                "or {\"claim\": {\"hostname\": ...}}.")
    hostname = body["claim"].get("hostname")
    if hostname is not None and not HOSTNAME_RE.match(hostname):
        raise errors.BadRequest(f"Invalid claim hostname {hostname[:300]!r}: 1 to 255 letters, "
                                "digits, dots, dashes or underscores, starting with a letter "
                                "or digit.")
    name = body["device_profile_name"].strip()
    with api.db.read() as conn:
        profile = profiles_db.get_by_name(conn, name) if name else None
    if profile is None:
        raise errors.NotFound(f"Device profile {name!r} could not be found.")
    counts = _count_per_group(profile.profile_json)
    limit = api.conf.api.max_arqs_per_create
    if sum(counts) > limit:
        raise errors.BadRequest(
            f"Device profile {name} asks for {sum(counts)} accelerators; one request may "
            f"create at most {limit} ARQs ([api] max_arqs_per_create).")
    groups = orjson.loads(profile.profile_json)
    full = api.policy.allows(EXPLAIN_RULE, ctx)
    try:  # before any transaction: it may ask Placement
        targets = claim_targets.choose(api.db, api.placement(), profile.name, groups,
                                       hostname, ctx.project_id, full)
    except claim_targets.UnknownHost as exc:
        raise errors.BadRequest(str(exc)) from None
    except claim_targets.NoCapacity as exc:
        raise errors.Conflict(str(exc)) from None
    shared = body.get("consumer_uuid")
    project_id = ctx.project_id
    consumer = str(uuidlib.UUID(shared)) if shared else None
    if consumer is not None:
        _check_consumer_elsewhere(api, consumer, project_id)
    with arq_limits.write(api, project_id) as quota:
        conn = quota.conn
        again = profiles_db.get_by_name(conn, name)
        if again is None or again.id != profile.id:
            raise errors.NotFound(f"Device profile {name!r} could not be found.")
        try:  # the choice, judged again under the chosen deployables' locks
            claim_targets.confirm(conn, profile.name, groups, targets, hostname,
                                  project_id, full)
        except claim_targets.NoCapacity as exc:
            raise errors.Conflict(str(exc)) from None
        quota.check(len(targets))  # 403: all or nothing
        created = []
        # One consumer for all (the caller's), or each ARQ its own (its uuid).
        for group, host, rp_uuid in targets:
            arq_uuid = str(uuidlib.uuid4())
            row_consumer = consumer or arq_uuid
            try:
                claims_db.ensure_consumer(conn, row_consumer, project_id, ctx.user_id)
            except claims_db.ConsumerTaken as exc:
                raise errors.Conflict(f"Invalid consumer_uuid: {exc}.") from None
            created += claims_db.create_claimed(conn, profile_id=profile.id,
                                                targets=[(group, host, rp_uuid)],
                                                project_id=project_id,
                                                consumer_uuid=row_consumer, uuid=arq_uuid)
        bind_jobs.create(conn, [(row["id"], None) for row in created],
                         global_request_id=ctx.global_id)
    if api.conductor is not None:
        _wake_for(api, [row["id"] for row in created])
    with api.db.read() as conn:
        rows = [db.get_by_uuid(conn, row["uuid"]) for row in created]
    to_wire = serializer(req)
    wire.respond(resp, {"arqs": [to_wire(r) for r in rows if r is not None]}, status=201)


def _check_consumer_elsewhere(api, consumer: str, project_id: str | None) -> None:  # type: ignore[no-untyped-def]
    """409 when Placement holds ``consumer`` as another's (acceld.claim_owner: a Nova
    instance's, another project's claim) or Nova has an instance of that uuid (any project,
    any state: a shelved one holds nothing in Placement), in the words used for every
    consumer that is not the caller's; 503 when either configured service cannot be asked.
    Before any transaction: these are calls."""
    client = api.placement()
    if client is not None:
        try:
            held = client.consumer(consumer)
        except pl.PlacementUnavailable as exc:
            raise errors.ServiceUnavailable(
                f"Placement could not be asked whether consumer {consumer} is free to claim "
                f"under ({exc}); try again later.") from None
        with api.db.read() as conn:
            ours = claims_db.acceld_providers(conn, held.allocations)
        if claim_owner.refusal(consumer, held, sorted(set(held.allocations) - ours),
                               project_id):
            raise errors.Conflict(f"Invalid consumer_uuid: "
                                  f"{claims_db.NOT_YOURS.format(consumer)}.")
    instances = api.nova()
    if instances is not None:
        try:
            instance = instances.is_instance(consumer)
        except nova.NovaUnavailable as exc:
            raise errors.ServiceUnavailable(
                f"Nova could not be asked whether consumer {consumer} is an instance "
                f"({exc}); try again later.") from None
        if instance:
            raise errors.Conflict(f"Invalid consumer_uuid: "
                                  f"{claims_db.NOT_YOURS.format(consumer)}.")


def list_arqs(req: falcon.Request, resp: falcon.Response) -> None:
    """GET [?instance=<uuid>][&bind_state=resolved]; 423 while an instance's bind is open.

    From 2.5 also [&limit=N][&marker=<uuid>] (acceld.api.pagination); below 2.5 those are
    unknown parameters (400) and the list is whole, as upstream's."""
    api = req.context.api
    api.policy.authorize("cyborg:arq:get_all", req.context.ctx)
    paged = req.context.version >= _V2_5
    params = wire.query_params(req, ("instance", "bind_state")
                               + (pagination.PARAMS if paged else ()))
    instance = _uuid(params["instance"], "query parameter instance") \
        if "instance" in params else None
    bind_state = params.get("bind_state")
    if bind_state is not None and bind_state != "resolved":
        raise errors.BadRequest(f"Invalid value {bind_state!r} for query parameter bind_state: "
                                "the only value accepted is 'resolved'.")
    page = pagination.requested(req, params) if paged else None
    marker = _uuid(page.marker, "query parameter marker") \
        if page and page.marker is not None else None
    with api.db.read() as conn:
        scope = _scope(req)
        after = db.id_of(conn, marker, scope) if marker else None
        if marker and after is None:
            # Unknown and another project's read the same: a marker is no existence oracle.
            raise errors.BadRequest(f"Marker {marker} could not be found.")
        rows = db.list_arqs(conn, project_id=scope, instance_uuid=instance, after_id=after,
                            limit=page.limit + 1 if page else None)
    more = page is not None and len(rows) > page.limit
    rows = rows[:page.limit] if more else rows
    state = db.WIRE_FIELDS.index("state")  # rows are driver tuples in WIRE_FIELDS order
    if bind_state and instance and any(r[state] not in db.RESOLVED for r in rows):
        raise errors.Locked("")
    to_wire = serializer(req)
    body = {"arqs": [to_wire(r) for r in rows]}
    if more:
        body["arqs_links"] = pagination.next_links(req, COLLECTION, params,
                                                    rows[-1][db.WIRE_FIELDS.index("uuid")])
    wire.respond(resp, body)


def show_arq(req: falcon.Request, resp: falcon.Response, uuid: str) -> None:
    api = req.context.api
    api.policy.authorize("cyborg:arq:get_one", req.context.ctx)
    wire.query_params(req, ())
    canonical = _uuid_or_none(uuid)
    row = None
    if canonical:
        with api.db.read() as conn:
            row = db.get_by_uuid(conn, canonical, _scope(req))
    if row is None:
        raise _not_found([uuid])
    wire.respond(resp, serializer(req)(row))


@retry_on_deadlock
def patch_collection(req: falcon.Request, resp: falcon.Response) -> None:
    """PATCH /accelerator_requests (Nova): bind or unbind the ARQs the body is keyed by."""
    _patch(req, resp, None)


@retry_on_deadlock
def patch_arq(req: falcon.Request, resp: falcon.Response, uuid: str) -> None:
    """PATCH /accelerator_requests/{uuid} (SDK, CLI): the same body, keyed by that uuid."""
    _patch(req, resp, uuid)


@retry_on_deadlock
def delete_by_query(req: falcon.Request, resp: falcon.Response) -> None:
    """DELETE ?arqs=u1,u2 (all or nothing) or ?instance=<uuid> (idempotent)."""
    api = req.context.api
    api.policy.authorize("cyborg:arq:delete", req.context.ctx)
    params = wire.query_params(req, ("arqs", "instance"))
    if ("arqs" in params) == ("instance" in params):
        raise errors.BadRequest("Give exactly one of ?arqs=<uuid>[,<uuid>...] or "
                                "?instance=<uuid>.")
    if "instance" in params:
        instance = _uuid(params["instance"], "query parameter instance")
        _require_service(req)
        with api.db.write() as conn:
            rows = db.lock(conn, instance_uuid=instance, project_id=_scope(req))
            db.delete_locked(conn, rows)
        wire.no_content(resp)
        return
    # Not stripped: a uuid with whitespace or a newline around it is not a uuid (400).
    given = [part for part in params["arqs"].split(",") if part]
    if not given:
        raise errors.BadRequest("?arqs= names no accelerator request.")
    limit = api.conf.api.max_arqs_per_delete
    if len(given) > limit:
        raise errors.BadRequest(f"?arqs= names {len(given)} accelerator requests; at most "
                                f"{limit} per request ([api] max_arqs_per_delete).")
    _delete_uuids(req, resp, {_uuid(u, "query parameter arqs") for u in given})


@retry_on_deadlock
def delete_arq(req: falcon.Request, resp: falcon.Response, uuid: str) -> None:
    api = req.context.api
    api.policy.authorize("cyborg:arq:delete", req.context.ctx)
    wire.query_params(req, ())
    canonical = _uuid_or_none(uuid)
    if canonical is None:
        raise _not_found([uuid])
    _delete_uuids(req, resp, {canonical})


# ---------------------------------------------------------------------------- internals

def _delete_uuids(req: falcon.Request, resp: falcon.Response, uuids: set[str]) -> None:
    api = req.context.api
    with api.db.write() as conn:
        rows = db.lock(conn, uuids=uuids, project_id=_scope(req))
        missing = uuids - {r.uuid for r in rows}
        if missing:
            raise _not_found(missing)
        if any(_held_by_instance(r) for r in rows):
            _require_service(req)  # bound ARQs are unbound first: that is Nova's to do
        if any(r.consumer_uuid for r in rows):
            api.policy.authorize(RELEASE_RULE, req.context.ctx)
            claims_db.record_released(conn, rows, req.context.ctx.user_id)
        db.delete_locked(conn, rows)
    wire.no_content(resp)


def _held_by_instance(row) -> bool:  # type: ignore[no-untyped-def]
    """Bound, binding, or failed while still naming its instance (Nova cleans those up);
    never a standalone claim's (its owner releases it)."""
    if row.consumer_uuid:
        return False
    return row.state in _INSTANCE_STATES or (row.state == db.BIND_FAILED
                                             and row.instance_uuid is not None)


def _patch(req: falcon.Request, resp: falcon.Response, path_uuid: str | None) -> None:
    api = req.context.api
    ctx = req.context.ctx
    api.policy.authorize("cyborg:arq:update", ctx)
    wire.query_params(req, ())
    _require_service(req)
    body = wire.read_json(req)
    plans = _parse_patch(req, body)
    if path_uuid is not None and set(plans) != {_uuid_or_none(path_uuid)}:
        if _uuid_or_none(path_uuid) is None:
            raise _not_found([path_uuid])
        raise errors.BadRequest(f"The patch for /{COLLECTION}/{path_uuid} must be keyed by "
                                "that uuid alone.")
    with api.db.write() as conn:
        rows = db.lock(conn, uuids=plans, project_id=_scope(req))
        missing = set(plans) - {r.uuid for r in rows}
        if missing:
            raise _not_found(missing)
        binds, unbinds = [], []
        for row in rows:
            if row.consumer_uuid:
                raise errors.Conflict(f"Accelerator request {row.uuid} is a standalone claim "
                                      f"(consumer {row.consumer_uuid}); Nova neither binds nor "
                                      "unbinds it: delete it to release it.")
            plan = plans[row.uuid]
            if plan is None:
                if row.state not in db.SOURCES[db.UNBOUND] and row.state != db.UNBOUND:
                    raise errors.Conflict(f"Accelerator request {row.uuid} is {row.state}; "
                                          "it cannot be unbound.")
                if row.state != db.UNBOUND:
                    unbinds.append(row)
            else:
                if row.state not in db.SOURCES[db.BIND_STARTED]:
                    raise errors.Conflict(
                        f"Accelerator request {row.uuid} is {row.state}; only an Initial or "
                        "Unbound request can be bound (unbind it first).")
                binds.append({"id": row.id, "project_id": plan.get("project_id",
                                                                    row.project_id), **plan})
        # Everything is validated: now change it.
        moved = db.start_binds(conn, binds)
        if moved not in (-1, len(binds)):
            raise errors.Conflict("Accelerator requests changed state during the bind; retry.")
        bind_jobs.create(conn, [(b["id"], b["instance_uuid"]) for b in binds],
                         global_request_id=req.context.ctx.global_id)
        db.unbind(conn, unbinds)
    if binds and api.conductor is not None:
        _wake_for(api, [b["id"] for b in binds])
    wire.no_content(resp, 202)


def _wake_for(api, arq_ids: list[int]) -> None:  # type: ignore[no-untyped-def]
    """Wake a conductor for the binds just committed; with ``[api] bind_wait``, answer the
    PATCH once they resolved (a client's next GET finds them ``Bound``), or when it ran out."""
    wait = api.conf.api.bind_wait
    if wait > 0:
        api.conductor.wait_for_binds(arq_ids, wait)
    else:
        api.conductor.wake_binds()


def _parse_patch(req: falcon.Request, body) -> dict[str, dict | None]:  # type: ignore[no-untyped-def]
    """{arq uuid: binding fields (bind) or None (unbind)}, or 400 for the first problem."""
    api = req.context.api
    version = req.context.version
    if not isinstance(body, dict) or not body:
        raise errors.BadRequest("The patch must be a non-empty object keyed by ARQ uuid, each "
                                "with a list of JSON-patch operations.")
    limit = api.conf.api.max_patch_operations
    if len(body) > limit:
        raise errors.BadRequest(f"The patch names {len(body)} accelerator requests; at most "
                                f"{limit} per request ([api] max_patch_operations).")
    allowed = schemas.BIND_PATHS + (("/project_id",) if version >= _V2_1 else ())
    for key, ops in body.items():
        for op in ops if isinstance(ops, list) else ():
            if not isinstance(op, dict):
                continue
            if op.get("op") not in ("add", "remove"):
                raise errors.BadRequest(f"Invalid patch for {key}: op {op.get('op')!r} is not "
                                        "supported; use 'add' (bind) or 'remove' (unbind).")
            if op.get("path") == "/project_id" and version < _V2_1:
                raise errors.BadRequest(f"Invalid patch for {key}: /project_id can be set only "
                                        "from microversion 2.1.")
            if op.get("path") not in allowed:
                raise errors.BadRequest(f"Invalid patch for {key}: path {op.get('path')!r} "
                                        f"cannot be patched; allowed: {', '.join(allowed)}.")
    wire.validate(schemas.PATCH_V2_1 if version >= _V2_1 else schemas.PATCH_V2_0, body,
                  "patch")
    plans: dict[str, dict | None] = {}
    for key, ops in body.items():
        uuid = str(uuidlib.UUID(key))
        if uuid in plans:
            raise errors.BadRequest(f"Accelerator request {uuid} appears twice in the patch.")
        kinds = {op["op"] for op in ops}
        paths = [op["path"] for op in ops]
        if len(kinds) > 1:
            raise errors.BadRequest(f"Invalid patch for {uuid}: mixes add and remove; bind "
                                    "with add operations only, unbind with remove only.")
        if len(set(paths)) != len(paths):
            raise errors.BadRequest(f"Invalid patch for {uuid}: a path appears twice.")
        if kinds == {"remove"}:
            if "/project_id" in paths:
                raise errors.BadRequest(f"Invalid patch for {uuid}: /project_id cannot be "
                                        "removed.")
            plans[uuid] = None
            continue
        missing = [p for p in schemas.BIND_PATHS if p not in paths]
        if missing:
            raise errors.BadRequest(f"Invalid patch for {uuid}: a bind needs "
                                    f"{', '.join(schemas.BIND_PATHS)}; missing "
                                    f"{', '.join(missing)}.")
        for op in ops:
            if "value" not in op:
                raise errors.BadRequest(f"Invalid patch for {uuid}: add {op['path']} needs a "
                                        "value.")
            wire.validate(schemas.ADD_VALUES[op["path"]], op["value"],
                          f"value of {op['path']} for {uuid}")
        values = {op["path"][1:]: op["value"] for op in ops}
        if "project_id" in values and not req.context.ctx.is_admin:
            raise errors.Forbidden("Only an administrator may set /project_id in a bind.")
        values["device_rp_uuid"] = str(uuidlib.UUID(values["device_rp_uuid"]))
        values["instance_uuid"] = str(uuidlib.UUID(values["instance_uuid"]))
        plans[uuid] = values
    return plans
