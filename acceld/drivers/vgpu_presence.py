"""Whether the NVIDIA vGPU manager (or any mdev vendor driver) holds a PCI function.

The generic ``pci`` driver must not hand out a function that vGPU guests run on, nor a VF
of a GPU whose VFs the vGPU manager drives: every such VF is the vGPU manager's, and a VM
given one as a plain PCI device takes it from under a running guest or from the vGPU
capacity ``nvidia_gpu`` counts. What sysfs shows on such a host:

- vGPU 17+ (vendor-specific VFIO, Hopper/Blackwell): each VF of the PF has an ``nvidia/``
  directory (``creatable_vgpu_types``, ``current_vgpu_type``; a non-zero
  ``current_vgpu_type`` is a running vGPU);
- mdev vGPU: ``mdev_supported_types/`` under the PF (pre-Ampere) or under each VF
  (Ampere after ``sriov-manage -e``), and created mdevs under ``<type>/devices/``.

Only reads; the answer is a sentence naming what was found, for ``status_reason``.
"""

from __future__ import annotations

import os
from typing import Iterable

from acceld.drivers import sysfs


def _function_dir(sysfs_root: str, address: str) -> str:
    return os.path.join(sysfs.pci_devices_dir(sysfs_root), address)


def current_vgpu_type(sysfs_root: str, address: str) -> int | None:
    """A VF's running vendor vGPU type id (0: none), or None without ``nvidia/``."""
    return sysfs.read_int(os.path.join(_function_dir(sysfs_root, address), "nvidia",
                                       "current_vgpu_type"))


def has_vgpu_manager_files(sysfs_root: str, address: str) -> bool:
    """The function carries vGPU manager state: ``nvidia/`` vGPU files or mdev types."""
    path = _function_dir(sysfs_root, address)
    return (os.path.exists(os.path.join(path, "nvidia", "creatable_vgpu_types"))
            or os.path.exists(os.path.join(path, "nvidia", "current_vgpu_type"))
            or os.path.isdir(os.path.join(path, "mdev_supported_types")))


def mdevs_on(sysfs_root: str, address: str) -> list[str]:
    """The uuids of mdevs created on a function (any type)."""
    types_dir = os.path.join(_function_dir(sysfs_root, address), "mdev_supported_types")
    found: list[str] = []
    for type_id in sysfs.list_dir(types_dir):
        found += sysfs.list_dir(os.path.join(types_dir, type_id, "devices"))
    return sorted(found)


def vgpu_busy(sysfs_root: str, address: str) -> str | None:
    """Why a function runs a vGPU guest (a vGPU type set, an mdev on it), or None."""
    current = current_vgpu_type(sysfs_root, address)
    if current:
        return f"{address} runs vGPU type id {current}"
    mdevs = mdevs_on(sysfs_root, address)
    if mdevs:
        return f"{address} has {len(mdevs)} mdev(s)"
    return None


def vgpu_managed(sysfs_root: str, pf: str, vfs: Iterable[str]) -> str | None:
    """Why the vGPU manager drives this PF (its own or its VFs' vGPU files), naming any
    function that runs a vGPU now; None when it does not."""
    functions = [pf, *vfs]
    managed = [a for a in functions if has_vgpu_manager_files(sysfs_root, a)]
    if not managed:
        return None
    busy = [reason for reason in (vgpu_busy(sysfs_root, a) for a in functions) if reason]
    vf_count = len(functions) - 1
    what = (f"{pf} is driven by {_manager(sysfs_root, managed)} (vGPU files on "
            f"{len(managed)} of its {'functions' if vf_count else 'function'})")
    if busy:
        what += "; " + "; ".join(busy)
    return what


def _manager(sysfs_root: str, managed: list[str]) -> str:
    """Who: NVIDIA's vGPU manager (``nvidia/`` vGPU files), else some mdev vendor driver
    (Intel GVT-g's ``i915-GVTg_*`` types, say)."""
    if any(os.path.isdir(os.path.join(_function_dir(sysfs_root, a), "nvidia"))
           for a in managed):
        return "the NVIDIA vGPU manager"
    vendor = sysfs.read_attr(os.path.join(_function_dir(sysfs_root, managed[0]), "vendor"))
    return "the NVIDIA vGPU manager" if vendor == "0x10de" else "an mdev (vGPU) vendor driver"


def vgpu_reason(sysfs_root: str, address: str, physfn: str | None) -> str | None:
    """Why a single function must not be offered as a PCI device: it runs a vGPU, or it is
    a VF of a PF the vGPU manager drives (its VFs are the vGPU manager's)."""
    busy = vgpu_busy(sysfs_root, address)
    if busy:
        return busy
    if physfn is not None:
        pf_dir = _function_dir(sysfs_root, physfn)
        siblings = [sysfs.link_name(os.path.join(pf_dir, e)) for e in sysfs.list_dir(pf_dir)
                    if e.startswith("virtfn")]
        managing = vgpu_managed(sysfs_root, physfn, [s for s in siblings if s])
        if managing:
            who = managing.split(" is driven by ", 1)[1].split(" (vGPU files", 1)[0]
            return f"{address} is a VF of {physfn}, which {who} drives"
    elif has_vgpu_manager_files(sysfs_root, address):
        return f"{address} is driven by {_manager(sysfs_root, [address])}"
    return None
