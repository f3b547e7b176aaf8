"""Binds racing for attach handles never share one, on SQLite, PostgreSQL and MariaDB.

60 ARQs are bound at once to one deployable with 16 handles; 12 threads, each
its own conductor worker claiming one job at a time, complete them in
parallel (plus a second phase where every thread runs its bind transaction at
the same instant). Exactly 16 end Bound, each on its own handle; the other 44
end BindFailed; nothing stays BindStarted and no handle leaks.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from falcon import testing
from sqlalchemy import func, select

from acceld.api.app import build_app
from acceld.conductor.binding.worker import BindWorker
from acceld.db import bind_jobs as jobs_db
from acceld.db.engine import Database
from acceld.db.models import accelerator_requests, attach_handles, bind_jobs
from tests.conftest import BACKENDS, make_conf
from tests.helpers import ADMIN, SERVICE
from tests.support import inventory
from tests.support.databases import private_database

ARQS = "/accelerator/v2/accelerator_requests"
HANDLES = 16
BINDS = 60
THREADS = 12


@pytest.fixture(params=BACKENDS)
def race_db(request, tmp_path):
    with private_database(request.param, tmp_path) as url:
        db = Database(url, pool_size=THREADS + 2, max_overflow=4)
        yield db
        db.dispose()


def _start_binds(conf, db) -> list[str]:
    fpga = inventory.add_fpga(db, hostname="race-node", handles=HANDLES)
    client = testing.TestClient(build_app(conf, db))
    assert client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
        {"name": "race", "groups": [{"resources:FPGA": str(BINDS)}]}]).status_code == 201
    arqs = client.simulate_post(ARQS, json={"device_profile_name": "race"},
                                headers=ADMIN).json["arqs"]
    assert len(arqs) == BINDS
    body = {a["uuid"]: [
        {"op": "add", "path": "/hostname", "value": "race-node"},
        {"op": "add", "path": "/device_rp_uuid", "value": fpga["deployable"]["rp_uuid"]},
        {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())}] for a in arqs}
    assert client.simulate_patch(ARQS, json=body, headers=SERVICE).status_code == 202
    return [a["uuid"] for a in arqs]


def _check_totals(db) -> None:
    with db.read() as conn:
        states = dict(conn.execute(select(accelerator_requests.c.state, func.count()).group_by(
            accelerator_requests.c.state)).all())
        shared = conn.execute(select(accelerator_requests.c.attach_handle_id).where(
            accelerator_requests.c.attach_handle_id.is_not(None)).group_by(
            accelerator_requests.c.attach_handle_id).having(func.count() > 1)).all()
        bound_handles = set(conn.execute(select(accelerator_requests.c.attach_handle_id).where(
            accelerator_requests.c.state == "Bound")).scalars())
        in_use = set(conn.execute(select(attach_handles.c.id).where(
            attach_handles.c.in_use == True)).scalars())  # noqa: E712
        reasons = set(conn.execute(select(accelerator_requests.c.bind_failure_reason).where(
            accelerator_requests.c.state == "BindFailed")).scalars())
        jobs_left = conn.execute(select(func.count()).select_from(bind_jobs)).scalar_one()
    assert states == {"Bound": HANDLES, "BindFailed": BINDS - HANDLES}
    assert shared == []
    assert None not in bound_handles and len(bound_handles) == HANDLES
    assert in_use == bound_handles
    assert len(reasons) == 1 and "no free attach handle" in reasons.pop()
    assert jobs_left == 0


def test_workers_race_for_sixteen_handles(race_db, tmp_path):
    conf = make_conf(str(tmp_path))
    _start_binds(conf, race_db)
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def work() -> None:
        worker = BindWorker(conf, race_db, batch=1)
        try:
            barrier.wait()
            while worker.run_once():
                pass
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    _check_totals(race_db)


def test_bind_transactions_start_together(race_db, tmp_path):
    """Every job claimed first, then all bind transactions released at one barrier."""
    conf = make_conf(str(tmp_path))
    _start_binds(conf, race_db)
    token = "race-claim"
    claimed = []  # a claim takes one instance's jobs: each ARQ here is its own instance's
    while batch := jobs_db.claim(race_db, jobs_db.PENDING, token, BINDS, 120):
        claimed += batch
    assert len(claimed) == BINDS
    shares = [claimed[i::THREADS] for i in range(THREADS)]
    barrier = threading.Barrier(THREADS)
    results: list[bool] = []
    errors: list[BaseException] = []

    def work(jobs) -> None:  # type: ignore[no-untyped-def]
        worker = BindWorker(conf, race_db)
        try:
            barrier.wait()
            for job in jobs:
                results.append(worker._bind(job, token))
            worker._notify([j.id for j in jobs], token)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(share,)) for share in shares]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert results.count(True) == BINDS
    _check_totals(race_db)
