"""A bind that programs nothing opens no transaction between its claim and its bind.

The claim reads each job's profile group (acceld.db.bind_jobs.claim_and_peek), so the
worker knows without a read of its own that the group asks no programming
(acceld.conductor.bind_programming): one transaction fewer on the path from PATCH to
Bound. A group that names an image is still read and checked before the bind.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from sqlalchemy import event

from acceld.conductor.binding import BindWorker
from acceld.db import bind_jobs as jobs_db
from tests.conftest import make_conf
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
