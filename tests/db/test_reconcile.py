"""Reconciliation: a node's report diffed into the inventory, on every backend."""

from __future__ import annotations

import json
import uuid as uuidlib

import pytest
from sqlalchemy import func, select, update

from acceld.conductor.reconcile import apply_report
from acceld.db import inventory
from acceld.db.models import (agents, attach_handles, attributes, controlpath_ids, deployables,
                              devices, placement_sync, utcnow)
from acceld.drivers.base import HardwareRecord
from acceld.drivers.fake import FakeDriver
from tests.conftest import count_queries, make_conf

HOST = "node-1"
WRITES = ("INSERT", "UPDATE", "DELETE", "COPY")  # COPY: new rows on PostgreSQL


@pytest.fixture
def fake_conf(tmp_path):
    return make_conf(str(tmp_path))


def fake_records(conf, devices_=("FPGA",), handles=16, host=HOST) -> list[HardwareRecord]:
    conf.set_override("devices", list(devices_), group="fake_driver")
    conf.set_override("attach_handles", handles, group="fake_driver")
    return FakeDriver(conf, host).discover()


def reconcile(db, records, host=HOST, **kwargs):
    with db.write() as conn:
        return inventory.reconcile_node(conn, host, records, **kwargs)


def count(db, table, *where) -> int:
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()


def writes(statements) -> list[str]:
    return [s for s in statements if s.lstrip().upper().startswith(WRITES)]


def test_add_creates_device_deployable_attributes_and_handles(db, fake_conf):
    changes = reconcile(db, fake_records(fake_conf))
    assert changes.added == 1 + 1 + 2 + 16
    with db.read() as conn:
        dev = conn.execute(select(devices)).one()
        dep = conn.execute(select(deployables)).one()
        cpid = conn.execute(select(controlpath_ids)).one()
        attrs = dict(conn.execute(select(attributes.c.key, attributes.c.value)).all())
        handles = conn.execute(select(attach_handles)).all()
        dirty = conn.execute(select(placement_sync)).all()
    assert (dev.type, dev.vendor, dev.hostname, dev.status, dev.acc_status, dev.vanished) == \
        ("FPGA", "0xABCD", HOST, "enabled", "ready", False)
    assert json.loads(dev.std_board_info) == {"device_id": "0xabcd", "class": "Fake class"}
    assert dep.name == f"{HOST}_FakeDevice"
    assert dep.rp_uuid == str(uuidlib.uuid3(uuidlib.NAMESPACE_DNS, f"{HOST}_FakeDevice"))
    assert (dep.num_accelerators, dep.driver_name, dep.device_id) == (16, "fake", dev.id)
    assert json.loads(cpid.cpid_info) == {"domain": "0000", "bus": "0c", "device": "00",
                                          "function": "0"}
    assert attrs == {"rc": "FPGA", "trait0": "CUSTOM_FAKE_DEVICE"}
    assert len(handles) == 16 and not any(h.in_use for h in handles)
    assert {h.attach_type for h in handles} == {"TEST_PCI"}
    assert json.loads(handles[0].attach_info)["bus"] == "0c"
    assert [(d.rp_uuid, d.dirty) for d in dirty] == [(dep.rp_uuid, True)]


def test_unchanged_node_costs_no_writes(db, fake_conf):
    records = fake_records(fake_conf, ("FPGA", "GPU", "QAT"))
    reconcile(db, records)
    with count_queries(db) as statements:
        changes = reconcile(db, records)
    assert changes.writes == 0 and not changes.dirty_rps
    assert writes(statements) == []
    # Five reads whatever the node's size.
    assert len(statements) == 5, statements


def test_update_changes_only_what_differs(db, fake_conf):
    reconcile(db, fake_records(fake_conf, handles=16))
    with db.read() as conn:
        before = conn.execute(select(devices.c.uuid, deployables.c.uuid).join(
            deployables, deployables.c.device_id == devices.c.id)).one()
    records = fake_records(fake_conf, handles=8)
    records[0].model = "new model"
    records[0].deployables[0].attributes["trait0"] = "CUSTOM_OTHER"
    records[0].deployables[0].attributes["trait1"] = "CUSTOM_MORE"
    with count_queries(db) as statements:
        changes = reconcile(db, records)
    assert changes.removed == 8  # the handles beyond 8
    assert count(db, attach_handles) == 8
    with db.read() as conn:
        after = conn.execute(select(devices.c.uuid, deployables.c.uuid).join(
            deployables, deployables.c.device_id == devices.c.id)).one()
        dev = conn.execute(select(devices)).one()
        dep = conn.execute(select(deployables)).one()
        attrs = dict(conn.execute(select(attributes.c.key, attributes.c.value)).all())
    assert after == before  # identities survive an update
    assert dev.model == "new model" and dep.num_accelerators == 8
    assert attrs == {"rc": "FPGA", "trait0": "CUSTOM_OTHER", "trait1": "CUSTOM_MORE"}
    # One UPDATE device, one UPDATE deployable, one UPDATE attribute, one INSERT attribute,
    # one DELETE of handles, one UPDATE of the placement flag.
    assert len(writes(statements)) == 6, writes(statements)


