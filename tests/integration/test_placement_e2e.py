"""End to end with a real Placement: the test plays Nova, ``acceld all`` plays Cyborg.

Nova's part, as nova-compute, the scheduler and the conductor do it: create the
compute-node provider (with VCPU and memory), read the device profile, ask
Placement for allocation candidates with the profile's groups as suffixed
request groups (``resources_device_profile_0=...``, microversion >= 1.33),
claim one with ``PUT /allocations/{instance}``, create the ARQs, bind each to
the provider its group was given (the candidate's ``mappings``), wait for the
``accelerator-request-bound`` event at a recording Nova endpoint and read the
ARQs. Then the operator disables the device (Placement reserves it all and
offers no candidates) and enables it again.

Hardware comes from the fake driver through the all-in-one's agent. Where the
all-in-one has no agent (it is being written), the test reconciles the fake
driver's report in process, the way the conductor applies an agent's report.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import requests

from acceld.db.engine import Database
from tests.compat.minimal_cloud import MinimalCloud
from tests.support import allinone
from tests.support.placement import PlacementServer, assert_placement_matches_db, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TAG = uuid.uuid4().hex[:8].upper()
HOST = f"e2e-node-{TAG.lower()}"
TRAIT = f"CUSTOM_E2E_{TAG}"  # only this test's device has it: candidates are ours alone
NOVA = {"Accept": "application/json", "X-User-Id": "nova-user", "X-Project-Id": "e2e-project",
        "X-Roles": "member,reader", "X-Service-Roles": "service"}
WAIT = 30.0


@dataclass
class Cyborg:
    proc: subprocess.Popen
    url: str
    state_path: Path
    spec_file: Path
    lines: list[str] = field(default_factory=list)

    @property
    def db(self) -> Database:
        return Database(f"sqlite:///{self.state_path / 'acceld.sqlite'}")

    def set_hardware(self, devices: list[dict[str, Any]]) -> None:
        """Change what the fake driver reports; the agent rediscovers and reports it."""
        self.spec_file.write_text(json.dumps({"devices": devices}))


def _config(path: Path, placement: PlacementServer, nova: MinimalCloud, spec: Path) -> None:
    path.write_text(f"""[DEFAULT]
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
full_sync_interval = 5
retry_max_delay = 1

