"""Project B never sees or touches project A's ARQs: 404 (not 403), lists without them.

ARQs are the only project data in the API (device profiles are shared by every
project, hardware inventory is the cloud's). Runs on every database backend.
"""

from __future__ import annotations

import uuid as uuidlib

import pytest

from tests.helpers import ADMIN, fault, member
from tests.support import inventory

ARQ = "/v2/accelerator_requests"
A, B = "project-a", "project-b"
SERVICE_TOKEN = {"X-Service-Roles": "service"}


@pytest.fixture
def world(client, db) -> dict:  # type: ignore[no-untyped-def]
    resp = client.simulate_post("/v2/device_profiles", headers=ADMIN,
                                json=[{"name": "iso-dp", "groups": [{"resources:FPGA": "2"}]}])
    assert resp.status_code == 201, resp.text
    with db.write() as conn:
        device = inventory.add_device(conn, hostname="node1")
        dep = inventory.add_deployable(conn, device["id"], name="node1_iso", num_accelerators=4)
        inventory.add_attach_handles(conn, dep["id"], 4)
    arqs = client.simulate_post(ARQ, headers=member(A),
                                json={"device_profile_name": "iso-dp"}).json["arqs"]
    instance = str(uuidlib.uuid4())
    bind = {a["uuid"]: [{"op": "add", "path": "/hostname", "value": "node1"},
                        {"op": "add", "path": "/device_rp_uuid", "value": dep["rp_uuid"]},
                        {"op": "add", "path": "/instance_uuid", "value": instance}]
            for a in arqs[:1]}
    resp = client.simulate_patch(ARQ, headers={**member(A), **SERVICE_TOKEN}, json=bind)
    assert resp.status_code == 202, resp.text
    return {"arqs": [a["uuid"] for a in arqs], "instance": instance, "rp": dep["rp_uuid"]}


def _states(client, project: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    got = client.simulate_get(ARQ, headers=member(project)).json["arqs"]
    return {a["uuid"]: a["state"] for a in got}


def test_lists_show_only_the_callers_project(client, world) -> None:
    assert set(_states(client, A)) == set(world["arqs"])
    assert _states(client, B) == {}
    by_instance = client.simulate_get(ARQ, headers=member(B),
                                      query_string=f"instance={world['instance']}")
    assert by_instance.status_code == 200 and by_instance.json["arqs"] == []
    every = client.simulate_get(ARQ, headers=ADMIN).json["arqs"]
    assert set(world["arqs"]) <= {a["uuid"] for a in every}


def test_show_is_404_for_another_project(client, world) -> None:
    for arq in world["arqs"]:
        resp = client.simulate_get(f"{ARQ}/{arq}", headers=member(B))
        assert resp.status_code == 404
        assert B not in fault(resp) and A not in fault(resp)
        assert client.simulate_get(f"{ARQ}/{arq}", headers=member(A)).status_code == 200


def test_bind_and_unbind_of_another_projects_arq_is_404(client, world) -> None:
    free = world["arqs"][1]
    bind = {free: [{"op": "add", "path": "/hostname", "value": "node1"},
                   {"op": "add", "path": "/device_rp_uuid", "value": world["rp"]},
                   {"op": "add", "path": "/instance_uuid", "value": str(uuidlib.uuid4())}]}
    for path in (ARQ, f"{ARQ}/{free}"):
        resp = client.simulate_patch(path, headers={**member(B), **SERVICE_TOKEN}, json=bind)
        assert resp.status_code == 404, resp.text
    bound = world["arqs"][0]
    unbind = {bound: [{"op": "remove", "path": p}
                      for p in ("/hostname", "/device_rp_uuid", "/instance_uuid")]}
    resp = client.simulate_patch(ARQ, headers={**member(B), **SERVICE_TOKEN}, json=unbind)
    assert resp.status_code == 404, resp.text
    states = _states(client, A)
    assert states[free] == "Initial" and states[bound] != "Unbound"


def test_delete_of_another_projects_arqs_changes_nothing(client, world) -> None:
    headers = {**member(B), **SERVICE_TOKEN}
    for arq in world["arqs"]:
        assert client.simulate_delete(f"{ARQ}/{arq}", headers=headers).status_code == 404
    resp = client.simulate_delete(ARQ, headers=headers,
                                  query_string=f"arqs={','.join(world['arqs'])}")
    assert resp.status_code == 404, resp.text
    # Delete by instance is idempotent: B's view of A's instance is empty, so nothing goes.
    resp = client.simulate_delete(ARQ, headers=headers,
                                  query_string=f"instance={world['instance']}")
    assert resp.status_code == 204
    assert set(_states(client, A)) == set(world["arqs"])


def test_owner_and_admin_can_delete(client, world) -> None:
    first, second = world["arqs"]
    resp = client.simulate_delete(f"{ARQ}/{second}", headers=member(A))
    assert resp.status_code == 204, resp.text
    resp = client.simulate_delete(ARQ, headers={**ADMIN, **SERVICE_TOKEN},
                                  query_string=f"instance={world['instance']}")
    assert resp.status_code == 204, resp.text
    assert _states(client, A) == {}
