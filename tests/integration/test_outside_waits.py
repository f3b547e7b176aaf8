"""A request that waits on something outside the API worker stops that request only: the
version document and /healthcheck of the same worker (``[api] workers = 1``) answer within
1 s meanwhile, and the waiting request ends in a bounded, truthful answer.

- Keystone that accepts and never answers (tests.support.stalling), while a request's
  token is being validated by keystonemiddleware: the validation ran inside the serving
  slot, so the whole worker waited with it.
- A table lock another transaction holds on PostgreSQL and MariaDB (a migration run
  under live services): the request's statement waited inside the slot, for as long as
  the lock was held; now the statement loses the slot, and ``[api]
  database_lock_timeout`` ends it with 503 and Retry-After.

Interleavings are forced on what the other side saw (the peer's ``requested`` event, the
server's own view of a session waiting for a lock), never on sleeps.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests
from sqlalchemy import text

from acceld.db import migrate
from acceld.db.engine import Database
from tests.support import api_process
from tests.support.net import free_port
from tests.support.stalling import StallingPeer

pytestmark = pytest.mark.integration

LOCK_TIMEOUT = 3  # [api] database_lock_timeout in these tests, seconds


def _conf(state: Path, port: int, db_url: str, extra: str = "") -> str:
    return (f"[DEFAULT]\nstate_path = {state}\nlog_file = {state}/api.log\n{extra}"
            f"[database]\nconnection = {db_url}\n"
            f"[internal]\nshared_secret = internal-secret-for-the-outside-wait-tests\n"
            f"[api]\nhost_ip = 127.0.0.1\nport = {port}\nworkers = 1\nthreads = 4\n"
            f"database_lock_timeout = {LOCK_TIMEOUT}\n")


def _answers_within_a_second(base: str) -> None:
    for path in ("/accelerator/v2", "/healthcheck"):
        started = time.monotonic()
        resp = requests.get(base + path, timeout=1.0)
        assert resp.status_code == 200, (path, resp.status_code, resp.text[:300])
        assert time.monotonic() - started < 1.0, path


def _in_thread(call) -> tuple[threading.Thread, list]:  # type: ignore[no-untyped-def]
    out: list = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # noqa: BLE001 - the test reads it
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


# ------------------------------------------------------------------------ Keystone hung

@pytest.fixture
def keystone_api(tmp_path) -> Iterator[tuple[str, StallingPeer]]:
    peer = StallingPeer("silent").start()
    db_url = f"sqlite:///{tmp_path}/acceld.sqlite"
    db = Database(db_url)
    migrate.upgrade(db)
    db.dispose()
    port = free_port()
    authtoken = (f"[keystone_authtoken]\nwww_authenticate_uri = {peer.url}/v3\n"
                 f"auth_url = {peer.url}/v3\nauth_type = password\nusername = cyborg\n"
                 f"password = secret\nuser_domain_id = default\nproject_name = service\n"
                 f"project_domain_id = default\nhttp_connect_timeout = 120\n")
    conf = _conf(tmp_path, port, db_url, "auth_strategy = keystone\n") + authtoken
    try:
        with api_process.running(tmp_path, conf, port) as base:
            yield base, peer
    finally:
        peer.stop()


def test_a_hung_keystone_holds_the_validating_request_not_the_worker(keystone_api):
    base, keystone = keystone_api
    thread, answers = _in_thread(lambda: requests.get(
        base + "/accelerator/v2/accelerator_requests",
        headers={"X-Auth-Token": "a-token-keystone-never-rules-on"}, timeout=60))
    assert keystone.requested.wait(10), "keystonemiddleware never called Keystone"
    _answers_within_a_second(base)
    _answers_within_a_second(base)  # and again: the worker did not just get lucky once
    keystone.stop()  # Keystone goes away: the request ends, truthfully
    thread.join(30)
    assert not thread.is_alive()
    assert isinstance(answers[0], requests.Response), answers
    assert answers[0].status_code == 503, answers[0].text


# ------------------------------------------------------------------ a held database lock

# What the server shows while a session waits for a lock: on MariaDB, a statement of the
# request running in this database (the lock's holder is idle, and nothing else runs there).
_WAITING = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                  "AND wait_event_type = 'Lock'",
    "mysql": "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() "
             "AND command = 'Query' AND id <> CONNECTION_ID() "
             "AND (info LIKE 'INSERT%' OR info LIKE 'DELETE%')",
}
_LOCK = {  # the other transaction's lock
    ("postgresql", "table"): "LOCK TABLE device_profiles IN ACCESS EXCLUSIVE MODE",
    ("mysql", "table"): "LOCK TABLES device_profiles WRITE",
    ("postgresql", "row"): "SELECT id FROM device_profiles WHERE name = 'held' FOR UPDATE",
    ("mysql", "row"): "SELECT id FROM device_profiles WHERE name = 'held' FOR UPDATE",
}


def _wait_until_blocked(db: Database) -> None:
    """Until the server shows a session waiting for a lock (polled: the server's state)."""
    query = _WAITING[db.backend]
    deadline = time.monotonic() + 15
    with db.engine.connect() as conn:
        while conn.execute(text(query)).scalar() == 0:
            conn.rollback()
            assert time.monotonic() < deadline, "no request ever waited for the lock"
            time.sleep(0.02)


@pytest.mark.parametrize("kind", ["table", "row"])
def test_a_held_lock_holds_the_waiting_request_not_the_worker(db, tmp_path, kind):
    """A table lock (a migration's) held while a profile is created; a row lock held while
    that row's profile is deleted."""
    if db.backend == "sqlite":
        pytest.skip("SQLite's write lock: tests/unit/test_sqlite_write_lock_slot.py")
    port = free_port()
    url = db.url.render_as_string(hide_password=False)
    profiles = "/accelerator/v2/device_profiles"
    with api_process.running(tmp_path, _conf(tmp_path, port, url), port) as base:
        made = requests.post(base + profiles, timeout=30,
                             json=[{"name": "held", "groups": [{"resources:FPGA": "1"}]}])
        assert made.status_code == 201, made.text
        holder = db.engine.connect()
        try:
            holder.execute(text(_LOCK[(db.backend, kind)]))
            started = time.monotonic()
            thread, answers = _in_thread(
                (lambda: requests.post(base + profiles, timeout=60, json=[
                    {"name": "waits", "groups": [{"resources:FPGA": "1"}]}]))
                if kind == "table" else
                (lambda: requests.delete(base + profiles + "/held", timeout=60)))
            _wait_until_blocked(db)
            _answers_within_a_second(base)
            _answers_within_a_second(base)
            thread.join(LOCK_TIMEOUT + 10)
            assert not thread.is_alive(), "the request waited past [api] database_lock_timeout"
            took = time.monotonic() - started
        finally:
            if db.backend == "mysql" and kind == "table":
                holder.execute(text("UNLOCK TABLES"))
            holder.rollback()
            holder.close()
    resp = answers[0]
    assert isinstance(resp, requests.Response), answers
    assert resp.status_code == 503, resp.text
    assert resp.headers["Retry-After"]
    assert "lock held by another transaction" in resp.text
    assert LOCK_TIMEOUT <= took < LOCK_TIMEOUT + 5
    with db.read() as conn:  # nothing of it was kept
        names = conn.execute(text("SELECT name FROM device_profiles")).scalars().all()
    assert names == ["held"]
