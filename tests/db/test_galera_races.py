"""Races with more than one writer: acceld's API on two nodes of a real three-node MariaDB
Galera cluster (tests.support.galera), no HAProxy between, each with its own engine.

Galera replicates rows, not locks: ``GET_LOCK`` taken on node 1 is invisible on node 2,
and ``SELECT ... FOR UPDATE`` locks only on the node that runs it; a conflicting write from
another node is found at commit by certification and rolled back with error 1213. What
keeps these races exact is a row both sides write (certification lets one commit) and a
retry of the loser as a whole transaction.
"""

from __future__ import annotations

import logging
import threading
import uuid
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from falcon import testing
from sqlalchemy import func, select

from acceld.api import arq_limits
from acceld.api.app import build_app
from acceld.db import migrate
from acceld.db.engine import Database
from acceld.db.models import accelerator_requests, device_profiles
from tests.conftest import make_conf
from tests.helpers import ADMIN, member
from tests.support.interleave import DEADLINE

URL = "/accelerator/v2/accelerator_requests"
DP_URL = "/accelerator/v2/device_profiles"


@pytest.fixture
def two_writers(galera_cluster):  # type: ignore[no-untyped-def]
    """A fresh database on the cluster, one engine on node 1 and one on node 2."""
    name = galera_cluster.create_database()
    first = Database(galera_cluster.nodes[0].url(name))
    migrate.upgrade(first)
    second = Database(galera_cluster.nodes[1].url(name))
    galera_cluster.wait_synced()
    try:
        yield first, second
    finally:
        first.dispose()
        second.dispose()


def _clients(tmp_path, dbs, cap: int) -> list[testing.TestClient]:
    conf = make_conf(str(tmp_path), quota__arqs_per_project=cap)
    clients = [testing.TestClient(build_app(conf, db)) for db in dbs]
    made = clients[0].simulate_post(DP_URL, headers=ADMIN, json=[
        {"name": "one", "groups": [{"resources:FPGA": "1"}]}])
    assert made.status_code == 201, made.text
    # Galera applies another node's commit asynchronously: wait until node 2 has it.
    deadline = time.monotonic() + DEADLINE
    while not _visible(dbs[1], device_profiles):
        assert time.monotonic() < deadline, "the profile never reached node 2"
        time.sleep(0.05)
    return clients


def _visible(db, table) -> bool:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one() > 0


def _count(db, project: str) -> int:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(accelerator_requests).where(
            accelerator_requests.c.project_id == project)).scalar_one()


def test_quota_counted_on_two_nodes_at_once_is_not_overshot(tmp_path, two_writers,
                                                           monkeypatch):
    """Forced: the create on node 1 has counted the project's ARQs (0 of 1) and waits; the
    create on node 2 counts and commits meanwhile. Node 1's create must then not insert
    a second ARQ on its stale count: it is refused (403), having run again from the start."""
    first_db, second_db = two_writers
    one, two = _clients(tmp_path, two_writers, cap=1)
    counted, other_done = threading.Event(), threading.Event()
    original = arq_limits.db.count_for_project

    def count_then_wait(conn, project_id):  # type: ignore[no-untyped-def]
        usage = original(conn, project_id)
        if threading.current_thread().name == "node1-create" and not counted.is_set():
            counted.set()
            other_done.wait(DEADLINE)
        return usage

    monkeypatch.setattr(arq_limits.db, "count_for_project", count_then_wait)
    results = {}

    def create_on_node1() -> None:
        results["node1"] = one.simulate_post(URL, json={"device_profile_name": "one"},
                                             headers=member("p"))

    t = threading.Thread(target=create_on_node1, name="node1-create")
    t.start()
    try:
        assert counted.wait(DEADLINE)
        results["node2"] = two.simulate_post(URL, json={"device_profile_name": "one"},
                                             headers=member("p"))
    finally:
        other_done.set()
        t.join(DEADLINE)
    assert results["node2"].status_code == 201, results["node2"].text
    assert results["node1"].status_code == 403, results["node1"].text
    assert _count(first_db, "p") == 1


