"""Fence keys that survive rediscovery and restores (issue 37 items 6 and 7), on SQLite,
PostgreSQL and MariaDB.

The agent keys its fence by the handle's uuid, and an mdev handle's uuid is derived from its
slot (uuid5): a handle removed and discovered again is the same key. So is a deployable. Its
token must therefore never go back for that key:

* a host retired and registered again: its new rows start above every token the old rows
  could have taken (the database's clock at the insert, in milliseconds, shifted left by
  20 bits), so the first bind of a used mdev is admitted, and a release claimed by a
  conductor that stalled across the re-registration is refused;
* a database restored from a backup: its tokens are below what the agents accepted. The
  first call the agent refuses for that reason (the row's token is below the agent's floor,
  so no newer claim exists) raises the row's token to the floor, logs what happened, and is
  retried at once: binds, releases and programs go on.

The agent is the production one (tests/db/test_fencing.py's FencedNode).
"""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import delete, insert, select, update

from acceld.conductor.binding.handle_release import ReleaseWorker
from acceld.conductor.binding.worker import BindWorker
from acceld.conductor.programming import Programmer
from acceld.db import fences, host_retire, inventory
from acceld.db.models import (accelerator_requests, agents, attach_handles, bind_jobs,
                              deployables)
from acceld.db.models import handle_releases as releases_table
from tests.db.test_fencing import IMAGE, FencedNode, _dep_uuid, run_binds
from tests.unit.test_attach_handles import HOST, SECRET


@pytest.fixture
def node(tmp_path, db):
    built = FencedNode(tmp_path, db)
    built.start_agent()
    yield built
    built.stop_agent()


def used_once(node: FencedNode) -> str:
    """Bind, unbind and release the mdev: the agent's floor for its handle is above 0."""
    first = node.bind()
    [mdev] = node.prepared()
    node.unbind(first)
    assert node.release_all() == 1 and node.prepared() == set()
    return mdev


def retire_and_register_again(node: FencedNode) -> None:
    """``acceld host delete --force``, then the agent's next hello registers the host anew."""
    host_retire.retire(node.db, HOST, force=True)
    endpoint = node.agent.url[len("http://"):]
    with node.db.write() as conn:
        inventory.reconcile_node(conn, HOST, node.fake.discover())
        conn.execute(insert(agents).values(hostname=HOST, endpoint=endpoint, state="up",
                                           heartbeat_interval=10))


def tokens(node: FencedNode) -> tuple[list[int], list[int]]:
    with node.db.read() as conn:
        return (list(conn.execute(select(attach_handles.c.fence_token)).scalars()),
                list(conn.execute(select(deployables.c.fence_token)).scalars()))


def test_a_used_mdev_binds_at_once_after_its_host_is_registered_again(node):
    mdev = used_once(node)
    retire_and_register_again(node)
    arq = node.bind()  # one pass of the worker
    assert node.arq(arq)["state"] == "Bound", node.arq(arq)
    assert node.prepared() == {mdev}


def test_a_release_stalled_across_the_reregistration_is_refused(node):
    """A claims the release of the first instance's mdev and stalls at the agent call; the
    host is retired, registered again, and a new instance binds the same mdev (same slot,
    same uuid). A resumes: the agent refuses it, the new instance keeps its mdev."""
    first = node.bind()
    [mdev] = node.prepared()
    node.unbind(first)
    stalled = ReleaseWorker(node.conf, node.db)
    real_release = stalled.client.release
    later: dict[str, str] = {}

    def stall_then_resume(hostname, body):  # type: ignore[no-untyped-def]
        retire_and_register_again(node)
        later["arq"] = node.bind()
        assert node.arq(later["arq"])["state"] == "Bound" and node.prepared() == {mdev}
        return real_release(hostname, body)  # A resumes its call

    stalled.client.release = stall_then_resume
    assert stalled.run_once() == 1
    assert node.prepared() == {mdev}, "the stale release removed the new instance's mdev"
    assert node.arq(later["arq"])["state"] == "Bound"
    assert node.releases_logged() == 0


TABLES = (deployables, attach_handles, accelerator_requests, bind_jobs, releases_table)


def backup(node: FencedNode) -> dict:
    """What a backup of the database holds of the node's inventory, ARQs and queues."""
    with node.db.read() as conn:
        return {table: {row.id: dict(row._mapping) for row in conn.execute(select(table))}
                for table in TABLES}


def restore(node: FencedNode, saved: dict) -> None:
    """The database as the backup had it: rows made since are gone, rows deleted since are
    back, every other row has its values of then (its tokens included)."""
    with node.db.write() as conn:
        for table in reversed(TABLES):  # children first
            conn.execute(delete(table).where(table.c.id.not_in(list(saved[table]) or [0])))
        for table in TABLES:  # parents first
            present = set(conn.execute(select(table.c.id)).scalars())
            for row_id, row in saved[table].items():
                if row_id in present:
                    conn.execute(update(table).where(table.c.id == row_id).values(
                        {k: v for k, v in row.items() if k != "id"}))
                else:
                    conn.execute(insert(table).values(row))


