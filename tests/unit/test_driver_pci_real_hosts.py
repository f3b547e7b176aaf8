"""pci on sysfs trees shaped like real vGPU hosts and idle GPUs (issue 27 items 1 and 5).

An H200 host running NVIDIA's vGPU manager (vGPU 17+, vendor-specific VFIO) shows the PF
bound to ``nvidia`` with 32 SR-IOV VFs (``sriov-manage -e``), each VF carrying
``nvidia/creatable_vgpu_types`` and ``nvidia/current_vgpu_type`` (non-zero on the VF a
guest's vGPU runs on). A T4 host (mdev vGPU) shows ``mdev_supported_types/`` on the PF and
created mdevs under ``<type>/devices/``. With the default drivers (``fake,pci``) none of
these functions may be offered as a plain PCI device.
"""

from __future__ import annotations

import json

import pytest

from acceld.drivers.health import DEGRADED, HEALTHY
from acceld.drivers.pci import PciDriver
from acceld.drivers.pci_health import judges_link_speed
from acceld.drivers.record_schema import check_node
from tests.conftest import make_conf
from tests.support.sysfs_fixtures import SysfsTree

PF = "0000:41:00.0"
# The H200's 32 VFs start at function 4 of the PF's slot (sriov_offset 4, stride 1).
VFS = [f"0000:41:{(4 + i) // 8:02x}.{(4 + i) % 8}" for i in range(32)]
BUSY_VF = VFS[0]
H200_TYPES = {1418: "NVIDIA H200X-18C", 1428: "NVIDIA H200X-141C"}


def driver(tmp_path, tree: SysfsTree, specs=None, **overrides) -> PciDriver:
    conf = make_conf(str(tmp_path), pci_driver__sysfs_root=str(tree.root), **overrides)
    if specs is not None:
        conf.set_override("device_spec", [json.dumps(s) for s in specs], group="pci_driver")
    return PciDriver(conf, "node1")


def address_of(record) -> str:
    info = record.controlpath_id["cpid_info"]
    return f"{info['domain']}:{info['bus']}:{info['device']}.{info['function']}"


def offered(records) -> list[str]:
    """Every function some record offers as an attach handle."""
    out = []
    for record in records:
        if record.acc_status != "ready":
            continue
        for dep in record.deployables:
            for handle in dep.attach_handles:
                i = handle.attach_info
                out.append(f"{i['domain']}:{i['bus']}:{i['device']}.{i['function']}")
    return out


def vgpu_host(tmp_path, *, busy: bool = True) -> SysfsTree:
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci(PF, "0x10de", "0x2335", "0x030200", driver="nvidia", revision="0xa1")
    tree.add_vfs(PF, VFS, "0x2335", driver="nvidia", total=32)
    creatable = {1418: H200_TYPES[1418]}  # a card with one 18C running offers only 18C
    for vf in VFS:
        tree.add_nvidia_vfio(vf, creatable if busy else H200_TYPES,
                             current=1418 if busy and vf == BUSY_VF else 0)
    return tree


def test_vgpu_manager_pf_and_its_vfs_are_never_pci_devices(tmp_path):
    """The default drivers (fake,pci) and the default allow-list (vendor 10de)."""
    records = driver(tmp_path, vgpu_host(tmp_path)).discover()
    assert offered(records) == []
    [record] = records
    assert address_of(record) == PF
    assert record.acc_status == "setup_required"
    assert record.deployables == [] and record.acc_specs["num"] == 0
    assert f"{PF} is driven by the NVIDIA vGPU manager" in record.status_reason
    assert f"{BUSY_VF} runs vGPU type id 1418" in record.status_reason
    assert "nvidia_gpu" in record.status_reason
    assert not check_node([r.to_dict() for r in records]).problems


def test_an_idle_vgpu_manager_pf_is_still_left_alone(tmp_path):
    records = driver(tmp_path, vgpu_host(tmp_path, busy=False)).discover()
    assert offered(records) == []
    [record] = records
    assert record.acc_status == "setup_required"
    assert "runs vGPU" not in record.status_reason


def test_vfs_admitted_without_their_pf_are_not_offered(tmp_path):
    """An allow-list naming the VFs by address (Nova's way for vGPU VFs) admits them
    alone; each is still the vGPU manager's."""
    tree = vgpu_host(tmp_path)
    records = driver(tmp_path, tree, specs=[{"address": {"bus": "41", "slot": "0[1-4]"}},
                                            {"address": "0000:41:00.5"}]).discover()
    assert records and offered(records) == []
    reasons = {address_of(r): r.status_reason for r in records}
    assert "0000:41:00.5" in reasons and BUSY_VF not in reasons
    assert reasons["0000:41:00.5"].startswith(
        f"0000:41:00.5 is a VF of {PF}, which the NVIDIA vGPU manager drives")
    tree2 = vgpu_host(tmp_path / "b")
    records = driver(tmp_path, tree2, specs=[{"address": BUSY_VF}]).discover()
    [record] = records
    assert record.status_reason.startswith(f"{BUSY_VF} runs vGPU type id 1418")
    assert offered(records) == []


