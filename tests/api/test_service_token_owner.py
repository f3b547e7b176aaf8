"""A service token counts only when it is another user's, of the service project (issue 25,
item 5).

keystonemiddleware's ``service_token_roles`` check asks only for the role: a user who holds
the service role could send their own token as both X-Auth-Token and X-Service-Token and
bind an ARQ to an instance Nova never scheduled, or delete by instance. The app here runs
with ``auth_strategy = keystone`` and gets the headers keystonemiddleware sets after it
validated both tokens (what auth_token passes on), without a Keystone. Every backend.
"""

from __future__ import annotations

import uuid as uuidlib

import pytest
from falcon import testing

from acceld.api.app import build_app
from tests.conftest import make_conf
from tests.support import inventory

ARQ = "/v2/accelerator_requests"
DEMO = "8c4b2a1e0d9f4e6b9a7c5d3e1f0a2b4c"
SERVICE_PROJECT = "5e1d9c8b7a6f4e3d2c1b0a9f8e7d6c5b"
OTHER_SERVICE = "0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c"

# The user's own token: a member of demo who also holds the service role there.
USER = {"X-Identity-Status": "Confirmed", "X-User-Id": "u-demo", "X-Project-Id": DEMO,
        "X-Project-Name": "demo", "X-Roles": "member,reader,service"}


def service_token(user_id: str, project_id: str = SERVICE_PROJECT,
                  project_name: str = "service", domain: str = "Default") -> dict[str, str]:
    """The headers keystonemiddleware adds for a valid X-Service-Token of ``user_id``."""
    return {"X-Service-Identity-Status": "Confirmed", "X-Service-Roles": "service",
            "X-Service-User-Id": user_id, "X-Service-User-Name": user_id,
            "X-Service-Project-Id": project_id, "X-Service-Project-Name": project_name,
            "X-Service-Project-Domain-Id": domain.lower(),
            "X-Service-Project-Domain-Name": domain}


NOVA = service_token("u-nova")


def _client(tmp_path, db, **overrides) -> testing.TestClient:
    conf = make_conf(str(tmp_path), **{"auth_strategy": "keystone", **overrides})
    return testing.TestClient(build_app(conf, db))


@pytest.fixture
def world(tmp_path, db) -> dict:
    admin = {"X-Identity-Status": "Confirmed", "X-User-Id": "u-admin", "X-Project-Id": "adm",
             "X-Roles": "admin,member,reader"}
    client = _client(tmp_path, db)
    made = client.simulate_post("/v2/device_profiles", headers=admin,
                                json=[{"name": "svc-dp", "groups": [{"resources:FPGA": "1"}]}])
    assert made.status_code == 201, made.text
    with db.write() as conn:
        device = inventory.add_device(conn, hostname="node1")
        dep = inventory.add_deployable(conn, device["id"], name="node1_svc", num_accelerators=2)
        inventory.add_attach_handles(conn, dep["id"], 2)
    arqs = [client.simulate_post(ARQ, headers=USER, json={"device_profile_name": "svc-dp"})
            .json["arqs"][0]["uuid"] for _ in range(2)]
    return {"db": db, "tmp_path": tmp_path, "arqs": arqs, "rp": dep["rp_uuid"]}


def _bind(arq: str, rp: str, instance: str) -> dict:
    return {arq: [{"op": "add", "path": "/hostname", "value": "node1"},
                  {"op": "add", "path": "/device_rp_uuid", "value": rp},
                  {"op": "add", "path": "/instance_uuid", "value": instance}]}


def _state(client: testing.TestClient, arq: str) -> str | None:
    got = client.simulate_get(f"{ARQ}/{arq}", headers=USER)
    return got.json["state"] if got.status_code == 200 else None


def _message(resp) -> str:  # type: ignore[no-untyped-def]
    return resp.json["error_message"]


