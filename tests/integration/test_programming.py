"""Programming with real processes: ``acceld all`` (API, conductor, agent with the fake driver).

The agent takes images from a ``bitstream_dir``; both request forms change
``bitstream_id``; firmware goes through the driver; a bad request is a 4xx and
changes nothing; disabling the device shows at 2.3.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Iterator

import pytest
import requests

from tests.support import allinone
from tests.support.allinone import free_port

HOST = "prog-node"
IMAGE = str(uuid.uuid4())
OTHER = str(uuid.uuid4())
FIRMWARE = str(uuid.uuid4())
ADMIN = {"X-User-Id": "admin", "X-Project-Id": "admin", "X-Roles": "admin,member,reader"}


@pytest.fixture(scope="module")
def acceld(tmp_path_factory) -> Iterator[allinone.Launched]:
    state = str(tmp_path_factory.mktemp("acceld-programming"))
    bitstreams = os.path.join(state, "bitstreams")
    os.makedirs(bitstreams)
    for image, data in ((IMAGE, b"first"), (OTHER, b"second"), (FIRMWARE, b"fw")):
        with open(os.path.join(bitstreams, image), "wb") as handle:
            handle.write(data * 100)
    config = os.path.join(state, "acceld.conf")
    with open(config, "w") as handle:
        handle.write(f"[DEFAULT]\nhost = {HOST}\n\n"
                     f"[conductor]\nport = {free_port()}\n\n"
                     f"[agent]\nport = {free_port()}\nenabled_drivers = fake\n"
                     f"heartbeat_interval = 1\nbitstream_dir = {bitstreams}\n")
    launched = allinone.launch(state, config)
    try:
        yield launched
    finally:
        allinone.stop(launched.proc)


@pytest.fixture(scope="module")
def deployable(acceld) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        resp = requests.get(f"{acceld.url}/deployables", params={"name": f"{HOST}_FakeDevice"},
                            headers=ADMIN, timeout=10)
        if resp.status_code == 200 and resp.json()["deployables"]:
            return resp.json()["deployables"][0]
        time.sleep(0.2)
    raise AssertionError("the fake deployable did not appear")


def show(acceld, dep_uuid: str) -> dict:
    resp = requests.get(f"{acceld.url}/deployables/{dep_uuid}", headers=ADMIN, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.json()


def patch(acceld, path: str, body) -> requests.Response:  # type: ignore[no-untyped-def]
    return requests.patch(f"{acceld.url}/deployables/{path}", json=body, headers=ADMIN,
                          timeout=60)


def fault(resp: requests.Response) -> str:
    return json.loads(resp.json()["error_message"])["faultstring"]


def test_program_through_both_forms(acceld, deployable):
    dep = deployable["uuid"]
    resp = patch(acceld, f"{dep}/program",
                 [{"path": "/program", "op": "replace", "value": [{"image_uuid": IMAGE}]}])
    assert resp.status_code == 200, resp.text
    assert resp.json()["bitstream_id"] == IMAGE
    assert show(acceld, dep)["bitstream_id"] == IMAGE

    resp = patch(acceld, dep, [{"path": "/bitstream", "op": "add", "value": OTHER}])
    assert resp.status_code == 204, resp.text
    assert show(acceld, dep)["bitstream_id"] == OTHER

    resp = patch(acceld, f"{dep}/program/{dep}",
                 [{"path": "/program", "op": "replace", "value": [{"image_uuid": IMAGE}]}])
    assert resp.status_code == 200, resp.text
    assert show(acceld, dep)["bitstream_id"] == IMAGE


def test_firmware_goes_through_the_driver(acceld, deployable):
    dep = deployable["uuid"]
    before = show(acceld, dep)["bitstream_id"]
    resp = patch(acceld, dep, [{"path": "/firmware", "op": "replace", "value": FIRMWARE}])
    assert resp.status_code == 204, resp.text
    with open(os.path.join(acceld.state_path, "fake_driver", "FakeDevice.json")) as handle:
        recorded = json.load(handle)
    assert recorded["firmware"]["size"] == len(b"fw" * 100)
    assert show(acceld, dep)["bitstream_id"] == before


@pytest.mark.parametrize("path, body, status", [
    ("{dep}/program", [{"path": "/program", "op": "replace",
                        "value": [{"image_uuid": "00000000-0000-4000-8000-000000000000"}]}], 400),
    ("{dep}", [{"path": "/bitstream", "op": "add",
                "value": "00000000-0000-4000-8000-000000000000"}], 400),
    ("{dep}/program", [{"path": "/program", "op": "replace", "value": IMAGE}], 400),
    ("{dep}", [{"path": "/bitstream", "op": "remove"}], 400),
    ("{dep}", {"bitstream": IMAGE}, 400),
])
def test_bad_program_requests_change_nothing(acceld, deployable, path, body, status):
    dep = deployable["uuid"]
    before = show(acceld, dep)
    resp = patch(acceld, path.format(dep=dep), body)
    assert resp.status_code == status, resp.text
    assert fault(resp)
    after = show(acceld, dep)
    assert (after["bitstream_id"], after["updated_at"]) == (before["bitstream_id"],
                                                            before["updated_at"])


def test_disable_and_enable_show_at_2_3(acceld, deployable):
    devices = requests.get(f"{acceld.url}/devices", params={"hostname": HOST}, headers={
        **ADMIN, "OpenStack-API-Version": "accelerator 2.3"}, timeout=10).json()["devices"]
    [device] = devices
    url = f"{acceld.url}/devices/{device['uuid']}"
    v23 = {**ADMIN, "OpenStack-API-Version": "accelerator 2.3"}
    assert requests.patch(url, json=[{"path": "/status", "op": "replace", "value": "disabled",
                                      "reason": "test"}], headers=ADMIN,
                          timeout=10).status_code == 204
    assert requests.get(url, headers=v23, timeout=10).json()["status"] == "maintaining"
    assert requests.post(f"{url}/enable", headers=ADMIN, timeout=10).status_code == 200
    assert requests.get(url, headers=v23, timeout=10).json()["status"] == "enabled"
    assert "status" not in requests.get(url, headers=ADMIN, timeout=10).json()


# Asynchronous programming (microversion 2.5) and a long program's effect on others.

V25 = {**ADMIN, "OpenStack-API-Version": "accelerator 2.5"}


def _database(acceld):  # type: ignore[no-untyped-def]
    from acceld.db.engine import Database

    return Database(f"sqlite:///{os.path.join(acceld.state_path, 'acceld.sqlite')}")


class _HeldLease:
    """Holds the deployable's program lease, as another program would: the next program
    waits for it, so a test sees that program running for as long as it likes."""

    def __init__(self, acceld, dep_uuid: str) -> None:  # type: ignore[no-untyped-def]
        from acceld.db import leases

        self.leases, self.db = leases, _database(acceld)
        self.name = f"program:{dep_uuid}"
        assert self.leases.acquire(self.db, self.name, "test-holder", 120)

    def release(self) -> None:
        assert self.leases.release(self.db, self.name, "test-holder")
        self.db.dispose()


def _show_at(acceld, dep_uuid: str, headers: dict) -> dict:  # type: ignore[no-untyped-def]
    resp = requests.get(f"{acceld.url}/deployables/{dep_uuid}", headers=headers, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _program_25(acceld, dep_uuid: str, image: str) -> requests.Response:  # type: ignore[no-untyped-def]
    return requests.patch(f"{acceld.url}/deployables/{dep_uuid}/program", headers=V25,
                          json=[{"path": "/program", "op": "replace",
                                 "value": [{"image_uuid": image}]}], timeout=10)


def _settled(acceld, dep_uuid: str) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 20
    while True:
        body = _show_at(acceld, dep_uuid, V25)
        if body["program_status"] != "PROGRAMMING":
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.1)


def test_program_at_2_5_answers_202_and_is_followed_on_the_deployable(acceld, deployable):
    dep = deployable["uuid"]
    assert patch(acceld, f"{dep}/program", [{"path": "/program", "op": "replace",
                                             "value": [{"image_uuid": IMAGE}]}]).ok
    held = _HeldLease(acceld, dep)
    try:
        started = time.monotonic()
        resp = _program_25(acceld, dep, OTHER)
        assert resp.status_code == 202, resp.text
        assert time.monotonic() - started < 5
        assert resp.json()["uuid"] == dep
        assert resp.json()["program_status"] == "PROGRAMMING"
        assert resp.json()["program_reason"] is None
        assert resp.json()["bitstream_id"] == IMAGE  # not yet programmed
        assert _show_at(acceld, dep, V25)["program_status"] == "PROGRAMMING"
        below = _show_at(acceld, dep, {**ADMIN, "OpenStack-API-Version": "accelerator 2.4"})
        assert "program_status" not in below and "program_reason" not in below
    finally:
        held.release()
    done = _settled(acceld, dep)
    assert (done["program_status"], done["program_reason"]) == ("SUCCEEDED", None)
    assert done["bitstream_id"] == OTHER


def test_a_failed_program_at_2_5_shows_why(acceld, deployable):
    dep = deployable["uuid"]
    before = show(acceld, dep)["bitstream_id"]
    missing = str(uuid.uuid4())
    resp = _program_25(acceld, dep, missing)
    assert resp.status_code == 202, resp.text
    done = _settled(acceld, dep)
    assert done["program_status"] == "FAILED"
    assert done["program_reason"].startswith("400: ") and missing in done["program_reason"]
    assert done["bitstream_id"] == before


def test_program_at_2_5_of_an_unknown_deployable_is_404_at_once(acceld):
    resp = _program_25(acceld, str(uuid.uuid4()), IMAGE)
    assert resp.status_code == 404, resp.text


def test_a_synchronous_program_shows_its_outcome_at_2_5(acceld, deployable):
    dep = deployable["uuid"]
    resp = patch(acceld, f"{dep}/program", [{"path": "/program", "op": "replace",
                                             "value": [{"image_uuid": IMAGE}]}])
    assert resp.status_code == 200 and "program_status" not in resp.json()
    shown = _show_at(acceld, dep, V25)
    assert (shown["program_status"], shown["program_reason"]) == ("SUCCEEDED", None)


def test_a_long_synchronous_program_ties_up_only_its_own_connection(acceld, deployable):
    import threading

    dep = deployable["uuid"]
    held = _HeldLease(acceld, dep)
    answers: list[int] = []
    waiting = threading.Thread(target=lambda: answers.append(patch(
        acceld, f"{dep}/program",
        [{"path": "/program", "op": "replace", "value": [{"image_uuid": IMAGE}]}]).status_code))
    try:
        waiting.start()
        deadline = time.monotonic() + 10
        while _show_at(acceld, dep, V25)["program_status"] != "PROGRAMMING":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for _ in range(5):  # the program waits for the lease; everyone else is served
            started = time.monotonic()
            assert requests.get(f"{acceld.url}/deployables", headers=ADMIN,
                                timeout=5).status_code == 200
            assert time.monotonic() - started < 1.0
        assert answers == []
    finally:
        held.release()
        waiting.join(30)
    assert answers == [200]
