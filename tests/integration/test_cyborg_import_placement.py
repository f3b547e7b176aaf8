"""Placement adopted, not duplicated: upstream Cyborg 17's own conductor code takes its fake
driver's report (tests/support/upstream_report.py: the device in upstream's database and its
provider in a real Placement), two instances are bound and hold Nova's allocations; then
acceld imports upstream's database and runs its Placement sync and audit on the same
Placement. The providers keep their uuids, names, parents and inventories, gain only
acceld's OWNER_CYBORG trait beside upstream's, no provider is created, and the instances'
allocations are exactly as they were."""

from __future__ import annotations

import json
import subprocess
import uuid as uuidlib
from typing import Any

import pytest

from acceld.conductor.placement_sync import PlacementSync
from acceld.db import cyborg_import
from tests.conftest import make_conf
from tests.support import upstream_cyborg
from tests.support.placement import PlacementServer, assert_placement_matches_db

pytestmark = pytest.mark.integration

REPORT = upstream_cyborg.FILL.with_name("upstream_report.py")


def snapshot(placement: PlacementServer, host: str, instances: list[str]) -> dict[str, Any]:
    """Every provider whose name starts with the host's, as Placement holds it, and the
    instances' allocations."""
    providers = {}
    for rp in placement.get("/resource_providers").json()["resource_providers"]:
        if not rp["name"].startswith(host):
            continue
        inventories = placement.get(f"/resource_providers/{rp['uuid']}/inventories").json()
        traits = placement.get(f"/resource_providers/{rp['uuid']}/traits").json()["traits"]
        providers[rp["uuid"]] = {"name": rp["name"], "parent": rp["parent_provider_uuid"],
                                 "inventories": inventories["inventories"],
                                 "traits": set(traits)}
    # (a provider's generation, shown beside each allocation, moves with any write to it)
    allocations = {vm: {rp: alloc["resources"] for rp, alloc in placement.get(
        f"/allocations/{vm}").json()["allocations"].items()} for vm in instances}
    return {"providers": providers, "allocations": allocations}


def test_acceld_adopts_upstreams_providers(placement, db, tmp_path) -> None:
    upstream_cyborg.require("sqlite")
    host = f"cn-{uuidlib.uuid4().hex[:10]}"
    root = placement.create_compute_node(host)
    with upstream_cyborg.database("sqlite", tmp_path) as url:
        done = subprocess.run([str(upstream_cyborg.PYTHON), str(REPORT), url, host,
                               placement.url], capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        made = json.loads(done.stdout.strip().splitlines()[-1])
        rp, instances = made["rp_uuid"], made["instances"]
        for vm in instances:  # what Nova's scheduler claimed for each bound instance
            resp = placement.put(f"/allocations/{vm}", {
                "allocations": {root: {"resources": {"VCPU": 1, "MEMORY_MB": 512}},
                                rp: {"resources": {"FPGA": 1}}},
                "project_id": "0a1b2c3d4e5f46a7b8c9d0e1f2a3b4c5", "user_id": "u1",
                "consumer_generation": None, "consumer_type": "INSTANCE"})
            assert resp.status_code == 204, resp.text
        before = snapshot(placement, host, instances)
        assert set(before["providers"]) == {root, rp}
        cyborg_import.run(url, db, dry_run=False)

    conf = make_conf(str(tmp_path))
    placement.configure(conf)
    sync = PlacementSync(conf, db)
    try:
        first = sync.sync_once()
        assert first.written == [rp]  # adopted: updated in place, not created
        sync.audit([host])
        sync.sync_once()
    finally:
        sync.stop()
    after = snapshot(placement, host, instances)

    assert set(after["providers"]) == set(before["providers"])  # none created, none deleted
    for uuid, was in before["providers"].items():
        now = after["providers"][uuid]
        assert (now["name"], now["parent"], now["inventories"]) == \
            (was["name"], was["parent"], was["inventories"]), uuid
        assert now["traits"] - was["traits"] <= {"OWNER_CYBORG"}  # beside, never instead
        assert was["traits"] <= now["traits"]
    assert after["providers"][rp]["traits"] == {"CUSTOM_FAKE_DEVICE", "OWNER_CYBORG"}
    assert after["allocations"] == before["allocations"]
    assert_placement_matches_db(placement, db, host, conf.conductor.reserve_devices_of_down_agents)
