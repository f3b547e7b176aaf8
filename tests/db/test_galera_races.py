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
