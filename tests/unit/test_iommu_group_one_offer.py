"""One IOMMU group, one offer (issue 27 item 7).

Two PCIe GPUs behind one PCIe switch whose downstream ports lack ACS share an IOMMU
group with the switch's ports (``/sys/kernel/iommu_groups/30/devices`` lists the upstream
port, both downstream ports and both GPUs). VFIO gives a group to one VM: while one VM
holds either GPU, a second VM with the other cannot start. So the group is one offer: one
deployable, one accelerator, either GPU's handle.
"""

from __future__ import annotations


import pytest

from acceld.drivers.nvidia_gpu import NvidiaGpuDriver
from acceld.drivers.pci import PciDriver
from acceld.drivers.record_schema import check_node
from tests.conftest import make_conf
from tests.support.sysfs_fixtures import SysfsTree

GPU_A, GPU_B = "0000:17:00.0", "0000:18:00.0"


def switch_node(tmp_path, second=("0x10de", "0x2335"), group_b: int = 30) -> SysfsTree:
    tree = SysfsTree(tmp_path / "sys")
    tree.add_root_port("0000:00:01.0")
    # The switch: upstream port and two downstream ports, all bridges in group 30.
    tree.add_pci("0000:15:00.0", "0x10b5", "0xc010", "0x060400", driver="pcieport",
                 iommu_group=30, bridge="0000:00:01.0")
    for port in ("0000:16:00.0", "0000:16:01.0"):
        tree.add_pci(port, "0x10b5", "0xc010", "0x060400", driver="pcieport",
                     iommu_group=30, bridge="0000:15:00.0")
    tree.add_pci(GPU_A, "0x10de", "0x2335", "0x030200", driver="vfio-pci", iommu_group=30,
                 bridge="0000:16:00.0")
    tree.add_pci(GPU_B, second[0], second[1], "0x030200", driver="vfio-pci",
                 iommu_group=group_b, bridge="0000:16:01.0")
    return tree


def pci_records(tmp_path, tree):
    conf = make_conf(str(tmp_path), pci_driver__sysfs_root=str(tree.root))
    return PciDriver(conf, "node1").discover()


def gpu_records(tmp_path, tree):
    conf = make_conf(str(tmp_path), nvidia_gpu__sysfs_root=str(tree.root),
                     nvidia_gpu__use_nvml=False)
    return NvidiaGpuDriver(conf, "node1").discover()


def address(record) -> str:
    i = record.controlpath_id["cpid_info"]
    return f"{i['domain']}:{i['bus']}:{i['device']}.{i['function']}"


def handles(dep) -> list[str]:
    return [f"{h.attach_info['domain']}:{h.attach_info['bus']}:{h.attach_info['device']}."
            f"{h.attach_info['function']}" for h in dep.attach_handles]


@pytest.mark.parametrize("discover", [pci_records, gpu_records])
def test_two_gpus_in_one_group_are_one_offer(tmp_path, discover):
    records = {address(r): r for r in discover(tmp_path, switch_node(tmp_path))}
    assert sorted(records) == [GPU_A, GPU_B]
    keeper, held = records[GPU_A], records[GPU_B]
    assert keeper.acc_status == "ready"
    [unit] = keeper.deployables
    assert unit.num_accelerators == 1 and handles(unit) == [GPU_A, GPU_B]
    assert held.deployables == [] and held.acc_status == "setup_required"
    assert held.status_reason.startswith(
        f"IOMMU group 30 also holds {GPU_A}: a VM gets the whole group, so only one of its "
        f"devices can be in use at a time; offered as one unit through {GPU_A}'s deployable")
    offered = sum(d.num_accelerators for r in records.values() for d in r.deployables
                  if r.acc_status == "ready")
    assert offered == 1
    assert not check_node([r.to_dict() for r in records.values()]).problems


def test_a_different_device_in_the_group_is_held_not_joined(tmp_path):
    tree = switch_node(tmp_path, second=("0x10de", "0x1eb8"))  # a T4 beside the H200
    records = {address(r): r for r in gpu_records(tmp_path, tree)}
    assert handles(records[GPU_A].deployables[0]) == [GPU_A]
    assert records[GPU_B].deployables == []
    assert f"held while {GPU_A} is offered" in records[GPU_B].status_reason


@pytest.mark.parametrize("discover", [pci_records, gpu_records])
def test_gpus_in_groups_of_their_own_are_offered_each(tmp_path, discover):
    records = discover(tmp_path, switch_node(tmp_path, group_b=31))
    assert [(r.acc_status, len(r.deployables)) for r in records] == [("ready", 1)] * 2
