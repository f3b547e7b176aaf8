"""Kill -9 the conductor in the middle of a batch of binds; after a restart every ARQ resolves.

A real ``acceld conductor`` process works on its own database (a SQLite file,
and PostgreSQL / MariaDB when configured). ``[conductor] bind_delay_for_tests``
slows each bind a little so the kill lands while jobs are claimed but not all
done; the test checks that it did. The restarted conductor re-claims the jobs
once their leases expire: every ARQ ends Bound or BindFailed, none stays
BindStarted, no handle leaks, and Nova hears about every ARQ.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
from falcon import testing
from sqlalchemy import func, select

from acceld.api.app import build_app
from acceld.db.engine import Database
from acceld.db.models import accelerator_requests as arqs
from acceld.db.models import attach_handles, bind_jobs
from tests.conftest import BACKENDS, make_conf
from tests.helpers import ADMIN, SERVICE
from tests.support import inventory
from tests.support.databases import private_database
from tests.support.nova import RecordingNova
from tests.support.net import free_port

pytestmark = pytest.mark.integration

URL = "/accelerator/v2/accelerator_requests"
HANDLES = 20
BINDS = 40
LEASE = 5


class ConductorProcess:
    def __init__(self, config_file: str, port: int, log_path: str) -> None:
        self.argv = [sys.executable, "-m", "acceld.cmd.main", "conductor", "--config-file",
                     config_file, "--port", str(port)]
        self.port = port
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ConductorProcess":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"conductor did not start:\n{self.log()}")

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def log(self) -> str:
        with open(self.log_path, errors="replace") as handle:
            return handle.read()[-4000:]


@pytest.fixture
def recorder():
    server = RecordingNova().start()
    yield server
    server.stop()


@pytest.fixture(params=BACKENDS)
def crash_db_url(request, tmp_path):
    with private_database(request.param, tmp_path) as url:
        yield url


def _states(db: Database) -> dict[str, int]:
    with db.read() as conn:
        return dict(conn.execute(select(arqs.c.state, func.count()).group_by(arqs.c.state)).all())


def _leased_pending(db: Database) -> int:
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(bind_jobs).where(
            bind_jobs.c.phase == "pending", bind_jobs.c.lease_owner.is_not(None))).scalar_one()


def _write_config(tmp_path, url: str, port: int, nova_url: str) -> str:
    path = tmp_path / "conductor.conf"
    path.write_text(f"""[DEFAULT]
state_path = {tmp_path}
[database]
connection = {url}
[internal]
shared_secret = crash-test-secret-{uuid.uuid4().hex}
[conductor]
host_ip = 127.0.0.1
port = {port}
bind_lease_seconds = {LEASE}
bind_delay_for_tests = 0.06
bind_poll_interval = 0.2
bind_workers = 2
[nova]
auth_type = none
endpoint_override = {nova_url}
retry_initial_delay = 0.05
""")
    return str(path)


def test_kill_9_mid_batch_then_restart(crash_db_url, tmp_path, recorder):
    db = Database(crash_db_url)
    fpga = inventory.add_fpga(db, hostname="crash-node", handles=HANDLES)
    client = testing.TestClient(build_app(make_conf(str(tmp_path)), db))
    assert client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
        {"name": "crash", "groups": [{"resources:FPGA": str(BINDS)}]}]).status_code == 201
    created = client.simulate_post(URL, json={"device_profile_name": "crash"},
                                   headers=ADMIN).json["arqs"]
    instance = str(uuid.uuid4())
    body = {a["uuid"]: [
        {"op": "add", "path": "/hostname", "value": "crash-node"},
        {"op": "add", "path": "/device_rp_uuid", "value": fpga["deployable"]["rp_uuid"]},
        {"op": "add", "path": "/instance_uuid", "value": instance}] for a in created}
    assert client.simulate_patch(URL, json=body, headers=SERVICE).status_code == 202

    port = free_port()
    config = _write_config(tmp_path, crash_db_url, port, recorder.url)
    conductor = ConductorProcess(config, port, str(tmp_path / "conductor.log"))
    try:
        conductor.start()
        deadline = time.monotonic() + 30
        while _states(db).get("Bound", 0) < 5:
            assert time.monotonic() < deadline, conductor.log()
            time.sleep(0.01)
        conductor.kill9()
        # The kill landed mid-batch: binds left undone, some of them claimed by the dead one.
        states = _states(db)
        assert states.get("BindStarted", 0) > 0, states
        assert _leased_pending(db) > 0
        killed_at = time.monotonic()

        conductor = ConductorProcess(config, port, str(tmp_path / "conductor.log")).start()
        deadline = time.monotonic() + LEASE + 40
        while _states(db).get("BindStarted", 0) or _job_count(db):
            assert time.monotonic() < deadline, (_states(db), conductor.log())
            time.sleep(0.1)
        # The dead conductor's claims waited for their lease to expire, no longer.
        assert time.monotonic() - killed_at < LEASE + 40
    finally:
        conductor.stop()

    assert _states(db) == {"Bound": HANDLES, "BindFailed": BINDS - HANDLES}
    with db.read() as conn:
        bound = list(conn.execute(select(arqs.c.attach_handle_id).where(
            arqs.c.state == "Bound")).scalars())
        in_use = set(conn.execute(select(attach_handles.c.id).where(
            attach_handles.c.in_use == True)).scalars())  # noqa: E712
    assert len(set(bound)) == len(bound) == HANDLES
    assert in_use == set(bound)
    # Nova heard about every ARQ (at least once: a kill between send and job delete repeats).
    final = {a["uuid"]: a["state"] for a in client.simulate_get(URL, headers=ADMIN).json["arqs"]}
    heard = {}
    for event in recorder.wait_for_events(BINDS):
        heard[event["tag"]] = event["status"]
    assert set(heard) == set(final)
    for arq_uuid, status in heard.items():
        assert status == ("completed" if final[arq_uuid] == "Bound" else "failed")
    db.dispose()


def _job_count(db: Database) -> int:
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(bind_jobs)).scalar_one()
