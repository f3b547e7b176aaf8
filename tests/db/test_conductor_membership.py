"""Conductor membership and the ring on every backend: who is live (by the database's clock),
a clean stop and a death rebalancing the hosts, and the ring composing with the claims that
make each unit of work happen once, with a conductor dying between claiming and finishing.

Deaths are forced, not waited for: a dead conductor's heartbeat (and its claim) is moved
into the past by the database's own clock.
"""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select, update

from acceld.conductor.binding.handle_release import ReleaseWorker
from acceld.conductor.fleet.hashring import HashRing
from acceld.conductor.fleet.membership import Membership, dead_after
from acceld.db import conductors as conductors_db
from acceld.db import handle_releases
from acceld.db.clock import sql_now
from acceld.db.models import attach_handles, conductors
from acceld.db.models import handle_releases as releases_table
from tests.unit.test_attach_handles import HOST, Node

DEAD_AFTER = 10.0


@pytest.fixture
def ring_conf(conf):
    conf.set_override("member_dead_after", DEAD_AFTER, group="conductor")
    conf.set_override("member_heartbeat_interval", 1.0, group="conductor")
    return conf


def silence(db, name: str, seconds: float) -> None:
    """``name``'s last heartbeat was ``seconds`` ago, by the database's clock (it died)."""
    with db.write() as conn:
        conn.execute(update(conductors).where(conductors.c.name == name).values(
            heartbeat_at=sql_now(db.backend, -seconds)))


def owner_of(host: str, members: list[str], want: str) -> list[str]:
    """``members`` with ``want`` renamed (want-0, want-1, ...) until the ring gives it
    ``host``: a deterministic pick, so a test knows which conductor owns the host."""
    for i in range(100):
        name = f"{want}-{i}"
        if HashRing([name, *members]).owner(host) == name:
            return [name, *members]
    raise AssertionError("no name found")


def test_conductors_join_and_see_each_other(db, ring_conf):
    a = Membership(ring_conf, db, "cond-a", "http://127.0.0.1:1")
    b = Membership(ring_conf, db, "cond-b")
    a.join()
    b.join()
    a.beat()
    assert a.ring.members == b.ring.members == {"cond-a", "cond-b"}
    hosts = [f"compute-{i}" for i in range(200)]
    assert all(a.owns(h) != b.owns(h) for h in hosts)  # each host has exactly one owner
    assert {m.name: m.url for m in conductors_db.members(db)} == {
        "cond-a": "http://127.0.0.1:1", "cond-b": None}


def test_a_dead_conductor_is_dropped_once_silent_past_the_bound_and_its_hosts_move(
        db, ring_conf, caplog):
    a = Membership(ring_conf, db, "cond-a")
    b = Membership(ring_conf, db, "cond-b")
    a.join()
    b.join()
    a.beat()
    hosts = [f"compute-{i}" for i in range(200)]
    a_hosts = {h for h in hosts if a.owns(h)}
    assert a_hosts and len(a_hosts) < len(hosts)
    silence(db, "cond-a", DEAD_AFTER - 2)  # late, within the bound: still a member
    b.beat()
    assert b.ring.members == {"cond-a", "cond-b"}
    silence(db, "cond-a", DEAD_AFTER + 1)  # past it: dropped at b's next beat
    with caplog.at_level("INFO", logger="acceld.conductor.fleet.membership"):
        b.beat()
    assert b.ring.members == {"cond-b"}
    assert all(b.owns(h) for h in hosts)  # a's hosts moved to b
    assert any("gone: cond-a" in r.getMessage() for r in caplog.records)
    # A dead conductor's row counts for nothing; far past the bound a peer deletes it.
    assert "cond-a" in {m.name for m in conductors_db.members(db)}
    silence(db, "cond-a", DEAD_AFTER * conductors_db.PRUNE_FACTOR + 1)
    b.beat()
    assert {m.name for m in conductors_db.members(db)} == {"cond-b"}


def test_a_clean_stop_leaves_the_ring_at_once_and_for_good(db, ring_conf):
    a = Membership(ring_conf, db, "cond-a")
    b = Membership(ring_conf, db, "cond-b")
    a.join()
    b.join()
    a.leave()
    b.beat()
    assert b.ring.members == {"cond-b"}  # at b's next beat, not after the bound
    a.beat()  # a pass of a's heartbeat still in flight after the stop
    assert {m.name for m in conductors_db.members(db)} == {"cond-b"}


def test_a_joining_conductor_takes_its_share_at_the_others_next_beat(db, ring_conf):
    a = Membership(ring_conf, db, "cond-a")
    a.join()
    hosts = [f"compute-{i}" for i in range(200)]
    assert all(a.owns(h) for h in hosts)
    b = Membership(ring_conf, db, "cond-b")
    b.join()
    a.beat()
    assert {h for h in hosts if not a.owns(h)} == {h for h in hosts if b.owns(h)} != set()


def test_the_bound_is_at_least_two_heartbeats(conf):
    conf.set_override("member_heartbeat_interval", 5.0, group="conductor")
    conf.set_override("member_dead_after", 1.0, group="conductor")
    assert dead_after(conf) == 10.0


# -- ring = who tries, claims = who may: a release across a conductor's death ----------------

@pytest.fixture
def node(tmp_path, db):
    built = Node(tmp_path, db)
    built.start_agent()
    yield built
    built.stop_agent()


