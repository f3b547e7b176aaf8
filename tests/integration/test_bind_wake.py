"""The API wakes the conductor after a bind commits: the bind completes without waiting for
the periodic scan (set to a minute here), over the real signed internal call; with
``[api] bind_wait`` the PATCH answers once its bind resolved, or when the wait ran out."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from falcon import testing

from acceld.api.app import build_app
from acceld.clients.conductor import ConductorClient
from acceld.clients.internal import InternalError
from acceld.conductor.binding.worker import BindingComponent
from acceld.conductor.service import Conductor
from tests.conftest import make_conf
from tests.helpers import ADMIN, SERVICE
from tests.support import inventory

URL = "/accelerator/v2/accelerator_requests"
SECRET = "wake-test-secret-0123456789abcdef"


def _conductor(tmp_path, db, **conf_overrides):  # type: ignore[no-untyped-def]
    """A conductor with only its binding component (the scan every minute: binds start
    from wakes) on ``db``."""
    conf = make_conf(str(tmp_path), internal__shared_secret=SECRET, conductor__port=0,
                     conductor__bind_poll_interval=60.0, **conf_overrides)
    binding = BindingComponent(conf, db)
    conductor = Conductor(conf, db, [binding])
    conductor.start()
    return conf, conductor, binding


def _stack(tmp_path, db, **conf_overrides):  # type: ignore[no-untyped-def]
    """A conductor, the API in process with its client, a one-handle FPGA, a profile, an
    ARQ and the PATCH body binding it."""
    conf, conductor, binding = _conductor(tmp_path, db, **conf_overrides)
    client = testing.TestClient(build_app(
        conf, db, ConductorClient(conductor.server.url, SECRET.encode())))
    fpga = inventory.add_fpga(db, hostname="wake-node", handles=1)
    client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN,
                         json=[{"name": "w", "groups": [{"resources:FPGA": "1"}]}])
    (arq,) = client.simulate_post(URL, json={"device_profile_name": "w"},
                                  headers=ADMIN).json["arqs"]
    body = {arq["uuid"]: [
        {"op": "add", "path": "/hostname", "value": "wake-node"},
        {"op": "add", "path": "/device_rp_uuid", "value": fpga["deployable"]["rp_uuid"]},
        {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())}]}
    return conductor, binding, client, arq, body


def _wait_until_bound(client, arq, why: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 10
    while client.simulate_get(f"{URL}/{arq['uuid']}", headers=ADMIN).json["state"] != "Bound":
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


def test_patch_wakes_the_conductor(tmp_path, sqlite_db):
    """bind_wait = 0: the PATCH answers at once and its wake alone starts the bind (the
    scan runs every minute here)."""
    conductor, binding, client, arq, body = _stack(tmp_path, sqlite_db, api__bind_wait=0)
    try:
        assert client.simulate_patch(URL, json=body, headers=SERVICE).status_code == 202
        _wait_until_bound(client, arq, "the wake call did not reach the workers")
    finally:
        conductor.stop()


def test_the_patch_answers_once_its_binds_are_resolved(tmp_path, sqlite_db):
    """[api] bind_wait (default 0.5 s): the client's next GET finds the ARQ Bound."""
    conductor, _, client, arq, body = _stack(tmp_path, sqlite_db)
    try:
        assert client.simulate_patch(URL, json=body, headers=SERVICE).status_code == 202
        assert client.simulate_get(f"{URL}/{arq['uuid']}", headers=ADMIN).json["state"] == \
            "Bound"
    finally:
        conductor.stop()


def test_a_bind_slower_than_bind_wait_completes_after_the_answer(tmp_path, sqlite_db,
                                                                 monkeypatch):
    conductor, binding, client, arq, body = _stack(tmp_path, sqlite_db, api__bind_wait=0.2)
    entered, release = threading.Event(), threading.Event()
    real_bind = binding.worker._bind

    def held_bind(job, token, *committed):  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(30)  # a program, an attach step: longer than the PATCH waits
        return real_bind(job, token, *committed)

    monkeypatch.setattr(binding.worker, "_bind", held_bind)
    try:
        assert client.simulate_patch(URL, json=body, headers=SERVICE).status_code == 202
        assert entered.is_set()  # the worker had the job when the wait ran out
        assert client.simulate_get(f"{URL}/{arq['uuid']}", headers=ADMIN).json["state"] == \
            "BindStarted"
        release.set()
        _wait_until_bound(client, arq, "the bind did not complete after the answer")
    finally:
        release.set()
        conductor.stop()


def test_a_malformed_wake_is_refused_and_wakes_nobody(tmp_path, sqlite_db):
    _, conductor, _ = _conductor(tmp_path, sqlite_db)
    try:
        caller = ConductorClient(conductor.server.url, SECRET.encode())
        for bad in ({"wait": "soon", "arq_ids": [1]}, {"wait": 11, "arq_ids": [1]},
                    {"arq_ids": ["x"], "wait": 1}, {"arq_ids": [0], "wait": 1},
                    {"unexpected": True}):
            with pytest.raises(InternalError) as refused:
                caller.call("POST", "/binds/wake", bad)
            assert refused.value.status == 400, bad
        assert caller.call("POST", "/binds/wake", {}) == {"status": "woken"}
        assert caller.call("POST", "/binds/wake", {"arq_ids": [424242], "wait": 0.05}) == \
            {"status": "woken", "resolved": 0}  # nothing resolved it within the wait
    finally:
        conductor.stop()
