"""Host steps never leak (issue 11 item 7): a prepare that lost its bind is undone.

Two ways an mdev prepared by a bind could outlive every handle that accounts for it:

* a release overtakes the prepare: the ARQ is unbound while the prepare is on its way, the
  queued release runs on the host first (nothing to remove yet) and frees the handle, then
  the prepare creates the mdev;
* a prepare succeeds, the conductor dies before recording it, and the later tries of the
  same bind fail (agent unreachable, driver error): the handle was freed as if the host had
  nothing.

Each interleaving is forced with hooks at the exact point (no sleeps), on SQLite,
PostgreSQL and MariaDB (the ``db`` fixture), with the fake driver's simulated mdevs behind
the agent's real attach routes (``tests/unit/test_attach_handles.Node``).
"""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select, update

from acceld.conductor.binding.attach_client import AttachError
from acceld.conductor.binding.worker import BindWorker
from acceld.conductor.binding.handle_release import ReleaseWorker
from acceld.db import handle_releases
from acceld.db.models import attach_handles, bind_jobs
from tests.support.interleave import Background
from tests.unit.test_attach_handles import Node, after_bind_timeout, mdev_uuid


class Died(BaseException):
    """The conductor process is killed here (not an Exception: nothing in it catches it)."""


@pytest.fixture
def node(tmp_path, db):
    built = Node(tmp_path, db, handles=1)
    built.start_agent()
    yield built
    built.stop_agent()


def expire_bind_leases(node: Node) -> None:
    with node.db.write() as conn:
        conn.execute(update(bind_jobs).values(lease_expires_at=None, lease_owner=None))


def run_binds(node: Node, worker: BindWorker | None = None) -> None:
    worker = worker or BindWorker(node.conf, node.db)
    while worker.run_once():
        pass


def assert_clean(node: Node) -> None:
    """No mdev on the host, no handle in use, nothing queued."""
    assert node.prepared() == set()
    assert node.in_use() == [] and node.queue() == []


@pytest.mark.parametrize("answer", ["prepared", "timed out"])
def test_release_that_overtakes_the_prepare_is_followed_by_an_undo(node, answer):
    """unbind -> release on the host -> handle freed -> the prepare creates the mdev (and
    answers, or its answer is lost to [conductor] attach_timeout)."""
    worker = BindWorker(node.conf, node.db)
    real_prepare = worker.attach.prepare
    arq_uuid = node.start_bind()

    def prepare_after_the_release(hostname, body):
        node.unbind(arq_uuid)
        assert node.release_all() == 1  # the host had nothing yet: released, handle freed
        assert node.in_use() == [] and node.queue() == []
        done = real_prepare(hostname, body)  # ... and now the mdev is created
        if answer == "timed out":
            raise AttachError(502, "did not prepare within 30 s", unknown=True)
        return done

    worker.attach.prepare = prepare_after_the_release
    run_binds(node, worker)
    assert node.arq(arq_uuid)["state"] == "Unbound"
    [leftover] = node.prepared()
    # The mdev is not forgotten: its handle is held and queued for release...
    [held] = node.in_use()
    assert mdev_uuid(held) == leftover
    assert len(node.queue()) == 1
    # ... so no other bind can take it before the host is clean ...
    assert node.arq(node.bind())["state"] == "BindFailed"
    node.make_due()
    assert node.release_all() == 1
    assert_clean(node)
    assert node.fake.attach_state()["log"][-1] == ["release", leftover]


def test_prepare_landing_while_the_release_is_finishing_rearms_the_release(node):
    """The release ran on the host and is about to free the handle when the prepare lands:
    the release is run again, and its first finish frees nothing."""
    worker = BindWorker(node.conf, node.db)
    real_prepare = worker.attach.prepare
    releaser = ReleaseWorker(node.conf, node.db)
    real_release = releaser.client.release
    on_host, settled = threading.Event(), threading.Event()
    arq_uuid = node.start_bind()
    outcome: dict[str, object] = {}

    def release_then_wait(hostname, body):
        real_release(hostname, body)
        on_host.set()  # the host step is undone; finish() has not committed yet
        assert settled.wait(30)

    releaser.client.release = release_then_wait

    def run_release():
        try:
            outcome["taken"] = releaser.run_once()
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            outcome["error"] = exc
            on_host.set()

    thread = threading.Thread(target=run_release)

    def prepare_during_the_release(hostname, body):
        node.unbind(arq_uuid)
        thread.start()
        assert on_host.wait(30)
        return real_prepare(hostname, body)

    worker.attach.prepare = prepare_during_the_release
    try:
        run_binds(node, worker)
    finally:
        settled.set()
        if thread.ident is not None:
            thread.join(30)
    assert "error" not in outcome, outcome
    assert node.arq(arq_uuid)["state"] == "Unbound"
    [leftover] = node.prepared()
    assert len(node.in_use()) == 1  # the overtaken release did not free it
    [row] = node.queue()
    assert row.lease_owner is None  # due again at once
    assert node.release_all() == 1
    assert_clean(node)
    assert node.fake.attach_state()["log"][-1] == ["release", leftover]


