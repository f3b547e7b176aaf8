"""Which agents the liveness sweep finds late (acceld.db.agents.overdue): the database
compares each row's last contact with its own heartbeat interval, by its own clock, and
returns only the late ones. Every backend."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import update

from acceld.db import agents as agents_db
from acceld.db.clock import db_now
from acceld.db.models import agents


def _agent(db, hostname: str, interval: int, silent_for: float, state: str = "up") -> None:
    """An agent heartbeating every ``interval`` s, last heard ``silent_for`` s ago by the
    database's clock."""
    with db.write() as conn:
        agents_db.record_heartbeat(conn, hostname, f"{hostname}:9000", interval)
        seen = db_now(conn) - dt.timedelta(seconds=silent_for)
        conn.execute(update(agents).where(agents.c.hostname == hostname).values(
            last_seen_at=seen, state=state))


def test_late_means_silent_for_more_than_its_own_intervals(db):
    _agent(db, "fast-late", interval=10, silent_for=40)       # 40 s > 3 x 10 s
    _agent(db, "slow-fine", interval=100, silent_for=40)      # 40 s < 3 x 100 s
    _agent(db, "fast-fine", interval=10, silent_for=20)       # 20 s < 3 x 10 s
    _agent(db, "slow-late", interval=100, silent_for=400)     # 400 s > 3 x 100 s
    _agent(db, "down-already", interval=10, silent_for=400, state="down")
    with db.read() as conn:
        late = agents_db.overdue(conn, 3)
    assert sorted(row.hostname for row in late) == ["fast-late", "slow-late"]
    by_name = {row.hostname: row for row in late}
    # What the sweep needs to mark one down (compare-and-set) and to log it.
    silence = (by_name["fast-late"].db_now - by_name["fast-late"].last_seen_at).total_seconds()
    assert 39 < silence < 60, silence
    assert by_name["slow-late"].heartbeat_interval == 100
    with db.write() as conn:
        assert agents_db.mark_down(conn, by_name["fast-late"])


def test_down_intervals_scale_the_limit(db):
    _agent(db, "n1", interval=10, silent_for=40)
    with db.read() as conn:
        assert [r.hostname for r in agents_db.overdue(conn, 3)] == ["n1"]
        assert agents_db.overdue(conn, 5) == []  # 40 s < 5 x 10 s