def test_removed_device_is_deleted_with_its_rows(db, fake_conf):
    reconcile(db, fake_records(fake_conf, ("FPGA", "GPU")))
    assert count(db, devices) == 2
    changes = reconcile(db, fake_records(fake_conf, ("FPGA",)))
    assert changes.removed == 1
    for table in (devices, deployables, controlpath_ids):
        assert count(db, table) == 1
    assert count(db, attach_handles) == 16
    reconcile(db, [])
    for table in (devices, deployables, controlpath_ids, attributes, attach_handles):
        assert count(db, table) == 0


def test_other_nodes_are_untouched(db, fake_conf):
    reconcile(db, fake_records(fake_conf, host="node-2"), host="node-2")
    reconcile(db, fake_records(fake_conf))
    reconcile(db, [])
    assert count(db, devices, devices.c.hostname == "node-2") == 1
    assert count(db, devices) == 1


def _take_handle(db) -> None:
    with db.write() as conn:
        first = conn.execute(select(attach_handles.c.id).order_by(attach_handles.c.id)).scalar()
        conn.execute(update(attach_handles).where(attach_handles.c.id == first)
                     .values(in_use=True))


def test_device_vanished_while_in_use_is_held_until_released(db, fake_conf):
    records = fake_records(fake_conf)
    reconcile(db, records)
    _take_handle(db)
    changes = reconcile(db, [])
    assert len(changes.held) == 1
    with db.read() as conn:
        dev = conn.execute(select(devices)).one()
    assert (dev.status, dev.vanished) == ("maintaining", True)
    assert dev.status_reason.startswith(inventory.VANISHED_PREFIX)
    assert count(db, attach_handles) == 16
    # Still gone and still in use: nothing to write.
    with count_queries(db) as statements:
        reconcile(db, [])
    assert writes(statements) == [], writes(statements)
    # Released: the next reconcile removes it.
    with db.write() as conn:
        conn.execute(update(attach_handles).values(in_use=False))
    assert reconcile(db, []).removed == 1
    assert count(db, devices) == 0 and count(db, attach_handles) == 0


def test_vanished_device_that_comes_back_is_enabled_again(db, fake_conf):
    records = fake_records(fake_conf)
    reconcile(db, records)
    _take_handle(db)
    reconcile(db, [])
    reconcile(db, records)
    with db.read() as conn:
        dev = conn.execute(select(devices)).one()
    assert (dev.status, dev.vanished, dev.status_reason) == ("enabled", False, None)


def test_operator_disable_survives_reconcile(db, fake_conf):
    records = fake_records(fake_conf)
    reconcile(db, records)
    with db.write() as conn:
        conn.execute(update(devices).values(status="maintaining", status_reason="broken fan"))
    records[0].model = "changed"
    reconcile(db, records)
    with db.read() as conn:
        dev = conn.execute(select(devices)).one()
    assert (dev.status, dev.status_reason, dev.model) == ("maintaining", "broken fan", "changed")


def test_in_use_handle_that_disappears_is_kept(db, fake_conf):
    reconcile(db, fake_records(fake_conf, handles=16))
    with db.write() as conn:
        last = conn.execute(select(attach_handles.c.id).order_by(
            attach_handles.c.id.desc())).scalar()
        conn.execute(update(attach_handles).where(attach_handles.c.id == last)
                     .values(in_use=True))
    reconcile(db, fake_records(fake_conf, handles=8))
    assert count(db, attach_handles) == 9
    assert count(db, attach_handles, attach_handles.c.in_use.is_(True)) == 1


def test_deployable_that_disappears_while_in_use_keeps_only_its_used_handles(db, fake_conf):
    """Its device is still reported, so nothing refuses binds to it: its free handles go at
    once (no new bind gets hardware the node no longer has); the rest once released."""
    records = fake_records(fake_conf, handles=4)
    reconcile(db, records)
    _take_handle(db)
    records[0].deployables = []
    changes = reconcile(db, records)
    assert changes.removed == 3
    assert count(db, deployables) == 1
    assert count(db, attach_handles) == 1
    assert count(db, attach_handles, attach_handles.c.in_use.is_(True)) == 1
    with db.write() as conn:
        conn.execute(update(attach_handles).values(in_use=False))
    reconcile(db, records)
    assert count(db, deployables) == 0 and count(db, attach_handles) == 0
    assert count(db, devices) == 1


