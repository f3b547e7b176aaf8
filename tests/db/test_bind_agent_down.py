"""An agent marked down during a bind is an outage to wait out, not a refusal (issue 11
item 4): the bind waits with capped backoff, without using its attempt budget, up to
``[conductor] bind_timeout``; Bound once the agent reports again, else BindFailed naming
the agent. Nova hears exactly one outcome; the log has one WARNING when the wait starts
and one when it ends (the agent back, or the bind failed), and no traceback.

Before: the bind-target check refused at once ("the agent of host ... is down").
The agent's state is set in the database (what the liveness sweep and the hello write);
the deadline uses an injected clock.
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy import insert, select, update

from acceld.conductor.binding.worker import MAX_BIND_ATTEMPTS, BindWorker
from acceld.db.models import agents, bind_jobs, utcnow
from tests.conftest import make_conf
from tests.support import inventory
from tests.support.binds import RecordingNotifier, arq_state, make_jobs_due, request_binds

HOST = "agent-down-node"
AGENT = f"The agent of host {HOST}"


class Clock:
    """utcnow, moved forward by the test."""

    def __init__(self) -> None:
        self.offset = dt.timedelta()

    def __call__(self) -> dt.datetime:
        return utcnow() + self.offset


def _setup(db, tmp_path):  # type: ignore[no-untyped-def]
    conf = make_conf(str(tmp_path))
    fpga = inventory.add_fpga(db, hostname=HOST, handles=1)
    with db.write() as conn:
        conn.execute(insert(agents).values(hostname=HOST, endpoint=f"{HOST}:6668",
                                           state="down", heartbeat_interval=10,
                                           last_seen_at=utcnow() - dt.timedelta(seconds=60)))
    notifier = RecordingNotifier()
    clock = Clock()
    worker = BindWorker(conf, db, notifier=notifier, clock=clock)
    worker.placement.client = None  # no Placement in this test: only the agent matters
    [(instance, [arq])] = request_binds(conf, db, [(HOST, fpga["deployable"]["rp_uuid"])])
    return conf, worker, notifier, clock, instance, arq


def _set_agent(db, state: str) -> None:  # type: ignore[no-untyped-def]
    with db.write() as conn:
        conn.execute(update(agents).where(agents.c.hostname == HOST).values(state=state))


def _agent_lines(caplog) -> list[tuple[str, bool]]:  # type: ignore[no-untyped-def]
    return [(r.levelname, "available again" in r.getMessage()) for r in caplog.records
            if r.getMessage().startswith(f"{AGENT} is ")]


def _wait_a_while(db, worker) -> None:  # type: ignore[no-untyped-def]
    """More tries than the attempt budget, all within the deadline."""
    for _ in range(2 * MAX_BIND_ATTEMPTS):
        worker.run_once()
        make_jobs_due(db)


def test_agent_back_before_the_deadline_binds(db, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    conf, worker, notifier, clock, instance, arq = _setup(db, tmp_path)
    _wait_a_while(db, worker)
    assert arq_state(db, arq) == ("BindStarted", None)
    assert notifier.sent == []
    with db.read() as conn:
        assert conn.execute(select(bind_jobs.c.attempts)).scalar_one() == 0  # budget untouched
    _set_agent(db, "up")
    clock.offset = dt.timedelta(seconds=conf.conductor.bind_timeout - 5)
    worker.run_once()
    worker.run_once()
    assert arq_state(db, arq) == ("Bound", None)
    assert [(s.server_uuid, s.arq_uuid, s.status) for s in notifier.sent] == [
        (instance, arq, "completed")]
    assert _agent_lines(caplog) == [("WARNING", False), ("WARNING", True)], \
        [r.getMessage() for r in caplog.records]
    assert [r for r in caplog.records if r.exc_info] == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_agent_down_past_the_deadline_fails_the_bind_naming_the_agent(db, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    conf, worker, notifier, clock, instance, arq = _setup(db, tmp_path)
    _wait_a_while(db, worker)
    assert arq_state(db, arq) == ("BindStarted", None)
    clock.offset = dt.timedelta(seconds=conf.conductor.bind_timeout + 1)
    worker.run_once()
    worker.run_once()
    state, reason = arq_state(db, arq)
    assert state == "BindFailed"
    assert reason.startswith(f"{AGENT} was unavailable") and "bind_timeout" in reason, reason
    assert "conductor died" not in reason
    assert [(s.server_uuid, s.arq_uuid, s.status) for s in notifier.sent] == [
        (instance, arq, "failed")]
    # One WARNING when the wait starts, one when the bind ends failed; no "again" line.
    assert _agent_lines(caplog) == [("WARNING", False)]
    failed = [r for r in caplog.records if r.getMessage().startswith(f"Bind of ARQ {arq}")]
    assert [r.levelname for r in failed] == ["WARNING"] and AGENT in failed[0].getMessage()
    assert [r for r in caplog.records if r.exc_info] == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
