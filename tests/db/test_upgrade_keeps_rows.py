"""Upgrades never lose rows (issue 24): a database made at the first revision and filled
as an installation fills it is upgraded one revision at a time to head, on SQLite,
PostgreSQL and MariaDB, and after every step each row of each table is still there with
its earlier columns unchanged.

0005 once rebuilt ``devices`` on SQLite (a batch migration) with foreign keys on: the
DROP TABLE cascaded through control paths, deployables, attributes, attach handles and
queued releases, and Bound ARQs lost their handle. The revisions come from alembic's
script directory, so a migration added later is covered without touching this test;
a table it adds gets rows (realistic ones where this file knows the table, typed ones
otherwise) and a column it adds gets a value in every row before the next step.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid as uuidlib
from typing import Any, Iterator

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, MetaData, Table, insert, select, update

from acceld.db import migrate
from acceld.db.engine import Database
from tests.conftest import BACKENDS
from tests.support.databases import create_server_database, drop_server_database

T0 = dt.datetime(2026, 11, 30, 12, 0, 0, 123456)


def revisions() -> list[str]:
    """Every revision, oldest first (the history is one line)."""
    script = ScriptDirectory.from_config(migrate.alembic_config())
    assert len(script.get_heads()) == 1, "the migrations branch: merge them first"
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


@pytest.fixture(params=BACKENDS)
def empty_db(request, tmp_path) -> Iterator[Database]:  # type: ignore[no-untyped-def]
    """An empty database of its own (no revision yet) on each backend."""
    backend = request.param
    if backend == "sqlite":
        db = Database(f"sqlite:///{os.path.join(str(tmp_path), 'upgrade.sqlite')}")
        yield db
        db.dispose()
        return
    url = create_server_database(backend, migrated=False)
    db = Database(url)
    try:
        yield db
    finally:
        db.dispose()
        drop_server_database(backend, url)


def _tables(conn: Connection) -> dict[str, Table]:
    meta = MetaData()
    meta.reflect(conn)
    return {name: t for name, t in meta.tables.items() if name != "alembic_version"}


Snapshot = dict[str, dict[tuple, dict[str, Any]]]


def snapshot(db: Database) -> Snapshot:
    """Every row of every table, by primary key."""
    out: Snapshot = {}
    with db.read() as conn:
        for name, table in _tables(conn).items():
            keys = [c.name for c in table.primary_key.columns]
            assert keys, f"{name} has no primary key: rows cannot be followed"
            out[name] = {tuple(r[k] for k in keys): dict(r)
                         for r in conn.execute(select(table)).mappings()}
    return out


def assert_kept(before: Snapshot, after: Snapshot, revision: str) -> None:
    lost = {name: sorted(set(rows) - set(after.get(name, {})))
            for name, rows in before.items()}
    lost = {name: keys for name, keys in lost.items() if keys}
    assert not lost, f"upgrading to {revision} lost rows (table: primary keys): {lost}"
    for name, rows in before.items():
        for key, row in rows.items():
            now = after[name][key]
            changed = {c: (v, now.get(c, "(column gone)")) for c, v in row.items()
                       if now.get(c, object()) != v}
            assert not changed, (f"upgrading to {revision} changed {name} row {key} "
                                 f"(column: before, after): {changed}")


# --- rows as an installation at the first revision has them --------------------------

def _u(n: int) -> str:
    return str(uuidlib.UUID(int=n))


def fill_first(conn: Connection) -> None:
    """Two hosts with inventory: a GPU whose handle a running instance holds (Bound, its
    Nova event sent), an FPGA with a region whose mdev-style handle waits for its queued
    release after an unbind, a free handle and one held by a Bound ARQ whose Nova event is
    still to send, a bind still pending, an ARQ not yet bound; profiles, leases, Placement
    sync state, agents."""
    t = _tables(conn)
    rows: dict[str, list[dict[str, Any]]] = {
        "agents": [
            dict(id=1, hostname="node1", endpoint="10.0.0.21:6668", state="up",
                 hardware_digest="a" * 64, heartbeat_interval=10, last_seen_at=T0,
                 created_at=T0, updated_at=T0),
            dict(id=2, hostname="node2", endpoint="10.0.0.22:6668", state="down",
                 hardware_digest="b" * 64, heartbeat_interval=10, last_seen_at=T0,
                 created_at=T0, updated_at=None),
        ],
        "device_profiles": [
            dict(id=1, uuid=_u(101), name="gpu-small", description="one GPU",
                 profile_json='{"groups": [{"resources:PGPU": "1"}]}', created_at=T0,
                 updated_at=None),
            dict(id=2, uuid=_u(102), name="fpga-region", description=None,
                 profile_json='{"groups": [{"resources:FPGA": "1"}]}', created_at=T0,
                 updated_at=T0),
        ],
        "devices": [
            dict(id=1, uuid=_u(201), type="GPU", vendor="10de", model="A100",
                 std_board_info='{"product_id": "20b0"}', vendor_board_info=None,
                 hostname="node1", status="enabled", status_reason=None,
                 acc_status="ready", vanished=False, created_at=T0, updated_at=T0),
            dict(id=2, uuid=_u(202), type="FPGA", vendor="8086", model="PAC",
                 std_board_info='{"product_id": "09c4"}', vendor_board_info="{}",
                 hostname="node2", status="maintaining", status_reason="operator",
                 acc_status="ready", vanished=False, created_at=T0, updated_at=None),
        ],
        "controlpath_ids": [
            dict(id=1, uuid=_u(301), device_id=1, cpid_type="PCI",
                 cpid_info='{"domain": "0000", "bus": "af", "device": "00", "function": "0"}',
                 created_at=T0, updated_at=None),
            dict(id=2, uuid=_u(302), device_id=2, cpid_type="PCI",
                 cpid_info='{"domain": "0000", "bus": "3b", "device": "00", "function": "0"}',
                 created_at=T0, updated_at=None),
        ],
        "deployables": [
            dict(id=1, uuid=_u(401), parent_id=None, root_id=None, name="node1_gpu0",
                 num_accelerators=1, device_id=1, driver_name="nvidia_gpu",
                 rp_uuid=_u(451), bitstream_id=None, created_at=T0, updated_at=None),
            dict(id=2, uuid=_u(402), parent_id=None, root_id=None, name="node2_fpga0",
                 num_accelerators=2, device_id=2, driver_name="intel_fpga",
                 rp_uuid=_u(452), bitstream_id=_u(499), created_at=T0, updated_at=T0),
            dict(id=3, uuid=_u(403), parent_id=2, root_id=2, name="node2_fpga0_region1",
                 num_accelerators=1, device_id=2, driver_name="intel_fpga",
                 rp_uuid=_u(453), bitstream_id=None, created_at=T0, updated_at=None),
        ],
        "attributes": [
            dict(id=1, uuid=_u(501), deployable_id=1, key="rc", value="PGPU",
                 operator_owned=False, created_at=T0, updated_at=None),
            dict(id=2, uuid=_u(502), deployable_id=1, key="trait0",
                 value="CUSTOM_GPU_A100", operator_owned=True, created_at=T0,
                 updated_at=None),
            dict(id=3, uuid=_u(503), deployable_id=2, key="rc", value="FPGA",
                 operator_owned=False, created_at=T0, updated_at=None),
            dict(id=4, uuid=_u(504), deployable_id=3, key="rc", value="FPGA",
                 operator_owned=False, created_at=T0, updated_at=None),
        ],
        "attach_handles": [
            dict(id=1, uuid=_u(601), deployable_id=1, cpid_id=1, attach_type="PCI",
                 attach_info='{"domain": "0000", "bus": "af", "device": "00", '
                             '"function": "0"}', in_use=True, created_at=T0, updated_at=T0),
            dict(id=2, uuid=_u(602), deployable_id=3, cpid_id=2, attach_type="MDEV",
                 attach_info='{"mdev_uuid": "' + _u(699) + '"}', in_use=True,
                 created_at=T0, updated_at=T0),
            dict(id=3, uuid=_u(603), deployable_id=2, cpid_id=2, attach_type="PCI",
                 attach_info='{"domain": "0000", "bus": "3b", "device": "00", '
                             '"function": "1"}', in_use=False, created_at=T0,
                 updated_at=None),
            dict(id=4, uuid=_u(604), deployable_id=2, cpid_id=None, attach_type="PCI",
                 attach_info='{"domain": "0000", "bus": "3b", "device": "00", '
                             '"function": "2"}', in_use=True, created_at=T0, updated_at=T0),
        ],
        "accelerator_requests": [
            dict(id=1, uuid=_u(701), state="Bound", device_profile_id=1,
                 device_profile_group_id=0, project_id="p1", hostname="node1",
                 device_rp_uuid=_u(451), instance_uuid=_u(801), attach_handle_id=1,
                 deployable_id=1, bind_failure_reason=None, created_at=T0, updated_at=T0),
            dict(id=2, uuid=_u(702), state="Unbound", device_profile_id=2,
                 device_profile_group_id=0, project_id="p1", hostname=None,
                 device_rp_uuid=None, instance_uuid=None, attach_handle_id=None,
                 deployable_id=None, bind_failure_reason=None, created_at=T0,
                 updated_at=T0),
            dict(id=3, uuid=_u(703), state="BindStarted", device_profile_id=2,
                 device_profile_group_id=0, project_id="p2", hostname="node2",
                 device_rp_uuid=_u(452), instance_uuid=_u(802), attach_handle_id=None,
                 deployable_id=None, bind_failure_reason=None, created_at=T0,
                 updated_at=T0),
            dict(id=4, uuid=_u(704), state="Initial", device_profile_id=1,
                 device_profile_group_id=0, project_id="p2", hostname=None,
                 device_rp_uuid=None, instance_uuid=None, attach_handle_id=None,
                 deployable_id=None, bind_failure_reason=None, created_at=T0,
                 updated_at=None),
            dict(id=5, uuid=_u(705), state="Bound", device_profile_id=2,
                 device_profile_group_id=0, project_id="p2", hostname="node2",
                 device_rp_uuid=_u(452), instance_uuid=_u(803), attach_handle_id=4,
                 deployable_id=2, bind_failure_reason=None, created_at=T0, updated_at=T0),
            dict(id=6, uuid=_u(706), state="BindFailed", device_profile_id=1,
                 device_profile_group_id=0, project_id="p1", hostname="node1",
                 device_rp_uuid=_u(451), instance_uuid=_u(804), attach_handle_id=None,
                 deployable_id=None, bind_failure_reason="no free attach handle",
                 created_at=T0, updated_at=T0),
        ],
        "bind_jobs": [
            dict(id=1, arq_id=3, instance_uuid=_u(802), phase="pending",
                 lease_owner="cond-a:17", lease_expires_at=T0, attempts=1, created_at=T0,
                 updated_at=T0),
            dict(id=2, arq_id=5, instance_uuid=_u(803), phase="notify", lease_owner=None,
                 lease_expires_at=None, attempts=0, created_at=T0, updated_at=None),
        ],
        "handle_releases": [
            dict(id=1, attach_handle_id=2, hostname="node2", driver_name="intel_fpga",
                 lease_owner=None, lease_expires_at=None, attempts=2,
                 last_error="agent on node2 unreachable", created_at=T0, updated_at=T0),
        ],
        "leases": [
            dict(name="liveness", owner="cond-a", expires_at=T0),
            dict(name="reconcile", owner="cond-b", expires_at=T0),
        ],
        "placement_sync": [
            dict(rp_uuid=_u(451), hostname="node1", digest="c" * 64, dirty=False,
                 generation=4, updated_at=T0),
            dict(rp_uuid=_u(452), hostname="node2", digest=None, dirty=True,
                 generation=None, updated_at=None),
            dict(rp_uuid=_u(453), hostname="node2", digest="d" * 64, dirty=False,
                 generation=12, updated_at=T0),
        ],
    }
    missing = set(t) - set(rows)
    assert not missing, f"the first revision has tables this test fills with no rows: {missing}"
    for name in [n for n in _ORDER if n in rows]:
        conn.execute(insert(t[name]), rows[name])


_ORDER = ("agents", "device_profiles", "devices", "controlpath_ids", "deployables",
          "attributes", "attach_handles", "accelerator_requests", "bind_jobs",
          "handle_releases", "leases", "placement_sync")


# --- rows for what later revisions add -------------------------------------------------

def _known_rows(name: str) -> list[dict[str, Any]] | None:
    """Realistic rows for a table a later revision created, where this file knows it."""
    return {
        "internal_nonces": [dict(nonce="n" * 64, expires_at=T0),
                            dict(nonce="m" * 40, expires_at=T0)],
        "device_events": [
            dict(id=1, uuid=_u(901), device_uuid=_u(201), hostname="node1", created_at=T0,
                 kind="health", detail='{"health": "ok"}', actor=None),
            dict(id=2, uuid=_u(902), device_uuid=_u(202), hostname="node2", created_at=T0,
                 kind="disabled", detail=None, actor="admin"),
        ],
        "conductors": [dict(name="cond-a", url="http://10.0.0.11:6667", started_at=T0,
                            heartbeat_at=T0),
                       dict(name="cond-b", url=None, started_at=T0, heartbeat_at=T0)],
    }.get(name)


def _value(column: Any, n: int, tag: str) -> Any:
    """A value of the column's type, different for each ``n``."""
    kind = column.type.python_type
    if kind is bool:
        return n % 2 == 0
    if kind is int:
        return 7 + n
    if kind is dt.datetime:
        return T0 + dt.timedelta(seconds=n)
    if kind is str:
        text = f"{tag}-{n}"
        length = getattr(column.type, "length", None)
        return text[-length:] if length else text
    raise AssertionError(f"no test value for {column.table.name}.{column.name} ({kind}): "
                         "teach tests/db/test_upgrade_keeps_rows.py its type")


