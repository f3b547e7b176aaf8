"""Device profiles written for upstream Cyborg bind on acceld's nvidia_gpu hardware (issue 17).

Upstream's NVIDIA driver names GPUs ``CUSTOM_NVIDIA_<PRODUCT_ID>`` and vGPUs
``CUSTOM_NVIDIA_<PRODUCT_ID>_<TYPE>``; a profile using them must get a Bound ARQ from acceld
on the same hardware: here a fixture /sys with an H200 (whole GPU) and a T4 with mdev vGPU
types, the inventory reconciled from the real driver, the API, the bind worker and the
agent's attach routes (loopback) in process. SQLite: what is checked is the hand-off, not the
database (binding itself is tested on every backend elsewhere).
"""

from __future__ import annotations

import uuid

import pytest
from falcon import testing
from sqlalchemy import insert, update

from acceld.agent.attach import AttachSteps
from acceld.api.app import build_app
from acceld.conductor.binding.worker import BindWorker
from acceld.db import inventory
from acceld.db.models import agents
from acceld.db.placement_flags import provider_uuid
from acceld.drivers.nvidia_gpu import NvidiaGpuDriver
from acceld.internal.auth import agent_destination
from acceld.internal.server import InternalServer, build_app as internal_app
from tests.conftest import make_conf
from tests.helpers import ADMIN, SERVICE
from tests.support.sysfs_fixtures import SysfsTree

SECRET = b"test-secret-for-upstream-profiles-0123456789"
HOST = "gpu-node"
H200, T4 = "0000:3b:00.0", "0000:06:00.0"
ARQ_URL = "/accelerator/v2/accelerator_requests"
V24 = {**SERVICE, "OpenStack-API-Version": "accelerator 2.4"}


class GpuNode:
    def __init__(self, tmp_path, db) -> None:
        self.tree = SysfsTree(tmp_path / "sys")
        self.tree.add_pci(H200, "0x10de", "0x2335", "0x030200", driver="nvidia", iommu_group=21)
        self.tree.add_pci(T4, "0x10de", "0x1eb8", "0x030200", driver="nvidia", iommu_group=9)
        self.tree.add_mdev_type(T4, "nvidia-223", "GRID T4-2B", 8)
        self.conf = make_conf(str(tmp_path), nvidia_gpu__sysfs_root=str(self.tree.root),
                              nvidia_gpu__use_nvml=False,
                              nvidia_gpu__enabled_vgpu_types=["GRID T4-2B"])
        self.conf.set_override("shared_secret", SECRET.decode(), group="internal")
        self.db = db
        self.driver = NvidiaGpuDriver(self.conf, HOST)
        with db.write() as conn:
            inventory.reconcile_node(conn, HOST, self.driver.discover())
            conn.execute(insert(agents).values(hostname=HOST, endpoint="127.0.0.1:9",
                                               state="up", heartbeat_interval=10))
        self.client = testing.TestClient(build_app(self.conf, db))
        steps = AttachSteps({self.driver.name: self.driver}.get, HOST)
        self.agent = InternalServer(internal_app(SECRET, 60, steps.routes(),
                                                 destination=agent_destination(HOST)),
                                    "127.0.0.1", 0).start()
        with db.write() as conn:
            conn.execute(update(agents).where(agents.c.hostname == HOST).values(
                endpoint=self.agent.url[len("http://"):]))

    def bind(self, groups: list[dict], deployable: str) -> dict:
        name = f"dp-{uuid.uuid4().hex[:8]}"
        made = self.client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN,
                                         json=[{"name": name, "groups": groups}])
        assert made.status_code == 201, made.text
        [arq] = self.client.simulate_post(ARQ_URL, json={"device_profile_name": name},
                                          headers=SERVICE).json["arqs"]
        ops = [{"op": "add", "path": "/hostname", "value": HOST},
               {"op": "add", "path": "/device_rp_uuid",
                "value": provider_uuid(f"{HOST}_{deployable}")},
               {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())}]
        answer = self.client.simulate_patch(ARQ_URL, json={arq["uuid"]: ops}, headers=SERVICE)
        if answer.status_code == 202:
            worker = BindWorker(self.conf, self.db)
            while worker.run_once():
                pass
        found = self.client.simulate_get(f"{ARQ_URL}/{arq['uuid']}", headers=V24).json
        found["patch_status"] = answer.status_code
        return found


@pytest.fixture
def node(tmp_path, sqlite_db):
    built = GpuNode(tmp_path, sqlite_db)
    yield built
    built.agent.stop()


def test_upstream_pgpu_profile_binds_the_h200(node):
    arq = node.bind([{"resources:PGPU": "1", "trait:CUSTOM_NVIDIA_2335": "required"}], H200)
    assert arq["state"] == "Bound", arq
    assert arq["attach_handle_type"] == "PCI"
    assert arq["attach_handle_info"] == {"domain": "0000", "bus": "3b", "device": "00",
                                         "function": "0"}


def test_upstream_vgpu_profile_binds_an_mdev_acceld_creates(node):
    arq = node.bind([{"resources:VGPU": "1", "trait:CUSTOM_NVIDIA_1EB8_T4_2B": "required"}],
                    f"{T4}_nvidia-223")
    assert arq["state"] == "Bound", arq
    assert arq["attach_handle_type"] == "MDEV"
    info = arq["attach_handle_info"]
    # Upstream's keys, the parent's address and the mdev uuid, which is the handle's uuid.
    assert {k: info[k] for k in ("domain", "bus", "device", "function", "asked_type")} == {
        "domain": "0000", "bus": "06", "device": "00", "function": "0",
        "asked_type": "nvidia-223"}
    assert info["vgpu_mark"].startswith("nvidia-223_")
    assert arq["attach_handle_uuid"] == info["uuid"]
    create = node.tree.device_dir(T4) / "mdev_supported_types" / "nvidia-223" / "create"
    assert create.read_text() == info["uuid"]  # acceld made it before the ARQ was Bound


def test_a_profile_for_another_product_does_not_bind(node):
    arq = node.bind([{"resources:PGPU": "1", "trait:CUSTOM_NVIDIA_2330": "required"}], H200)
    assert arq["state"] != "Bound"
