"""The API wakes the conductor after a bind commits: the bind completes without waiting for
the periodic scan (set to a minute here), over the real signed internal call."""

from __future__ import annotations

import time
import uuid

from falcon import testing

from acceld.api.app import build_app
from acceld.clients.conductor import ConductorClient
from acceld.conductor.binding import BindingComponent
from acceld.conductor.service import Conductor
from tests.conftest import make_conf
from tests.helpers import ADMIN, SERVICE
from tests.support import inventory

URL = "/accelerator/v2/accelerator_requests"


def test_patch_wakes_the_conductor(tmp_path, sqlite_db):
    conf = make_conf(str(tmp_path), internal__shared_secret="wake-test-secret-0123456789abcdef",
                     conductor__port=0, conductor__bind_poll_interval=60.0)
    conductor = Conductor(conf, sqlite_db, [BindingComponent(conf, sqlite_db)])
    conductor.start()
    try:
        client = testing.TestClient(build_app(
            conf, sqlite_db, ConductorClient(conductor.server.url, b"wake-test-secret-0123456789abcdef")))
        fpga = inventory.add_fpga(sqlite_db, hostname="wake-node", handles=1)
        client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN,
                             json=[{"name": "w", "groups": [{"resources:FPGA": "1"}]}])
        time.sleep(0.3)  # the start-up pass has run and found nothing
        (arq,) = client.simulate_post(URL, json={"device_profile_name": "w"},
                                      headers=ADMIN).json["arqs"]
        body = {arq["uuid"]: [
            {"op": "add", "path": "/hostname", "value": "wake-node"},
            {"op": "add", "path": "/device_rp_uuid", "value": fpga["deployable"]["rp_uuid"]},
            {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())}]}
        assert client.simulate_patch(URL, json=body, headers=SERVICE).status_code == 202
        deadline = time.monotonic() + 10
        while client.simulate_get(f"{URL}/{arq['uuid']}", headers=ADMIN).json["state"] != \
                "Bound":
            assert time.monotonic() < deadline, "the wake call did not reach the workers"
            time.sleep(0.05)
    finally:
        conductor.stop()
