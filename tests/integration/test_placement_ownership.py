"""What acceld owns on the providers it manages, and what it keeps of the operator's (issue 40).

An operator drains a card with ``reserved`` on its provider's inventory and tags it with a
custom trait that flavors require. acceld once owned the whole inventory record and trait
list, so its next write (a reconcile, a device enabled again) or its audit undid both,
silently. Now it writes what it derives (class, total, its own reservation, its own
traits) and keeps the rest: an operator's ``reserved`` (until acceld's own full
reservation covers it), and traits it did not write itself, while a trait it wrote and no
longer wants is removed (docs/placement.md, "Ownership"). Against the real Placement.
"""

from __future__ import annotations

import logging
import uuid as uuidlib
from typing import Any

import pytest
from sqlalchemy import update

from acceld.conductor.placement.sync import PlacementSync
from acceld.db.engine import Database
from acceld.db.models import attributes, deployables, devices
from acceld.db.placement_flags import mark_dirty
from tests.integration.test_placement_sync import add_accelerator
from tests.support.placement import PlacementServer, assert_placement_matches_db

pytestmark = pytest.mark.integration


@pytest.fixture
def host() -> str:
    return f"own-{uuidlib.uuid4().hex[:10]}"


def inventory(placement: PlacementServer, rp: str) -> dict[str, Any]:
    return placement.get(f"/resource_providers/{rp}/inventories").json()["inventories"]


def traits(placement: PlacementServer, rp: str) -> set[str]:
    return set(placement.get(f"/resource_providers/{rp}/traits").json()["traits"])


def operator_reserves(placement: PlacementServer, rp: str, rc: str, reserved: int) -> None:
    """``openstack resource provider inventory set --amend`` of reserved alone."""
    body = placement.get(f"/resource_providers/{rp}/inventories").json()
    inv = dict(body["inventories"][rc], reserved=reserved)
    resp = placement.put(f"/resource_providers/{rp}/inventories/{rc}", {
        "resource_provider_generation": body["resource_provider_generation"], **inv})
    assert resp.status_code == 200, resp.text


def operator_tags(placement: PlacementServer, rp: str, trait: str) -> None:
    """``openstack resource provider trait set`` with one trait more."""
    assert placement.put(f"/traits/{trait}", {}).status_code in (201, 204)
    body = placement.get(f"/resource_providers/{rp}/traits").json()
    resp = placement.put(f"/resource_providers/{rp}/traits", {
        "resource_provider_generation": body["resource_provider_generation"],
        "traits": sorted(set(body["traits"]) | {trait})})
    assert resp.status_code == 200, resp.text


def set_device(db: Database, acc: dict[str, Any], **values: Any) -> None:
    """A change the way reconcile or ``acceld device disable`` makes one: flagged."""
    with db.write() as conn:
        if "num" in values:
            conn.execute(update(deployables).where(
                deployables.c.id == acc["deployable"]["id"]).values(
                num_accelerators=values.pop("num")))
        if "trait0" in values:
            conn.execute(update(attributes).where(
                attributes.c.deployable_id == acc["deployable"]["id"],
                attributes.c.key == "trait0").values(value=values.pop("trait0")))
        if values:
            conn.execute(update(devices).where(devices.c.id == acc["device"]["id"])
                         .values(**values))
        mark_dirty(conn, device_uuid=acc["device"]["uuid"])


def test_operator_reserved_is_kept_across_writes_and_audits(placement, pconf, db, host, tag,
                                                            caplog):
    placement.create_compute_node(host)
    acc = add_accelerator(db, host, "0000:5e:00.0", num=2)
    rp = acc["rp"]
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    operator_reserves(placement, rp, "FPGA", 1)  # drain one of the card's two

    # A reconcile changes what acceld derives (a third accelerator): written, reserved kept.
    set_device(db, acc, num=3)
    with caplog.at_level(logging.INFO, logger="acceld.conductor"):
        assert sync.sync_once(full=False).written == [rp]
    assert inventory(placement, rp)["FPGA"] | {} == {
        "total": 3, "max_unit": 3, "reserved": 1, "min_unit": 1, "step_size": 1,
        "allocation_ratio": 1.0}
    changed = [r.getMessage() for r in caplog.records if rp in r.getMessage()]
    assert len(changed) == 1 and "total=3" in changed[0], caplog.text  # one line: what changed

    # The audit does not call it drift, and rewrites nothing.
    result = sync.audit([host])
    assert result.repaired == {}
    assert inventory(placement, rp)["FPGA"]["reserved"] == 1

    # acceld's own full reservation covers it while the device is disabled, then it is back.
    set_device(db, acc, status="maintaining")
    sync.sync_once(full=False)
    assert inventory(placement, rp)["FPGA"]["reserved"] == 3
    set_device(db, acc, status="enabled")
    sync.sync_once(full=False)
    assert inventory(placement, rp)["FPGA"]["reserved"] == 1
    sync.sync_once(full=True)
    assert sync.audit([host]).repaired == {}
    assert inventory(placement, rp)["FPGA"]["reserved"] == 1

    # The operator undrains the card: that is kept too.
    operator_reserves(placement, rp, "FPGA", 0)
    set_device(db, acc, num=2)
    sync.sync_once(full=False)
    assert sync.audit([host]).repaired == {}
    assert inventory(placement, rp)["FPGA"]["reserved"] == 0
    assert_placement_matches_db(placement, db, host)