def _prepare_then_die(node: Node) -> tuple[str, str]:
    """A bind whose prepare succeeded on the host, by a conductor killed before it recorded
    that; returns (ARQ uuid, mdev uuid)."""
    worker = BindWorker(node.conf, node.db)
    real_prepare = worker.attach.prepare

    def prepare_and_die(hostname, body):
        real_prepare(hostname, body)
        raise Died

    worker.attach.prepare = prepare_and_die
    arq_uuid = node.start_bind()
    with pytest.raises(Died):
        run_binds(node, worker)
    [mdev] = node.prepared()
    [held] = node.in_use()
    assert mdev_uuid(held) == mdev
    assert node.arq(arq_uuid)["state"] == "BindStarted"
    return arq_uuid, mdev


def test_prepared_before_a_crash_then_the_driver_fails_the_retry(node):
    arq_uuid, mdev = _prepare_then_die(node)
    node.write_spec(handles=1, fail=["prepare"])
    expire_bind_leases(node)
    run_binds(node)
    arq = node.arq(arq_uuid)
    assert arq["state"] == "BindFailed" and "simulated failure to prepare" in \
        arq["bind_failure_reason"]
    assert node.prepared() == {mdev}
    # The earlier try's mdev is still on the host: the handle waits for its release.
    assert len(node.in_use()) == 1 and len(node.queue()) == 1
    node.write_spec(handles=1)
    assert node.release_all() == 1
    assert_clean(node)


def test_prepared_before_a_crash_then_the_agent_stays_unreachable(node):
    arq_uuid, mdev = _prepare_then_die(node)
    node.stop_agent()
    expire_bind_leases(node)
    run_binds(node)  # the outage is waited out, the handle still held
    assert node.arq(arq_uuid)["state"] == "BindStarted" and len(node.in_use()) == 1
    expire_bind_leases(node)
    run_binds(node, after_bind_timeout(node))  # ... until [conductor] bind_timeout
    arq = node.arq(arq_uuid)
    assert arq["state"] == "BindFailed" and "could not be reached" in arq["bind_failure_reason"]
    assert node.prepared() == {mdev}
    assert len(node.in_use()) == 1 and len(node.queue()) == 1
    node.start_agent()
    assert node.release_all() == 1
    assert_clean(node)


def test_a_first_prepare_refused_by_the_driver_still_frees_at_once(node):
    """No earlier try held the handle: a driver's failed prepare leaves nothing, so no
    release is needed (unchanged)."""
    node.write_spec(handles=1, fail=["prepare"])
    arq = node.arq(node.bind())
    assert arq["state"] == "BindFailed"
    assert_clean(node)


def test_release_finishing_while_the_prepare_is_reclaimed_never_deadlocks(node):
    """The bind's reclaim holds the handle (its first lock) when the release worker finishes
    the same handle. A finish that took the release row first and then waited for the
    handle would close a lock cycle with the reclaim (handle, then release row): one of them
    would die as a deadlock victim. Both lock the handle first, so the finish waits, then
    finds its claim void (the release is re-armed) and frees nothing."""
    arq_uuid = node.bind()
    [held] = node.in_use()
    node.unbind(arq_uuid)
    [claimed] = handle_releases.claim(node.db, "release-claim", 1, 60)
    with node.db.write() as conn:
        conn.execute(select(attach_handles.c.id).where(
            attach_handles.c.id == claimed.attach_handle_id).with_for_update())
        finishing = Background(node.db, lambda: handle_releases.finish(
            node.db, claimed.id, claimed.attach_handle_id, "release-claim"), "finish")
        assert finishing.finished_or_blocked() == "blocked"
        assert handle_releases.reclaim(conn, claimed.attach_handle_id) == "rearmed"
    assert finishing.join() is False
    [row] = node.queue()
    assert row.lease_owner is None and row.lease_expires_at is None  # due again at once
    assert node.in_use() == [held]
    assert node.release_all() == 1
    assert_clean(node)
