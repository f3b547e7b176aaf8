"""Whether a PCI function can really be given to a VM: IOMMU groups and the boot VGA device.

VFIO hands a VM whole IOMMU groups: QEMU can open a device only when every device in its
group (``<dev>/iommu_group/devices/*``) is bound to a VFIO driver, to ``pci-stub``, to
nothing, or is a bridge (the kernel allows bridges with any driver). A GPU whose HDMI
audio function sits in its group bound to ``snd_hda_intel`` cannot start a VM, so
offering it would only fail later, at boot of the instance. A group member that acceld
offers together with the device (a PF and its VFs in one deployable, say) is fine: it
leaves the host with it.

The boot VGA device (``boot_vga`` = 1) drives the host's console; it is never offered.

Without an ``iommu_group`` link the IOMMU is off (or the tree is a VM's without one):
there is no group to judge, and nothing is refused for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable

from acceld.drivers import sysfs
from acceld.drivers.base import HardwareRecord

# vfio_driver_allowed in the kernel: drivers that only keep others off a device.
STUB_DRIVERS = frozenset({"pci-stub"})
# Header types other than normal (bridges) may stay bound to anything (pcieport).
BRIDGE_CLASSES = frozenset({0x0604, 0x0607, 0x0609})


def is_vfio_driver(driver: str | None) -> bool:
    """vfio-pci and its vendor variants (mlx5_vfio_pci, hisi_acc_vfio_pci, nvgrace_gpu_vfio_pci,
    pds_vfio_pci, virtio_vfio_pci ...)."""
    if not driver:
        return False
    name = driver.replace("-", "_")
    return name == "vfio_pci" or name.endswith("_vfio_pci")


# (vendor, device) vfio-pci refuses to bind unless loaded with disable_denylist=1
# (vfio_pci_dev_in_denylist: the older QAT generations, PFs and VFs).
VFIO_DENYLIST = frozenset(("0x8086", d) for d in ("0x0435", "0x0443", "0x37c8", "0x37c9",
                                                   "0x19e2", "0x19e3"))


def vfio_refuses(sysfs_root: str, vendor: str, device: str) -> bool:
    """Whether vfio-pci will refuse to bind this id: on its denylist and the vfio_pci module
    not loaded with ``disable_denylist=1``."""
    if (vendor, device) not in VFIO_DENYLIST:
        return False
    flag = sysfs.read_attr(os.path.join(sysfs_root, "module", "vfio_pci", "parameters",
                                        "disable_denylist"))
    return flag not in ("Y", "1")


def is_boot_vga(sysfs_root: str, address: str) -> bool:
    return sysfs.read_attr(os.path.join(sysfs.pci_devices_dir(sysfs_root), address,
                                        "boot_vga")) == "1"


def iommu_group(sysfs_root: str, address: str) -> str | None:
    return sysfs.link_name(os.path.join(sysfs.pci_devices_dir(sysfs_root), address,
                                        "iommu_group"))


def group_members(sysfs_root: str, address: str) -> list[str]:
    """Addresses of every function in ``address``'s IOMMU group (itself included)."""
    link = os.path.join(sysfs.pci_devices_dir(sysfs_root), address, "iommu_group")
    if not os.path.islink(link):
        return []
    return [m for m in sysfs.list_dir(os.path.join(link, "devices")) if sysfs.is_pci_address(m)]


def _member_blocks(sysfs_root: str, member: str) -> str | None:
    """The host driver that keeps a group member from leaving the host, or None."""
    path = os.path.join(sysfs.pci_devices_dir(sysfs_root), member)
    driver = sysfs.link_name(os.path.join(path, "driver"))
    if driver is None or is_vfio_driver(driver) or driver in STUB_DRIVERS:
        return None
    class_code = sysfs.read_int(os.path.join(path, "class"), 16)
    if class_code is not None and (class_code >> 8) in BRIDGE_CLASSES:
        return None
    return driver


def isolation_problem(sysfs_root: str, address: str,
                      offered_with: Iterable[str] = ()) -> str | None:
    """Why ``address`` cannot be given to a VM, or None when it can.

    ``offered_with``: the addresses acceld offers together with it (they leave the host
    with it, so they may share its group whatever their driver)."""
    if is_boot_vga(sysfs_root, address):
        return f"{address} is the boot VGA device (the host's console)"
    together = set(offered_with) | {address}
    blockers = []
    for member in group_members(sysfs_root, address):
        if member in together:
            continue
        driver = _member_blocks(sysfs_root, member)
        if driver:
            blockers.append(f"{member} (bound to {driver})")
    if blockers:
        group = iommu_group(sysfs_root, address)
        return (f"IOMMU group {group} of {address} also holds {', '.join(blockers)}: bind "
                f"{'it' if len(blockers) == 1 else 'them'} to vfio-pci (or unbind) so the "
                f"group can be given to a VM")
    return None


