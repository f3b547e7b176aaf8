"""The liveness sweep judges an agent's silence only as far as the conductors have written
what they heard (acceld.conductor.fleet.liveness, acceld.db.conductors ``furthest_behind``).

A conductor answers unchanged hellos from memory and writes them at its next flush; a
conductor whose flushes run late (saturated, or a slow database) holds hellos the database
does not show yet. Before this, a peer's sweep marked those agents down although their
hellos were answered, and each of their next hellos took the full path: at 10,000 nodes
that fed on itself. The lag is forced here by moving each conductor's mark with the
database's own clock, on every backend.
"""

from __future__ import annotations

import pymysql
import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.exc import OperationalError

from acceld.conductor.fleet.agents import AgentsComponent
from acceld.db import agents as agents_db
from acceld.db.clock import sql_now
from acceld.db.models import agents, conductors

INTERVAL = 10  # the agents' heartbeat interval; marked down after 3 of them (30 s)


@pytest.fixture
def sweeper(conf, db) -> AgentsComponent:
    conf.set_override("agent_down_intervals", 3, group="conductor")
    conf.set_override("member_dead_after", 10.0, group="conductor")
    conf.set_override("member_heartbeat_interval", 2.0, group="conductor")
    conf.set_override("heartbeat_flush_interval", 1.0, group="conductor")
    return AgentsComponent(conf, db)  # owns every host


def conductor(db, name: str, beat_ago: float, heard_ago: float | None) -> None:
    """A conductor row: beating ``beat_ago`` s ago, its heartbeats written up to
    ``heard_ago`` s ago (None: it never flushed), by the database's clock."""
    values = {"heartbeat_at": sql_now(db.backend, -beat_ago),
              "heard_through": None if heard_ago is None else sql_now(db.backend, -heard_ago)}
    with db.write() as conn:
        if not conn.execute(update(conductors).where(conductors.c.name == name)
                            .values(**values)).rowcount:
            conn.execute(insert(conductors).values(
                name=name, url=None, started_at=sql_now(db.backend, -3600), **values))


def agent(db, hostname: str, silent_for: float) -> None:
    with db.write() as conn:
        agents_db.record_heartbeat(conn, hostname, f"{hostname}:9000", INTERVAL)
        conn.execute(update(agents).where(agents.c.hostname == hostname).values(
            last_seen_at=sql_now(db.backend, -silent_for)))


def states(db) -> dict[str, str]:
    with db.read() as conn:
        return {r.hostname: r.state for r in conn.execute(select(agents))}


def test_a_conductor_behind_on_its_writes_holds_the_judgment_back(db, sweeper):
    conductor(db, "current", beat_ago=0.5, heard_ago=0.5)
    conductor(db, "behind", beat_ago=0.5, heard_ago=40)  # beating, its flushes late
    agent(db, "heard-by-behind", silent_for=35)  # its hellos may sit in "behind"'s memory
    agent(db, "long-gone", silent_for=45)  # silent past the bound of the deferral
    sweeper.sweep()
    assert states(db) == {"heard-by-behind": "up", "long-gone": "down"}
    conductor(db, "behind", beat_ago=0.5, heard_ago=0.5)  # caught up: nothing written for it
    sweeper.sweep()
    assert states(db) == {"heard-by-behind": "down", "long-gone": "down"}


def test_a_dead_conductor_is_not_waited_for(db, sweeper):
    conductor(db, "current", beat_ago=0.5, heard_ago=0.5)
    conductor(db, "dead", beat_ago=60, heard_ago=60)
    agent(db, "silent", silent_for=35)
    sweeper.sweep()
    assert states(db) == {"silent": "down"}


def test_a_conductor_that_never_flushed_counts_from_its_heartbeat(db, sweeper):
    """No mark (it writes each hello in its own transaction, or has not flushed yet): its
    last heartbeat stands for it."""
    conductor(db, "unflushed", beat_ago=1, heard_ago=None)
    agent(db, "quiet", silent_for=29)
    agent(db, "silent", silent_for=35)
    sweeper.sweep()
    assert states(db) == {"quiet": "up", "silent": "down"}


def test_no_conductor_rows_judge_by_the_database_clock(db, sweeper):
    agent(db, "silent", silent_for=31)
    agent(db, "fine", silent_for=25)
    sweeper.sweep()
    assert states(db) == {"silent": "down", "fine": "up"}


def test_the_lag_is_logged_when_it_starts_and_when_it_ends(db, sweeper, caplog):
    caplog.set_level("INFO", logger="acceld.conductor.fleet.agents")
    conductor(db, "behind", beat_ago=0.5, heard_ago=20)
    sweeper.sweep()
    sweeper.sweep()
    conductor(db, "behind", beat_ago=0.5, heard_ago=1)
    sweeper.sweep()
    sweeper.sweep()
    lines = [r.getMessage() for r in caplog.records if "heartbeats" in r.getMessage()]
    assert len(lines) == 2, lines
    assert lines[0].startswith("Conductor behind has not written the heartbeats it heard for")
    assert caplog.records[0].levelname == "WARNING"
    assert lines[1].startswith("Conductor behind wrote its heartbeats again")


def test_a_sweep_chosen_as_a_deadlock_victim_marks_and_logs_once(db, sweeper, caplog,
                                                                   monkeypatch):
    """The marks lock agent rows a flush may lock too: a deadlock runs the marks again
    (in the flushes' host order) and the WARNING is logged for the kept marks only."""
    caplog.set_level("WARNING", logger="acceld.conductor.fleet.agents")
    agent(db, "b-silent", silent_for=40)
    agent(db, "a-silent", silent_for=40)
    real_mark_down = agents_db.mark_down
    order = []

    def deadlock_once(conn, row):  # type: ignore[no-untyped-def]
        order.append(row.hostname)
        if len(order) == 2:
            raise OperationalError("UPDATE agents", {}, pymysql.err.OperationalError(
                1213, "Deadlock found when trying to get lock; try restarting transaction"))
        return real_mark_down(conn, row)

    monkeypatch.setattr(agents_db, "mark_down", deadlock_once)
    sweeper.sweep()
    assert states(db) == {"a-silent": "down", "b-silent": "down"}
    assert order == ["a-silent", "b-silent", "a-silent", "b-silent"]
    downs = [r.getMessage() for r in caplog.records if " is down: " in r.getMessage()]
    assert len(downs) == 2, downs
