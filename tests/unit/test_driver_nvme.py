"""nvme: NVMe controllers as SSDs, only those configured and never one the host is using."""

from __future__ import annotations

import json
import logging
import os
import sys

import pytest

from acceld.drivers.base import NotSupported, hardware_uuid
from acceld.drivers.health import DEGRADED, HEALTHY, UNHEALTHY, UNKNOWN
from acceld.drivers.nvme import NvmeDriver, read_mounted_devices
from acceld.drivers.nvme_usage import (critical_warning_health, parse_critical_warning,
                                       read_swap_devices)
from tests.conftest import make_conf
from tests.support.sysfs_fixtures import SysfsTree

FREE, BOOT, VFIO = "0000:3c:00.0", "0000:01:00.0", "0000:af:00.0"
ALL = [FREE, BOOT, VFIO]
NO_SWAP = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"


def driver(tmp_path, tree: SysfsTree, mounts: str = "", swaps: str = NO_SWAP,
           addresses=ALL, **opts) -> NvmeDriver:
    mounts_file = tmp_path / "mounts"
    mounts_file.write_text(mounts)
    swaps_file = tmp_path / "swaps"
    swaps_file.write_text(swaps)
    overrides = {"nvme__sysfs_root": str(tree.root), "nvme__mounts_path": str(mounts_file),
                 "nvme__swaps_path": str(swaps_file), "nvme__addresses": addresses,
                 "nvme__udev_data_dir": str(tmp_path / "udev"),
                 "nvme__nvme_cli_path": str(tmp_path / "no-nvme-cli")}
    overrides.update({f"nvme__{k}": v for k, v in opts.items()})
    return NvmeDriver(make_conf(str(tmp_path), **overrides), "node1")


def names(records):
    return sorted(r.deployables[0].name for r in records)


@pytest.fixture
def tree(tmp_path) -> SysfsTree:
    t = SysfsTree(tmp_path / "sys")
    t.add_root_port("0000:00:1d.0")
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
    assert names(driver(tmp_path, tree, mounts=BOOT_MOUNTS).discover()) == [FREE, VFIO]


def test_an_empty_address_list_offers_nothing(tmp_path, tree):
    assert driver(tmp_path, tree, mounts=BOOT_MOUNTS, addresses=[]).discover() == []


def test_only_listed_addresses_are_offered(tmp_path, tree, caplog):
    records = driver(tmp_path, tree, addresses=[FREE, "0000:00:17.0", "0000:99:00.0"],
                     resource_class="CUSTOM_NVME_DISK").discover()
    assert names(records) == [FREE]
    assert records[0].deployables[0].attributes["rc"] == "CUSTOM_NVME_DISK"
    assert "0000:99:00.0 is not an NVMe controller" in caplog.text


def test_host_bound_controller(tmp_path, tree):
    records = {r.deployables[0].name: r for r in driver(tmp_path, tree,
                                                        mounts=BOOT_MOUNTS).discover()}
    record = records[FREE]
    assert (record.type, record.vendor, record.model, record.driver_name) == (
        "SSD", "0x144d", "NVMe 0x144d:0xa80a", "nvme")
    assert record.uuid == hardware_uuid("node1", "nvme", FREE)
    info = record.vendor_board_info
    assert info["model"] == "Samsung SSD 970 EVO Plus 1TB"  # the kernel pads it; we strip
    assert info["serial"] == "S4EWNX0R123456"
    assert info["firmware_rev"] == "2B2QEXM7"
    assert (info["controller"], info["state"], info["namespaces"]) == ("nvme0", "live", 1)
    [dep] = record.deployables
    assert dep.attributes == {"rc": "CUSTOM_SSD", "trait0": "CUSTOM_SSD_PRODUCT_ID_A80A",
                              "trait1": "CUSTOM_SSD", "trait2": "CUSTOM_NVME"}
    assert dep.attach_handles[0].attach_info == {"domain": "0000", "bus": "3c", "device": "00",
                                                 "function": "0"}
    # A controller already bound to vfio-pci shows PCI facts only.
    assert records[VFIO].model == "NVMe 0x1c5c:0x174a"
    assert records[VFIO].vendor_board_info == {}


def test_upstream_vendor_trait_and_model_survive_a_rebind(tmp_path):
    """Inspur (upstream's SSD vendor): CUSTOM_SSD_INSPUR and CUSTOM_SSD_PRODUCT_ID_<pid>;
    rebinding the controller to vfio-pci changes neither the traits nor the model."""
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(FREE, "0x1bd4", "0x1003", "0x010802", driver="nvme")
    t.add_nvme(FREE, 0, model="Inspur NS8500", serial="IN1")
    [before] = driver(tmp_path, t, addresses=[FREE]).discover()
    t.bind(FREE, "vfio-pci")
    for entry in (t.root / "class" / "nvme").iterdir():
        entry.unlink()
    [after] = driver(tmp_path, t, addresses=[FREE]).discover()
    assert before.deployables[0].attributes == after.deployables[0].attributes
    assert before.deployables[0].attributes["trait0"] == "CUSTOM_SSD_INSPUR"
    assert before.deployables[0].attributes["trait1"] == "CUSTOM_SSD_PRODUCT_ID_1003"
    assert before.model == after.model


