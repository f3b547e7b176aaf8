"""Claims, deadlines and liveness are judged by the database's clock (issue 11 item 10).

Each conductor's own clock (``tests.support.clock.skew``: ten minutes ahead or
behind; the database server's clock stays right) decides nothing: a bind job's
or a handle release's claim another conductor holds stays its own, a claim, a
renewal or a retry delay lasts what it asked for (no claim already over, none
kept ten minutes too long), a bind waiting out an outage fails at
``[conductor] bind_timeout`` after it was asked for, no sooner and no later,
an agent is marked down after ``agent_down_intervals`` silent heartbeat
intervals, neither while it heartbeats nor ten minutes late, and a program is
failed as abandoned only once no live program could still be running. Every
backend.
"""

from __future__ import annotations

import argparse
import datetime as dt

import pytest
from sqlalchemy import insert, select, update

from acceld.conductor.fleet.agents import AgentsComponent
from acceld.conductor.binding.worker import BindWorker
from acceld.conductor.placement.checks import BindPlacementCheck
from acceld.conductor.programming import ProgrammingComponent
from acceld.db import agents as agents_db
from acceld.db import bind_jobs as jobs_db
from acceld.db import deployables as dep_db
from acceld.db import handle_releases as releases_db
from acceld.db.clock import db_now
from acceld.db.models import accelerator_requests, bind_jobs, deployables, handle_releases
from tests.conftest import make_conf
from tests.support import inventory
from tests.support.binds import FlakyPlacement, RecordingNotifier, arq_state, request_binds
from tests.support.clock import MINUTES_10, skew

HOST = "clock-node"
SKEWS = pytest.mark.parametrize("offset", [MINUTES_10, -MINUTES_10], ids=["ahead", "behind"])


def _left(db, table, row_id: int) -> float:  # type: ignore[no-untyped-def]
    """Seconds until the row's lease is over, by the database's clock."""
    with db.read() as conn:
        expires = conn.execute(select(table.c.lease_expires_at).where(
            table.c.id == row_id)).scalar_one()
        return (expires - db_now(conn)).total_seconds()


def _jobs(db, tmp_path, count: int = 1):  # type: ignore[no-untyped-def]
    conf = make_conf(str(tmp_path))
    fpga = inventory.add_fpga(db, hostname=HOST, handles=count)
    request_binds(conf, db, [(HOST, fpga["deployable"]["rp_uuid"])], arqs_per_instance=count)
    return conf, fpga


# Bind job claims


def test_a_conductor_ahead_does_not_steal_a_live_bind_claim(db, tmp_path, monkeypatch):
    _jobs(db, tmp_path)
    assert len(jobs_db.claim(db, jobs_db.PENDING, "c1", 10, 60)) == 1
    skew(monkeypatch, MINUTES_10)
    assert not jobs_db.any_due(db)
    assert jobs_db.claim(db, jobs_db.PENDING, "c2", 10, 60) == []


@SKEWS
def test_a_skewed_conductor_claims_renews_and_defers_for_as_long_as_it_asks(
        db, tmp_path, monkeypatch, offset):
    _jobs(db, tmp_path)
    skew(monkeypatch, offset)
    (job,) = jobs_db.claim(db, jobs_db.PENDING, "c1", 10, 60)
    assert 55 < _left(db, bind_jobs, job.id) <= 60
    assert jobs_db.claim(db, jobs_db.PENDING, "c2", 10, 60) == []
    assert jobs_db.renew(db, ["c1"], 120) == 1
    assert 115 < _left(db, bind_jobs, job.id) <= 120
    jobs_db.retry_later(db, [job.id], "c1", 5.0)
    assert 0 < _left(db, bind_jobs, job.id) <= 5
    assert not jobs_db.any_due(db)
    assert jobs_db.claim(db, jobs_db.PENDING, "c2", 10, 60) == []  # not due for 5 s


def test_a_conductor_behind_takes_a_lapsed_bind_claim(db, tmp_path, monkeypatch):
    _jobs(db, tmp_path)
    (job,) = jobs_db.claim(db, jobs_db.PENDING, "dead", 10, 60)
    with db.write() as conn:  # the dead conductor's lease ran out a second ago
        conn.execute(update(bind_jobs).values(
            lease_expires_at=db_now(conn) - dt.timedelta(seconds=1)))
    skew(monkeypatch, -MINUTES_10)
    assert jobs_db.any_due(db)
    assert [j.id for j in jobs_db.claim(db, jobs_db.PENDING, "c2", 10, 60)] == [job.id]


