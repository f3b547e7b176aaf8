"""Nova events and the bind job's claim: fenced against a stalled conductor, bounded in time.

- A conductor frozen after it read its notify jobs, whose lease lapsed meanwhile and
  whose jobs another conductor claimed and announced, sends nothing when it resumes
  (the claim is checked in the database right before each Nova call).
- A Nova that accepts the connection and never answers holds a bind worker no longer
  than ``[nova] deadline``; the worker then claims the other instances' binds.
- A worker stuck in a call past its deadline (one the watchdog cannot cut) has its
  claim no longer renewed, so it lapses and the jobs are taken up again.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from sqlalchemy import select, update

from acceld.clients import deadline as deadlines
from acceld.clients import nova
from acceld.conductor.binding.worker import BindingComponent, BindWorker
from acceld.db import bind_jobs as jobs_db
from acceld.db.models import bind_jobs, utcnow
from tests.conftest import make_conf
from tests.support import binds, inventory
from tests.support.nova import RecordingNova
from tests.support.stalling import StallingPeer


@pytest.fixture
def recorder():
    server = RecordingNova().start()
    yield server
    server.stop()


def _nova_conf(tmp_path, url: str, **extra):  # type: ignore[no-untyped-def]
    return make_conf(str(tmp_path), nova__auth_type="none", nova__endpoint_override=url,
                     nova__connect_retries=0, nova__status_code_retries=0, **extra)


def _one_bind(conf, db, hostname: str = "fence-node") -> tuple[str, str]:  # type: ignore[no-untyped-def]
    fpga = inventory.add_fpga(db, hostname=hostname, handles=1)
    [(instance, [arq])] = binds.request_binds(conf, db, [(hostname,
                                                           fpga["deployable"]["rp_uuid"])])
    return instance, arq


def _jobs(db) -> list[tuple]:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return [tuple(r) for r in conn.execute(select(
            bind_jobs.c.phase, bind_jobs.c.lease_owner, bind_jobs.c.lease_expires_at))]


def test_a_conductor_whose_claim_lapsed_sends_no_event_another_sent(db, tmp_path, recorder):
    conf = _nova_conf(tmp_path, recorder.url)
    _, arq = _one_bind(conf, db)
    a = BindWorker(conf, db)
    b = BindWorker(conf, db)
    b_claimed: list[int] = []

    def frozen_after_reading(job_ids: list[int]) -> None:
        """A is frozen here: its lease lapses, B claims the job, tells Nova, drops it."""
        a.on_notify_read = lambda ids: None  # once
        assert job_ids, "A read its notify job"
        with db.write() as conn:
            conn.execute(update(bind_jobs).values(
                lease_expires_at=utcnow() - dt.timedelta(hours=1)))
        b_claimed.append(b.run_once())
        assert [e["tag"] for e in recorder.events()] == [arq]  # B sent it
        assert _jobs(db) == []  # and dropped the job

    a.on_notify_read = frozen_after_reading
    a.run_once()  # claims the pending job, binds it, reads it for notify, resumes
    assert b_claimed == [1]
    assert [e["tag"] for e in recorder.events()] == [arq], "A sent the event again"
    assert binds.arq_state(db, arq)[0] == "Bound"


def test_a_lapsed_claim_nobody_took_yet_is_left_to_the_next(db, tmp_path, recorder):
    """A's lease ran out, nobody claimed the job yet: A sends nothing, and does not touch
    the job (any conductor may claim it now); the next claim sends the event once."""
    conf = _nova_conf(tmp_path, recorder.url)
    _, arq = _one_bind(conf, db)
    a = BindWorker(conf, db)

    def lapse(job_ids: list[int]) -> None:
        with db.write() as conn:
            conn.execute(update(bind_jobs).values(
                lease_expires_at=utcnow() - dt.timedelta(hours=1)))

    a.on_notify_read = lapse
    a.run_once()
    assert recorder.events() == []
    [(phase, _owner, _expires)] = _jobs(db)
    assert phase == "notify"
    assert BindWorker(conf, db).run_once() == 1
    assert [e["tag"] for e in recorder.events()] == [arq]
    assert _jobs(db) == []


def test_a_hanging_nova_holds_the_worker_no_longer_than_its_deadline(db, tmp_path):
    """One worker; Nova accepts and never answers. The first bind's event waits out
    [nova] deadline, not forever, and the same worker then binds the second instance.
    The claim that waited was renewed while its call was within its deadline only."""
    silent = StallingPeer("silent").start()
    try:
        conf = _nova_conf(tmp_path, silent.url, nova__deadline=3.0, nova__timeout=600,
                          conductor__bind_workers=1)
        first = _one_bind(conf, db, "hang-a")
        second = _one_bind(conf, db, "hang-b")
        component = BindingComponent(conf, db)
        worker = component.worker
        done = threading.Event()
        outcomes: list[int] = []

        def loop() -> None:  # one bind worker thread, as BindingComponent runs it
            while True:
                claimed = worker.run_once()
                outcomes.append(claimed)
                if claimed == 0:
                    break
            done.set()

        thread = threading.Thread(target=loop, daemon=True)
        started = time.monotonic()
        thread.start()
        assert silent.requested.wait(30), "the first event never reached Nova"
        assert worker.renew_leases() == 1  # in its call, within the deadline: renewed
        assert done.wait(30), "the bind worker is still held by the silent Nova"
        elapsed = time.monotonic() - started
        # Two instances, each send cut at 3 s: far below what the 600 s read timeout
        # alone would allow.
        assert elapsed < 30, elapsed
        for _instance, arq in (first, second):
            assert binds.arq_state(db, arq)[0] == "Bound"
        # Both events are left for later, leases given up (not held by a stuck worker).
        assert [(phase, owner) for phase, owner, _ in _jobs(db)] == [("notify", None)] * 2
        assert worker.renew_leases() == 0
    finally:
        silent.stop()


def test_a_claim_stuck_in_a_call_past_its_deadline_is_not_renewed(db, tmp_path, caplog):
    """A call the watchdog cannot cut (here: a notifier that blocks inside its bounded
    block) leaves its claim unrenewed once it is past its deadline: the lease lapses and
    another conductor takes the job up."""
    conf = make_conf(str(tmp_path))
    _, arq = _one_bind(conf, db)
    inside = threading.Event()
    release = threading.Event()

    class StuckNotifier:
        configured = True

        def send(self, events: list[nova.Event]) -> dict[str, str]:
            with deadlines.bounded(0.05, "Nova"):
                inside.set()
                release.wait(60)  # e.g. a name lookup: no socket to shut down
            return {e.arq_uuid: nova.RETRY for e in events}

    worker = BindWorker(conf, db, notifier=StuckNotifier())  # type: ignore[arg-type]
    thread = threading.Thread(target=worker.run_once, daemon=True)
    thread.start()
    try:
        assert inside.wait(30)
        [(_, owner, before)] = _jobs(db)
        assert owner is not None
        ident = thread.ident
        assert ident is not None
        give_up = time.monotonic() + 30
        while deadlines.overdue(ident, 1.0) is None:  # observed, not assumed
            assert time.monotonic() < give_up, "the call never became overdue"
            time.sleep(0.05)
        assert worker.renew_leases() == 0
        assert worker.renew_leases() == 0
        [(_, owner_after, after)] = _jobs(db)
        assert (owner_after, after) == (owner, before)  # not extended
        stuck_lines = [r for r in caplog.records if "no longer renewed" in r.getMessage()]
        assert len(stuck_lines) == 1  # once, not at every renewal
        # What time does to an unrenewed lease; another conductor then takes the job.
        with db.write() as conn:
            conn.execute(update(bind_jobs).values(
                lease_expires_at=utcnow() - dt.timedelta(seconds=1)))
        assert len(jobs_db.claim(db, jobs_db.NOTIFY, "another-conductor", 16, 60)) == 1
    finally:
        release.set()
        thread.join(30)
    assert binds.arq_state(db, arq)[0] == "Bound"


def test_bind_timeout_holds_whatever_placement_does(db, tmp_path):
    """Placement accepts and never answers, its own deadline far away: the bind's calls are
    held to what is left of [conductor] bind_timeout, and the bind fails naming Placement
    at about that time instead of holding the worker until Placement's deadline."""
    silent = StallingPeer("silent").start()
    try:
        conf = make_conf(str(tmp_path), placement__auth_type="none",
                         placement__endpoint_override=silent.url, placement__deadline=600,
                         placement__timeout=600, conductor__bind_timeout=10)
        _, arq = _one_bind(conf, db)
        worker = BindWorker(conf, db)
        thread = threading.Thread(target=worker.run_once, daemon=True)
        started = time.monotonic()
        thread.start()
        assert silent.requested.wait(30), "the bind never asked Placement"
        thread.join(60)
        assert not thread.is_alive(), "the bind worker is held past bind_timeout"
        assert time.monotonic() - started < 40
        state, reason = binds.arq_state(db, arq)
        assert state == "BindFailed"
        assert "Placement" in (reason or "") and "bind_timeout" in (reason or "")
    finally:
        silent.stop()