def test_holders_on_a_namespace_or_a_partition_make_a_controller_in_use(tmp_path, tree):
    t = tree
    t.add_pci("0000:41:00.0", "0x144d", "0xa80a", "0x010802", driver="nvme")
    t.add_nvme("0000:41:00.0", 2, model="M", serial="S", holders={"nvme2n1": ["dm-0"]})
    t.add_pci("0000:42:00.0", "0x144d", "0xa80a", "0x010802", driver="nvme")
    t.add_nvme("0000:42:00.0", 3, model="M", serial="T")
    t.add_nvme_partition(3, 1, 1)
    t.add_nvme_partition(3, 1, 2, holders=("dm-3",))  # an LVM PV on the second partition
    found = names(driver(tmp_path, t, mounts=BOOT_MOUNTS,
                         addresses=ALL + ["0000:41:00.0", "0000:42:00.0"]).discover())
    assert found == [FREE, VFIO]


def test_active_swap_makes_a_controller_in_use(tmp_path, tree):
    swaps = NO_SWAP + "/dev/nvme0n1\t\t\t\tpartition\t8388604\t\t0\t\t-2\n"
    assert names(driver(tmp_path, tree, mounts=BOOT_MOUNTS, swaps=swaps).discover()) == [VFIO]
    # An unreadable swap table makes every host-bound controller unsafe.
    assert names(driver(tmp_path, tree, mounts=BOOT_MOUNTS,
                        swaps_path=str(tmp_path / "absent")).discover()) == [VFIO]


def test_zfs_and_lvm_members_are_in_use(tmp_path, tree):
    udev = tmp_path / "udev"
    ns = (tree.root / "class" / "nvme" / "nvme0").resolve() / "nvme0n1"
    tree.add_udev_fs_type(udev, ns, "zfs_member")
    assert names(driver(tmp_path, tree, mounts=BOOT_MOUNTS).discover()) == [VFIO]
    tree.add_udev_fs_type(udev, ns, "LVM2_member")
    assert names(driver(tmp_path, tree, mounts=BOOT_MOUNTS).discover()) == [VFIO]
    tree.add_udev_fs_type(udev, ns, "ext4")  # a file system that is not mounted: free
    assert names(driver(tmp_path, tree, mounts=BOOT_MOUNTS).discover()) == [FREE, VFIO]


def test_native_multipath_with_a_mounted_partition_of_the_head(tmp_path):
    """A dual-ported drive under native multipath: controllers nvme0 and nvme1 each hold a
    hidden path (nvme0c0n1, nvme0c1n1); the host mounts a partition of the head nvme0n1.
    Neither controller may be offered; once it is unmounted both may."""
    t = SysfsTree(tmp_path / "sys")
    ports = ["0000:3c:00.0", "0000:3d:00.0"]
    for ctrl, address in enumerate(ports):
        t.add_pci(address, "0x8086", "0x0b60", "0x010802", driver="nvme")
        t.add_nvme(address, ctrl, model="INTEL D7-P5620", serial="PHAB0001", namespaces=())
    head = t.add_nvme_multipath(0, [0, 1], partitions=(1, 2))
    assert (t.root / "block" / "nvme0n1").resolve() == head
    mounts = "/dev/nvme0n1p2 /srv xfs rw 0 0\n"
    assert driver(tmp_path, t, mounts=mounts, addresses=ports).discover() == []
    assert names(driver(tmp_path, t, mounts="", addresses=ports).discover()) == ports
    # LVM on a partition of the head holds it too.
    (head / "nvme0n1p1" / "holders" / "dm-1").mkdir()
    assert driver(tmp_path, t, mounts="", addresses=ports).discover() == []


def test_multipath_head_mounted_whole(tmp_path):
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(FREE, "0x144d", "0xa80a", "0x010802", driver="nvme")
    t.add_nvme(FREE, 0, model="M", serial="S", namespaces=())
    t.add_nvme_multipath(0, [0])
    assert driver(tmp_path, t, mounts="/dev/nvme0n1 /data xfs rw 0 0\n",
                  addresses=[FREE]).discover() == []
    assert len(driver(tmp_path, t, mounts="", addresses=[FREE]).discover()) == 1


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
    records = driver(tmp_path, tree, mounts_path=str(tmp_path / "no-mounts")).discover()
    # Without a readable mount table no host-bound controller is safe to offer;
    # one already bound to vfio-pci still is.
    assert names(records) == [VFIO]