# Handle release claims


def _release(db) -> int:  # type: ignore[no-untyped-def]
    """One queued release of an (in use) handle, due now."""
    fpga = inventory.add_fpga(db, hostname=HOST, handles=1)
    with db.write() as conn:
        return conn.execute(insert(handle_releases).values(
            attach_handle_id=fpga["handles"][0]["id"], hostname=HOST, driver_name="fake", attempts=0,
            created_at=db_now(conn))).inserted_primary_key[0]


def test_a_conductor_ahead_does_not_steal_a_live_release_claim(db, monkeypatch):
    _release(db)
    assert len(releases_db.claim(db, "c1", 10, 60)) == 1
    skew(monkeypatch, MINUTES_10)
    assert releases_db.claim(db, "c2", 10, 60) == []


@SKEWS
def test_a_skewed_conductor_holds_a_release_for_as_long_as_it_asks(db, monkeypatch, offset):
    release = _release(db)
    skew(monkeypatch, offset)
    assert [r.id for r in releases_db.claim(db, "c1", 10, 60)] == [release]
    assert 55 < _left(db, handle_releases, release) <= 60
    assert releases_db.claim(db, "c2", 10, 60) == []
    releases_db.retry_later(db, release, "c1", 4.0, "agent away")
    assert 0 < _left(db, handle_releases, release) <= 4
    assert releases_db.claim(db, "c2", 10, 60) == []


def test_a_conductor_behind_takes_a_lapsed_release_claim(db, monkeypatch):
    release = _release(db)
    releases_db.claim(db, "dead", 10, 60)
    with db.write() as conn:
        conn.execute(update(handle_releases).values(
            lease_expires_at=db_now(conn) - dt.timedelta(seconds=1)))
    skew(monkeypatch, -MINUTES_10)
    assert [r.id for r in releases_db.claim(db, "c2", 10, 60)] == [release]


# The bind deadline


def _waiting_bind(db, tmp_path):  # type: ignore[no-untyped-def]
    """A bind whose Placement is away until the test ends, and a worker on the default clock."""
    conf, fpga = _jobs(db, tmp_path)
    worker = BindWorker(conf, db, notifier=RecordingNotifier())
    worker.placement = BindPlacementCheck(conf, client=FlakyPlacement(
        HOST, fpga["deployable"]["rp_uuid"], None))
    with db.read() as conn:
        arq = conn.execute(select(accelerator_requests.c.uuid).join(
            bind_jobs, bind_jobs.c.arq_id == accelerator_requests.c.id)).scalar_one()
    return conf, worker, arq


def test_a_conductor_ahead_does_not_fail_a_bind_before_its_deadline(db, tmp_path, monkeypatch):
    conf, worker, arq = _waiting_bind(db, tmp_path)
    skew(monkeypatch, MINUTES_10)  # > bind_timeout: the bind looks long overdue to it
    worker.run_once()
    assert arq_state(db, arq) == ("BindStarted", None)
    with db.read() as conn:  # and it waits a backoff, not the rest of the ten minutes
        row = conn.execute(select(bind_jobs.c.lease_expires_at, bind_jobs.c.attempts)).one()
        assert (row.lease_expires_at - db_now(conn)).total_seconds() <= 10
    assert row.attempts == 0


def test_a_conductor_behind_fails_a_bind_at_its_deadline(db, tmp_path, monkeypatch):
    conf, worker, arq = _waiting_bind(db, tmp_path)
    timeout = conf.conductor.bind_timeout
    with db.write() as conn:  # asked for bind_timeout + 1 s ago, by the database's clock
        conn.execute(update(bind_jobs).values(
            created_at=db_now(conn) - dt.timedelta(seconds=timeout + 1)))
    skew(monkeypatch, -MINUTES_10)  # to it the bind is not even asked for yet
    worker.run_once()
    state, reason = arq_state(db, arq)
    assert state == "BindFailed" and "bind_timeout" in reason and "Placement" in reason


