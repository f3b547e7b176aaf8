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