def test_a_worker_frozen_between_its_lease_read_and_the_send_sends_nothing(
        db, tmp_path, recorder, monkeypatch):
    """A is frozen right after it read its claim's lease (``bind_jobs.held``) and before its
    bounded send: longer than the lease it read. Meanwhile B claims the job and tells Nova.
    A's deadline counts from its read (a monotonic reading taken at the read), so A finds it
    passed when it resumes and sends nothing: Nova hears the event once."""
    conf = _nova_conf(tmp_path, recorder.url)
    _, arq = _one_bind(conf, db)
    a = BindWorker(conf, db)
    b = BindWorker(conf, db)
    frozen = [0.0]  # seconds A spent frozen, as the deadlines' monotonic clock sees them
    real_clock = deadlines._clock
    monkeypatch.setattr(deadlines, "_clock", lambda: real_clock() + frozen[0])
    read: list[float] = []

    def frozen_after_the_lease_read(lease_left: float) -> None:
        a.on_lease_read = lambda left: None  # once
        read.append(lease_left)
        frozen[0] += lease_left + 5  # the freeze outlasts the lease A read
        with db.write() as conn:  # what that much time does to A's lease
            conn.execute(update(bind_jobs).values(
                lease_expires_at=utcnow() - dt.timedelta(seconds=1)))
        assert b.run_once() == 1
        assert [e["tag"] for e in recorder.events()] == [arq]  # B sent it

    a.on_lease_read = frozen_after_the_lease_read
    a.run_once()
    assert read and read[0] > 0, "A never read its lease before sending"
    assert [e["tag"] for e in recorder.events()] == [arq], "A sent the event again"
    assert binds.arq_state(db, arq)[0] == "Bound"
    assert _jobs(db) == []
