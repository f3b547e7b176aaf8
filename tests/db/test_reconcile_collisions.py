"""A new node's rows that collide with other nodes' rows, on every backend.

acceld.db.inventory looks up, in one statement for the node, the device uuids another
node holds (the new device gets a fresh uuid), the deployable names another node holds
(not added) and the new devices that come back with a history (a REAPPEARED event).
"""

from __future__ import annotations

from sqlalchemy import select

from acceld.db import device_events as events
from acceld.db import inventory
from acceld.db.models import device_events, devices
from acceld.drivers.fake import FakeDriver
from tests.conftest import count_queries, make_conf


def _records(tmp_path, host: str, types: tuple[str, ...] = ("FPGA", "GPU")):
    conf = make_conf(str(tmp_path))
    conf.set_override("devices", list(types), group="fake_driver")
    conf.set_override("attach_handles", 2, group="fake_driver")
    return FakeDriver(conf, host).discover()


def _reconcile(db, host, records):
    with db.write() as conn:
        return inventory.reconcile_node(conn, host, records)


def test_every_collision_and_history_in_one_lookup(db, tmp_path):
    # "a" holds the GPU uuid "a_b" will report, and a deployable named as one of a_b's
    # ("a" + "_" + "b_FakeDevice" is "a_b" + "_" + "FakeDevice").
    theirs = _records(tmp_path, "a_b")
    mine = _records(tmp_path, "a", ("GPU",))
    mine[0].uuid = theirs[1].uuid
    mine[0].deployables[0].name = "b_" + theirs[0].deployables[0].name
    _reconcile(db, "a", mine)
    # a_b's FPGA was there before, removed while not reported: back with a history.
    _reconcile(db, "a_b", theirs[:1])
    _reconcile(db, "a_b", [])
    with count_queries(db) as statements:
        changes = _reconcile(db, "a_b", theirs)
    lookups = [s for s in statements if "UNION ALL" in s.upper()]
    assert len(lookups) == 1, statements
    assert changes.skipped == ["a_b_" + theirs[0].deployables[0].name]
    with db.read() as conn:
        uuids = dict(conn.execute(select(devices.c.type, devices.c.uuid).where(
            devices.c.hostname == "a_b")).all())
        kinds = conn.execute(select(device_events.c.kind).where(
            device_events.c.device_uuid == theirs[0].uuid).order_by(
            device_events.c.id)).scalars().all()
    assert uuids["FPGA"] == theirs[0].uuid
    assert uuids["GPU"] != theirs[1].uuid  # held by a: a fresh one
    assert kinds[-1] == events.REAPPEARED
