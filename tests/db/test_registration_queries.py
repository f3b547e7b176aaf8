"""A new node's first report costs a bounded number of statements (acceld.conductor.reconcile).

The statements that once ran per new device and are now one per node: the check for a
returning device's event history, and the health rules' lock and re-read of a device
this same transaction inserted. The count grows with the devices only by the INSERTs.
"""

from __future__ import annotations

from sqlalchemy import func, select

from acceld.conductor.reconcile import apply_report
from acceld.db.models import device_events, devices
from acceld.drivers.fake import TYPES, FakeDriver
from tests.conftest import count_queries, make_conf

HOST = "node-new"


def _report(tmp_path, health: dict | None) -> dict:
    conf = make_conf(str(tmp_path))
    conf.set_override("devices", list(TYPES) + list(TYPES)[:2], group="fake_driver")
    records = [r.to_dict() for r in FakeDriver(conf, HOST).discover()]
    for record in records:
        if health is not None:
            record["health"] = health
    return {"hardware": records, "digest": "d1"}


def _selects(statements: list[str]) -> list[str]:
    return [s for s in statements if s.lstrip().upper().startswith("SELECT")]


def test_new_node_selects_do_not_grow_with_its_devices(db, tmp_path):
    report = _report(tmp_path, None)
    assert len(report["hardware"]) == 8
    with count_queries(db) as statements:
        outcome = apply_report(db, HOST, report)
    assert outcome.changes.added > 8 and not outcome.problems
    # agent lock, 5 node reads, taken uuids, taken names, event history: none per device.
    assert len(_selects(statements)) <= 10, _selects(statements)
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(devices)).scalar_one() == 8


def test_new_node_health_applied_without_relocking_its_rows(db, tmp_path):
    report = _report(tmp_path, {"state": "unhealthy", "reason": "ECC errors"})
    with count_queries(db) as statements:
        apply_report(db, HOST, report)
    assert len(_selects(statements)) <= 10 + 8, _selects(statements)  # + providers to flag
    with db.read() as conn:
        rows = conn.execute(select(devices.c.health, devices.c.health_reason,
                                   devices.c.quarantined)).all()
        kinds = conn.execute(select(device_events.c.kind)).scalars().all()
    assert rows and all(tuple(r) == ("unhealthy", "ECC errors", True) for r in rows)
    assert len(kinds) == 16  # a health change and a quarantine per device, as before


def test_a_known_node_is_read_by_id_lists_not_subqueries(db, tmp_path):
    """A report of a node already in the inventory reads its rows in five statements, each
    naming the ids the one before found: a subquery's plan followed PostgreSQL's table
    statistics, which were stale after a bulk registration (autovacuum had not analysed
    the grown tables), and it scanned every node's rows: 15 ms a statement at 10,000
    nodes (docs/performance.md). An id list is an index lookup whatever they say."""
    report = _report(tmp_path, None)
    apply_report(db, HOST, report)
    report["digest"] = "d2"
    with count_queries(db) as statements:
        apply_report(db, HOST, report)
    reads = [s for s in _selects(statements) if "FROM devices" in s
             or "FROM controlpath_ids" in s or "FROM deployables" in s
             or "FROM attributes" in s or "FROM attach_handles" in s]
    assert len(reads) >= 5, reads
    nested = [s for s in reads if "(SELECT" in s.upper().replace("( SELECT", "(SELECT")]
    assert not nested, nested
