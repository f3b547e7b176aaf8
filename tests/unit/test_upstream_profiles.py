"""Device profiles written for upstream Cyborg (its resource classes and trait names) get a
Bound ARQ from acceld on fixture hardware shaped like the real thing (issue 17).

Each case: a driver discovers a fixture node, the records are reconciled into the
inventory (SQLite), a profile with upstream's names is created through the API, an ARQ is
bound to the deployable's provider with the bind worker in process, and it ends Bound with
the attach handle upstream would give. A profile with a trait upstream would not report
is refused, so the check is not vacuous.
"""

from __future__ import annotations

import uuid

import pytest
from falcon import testing
from sqlalchemy import insert

from acceld.api.app import build_app
from acceld.conductor.binding.worker import BindWorker
from acceld.db import inventory
from acceld.db.models import agents
from acceld.db.placement_flags import provider_uuid
from acceld.drivers import loader
from tests.conftest import make_conf
from tests.helpers import ADMIN, SERVICE
from tests.support.sysfs_fixtures import SysfsTree, node_overrides, populate_node
from tests.support.told import agent_told

HOST = "node-up"
ARQS = "/accelerator/v2/accelerator_requests"
V24 = {**SERVICE, "OpenStack-API-Version": "accelerator 2.4"}

# driver -> (deployable, upstream profile group, attach_info the ARQ gets)
CASES = {
    "pci": ("0000:3b:00.1", {"resources:CUSTOM_PCI": "1", "trait:CUSTOM_PCI_PRODUCT_ID_5005":
                             "required", "trait:OWNER_CYBORG": "required"},
            {"domain": "0000", "bus": "3b", "device": "00", "function": "1"}),
    "xilinx_fpga": ("0000:3b:00.1", {"resources:FPGA": "1", "trait:CUSTOM_FPGA_XILINX":
                                     "required", "trait:CUSTOM_FPGA_PRODUCT_ID_5004": "required"},
                    {"domain": "0000", "bus": "3b", "device": "00", "function": "1"}),
    "intel_fpga": ("0000:5e:00.0", {"resources:FPGA": "1",
                                    "trait:CUSTOM_FPGA_INTEL_PAC_ARRIA10": "required",
                                    "trait:CUSTOM_FPGA_FUNCTION_ID_INTEL_"
                                    "D8424DC4A4A3C413F89E433683F9040B": "required"},
                   {"domain": "0000", "bus": "5e", "device": "00", "function": "0"}),
    "intel_qat": ("0000:6b:00.0", {"resources:CUSTOM_QAT": "1"},
                  {"domain": "0000", "bus": "6b", "device": "00", "function": "1"}),
    "nic": ("0000:5f:00.0", {"resources:CUSTOM_NIC": "1", "trait:CUSTOM_VF": "required",
                             "trait:CUSTOM_PHYSNET2": "required"},
            {"domain": "0000", "bus": "5f", "device": "02", "function": "0",
             "physical_network": "physnet2"}),
    "nvme": ("0000:3c:00.0", {"resources:CUSTOM_SSD": "1",
                              "trait:CUSTOM_SSD_PRODUCT_ID_A80A": "required"},
             {"domain": "0000", "bus": "3c", "device": "00", "function": "0"}),
}


def node(tmp_path, sqlite_db, name):
    tree = populate_node(SysfsTree(tmp_path / "sys"))
    # The pci driver alone here (no specific driver enabled), admitting the Alveo's user
    # function as upstream's passthrough_whitelist would.
    overrides = node_overrides(tree, tmp_path)
    conf = make_conf(str(tmp_path), pci_driver__sysfs_root=str(tree.root),
                     agent__enabled_drivers=[name], **overrides)
    conf.set_override("device_spec", ['{"vendor_id": "10ee", "product_id": "5005"}'],
                      group="pci_driver")
    records = loader.load(name, conf, HOST).discover()
    with sqlite_db.write() as conn:
        inventory.reconcile_node(conn, HOST, records)
        agent_told(conn)  # no agent server: PCI binds in one transaction
        conn.execute(insert(agents).values(hostname=HOST, endpoint="127.0.0.1:9", state="up",
                                           heartbeat_interval=10))
    return conf, testing.TestClient(build_app(conf, sqlite_db))


def bind(conf, db, client, group, deployable):
    profile = f"dp-{uuid.uuid4().hex[:8]}"
    assert client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
        {"name": profile, "groups": [group]}]).status_code == 201
    [arq] = client.simulate_post(ARQS, json={"device_profile_name": profile},
                                 headers=SERVICE).json["arqs"]
    ops = [{"op": "add", "path": "/hostname", "value": HOST},
           {"op": "add", "path": "/device_rp_uuid",
            "value": provider_uuid(f"{HOST}_{deployable}")},
           {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())}]
    assert client.simulate_patch(ARQS, json={arq["uuid"]: ops},
                                 headers=SERVICE).status_code == 202
    worker = BindWorker(conf, db)
    while worker.run_once():
        pass
    return client.simulate_get(f"{ARQS}/{arq['uuid']}", headers=V24).json


@pytest.mark.parametrize("name", sorted(CASES))
def test_upstream_profile_binds(tmp_path, sqlite_db, name):
    deployable, group, attach_info = CASES[name]
    conf, client = node(tmp_path, sqlite_db, name)
    arq = bind(conf, sqlite_db, client, group, deployable)
    assert arq["state"] == "Bound", arq
    assert arq["attach_handle_type"] == "PCI"
    assert arq["attach_handle_info"] == attach_info


def test_a_trait_upstream_does_not_report_is_refused(tmp_path, sqlite_db):
    conf, client = node(tmp_path, sqlite_db, "xilinx_fpga")
    arq = bind(conf, sqlite_db, client, {"resources:FPGA": "1",
                                         "trait:CUSTOM_FPGA_PRODUCT_ID_9999": "required"},
               "0000:3b:00.1")
    assert arq["state"] == "BindFailed"
    assert "lacks trait CUSTOM_FPGA_PRODUCT_ID_9999" in arq["bind_failure_reason"]