def test_an_api_host_ahead_stamps_the_bind_with_the_database_clock(db, tmp_path, monkeypatch):
    skew(monkeypatch, MINUTES_10)
    _jobs(db, tmp_path)
    with db.read() as conn:
        asked = conn.execute(select(bind_jobs.c.created_at)).scalar_one()
        assert abs((asked - db_now(conn)).total_seconds()) < 5


# Agent liveness


def _component(db, tmp_path) -> AgentsComponent:  # type: ignore[no-untyped-def]
    return AgentsComponent(make_conf(str(tmp_path)), db)


def _heartbeat(db) -> None:  # type: ignore[no-untyped-def]
    with db.write() as conn:
        agents_db.record_heartbeat(conn, HOST, f"{HOST}:6668", 10)


def _up(db) -> bool:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return agents_db.list_agents(conn)[0].state == "up"


def test_a_conductor_ahead_does_not_mark_a_live_agent_down(db, tmp_path, monkeypatch):
    _heartbeat(db)
    skew(monkeypatch, MINUTES_10)
    _component(db, tmp_path).sweep()
    assert _up(db)


def test_a_heartbeat_taken_by_a_conductor_behind_keeps_the_agent_up(db, tmp_path, monkeypatch):
    skew(monkeypatch, -MINUTES_10)
    _heartbeat(db)
    monkeypatch.undo()
    _component(db, tmp_path).sweep()
    assert _up(db)


def test_a_conductor_behind_marks_a_silent_agent_down_on_time(db, tmp_path, monkeypatch):
    _heartbeat(db)
    with db.write() as conn:  # silent for three intervals and a second
        conn.execute(update(agents_db.agents).values(
            last_seen_at=db_now(conn) - dt.timedelta(seconds=31)))
    skew(monkeypatch, -MINUTES_10)
    _component(db, tmp_path).sweep()
    assert not _up(db)


# The sweep of programs a stopped conductor left PROGRAMMING


def _programming(db) -> int:  # type: ignore[no-untyped-def]
    dep = inventory.add_fpga(db, hostname=HOST)["deployable"]
    with db.write() as conn:
        assert dep_db.start_program(conn, dep["id"], "request-1")
    return dep["id"]


def _program_status(db, dep_id: int) -> str:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return conn.execute(select(deployables.c.program_status).where(
            deployables.c.id == dep_id)).scalar_one()


def test_a_conductor_ahead_does_not_fail_a_live_program(db, tmp_path, monkeypatch):
    dep_id = _programming(db)
    skew(monkeypatch, MINUTES_10)
    ProgrammingComponent(make_conf(str(tmp_path), conductor__program_timeout=10), db).fail_stale()
    assert _program_status(db, dep_id) == dep_db.PROGRAMMING


def test_a_conductor_behind_fails_a_stale_program(db, tmp_path, monkeypatch):
    dep_id = _programming(db)
    with db.write() as conn:  # 2 x program_timeout + 60 s and one more, by the database's clock
        conn.execute(update(deployables).values(
            program_started_at=db_now(conn) - dt.timedelta(seconds=81)))
    skew(monkeypatch, -MINUTES_10)
    ProgrammingComponent(make_conf(str(tmp_path), conductor__program_timeout=10), db).fail_stale()
    assert _program_status(db, dep_id) == dep_db.FAILED


def test_a_program_started_by_a_conductor_ahead_is_stamped_by_the_database(db, monkeypatch):
    skew(monkeypatch, MINUTES_10)
    _programming(db)
    with db.read() as conn:
        started = conn.execute(select(deployables.c.program_started_at)).scalar_one()
        assert abs((started - db_now(conn)).total_seconds()) < 5


def test_acceld_status_on_a_host_ahead_shows_how_long_ago_by_the_database(
        db, tmp_path, monkeypatch, capsys):
    from acceld.db import engine
    from acceld.cmd import node as node_cli

    _heartbeat(db)
    monkeypatch.setattr(node_cli, "_load", lambda args: make_conf(str(tmp_path)))
    monkeypatch.setattr(engine, "from_config", lambda conf: db)
    skew(monkeypatch, MINUTES_10)
    assert node_cli.cmd_status(argparse.Namespace()) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith(HOST)]
    assert 0 <= int(line.split()[4].rstrip("s")) <= 5, line