def _typed_rows(conn: Connection, table: Table, tag: str) -> list[dict[str, Any]]:
    """Two rows for a table this file does not know: each column a value of its type, a
    foreign key the first row of the table it refers to (which this test has filled)."""
    out = []
    for n in (1, 2):
        row: dict[str, Any] = {}
        for column in table.columns:
            if (column.primary_key and len(table.primary_key.columns) == 1
                    and column.type.python_type is int):
                continue  # the database numbers it
            fks = list(column.foreign_keys)
            if fks:
                target = fks[0].column
                row[column.name] = conn.execute(
                    select(target).order_by(target).limit(1)).scalar_one()
            else:
                row[column.name] = _value(column, n, tag)
        out.append(row)
    return out


def fill_new(conn: Connection, before: Snapshot, revision: str) -> None:
    """Rows for each table ``revision`` created; a value in each row for each column it
    added to a table that had rows (a nullable or defaulted column would otherwise be
    compared as NULL or its default only)."""
    tag = revision.split("_")[0]
    for name, table in _tables(conn).items():
        if name not in before:
            rows = _known_rows(name) or _typed_rows(conn, table, tag)
            conn.execute(insert(table), rows)
            continue
        if not before[name]:
            continue
        old = set(next(iter(before[name].values())))
        added = [c for c in table.columns if c.name not in old and not c.foreign_keys]
        keys = list(table.primary_key.columns)
        for n, key in enumerate(sorted(before[name]), start=1):
            if added:
                conn.execute(update(table).where(*[k == v for k, v in zip(keys, key)])
                             .values({c.name: _value(c, n, tag) for c in added}))


