"""Coalesced heartbeats (acceld.conductor.liveness): an unchanged hello writes nothing by
itself; one flush stamps every host heard, by the database's clock; anything that differs
from the remembered row, a row marked down or gone, goes the full way. Every backend."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import delete, select, update

from acceld.conductor.liveness import Liveness
from acceld.db import agents as agents_db
from acceld.db.clock import db_now
from acceld.db.models import agents

LONG_AGO = dt.datetime(2020, 1, 1)


def _register(db, hostname: str, digest: str = "d1", discovery: int | None = 3) -> None:
    with db.write() as conn:
        agents_db.record_heartbeat(conn, hostname, f"{hostname}:9000", 10)
        conn.execute(update(agents).where(agents.c.hostname == hostname).values(
            hardware_digest=digest, last_discovery=discovery))


def _row(db, hostname: str):  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return conn.execute(select(agents).where(agents.c.hostname == hostname)).first()


def _age(db, *hostnames: str) -> None:
    with db.write() as conn:
        conn.execute(update(agents).where(agents.c.hostname.in_(hostnames)).values(
            last_seen_at=LONG_AGO))


def _known(db, *hostnames: str) -> Liveness:
    """A Liveness that has learnt ``hostnames`` (a full hello each, then a flush)."""
    live = Liveness(db, 1.0)
    for host in hostnames:
        live.learn(host)
    live.flush()
    return live


def test_an_unchanged_hello_is_answered_from_memory_and_stamped_by_the_flush(db):
    _register(db, "n1")
    _register(db, "n2")
    live = _known(db, "n1", "n2")
    _age(db, "n1", "n2")
    assert live.unchanged("n1", "n1:9000", 10, "d1", 3)
    assert live.unchanged("n2", "n2:9000", 10, "d1", 3)
    assert _row(db, "n1").last_seen_at == LONG_AGO  # nothing written yet
    assert live.flush() == 2
    with db.read() as conn:
        now = db_now(conn)
    for host in ("n1", "n2"):
        row = _row(db, host)
        assert abs((now - row.last_seen_at).total_seconds()) < 5, row.last_seen_at
        assert row.state == "up"
    assert live.flush() == 0  # nobody heard since


def test_anything_that_differs_goes_the_full_way(db):
    _register(db, "n1")
    live = _known(db, "n1")
    assert not live.unchanged("n1", "n1:9001", 10, "d1", 3)   # another agent process
    assert not live.unchanged("n1", "n1:9000", 20, "d1", 3)   # another interval
    assert not live.unchanged("n1", "n1:9000", 10, "d2", 3)   # hardware changed
    assert not live.unchanged("n1", "n1:9000", 10, None, 3)   # no digest: always pulled
    assert not live.unchanged("n1", "n1:9000", 10, "d1", 4)   # a new discovery (health)
    assert not live.unchanged("n9", "n9:9000", 10, "d1", 3)   # never heard of
    assert live.unchanged("n1", "n1:9000", 10, "d1", 3)
    assert not Liveness(db, 0.0).unchanged("n1", "n1:9000", 10, "d1", 3)  # disabled


def test_a_row_changed_elsewhere_is_seen_at_the_next_flush(db):
    """Another conductor's pull cleared the digest (a vanished device is held): after the
    next flush of the host, its hello goes the full way (and pulls)."""
    _register(db, "n1")
    live = _known(db, "n1")
    with db.write() as conn:
        agents_db.set_digest(conn, "n1", None)
    assert live.unchanged("n1", "n1:9000", 10, "d1", 3)
    live.flush()
    assert not live.unchanged("n1", "n1:9000", 10, "d1", 3)


def test_a_host_marked_down_before_the_flush_is_brought_back_up(db, caplog):
    _register(db, "n1")
    live = _known(db, "n1")
    assert live.unchanged("n1", "n1:9000", 10, "d1", 3)
    row = _row(db, "n1")
    with db.write() as conn:  # the sweep got there first
        assert agents_db.mark_down(conn, row)
    caplog.set_level("INFO", logger="acceld.conductor.liveness")
    live.flush()
    assert _row(db, "n1").state == "up"
    assert "Agent of host n1 is back" in caplog.text
    assert not live.unchanged("n1", "n1:9000", 10, "d1", 3)  # relearnt by a full hello


def test_a_retired_host_is_forgotten(db):
    _register(db, "n1")
    live = _known(db, "n1")
    assert live.unchanged("n1", "n1:9000", 10, "d1", 3)
    with db.write() as conn:
        conn.execute(delete(agents).where(agents.c.hostname == "n1"))
    live.flush()
    assert _row(db, "n1") is None  # not re-created by a stamp
    assert not live.unchanged("n1", "n1:9000", 10, "d1", 3)


def test_a_full_hello_during_a_flush_keeps_the_older_row_out_of_memory(db, monkeypatch):
    """The flush read the row, then a full hello changed it before the flush stored what
    it read: the older row must not be remembered (its digest could skip a pull)."""
    _register(db, "n1")
    live = _known(db, "n1")
    live.unchanged("n1", "n1:9000", 10, "d1", 3)
    real_rows_of = agents_db.rows_of

    def rows_then_full_hello(conn, hosts):  # type: ignore[no-untyped-def]
        rows = real_rows_of(conn, hosts)
        live.learn("n1")  # a full hello of n1 completes here
        return rows

    monkeypatch.setattr(agents_db, "rows_of", rows_then_full_hello)
    live.flush()
    monkeypatch.setattr(agents_db, "rows_of", real_rows_of)
    assert not live.unchanged("n1", "n1:9000", 10, "d1", 3)
    live.flush()
    assert live.unchanged("n1", "n1:9000", 10, "d1", 3)


def test_a_database_outage_keeps_the_heard_hosts_for_the_next_flush(db, monkeypatch):
    _register(db, "n1")
    live = _known(db, "n1")
    _age(db, "n1")
    live.unchanged("n1", "n1:9000", 10, "d1", 3)

    def unreachable(conn, hosts):  # type: ignore[no-untyped-def]
        raise ConnectionError("database away")

    monkeypatch.setattr(agents_db, "touch_up", unreachable)
    try:
        live.flush()
    except ConnectionError:
        pass
    else:
        raise AssertionError("the flush hid the outage")
    monkeypatch.undo()
    assert live.flush() == 1
    assert _row(db, "n1").last_seen_at != LONG_AGO
