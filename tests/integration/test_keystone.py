"""acceld behind a real Keystone: tokens, policy personas, service tokens, tenant isolation.

One Keystone (from the prepared template, a few seconds) and one `acceld api`
process with ``auth_strategy = keystone`` serve the whole module.
"""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest
import requests

from tests.support import inventory, keystone

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROFILE = "ks-fpga"


@pytest.fixture(scope="module")
def api(ks, tmp_path_factory) -> Iterator[dict]:
    """`acceld api` on the port the catalog names, validating tokens with Keystone, with
    PROFILE made by demo-admin (here, not in a test: xdist may run this module's tests in
    two processes, each with its own Keystone and API)."""
    with keystone.acceld_api(ks, tmp_path_factory.mktemp("acceld")) as client:
        api = {**client, "tokens": set()}
        created = _call(api, ks, "POST", "/v2/device_profiles", "demo-admin",
                        json=[{"name": PROFILE, "groups": [{"resources:FPGA": "1"}]}])
        assert created.status_code == 201, created.text
        yield api


def _call(api: dict, ks: keystone.Keystone, method: str, path: str, user: str | None = None,
          service: str | None = None, **kwargs) -> requests.Response:
    headers = dict(kwargs.pop("headers", {}))
    if user:
        headers["X-Auth-Token"] = ks.token(user)
        api["tokens"].add(headers["X-Auth-Token"])
    if service:
        headers["X-Service-Token"] = ks.token(service)
        api["tokens"].add(headers["X-Service-Token"])
    return requests.request(method, api["base"] + "/accelerator" + path, headers=headers,
                            timeout=30, **kwargs)


@pytest.mark.parametrize("path", ["/", "/accelerator", "/v2", "/accelerator/v2",
                                  "/accelerator/v2/"])
def test_version_documents_need_no_token(api, path) -> None:
    resp = requests.get(api["base"] + path, timeout=10)
    assert resp.status_code == 200, resp.text


def test_no_token_is_401(api, ks) -> None:
    resp = _call(api, ks, "GET", "/v2/device_profiles")
    assert resp.status_code == 401
    assert resp.headers["WWW-Authenticate"] == f'Keystone uri="{ks.url}/v3"'


def test_garbage_token_is_401(api, ks) -> None:
    resp = _call(api, ks, "GET", "/v2/device_profiles", headers={"X-Auth-Token": "gAAAA-bogus"})
    assert resp.status_code == 401


def test_member_cannot_create_a_profile_admin_can(api, ks) -> None:
    body = [{"name": PROFILE + "-2", "groups": [{"resources:FPGA": "1"}]}]
    # Forged identity headers are replaced by what Keystone says about the token.
    forged = {"X-Roles": "admin", "X-Project-Id": "admin", "X-Service-Roles": "service"}
    denied = _call(api, ks, "POST", "/v2/device_profiles", "demo-member", json=body,
                   headers=forged)
    assert denied.status_code == 403, denied.text
    assert "cyborg:device_profile:create" in denied.json()["error_message"]
    created = _call(api, ks, "POST", "/v2/device_profiles", "demo-admin", json=body)
    assert created.status_code == 201, created.text
    listed = _call(api, ks, "GET", "/v2/device_profiles", "demo-reader")
    assert sorted(p["name"] for p in listed.json()["device_profiles"]) == [PROFILE,
                                                                           PROFILE + "-2"]


def test_manager_reads_inventory_member_does_not(api, ks) -> None:
    assert _call(api, ks, "GET", "/v2/devices", "demo-manager").status_code == 200
    assert _call(api, ks, "GET", "/v2/devices", "demo-member").status_code == 403


def _create_arq(api, ks, user: str) -> dict:  # type: ignore[no-untyped-def]
    resp = _call(api, ks, "POST", "/v2/accelerator_requests", user,
                 json={"device_profile_name": PROFILE})
    assert resp.status_code == 201, resp.text
    return resp.json()["arqs"][0]


def test_project_b_never_sees_project_a_arqs(api, ks) -> None:
    arq = _create_arq(api, ks, "demo-member")
    assert arq["project_id"] == ks.project_id("demo")
    mine = _call(api, ks, "GET", "/v2/accelerator_requests", "demo-reader").json()["arqs"]
    assert arq["uuid"] in [a["uuid"] for a in mine]
    theirs = _call(api, ks, "GET", "/v2/accelerator_requests", "demo2-member").json()["arqs"]
    assert arq["uuid"] not in [a["uuid"] for a in theirs]
    one = _call(api, ks, "GET", f"/v2/accelerator_requests/{arq['uuid']}", "demo2-member")
    assert one.status_code == 404
    gone = _call(api, ks, "DELETE", f"/v2/accelerator_requests/{arq['uuid']}", "demo2-member")
    assert gone.status_code == 404
    still = _call(api, ks, "GET", f"/v2/accelerator_requests/{arq['uuid']}", "demo-reader")
    assert still.status_code == 200


def _bind_body(arq_uuid: str, rp_uuid: str) -> dict:
    return {arq_uuid: [
        {"op": "add", "path": "/hostname", "value": "node1"},
        {"op": "add", "path": "/device_rp_uuid", "value": rp_uuid},
        {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())},
    ]}


def _one_handle(api: dict, name: str) -> str:
    """A deployable named ``name`` on node1 with one free handle; its provider's uuid."""
    with api["db"].write() as conn:
        device = inventory.add_device(conn, hostname="node1")
        deployable = inventory.add_deployable(conn, device["id"], name=name)
        inventory.add_attach_handles(conn, deployable["id"], 1)
    return deployable["rp_uuid"]