def test_every_revision_keeps_every_row(empty_db: Database) -> None:
    db = empty_db
    first, *later = revisions()
    assert later, "one revision only: nothing to upgrade"
    migrate.upgrade(db, first)
    with db.write() as conn:
        fill_first(conn)
    before = snapshot(db)
    assert all(before.values()), {n: len(r) for n, r in before.items()}
    for revision in later:
        migrate.upgrade(db, revision)
        assert migrate.current_revision(db) == revision
        assert_kept(before, snapshot(db), revision)
        with db.write() as conn:
            fill_new(conn, before, revision)
        before = snapshot(db)
        empty = [name for name, rows in before.items() if not rows]
        assert not empty, f"tables without rows after {revision}: {empty}"
    assert migrate.current_revision(db) == migrate.head_revision()


def test_deployables_from_before_0016_are_untold(empty_db: Database) -> None:
    """Issue 37 item 8: a row from before migration 0016 may follow an earlier row of the
    same device (its host re-registered), so the agent has not been told its token: NULL,
    and the first bind of each of its PCI handles tells it once. Tokens are kept."""
    db = empty_db
    migrate.upgrade(db, revisions()[0])
    with db.write() as conn:
        fill_first(conn)
    migrate.upgrade(db, "0015_project_locks")
    with db.write() as conn:
        t = _tables(conn)["deployables"]
        conn.execute(update(t).where(t.c.id == 2).values(fence_token=5))
    migrate.upgrade(db, "head")
    with db.read() as conn:
        t = _tables(conn)["deployables"]
        rows = conn.execute(select(t.c.id, t.c.fence_token, t.c.fence_told).order_by(
            t.c.id)).tuples().all()
    assert rows == [(1, 0, None), (2, 5, None), (3, 0, None)]