@pytest.mark.parametrize("cap,creates", [(1, 20), (10, 40)])
def test_quota_race_on_two_nodes_is_exact(tmp_path, two_writers, cap, creates, caplog):
    """``creates`` concurrent creates for one project, alternating between the nodes: exactly
    ``cap`` are made (201), every other one is 403, and no ERROR is logged."""
    first_db, _ = two_writers
    clients = _clients(tmp_path, two_writers, cap=cap)

    def create(i: int) -> int:
        return clients[i % 2].simulate_post(URL, json={"device_profile_name": "one"},
                                            headers=member("p")).status_code

    with caplog.at_level(logging.INFO), ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(create, range(creates)))
    assert sorted(set(codes)) <= [201, 403], codes
    assert codes.count(201) == cap, codes
    assert _count(first_db, "p") == cap
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert not any(r.exc_info for r in caplog.records if r.name.startswith("acceld"))


def test_binds_for_the_last_handles_on_two_nodes_stay_exact(tmp_path, two_writers, caplog):
    """60 binds for 16 handles, bind workers on node 1 and node 2 (6 each, one job at a
    time): exactly 16 Bound, each on its own handle, 44 BindFailed, nothing left behind;
    the losers of certification are retried and logged without an ERROR or a traceback."""
    from acceld.conductor.binding.worker import BindWorker
    from tests.db import test_bind_races as races

    first_db, second_db = two_writers
    conf = make_conf(str(tmp_path))
    races._start_binds(conf, first_db)
    _wait_for(second_db, accelerator_requests, races.BINDS)
    failures: list[BaseException] = []

    def work(db) -> None:  # type: ignore[no-untyped-def]
        worker = BindWorker(conf, db, batch=1)
        try:
            for _ in range(400):
                if not worker.run_once() and not worker_due(db):
                    return
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    with caplog.at_level(logging.INFO):
        threads = [threading.Thread(target=work, args=(db,))
                   for db in (first_db, second_db) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    assert failures == []
    galera_sync(first_db)
    races._check_totals(first_db)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    assert not any(r.exc_info for r in caplog.records if r.name.startswith("acceld"))


def worker_due(db) -> bool:  # type: ignore[no-untyped-def]
    """Whether bind jobs remain (a job lost to a conflict is due again shortly)."""
    from acceld.db.models import bind_jobs

    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(bind_jobs)).scalar_one() > 0


def galera_sync(db) -> None:  # type: ignore[no-untyped-def]
    """Make ``db``'s next reads wait for every commit the cluster has ordered."""
    with db.engine.connect() as conn:
        conn.exec_driver_sql("SET SESSION wsrep_sync_wait = 1")
        conn.exec_driver_sql("SELECT 1")
        conn.exec_driver_sql("SET SESSION wsrep_sync_wait = 0")


def _wait_for(db, table, rows: int) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + DEADLINE
    while True:
        with db.read() as conn:
            if conn.execute(select(func.count()).select_from(table)).scalar_one() >= rows:
                return
        assert time.monotonic() < deadline, f"{table.name} never reached node 2"
        time.sleep(0.05)


def test_haproxy_takes_a_node_that_is_not_synced_out(galera_cluster):
    """The kolla-style HAProxy: node 1 takes the connections; desynced (wsrep_local_state
    2, as a donor is) its check fails and the first backup takes them; synced again, node 1
    is back."""
    node1 = galera_cluster.nodes[0]
    assert galera_cluster.active_server() == "node1"
    conn = node1.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET GLOBAL wsrep_desync = ON")
        _until(lambda: galera_cluster.server_states().get("node1", "").startswith("DOWN"))
        assert galera_cluster.active_server() == "node2"
    finally:
        with conn.cursor() as cur:
            cur.execute("SET GLOBAL wsrep_desync = OFF")
        conn.close()
    _until(lambda: galera_cluster.active_server() == "node1")


def _until(condition) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, "HAProxy never changed its server"
        time.sleep(0.1)


