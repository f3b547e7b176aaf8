"""One global request id from Nova's bind PATCH to the Nova event, across every service.

``acceld all`` (real processes: API under gunicorn, conductor, agent with the fake
driver) against a real Placement, a recording Nova (tests/support/nova.py) and a
recording Glance (tests/support/glance.py). The bind's profile names a bitstream, so the
conductor has the agent program the device (from Glance) before it binds: one bind
reaches every service. The PATCH carries Nova's ``X-OpenStack-Request-Id``; the test
then finds that id in the API's access line, the conductor's lines for the bind
(program, bind, Nova event), the agent's lines for the program call, the headers
Glance and Nova received, and Placement's own log of the allocation check.
A malformed id is ignored: never logged, never passed on.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any, Callable, Iterator

import pytest
import requests

from tests.support import allinone
from tests.support.glance import GlanceServer
from tests.support.nova import RecordingNova
from tests.support.placement import PlacementServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TAG = uuid.uuid4().hex[:8].upper()
HOST = f"reqid-node-{TAG.lower()}"
TRAIT = f"CUSTOM_REQID_{TAG}"
IMAGE = str(uuid.uuid4())
NOVA = {"Accept": "application/json", "X-User-Id": "nova-user", "X-Project-Id": "reqid-project",
        "X-Roles": "member,reader", "X-Service-Roles": "service"}
WAIT = 40.0


def wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}: {last!r}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory, placement: PlacementServer) -> Iterator[dict[str, Any]]:
    nova, glance = RecordingNova().start(), GlanceServer().start()
    glance.store.add(IMAGE, b"\x00bitstream" * 512)
    root = placement.create_compute_node(HOST, vcpus=4, memory_mb=4096)
    state = tmp_path_factory.mktemp("acceld-reqid")
    spec = state / "fake-devices.json"
    spec.write_text(json.dumps({"devices": [
        {"type": "FPGA", "attach_handles": 2, "traits": [TRAIT]}]}))
    conf = state / "acceld.conf"
    conf.write_text(f"""[DEFAULT]