def test_bind_needs_a_service_token(api, ks) -> None:
    rp_uuid = _one_handle(api, "node1_ks")
    arq = _create_arq(api, ks, "demo-member")
    body = _bind_body(arq["uuid"], rp_uuid)
    without = _call(api, ks, "PATCH", "/v2/accelerator_requests", "demo-member", json=body)
    assert without.status_code == 403, without.text
    # A service token of a user without the service role is not a service token.
    wrong = _call(api, ks, "PATCH", "/v2/accelerator_requests", "demo-member", "norole",
                  json=body)
    assert wrong.status_code == 401, wrong.text
    bound = _call(api, ks, "PATCH", "/v2/accelerator_requests", "demo-member", "nova",
                  json=body)
    assert bound.status_code == 202, bound.text
    shown = _call(api, ks, "GET", f"/v2/accelerator_requests/{arq['uuid']}", "demo-reader")
    assert shown.json()["state"] in ("BindStarted", "Bound", "BindFailed")


def test_domain_and_system_tokens_see_no_project_data(api, ks) -> None:
    """A domain reader does not list every project's ARQs, a domain member does not delete
    another project's ARQ, a domain admin is no cloud admin, and a system-scoped token
    reads no project data either: none of acceld's rules is registered for those scopes."""
    arq = _create_arq(api, ks, "demo-member")
    for user in ("domain-reader", "domain-member", "domain-admin", "system-reader",
                 "system-admin"):
        listed = _call(api, ks, "GET", "/v2/accelerator_requests", user)
        assert listed.status_code == 403, (user, listed.text)
        assert "token scoped to a project" in listed.json()["error_message"]
        shown = _call(api, ks, "GET", f"/v2/accelerator_requests/{arq['uuid']}", user)
        assert shown.status_code == 403, (user, shown.text)
        gone = _call(api, ks, "DELETE", f"/v2/accelerator_requests/{arq['uuid']}", user)
        assert gone.status_code == 403, (user, gone.text)
    for user in ("domain-admin", "system-admin"):
        assert _call(api, ks, "GET", "/v2/devices", user).status_code == 403
        made = _call(api, ks, "POST", "/v2/device_profiles", user,
                     json=[{"name": f"by-{user}", "groups": [{"resources:FPGA": "1"}]}])
        assert made.status_code == 403, (user, made.text)
    still = _call(api, ks, "GET", f"/v2/accelerator_requests/{arq['uuid']}", "demo-reader")
    assert still.status_code == 200
    names = [p["name"] for p in
             _call(api, ks, "GET", "/v2/device_profiles", "demo-reader").json()["device_profiles"]]
    assert not any(n.startswith("by-") for n in names)


def test_the_service_role_counts_only_on_the_service_token(api, ks) -> None:
    """A user holding the service role on their own token is not Nova: binding, and deleting
    an ARQ an instance holds, need a real service token."""
    rp_uuid = _one_handle(api, "node1_svc")
    arq = _create_arq(api, ks, "demo-service")
    body = _bind_body(arq["uuid"], rp_uuid)
    refused = _call(api, ks, "PATCH", "/v2/accelerator_requests", "demo-service", json=body)
    assert refused.status_code == 403, refused.text
    assert _call(api, ks, "GET", f"/v2/accelerator_requests/{arq['uuid']}",
                 "demo-reader").json()["state"] == "Initial"
    bound = _call(api, ks, "PATCH", "/v2/accelerator_requests", "demo-service", "nova",
                  json=body)
    assert bound.status_code == 202, bound.text
    kept = _call(api, ks, "DELETE", f"/v2/accelerator_requests/{arq['uuid']}", "demo-service")
    assert kept.status_code == 403, kept.text
    assert _call(api, ks, "GET", f"/v2/accelerator_requests/{arq['uuid']}",
                 "demo-reader").status_code == 200


def test_a_service_token_is_another_users_of_the_service_project(api, ks) -> None:
    """keystonemiddleware accepts any token holding the service role as a service token:
    acceld counts it only when it is another user's, of the service project (issue 25,
    item 5)."""
    rp_uuid = _one_handle(api, "node1_own")
    arq = _create_arq(api, ks, "demo-service")
    body = _bind_body(arq["uuid"], rp_uuid)
    own = _call(api, ks, "PATCH", "/v2/accelerator_requests", "demo-service", "demo-service",
                json=body)
    assert own.status_code == 403, own.text
    assert "same user as the X-Auth-Token" in own.json()["error_message"]
    outside = _call(api, ks, "PATCH", "/v2/accelerator_requests", "demo-member",
                    "demo-service", json=body)
    assert outside.status_code == 403, outside.text
    assert "not scoped to the service project" in outside.json()["error_message"]
    assert _call(api, ks, "GET", f"/v2/accelerator_requests/{arq['uuid']}",
                 "demo-reader").json()["state"] == "Initial"
    bound = _call(api, ks, "PATCH", "/v2/accelerator_requests", "demo-service", "cyborg",
                  json=body)
    assert bound.status_code == 202, bound.text


def test_logs_never_contain_tokens(api, ks) -> None:
    """Runs last in the module: every token used above must be absent from every log."""
    assert api["tokens"], "no token was used"
    logs = {p.name: p.read_text(errors="replace") for p in api["state"].glob("*.log")}
    assert any(text.strip() for text in logs.values()), "the API wrote no log at all"
    for token in api["tokens"]:
        for name, text in logs.items():
            assert token not in text, f"a token leaked into {name}"
            assert token[:40] not in text, f"a token prefix leaked into {name}"
    assert keystone.PASSWORD not in "".join(logs.values())