def test_read_mounted_and_swap_devices(tmp_path):
    path = tmp_path / "mounts"
    path.write_text(BOOT_MOUNTS + "/dev/mapper/vg-root /srv xfs rw 0 0\n")
    assert read_mounted_devices(str(path)) == {"nvme1n1p2", "vg-root"}
    assert read_mounted_devices(str(tmp_path / "absent")) is None
    swaps = tmp_path / "swaps"
    swaps.write_text(NO_SWAP + "/dev/nvme0n1p3 partition 8388604 0 -2\n/swapfile file 1 0 -3\n")
    assert read_swap_devices(str(swaps)) == {"nvme0n1p3"}


def fake_nvme_cli(tmp_path, output: str, exit_code: int = 0):
    tool = tmp_path / "nvme"
    tool.write_text(f"#!{sys.executable}\nimport sys\n"
                    f"open({str(tmp_path / 'nvme.calls')!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                    f"sys.stdout.write({output!r})\nsys.exit({exit_code})\n")
    os.chmod(tool, 0o755)
    return str(tool)


def health_of(tmp_path, tree, tool):
    records = driver(tmp_path, tree, mounts=BOOT_MOUNTS, nvme_cli_path=tool).discover()
    return {r.deployables[0].name: r.health for r in records}


def test_smart_critical_warning_through_nvme_cli(tmp_path, tree):
    tree.set_aer(FREE)
    tool = fake_nvme_cli(tmp_path, json.dumps({"critical_warning": 0, "temperature": 310}))
    health = health_of(tmp_path, tree, tool)
    assert health[FREE]["state"] == HEALTHY
    assert health[FREE]["counters"]["nvme_critical_warning"] == 0
    # Only the host-bound controller is asked (a vfio-pci one has no /dev/nvmeN).
    assert (tmp_path / "nvme.calls").read_text() == "smart-log /dev/nvme0 --output-format=json\n"
    assert health[VFIO]["state"] == UNKNOWN  # no AER files, no link figures, no SMART
    tool = fake_nvme_cli(tmp_path, json.dumps({"critical_warning": 8}))
    health = health_of(tmp_path, tree, tool)[FREE]
    assert health["state"] == UNHEALTHY and "read-only" in health["reason"]
    tool = fake_nvme_cli(tmp_path, json.dumps({"critical_warning": {"value": 2}}))
    assert health_of(tmp_path, tree, tool)[FREE]["state"] == DEGRADED


def test_nvme_cli_absent_or_failing_leaves_pcie_health(tmp_path, tree):
    tree.set_aer(FREE)
    assert health_of(tmp_path, tree, str(tmp_path / "absent"))[FREE]["state"] == HEALTHY
    tool = fake_nvme_cli(tmp_path, "garbage", exit_code=1)
    health = health_of(tmp_path, tree, tool)[FREE]
    assert health["state"] == HEALTHY and "nvme_critical_warning" not in health["counters"]


def test_critical_warning_parsing():
    assert parse_critical_warning('{"critical_warning": 4}') == 4
    assert parse_critical_warning('{"critical_warning": {"value": 1}}') == 1
    assert parse_critical_warning("not json") is None
    assert parse_critical_warning('{"critical_warning": -1}') is None
    assert parse_critical_warning('{"critical_warning": true}') is None
    both = critical_warning_health(0x03)
    assert both.state == DEGRADED and "spare" in both.reason and "temperature" in both.reason


def test_programming_is_not_supported(tmp_path, tree):
    with pytest.raises(NotSupported):
        driver(tmp_path, tree).program(FREE, "/tmp/fw.bin", kind="firmware")


def test_controller_sharing_its_iommu_group_with_a_host_device_needs_setup(tmp_path):
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(FREE, "0x144d", "0xa80a", "0x010802", driver="vfio-pci", iommu_group=14)
    t.add_pci("0000:3c:00.1", "0x8086", "0xa352", "0x010601", driver="ahci", iommu_group=14)
    [record] = driver(tmp_path, t, addresses=[FREE]).discover()
    assert record.acc_status == "setup_required" and "bound to ahci" in record.status_reason
    t.bind("0000:3c:00.1", "vfio-pci")
    [record] = driver(tmp_path, t, addresses=[FREE]).discover()
    assert record.acc_status == "ready"


def test_a_held_back_controller_is_logged_once_per_reason(tmp_path, tree, caplog):
    caplog.set_level(logging.INFO, logger="acceld.drivers.nvme")
    drv = driver(tmp_path, tree, mounts=BOOT_MOUNTS)
    drv.discover()
    drv.discover()
    assert [r.getMessage() for r in caplog.records if "not offered" in r.getMessage()] == [
        f"nvme: {BOOT} not offered: nvme1n1p2 is mounted"]
