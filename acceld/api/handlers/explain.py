"""GET /v2/device_profiles/{name_or_uuid}/explain (microversion 2.7, admin by policy).

Why a device profile can or cannot get an accelerator: Placement's allocation
candidates for each request group beside acceld's own view of every provider, with
every reason that keeps one from serving, and a one-line verdict first
(acceld.explain; docs/explain.md). ``?hostname=`` narrows both views to one host;
``?member_of=`` adds the aggregates Nova's prefilters would ask for; ``?project_id=``
also asks whether that project may create the profile's ARQs now ([quota]). Placement being
unreachable is part of the answer (200), never a failure of the request.
"""

from __future__ import annotations

import re
import uuid as uuidlib

import falcon

from acceld import explain
from acceld.api import arq_limits, errors, microversion, wire

EXPLAIN_VERSION = "2.7"
RULE = "acceld:device_profile:explain"
# Host names as agents and Nova report them: letters, digits, dots, dashes, underscores.
HOSTNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}\Z")
MAX_AGGREGATES = 64


def _hostname(value: str | None) -> str | None:
    if value is None:
        return None
    if not HOSTNAME_RE.match(value):
        raise errors.BadRequest(f"Invalid hostname {value[:300]!r}: 1 to 255 letters, digits, "
                                "dots, dashes or underscores, starting with a letter or digit.")
    return value


def _member_of(value: str | None) -> tuple[str, ...]:
    """``in:<uuid>,<uuid>`` or ``<uuid>,...``: the aggregates, any of which will do."""
    if value is None:
        return ()
    items = value[3:] if value.startswith("in:") else value
    out = []
    for item in items.split(","):
        try:
            out.append(str(uuidlib.UUID(item.strip())))
        except ValueError:
            raise errors.BadRequest(f"Invalid member_of {value[:300]!r}: expected aggregate "
                                    "uuids separated by commas, optionally after 'in:'."
                                    ) from None
    if len(out) > MAX_AGGREGATES:
        raise errors.BadRequest(f"Invalid member_of: at most {MAX_AGGREGATES} aggregates.")
    return tuple(out)


def _project(value: str | None) -> str | None:
    if value is not None and not 0 < len(value) <= 255:
        raise errors.BadRequest("Invalid project_id: 1 to 255 characters.")
    return value


def explain_profile(req: falcon.Request, resp: falcon.Response, ident: str) -> None:
    microversion.require(req.context.version, EXPLAIN_VERSION)
    api = req.context.api
    api.policy.authorize(RULE, req.context.ctx)
    params = wire.query_params(req, ("hostname", "member_of", "project_id"))
    hostname = _hostname(params.get("hostname"))
    member_of = _member_of(params.get("member_of"))
    project_id = _project(params.get("project_id"))
    try:
        body = explain.explain(
            api.db, api.placement(), ident, hostname, member_of,
            api.conf.conductor.reserve_devices_of_down_agents, project_id,
            None if project_id is None else arq_limits.refuser(api.conf, project_id))
    except explain.ProfileNotFound as exc:
        raise errors.NotFound(str(exc)) from None
    wire.respond(resp, body)
