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

from sqlalchemy import select

from acceld.conductor.placement.sync import PlacementSync
from acceld.conductor.reconcile import apply_report
from acceld.db import cyborg_import
from acceld.db.models import (accelerator_requests, attach_handles, attributes, deployables,
                              devices)
from acceld.drivers import loader
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


def upstream_cloud(placement: PlacementServer, db: Any, tmp_path: Any
                   ) -> tuple[str, str, str, list[str], dict[str, Any]]:
    """Upstream's report and binds on a new host, Nova's allocations, then the import into
    ``db``: (host, compute node uuid, deployable provider uuid, instances, Placement before)."""
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
    return host, root, rp, instances, before


def test_acceld_adopts_upstreams_providers(placement, db, tmp_path) -> None:
    host, root, rp, instances, before = upstream_cloud(placement, db, tmp_path)
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


def inventory_of(db: Any, host: str) -> dict[str, Any]:
    with db.read() as conn:
        return {
            "devices": set(conn.execute(select(devices.c.uuid).where(
                devices.c.hostname == host)).scalars()),
            "deployables": set(conn.execute(select(deployables.c.uuid, deployables.c.rp_uuid)
                                            ).tuples()),
            "handles": {u: (info, in_use) for u, info, in_use in conn.execute(select(
                attach_handles.c.uuid, attach_handles.c.attach_info, attach_handles.c.in_use))},
            "attributes": set(conn.execute(select(attributes.c.uuid, attributes.c.key,
                                                  attributes.c.value)).tuples()),
            "arqs": {u: (state, handle) for u, state, handle in conn.execute(select(
                accelerator_requests.c.uuid, accelerator_requests.c.state,
                attach_handles.c.uuid).outerjoin(attach_handles, attach_handles.c.id
                                                 == accelerator_requests.c.attach_handle_id))},
        }


def test_acceld_agent_report_reconciles_onto_the_imported_rows(placement, db, tmp_path) -> None:
    """acceld's fake driver on the imported host reports the same device: the same rows
    (uuids, handles, attributes), nothing added or removed, the Bound ARQs' handles still
    theirs and in use; and Placement stays as upstream left it."""
    host, _root, rp, instances, before = upstream_cloud(placement, db, tmp_path)
    imported = inventory_of(db, host)
    conf = make_conf(str(tmp_path), host=host)
    records = [r.to_dict() for r in loader.load("fake_driver", conf, host).discover()]
    outcome = apply_report(db, host, {"hardware": records, "digest": "d1"})
    assert not outcome.problems
    assert (outcome.changes.added, outcome.changes.removed) == (0, 0), outcome.changes
    assert inventory_of(db, host) == imported
    bound = [h for state, h in imported["arqs"].values() if state == "Bound"]
    assert len(bound) == 2 and all(imported["handles"][h][1] for h in bound)

    placement.configure(conf)
    sync = PlacementSync(conf, db)
    sync.sync_once()
    after = snapshot(placement, host, instances)
    assert set(after["providers"]) == set(before["providers"])
    assert after["providers"][rp]["inventories"] == before["providers"][rp]["inventories"]
    assert after["allocations"] == before["allocations"]


def test_operators_reserved_and_trait_survive_the_adoption(placement, db, tmp_path) -> None:
    """Issue 40: the operator drained the card by one (``reserved``) and tagged it with a
    custom trait flavors require, under upstream. acceld's import, reconcile, first sync and
    audit keep both; acceld's own trait that its device no longer has is removed, and the
    operator's stays through that too (docs/placement.md, "Ownership")."""
    from acceld.db.placement_flags import mark_dirty
    from sqlalchemy import update

    host, _root, rp, instances, before = upstream_cloud(placement, db, tmp_path)
    fpga = before["providers"][rp]["inventories"]["FPGA"]
    assert fpga["reserved"] == 0 and fpga["total"] > 2
    body = placement.get(f"/resource_providers/{rp}/inventories").json()
    assert placement.put(f"/resource_providers/{rp}/inventories/FPGA", {
        "resource_provider_generation": body["resource_provider_generation"],
        **dict(fpga, reserved=1)}).status_code == 200
    assert placement.put("/traits/CUSTOM_OPERATOR_TAG", {}).status_code in (201, 204)
    body = placement.get(f"/resource_providers/{rp}/traits").json()
    assert placement.put(f"/resource_providers/{rp}/traits", {
        "resource_provider_generation": body["resource_provider_generation"],
        "traits": body["traits"] + ["CUSTOM_OPERATOR_TAG"]}).status_code == 200

    conf = make_conf(str(tmp_path), host=host)
    records = [r.to_dict() for r in loader.load("fake_driver", conf, host).discover()]
    assert not apply_report(db, host, {"hardware": records, "digest": "d1"}).problems
    placement.configure(conf)
    sync = PlacementSync(conf, db)
    sync.sync_once()
    assert sync.audit([host]).repaired == {}
    sync.sync_once()

    def state() -> tuple[int, set[str]]:
        inv = placement.get(f"/resource_providers/{rp}/inventories").json()["inventories"]
        return (inv["FPGA"]["reserved"],
                set(placement.get(f"/resource_providers/{rp}/traits").json()["traits"]))

    assert state() == (1, {"CUSTOM_FAKE_DEVICE", "CUSTOM_OPERATOR_TAG", "OWNER_CYBORG"})
    assert snapshot(placement, host, instances)["allocations"] == before["allocations"]

    # The device's trait changes under acceld: the one acceld wrote goes, the operator's stays.
    with db.write() as conn:
        dep = conn.execute(select(deployables.c.id).where(deployables.c.rp_uuid == rp)
                           ).scalar_one()
        conn.execute(update(attributes).where(attributes.c.deployable_id == dep,
                                              attributes.c.value == "CUSTOM_FAKE_DEVICE")
                     .values(value="CUSTOM_FAKE_DEVICE_V2"))
        mark_dirty(conn, hostname=host)
    sync.sync_once(full=False)
    assert sync.audit([host]).repaired == {}
    assert state() == (1, {"CUSTOM_FAKE_DEVICE_V2", "CUSTOM_OPERATOR_TAG", "OWNER_CYBORG"})
