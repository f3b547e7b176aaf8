"""Nova's boot and teardown sequence over HTTP against ``acceld all``, events included.

``acceld all`` runs as a subprocess on free ports, its ``[nova]`` section
pointing at a recording endpoint in this test. Inventory for a compute node
that no agent manages is written straight into the all-in-one's SQLite file
(until agents report it, that is what the conductor would have stored).
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Iterator

import openstack
import pytest
import requests
from sqlalchemy import func, select

from acceld.db.engine import Database
from acceld.db.models import attach_handles
from tests.support import allinone, inventory
from tests.support.allinone import free_port
from tests.support.nova import RecordingNova

pytestmark = pytest.mark.integration

NODE = "nova-flow-node"
NOVA = {"Accept": "application/json", "X-User-Id": "nova-user", "X-Project-Id": "tenant-1",
        "X-Roles": "member,reader", "X-Service-Roles": "service"}


def write_config(state_path: str, nova_url: str) -> str:
    config = os.path.join(state_path, "acceld.conf")
    with open(config, "w") as handle:
        handle.write(f"""[DEFAULT]
host = nova-flow-agent
[conductor]
port = {free_port()}
bind_poll_interval = 0.5
[agent]
port = {free_port()}
enabled_drivers = fake
[placement]
check_allocations = false
[nova]
auth_type = none
endpoint_override = {nova_url}
retry_initial_delay = 0.1
""")
    return config


@pytest.fixture(scope="module")
def recorder() -> Iterator[RecordingNova]:
    server = RecordingNova().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def aio(tmp_path_factory, recorder) -> Iterator[allinone.Launched]:
    state = str(tmp_path_factory.mktemp("nova-flow"))
    launched = allinone.launch(state, write_config(state, recorder.url), timeout=90)
    try:
        yield launched
    finally:
        allinone.stop(launched.proc)


@pytest.fixture(scope="module")
def node(aio) -> Iterator[tuple[Database, dict]]:
    db = Database(f"sqlite:///{os.path.join(aio.state_path, 'acceld.sqlite')}")
    fpga = inventory.add_fpga(db, hostname=NODE, name="fpga0", handles=2)
    yield db, fpga
    db.dispose()


def _free_handles(db: Database, fpga: dict) -> int:
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(attach_handles).where(
            attach_handles.c.deployable_id == fpga["deployable"]["id"],
            attach_handles.c.in_use == False)).scalar_one()  # noqa: E712


def test_nova_boot_and_teardown(aio, recorder, node):
    db, fpga = node
    admin = requests.Session()  # the all-in-one's noauth defaults: admin
    nova = requests.Session()
    nova.headers.update(NOVA)
    groups = [{"resources:FPGA": "2", "trait:CUSTOM_FAKE_DEVICE": "required"}]
    assert admin.post(f"{aio.url}/device_profiles",
                      json=[{"name": "nova-dp", "groups": groups}]).status_code == 201

    # 1. The profile, by name: exactly one.
    resp = nova.get(f"{aio.url}/device_profiles", params={"name": "nova-dp"})
    assert resp.status_code == 200
    assert [p["groups"] for p in resp.json()["device_profiles"]] == [groups]
    # 2. The ARQs.
    resp = nova.post(f"{aio.url}/accelerator_requests", json={"device_profile_name": "nova-dp"})
    assert resp.status_code == 201, resp.text
    arqs = resp.json()["arqs"]
    assert [a["device_profile_group_id"] for a in arqs] == [0, 0]
    # 3. One collection PATCH binding them all.
    instance = str(uuid.uuid4())
    rp = fpga["deployable"]["rp_uuid"]
    body = {a["uuid"]: [{"path": "/hostname", "op": "add", "value": NODE},
                        {"path": "/device_rp_uuid", "op": "add", "value": rp},
                        {"path": "/instance_uuid", "op": "add", "value": instance}] for a in arqs}
    resp = nova.patch(f"{aio.url}/accelerator_requests", json=body)
    assert resp.status_code == 202, resp.text
    assert resp.content == b""
    # 4. The events reach Nova: one per ARQ, completed.
    events = recorder.wait_for_events(2, timeout=30)
    assert sorted(e["tag"] for e in events) == sorted(a["uuid"] for a in arqs)
    assert {(e["name"], e["server_uuid"], e["status"]) for e in events} == {
        ("accelerator-request-bound", instance, "completed")}
    assert recorder.requests[0].path == "/os-server-external-events"
    assert recorder.requests[0].headers["OpenStack-API-Version"] == "compute 2.82"
    # 5. What Nova attaches: Bound, with the PCI handle.
    resp = nova.get(f"{aio.url}/accelerator_requests", params={"instance": instance})
    assert resp.status_code == 200
    bound = resp.json()["arqs"]
    assert [a["state"] for a in bound] == ["Bound", "Bound"]
    handle_uuids = {h["uuid"] for h in fpga["handles"]}
    assert {a["attach_handle_uuid"] for a in bound} == handle_uuids
    for arq in bound:
        assert arq["attach_handle_type"] == "PCI"
        assert set(arq["attach_handle_info"]) == {"domain", "bus", "device", "function"}
    assert _free_handles(db, fpga) == 0
    # 6. Teardown: delete by instance; the handles are free again; idempotent.
    resp = nova.delete(f"{aio.url}/accelerator_requests", params={"instance": instance})
    assert resp.status_code == 204, resp.text
    assert _free_handles(db, fpga) == 2
    assert nova.get(f"{aio.url}/accelerator_requests",
                    params={"instance": instance}).json() == {"arqs": []}
    assert nova.delete(f"{aio.url}/accelerator_requests",
                       params={"instance": instance}).status_code == 204


def test_sdk_per_uuid_patch_and_delete(aio, node):
    db, fpga = node
    conn = openstack.connection.Connection(auth_type="none",
                                           accelerator_endpoint_override=aio.url)
    try:
        if not list(conn.accelerator.device_profiles(name="sdk-dp")):
            conn.accelerator.create_device_profile(
                name="sdk-dp", groups=[{"resources:FPGA": "1"}])
        arq = conn.accelerator.create_accelerator_request(device_profile_name="sdk-dp")
        instance = str(uuid.uuid4())
        conn.accelerator.patch_accelerator_request(arq.id, [
            {"path": "/hostname", "op": "add", "value": NODE},
            {"path": "/device_rp_uuid", "op": "add", "value": fpga["deployable"]["rp_uuid"]},
            {"path": "/instance_uuid", "op": "add", "value": instance}])
        deadline = time.monotonic() + 30
        while conn.accelerator.get_accelerator_request(arq.id).state != "Bound":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert _free_handles(db, fpga) == 1
        conn.accelerator.delete_accelerator_request(arq.id, ignore_missing=False)
        assert _free_handles(db, fpga) == 2
        with pytest.raises(openstack.exceptions.NotFoundException):
            conn.accelerator.get_accelerator_request(arq.id)
    finally:
        conn.close()
