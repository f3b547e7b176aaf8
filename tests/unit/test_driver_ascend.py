"""ascend: Huawei Ascend NPUs by vendor and class."""

from __future__ import annotations

import pytest

from acceld.drivers.ascend import AscendDriver, read_driver_version
from acceld.drivers.base import NotSupported, hardware_uuid
from tests.conftest import make_conf
from tests.support.sysfs_fixtures import SysfsTree

NPU = "0000:c1:00.0"


def driver(tmp_path, tree: SysfsTree, version_info: str | None = "Version=24.1.rc2\n",
           **opts) -> AscendDriver:
    path = tmp_path / "version.info"
    if version_info is not None:
        path.write_text(version_info)
    overrides = {"ascend__sysfs_root": str(tree.root), "ascend__version_info_path": str(path)}
    overrides.update({f"ascend__{k}": v for k, v in opts.items()})
    return AscendDriver(make_conf(str(tmp_path), **overrides), "node1")


@pytest.fixture
def tree(tmp_path) -> SysfsTree:
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(NPU, "0x19e5", "0xd802", "0x120000", driver="devdrv_device_driver",
              revision="0x71")
    t.add_pci("0000:00:0c.0", "0x19e5", "0xd100", "0x120000", revision="0x20")
    t.add_pci("0000:3d:00.0", "0x19e5", "0x1822", "0x020000", driver="hinic")  # Huawei NIC
    t.add_pci("0000:3e:00.0", "0x19e5", "0x3758", "0x010400", driver="hisi_sas")  # RAID
    t.add_pci("0000:3b:00.0", "0x10ee", "0x5000", "0x120000")  # another vendor's accelerator
    return t


def test_npus_only(tmp_path, tree):
    records = driver(tmp_path, tree).discover()
    assert [r.model for r in records] == ["Ascend 310", "Ascend 910B"]
    npu = records[1]
    assert (npu.type, npu.vendor, npu.driver_name) == ("AICHIP", "0x19e5", "ascend")
    assert npu.uuid == hardware_uuid("node1", "ascend", NPU)
    assert npu.vendor_board_info == {"chip": "910B", "driver_version": "24.1.rc2"}
    [dep] = npu.deployables
    assert dep.name == NPU
    assert dep.attributes == {"rc": "CUSTOM_ASCEND", "trait0": "CUSTOM_ASCEND",
                              "trait1": "CUSTOM_ASCEND_910B"}
    assert dep.attach_handles[0].attach_info["bus"] == "c1"


def test_missing_version_info_and_unknown_chip(tmp_path, tree):
    tree.add_pci("0000:c2:00.0", "0x19e5", "0xd9ff", "0x120000")
    records = driver(tmp_path, tree, version_info=None, resource_class="CUSTOM_NPU").discover()
    assert records[-1].model == "Ascend D9FF"
    assert records[-1].vendor_board_info == {"chip": "D9FF"}
    assert records[-1].deployables[0].attributes["rc"] == "CUSTOM_NPU"


def test_function_with_unreadable_ids_is_skipped(tmp_path, tree):
    (tree.device_dir(NPU) / "class").write_text("0xzz\n")
    assert [r.model for r in driver(tmp_path, tree).discover()] == ["Ascend 310"]


def test_read_driver_version(tmp_path):
    path = tmp_path / "version.info"
    path.write_text("package_name=Ascend-hdk-910b-npu-driver\nVersion=23.0.3\n")
    assert read_driver_version(str(path)) == "23.0.3"
    path.write_text("Version=\n")
    assert read_driver_version(str(path)) is None
    assert read_driver_version(str(tmp_path / "absent")) is None


def test_programming_is_not_supported(tmp_path, tree):
    with pytest.raises(NotSupported):
        driver(tmp_path, tree).program(NPU, "/tmp/fw.bin", kind="firmware")


def test_health_from_aer_and_link(tmp_path, tree):
    tree.set_aer(NPU)
    tree.set_link(NPU)
    drv = driver(tmp_path, tree)
    health = {r.deployables[0].name: r.health for r in drv.discover()}
    assert health[NPU]["state"] == "healthy"
    assert health["0000:00:0c.0"]["state"] == "unknown"  # no AER, no link figures
    tree.set_aer(NPU, fatal=3)
    health = {r.deployables[0].name: r.health for r in drv.discover()}
    assert health[NPU]["state"] == "unhealthy" and "fatal PCIe" in health[NPU]["reason"]
