"""Every endpoint times every persona, with upstream's default allow or deny.

The cases come from one table (route, method -> who may, what a permitted call
answers). A test fails when a route in ``acceld.api.routes.ROUTES`` has no
row here, so a new endpoint cannot ship without its policy expectations.

Personas (noauth headers, as keystonemiddleware would set them from tokens,
with Keystone's implied roles): admin; member, reader and manager of project
A (the data's project) and of project B; nova's service user; nova acting for a
member of A (the user's token plus nova's service token); a member of A who
holds the service role on their own token (not a service token); and domain-
and system-scoped tokens of every persona, which see no project data at all.
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass
from typing import Callable

import pytest
from falcon import testing

from acceld.api import routes
from acceld.api.app import build_app
from tests.helpers import fault
from tests.support import inventory

A, B = "project-a", "project-b"

PERSONAS: dict[str, dict[str, str]] = {
    "admin": {"X-User-Id": "u-admin", "X-Project-Id": "admin",
              "X-Roles": "admin,manager,member,reader"},
    "a_manager": {"X-User-Id": "u-am", "X-Project-Id": A, "X-Roles": "manager,member,reader"},
    "a_member": {"X-User-Id": "u-a", "X-Project-Id": A, "X-Roles": "member,reader"},
    "a_reader": {"X-User-Id": "u-ar", "X-Project-Id": A, "X-Roles": "reader"},
    "b_manager": {"X-User-Id": "u-bm", "X-Project-Id": B, "X-Roles": "manager,member,reader"},
    "b_member": {"X-User-Id": "u-b", "X-Project-Id": B, "X-Roles": "member,reader"},
    "b_reader": {"X-User-Id": "u-br", "X-Project-Id": B, "X-Roles": "reader"},
    "service": {"X-User-Id": "u-nova", "X-Project-Id": "service", "X-Roles": "service",
                "X-Service-Roles": "service"},
    "nova_for_a": {"X-User-Id": "u-a", "X-Project-Id": A, "X-Roles": "member,reader",
                   "X-Service-Roles": "service"},
    "a_member_service_role": {"X-User-Id": "u-as", "X-Project-Id": A,
                              "X-Roles": "service,member,reader"},
    "domain_admin": {"X-User-Id": "u-da", "X-Domain-Id": "default",
                     "X-Roles": "admin,manager,member,reader"},
    "domain_manager": {"X-User-Id": "u-dmg", "X-Domain-Id": "default",
                       "X-Roles": "manager,member,reader"},
    "domain_member": {"X-User-Id": "u-dm", "X-Domain-Id": "default", "X-Roles": "member,reader"},
    "domain_reader": {"X-User-Id": "u-dr", "X-Domain-Id": "default", "X-Roles": "reader"},
    "system_admin": {"X-User-Id": "u-sa", "OpenStack-System-Scope": "all",
                     "X-Roles": "admin,manager,member,reader"},
    "system_reader": {"X-User-Id": "u-sr", "OpenStack-System-Scope": "all", "X-Roles": "reader"},
    # A domain token that also carries a stale project header must not count as the project.
    "domain_admin_with_project": {"X-User-Id": "u-dap", "X-Domain-Id": "default",
                                  "X-Project-Id": A, "X-Roles": "admin,member,reader"},
}
# Tokens scoped to a domain or the system: no rule of acceld's is registered for them.
UNSCOPED = {p for p, h in PERSONAS.items() if "X-Domain-Id" in h or "OpenStack-System-Scope" in h}

# Who passes each kind of rule (upstream defaults; the target is the caller's own project).
READER_OR_ADMIN = {"admin", "a_manager", "a_member", "a_reader", "b_manager", "b_member",
                   "b_reader", "nova_for_a", "a_member_service_role"}
MEMBER_OR_SERVICE = {"admin", "a_manager", "a_member", "b_manager", "b_member", "service",
                     "nova_for_a", "a_member_service_role"}
MANAGER_OR_ADMIN = {"admin", "a_manager", "b_manager"}
ADMIN_ONLY = {"admin"}
EVERYONE = set(PERSONAS)
# Who can see project A's ARQs.
SEES_A = {"admin", "a_manager", "a_member", "a_reader", "nova_for_a", "a_member_service_role"}


@dataclass
class World:
    """What every case starts from: a profile, inventory, and (when ARQs exist) A's ARQ."""

    profile: str
    device: str
    deployable: str
    deployable_id: int
    rp_uuid: str
    attribute: str
    arq: str | None