def test_mdev_host_gpu_with_a_running_vgpu_is_not_offered(tmp_path):
    tree = SysfsTree(tmp_path / "sys")
    t4 = "0000:06:00.0"
    tree.add_pci(t4, "0x10de", "0x1eb8", "0x030200", driver="nvidia")
    tree.add_mdev_type(t4, "nvidia-223", "GRID T4-2B", 7)
    tree.add_mdev(t4, "nvidia-223", "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001")
    [record] = driver(tmp_path, tree).discover()
    assert record.acc_status == "setup_required" and offered([record]) == []
    assert record.status_reason.startswith(f"{t4} has 1 mdev(s)")


def test_a_plain_sriov_gpu_without_the_vgpu_manager_is_still_offered(tmp_path):
    """VFs bound to vfio-pci with no vGPU files (an SR-IOV device pci may offer)."""
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci(PF, "0x10de", "0x2335", "0x030200", driver="vfio-pci")
    tree.add_vfs(PF, VFS[:2], "0x2335", driver="vfio-pci", total=32)
    [record] = driver(tmp_path, tree, specs=[{"address": PF}]).discover()
    assert record.acc_status == "ready"
    assert offered([record]) == VFS[:2]


def test_with_nvidia_gpu_enabled_the_vgpu_host_is_its_alone(tmp_path):
    records = driver(tmp_path, vgpu_host(tmp_path),
                     agent__enabled_drivers=["pci", "nvidia_gpu"]).discover()
    assert records == []


# --- item 5: link speed of an idle GPU ----------------------------------------------------


@pytest.mark.parametrize(("class_code", "judged"), [
    (0x030000, False), (0x030200, False), (0x038000, False),
    (0x120000, True), (0x0B4000, True), (0x010802, True), (0x020000, True)])
def test_link_speed_is_judged_for_every_class_but_display(class_code, judged):
    assert judges_link_speed(class_code) is judged


def test_an_idle_gpu_is_healthy_and_a_narrow_link_degraded(tmp_path):
    """An idle H200 on a Gen5 x16 slot trains down to 2.5 GT/s (width stays x16)."""
    tree = SysfsTree(tmp_path / "sys")
    tree.add_root_port("0000:40:01.0", max_speed="32.0 GT/s PCIe")
    tree.add_pci(PF, "0x10de", "0x2335", "0x030200", driver="vfio-pci",
                 bridge="0000:40:01.0")
    tree.set_link(PF, speed="2.5 GT/s PCIe", max_speed="32.0 GT/s PCIe")
    drv = driver(tmp_path, tree)
    [record] = drv.discover()
    assert record.health["state"] == HEALTHY
    tree.set_link(PF, speed="32.0 GT/s PCIe", max_speed="32.0 GT/s PCIe", width=8)
    [record] = drv.discover()
    assert record.health["state"] == DEGRADED
    assert "x8" in record.health["reason"]


def test_a_slow_link_still_degrades_a_non_gpu(tmp_path):
    tree = SysfsTree(tmp_path / "sys")
    tree.add_root_port("0000:3a:01.0")
    qat = "0000:6b:00.0"
    tree.add_pci(qat, "0x8086", "0x4940", "0x0b4000", driver="vfio-pci",
                 bridge="0000:3a:01.0")
    tree.set_link(qat, speed="2.5 GT/s PCIe", max_speed="16.0 GT/s PCIe")
    [record] = driver(tmp_path, tree).discover()
    assert record.health["state"] == DEGRADED


def test_an_igpu_with_gvt_g_types_is_left_to_its_mdev_driver(tmp_path):
    """Intel GVT-g: i915 lists mdev types on the iGPU (not NVIDIA's vGPU manager)."""
    tree = SysfsTree(tmp_path / "sys")
    igpu = "0000:00:02.0"
    tree.add_pci(igpu, "0x8086", "0x3e92", "0x030000", driver="i915")
    tree.add_mdev_type(igpu, "i915-GVTg_V5_4", None, 2)
    [record] = driver(tmp_path, tree).discover()
    assert record.acc_status == "setup_required" and offered([record]) == []
    assert record.status_reason.startswith(f"{igpu} is driven by an mdev (vGPU) vendor driver")
