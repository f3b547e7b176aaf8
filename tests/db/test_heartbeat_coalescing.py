"""Coalesced heartbeats (acceld.conductor.fleet.liveness): an unchanged hello writes nothing by
itself; one flush stamps every host heard, by the database's clock; anything that differs
from the remembered row, a row marked down or gone, goes the full way. Every backend."""

from __future__ import annotations

import datetime as dt
import time

import pymysql
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import OperationalError

from acceld.conductor.fleet import liveness as liveness_module
from acceld.conductor.fleet.liveness import Liveness
from acceld.db import agents as agents_db
from acceld.db import conductors as conductors_db
from acceld.db.clock import db_now
from acceld.db.models import agents, conductors, handle_releases
from tests.conftest import count_queries
from tests.support import inventory

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


def _clock_past_marks(db) -> None:
    """Wait until the database's clock is clearly past every down mark: a conductor's
    estimate of when it heard a hello errs early by a read's latency (and SQLite's clock
    has whole milliseconds), so a hello taken a moment after a mark could count as before."""
    with db.read() as conn:
        marked = conn.execute(select(func.max(agents.c.updated_at))).scalar_one()
    deadline = time.monotonic() + 5
    while True:
        with db.read() as conn:
            if db_now(conn) > marked + dt.timedelta(milliseconds=20):
                return
        assert time.monotonic() < deadline, "the database's clock stands still"


def test_a_host_marked_down_before_the_flush_is_brought_back_up(db, caplog):
    _register(db, "n1")
    live = _known(db, "n1")
    row = _row(db, "n1")
    with db.write() as conn:  # the sweep got there first
        assert agents_db.mark_down(conn, row)
    _clock_past_marks(db)
    assert live.unchanged("n1", "n1:9000", 10, "d1", 3)  # heard after the mark
    caplog.set_level("INFO", logger="acceld.conductor.fleet.liveness")
    live.flush()
    assert _row(db, "n1").state == "up"
    assert "Agent of host n1 is back" in caplog.text
    # Remembered as up: its next hello is answered from memory, not the full path.
    assert live.unchanged("n1", "n1:9000", 10, "d1", 3)


def test_many_hosts_back_at_once_cost_a_few_statements_not_a_transaction_each(db):
    """A conductor that fell behind finds thousands marked down at its next flush: they
    come back in a bounded number of statements, waiting releases made due, and every one
    is answered from memory afterwards (each took the full path before)."""
    hosts = [f"n{i:03d}" for i in range(60)]
    for host in hosts:
        _register(db, host)
    live = _known(db, *hosts)
    with db.write() as conn:  # the sweep marked them all down
        for row in conn.execute(select(agents)).all():
            assert agents_db.mark_down(conn, row)
        device = inventory.add_device(conn, hostname=hosts[7])
        dep = inventory.add_deployable(conn, device["id"], name="dep")
        [handle] = inventory.add_attach_handles(conn, dep["id"], 1, in_use=True)
        conn.execute(insert(handle_releases).values(  # waits out the agent's outage
            attach_handle_id=handle["id"], hostname=hosts[7], driver_name="fake",
            lease_owner=None, lease_expires_at=dt.datetime(2999, 1, 1), attempts=3,
            created_at=LONG_AGO))
    _clock_past_marks(db)
    for host in hosts:  # heard again after the marks
        assert live.unchanged(host, f"{host}:9000", 10, "d1", 3)
    with count_queries(db) as statements:
        assert live.flush() == len(hosts)
    assert len(statements) <= 6, statements  # stamp, read, bring up, releases due
    with db.read() as conn:
        states = {r.hostname: r.state for r in conn.execute(select(agents))}
        waiting = conn.execute(select(handle_releases.c.lease_expires_at)).scalar_one()
    assert set(states.values()) == {"up"}
    assert waiting is None  # due now: the agent is back
    assert all(live.unchanged(h, f"{h}:9000", 10, "d1", 3) for h in hosts)


def test_the_memory_outlives_a_few_missed_heartbeats(db, monkeypatch):
    """A conductor behind on its hellos (spaced wider than their interval) still answers
    them from memory, so falling behind does not send every hello down the full path; a
    host silent past the trusted span goes the full way."""
    _register(db, "n1")
    live = Liveness(db, 1.0, trust_intervals=6.0)
    live.learn("n1")
    live.flush()
    clock = [time.monotonic()]
    monkeypatch.setattr(liveness_module.time, "monotonic", lambda: clock[0])
    clock[0] += 4 * 10  # four missed heartbeats of 10 s
    assert live.unchanged("n1", "n1:9000", 10, "d1", 3)
    live.flush()  # read again: trusted from now
    clock[0] += 6 * 10 + 1
    assert not live.unchanged("n1", "n1:9000", 10, "d1", 3)