def test_hardware_not_ready_is_recorded_with_its_reason(db, fake_conf, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([{"type": "FPGA", "acc_status": "setup_required",
                                 "status_reason": "load the shell bitstream first"}]))
    fake_conf.set_override("spec_file", str(spec), group="fake_driver")
    reconcile(db, FakeDriver(fake_conf, HOST).discover())
    with db.read() as conn:
        dev = conn.execute(select(devices)).one()
    assert (dev.acc_status, dev.status_reason) == ("setup_required",
                                                   "load the shell bitstream first")
    spec.write_text(json.dumps([{"type": "FPGA"}]))
    changes = reconcile(db, FakeDriver(fake_conf, HOST).discover())
    assert changes.dirty_rps  # Placement must now offer it
    with db.read() as conn:
        dev = conn.execute(select(devices)).one()
    assert (dev.acc_status, dev.status_reason, dev.status) == ("ready", None, "enabled")


def _agent(db, host=HOST) -> None:
    with db.write() as conn:
        conn.execute(agents.insert().values(hostname=host, endpoint="127.0.0.1:1",
                                            state="up", heartbeat_interval=1,
                                            last_seen_at=utcnow()))


def test_report_with_a_bad_record_keeps_the_rest(db, fake_conf):
    _agent(db)
    good = [r.to_dict() for r in fake_records(fake_conf, ("FPGA", "GPU"))]
    outcome = apply_report(db, HOST, {"hardware": good, "digest": "d1"})
    assert not outcome.problems and count(db, devices) == 2
    # Now the GPU record is broken and the FPGA changed: the FPGA change applies,
    # the GPU rows stay as they were.
    bad = [dict(good[0], model="FPGA v2"), dict(good[1], vendor=17)]
    outcome = apply_report(db, HOST, {"hardware": bad, "digest": "d2"})
    assert [p.index for p in outcome.problems] == [1]
    assert "vendor" in outcome.problems[0].message
    with db.read() as conn:
        rows = dict(conn.execute(select(devices.c.type, devices.c.model)).all())
        digest = conn.execute(select(agents.c.hardware_digest)).scalar()
    assert rows == {"FPGA": "FPGA v2", "GPU": "miss model info"}
    assert digest == "d2"


def test_report_that_is_not_a_list_changes_nothing(db, fake_conf):
    _agent(db)
    apply_report(db, HOST, {"hardware": [r.to_dict() for r in fake_records(fake_conf)],
                            "digest": "d1"})
    outcome = apply_report(db, HOST, {"hardware": "nonsense", "digest": "d2"})
    assert outcome.problems and count(db, devices) == 1


def test_report_with_held_device_forgets_digest(db, fake_conf):
    _agent(db)
    apply_report(db, HOST, {"hardware": [r.to_dict() for r in fake_records(fake_conf)],
                            "digest": "d1"})
    _take_handle(db)
    outcome = apply_report(db, HOST, {"hardware": [], "digest": "d-empty"})
    assert outcome.changes.held
    with db.read() as conn:
        assert conn.execute(select(agents.c.hardware_digest)).scalar() is None


def _attr_rows(db) -> dict[str, tuple[str, bool]]:
    with db.read() as conn:
        return {r.key: (r.value, r.operator_owned) for r in conn.execute(select(
            attributes.c.key, attributes.c.value, attributes.c.operator_owned))}


def test_operator_attribute_survives_reconcile(db, fake_conf):
    from acceld.db import attributes as attr_db

    reconcile(db, fake_records(fake_conf, handles=16))
    with db.write() as conn:
        dep_id = conn.execute(select(deployables.c.id)).scalar_one()
        attr_db.create(conn, deployable_id=dep_id, key="trait7", value="CUSTOM_OPERATOR")
    records = fake_records(fake_conf, handles=8)  # a changed report is diffed again
    records[0].deployables[0].attributes.pop("trait0")
    changes = reconcile(db, records)
    assert changes.removed == 8 + 1  # the handles beyond 8 and the driver's trait0
    assert _attr_rows(db) == {"rc": ("FPGA", False), "trait7": ("CUSTOM_OPERATOR", True)}
    with count_queries(db) as statements:
        assert reconcile(db, records).writes == 0
    assert writes(statements) == []


def test_driver_reported_key_takes_over_an_operator_attribute(db, fake_conf):
    from acceld.db import attributes as attr_db

    reconcile(db, fake_records(fake_conf))
    with db.write() as conn:
        dep_id = conn.execute(select(deployables.c.id)).scalar_one()
        attr_db.create(conn, deployable_id=dep_id, key="trait1", value="CUSTOM_TYPED")
    records = fake_records(fake_conf)
    records[0].deployables[0].attributes["trait1"] = "CUSTOM_FROM_HARDWARE"
    changes = reconcile(db, records)
    assert rp_dirty(db, changes)
    assert _attr_rows(db)["trait1"] == ("CUSTOM_FROM_HARDWARE", False)
    # Now the driver's: it goes when the driver stops reporting it.
    reconcile(db, fake_records(fake_conf))
    assert "trait1" not in _attr_rows(db)


def rp_dirty(db, changes) -> bool:
    with db.read() as conn:
        return bool(changes.dirty_rps) and conn.execute(select(placement_sync.c.dirty)).scalar()