@pytest.mark.parametrize("first", ["claim", "nova"])
def test_last_handle_claim_against_nova_bind_on_two_nodes(tmp_path, two_writers, monkeypatch,
                                                          caplog, first):
    """The last handle, a standalone claim's bind and a Nova bind, bound on different nodes.
    Forced: the first side's bind (node 1) has taken the handle and waits before its
    commit; the second's (node 2) is not held back (row locks are per node) and commits.
    The first's commit then loses certification: rolled back whole, one WARNING, tried
    again, BindFailed saying why. Nobody was told of the lost attempt: Nova hears of its
    own ARQ's outcome only, once."""
    from acceld.conductor.binding.worker import BindWorker
    from acceld.db.models import attach_handles, claim_consumers
    from tests.db import test_claim_races as claims
    from tests.support.binds import RecordingNotifier

    node1_db, node2_db = two_writers
    conf = make_conf(str(tmp_path))
    sides = claims.set_up(conf, node1_db)
    galera_sync(node2_db)
    second = "nova" if first == "claim" else "claim"
    notifier = RecordingNotifier()
    gate = claims.pause_after_taking_a_handle(monkeypatch, "first")
    results: dict[str, object] = {}

    def run(side: str, db) -> bool:  # type: ignore[no-untyped-def]
        worker = BindWorker(conf, db, notifier=notifier)
        _, job = sides[side]
        done = worker._bind(job, claims.TOKEN)
        worker._notify([job.id], claims.TOKEN)
        return done

    with caplog.at_level(logging.INFO):
        thread = threading.Thread(target=lambda: results.update(first=run(first, node1_db)),
                                  name="first", daemon=True)
        thread.start()
        gate.wait_reached()
        assert run(second, node2_db) is True  # not held back by node 1's row lock
        assert notifier.sent == [] or second == "nova"
        gate.open()
        thread.join(DEADLINE)
        assert results["first"] is False  # lost at commit: nothing of it kept
        worker = BindWorker(conf, node1_db, notifier=notifier)
        deadline = time.monotonic() + DEADLINE
        while claims.outcome(node1_db, sides[first][0]).state == "BindStarted":
            assert time.monotonic() < deadline, "the lost bind was never tried again"
            worker.run_once()
            time.sleep(0.05)
    galera_sync(node1_db)
    winner = claims.outcome(node1_db, sides[second][0])
    loser = claims.outcome(node1_db, sides[first][0])
    assert winner.state == "Bound" and winner.attach_handle_id is not None
    assert loser.state == "BindFailed" and loser.attach_handle_id is None
    assert loser.bind_failure_reason == (
        f"no free attach handle on deployable {claims.HOST}_FakeDevice: all are in use")
    with node1_db.read() as conn:
        in_use = conn.scalar(select(func.count()).select_from(attach_handles).where(
            attach_handles.c.in_use.is_(True)))
        due = conn.scalar(select(claim_consumers.c.due))
    assert in_use == 1
    assert [(s.server_uuid, s.arq_uuid, s.status) for s in notifier.sent] == [
        (sides["instance"], sides["nova"][0], "completed" if second == "nova" else "failed")]
    assert due is (second == "nova")  # a losing claim's allocation is written again
    assert any("lost a write conflict" in r.getMessage() for r in caplog.records)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_reads_on_another_node_wait_for_its_commits_when_asked(galera_cluster, two_writers):
    """The documented knob for a reader that must see another node's latest commit (a
    release read right after the bind that freed it): ``init_command`` in the connection
    URL sets ``wsrep_sync_wait`` on every connection of the engine; each of 20 rows
    committed on node 1 is then read at once on node 2."""
    from acceld.db.models import device_profiles

    first_db, second_db = two_writers
    url = second_db.engine.url.update_query_dict(
        {"init_command": "SET SESSION wsrep_sync_wait = 1"})
    waiting = Database(url.render_as_string(hide_password=False))
    try:
        with waiting.read() as conn:
            assert conn.exec_driver_sql("SELECT @@wsrep_sync_wait").scalar() == 1
        for i in range(20):
            with first_db.write() as conn:
                conn.execute(device_profiles.insert().values(
                    name=f"p{i}", uuid=str(uuid.uuid4()), profile_json="[]"))
            with waiting.read() as conn:
                names = set(conn.execute(select(device_profiles.c.name)).scalars())
            assert f"p{i}" in names
    finally:
        waiting.dispose()
