"""The transactions and statements on a bind's path from PATCH to Nova's event.

- The claim reads each job's profile group (acceld.db.bind_jobs.claim_and_peek), so the
  worker knows without a read of its own that the group asks no programming
  (acceld.conductor.binding.programming); a group that names an image is still read.
- The Nova event is built from what the bind transaction committed: only the fence's
  read (the claim still ours) lies between that transaction and Nova.
- A worker passes again only while its claims left jobs due; a PATCH that only binds
  runs no unbind statement.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from sqlalchemy import event

from acceld.conductor.binding.worker import BindWorker
from acceld.db import bind_jobs as jobs_db
from tests.conftest import count_queries, make_conf
from tests.support import binds, inventory


@contextlib.contextmanager
def transactions(db) -> Iterator[list[str]]:  # type: ignore[no-untyped-def]
    """The first statement of each transaction begun on ``db`` inside the block."""
    begun: list[str] = []
    opened: set[int] = set()

    def on_begin(conn) -> None:  # type: ignore[no-untyped-def]
        opened.add(id(conn))

    def on_statement(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        if id(conn) in opened and not statement.lstrip().upper().startswith(
                ("BEGIN", "PRAGMA", "SET")):
            opened.discard(id(conn))
            begun.append(" ".join(statement.split())[:80])

    event.listen(db.engine, "begin", on_begin)
    event.listen(db.engine, "before_cursor_execute", on_statement)
    try:
        yield begun
    finally:
        event.remove(db.engine, "begin", on_begin)
        event.remove(db.engine, "before_cursor_execute", on_statement)


def _claimed(conf, db, group: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    fpga = inventory.add_fpga(db, hostname="reads-node", handles=1)
    [(_instance, [arq])] = binds.request_binds(
        conf, db, [("reads-node", fpga["deployable"]["rp_uuid"])], group=group)
    (job,) = jobs_db.claim(db, jobs_db.PENDING, "reads-token", 16, 60)
    return arq, job


def test_a_bind_that_programs_nothing_goes_from_claim_to_bind_transaction(db, tmp_path):
    conf = make_conf(str(tmp_path))
    arq, job = _claimed(conf, db)
    worker = BindWorker(conf, db, notifier=binds.RecordingNotifier())
    with transactions(db) as begun:
        assert worker._bind(job, "reads-token") is True
    assert len(begun) == 1, begun  # the bind's own, which locks the ARQ first
    assert begun[0].startswith("SELECT accelerator_requests.id")
    assert binds.arq_state(db, arq)[0] == "Bound"


def test_a_group_that_names_an_image_is_still_read_before_the_bind(db, tmp_path):
    """The programming check is not skipped for a group that asks for it: it reads the
    ARQ and (the target refused by Placement here) plans no program."""
    conf = make_conf(str(tmp_path))
    _arq, job = _claimed(conf, db, group={"accel:bitstream_id": "image-1"})
    worker = BindWorker(conf, db, notifier=binds.RecordingNotifier())
    group = {"resources:FPGA": "1", "accel:bitstream_id": "image-1"}
    with transactions(db) as begun:
        verdict = worker.programming.before(db, job.arq_id, placement_refused=True,
                                            group=group)
    assert len(begun) == 1
    assert verdict is not None and verdict.image_id is None


def test_a_pass_says_whether_its_claims_left_jobs_due(db, tmp_path):
    """The worker thread passes again only while a claim saw more due than it took: after
    the last instance's bind, not once more (two empty claims per bind)."""
    conf = make_conf(str(tmp_path))
    targets = []
    for host in ("pass-a", "pass-b"):
        fpga = inventory.add_fpga(db, hostname=host, handles=1)
        targets.append((host, fpga["deployable"]["rp_uuid"]))
    made = binds.request_binds(conf, db, targets)
    worker = BindWorker(conf, db, notifier=binds.RecordingNotifier())
    assert worker.run_pass() == (1, True)  # one instance bound, the other still due
    assert worker.run_pass() == (1, False)
    assert worker.run_pass() == (0, False)
    assert [binds.arq_state(db, arqs[0])[0] for _, arqs in made] == ["Bound", "Bound"]


def test_a_patch_that_only_binds_runs_no_unbind_statement(db, tmp_path):
    """The PATCH's write transaction (SQLite's one write lock) drops bind jobs once, for
    the ARQs it binds; its empty unbind half runs nothing."""
    conf = make_conf(str(tmp_path))
    fpga = inventory.add_fpga(db, hostname="patch-node", handles=1)
    with count_queries(db) as statements:
        binds.request_binds(conf, db, [("patch-node", fpga["deployable"]["rp_uuid"])])
    dropped = [s for s in statements if s.lstrip().upper().startswith("DELETE FROM BIND_JOBS")]
    assert len(dropped) == 1, dropped


def test_the_nova_event_of_a_bind_leaves_without_reading_its_outcome_again(db, tmp_path):
    """After the bind transaction, only the fence's read (is the claim still ours, by the
    database's clock) comes before Nova: the outcome is what that transaction committed."""
    conf = make_conf(str(tmp_path))
    fpga = inventory.add_fpga(db, hostname="event-node", handles=1)
    [(_instance, [arq])] = binds.request_binds(conf, db, [("event-node",
                                                            fpga["deployable"]["rp_uuid"])])
    notifier = binds.RecordingNotifier()
    worker = BindWorker(conf, db, notifier=notifier)
    seen: list[list[str]] = []
    worker.on_notify_read = lambda job_ids: seen.append(list(begun))
    with transactions(db) as begun:
        assert worker.run_once() == 1
    [before_nova] = seen
    assert before_nova[-1].startswith("SELECT accelerator_requests.id")  # the bind's
    fence = begun[len(before_nova)]
    assert fence.startswith("SELECT bind_jobs.id, bind_jobs.lease_expires_at"), begun
    assert [(e.arq_uuid, e.status) for e in notifier.sent] == [(arq, "completed")]


def test_a_claim_of_pending_jobs_is_one_transaction(db, tmp_path):
    """Pending jobs are claimed in one write transaction, without a read first (a wake
    follows jobs made due); notify jobs are looked for with a read, which finds none
    here and takes no write transaction."""
    conf = make_conf(str(tmp_path))
    fpga = inventory.add_fpga(db, hostname="claim-node", handles=1)
    binds.request_binds(conf, db, [("claim-node", fpga["deployable"]["rp_uuid"])])
    with transactions(db) as begun:
        claimed, more = jobs_db.claim_and_peek(db, jobs_db.PENDING, "one-tx", 16, 60)
    assert len(claimed) == 1 and not more
    assert len(begun) == 1, begun
    with transactions(db) as begun:
        assert jobs_db.claim_and_peek(db, jobs_db.NOTIFY, "one-tx-n", 16, 60) == ([], False)
    assert len(begun) == 1 and begun[0].startswith("SELECT EXISTS"), begun