host = {HOST}
[conductor]
port = {free_port()}
bind_poll_interval = 0.2
[agent]
port = {free_port()}
enabled_drivers = fake
heartbeat_interval = 1
discovery_interval = 1
[fake_driver]
spec_file = {spec}
{placement.config_lines()}sync_interval = 0.2
[nova]
auth_type = none
endpoint_override = {nova.url}
[glance]
auth_type = none
endpoint_override = {glance.url}
""")
    launched = allinone.launch(str(state), str(conf))
    try:
        yield {"api": launched.url, "lines": launched.lines, "nova": nova, "glance": glance,
               "root": root}
    finally:
        allinone.stop(launched.proc)
        nova.stop()
        glance.stop()


def _device_provider(placement: PlacementServer, root: str) -> str | None:
    tree = placement.get("/resource_providers", in_tree=root).json()["resource_providers"]
    mine = [p["uuid"] for p in tree if p["uuid"] != root]
    if len(mine) != 1:
        return None
    traits = placement.get(f"/resource_providers/{mine[0]}/traits").json()["traits"]
    return mine[0] if TRAIT in traits else None  # traits are written last


def _lines_with(lines: list[str], text: str) -> list[str]:
    return [line for line in list(lines) if text in line]


def _header(headers: dict[str, str]) -> str | None:
    return {k.lower(): v for k, v in headers.items()}.get("x-openstack-request-id")


def test_one_global_request_id_from_the_bind_to_the_nova_event(placement, stack):
    api, lines, nova, glance = stack["api"], stack["lines"], stack["nova"], stack["glance"]
    rp = wait_for("the device provider", lambda: _device_provider(placement, stack["root"]))
    profile = f"reqid-{TAG.lower()}"
    resp = requests.post(f"{api}/device_profiles", json=[{"name": profile, "groups": [
        {"resources:FPGA": "1", f"trait:{TRAIT}": "required",
         "accel:bitstream_id": IMAGE}]}])
    assert resp.status_code == 201, resp.text
    instance = str(uuid.uuid4())
    resp = placement.put(f"/allocations/{instance}", {
        "allocations": {stack["root"]: {"resources": {"VCPU": 1}},
                        rp: {"resources": {"FPGA": 1}}},
        "project_id": "reqid-project", "user_id": "nova-user", "consumer_generation": None,
        "consumer_type": "INSTANCE"})
    assert resp.status_code == 204, resp.text
    (arq,) = requests.post(f"{api}/accelerator_requests", headers=NOVA,
                           json={"device_profile_name": profile}).json()["arqs"]

    global_id = f"req-{uuid.uuid4()}"
    resp = requests.patch(f"{api}/accelerator_requests", json={arq["uuid"]: [
        {"path": "/hostname", "op": "add", "value": HOST},
        {"path": "/device_rp_uuid", "op": "add", "value": rp},
        {"path": "/instance_uuid", "op": "add", "value": instance}]},
        headers={**NOVA, "X-OpenStack-Request-Id": global_id})
    assert resp.status_code == 202, resp.text
    local_id = resp.headers["X-OpenStack-Request-Id"]
    assert re.fullmatch(r"req-[0-9a-f-]{36}", local_id) and local_id != global_id

    (event,) = wait_for("the bound event", lambda: [
        r for r in nova.requests for e in r.body.get("events", [])
        if e["server_uuid"] == instance])
    assert event.body["events"][0]["status"] == "completed", event.body
    # Nova and Glance received the caller's id (keystoneauth's global_request_id).
    assert _header(event.headers) == global_id
    fetched = [r for r in glance.store.requests if IMAGE in r[1]]
    assert [r[1] for r in fetched] == [f"/v2/images/{IMAGE}", f"/v2/images/{IMAGE}/file"]
    assert {_header(r[2]) for r in fetched} == {global_id}

    # The API's access line names both ids, the user and the project.
    (access,) = wait_for("the access line", lambda: [
        line for line in _lines_with(lines, global_id)
        if "acceld.api.access" in line and '"PATCH /accelerator/v2/accelerator_requests"'
        in line])
    assert f"[{global_id} {local_id} nova-user reqid-project" in access
    assert "status: 202" in access and " len: 0 " in access
    # The conductor: the bind's own lines, and the Nova event it sent (logged once Nova's
    # answer is back, which can be after the event reached the recording Nova).
    wait_for("the conductor's Nova line", lambda: [
        line for line in _lines_with(lines, global_id)
        if "acceld.clients.nova" in line and "Nova took" in line])
    mine = _lines_with(lines, global_id)
    # (Bound after the agent fenced the programs of the deployable it programmed: the line
    # of acceld.conductor.binding.attach, docs/architecture.md "Fencing".)
    assert any("acceld.conductor.binding." in line and f"Bound ARQ {arq['uuid']}" in line
               for line in mine), "\n".join(mine)
    assert any("acceld.internal.server" in line and "POST /deployables/fence answered 200"
               in line for line in mine), "\n".join(mine)
    # The agent: the conductor's program call, made for this request.
    assert any("acceld.internal.server" in line and "POST /program answered 200" in line
               for line in mine), "\n".join(mine)
    # Placement logged the allocation check under the same global id.
    assert wait_for("Placement's line", lambda: [
        line for line in placement.log_path.read_text(errors="replace").splitlines()
        if global_id in line and f"/allocations/{instance}" in line], timeout=10)


def test_a_malformed_request_id_is_ignored(stack):
    api, lines = stack["api"], stack["lines"]
    forged = "req-not-a-uuid\" injected"
    resp = requests.get(f"{api}/device_profiles", headers={**NOVA,
                                                           "X-OpenStack-Request-Id": forged})
    assert resp.status_code == 200
    local_id = resp.headers["X-OpenStack-Request-Id"]
    (access,) = wait_for("the access line", lambda: _lines_with(lines, local_id))
    assert "[None " + local_id in access and "injected" not in access