@dataclass
class Assignable:
    """Functions split by whether they can be given to a VM; ``problems`` say why not."""

    ok: list[str]
    problems: list[str]

    def reason(self) -> str | None:
        return "; ".join(self.problems)[:1000] if self.problems else None


def split_assignable(sysfs_root: str, addresses: list[str],
                     offered_with: Iterable[str] = ()) -> Assignable:
    """Each of ``addresses`` (the attach handles of one device) judged on its own, all of
    them (and ``offered_with``) counting as offered together."""
    together = set(addresses) | set(offered_with)
    ok, problems = [], []
    for address in addresses:
        problem = isolation_problem(sysfs_root, address, together)
        if problem:
            problems.append(problem)
        else:
            ok.append(address)
    return Assignable(ok, problems)


def handle_addresses(record: HardwareRecord) -> list[str]:
    """The PCI addresses of a record's PCI attach handles (what VMs would get)."""
    out = []
    for deployable in record.deployables:
        for handle in deployable.attach_handles:
            info = handle.attach_info
            if handle.attach_type == "PCI" and {"domain", "bus", "device", "function"} <= set(info):
                out.append(f"{info['domain']}:{info['bus']}:{info['device']}.{info['function']}")
    return out


def require_isolation(record: HardwareRecord, sysfs_root: str) -> HardwareRecord:
    """A ready record whose handles cannot all be given to VMs becomes ``setup_required``
    with the reason (the device stays in the inventory, visible, but is not offered)."""
    if record.acc_status != "ready":
        return record
    judged = split_assignable(sysfs_root, handle_addresses(record))
    if judged.problems:
        record.acc_status, record.status_reason = "setup_required", judged.reason()
    return record


# --- one IOMMU group, one offer -----------------------------------------------------------


def _whole_device_handle(record: HardwareRecord) -> str | None:
    """The one PCI function a ready record offers whole (one deployable of one accelerator
    with one PCI handle), or None for anything else (vGPUs, a PF's VFs, nothing offered)."""
    if record.acc_status != "ready" or len(record.deployables) != 1:
        return None
    dep = record.deployables[0]
    addresses = handle_addresses(record)
    if dep.num_accelerators != 1 or len(dep.attach_handles) != 1 or len(addresses) != 1:
        return None
    return addresses[0]


def one_offer_per_group(records: list[HardwareRecord], sysfs_root: str) -> list[HardwareRecord]:
    """Devices offered whole that share an IOMMU group become one offer.

    VFIO gives a group to one VM: while a VM holds one device of it, another VM cannot
    start with another (its QEMU cannot open the group). Two such devices offered as two
    providers let Placement place two VMs, and the second fails at boot. So the device of
    the group with the lowest address keeps its deployable, which gets the others' attach
    handles too but still one accelerator (Placement then places one VM on the group, and
    the bind takes whichever handle is free); the others offer nothing and are
    ``setup_required`` saying where they went. A member whose offer differs (another
    resource class or traits) adds no handle: it is only held."""
    by_group: dict[str, list[tuple[str, HardwareRecord]]] = {}
    for record in records:
        address = _whole_device_handle(record)
        group = iommu_group(sysfs_root, address) if address else None
        if address and group is not None:
            by_group.setdefault(group, []).append((address, record))
    for group, members in by_group.items():
        if len(members) < 2:
            continue
        members.sort(key=lambda m: m[0])
        keeper_address, keeper = members[0]
        unit = keeper.deployables[0]
        for address, record in members[1:]:
            dep = record.deployables[0]
            joined = dep.attributes == unit.attributes
            if joined:
                unit.attach_handles.extend(dep.attach_handles)
            record.deployables = []
            record.acc_specs = {**record.acc_specs, "num": 0}
            record.acc_status = "setup_required"
            record.status_reason = (
                f"IOMMU group {group} also holds {keeper_address}: a VM gets the whole "
                f"group, so only one of its devices can be in use at a time; "
                + (f"offered as one unit through {keeper_address}'s deployable"
                   if joined else f"held while {keeper_address} is offered")
                + " (separate the devices' groups, e.g. ACS on their PCIe switch, to offer "
                  "each)")
    return records
