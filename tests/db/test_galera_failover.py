"""The writer node killed under binds, through the kolla-style HAProxy (one active node,
two backups): acceld's API and two bind workers (two conductors) reach a real three-node
Galera cluster only through HAProxy; node 1, the one taking every write, is killed with
SIGKILL while Nova's binds are being made. Every ARQ ends Bound or BindFailed saying why,
no handle is shared, no client gets a 500 (a 503 with Retry-After during the switch is
what the docs promise), the outage is logged once each way, and the killed node rejoins
(state transfer) with the same rows as the others.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from falcon import testing
from sqlalchemy import func, select

from acceld.api.app import build_app
from acceld.conductor.binding.worker import BindWorker
from acceld.db import migrate
from acceld.db.engine import Database
from acceld.db.models import accelerator_requests, attach_handles, bind_jobs
from tests.conftest import make_conf
from tests.helpers import ADMIN, SERVICE
from tests.support import inventory

ARQS = "/accelerator/v2/accelerator_requests"
HANDLES = 8
BINDS = 24
BATCH = 4
HOST = "failover-node"


def _send(client, method: str, path: str, json, codes: list) -> object:  # type: ignore[no-untyped-def]
    """Nova's call, repeated while it is answered 503 (with Retry-After) during the switch."""
    deadline = time.monotonic() + 90
    while True:
        resp = client.simulate_request(method, path, json=json, headers=SERVICE)
        codes.append(resp.status_code)
        if resp.status_code != 503:
            return resp
        assert resp.headers.get("Retry-After"), resp.text
        assert time.monotonic() < deadline, "still 503 after 90 s"
        time.sleep(0.2)


@pytest.fixture
def vip_db(galera_cluster):  # type: ignore[no-untyped-def]
    name = galera_cluster.create_database()
    first = Database(galera_cluster.nodes[0].url(name))
    migrate.upgrade(first)
    first.dispose()
    galera_cluster.wait_synced()
    dbs = [Database(galera_cluster.vip_url(name)) for _ in range(3)]  # API, 2 conductors
    try:
        yield name, dbs
    finally:
        for db in dbs:
            db.dispose()
        node1 = galera_cluster.nodes[0]
        if node1.proc is None or node1.proc.poll() is not None:
            galera_cluster.start_node(node1)  # leave the cluster whole for later tests


def test_writer_killed_during_binds(tmp_path, galera_cluster, vip_db, caplog):
    name, (api_db, *conductor_dbs) = vip_db
    conf = make_conf(str(tmp_path), conductor__bind_delay_for_tests=0.05)
    client = testing.TestClient(build_app(conf, api_db))
    fpga = inventory.add_fpga(api_db, hostname=HOST, handles=HANDLES)
    codes: list[int] = []
    assert _send(client, "POST", "/accelerator/v2/device_profiles",
                 [{"name": "one", "groups": [{"resources:FPGA": "1"}]}], codes).status_code == 201
    uuids = []
    for _ in range(BINDS):
        made = _send(client, "POST", ARQS, {"device_profile_name": "one"}, codes)
        assert made.status_code == 201, made.text
        uuids.append(made.json["arqs"][0]["uuid"])
    stop = threading.Event()
    failures: list[BaseException] = []

    def conduct(db) -> None:  # type: ignore[no-untyped-def]
        worker = BindWorker(conf, db, batch=1)
        try:
            while not stop.is_set():
                if not worker.run_once():
                    time.sleep(0.05)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    with caplog.at_level(logging.INFO):
        workers = [threading.Thread(target=conduct, args=(db,)) for db in conductor_dbs]
        for w in workers:
            w.start()
        try:
            for start in range(0, BINDS, BATCH):
                body = {u: [{"op": "add", "path": "/hostname", "value": HOST},
                            {"op": "add", "path": "/device_rp_uuid",
                             "value": fpga["deployable"]["rp_uuid"]},
                            {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())}]
                        for u in uuids[start:start + BATCH]}
                resp = _send(client, "PATCH", ARQS, body, codes)
                assert resp.status_code == 202, resp.text
                if start == BATCH:  # binds of the first batches under way: kill the writer
                    galera_cluster.kill_node(galera_cluster.nodes[0])
            deadline = time.monotonic() + 120
            while _jobs_left(api_db):
                assert time.monotonic() < deadline, "bind jobs left after 120 s"
                time.sleep(0.2)
        finally:
            stop.set()
            for w in workers:
                w.join(timeout=60)
    assert failures == []
    assert 500 not in codes and set(codes) <= {201, 202, 503}, codes
    with api_db.read() as conn:
        rows = conn.execute(select(accelerator_requests.c.state,
                                   accelerator_requests.c.attach_handle_id,
                                   accelerator_requests.c.bind_failure_reason)).all()
        in_use = set(conn.execute(select(attach_handles.c.id).where(
            attach_handles.c.in_use == True)).scalars())  # noqa: E712
    states = [r.state for r in rows]
    bound = [r.attach_handle_id for r in rows if r.state == "Bound"]
    assert set(states) <= {"Bound", "BindFailed"}, states
    assert len(bound) == len(set(bound)) == HANDLES  # 24 binds for 8 handles: all taken
    assert in_use == set(bound)
    assert all(r.bind_failure_reason for r in rows if r.state == "BindFailed")
    down = [r for r in caplog.records if "The database is unavailable" in r.getMessage()]
    back = [r for r in caplog.records if "The database is available again" in r.getMessage()]
    # Each engine (the API's, each conductor's: one process each in a deployment) logs the
    # outage once when it starts and once when it ends.
    lines = [r.getMessage() for r in down + back]
    assert sum("the API answers 503" in m for m in lines) <= 1, lines
    assert sum("binds resume" in m for m in lines) <= len(conductor_dbs), lines
    assert len(back) == len(down), lines
    assert not any(db.outage.is_down for db in (api_db, *conductor_dbs))
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    # The killed node rejoins by state transfer and holds the same rows as the others.
    node1 = galera_cluster.nodes[0]
    galera_cluster.start_node(node1)
    galera_cluster.wait_synced()
    assert len({_checksum(n, name) for n in galera_cluster.nodes}) == 1


def _jobs_left(db) -> int:  # type: ignore[no-untyped-def]
    try:
        with db.read() as conn:
            return conn.execute(select(func.count()).select_from(bind_jobs)).scalar_one()
    except Exception:  # noqa: BLE001 - the switch: ask again
        return 1


def _checksum(node, database: str) -> tuple:  # type: ignore[no-untyped-def]
    conn = node.connect(database=database)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION wsrep_sync_wait = 1")
            cur.execute("CHECKSUM TABLE accelerator_requests, attach_handles, bind_jobs")
            return tuple(row[1] for row in cur.fetchall())
    finally:
        conn.close()