@dataclass
class Case:
    route: str
    method: str
    rule: str | None           # None: public
    allowed: set[str]
    ok: int                    # status of a permitted call
    path: Callable[[World], str] = lambda w: ""
    body: Callable[[World], object] | None = None
    query: str = ""
    headers: dict[str, str] | None = None
    # Permitted by policy but answered 404 because the object is another project's.
    hidden_from: set[str] | None = None
    # Beyond policy, needs the service role (a service token).
    needs_service: bool = False


def _bind(w: World, op: str = "add") -> dict:
    ops = [{"op": op, "path": "/hostname", "value": "node1"},
           {"op": op, "path": "/device_rp_uuid", "value": w.rp_uuid},
           {"op": op, "path": "/instance_uuid", "value": str(uuidlib.uuid4())}]
    if op == "remove":
        ops = [{"op": "remove", "path": o["path"]} for o in ops]
    return {w.arq: ops}


NOT_A = EVERYONE - SEES_A
ARQ = "/v2/accelerator_requests"
CASES: list[Case] = [
    Case("/", "GET", None, EVERYONE, 200, lambda w: "/"),
    Case("/v2", "GET", None, EVERYONE, 200, lambda w: "/v2"),
    # Device profiles: shared by every project.
    Case("/v2/device_profiles", "GET", "cyborg:device_profile:get_all", READER_OR_ADMIN, 200),
    Case("/v2/device_profiles", "POST", "cyborg:device_profile:create", ADMIN_ONLY, 201,
         body=lambda w: [{"name": "new-dp", "groups": [{"resources:FPGA": "1"}]}]),
    Case("/v2/device_profiles", "DELETE", "cyborg:device_profile:delete", ADMIN_ONLY, 204,
         query="value=spare-dp"),
    Case("/v2/device_profiles/{ident}", "GET", "cyborg:device_profile:get_one", READER_OR_ADMIN,
         200, lambda w: f"/{w.profile}", headers={"OpenStack-API-Version": "accelerator 2.2"}),
    Case("/v2/device_profiles/{ident}", "DELETE", "cyborg:device_profile:delete", ADMIN_ONLY,
         204, lambda w: "/spare-dp"),
    # 2.7: why a profile can or cannot get an accelerator (names every project's ARQs).
    Case("/v2/device_profiles/{ident}/explain", "GET", "acceld:device_profile:explain",
         ADMIN_ONLY, 200, lambda w: f"/{w.profile}/explain",
         headers={"OpenStack-API-Version": "accelerator 2.7"}),
    # Hardware inventory: managers read, admins change.
    Case("/v2/devices", "GET", "cyborg:device:get_all", MANAGER_OR_ADMIN, 200),
    Case("/v2/devices/{uuid}", "GET", "cyborg:device:get_one", MANAGER_OR_ADMIN, 200,
         lambda w: f"/{w.device}"),
    Case("/v2/devices/{uuid}", "PATCH", "cyborg:device:disable", ADMIN_ONLY, 204,
         lambda w: f"/{w.device}",
         body=lambda w: [{"op": "replace", "path": "/status", "value": "disabled"}]),
    Case("/v2/devices/{uuid}/enable", "POST", "cyborg:device:enable", ADMIN_ONLY, 200,
         lambda w: f"/{w.device}/enable"),
    Case("/v2/devices/{uuid}/disable", "POST", "cyborg:device:disable", ADMIN_ONLY, 200,
         lambda w: f"/{w.device}/disable"),
    # 2.6: a device's events (health, quarantine, operator, programs).
    Case("/v2/devices/{uuid}/events", "GET", "acceld:device_event:get_all", ADMIN_ONLY, 200,
         lambda w: f"/{w.device}/events", headers={"OpenStack-API-Version": "accelerator 2.6"}),
    Case("/v2/deployables", "GET", "cyborg:deployable:get_all", MANAGER_OR_ADMIN, 200),
    Case("/v2/deployables/{uuid}", "GET", "cyborg:deployable:get_one", MANAGER_OR_ADMIN, 200,
         lambda w: f"/{w.deployable}"),
    # No conductor in-process: a permitted program reaches the point of calling it (503).
    Case("/v2/deployables/{uuid}", "PATCH", "cyborg:deployable:program", ADMIN_ONLY, 503,
         lambda w: f"/{w.deployable}",
         body=lambda w: [{"op": "add", "path": "/bitstream", "value": str(uuidlib.uuid4())}]),
    Case("/v2/deployables/{uuid}/program", "PATCH", "cyborg:deployable:program", ADMIN_ONLY,
         503, lambda w: f"/{w.deployable}/program",
         body=lambda w: [{"op": "replace", "path": "/program",
                          "value": [{"image_uuid": str(uuidlib.uuid4())}]}]),
    Case("/v2/deployables/{uuid}/program/{again}", "PATCH", "cyborg:deployable:program",
         ADMIN_ONLY, 503, lambda w: f"/{w.deployable}/program/{w.deployable}",
         body=lambda w: [{"op": "replace", "path": "/program",
                          "value": [{"image_uuid": str(uuidlib.uuid4())}]}]),
    Case("/v2/attributes", "GET", "cyborg:attribute:get_all", MANAGER_OR_ADMIN, 200),
    Case("/v2/attributes", "POST", "cyborg:attribute:create", ADMIN_ONLY, 201,
         body=lambda w: {"deployable_id": w.deployable_id, "key": "trait9",
                         "value": "CUSTOM_X"}),
    Case("/v2/attributes/{uuid}", "GET", "cyborg:attribute:get_one", MANAGER_OR_ADMIN, 200,
         lambda w: f"/{w.attribute}"),
    Case("/v2/attributes/{uuid}", "DELETE", "cyborg:attribute:delete", ADMIN_ONLY, 204,
         lambda w: f"/{w.attribute}"),
    Case("/v2/hosts", "GET", "acceld:host:get_all", ADMIN_ONLY, 200,
         headers={"OpenStack-API-Version": "accelerator 2.4"}),
    # No agent reported in this world: the admin passes policy and learns the host is unknown.
    Case("/v2/hosts/{hostname}", "GET", "acceld:host:get_all", ADMIN_ONLY, 404,
         lambda w: "/no-such-host", headers={"OpenStack-API-Version": "accelerator 2.4"}),
    # 2.5: retiring node1 (no agent, no ARQ bound there) removes its inventory.
    Case("/v2/hosts/{hostname}", "DELETE", "acceld:host:delete", ADMIN_ONLY, 204,
         lambda w: "/node1", headers={"OpenStack-API-Version": "accelerator 2.5"}),
    # ARQs: project data. Another project's ARQ is answered 404, never 403.
    Case(ARQ, "GET", "cyborg:arq:get_all", READER_OR_ADMIN, 200),
    Case(ARQ, "POST", "cyborg:arq:create", MEMBER_OR_SERVICE, 201,
         body=lambda w: {"device_profile_name": w.profile}),
    Case(ARQ, "PATCH", "cyborg:arq:update", MEMBER_OR_SERVICE, 202, body=_bind,
         needs_service=True, hidden_from=NOT_A),
    Case(ARQ, "DELETE", "cyborg:arq:delete", MEMBER_OR_SERVICE, 204,
         query="arqs={arq}", hidden_from=NOT_A),
    Case(ARQ + "/{uuid}", "GET", "cyborg:arq:get_one", READER_OR_ADMIN, 200,
         lambda w: f"/{w.arq}", hidden_from=NOT_A),
    Case(ARQ + "/{uuid}", "PATCH", "cyborg:arq:update", MEMBER_OR_SERVICE, 202,
         lambda w: f"/{w.arq}", body=_bind, needs_service=True, hidden_from=NOT_A),
    Case(ARQ + "/{uuid}", "DELETE", "cyborg:arq:delete", MEMBER_OR_SERVICE, 204,
         lambda w: f"/{w.arq}", hidden_from=NOT_A),
]