def test_operator_trait_is_kept_and_acceld_stale_trait_is_removed(placement, pconf, db, host,
                                                                  tag):
    placement.create_compute_node(host)
    acc = add_accelerator(db, host, "0000:5e:00.0", traits=(f"CUSTOM_A_{tag}",))
    rp = acc["rp"]
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    operator_tags(placement, rp, f"CUSTOM_OPERATOR_{tag}")

    # The device's trait changes (reprogrammed): acceld's old one goes, the operator's stays.
    set_device(db, acc, trait0=f"CUSTOM_B_{tag}")
    assert sync.sync_once(full=False).written == [rp]
    assert traits(placement, rp) == {"OWNER_CYBORG", f"CUSTOM_B_{tag}", f"CUSTOM_OPERATOR_{tag}"}
    assert sync.audit([host]).repaired == {}
    assert traits(placement, rp) == {"OWNER_CYBORG", f"CUSTOM_B_{tag}", f"CUSTOM_OPERATOR_{tag}"}

    # A trait of acceld's removed by hand, or its old one put back, is drift: repaired,
    # and the operator's stays through the repair.
    body = placement.get(f"/resource_providers/{rp}/traits").json()
    assert placement.put(f"/resource_providers/{rp}/traits", {
        "resource_provider_generation": body["resource_provider_generation"],
        "traits": ["OWNER_CYBORG", f"CUSTOM_A_{tag}", f"CUSTOM_OPERATOR_{tag}"]}
    ).status_code == 200
    result = sync.audit([host])
    drift = " ".join(result.repaired[host])
    assert f"missing CUSTOM_B_{tag}" in drift and f"unexpected CUSTOM_A_{tag}" in drift
    assert f"CUSTOM_OPERATOR_{tag}" not in drift
    assert traits(placement, rp) == {"OWNER_CYBORG", f"CUSTOM_B_{tag}", f"CUSTOM_OPERATOR_{tag}"}


def test_audit_names_the_operators_edits_once_and_repairs_only_acceld_s(placement, pconf, db,
                                                                       host, tag, caplog):
    placement.create_compute_node(host)
    acc = add_accelerator(db, host, "0000:5e:00.0", num=2)
    rp = acc["rp"]
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    operator_reserves(placement, rp, "FPGA", 2)
    operator_tags(placement, rp, f"CUSTOM_OPERATOR_{tag}")

    with caplog.at_level(logging.INFO, logger="acceld.conductor"):
        result = sync.audit([host])
        again = sync.audit([host])

    assert result.repaired == {} and again.repaired == {}
    lines = [r.getMessage() for r in caplog.records if rp in r.getMessage()]
    assert len(lines) == 1, caplog.text  # named once, as the operator's, not as drift
    assert "operator" in lines[0] and "reserved=2" in lines[0] and "drift" not in lines[0]
    assert f"CUSTOM_OPERATOR_{tag}" in lines[0]
    assert inventory(placement, rp)["FPGA"]["reserved"] == 2
    assert f"CUSTOM_OPERATOR_{tag}" in traits(placement, rp)


def test_an_operator_edit_between_acceld_s_read_and_write_is_kept(placement, pconf, db, host,
                                                                 tag):
    """The operator tags and drains the card right after acceld read its traits, before
    acceld writes them: acceld's write carries the generation it read, gets a 409, reads
    again and merges again, so neither edit is lost."""
    placement.create_compute_node(host)
    acc = add_accelerator(db, host, "0000:5e:00.0", traits=(f"CUSTOM_A_{tag}",), num=2)
    rp = acc["rp"]
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    set_device(db, acc, trait0=f"CUSTOM_B_{tag}")
    real = sync.client.read_traits
    reads: list[int] = []

    def then_the_operator(uuid: str):  # type: ignore[no-untyped-def]
        found = real(uuid)
        reads.append(found[1])
        if len(reads) == 1:  # between acceld's read and its write
            operator_tags(placement, rp, f"CUSTOM_OPERATOR_{tag}")
            operator_reserves(placement, rp, "FPGA", 1)
        return found

    sync.client.read_traits = then_the_operator  # type: ignore[method-assign]
    assert sync.sync_once(full=False).written == [rp]

    assert len(reads) == 2  # read again after the 409
    assert traits(placement, rp) == {"OWNER_CYBORG", f"CUSTOM_B_{tag}", f"CUSTOM_OPERATOR_{tag}"}
    assert inventory(placement, rp)["FPGA"]["reserved"] == 1
    assert sync.audit([host]).repaired == {}
