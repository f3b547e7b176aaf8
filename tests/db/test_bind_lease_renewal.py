"""A bind job's lease is renewed while its conductor works on it.

A claim's work can outlast ``[conductor] bind_lease_seconds`` (a batch of
binds worked one at a time, a program of up to ``program_timeout``). Before
renewal existed, the lease lapsed mid-bind: another worker claimed the same
job, did the work again (programming the device twice), and the job's attempts
ran up until the bind was abandoned although no conductor had died.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid

from falcon import testing
from sqlalchemy import select

from acceld.api.app import build_app
from acceld.conductor.binding.worker import BindingComponent
from acceld.db import bind_jobs as jobs_db
from acceld.db.models import accelerator_requests, bind_jobs, utcnow
from tests.conftest import make_conf
from tests.helpers import ADMIN, SERVICE
from tests.support import inventory

ARQS = "/accelerator/v2/accelerator_requests"


def _start_binds(conf, db, count: int) -> list[str]:  # type: ignore[no-untyped-def]
    fpga = inventory.add_fpga(db, hostname="lease-node", handles=count)
    client = testing.TestClient(build_app(conf, db))
    assert client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
        {"name": "lease", "groups": [{"resources:FPGA": str(count)}]}]).status_code == 201
    arqs = client.simulate_post(ARQS, json={"device_profile_name": "lease"},
                                headers=ADMIN).json["arqs"]
    body = {a["uuid"]: [
        {"op": "add", "path": "/hostname", "value": "lease-node"},
        {"op": "add", "path": "/device_rp_uuid", "value": fpga["deployable"]["rp_uuid"]},
        {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())}] for a in arqs}
    assert client.simulate_patch(ARQS, json=body, headers=SERVICE).status_code == 202
    return [a["uuid"] for a in arqs]


def _leases(db) -> dict[int, tuple[str | None, dt.datetime | None]]:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return {r.id: (r.lease_owner, r.lease_expires_at) for r in conn.execute(
            select(bind_jobs.c.id, bind_jobs.c.lease_owner, bind_jobs.c.lease_expires_at))}


def test_renew_extends_only_the_given_claims(db, tmp_path) -> None:
    conf = make_conf(str(tmp_path))
    _start_binds(conf, db, 2)
    mine = jobs_db.claim(db, jobs_db.PENDING, "token-a", 1, 5)
    assert len(mine) == 1
    assert jobs_db.renew(db, ["token-a"], 600) == 1
    leases = _leases(db)
    owner, expires = leases[mine[0].id]
    assert owner == "token-a" and expires > utcnow() + dt.timedelta(seconds=500)
    other = [job_id for job_id in leases if job_id != mine[0].id]
    assert [leases[i] for i in other] == [(None, None)]  # unclaimed: untouched
    assert jobs_db.renew(db, ["token-b"], 600) == 0  # a token that holds nothing
    assert jobs_db.renew(db, [], 600) == 0
    jobs_db.retry_later(db, [mine[0].id], "token-a", 0)
    assert jobs_db.renew(db, ["token-a"], 600) == 0  # a lease given up is not taken back


def test_a_bind_slower_than_its_lease_is_not_claimed_twice(sqlite_db, tmp_path) -> None:
    conf = make_conf(str(tmp_path), conductor__bind_lease_seconds=5,
                     conductor__bind_delay_for_tests=6.5)
    [arq_uuid] = _start_binds(conf, sqlite_db, 1)
    component = BindingComponent(conf, sqlite_db)
    [renew] = [t for t in component.periodic_tasks() if t.name == "bind-lease-renew"]
    assert renew.interval < conf.conductor.bind_lease_seconds
    stop = threading.Event()

    def renewer() -> None:  # what the conductor's periodic loop does
        while not stop.wait(renew.interval):
            renew.run()

    worker = threading.Thread(target=component.worker.run_once)
    renewing = threading.Thread(target=renewer)
    worker.start()
    renewing.start()
    try:
        time.sleep(5.6)  # past the first lease, while the bind is still in progress
        stolen = jobs_db.claim(sqlite_db, jobs_db.PENDING, "another-conductor", 16, 5)
        assert stolen == [], "a job still being worked on was claimed a second time"
        worker.join(timeout=30)
        assert not worker.is_alive()
    finally:
        stop.set()
        renewing.join(timeout=10)
    with sqlite_db.read() as conn:
        state = conn.execute(select(accelerator_requests.c.state).where(
            accelerator_requests.c.uuid == arq_uuid)).scalar_one()
        left = conn.execute(select(bind_jobs.c.id)).all()
    assert state == "Bound"
    assert left == []  # notified (no Nova configured) and dropped
