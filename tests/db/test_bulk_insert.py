"""acceld.db.bulk.insert_rows writes what SQLAlchemy's INSERT writes, on every backend
(COPY on PostgreSQL), inside the caller's transaction, with SQLAlchemy's errors."""

from __future__ import annotations

import uuid as uuidlib

import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from acceld.db import bulk
from acceld.db.models import attach_handles, deployables, devices

AWKWARD = 'tab\there, new\nline, back\\slash, "quote", \'single\', NUL-free \u00e9\u4e2d'


def _deployable(db) -> int:
    with db.write() as conn:
        device = conn.execute(insert(devices).values(
            uuid=str(uuidlib.uuid4()), type="FPGA", vendor="v", model="m", hostname="h",
            status="enabled", acc_status="ready", vanished=False)).inserted_primary_key[0]
        return conn.execute(insert(deployables).values(
            uuid=str(uuidlib.uuid4()), name="h_d", num_accelerators=1, device_id=device,
            driver_name="fake")).inserted_primary_key[0]


def _rows(dep: int, tag: str) -> list[dict]:
    return [{"uuid": str(uuidlib.uuid4()), "deployable_id": dep, "attach_type": "TEST_PCI",
             "attach_info": f"{tag} {i} {AWKWARD}", "in_use": i % 2 == 0} for i in range(3)]


def _columns(row) -> tuple:
    # Everything but the id and the creation time, which differ between the two writes.
    return (row.deployable_id, row.cpid_id, row.attach_type, row.attach_info.split(" ", 1)[1],
            row.in_use, row.fence_token, row.updated_at)


def test_rows_as_an_insert_writes_them(db):
    dep = _deployable(db)
    copied, inserted = _rows(dep, "copy"), _rows(dep, "insert")
    with db.write() as conn:
        bulk.insert_rows(conn, attach_handles, copied)
        conn.execute(insert(attach_handles), inserted)
        bulk.insert_rows(conn, attach_handles, [])
    with db.read() as conn:
        rows = {r.uuid: r for r in conn.execute(select(attach_handles))}
    assert len(rows) == 6
    for mine, theirs in zip(copied, inserted):
        a, b = rows[mine["uuid"]], rows[theirs["uuid"]]
        assert a.attach_info == f"copy {a.attach_info.split(' ', 2)[1]} {AWKWARD}"
        assert _columns(a) == _columns(b)
        assert a.created_at is not None and abs((a.created_at - b.created_at).total_seconds()) < 60


def test_a_violation_is_sqlalchemys_and_nothing_is_kept(db):
    dep = _deployable(db)
    rows = _rows(dep, "dup")
    rows[2]["uuid"] = rows[0]["uuid"]
    with pytest.raises(IntegrityError):
        with db.write() as conn:
            conn.execute(insert(attach_handles), [dict(rows[1], uuid=str(uuidlib.uuid4()))])
            bulk.insert_rows(conn, attach_handles, rows)
    with db.read() as conn:
        assert conn.execute(select(attach_handles)).all() == []