[nova]
auth_type = admin_token
endpoint = {nova.compute_url}
token = nova-admin
""")


@pytest.fixture(scope="module")
def nova() -> Iterator[MinimalCloud]:
    cloud = MinimalCloud().start()
    yield cloud
    cloud.stop()


@pytest.fixture(scope="module")
def compute_node(placement: PlacementServer) -> str:
    """What nova-compute does first: its compute-node provider, named after the host."""
    return placement.create_compute_node(HOST, vcpus=8, memory_mb=16384)


@pytest.fixture(scope="module")
def cyborg(tmp_path_factory, placement, nova, compute_node) -> Iterator[Cyborg]:
    state = tmp_path_factory.mktemp("acceld-e2e")
    spec = state / "fake-devices.json"
    spec.write_text(json.dumps({"devices": [
        {"type": "FPGA", "attach_handles": 4, "traits": ["CUSTOM_FAKE_DEVICE", TRAIT]}]}))
    _config(state / "acceld.conf", placement, nova, spec)
    launched = allinone.launch(str(state), str(state / "acceld.conf"))
    try:
        yield Cyborg(launched.proc, launched.url, state, spec, launched.lines)
    finally:
        allinone.stop(launched.proc)


def wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except AssertionError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}: {last!r}")


def device_provider(placement: PlacementServer, root: str) -> dict[str, Any] | None:
    tree = placement.get("/resource_providers", in_tree=root).json()["resource_providers"]
    mine = [p for p in tree if p["uuid"] != root]
    return mine[0] if len(mine) == 1 else None


def inventory_of(placement: PlacementServer, rp: str) -> dict[str, Any]:
    return placement.get(f"/resource_providers/{rp}/inventories").json()["inventories"]


def nova_candidates(placement: PlacementServer, groups: list[dict[str, str]]) -> dict[str, Any]:
    """GET /allocation_candidates the way Nova's scheduler builds it from a flavor + profile."""
    params: dict[str, str] = {"resources": "VCPU:1,MEMORY_MB:512", "limit": "1000"}
    for index, group in enumerate(groups):
        suffix = f"_device_profile_{index}"
        resources = [f"{k.split(':', 1)[1]}:{v}" for k, v in group.items()
                     if k.startswith("resources:")]
        required = [k.split(":", 1)[1] for k, v in group.items()
                    if k.startswith("trait:") and v == "required"]
        forbidden = ["!" + k.split(":", 1)[1] for k, v in group.items()
                     if k.startswith("trait:") and v == "forbidden"]
        params[f"resources{suffix}"] = ",".join(resources)
        if required or forbidden:
            params[f"required{suffix}"] = ",".join(required + forbidden)
    if len(groups) > 1:
        params["group_policy"] = "none"
    resp = placement.get("/allocation_candidates", **params)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_nova_boot_with_an_accelerator_against_real_placement(placement, nova, compute_node,
                                                              cyborg):
    api, root = cyborg.url, compute_node
    # 1. acceld reports the fake FPGA to Placement, under the compute node.
    rp = wait_for("the device provider", lambda: device_provider(placement, root))
    assert rp["name"] == f"{HOST}_FakeDevice"
    traits = wait_for("its traits", lambda: placement.get(
        f"/resource_providers/{rp['uuid']}/traits").json()["traits"])  # written last
    assert set(traits) == {"OWNER_CYBORG", "CUSTOM_FAKE_DEVICE", TRAIT}
    inv = inventory_of(placement, rp["uuid"])
    assert inv["FPGA"]["total"] == inv["FPGA"]["max_unit"] == 4
    assert inv["FPGA"]["reserved"] == 0
    deployables = requests.get(f"{api}/deployables").json()["deployables"]
    assert [d["rp_uuid"] for d in deployables if d["name"] == rp["name"]] == [rp["uuid"]]

    # 2. An operator's profile; Nova reads it by name.
    profile = f"e2e-{TAG.lower()}"
    resp = requests.post(f"{api}/device_profiles", json=[{"name": profile, "groups": [
        {"resources:FPGA": "1", f"trait:{TRAIT}": "required"}]}])
    assert resp.status_code == 201, resp.text
    (dp,) = requests.get(f"{api}/device_profiles", params={"name": profile},
                         headers=NOVA).json()["device_profiles"]

    # 3. The scheduler: candidates for the flavor plus the profile's groups, then the claim.
    found = nova_candidates(placement, dp["groups"])
    assert len(found["allocation_requests"]) == 1, found
    claim = found["allocation_requests"][0]
    assert claim["mappings"]["_device_profile_0"] == [rp["uuid"]]
    instance = str(uuid.uuid4())
    resp = placement.put(f"/allocations/{instance}", {
        "allocations": claim["allocations"], "mappings": claim["mappings"],
        "project_id": "e2e-project", "user_id": "nova-user", "consumer_generation": None,
        "consumer_type": "INSTANCE"})
    assert resp.status_code == 204, resp.text

    # 4. The conductor: ARQs, one bind PATCH with each ARQ's allocated provider.
    resp = requests.post(f"{api}/accelerator_requests", json={"device_profile_name": profile},
                         headers=NOVA)
    assert resp.status_code == 201, resp.text
    arqs = resp.json()["arqs"]
    assert len(arqs) == 1
    patch = {arq["uuid"]: [
        {"path": "/hostname", "op": "add", "value": HOST},
        {"path": "/device_rp_uuid", "op": "add",
         "value": claim["mappings"][f"_device_profile_{arq['device_profile_group_id']}"][0]},
        {"path": "/instance_uuid", "op": "add", "value": instance}] for arq in arqs}
    resp = requests.patch(f"{api}/accelerator_requests", json=patch, headers=NOVA)
    assert resp.status_code == 202, resp.text

    # 5. Nova hears of it, and reads the bound ARQs.
    events = wait_for("the bound event", lambda: [e for e in nova.events
                                                  if e["server_uuid"] == instance])
    assert events == [{"name": "accelerator-request-bound", "server_uuid": instance,
                       "tag": arqs[0]["uuid"], "status": "completed"}]
    resp = requests.get(f"{api}/accelerator_requests", params={"instance": instance},
                        headers=NOVA)
    assert resp.status_code == 200, resp.text
    (bound,) = resp.json()["arqs"]
    assert bound["state"] == "Bound", bound
    assert bound["device_rp_uuid"] == rp["uuid"] and bound["hostname"] == HOST

    # A bind Placement did not allocate is refused (check_allocations), and Nova is told.
    stranger = str(uuid.uuid4())
    resp = requests.post(f"{api}/accelerator_requests", json={"device_profile_name": profile},
                         headers=NOVA)
    (other,) = resp.json()["arqs"]
    resp = requests.patch(f"{api}/accelerator_requests", headers=NOVA, json={other["uuid"]: [
        {"path": "/hostname", "op": "add", "value": HOST},
        {"path": "/device_rp_uuid", "op": "add", "value": rp["uuid"]},
        {"path": "/instance_uuid", "op": "add", "value": stranger}]})
    assert resp.status_code == 202, resp.text
    failed = wait_for("the failed event", lambda: [e for e in nova.events
                                                   if e["server_uuid"] == stranger])
    assert failed[0]["status"] == "failed"
    arq = requests.get(f"{api}/accelerator_requests/{other['uuid']}", headers=NOVA).json()
    assert arq["state"] == "BindFailed"
    assert any(f"instance {stranger} has no Placement allocation" in line
               for line in cyborg.lines), "the refusal reason is logged"
    assert requests.delete(f"{api}/accelerator_requests", params={"arqs": other["uuid"]},
                           headers=NOVA).status_code == 204

    # 6. The operator disables the device: all reserved, no candidates; enable: back.
    (device,) = [d for d in requests.get(f"{api}/devices", params={"hostname": HOST}).json()[
        "devices"]]
    assert requests.post(f"{api}/devices/{device['uuid']}/disable").status_code == 200
    wait_for("reserved == total", lambda: inventory_of(placement, rp["uuid"])["FPGA"][
        "reserved"] == 4)
    assert nova_candidates(placement, dp["groups"])["allocation_requests"] == []
    # The running instance keeps its allocation while the device is reserved.
    assert rp["uuid"] in placement.get(f"/allocations/{instance}").json()["allocations"]
    assert requests.post(f"{api}/devices/{device['uuid']}/enable").status_code == 200
    wait_for("reserved == 0", lambda: inventory_of(placement, rp["uuid"])["FPGA"][
        "reserved"] == 0)
    assert len(nova_candidates(placement, dp["groups"])["allocation_requests"]) == 1

    # 7. Teardown as Nova does it.
    assert requests.delete(f"{api}/accelerator_requests", params={"instance": instance},
                           headers=NOVA).status_code == 204
    assert placement.delete(f"/allocations/{instance}").status_code == 204


