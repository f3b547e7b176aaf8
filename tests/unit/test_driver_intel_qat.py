"""intel_qat: QAT PFs with their VFs as attach handles."""

from __future__ import annotations

import pytest

from acceld.drivers.base import NotSupported, hardware_uuid
from acceld.drivers.intel_qat import IntelQatDriver
from tests.conftest import make_conf
from tests.support.sysfs_fixtures import SysfsTree

PF = "0000:6b:00.0"
VFS = ["0000:6b:00.1", "0000:6b:00.2", "0000:6b:00.3"]


def driver(tmp_path, tree: SysfsTree, **opts) -> IntelQatDriver:
    overrides = {"intel_qat__sysfs_root": str(tree.root)}
    overrides.update({f"intel_qat__{k}": v for k, v in opts.items()})
    return IntelQatDriver(make_conf(str(tmp_path), **overrides), "node1")


@pytest.fixture
def tree(tmp_path) -> SysfsTree:
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(PF, "0x8086", "0x4940", "0x0b4000", driver="4xxx")
    t.add_vfs(PF, VFS, "0x4941", driver="vfio-pci", total=16, iommu_base=60)
    t.add_qat_config(PF, state="up", services="sym;asym")
    t.add_pci("0000:3d:00.0", "0x8086", "0x0b25", "0x088000", driver="idxd")  # DSA, not QAT
    t.add_pci("0000:5e:00.0", "0x8086", "0x1572", "0x020000", driver="i40e")
    t.add_pci("0000:b1:00.0", "0x1af4", "0x37c8", "0x0b4000")  # QAT's id, another vendor
    return t


def test_pf_with_vfs(tmp_path, tree):
    [record] = driver(tmp_path, tree).discover()
    assert (record.type, record.vendor, record.model, record.driver_name) == (
        "QAT", "0x8086", "Intel QAT 4XXX", "intel_qat")
    assert record.uuid == hardware_uuid("node1", "intel_qat", PF)
    assert record.acc_status == "ready"
    assert record.acc_specs == {"device_type": "QAT", "remote": False, "num": 3,
                                "acc_capability": {"services": ["asym", "sym"]}}
    assert record.vendor_board_info == {"generation": "4XXX", "state": "up",
                                        "services": "asym;sym", "sriov_totalvfs": 16,
                                        "vf_driver": "vfio-pci"}
    [dep] = record.deployables
    assert dep.name == PF and dep.num_accelerators == 3
    assert dep.attributes == {"rc": "CUSTOM_QAT", "trait0": "CUSTOM_QAT",
                              "trait1": "CUSTOM_QAT_4XXX", "trait2": "CUSTOM_QAT_ASYM",
                              "trait3": "CUSTOM_QAT_SYM", "services": "asym;sym"}
    assert [h.attach_info["function"] for h in dep.attach_handles] == ["1", "2", "3"]


def test_resource_class_is_configurable(tmp_path, tree):
    [record] = driver(tmp_path, tree, resource_class="CUSTOM_CRYPTO").discover()
    assert record.deployables[0].attributes["rc"] == "CUSTOM_CRYPTO"


def test_c62x_without_qat_directory_and_without_vfs(tmp_path):
    t = SysfsTree(tmp_path / "sys")
    t.add_pci("0000:3d:00.0", "0x8086", "0x37c8", "0x0b4000", driver="c6xx")
    t.set_sriov("0000:3d:00.0", total=16)
    [record] = driver(tmp_path, t).discover()
    assert record.model == "Intel QAT C62X"
    assert record.acc_status == "setup_required"
    assert "up to 16" in record.status_reason and record.deployables == []
    assert "state" not in record.vendor_board_info


def test_down_device_needs_setup(tmp_path, tree):
    (tree.device_dir(PF) / "qat" / "state").write_text("down\n")
    [record] = driver(tmp_path, tree).discover()
    assert record.acc_status == "setup_required" and "down" in record.status_reason


def test_vfs_with_a_foreign_id_or_missing_files_are_not_handles(tmp_path, tree):
    (tree.device_dir(VFS[0]) / "device").write_text("0x1234\n")
    (tree.device_dir(VFS[1]) / "vendor").unlink()
    [record] = driver(tmp_path, tree).discover()
    assert [h.attach_info["function"] for h in record.deployables[0].attach_handles] == ["3"]


def test_unreadable_services_give_no_service_traits(tmp_path, tree):
    (tree.device_dir(PF) / "qat" / "cfg_services").unlink()
    [record] = driver(tmp_path, tree).discover()
    assert record.deployables[0].attributes == {"rc": "CUSTOM_QAT", "trait0": "CUSTOM_QAT",
                                                "trait1": "CUSTOM_QAT_4XXX"}


def test_programming_is_not_supported(tmp_path, tree):
    with pytest.raises(NotSupported):
        driver(tmp_path, tree).program(PF, "/tmp/fw.bin", kind="firmware")


def test_health_down_state_is_unhealthy_and_aer_counts(tmp_path, tree):
    drv = driver(tmp_path, tree)
    [record] = drv.discover()
    assert record.health["state"] == "healthy"
    tree.set_aer(VFS[1])
    drv.discover()
    tree.set_aer(VFS[1], nonfatal=1)
    [record] = drv.discover()
    assert record.health["state"] == "degraded" and VFS[1] in record.health["reason"]
    (tree.device_dir(PF) / "qat" / "state").write_text("down\n")
    [record] = drv.discover()
    assert record.health["state"] == "unhealthy"
    assert record.health["reason"] == f"QAT device {PF} is down (qat/state)"
    assert record.acc_specs["device_type"] == record.type == "QAT"


def test_vf_sharing_its_iommu_group_with_a_host_device_needs_setup(tmp_path, tree):
    # A host-bound device (the DSA) joins the first VF's IOMMU group.
    tree.add_pci("0000:6b:01.0", "0x8086", "0x0b25", "0x088000", driver="idxd", iommu_group=60)
    [record] = driver(tmp_path, tree).discover()
    assert record.acc_status == "setup_required"
    assert f"IOMMU group 60 of {VFS[0]} also holds 0000:6b:01.0 (bound to idxd)" in \
        record.status_reason


def test_c62x_vfs_on_the_vfio_denylist_warn_once(tmp_path, caplog):
    t = SysfsTree(tmp_path / "sys")
    t.add_pci("0000:3d:00.0", "0x8086", "0x37c8", "0x0b4000", driver="c6xx")
    t.add_vfs("0000:3d:00.0", ["0000:3d:01.0"], "0x37c9", driver="c6xxvf", total=16)
    drv = driver(tmp_path, t)
    drv.discover()
    drv.discover()
    assert [r.getMessage() for r in caplog.records if "denylist" in r.getMessage()] == [
        "intel_qat: the VFs of 0000:3d:00.0 (C62X, 8086:37c9) are on vfio-pci's denylist: VMs "
        "cannot get them unless the vfio_pci module is loaded with disable_denylist=1"]