def test_each_flush_marks_its_conductor_current_before_taking_the_hosts(db, monkeypatch):
    """heard_through never runs ahead of what was written: a hello heard just after the
    mark is in the same flush, not left for the next one under a newer mark."""
    with db.write() as conn:
        conn.execute(insert(conductors).values(name="c1", url=None,
                                               started_at=LONG_AGO, heartbeat_at=LONG_AGO))
    _register(db, "n1")
    _register(db, "n2")
    live = _known(db, "n1", "n2")
    live.member = "c1"
    _age(db, "n1", "n2")
    live.unchanged("n1", "n1:9000", 10, "d1", 3)
    real_record_heard = conductors_db.record_heard

    def mark_then_hello(conn, name):  # type: ignore[no-untyped-def]
        real_record_heard(conn, name)
        live.unchanged("n2", "n2:9000", 10, "d1", 3)  # read by the server right after

    monkeypatch.setattr(conductors_db, "record_heard", mark_then_hello)
    assert live.flush() == 2
    with db.read() as conn:
        mark = conn.execute(select(conductors.c.heard_through)).scalar_one()
    assert mark is not None and mark > LONG_AGO
    for host in ("n1", "n2"):
        assert _row(db, host).last_seen_at >= mark
    monkeypatch.undo()
    with db.write() as conn:
        conn.execute(update(conductors).values(heard_through=LONG_AGO))
    assert live.flush() == 0  # nothing heard since; the mark still moves
    with db.read() as conn:
        assert conn.execute(select(conductors.c.heard_through)).scalar_one() > LONG_AGO


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


def test_a_flush_chosen_as_a_deadlock_victim_runs_again_with_the_same_hosts(db, monkeypatch):
    """Two conductors' flushes (or a flush and a sweep) lock agent rows in one statement
    each; the database may roll one back to break a deadlock: it runs again at once, with
    every host it had taken, and no traceback."""
    _register(db, "n1")
    live = _known(db, "n1")
    _age(db, "n1")
    live.unchanged("n1", "n1:9000", 10, "d1", 3)
    real_touch_up = agents_db.touch_up
    calls = []

    def deadlock_once(conn, hosts):  # type: ignore[no-untyped-def]
        calls.append(list(hosts))
        if len(calls) == 1:
            raise OperationalError("UPDATE agents", {}, pymysql.err.OperationalError(
                1213, "Deadlock found when trying to get lock; try restarting transaction"))
        return real_touch_up(conn, hosts)

    monkeypatch.setattr(agents_db, "touch_up", deadlock_once)
    assert live.flush() == 1
    assert calls == [["n1"], ["n1"]]
    assert _row(db, "n1").last_seen_at != LONG_AGO


def test_a_host_this_conductor_never_heard_is_recalled_with_one_read(db):
    """After a peer died its agents hello here: a row that repeats the hello is read, not
    locked and written, and the host is remembered and stamped at the next flush."""
    _register(db, "n1")
    _age(db, "n1")
    live = Liveness(db, 1.0)  # a conductor that never heard n1
    assert not live.unchanged("n1", "n1:9000", 10, "d1", 3)
    with count_queries(db) as statements:
        assert live.recall("n1", "n1:9000", 10, "d1", 3)
    assert statements and all(s.lstrip().upper().startswith("SELECT") for s in statements)
    assert live.unchanged("n1", "n1:9000", 10, "d1", 3)  # remembered
    assert live.flush() == 1
    assert _row(db, "n1").last_seen_at != LONG_AGO


def test_a_row_that_differs_is_not_recalled(db):
    _register(db, "n1")
    live = Liveness(db, 1.0)
    assert not live.recall("n1", "n1:9001", 10, "d1", 3)  # another agent process
    assert not live.recall("n1", "n1:9000", 20, "d1", 3)  # another interval
    assert not live.recall("n1", "n1:9000", 10, "d2", 3)  # hardware changed: pull
    assert not live.recall("n1", "n1:9000", 10, None, 3)  # no digest: always pulled
    assert not live.recall("n1", "n1:9000", 10, "d1", 4)  # a new discovery (health)
    assert not live.recall("n9", "n9:9000", 10, "d1", 3)  # never registered
    with db.write() as conn:
        assert agents_db.mark_down(conn, _row(db, "n1"))
    assert not live.recall("n1", "n1:9000", 10, "d1", 3)  # down: the full path brings it up
    assert not Liveness(db, 0.0).recall("n1", "n1:9000", 10, "d1", 3)  # disabled
    assert live.flush() == 0  # nothing was noted as heard


def test_a_full_hello_during_a_recall_keeps_the_read_row_out_of_memory(db, monkeypatch):
    _register(db, "n1")
    live = Liveness(db, 1.0)
    real_get_agent = agents_db.get_agent

    def read_then_full_hello(conn, hostname):  # type: ignore[no-untyped-def]
        row = real_get_agent(conn, hostname)
        live.learn("n1")  # a full hello of n1 (a new digest, say) completes here
        return row

    monkeypatch.setattr(agents_db, "get_agent", read_then_full_hello)
    assert not live.recall("n1", "n1:9000", 10, "d1", 3)
    monkeypatch.undo()
    assert not live.unchanged("n1", "n1:9000", 10, "d1", 3)  # read again at the flush