def _routes() -> set[tuple[str, str]]:
    return {(path, method) for path, methods in routes.ROUTES.items() for method in methods}


def test_every_route_has_policy_expectations() -> None:
    covered = {(c.route, c.method) for c in CASES}
    missing = sorted(_routes() - covered)
    assert not missing, f"add these routes to the policy matrix: {missing}"


def test_every_policy_rule_named_by_the_matrix_exists() -> None:
    from acceld.api.policy import RULES

    names = {r.name for r in RULES}
    assert {c.rule for c in CASES if c.rule} <= names


LIVE = [c for c in CASES if (c.route, c.method) in _routes()]


def _seed(db, client: testing.TestClient) -> World:  # type: ignore[no-untyped-def]
    admin = PERSONAS["admin"]
    for name in ("matrix-dp", "spare-dp"):
        resp = client.simulate_post("/v2/device_profiles", headers=admin,
                                    json=[{"name": name, "groups": [{"resources:FPGA": "1"}]}])
        assert resp.status_code == 201, resp.text
    with db.write() as conn:
        device = inventory.add_device(conn, hostname="node1")
        dep = inventory.add_deployable(conn, device["id"], name="node1_matrix")
        inventory.add_attach_handles(conn, dep["id"], 2)
        attr = inventory.add_attribute(conn, dep["id"], "trait0", "CUSTOM_MATRIX")
    arq = None
    if (ARQ, "POST") in _routes():
        resp = client.simulate_post(ARQ, headers=PERSONAS["a_member"],
                                    json={"device_profile_name": "matrix-dp"})
        assert resp.status_code == 201, resp.text
        arq = resp.json["arqs"][0]["uuid"]
    return World(profile="matrix-dp", device=device["uuid"], deployable=dep["uuid"],
                 deployable_id=dep["id"], rp_uuid=dep["rp_uuid"], attribute=attr["uuid"],
                 arq=arq)