def test_placement_outage_while_hardware_changes_ends_matching(placement, compute_node,
                                                               cyborg):
    root = compute_node
    wait_for("the device provider", lambda: device_provider(placement, root))
    db = cyborg.db
    try:
        placement.stop(kill=True)
        try:
            # The node's hardware changes while Placement is away: a second device appears,
            # the first one loses a trait and gains handles.
            cyborg.set_hardware([
                {"type": "FPGA", "attach_handles": 6, "traits": ["CUSTOM_FAKE_DEVICE"]},
                {"type": "QAT", "name": "FakeQat", "attach_handles": 2}])
            wait_for("the new inventory in the database", lambda: len(
                requests.get(f"{cyborg.url}/deployables").json()["deployables"]) == 2)
            # The API keeps serving while Placement is down.
            assert requests.get(f"{cyborg.url}/devices").status_code == 200
            time.sleep(1.0)  # the conductor tries, fails and backs off
        finally:
            placement.start()

        def matches() -> bool:
            assert_placement_matches_db(placement, db, HOST)
            return True

        wait_for("Placement to match the database", matches)
        assert any("Placement is unavailable" in line for line in cyborg.lines)
        assert any("Placement is available again" in line for line in cyborg.lines)
        tree = placement.get("/resource_providers", in_tree=root).json()["resource_providers"]
        assert len(tree) == 3  # the compute node and two devices
    finally:
        db.dispose()


