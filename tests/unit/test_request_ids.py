"""Request ids in process: the API's ids and access line, the global id a bind job keeps
and sends to Nova, and the id internal calls carry to the conductor and agents."""

from __future__ import annotations

import logging
import uuid
from typing import Iterator

import pytest
from falcon import testing
from sqlalchemy import select

from acceld import logs, request_ids
from acceld.api.app import build_app, wsgi_app
from acceld.clients.internal import InternalClient
from acceld.conductor.binding.worker import BindWorker
from acceld.db.models import bind_jobs
from acceld.internal import auth
from acceld.internal.server import InternalServer, build_app as internal_app, respond
from tests.conftest import make_conf
from tests.helpers import ADMIN, SERVICE
from tests.support import inventory
from tests.support.nova import RecordingNova

ARQS = "/accelerator/v2/accelerator_requests"
# Fixed: parameter ids built from it must match in every collecting process (pytest-xdist).
GLOBAL_ID = "req-7e0a4c83-69c7-447c-9f47-b39d4e17c539"
SECRET = b"s" * 32


@pytest.fixture
def log_file(tmp_path) -> Iterator:
    """This process logs as a service does, to a file the test reads."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    path = tmp_path / "service.log"
    logs.setup(make_conf(str(tmp_path), log_file=str(path)), "test")

    def read() -> str:
        for handler in logging.getLogger().handlers:
            handler.flush()
        return path.read_text()

    yield read
    for handler in root.handlers:
        if handler not in saved[0]:
            handler.close()
    root.handlers[:], level = saved
    root.setLevel(level)


@pytest.fixture
def recorder() -> Iterator[RecordingNova]:
    server = RecordingNova().start()
    yield server
    server.stop()


def _header(headers: dict[str, str]) -> str | None:
    return {k.lower(): v for k, v in headers.items()}.get("x-openstack-request-id")


# ------------------------------------------------------------------------------- the API

def test_access_line_per_request(tmp_path, sqlite_db, log_file):
    client = testing.TestClient(wsgi_app(make_conf(str(tmp_path)), sqlite_db))
    resp = client.simulate_get("/accelerator/v2/device_profiles", query_string="name=x",
                               headers={**ADMIN, "X-OpenStack-Request-Id": GLOBAL_ID})
    local_id = resp.headers["X-OpenStack-Request-Id"]
    assert resp.status_code == 200 and local_id != GLOBAL_ID
    missing = client.simulate_get(f"/accelerator/v2/device_profiles/{uuid.uuid4()}",
                                  headers=ADMIN)
    assert missing.status_code == 404
    lines = [line for line in log_file().splitlines() if "acceld.api.access" in line]
    assert len(lines) == 2, lines
    first, second = lines
    assert f"[{GLOBAL_ID} {local_id} admin-user admin-project " in first
    assert '"GET /accelerator/v2/device_profiles?name=x" status: 200 ' in first
    assert f" len: {len(resp.content)} time: " in first
    assert f"[None {missing.headers['X-OpenStack-Request-Id']} " in second
    assert " status: 404 " in second and f" len: {len(missing.content)} " in second
    assert request_ids.current() is None  # the thread's context ended with the request


@pytest.mark.parametrize("header", [
    "bogus", "49326a8a-1734-432b-b82b-2f9bcd458642", GLOBAL_ID.upper(), GLOBAL_ID + "0", GLOBAL_ID + "\nforged",
    "req-" + "0" * 36,
])
def test_a_malformed_global_id_is_ignored(tmp_path, sqlite_db, header):
    """oslo.middleware's rule: ``req-<uuid>`` in lower case or nothing; the API then passes
    on its own request id."""
    client = testing.TestClient(build_app(make_conf(str(tmp_path)), sqlite_db))
    arq = _bindable(client, sqlite_db)
    resp = client.simulate_patch(ARQS, json=arq["patch"], headers={
        **SERVICE, "X-OpenStack-Request-Id": header})
    assert resp.status_code == 202
    assert _job_ids(sqlite_db) == [resp.headers["X-OpenStack-Request-Id"]]


def _bindable(client, db) -> dict:  # type: ignore[no-untyped-def]
    fpga = inventory.add_fpga(db, hostname="node1", handles=1)
    name = f"dp-{uuid.uuid4().hex[:6]}"
    client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN,
                         json=[{"name": name, "groups": [{"resources:FPGA": "1"}]}])
    (arq,) = client.simulate_post(ARQS, json={"device_profile_name": name},
                                  headers=ADMIN).json["arqs"]
    instance = str(uuid.uuid4())
    return {"uuid": arq["uuid"], "instance": instance, "patch": {arq["uuid"]: [
        {"op": "add", "path": "/hostname", "value": "node1"},
        {"op": "add", "path": "/device_rp_uuid", "value": fpga["deployable"]["rp_uuid"]},
        {"op": "add", "path": "/instance_uuid", "value": instance}]}}


def _job_ids(db) -> list:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return list(conn.execute(select(bind_jobs.c.global_request_id)).scalars())


# ------------------------------------------------------------------------------ bind jobs

def test_a_bind_job_keeps_the_global_id_for_its_lines_and_nova(tmp_path, sqlite_db,
                                                               recorder, log_file):
    conf = make_conf(str(tmp_path), nova__auth_type="none",
                     nova__endpoint_override=recorder.url)
    client = testing.TestClient(build_app(conf, sqlite_db))
    arq = _bindable(client, sqlite_db)
    resp = client.simulate_patch(ARQS, json=arq["patch"],
                                 headers={**SERVICE, "X-OpenStack-Request-Id": GLOBAL_ID})
    assert resp.status_code == 202
    assert _job_ids(sqlite_db) == [GLOBAL_ID]
    # Another thread, later, as the conductor's bind worker: the job names the request.
    BindWorker(conf, sqlite_db).run_once()
    (event,) = recorder.requests
    assert _header(event.headers) == GLOBAL_ID
    bound = [line for line in log_file().splitlines() if f"Bound ARQ {arq['uuid']}" in line]
    assert len(bound) == 1 and f"acceld.conductor.binding.worker [{GLOBAL_ID} req-" in bound[0]
    assert request_ids.current() is None


# --------------------------------------------------------------------------- internal calls

class _Seen:
    """An internal route that records the context its call ran under."""

    def __init__(self) -> None:
        self.global_ids: list[str | None] = []

    def on_post(self, req, resp) -> None:  # type: ignore[no-untyped-def]
        ctx = request_ids.current()
        self.global_ids.append(ctx.global_request_id if ctx else "no context")
        respond(resp, {})


def test_internal_calls_carry_the_global_id(log_file):
    seen = _Seen()
    server = InternalServer(internal_app(SECRET, 60, {"/seen": {"POST": seen.on_post}},
                                         destination=auth.CONDUCTOR), "127.0.0.1", 0).start()
    try:
        client = InternalClient(server.url, SECRET, destination=auth.CONDUCTOR)
        with request_ids.bound(GLOBAL_ID):
            client.call("POST", "/seen", {})
        client.call("POST", "/seen", {})  # periodic work: no request behind it
        with request_ids.bound("req-forged"):  # not well-formed: never reaches the server
            client.call("POST", "/seen", {})
        client.close()
    finally:
        server.stop()
    assert seen.global_ids == [GLOBAL_ID, None, None]
    calls = [line for line in log_file().splitlines() if "Internal call POST /seen" in line]
    # Calls made for a request are INFO lines naming it; the others are DEBUG (not shown).
    assert len(calls) == 1 and f" INFO acceld.internal.server [{GLOBAL_ID} req-" in calls[0]
