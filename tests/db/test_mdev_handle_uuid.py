"""An MDEV attach handle's uuid is its mdev's uuid (issue 17), on every backend.

Upstream Cyborg's consumer reads the ARQ's ``attach_handle_uuid`` as the mdev to attach, so
the inventory stores the driver's mdev uuid as the handle row's uuid.
"""

from __future__ import annotations

import dataclasses
import json

from sqlalchemy import select, update

from acceld.db import inventory
from acceld.db.models import attach_handles
from tests.support.sysfs_fixtures import SysfsTree
from tests.unit.test_driver_nvidia_gpu import driver

T4 = "0000:06:00.0"


def t4_records(tmp_path):
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci(T4, "0x10de", "0x1eb8", "0x030200", driver="nvidia")
    tree.add_mdev_type(T4, "nvidia-223", "GRID T4-2B", 8)
    return driver(tmp_path, tree, use_nvml=False, enabled_vgpu_types=["GRID T4-2B"]).discover()


def handle_rows(db):
    with db.read() as conn:
        return conn.execute(select(attach_handles.c.uuid, attach_handles.c.attach_info,
                                   attach_handles.c.in_use)
                            .order_by(attach_handles.c.id)).all()


def test_mdev_handle_uuid_is_the_mdev_uuid(db, tmp_path):
    records = t4_records(tmp_path)
    with db.write() as conn:
        inventory.reconcile_node(conn, "node1", records)
    rows = handle_rows(db)
    assert len(rows) == 8
    assert all(row.uuid == json.loads(row.attach_info)["uuid"] for row in rows)


def test_an_mdev_reported_with_other_info_keeps_its_row(db, tmp_path):
    """The handle's info changes (a new key) while its row is in use: the same mdev on the
    same parent is the same handle, so the row takes the new info in place (no second,
    free row for a vGPU in use; tests/db/test_mdev_handle_upgrade.py for the upgrade)."""
    records = t4_records(tmp_path)
    with db.write() as conn:
        inventory.reconcile_node(conn, "node1", records)
        conn.execute(update(attach_handles).values(in_use=True))
    before = handle_rows(db)
    dep = records[0].deployables[0]
    changed = [dataclasses.replace(h, attach_info={**h.attach_info, "note": "x"})
               for h in dep.attach_handles]
    records[0].deployables[0] = dataclasses.replace(dep, attach_handles=changed)
    with db.write() as conn:
        inventory.reconcile_node(conn, "node1", records)
    rows = handle_rows(db)
    assert [(row.uuid, row.in_use) for row in rows] == [(row.uuid, True) for row in before]
    assert all(json.loads(row.attach_info)["note"] == "x" for row in rows)


def test_a_taken_mdev_uuid_gets_a_fresh_one_instead_of_failing(db, tmp_path):
    """A deployable renamed while all its handles are in use: it is kept for them, and the
    new deployable's handles cannot take the uuids the kept rows hold; the reconcile still
    succeeds."""
    records = t4_records(tmp_path)
    with db.write() as conn:
        inventory.reconcile_node(conn, "node1", records)
        conn.execute(update(attach_handles).values(in_use=True))
    dep = records[0].deployables[0]
    records[0].deployables[0] = dataclasses.replace(dep, name=dep.name + "-renamed")
    with db.write() as conn:
        inventory.reconcile_node(conn, "node1", records)
    rows = handle_rows(db)
    assert len(rows) == 16 and len({row.uuid for row in rows}) == 16
    kept = [row for row in rows if row.in_use]
    assert len(kept) == 8
    assert all(row.uuid == json.loads(row.attach_info)["uuid"] for row in kept)
