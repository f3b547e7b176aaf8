"""Each instance hears as soon as its own ARQs resolve (issue 11 item 5).

A claim takes the due jobs of one instance, not a batch of unrelated ones;
on PostgreSQL and MariaDB concurrent claims skip each other's rows (``FOR
UPDATE SKIP LOCKED``) instead of waiting or colliding; and an instance's
``accelerator-request-bound`` events go out when its ARQs resolve. Before: one
worker claimed up to 16 jobs of any instances, bound them one after another
and sent every event when the whole batch was done, so one slow mdev prepare
or program held up every other instance's boot.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import event, update

from acceld.conductor.binding.worker import BindingComponent, BindWorker
from acceld.db import bind_jobs as jobs_db
from acceld.db.models import attach_handles, deployables
from tests.conftest import make_conf
from tests.support import inventory
from tests.support.binds import RecordingNotifier, arq_state, request_binds


def _two_instances(db, tmp_path, arqs_per_instance=2, hosts=("node-1", "node-2"), **conf):  # type: ignore[no-untyped-def]
    cfg = make_conf(str(tmp_path), **conf)
    targets = []
    for host in hosts:
        fpga = inventory.add_fpga(db, hostname=host, handles=arqs_per_instance)
        targets.append((host, fpga["deployable"]["rp_uuid"]))
    return cfg, request_binds(cfg, db, targets, arqs_per_instance)


def test_a_claim_takes_one_instance_only(db, tmp_path):
    conf, made = _two_instances(db, tmp_path)
    first = jobs_db.claim(db, jobs_db.PENDING, "claim-a", 16, 60)
    second = jobs_db.claim(db, jobs_db.PENDING, "claim-b", 16, 60)
    assert {j.instance_uuid for j in first} == {made[0][0]}
    assert len(first) == 2
    assert {j.instance_uuid for j in second} == {made[1][0]}
    assert jobs_db.claim(db, jobs_db.PENDING, "claim-c", 16, 60) == []


def test_concurrent_claims_skip_locked_rows(db, tmp_path):
    """Claim A is held after locking the first job it read, before it reads the rest of
    that instance's jobs and commits; claim B, on another connection, takes the other
    instance at once: it neither waits for A's locks nor takes the rest of A's instance."""
    if db.is_sqlite:
        pytest.skip("SQLite has one writer: claims are serialised by BEGIN IMMEDIATE")
    conf, made = _two_instances(db, tmp_path)
    paused, resume = threading.Event(), threading.Event()
    holder: dict[str, object] = {}
    locking_reads = []

    def hold_after_read(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        if (threading.current_thread().name == "claim-a"
                and "FOR UPDATE" in statement.upper()):
            locking_reads.append(statement)
            if len(locking_reads) == 2:  # the first read is done and holds its row
                paused.set()
                resume.wait(30)

    def claim_a() -> None:
        holder["a"] = jobs_db.claim(db, jobs_db.PENDING, "claim-a", 16, 60)

    event.listen(db.engine, "before_cursor_execute", hold_after_read)
    thread = threading.Thread(target=claim_a, name="claim-a")
    thread.start()
    try:
        assert paused.wait(10)
        got_b: list = []
        b = threading.Thread(target=lambda: got_b.extend(
            jobs_db.claim(db, jobs_db.PENDING, "claim-b", 16, 60)))
        b.start()
        b.join(10)
        assert not b.is_alive(), "claim B waited for claim A's locks"
    finally:
        resume.set()
        thread.join(10)
        event.remove(db.engine, "before_cursor_execute", hold_after_read)
    a_instances = {j.instance_uuid for j in holder["a"]}  # type: ignore[attr-defined]
    b_instances = {j.instance_uuid for j in got_b}
    assert len(a_instances) == 1 and len(b_instances) == 1
    assert a_instances != b_instances
    assert a_instances | b_instances == {made[0][0], made[1][0]}


class BlockingAttach:
    """The agents' prepare step, held on one host until the test releases it."""

    def __init__(self, slow_host: str) -> None:
        self.slow_host = slow_host
        self.entered = threading.Event()
        self.release = threading.Event()

    def prepare(self, hostname: str, body: dict) -> dict:
        if hostname == self.slow_host:
            self.entered.set()
            assert self.release.wait(60), "the test never released the slow prepare"
        return {"attach_info": body["attach_info"]}


def test_slow_prepare_of_one_instance_never_delays_another(db, tmp_path):
    conf, made = _two_instances(db, tmp_path, conductor__bind_workers=2)
    (slow_instance, slow_arqs), (fast_instance, fast_arqs) = made
    with db.write() as conn:  # handles with a host step (mdev): prepared by the agent
        conn.execute(update(attach_handles).values(attach_type="MDEV"))
    component = BindingComponent(conf, db)
    notifier = RecordingNotifier()
    attach = BlockingAttach("node-1")
    component.worker.notifier = notifier
    component.worker.attach = attach  # type: ignore[assignment]
    component.start()
    try:
        assert attach.entered.wait(20), "instance 1's prepare never started"
        sent = notifier.wait_for(fast_instance, len(fast_arqs))
        assert sorted((s.arq_uuid, s.status) for s in sent) == sorted(
            (arq, "completed") for arq in fast_arqs)
        assert notifier.for_instance(slow_instance) == []
        assert {arq_state(db, a)[0] for a in slow_arqs} == {"BindStarted"}
        attach.release.set()
        sent = notifier.wait_for(slow_instance, len(slow_arqs))
        assert sorted((s.arq_uuid, s.status) for s in sent) == sorted(
            (arq, "completed") for arq in slow_arqs)
    finally:
        attach.release.set()
        component.stop()
    assert {arq_state(db, a)[0] for a in slow_arqs + fast_arqs} == {"Bound"}