def behind_lines(caplog) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.getMessage() for r in caplog.records
            if r.name == "acceld.conductor.fencing" and "raised to" in r.getMessage()]


def test_releases_programs_and_binds_go_on_after_a_restore(node, caplog):
    """The backup holds a Bound ARQ. Since: it was unbound and released, the device was
    programmed twice and bound again. Restored: the ARQ is unbound again, its release is
    refused once (the database is behind), caught up and sent again; a program is caught
    up likewise; a new bind needs nothing. Each row is caught up once, with a WARNING."""
    programmer = Programmer(node.conf, node.db, SECRET)
    first = node.bind()
    [mdev] = node.prepared()
    saved = backup(node)
    node.unbind(first)
    assert node.release_all() == 1 and node.prepared() == set()
    for _ in range(2):
        assert programmer.program(_dep_uuid(node), "bitstream", image_id=IMAGE) == IMAGE
    node.bind()
    assert node.prepared() == {mdev}
    restore(node, saved)
    assert node.arq(first)["state"] == "Bound"
    assert tokens(node) == ([row["fence_token"] for row in saved[attach_handles].values()],
                            [row["fence_token"] for row in saved[deployables].values()])
    with caplog.at_level(logging.WARNING):
        node.unbind(first)
        assert node.release_all() == 1  # refused, caught up, due again at once
        assert node.release_all() == 1 and node.prepared() == set()
        assert programmer.program(_dep_uuid(node), "bitstream", image_id=IMAGE) == IMAGE
        arq = node.bind()
        assert node.arq(arq)["state"] == "Bound" and node.prepared() == {mdev}
    behind = behind_lines(caplog)
    assert len(behind) == 2, behind  # the handle's and the deployable's, once each
    assert any("attach handle" in line for line in behind)
    assert any("deployable" in line for line in behind)


def test_a_bind_goes_on_after_a_restore(node, caplog):
    """The backup holds no ARQ; since, the mdev was bound, unbound and released. Restored:
    the first bind's prepare is refused, caught up and tried again at once: Bound in one
    pass of the worker, not BindFailed minutes later."""
    saved = backup(node)
    used_once(node)
    restore(node, saved)
    with caplog.at_level(logging.WARNING):
        arq = node.bind()
    assert node.arq(arq)["state"] == "Bound", node.arq(arq)
    assert len(node.prepared()) == 1
    assert len(behind_lines(caplog)) == 1


def test_a_stalled_claim_is_still_fenced_when_the_database_is_not_behind(node, caplog):
    """The resync only ever raises a token that is below the agent's floor: a stale prepare
    refused because a newer claim (recorded in the database) acted is not retried."""
    arq = node.start_bind()
    stalled = BindWorker(node.conf, node.db)
    real_prepare = stalled.attach.prepare

    def stall_then_resume(hostname, body):  # type: ignore[no-untyped-def]
        with node.db.write() as conn:
            conn.execute(update(bind_jobs).values(lease_expires_at=None))
        run_binds(node)
        node.unbind(arq)
        assert node.release_all() == 1 and node.prepared() == set()
        return real_prepare(hostname, body)

    stalled.attach.prepare = stall_then_resume
    [initial], _ = tokens(node)
    with caplog.at_level(logging.INFO):
        run_binds(node, stalled)
    assert node.prepared() == set() and node.arq(arq)["state"] == "Unbound"
    # A's prepare, the later try's, the release: no token but the claims' own.
    assert tokens(node)[0] == [initial + 3]
    assert behind_lines(caplog) == []
    assert [r for r in caplog.records if "fenced; left to the newer claim" in r.getMessage()]


def test_a_floor_beyond_every_token_handed_out_is_not_believed(node):
    """A compromised node names the column's end as its floor: the row is not raised (its
    next claim would overflow BIGINT); a floor a real claim could have reached is."""
    with node.db.read() as conn:
        handle_id, token = conn.execute(select(attach_handles.c.id,
                                               attach_handles.c.fence_token)).one()
    with node.db.write() as conn:
        assert fences.catch_up(conn, attach_handles, handle_id, 2 ** 63 - 1) is None
        assert fences.catch_up(conn, attach_handles, handle_id, token + 5) == token
    assert tokens(node)[0] == [token + 5]


def test_a_new_handle_row_starts_above_the_old_rows_tokens(node):
    used_once(node)
    [old], _ = tokens(node)
    retire_and_register_again(node)
    [new], _ = tokens(node)
    assert new > old + (1 << fences.EPOCH_BITS)