def expected(case: Case, persona: str) -> int:
    if persona not in case.allowed:
        return 403
    if case.needs_service and "service" not in PERSONAS[persona].get("X-Service-Roles", ""):
        return 403
    if case.hidden_from and persona in case.hidden_from:
        return 404
    return case.ok


@pytest.mark.parametrize("persona", list(PERSONAS))
@pytest.mark.parametrize("case", LIVE, ids=lambda c: f"{c.method} {c.route}")
def test_matrix(case: Case, persona: str, conf, sqlite_db) -> None:
    client = testing.TestClient(build_app(conf, sqlite_db))
    world = _seed(sqlite_db, client)
    headers = {**PERSONAS[persona], **(case.headers or {})}
    # Routes with parameters: the static part, then what the case fills in.
    path = case.route.split("/{")[0] + case.path(world) if "{" in case.route else case.route
    query = case.query.format(arq=world.arq) if case.query else None
    kwargs = {"headers": headers, "query_string": query}
    if case.body is not None:
        kwargs["json"] = case.body(world)
    result = client.simulate_request(case.method, "/accelerator" + path, **kwargs)
    want = expected(case, persona)
    assert result.status_code == want, (persona, result.status_code, result.text[:300])
    if want == 403 and case.rule and persona in UNSCOPED:
        assert fault(result).startswith(f"Policy doesn't allow {case.rule} to be performed "
                                        "with a "), fault(result)
        assert "use a token scoped to a project" in fault(result)
    elif want == 403 and case.rule and persona not in case.allowed:
        assert fault(result) == f"Policy doesn't allow {case.rule} to be performed."