def test_fault_in_the_spec_file_quarantines_and_recovery_returns_the_device(
        placement, nova, compute_node, cyborg):
    """Issue 13's Done-when, on the running all-in-one: a fault written into the fake
    driver's spec file quarantines the device within a discovery interval (a bind to it is
    refused naming its health, Placement reserves it all); clearing it returns the device
    after [conductor] health_recovery_reports (3) healthy discoveries; both transitions are
    in the device's events."""
    api, root = cyborg.url, compute_node
    v26 = {"OpenStack-API-Version": "accelerator 2.6"}
    spec = [{"type": "FPGA", "attach_handles": 4, "traits": ["CUSTOM_FAKE_DEVICE", TRAIT]}]
    cyborg.set_hardware(spec)
    rp = wait_for("the device provider", lambda: device_provider(placement, root))
    wait_for("reserved == 0", lambda: inventory_of(placement, rp["uuid"])["FPGA"][
        "reserved"] == 0)
    (device,) = requests.get(f"{api}/devices", params={"hostname": HOST},
                             headers=v26).json()["devices"]
    assert device["quarantined"] is False
    profile = f"health-{TAG.lower()}"
    assert requests.post(f"{api}/device_profiles", json=[{"name": profile, "groups": [
        {"resources:FPGA": "1", f"trait:{TRAIT}": "required"}]}]).status_code == 201
    # The instance's allocation is claimed while the device is healthy.
    instance = str(uuid.uuid4())
    claim = nova_candidates(placement, [{"resources:FPGA": "1",
                                         f"trait:{TRAIT}": "required"}])[
        "allocation_requests"][0]
    assert placement.put(f"/allocations/{instance}", {
        "allocations": claim["allocations"], "mappings": claim["mappings"],
        "project_id": "e2e-project", "user_id": "nova-user", "consumer_generation": None,
        "consumer_type": "INSTANCE"}).status_code == 204

    reason = "XID 79: GPU has fallen off the bus (injected)"
    cyborg.set_hardware([{**spec[0], "health": {"state": "unhealthy", "reason": reason}}])
    shown = wait_for("the quarantine", lambda: (lambda d: d if d["quarantined"] else None)(
        requests.get(f"{api}/devices/{device['uuid']}", headers=v26).json()), timeout=10)
    assert (shown["health"], shown["health_reason"]) == ("unhealthy", reason)
    wait_for("reserved == total", lambda: inventory_of(placement, rp["uuid"])["FPGA"][
        "reserved"] == 4)
    assert any("quarantined" in line and device["uuid"] in line and HOST in line
               and reason in line for line in cyborg.lines), "one WARNING names it all"

    (arq,) = requests.post(f"{api}/accelerator_requests", json={"device_profile_name": profile},
                           headers=NOVA).json()["arqs"]
    assert requests.patch(f"{api}/accelerator_requests", headers=NOVA, json={arq["uuid"]: [
        {"path": "/hostname", "op": "add", "value": HOST},
        {"path": "/device_rp_uuid", "op": "add", "value": rp["uuid"]},
        {"path": "/instance_uuid", "op": "add", "value": instance}]}).status_code == 202
    wait_for("the failed event", lambda: [e for e in nova.events
                                          if e["server_uuid"] == instance])
    # The reason names hardware: an administrator reads it (Nova is told the short form).
    refused = requests.get(f"{api}/accelerator_requests/{arq['uuid']}",
                           headers={"OpenStack-API-Version": "accelerator 2.4"}).json()
    assert refused["state"] == "BindFailed"
    assert "quarantined" in refused["bind_failure_reason"]
    assert reason in refused["bind_failure_reason"]

    cyborg.set_hardware([{**spec[0], "health": {"state": "healthy"}}])
    wait_for("the return to service", lambda: requests.get(
        f"{api}/devices/{device['uuid']}", headers=v26).json()["quarantined"] is False,
        timeout=15)
    wait_for("reserved == 0", lambda: inventory_of(placement, rp["uuid"])["FPGA"][
        "reserved"] == 0)
    kinds = [e["kind"] for e in requests.get(f"{api}/devices/{device['uuid']}/events",
                                             headers=v26).json()["events"]]
    assert kinds[0] == "recovered" and "quarantined" in kinds, kinds
    assert kinds.index("recovered") < kinds.index("quarantined")  # newest first

    assert requests.delete(f"{api}/accelerator_requests", params={"arqs": arq["uuid"]},
                           headers=NOVA).status_code == 204
    assert placement.delete(f"/allocations/{instance}").status_code == 204
    cyborg.set_hardware(spec)