def test_the_users_own_token_as_service_token_binds_and_deletes_nothing(world) -> None:
    client = _client(world["tmp_path"], world["db"])
    arq, bound_arq = world["arqs"]
    own = service_token("u-demo", project_id=DEMO, project_name="demo")
    # Even when that user's token is scoped to the service project.
    own_in_service = service_token("u-demo")
    instance = str(uuidlib.uuid4())
    for forged in (own, own_in_service):
        refused = client.simulate_patch(ARQ, headers={**USER, **forged},
                                        json=_bind(arq, world["rp"], instance))
        assert refused.status_code == 403, refused.text
        assert "same user as the X-Auth-Token" in _message(refused)
        assert _state(client, arq) == "Initial"
    # Nova (another user, of the service project) binds the other ARQ to an instance ...
    held_by = str(uuidlib.uuid4())
    bound = client.simulate_patch(ARQ, headers={**USER, **NOVA},
                                  json=_bind(bound_arq, world["rp"], held_by))
    assert bound.status_code == 202, bound.text
    # ... which the user cannot delete with their own token twice over, by instance or uuid.
    for path, query in ((ARQ, f"instance={held_by}"), (f"{ARQ}/{bound_arq}", None)):
        gone = client.simulate_delete(path, headers={**USER, **own_in_service},
                                      query_string=query)
        assert gone.status_code == 403, gone.text
        assert "same user as the X-Auth-Token" in _message(gone)
        assert _state(client, bound_arq) is not None


def test_another_user_of_the_service_project_is_a_service(world) -> None:
    client = _client(world["tmp_path"], world["db"])
    arq = world["arqs"][0]
    instance = str(uuidlib.uuid4())
    bound = client.simulate_patch(ARQ, headers={**USER, **NOVA},
                                  json=_bind(arq, world["rp"], instance))
    assert bound.status_code == 202, bound.text
    assert _state(client, arq) in ("BindStarted", "Bound", "BindFailed")
    gone = client.simulate_delete(ARQ, headers={**USER, **NOVA},
                                  query_string=f"instance={instance}")
    assert gone.status_code == 204, gone.text
    assert _state(client, arq) is None


@pytest.mark.parametrize("token", [
    service_token("u-other", project_id=DEMO, project_name="demo"),
    # A project named like the service project, in another domain (a domain admin made it).
    service_token("u-other", project_id=OTHER_SERVICE, domain="Tenants"),
], ids=["another-project", "same-name-another-domain"])
def test_another_user_outside_the_service_project_is_refused(world, token) -> None:
    client = _client(world["tmp_path"], world["db"])
    arq = world["arqs"][0]
    refused = client.simulate_patch(ARQ, headers={**USER, **token},
                                    json=_bind(arq, world["rp"], str(uuidlib.uuid4())))
    assert refused.status_code == 403, refused.text
    assert "not scoped to the service project ('service'" in _message(refused)
    assert _state(client, arq) == "Initial"


def test_the_service_project_can_be_named_by_id_or_left_open(world) -> None:
    arq, other = world["arqs"]
    by_id = _client(world["tmp_path"], world["db"], api__service_token_project=OTHER_SERVICE)
    outsider = service_token("u-other", project_id=OTHER_SERVICE, project_name="svc",
                             domain="Tenants")
    ok = by_id.simulate_patch(ARQ, headers={**USER, **outsider},
                              json=_bind(arq, world["rp"], str(uuidlib.uuid4())))
    assert ok.status_code == 202, ok.text
    # The default service project no longer counts there.
    refused = by_id.simulate_patch(ARQ, headers={**USER, **NOVA},
                                   json=_bind(other, world["rp"], str(uuidlib.uuid4())))
    assert refused.status_code == 403, refused.text
    # Empty: the role alone, still never the same user's.
    open_ = _client(world["tmp_path"], world["db"], api__service_token_project="")
    demo_user = service_token("u-other", project_id=DEMO, project_name="demo")
    ok = open_.simulate_patch(ARQ, headers={**USER, **demo_user},
                              json=_bind(other, world["rp"], str(uuidlib.uuid4())))
    assert ok.status_code == 202, ok.text
    same = open_.simulate_delete(ARQ, headers={**USER, **service_token("u-demo")},
                                 query_string=f"instance={uuidlib.uuid4()}")
    assert same.status_code == 403, same.text


def test_noauth_checks_the_service_user_it_is_given(world) -> None:
    """noauth trusts its headers, but a service user it is told equals the user is refused."""
    client = _client(world["tmp_path"], world["db"], auth_strategy="noauth")
    user = {k: v for k, v in USER.items() if k != "X-Identity-Status"}
    same = client.simulate_delete(ARQ, headers={**user, "X-Service-Roles": "service",
                                                "X-Service-User-Id": "u-demo"},
                                  query_string=f"instance={uuidlib.uuid4()}")
    assert same.status_code == 403, same.text
    trusted = client.simulate_delete(ARQ, headers={**user, "X-Service-Roles": "service"},
                                     query_string=f"instance={uuidlib.uuid4()}")
    assert trusted.status_code == 204, trusted.text