def test_events_go_out_per_instance(db, tmp_path):
    conf, made = _two_instances(db, tmp_path)
    notifier = RecordingNotifier()
    worker = BindWorker(conf, db, notifier=notifier)
    worker.run_once()  # one instance's claim: its events, and only its
    assert notifier.posts == 1
    assert {s.server_uuid for s in notifier.sent} == {made[0][0]}
    worker.run_once()
    assert notifier.posts == 2
    assert len(notifier.sent) == 4


class BlockingProgrammer:
    """Programs a deployable (recording its bitstream as the real programmer does); the
    slow deployable's program is held until the test releases it."""

    def __init__(self, db, slow_deployable: str) -> None:  # type: ignore[no-untyped-def]
        self.db = db
        self.slow = slow_deployable
        self.entered = threading.Event()
        self.release = threading.Event()

    def program(self, deployable_uuid: str, kind: str, *, image_id=None, function_id=None,  # type: ignore[no-untyped-def]
                precheck=None) -> str:
        if deployable_uuid == self.slow:
            self.entered.set()
            assert self.release.wait(60), "the test never released the slow program"
        with self.db.write() as conn:
            conn.execute(update(deployables).where(deployables.c.uuid == deployable_uuid)
                         .values(bitstream_id=image_id))
        return str(image_id)


def test_slow_program_of_one_instance_never_delays_another(db, tmp_path):
    conf = make_conf(str(tmp_path), conductor__bind_workers=2)
    slow = inventory.add_fpga(db, hostname="node-1", handles=1)
    fast = inventory.add_fpga(db, hostname="node-2", handles=1)
    group = {"accel:bitstream_id": str(uuid.uuid4())}
    [(slow_instance, [slow_arq])] = request_binds(
        conf, db, [("node-1", slow["deployable"]["rp_uuid"])], group=group)
    [(fast_instance, [fast_arq])] = request_binds(
        conf, db, [("node-2", fast["deployable"]["rp_uuid"])], group=group)
    component = BindingComponent(conf, db)
    notifier = RecordingNotifier()
    programmer = BlockingProgrammer(db, slow["deployable"]["uuid"])
    component.worker.notifier = notifier
    component.worker.programming.programmer = programmer  # type: ignore[assignment]
    component.start()
    try:
        assert programmer.entered.wait(20), "instance 1's program never started"
        assert [(s.arq_uuid, s.status) for s in notifier.wait_for(fast_instance, 1)] == [
            (fast_arq, "completed")]
        assert notifier.for_instance(slow_instance) == []
        assert arq_state(db, slow_arq)[0] == "BindStarted"
        programmer.release.set()
        assert [(s.arq_uuid, s.status) for s in notifier.wait_for(slow_instance, 1)] == [
            (slow_arq, "completed")]
    finally:
        programmer.release.set()
        component.stop()


def test_a_claim_says_whether_another_instance_is_due(db, tmp_path):
    """A worker wakes another only when jobs are left: with one instance due, nobody is
    woken for nothing (a wasted pair of write transactions per bind)."""
    conf, made = _two_instances(db, tmp_path)
    first, more = jobs_db.claim_and_peek(db, jobs_db.PENDING, "claim-a", 16, 60)
    assert {j.instance_uuid for j in first} == {made[0][0]} and more
    second, more = jobs_db.claim_and_peek(db, jobs_db.PENDING, "claim-b", 16, 60)
    assert {j.instance_uuid for j in second} == {made[1][0]} and not more
    assert jobs_db.claim_and_peek(db, jobs_db.PENDING, "claim-c", 16, 60) == ([], False)
    # A batch cut short by the limit leaves the rest of its instance due: more.
    _conf, _made = _two_instances(db, tmp_path, arqs_per_instance=3, hosts=("node-3",))
    part, more = jobs_db.claim_and_peek(db, jobs_db.PENDING, "claim-d", 2, 60)
    assert len(part) == 2 and more


def test_one_instance_due_wakes_no_second_worker(db, tmp_path):
    conf, made = _two_instances(db, tmp_path, hosts=("node-1",))
    worker = BindWorker(conf, db, notifier=RecordingNotifier())
    woken = []
    worker.on_claimed = lambda: woken.append(True)
    assert worker.run_once() == 2
    assert woken == []
    assert {arq_state(db, arq)[0] for _, arqs in made for arq in arqs} == {"Bound"}
