"""nvme: NVMe controllers as SSDs, never one the host is using."""

from __future__ import annotations

import pytest

from acceld.drivers.base import NotSupported, hardware_uuid
from acceld.drivers.nvme import NvmeDriver, read_mounted_devices
from tests.conftest import make_conf
from tests.support.sysfs_fixtures import SysfsTree

FREE, BOOT, VFIO = "0000:3c:00.0", "0000:01:00.0", "0000:af:00.0"


def driver(tmp_path, tree: SysfsTree, mounts: str = "", **opts) -> NvmeDriver:
    mounts_file = tmp_path / "mounts"
    mounts_file.write_text(mounts)
    overrides = {"nvme__sysfs_root": str(tree.root), "nvme__mounts_path": str(mounts_file)}
    overrides.update({f"nvme__{k}": v for k, v in opts.items()})
    return NvmeDriver(make_conf(str(tmp_path), **overrides), "node1")


@pytest.fixture
def tree(tmp_path) -> SysfsTree:
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(FREE, "0x144d", "0xa80a", "0x010802", driver="nvme", bridge="0000:00:1d.0")
    t.add_nvme(FREE, 0, model="Samsung SSD 970 EVO Plus 1TB", serial="S4EWNX0R123456")
    t.add_pci(BOOT, "0x8086", "0x0a54", "0x010802", driver="nvme")
    t.add_nvme(BOOT, 1, model="INTEL SSDPE2KX010T8", serial="PHLJ9999")
    t.add_nvme_partition(1, 1, 2)
    t.add_pci(VFIO, "0x1c5c", "0x174a", "0x010802", driver="vfio-pci")  # no class/nvme entry
    t.add_pci("0000:00:17.0", "0x8086", "0xa352", "0x010601", driver="ahci")  # SATA
    t.add_pci("0000:02:00.0", "0x1af4", "0x1042", "0x018000", driver="virtio-pci")
    return t


BOOT_MOUNTS = "/dev/nvme1n1p2 / ext4 rw,relatime 0 0\nproc /proc proc rw 0 0\n"


def test_controllers_in_use_are_never_reported(tmp_path, tree):
    records = driver(tmp_path, tree, mounts=BOOT_MOUNTS).discover()
    assert sorted(r.deployables[0].name for r in records) == [FREE, VFIO]


def test_host_bound_controller(tmp_path, tree):
    records = {r.deployables[0].name: r for r in driver(tmp_path, tree,
                                                        mounts=BOOT_MOUNTS).discover()}
    record = records[FREE]
    assert (record.type, record.vendor, record.model, record.driver_name) == (
        "SSD", "0x144d", "Samsung SSD 970 EVO Plus 1TB", "nvme")
    assert record.uuid == hardware_uuid("node1", "nvme", FREE)
    info = record.vendor_board_info
    assert info["serial"] == "S4EWNX0R123456"  # the kernel pads it; we strip
    assert info["firmware_rev"] == "2B2QEXM7"
    assert (info["controller"], info["state"], info["namespaces"]) == ("nvme0", "live", 1)
    [dep] = record.deployables
    assert dep.attributes == {"rc": "CUSTOM_SSD", "trait0": "CUSTOM_SSD", "trait1": "CUSTOM_NVME"}
    assert dep.attach_handles[0].attach_info == {"domain": "0000", "bus": "3c", "device": "00",
                                                 "function": "0"}
    # A controller already bound to vfio-pci shows PCI facts only.
    assert records[VFIO].model == "NVMe 0x1c5c:0x174a"
    assert records[VFIO].vendor_board_info == {}


def test_holders_make_a_controller_in_use(tmp_path, tree):
    t = tree
    t.add_pci("0000:41:00.0", "0x144d", "0xa80a", "0x010802", driver="nvme")
    t.add_nvme("0000:41:00.0", 2, model="M", serial="S", holders={"nvme2n1": ["dm-0"]})
    names = [r.deployables[0].name for r in driver(tmp_path, t, mounts=BOOT_MOUNTS).discover()]
    assert "0000:41:00.0" not in names


def test_addresses_narrow_the_report_and_rc_is_configurable(tmp_path, tree):
    [record] = driver(tmp_path, tree, mounts=BOOT_MOUNTS, addresses=[FREE],
                      resource_class="CUSTOM_NVME_DISK").discover()
    assert record.deployables[0].attributes["rc"] == "CUSTOM_NVME_DISK"


def test_fabrics_and_dead_controllers(tmp_path, tree):
    tree.add_nvme(FREE, 5, model="fabric", serial="X", transport="tcp")  # not PCI: ignored
    (tree.root / "class" / "nvme" / "nvme0" / "state").write_text("dead\n")
    records = {r.deployables[0].name: r for r in driver(tmp_path, tree,
                                                        mounts=BOOT_MOUNTS).discover()}
    assert records[FREE].acc_status == "setup_required"
    assert "nvme0 is dead" in records[FREE].status_reason


def test_missing_model_file(tmp_path, tree):
    (tree.root / "class" / "nvme" / "nvme0" / "model").unlink()
    records = {r.deployables[0].name: r for r in driver(tmp_path, tree,
                                                        mounts=BOOT_MOUNTS).discover()}
    assert records[FREE].model == "NVMe 0x144d:0xa80a"
    assert "model" not in records[FREE].vendor_board_info


def test_unreadable_mount_table(tmp_path, tree):
    conf = make_conf(str(tmp_path), nvme__sysfs_root=str(tree.root),
                     nvme__mounts_path=str(tmp_path / "no-mounts"))
    records = {r.deployables[0].name: r for r in NvmeDriver(conf, "node1").discover()}
    # Without a readable mount table no host-bound controller is safe to offer;
    # one already bound to vfio-pci still is.
    assert sorted(records) == [VFIO]


def test_read_mounted_devices(tmp_path):
    path = tmp_path / "mounts"
    path.write_text(BOOT_MOUNTS + "/dev/mapper/vg-root /srv xfs rw 0 0\n")
    assert read_mounted_devices(str(path)) == {"nvme1n1p2", "vg-root"}
    assert read_mounted_devices(str(tmp_path / "absent")) is None


def test_multipath_namespace_mounted_under_its_subsystem_name(tmp_path):
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(FREE, "0x144d", "0xa80a", "0x010802", driver="nvme")
    ctrl = t.add_nvme(FREE, 0, model="M", serial="S", namespaces=())
    (ctrl / "nvme0c0n1").mkdir()
    assert driver(tmp_path, t, mounts="/dev/nvme0n1 /data xfs rw 0 0\n").discover() == []
    assert len(driver(tmp_path, t, mounts="").discover()) == 1


def test_programming_is_not_supported(tmp_path, tree):
    with pytest.raises(NotSupported):
        driver(tmp_path, tree).program(FREE, "/tmp/fw.bin", kind="firmware")
