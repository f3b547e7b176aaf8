"""Outages are waited out, not counted as failures (issue 11 item 4).

Placement (or an agent, or the database) being unavailable during a bind
does not use up the bind's attempt budget: the bind waits, with capped
backoff, up to ``[conductor] bind_timeout`` after it was asked for, then ends
BindFailed with a reason naming what was unavailable. Nova hears exactly one
outcome either way, and the log has one WARNING when the outage starts and one
when it ends, with no traceback. Before: 5 failed tries ended the bind with
"the conductor died or failed each time" (and a traceback each), and an
outage longer than that left it BindStarted forever.

The outage is forced deterministically: a Placement client that refuses the
next N calls, and the database refusing connections at the engine level
(tests.support.db_outage). The deadline uses an injected clock.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import uuid

import pytest

from sqlalchemy import select

from acceld.conductor.binding.worker import MAX_BIND_ATTEMPTS, BindWorker
from acceld.conductor.placement.checks import BindPlacementCheck
from acceld.db.models import bind_jobs, utcnow
from tests.conftest import make_conf
from tests.support import inventory
from tests.support.binds import (FlakyPlacement, FlakyProgrammer, RecordingNotifier, arq_state,
                                 make_jobs_due, request_binds)
from tests.support.db_outage import outage

HOST = "outage-node"


class Clock:
    """utcnow (or ``base`` when set), moved forward by the test."""

    def __init__(self) -> None:
        self.offset = dt.timedelta()
        self.base: dt.datetime | None = None

    def __call__(self) -> dt.datetime:
        return (self.base or utcnow()) + self.offset


def _setup(db, tmp_path, failures):  # type: ignore[no-untyped-def]
    conf = make_conf(str(tmp_path))
    fpga = inventory.add_fpga(db, hostname=HOST, handles=2)
    rp = fpga["deployable"]["rp_uuid"]
    placement = FlakyPlacement(HOST, rp, failures)
    notifier = RecordingNotifier()
    clock = Clock()
    worker = BindWorker(conf, db, notifier=notifier, clock=clock)
    worker.placement = BindPlacementCheck(conf, client=placement)
    [(instance, [arq])] = request_binds(conf, db, [(HOST, rp)])
    return conf, worker, placement, notifier, clock, instance, arq


def _messages(caplog, words: str) -> list[logging.LogRecord]:  # type: ignore[no-untyped-def]
    return [r for r in caplog.records if words in r.getMessage()]


def test_placement_outage_longer_than_the_attempt_budget_is_waited_out(db, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    failures = 3 * MAX_BIND_ATTEMPTS
    conf, worker, placement, notifier, _, instance, arq = _setup(db, tmp_path, failures)
    passes = 0
    while arq_state(db, arq)[0] == "BindStarted" and passes < 4 * failures:
        worker.run_once()
        make_jobs_due(db)
        passes += 1
    assert placement.refused == failures
    assert arq_state(db, arq) == ("Bound", None)
    assert [(s.server_uuid, s.arq_uuid, s.status) for s in notifier.sent] == [
        (instance, arq, "completed")]
    outage_logs = _messages(caplog, "Placement is ")
    assert [(r.levelname, "again" in r.getMessage()) for r in outage_logs] == [
        ("WARNING", False), ("WARNING", True)], [r.getMessage() for r in outage_logs]
    assert [r for r in caplog.records if r.exc_info] == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    with db.read() as conn:
        assert conn.execute(select(bind_jobs.c.id)).all() == []


def test_outage_past_bind_timeout_fails_the_bind_naming_placement(db, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    conf, worker, placement, notifier, clock, instance, arq = _setup(db, tmp_path, None)
    timeout = conf.conductor.bind_timeout
    assert 0 < timeout < 300  # below Nova's default arq_binding_timeout
    for _ in range(2 * MAX_BIND_ATTEMPTS):  # more tries than the budget, within the deadline
        worker.run_once()
        make_jobs_due(db)
    assert arq_state(db, arq) == ("BindStarted", None)
    assert notifier.sent == []
    clock.offset = dt.timedelta(seconds=timeout + 1)
    worker.run_once()
    state, reason = arq_state(db, arq)
    assert state == "BindFailed"
    assert "Placement" in reason and "bind_timeout" in reason and "unreachable" in reason
    assert "conductor died" not in reason
    worker.run_once()
    assert [(s.server_uuid, s.arq_uuid, s.status) for s in notifier.sent] == [
        (instance, arq, "failed")]
    assert len(_messages(caplog, "Placement is unavailable")) == 1
    assert [r for r in caplog.records if r.exc_info] == []


def test_deadline_wait_is_capped_backoff_not_a_busy_loop(db, tmp_path):
    conf, worker, placement, notifier, clock, instance, arq = _setup(db, tmp_path, None)
    timeout = conf.conductor.bind_timeout
    with db.read() as conn:
        clock.base = conn.execute(select(bind_jobs.c.created_at)).scalar_one()
    delays = []
    for age in (0, 8, 40, 120, timeout - 5, timeout - 0.5):  # seconds since the bind was asked
        clock.offset = dt.timedelta(seconds=age)
        worker.run_once()
        with db.read() as conn:  # both written by the retry, at the same moment
            row = conn.execute(select(bind_jobs.c.lease_expires_at,
                                      bind_jobs.c.updated_at)).one()
        delays.append(round((row.lease_expires_at - row.updated_at).total_seconds()))
        make_jobs_due(db)
    # A quarter of the bind's age, at least 1 s and at most 10 s, never past the deadline.
    assert delays == [1, 2, 10, 10, 5, 0], delays
    assert arq_state(db, arq)[0] == "BindStarted"
    with db.read() as conn:
        attempts = conn.execute(select(bind_jobs.c.attempts)).scalar_one()
    assert attempts == 0  # waiting is not trying: the attempt budget is untouched


@pytest.mark.parametrize("message, what", [
    ("Glance could not be reached: Unable to establish connection to http://127.0.0.1:1",
     "The image service"),
    ("The agent of host outage-node could not be reached: ConnectionError.",
     "The agent of host outage-node"),
])
def test_program_outage_is_waited_out(db, tmp_path, caplog, message, what):
    """The agent, or the image service it downloads from, is away while the bind's
    profile asks for a bitstream: the bind waits, then programs and binds."""
    caplog.set_level(logging.INFO)
    conf = make_conf(str(tmp_path))
    fpga = inventory.add_fpga(db, hostname=HOST, handles=1)
    programmer = FlakyProgrammer(db, 2 * MAX_BIND_ATTEMPTS, message)
    notifier = RecordingNotifier()
    worker = BindWorker(conf, db, notifier=notifier)
    worker.programming.programmer = programmer  # type: ignore[assignment]
    image = str(uuid.uuid4())
    [(instance, [arq])] = request_binds(conf, db, [(HOST, fpga["deployable"]["rp_uuid"])],
                                        group={"accel:bitstream_id": image})
    for _ in range(4 * MAX_BIND_ATTEMPTS):
        if arq_state(db, arq)[0] != "BindStarted":
            break
        worker.run_once()
        make_jobs_due(db)
    assert arq_state(db, arq) == ("Bound", None)
    assert programmer.programs == 1
    assert [(s.arq_uuid, s.status) for s in notifier.sent] == [(arq, "completed")]
    logs = _messages(caplog, f"{what} is ")
    assert [(r.levelname, "again" in r.getMessage()) for r in logs] == [
        ("WARNING", False), ("WARNING", True)], [r.getMessage() for r in logs]
    assert [r for r in caplog.records if r.exc_info] == []


def test_database_outage_mid_bind_resumes_as_soon_as_it_is_back(db, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    conf, worker, placement, notifier, _, instance, arq = _setup(db, tmp_path, 0)
    assert conf.conductor.bind_lease_seconds >= 60
    checks = worker.placement.before

    with outage(db) as down:
        def database_goes_away(*args, **kwargs):  # type: ignore[no-untyped-def]
            down.start()  # after the claim, before the bind transaction
            return checks(*args, **kwargs)

        worker.placement.before = database_goes_away
        worker.run_once()
        assert down.refused >= 1
        worker.placement.before = checks
        down.stop()
    # The database is back: the claimed job is taken up now, not after its 60 s lease.
    worker.run_once()
    assert arq_state(db, arq) == ("Bound", None)
    assert [(s.arq_uuid, s.status) for s in notifier.sent] == [(arq, "completed")]
    logs = _messages(caplog, "The database is ")
    assert [(r.levelname, "again" in r.getMessage()) for r in logs] == [
        ("WARNING", False), ("WARNING", True)], [r.getMessage() for r in logs]
    assert [r for r in caplog.records if r.exc_info] == []


def test_agent_outage_during_prepare_is_waited_out(db, tmp_path, caplog):
    """The node's agent is away when an mdev handle must be prepared: the bind holds the
    handle and waits; once the agent is back the handle is prepared and the ARQ Bound."""
    from tests.unit.test_attach_handles import HOST as NODE, Node

    caplog.set_level(logging.INFO)
    node = Node(tmp_path, db)  # its agent is not started: connections are refused
    notifier = RecordingNotifier()
    worker = BindWorker(node.conf, db, notifier=notifier)
    arq = node.start_bind()
    try:
        for _ in range(2 * MAX_BIND_ATTEMPTS):
            worker.run_once()
            make_jobs_due(db)
        assert arq_state(db, arq) == ("BindStarted", None)
        assert len(node.in_use()) == 1  # held while waiting
        node.start_agent()
        worker.run_once()
    finally:
        node.stop_agent()
    assert arq_state(db, arq) == ("Bound", None)
    assert len(node.prepared()) == 1
    assert [(s.arq_uuid, s.status) for s in notifier.sent] == [(arq, "completed")]
    logs = _messages(caplog, f"The agent of host {NODE} is ")
    assert [(r.levelname, "again" in r.getMessage()) for r in logs] == [
        ("WARNING", False), ("WARNING", True)], [r.getMessage() for r in logs]
    assert [r for r in caplog.records if r.exc_info] == []


def test_running_conductor_resumes_its_claims_when_the_database_is_back(db, tmp_path):
    """The component's worker thread loses the database mid-bind; once it answers again,
    the periodic bind-scan wakes the worker, which gives its claim back and binds, well
    within the 60 s lease that the claim would otherwise have waited out."""
    from acceld.conductor.binding.worker import BindingComponent

    conf = make_conf(str(tmp_path), conductor__bind_workers=1)
    fpga = inventory.add_fpga(db, hostname=HOST, handles=1)
    component = BindingComponent(conf, db)
    notifier = RecordingNotifier()
    component.worker.notifier = notifier
    checks = component.worker.placement.before
    lost = threading.Event()

    with outage(db) as down:
        def database_goes_away(*args, **kwargs):  # type: ignore[no-untyped-def]
            if not lost.is_set():
                down.start()
                lost.set()
            return checks(*args, **kwargs)

        component.worker.placement.before = database_goes_away
        [(instance, [arq])] = request_binds(conf, db, [(HOST, fpga["deployable"]["rp_uuid"])])
        component.start()
        try:
            assert lost.wait(20)
            deadline = utcnow() + dt.timedelta(seconds=20)
            while not component.worker.has_stranded() and utcnow() < deadline:
                lost.wait(0.05)  # the worker's pass is ending: it records the claim
            assert component.worker.has_stranded()
            down.stop()
            component.scan()  # what the periodic bind-scan does every bind_poll_interval
            sent = notifier.wait_for(instance, 1, timeout=20)
        finally:
            component.stop()
    assert [(s.arq_uuid, s.status) for s in sent] == [(arq, "completed")]
    assert arq_state(db, arq) == ("Bound", None)


def test_binds_that_program_nothing_do_not_end_an_image_service_outage(db, tmp_path, caplog):
    """While the image service is away, binds of deployables that already hold their
    image keep completing; they never reach it, so they neither end its outage in the
    log nor start it again: one WARNING each way for the whole outage."""
    caplog.set_level(logging.INFO)
    conf = make_conf(str(tmp_path))
    held = str(uuid.uuid4())
    wanted = str(uuid.uuid4())
    waiting = inventory.add_fpga(db, hostname="node-needs", handles=1)
    ready = inventory.add_fpga(db, hostname="node-holds", handles=3, bitstream_id=held)
    programmer = FlakyProgrammer(db, 4, "Glance could not be reached: connection refused")
    notifier = RecordingNotifier()
    worker = BindWorker(conf, db, notifier=notifier)
    worker.programming.programmer = programmer  # type: ignore[assignment]
    [(_, [blocked])] = request_binds(conf, db, [("node-needs", waiting["deployable"]["rp_uuid"])],
                                     group={"accel:bitstream_id": wanted})
    quick = []
    for _ in range(3):
        quick += request_binds(conf, db, [("node-holds", ready["deployable"]["rp_uuid"])],
                               group={"accel:bitstream_id": held})
        while worker.run_once():
            pass
        make_jobs_due(db)
    assert {arq_state(db, arq)[0] for _, arqs in quick for arq in arqs} == {"Bound"}
    assert arq_state(db, blocked)[0] == "BindStarted"
    while arq_state(db, blocked)[0] == "BindStarted" and programmer.failures >= 0:
        worker.run_once()
        make_jobs_due(db)
        if programmer.programs:
            break
    assert arq_state(db, blocked) == ("Bound", None)
    logs = _messages(caplog, "The image service is ")
    assert [(r.levelname, "again" in r.getMessage()) for r in logs] == [
        ("WARNING", False), ("WARNING", True)], [r.getMessage() for r in logs]