class Died(Exception):
    """The conductor process is gone (raised where a kill would land)."""


def queued_release(node: Node) -> int:
    """Bind then unbind an mdev ARQ: its handle's release is queued; the handle's id."""
    arq = node.bind()
    node.unbind(arq)
    (row,) = node.queue()
    return row.attach_handle_id


def releases_on_the_node(node: Node) -> int:
    return sum(1 for step, _ in node.fake.attach_state().get("log", []) if step == "release")


def test_a_conductor_dying_between_claiming_and_finishing_a_release(db, node, ring_conf):
    names = owner_of(HOST, ["cond-b"], "cond-a")
    a = Membership(ring_conf, db, names[0])
    b = Membership(ring_conf, db, "cond-b")
    a.join()
    b.join()
    assert a.owns(HOST) and not b.owns(HOST)
    handle = queued_release(node)
    worker_a, worker_b = ReleaseWorker(node.conf, db), ReleaseWorker(node.conf, db)
    worker_a.ownership, worker_b.ownership = a, b
    assert worker_b.run_once() == 0  # due, but a's host: b does not try it

    def die(hostname, body):  # type: ignore[no-untyped-def]
        raise Died()

    worker_a.client.release = die  # type: ignore[method-assign]
    with pytest.raises(Died):
        worker_a.run_once()  # claimed, then killed before the agent heard anything
    silence(db, a.name, DEAD_AFTER + 1)
    b.beat()
    assert b.owns(HOST)
    assert worker_b.run_once() == 0  # b owns the host now, but a's claim is still live
    with db.write() as conn:  # the claim lapses (by the database's clock)
        conn.execute(update(releases_table).values(lease_expires_at=sql_now(db.backend, -1)))
    assert worker_b.run_once() == 1
    assert releases_on_the_node(node) == 1
    assert node.queue() == []
    with db.read() as conn:
        assert conn.execute(select(attach_handles.c.in_use).where(
            attach_handles.c.id == handle)).scalar_one() is False


def test_a_frozen_conductor_that_wakes_after_its_hosts_moved_finishes_nothing_twice(
        db, node, ring_conf):
    names = owner_of(HOST, ["cond-b"], "cond-a")
    a = Membership(ring_conf, db, names[0])
    b = Membership(ring_conf, db, "cond-b")
    a.join()
    b.join()
    handle = queued_release(node)
    worker_a, worker_b = ReleaseWorker(node.conf, db), ReleaseWorker(node.conf, db)
    worker_a.ownership, worker_b.ownership = a, b
    released, go = threading.Event(), threading.Event()
    real_release = worker_a.client.release

    def frozen_after_the_agent_call(hostname, body):  # type: ignore[no-untyped-def]
        real_release(hostname, body)
        released.set()
        go.wait(30)  # SIGSTOP between the agent's answer and the finish

    worker_a.client.release = frozen_after_the_agent_call  # type: ignore[method-assign]
    thread = threading.Thread(target=worker_a.run_once)
    thread.start()
    try:
        assert released.wait(30)
        silence(db, a.name, DEAD_AFTER + 1)
        b.beat()
        with db.write() as conn:
            conn.execute(update(releases_table).values(
                lease_expires_at=sql_now(db.backend, -1)))
        assert worker_b.run_once() == 1  # b takes the lapsed claim and finishes it
    finally:
        go.set()
        thread.join(30)
    # a's late finish was refused: the handle was freed once, by b, and the row is gone.
    assert node.queue() == []
    with db.read() as conn:
        assert conn.execute(select(attach_handles.c.in_use).where(
            attach_handles.c.id == handle)).scalar_one() is False
        assert handle_releases.pending(conn) == []
    assert releases_on_the_node(node) == 2  # the agent's release is idempotent


def test_status_lists_the_conductors_and_the_hosts_the_ring_gives_each(db, ring_conf):
    from acceld.cmd.node import format_conductors

    for name in ("cond-a", "cond-b", "cond-c"):
        Membership(ring_conf, db, name, f"http://{name}:6667").join()
    silence(db, "cond-c", DEAD_AFTER + 1)
    hosts = [f"compute-{i}" for i in range(100)]
    text = format_conductors(conductors_db.members(db), DEAD_AFTER, hosts)
    rows = {line.split()[0]: line.split() for line in text.splitlines()[3:]}
    assert rows["cond-c"][1] == "gone" and rows["cond-c"][4] == "-"
    ring = HashRing(["cond-a", "cond-b"])
    for name in ("cond-a", "cond-b"):
        assert rows[name][1] == "live"
        assert int(rows[name][4]) == sum(ring.owner(h) == name for h in hosts) > 0
        assert rows[name][5] == f"http://{name}:6667"
    assert rows["cond-a"][3] == "0s"  # never flushed: its heartbeat stands for it
    with db.write() as conn:  # cond-b wrote what it heard 40 s ago (its flushes stalled)
        conn.execute(update(conductors).where(conductors.c.name == "cond-b").values(
            heard_through=sql_now(db.backend, -40)))
    text = format_conductors(conductors_db.members(db), DEAD_AFTER, hosts)
    rows = {line.split()[0]: line.split() for line in text.splitlines()[3:]}
    assert 39 <= int(rows["cond-b"][3].rstrip("s")) <= 45, rows["cond-b"]
    assert format_conductors([], DEAD_AFTER, hosts) == ""
