"""A conductor's flush brings a host marked down back up only for a hello it received
after the down mark (acceld.conductor.fleet.liveness, acceld.db.agents.bring_up): a conductor
that froze holding hellos heard before the agent died must not revive it. Every backend.
"""

from __future__ import annotations

import datetime as dt
import time

from sqlalchemy import insert, select, update

from acceld.conductor.fleet.liveness import Liveness
from acceld.db import agents as agents_db
from acceld.db.clock import db_now
from acceld.db.models import agents, handle_releases
from tests.support import inventory

HELLO = ("n1:9000", 10, "d1", 3)  # endpoint, interval, digest, discovery


def _register(db, hostname: str = "n1") -> None:
    with db.write() as conn:
        agents_db.record_heartbeat(conn, hostname, f"{hostname}:9000", 10)
        conn.execute(update(agents).where(agents.c.hostname == hostname).values(
            hardware_digest="d1", last_discovery=3))


def _row(db, hostname: str = "n1"):  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return conn.execute(select(agents).where(agents.c.hostname == hostname)).first()


def _known(db, *hostnames: str) -> Liveness:
    live = Liveness(db, 1.0)
    for host in hostnames:
        live.learn(host)
    live.flush()
    return live


def _peer_marks_down(db, hostname: str = "n1") -> dt.datetime:
    """A peer's sweep marks the host down; returns the mark's time (the database's clock)."""
    with db.write() as conn:
        assert agents_db.mark_down(conn, _row(db, hostname))
    mark = _row(db, hostname).updated_at
    with db.read() as conn:  # the mark's time is the database's "now", not some other clock
        assert abs((db_now(conn) - mark).total_seconds()) < 5
    return mark


def _clock_past(db, instant: dt.datetime) -> None:
    """Until the database's clock is clearly past ``instant``: the flush's estimate of a
    hello's time errs early by a read's latency (and SQLite's clock has whole ms)."""
    deadline = time.monotonic() + 5
    while True:
        with db.read() as conn:
            if db_now(conn) > instant + dt.timedelta(milliseconds=20):
                return
        assert time.monotonic() < deadline, "the database's clock stands still"


def test_a_hello_heard_before_the_down_mark_does_not_bring_the_host_back(db, caplog):
    _register(db)
    live = _known(db, "n1")
    assert live.unchanged("n1", *HELLO)  # conductor A hears the agent's last hello...
    with db.read() as conn:
        heard_by = db_now(conn)
    _clock_past(db, heard_by)  # ...A freezes; the agent dies; a peer marks the host down
    mark = _peer_marks_down(db)
    assert mark > heard_by
    caplog.set_level("INFO", logger="acceld.conductor.fleet.liveness")
    assert live.flush() == 1  # A resumes and flushes what it heard before the freeze
    row = _row(db)
    assert row.state == "down"
    assert row.updated_at == mark  # the mark stands as it was
    assert "is back" not in caplog.text


def test_a_hello_received_after_the_down_mark_brings_the_host_back(db, caplog):
    _register(db)
    live = _known(db, "n1")
    assert live.unchanged("n1", *HELLO)
    mark = _peer_marks_down(db)
    live.flush()
    assert _row(db).state == "down"
    with db.write() as conn:  # a release waiting out the agent's outage
        device = inventory.add_device(conn, hostname="n1")
        dep = inventory.add_deployable(conn, device["id"], name="dep")
        [handle] = inventory.add_attach_handles(conn, dep["id"], 1, in_use=True)
        conn.execute(insert(handle_releases).values(
            attach_handle_id=handle["id"], hostname="n1", driver_name="fake",
            lease_owner=None, lease_expires_at=dt.datetime(2999, 1, 1), attempts=3,
            created_at=dt.datetime(2020, 1, 1)))
    _clock_past(db, mark)
    # The agent is alive after all: its next hello, answered from memory, is after the mark.
    assert live.unchanged("n1", *HELLO)
    caplog.set_level("INFO", logger="acceld.conductor.fleet.liveness")
    live.flush()
    row = _row(db)
    assert row.state == "up" and row.last_seen_at > mark
    assert "Agent of host n1 is back" in caplog.text
    with db.read() as conn:
        assert conn.execute(select(handle_releases.c.lease_expires_at)).scalar_one() is None


def test_the_latest_hello_since_the_last_flush_decides(db):
    """Hellos before and after the mark, both waiting for one flush: the later counts."""
    _register(db)
    live = _known(db, "n1")
    assert live.unchanged("n1", *HELLO)
    mark = _peer_marks_down(db)
    _clock_past(db, mark)
    assert live.unchanged("n1", *HELLO)
    live.flush()
    assert _row(db).state == "up"


def test_of_hosts_flushed_together_only_those_heard_after_their_marks_come_back(db):
    for host in ("n1", "n2"):
        _register(db, host)
    live = _known(db, "n1", "n2")
    assert live.unchanged("n1", *HELLO)  # n1's last hello, before its mark
    marks = [_peer_marks_down(db, "n1"), _peer_marks_down(db, "n2")]
    _clock_past(db, max(marks))
    assert live.unchanged("n2", "n2:9000", 10, "d1", 3)  # n2 heard after its mark
    live.flush()
    assert (_row(db, "n1").state, _row(db, "n2").state) == ("down", "up")


def test_a_full_hello_counts_from_when_it_arrived(db):
    """A full hello that began before the mark (a long pull) and ended after it: the flush
    that follows judges it by its arrival."""
    _register(db)
    live = _known(db, "n1")
    arrived = time.monotonic()
    with db.read() as conn:
        heard_by = db_now(conn)
    _clock_past(db, heard_by)
    _peer_marks_down(db)
    live.learn("n1", arrived)
    live.flush()
    assert _row(db).state == "down"
