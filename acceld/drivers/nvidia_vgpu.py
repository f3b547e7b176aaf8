"""vGPU offers of one NVIDIA GPU: the type it serves, how many handles, or why it cannot.

Three layouts (``shared/reference/hardware-layouts.md`` 2.1-2.3):

- mdev on the PF (pre-Ampere: T4, V100): the kernel's ``available_instances`` counts what
  the card can still host, so free slots plus the ones acceld made are the capacity.
- mdev on SR-IOV VFs (Ampere+ after ``sriov-manage -e``): every VF says 1 or 0, so 32 VFs
  would look like 32 vGPUs of a type the card holds 1 or 7 of.
- vGPU 17+ vendor-specific VFIO: each VF takes one vGPU through
  ``nvidia/current_vgpu_type``; ``creatable_vgpu_types`` lists what can be made *now* and
  empties as the card fills, so it cannot name the types in use.

Capacity per type is therefore NVML's ``nvmlVgpuTypeGetMaxInstances`` where NVML answers,
else ``[nvidia_gpu] vgpu_max_instances`` (as Nova's ``[mdev_<type>] max_instances``), else
for mdev types the ``max_instance=`` the driver prints in the type's description, else (mdev
on the PF only) the kernel's own count. Instances another tool made count against it. Type
names come from NVML's supported types (never empty), the mdev type's ``name``, any VF's
``creatable_vgpu_types``, and the names the driver learnt earlier; never from one VF's
creatable list alone.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

from acceld.drivers import sysfs
from acceld.drivers.base import AttachHandle, pci_address_parts, pci_handle
from acceld.drivers.nvidia_nvml import NvmlGpu

# Slot numbers probed for acceld's own mdevs: more than any type's instances per GPU.
MIN_SLOT_PROBE = 64
SRIOV_MANAGE = "/usr/lib/nvidia/sriov-manage"
# A MIG-backed type's name ends in <slices>-<memory GB><licence>: "NVIDIA H200X-1-18C".
_MIG_BACKED_NAME = re.compile(r"-\d+-\d+[A-Z]$")
_MAX_INSTANCE = re.compile(r"max_instance=(\d+)")


@dataclass
class VgpuOffer:
    """One vGPU type a GPU serves, with a handle per instance it can hold."""

    key: str  # mdev type id (nvidia-223) or the vendor VFIO type name
    name: str
    kind: str  # 'mdev' | 'vfio'
    handles: list[AttachHandle]
    capacity_source: str  # nvml | config | mdev-description | kernel


@dataclass
class VgpuPlan:
    """What discovery does with a GPU's vGPU side."""

    offer: VgpuOffer | None = None
    setup_reason: str | None = None  # a configured type this GPU should serve but cannot
    busy_reason: str | None = None  # vGPU guests run on it: never offered whole
    vgpu_host: bool = False  # the vGPU manager drives it (mdev types, vGPU VFs, NVML types)
    known_names: set[str] = field(default_factory=set)
    unmatched: bool = False  # types are configured, none is one this GPU knows


@dataclass
class _MdevType:
    parent: str
    type_id: str
    name: str
    available: int
    created: list[str]
    description: str | None


@dataclass
class _VfioVf:
    address: str
    current: int
    creatable: dict[int, str] | None


@dataclass
class _Type:
    key: str
    name: str
    kind: str  # mdev | vfio | nvml (NVML lists it; sysfs has no way to make it yet)
    vendor_id: int | None = None
    max_instances: int | None = None
    gi_profile: int | None = None
    description: str | None = None


def read_vgpu_types(path: str) -> dict[int, str] | None:
    """Parse ``creatable_vgpu_types``: a header, then ``%-5d : name`` lines."""
    text = sysfs.read_attr(path)
    if text is None:
        return None
    types: dict[int, str] = {}
    for line in text.splitlines():
        tid, sep, name = line.partition(":")
        tid = tid.strip()
        if sep and tid.isdigit() and name.strip():
            types[int(tid)] = name.strip()
    return types


def mdev_handle(parent: str, type_id: str, slot: int, uuid: str) -> AttachHandle:
    """Upstream Cyborg's MDEV attach_info (parent's address parts, ``asked_type``,
    ``vgpu_mark``) plus the mdev's ``uuid``, which is also the handle's uuid."""
    info = pci_address_parts(parent)
    info.update(asked_type=type_id, vgpu_mark=f"{type_id}_{slot}", uuid=uuid)
    return AttachHandle(attach_type="MDEV", attach_info=info)


def vfio_handle(vf: str, name: str) -> AttachHandle:
    """A vendor-VFIO vGPU VF: Nova must not rebind it (``managed`` no), acceld sets the
    type on bind (``vgpu_type``)."""
    handle = pci_handle(vf)
    handle.attach_info.update(vgpu_type=name, managed="no")
    return handle


def _mdev_types(parent: sysfs.PciFunction) -> list[_MdevType]:
    types_dir = parent.join("mdev_supported_types")
    found = []
    for type_id in sysfs.list_dir(types_dir):
        tdir = os.path.join(types_dir, type_id)
        available = sysfs.read_int(os.path.join(tdir, "available_instances"))
        if available is None or sysfs.read_attr(os.path.join(tdir, "device_api")) is None:
            continue  # both are mandatory in the mdev ABI
        found.append(_MdevType(
            parent=parent.address, type_id=type_id,
            name=sysfs.read_attr(os.path.join(tdir, "name")) or type_id,
            available=available, created=sorted(sysfs.list_dir(os.path.join(tdir, "devices"))),
            description=sysfs.read_attr(os.path.join(tdir, "description"))))
    return found


def _vfio_vfs(vfs: Iterable[sysfs.PciFunction]) -> list[_VfioVf]:
    found = []
    for vf in vfs:
        current = sysfs.read_int(vf.join("nvidia", "current_vgpu_type"))
        if current is None:
            continue
        found.append(_VfioVf(vf.address, current,
                             read_vgpu_types(vf.join("nvidia", "creatable_vgpu_types"))))
    return found


def _mdev_vendor_id(type_id: str) -> int | None:
    prefix, _, number = type_id.rpartition("-")
    return int(number) if prefix == "nvidia" and number.isdigit() else None


class VgpuPlanner:
    """Plans one GPU's vGPU offer from sysfs and (when it answers) NVML."""

    def __init__(self, enabled: list[str], max_instances: dict[str, int],
                 slot_uuid: Callable[[str, str, int], str],
                 learnt_names: dict[str, dict[int, str]]) -> None:
        self.enabled = list(enabled)
        self.max_instances = dict(max_instances)
        self.slot_uuid = slot_uuid
        # PF address -> vendor type id -> name, remembered across discoveries.
        self.learnt_names = learnt_names

    # --- observation -------------------------------------------------------------

    def plan(self, pf: sysfs.PciFunction, vfs: list[sysfs.PciFunction],
             gpu: NvmlGpu | None) -> VgpuPlan:
        parents = [pf] if os.path.isdir(pf.join("mdev_supported_types")) else [
            vf for vf in vfs if os.path.isdir(vf.join("mdev_supported_types"))]
        mdevs = [t for parent in parents for t in _mdev_types(parent)]
        vfio = _vfio_vfs(vfs)
        names = self._vfio_names(pf.address, vfio, gpu)
        types = self._known_types(mdevs, vfio, names, gpu)
        plan = VgpuPlan(known_names={t.name for t in types.values()} | set(types),
                        vgpu_host=bool(mdevs or vfio or (gpu and gpu.vgpu_types)))
        running = max(sum(len(t.created) for t in mdevs),
                      sum(1 for vf in vfio if vf.current != 0),
                      len(gpu.active_vgpu_types) if gpu else 0)
        if running:
            plan.busy_reason = f"{running} vGPU(s) run on it"
        wanted = self._wanted(types)
        if wanted is None:
            plan.unmatched = bool(self.enabled) and plan.vgpu_host
            unnamed = sorted({vf.current for vf in vfio if vf.current and vf.current not in names})
            if plan.unmatched and unnamed:
                plan.setup_reason = (
                    f"its VFs run vGPU type id(s) {', '.join(map(str, unnamed))}, which cannot "
                    f"be named without NVML (creatable_vgpu_types empties as the card fills)")
            return plan
        reason = self._unservable(wanted, pf, vfs, gpu)
        if reason:
            plan.setup_reason = reason
            return plan
        cap, source = self._capacity(wanted, pf, parents, gpu)
        if source is None:
            plan.setup_reason = (
                f"the number of vGPUs of type {wanted.name!r} {pf.address} can hold is "
                f"unknown: NVML did not answer; set [nvidia_gpu] vgpu_max_instances = "
                f"{wanted.name}:<n>")
            return plan
        if wanted.kind == "mdev":
            handles = self._mdev_handles(wanted, [t for t in mdevs if t.type_id == wanted.key],
                                         cap, per_vf=parents[0] is not pf)
        else:
            handles = self._vfio_handles(wanted, vfio, cap)
        plan.offer = VgpuOffer(wanted.key, wanted.name, wanted.kind, handles, source)
        return plan

    def _vfio_names(self, pf: str, vfio: list[_VfioVf], gpu: NvmlGpu | None
                    ) -> dict[int, str]:
        names = self.learnt_names.setdefault(pf, {})
        for vf in vfio:
            names.update(vf.creatable or {})
        if gpu:
            names.update({tid: t.name for tid, t in gpu.vgpu_types.items()})
        return dict(names)

    def _known_types(self, mdevs: list[_MdevType], vfio: list[_VfioVf], names: dict[int, str],
                     gpu: NvmlGpu | None) -> dict[str, _Type]:
        """Types by name: what sysfs can make, then what only NVML knows."""
        nvml_by_name = {t.name: t for t in (gpu.vgpu_types.values() if gpu else [])}
        types: dict[str, _Type] = {}
        for m in mdevs:
            if m.name not in types:
                types[m.name] = _Type(key=m.type_id, name=m.name, kind="mdev",
                                      vendor_id=_mdev_vendor_id(m.type_id),
                                      description=m.description)
        if vfio:
            for tid, name in names.items():
                types.setdefault(name, _Type(key=name, name=name, kind="vfio", vendor_id=tid))
        for name, t in nvml_by_name.items():
            types.setdefault(name, _Type(key=name, name=name, kind="nvml", vendor_id=t.type_id))
        for t in types.values():
            info = nvml_by_name.get(t.name)
            if info is not None:
                t.max_instances, t.gi_profile = info.max_instances, info.gpu_instance_profile
        return types

    def _wanted(self, types: dict[str, _Type]) -> _Type | None:
        """The first configured type (config order) this GPU knows, by name or mdev id."""
        for wanted in self.enabled:
            for t in types.values():
                if wanted in (t.name, t.key):
                    return t
        return None

    # --- checks --------------------------------------------------------------------

    @staticmethod
    def _unservable(t: _Type, pf: sysfs.PciFunction, vfs: list[sysfs.PciFunction],
                    gpu: NvmlGpu | None) -> str | None:
        if t.kind == "nvml":
            if pf.is_sriov_pf and not vfs:
                return (f"vGPU type {t.name!r} needs the GPU's SR-IOV VFs, which are not "
                        f"enabled: run {SRIOV_MANAGE} -e {pf.address}")
            return (f"NVML lists vGPU type {t.name!r} but sysfs offers no way to create it "
                    f"on {pf.address} (no mdev types, no nvidia/current_vgpu_type on its "
                    f"VFs): is the vGPU manager's VFIO module loaded?")
        mig_backed = t.gi_profile is not None or bool(_MIG_BACKED_NAME.search(t.name))
        if mig_backed and gpu is not None and gpu.mig_mode is not None:
            if gpu.mig_mode != "enabled":
                return (f"MIG-backed vGPU type {t.name!r} needs MIG mode enabled on "
                        f"{pf.address}")
            if gpu.gpu_instances_error and gpu.gpu_instances_source in (None, "capabilities"):
                return (f"MIG-backed vGPU type {t.name!r} needs the GPU instance profiles of "
                        f"{pf.address}, which cannot be read: NVML {gpu.gpu_instances_error} "
                        f"(a privileged user is needed: run the [privsep_nvml] daemon)")
            if t.gi_profile is not None and t.gi_profile not in gpu.gpu_instance_profiles:
                return (f"MIG-backed vGPU type {t.name!r} needs GPU instances of MIG profile "
                        f"id {t.gi_profile}; none exist on {pf.address}")
        return None

    def _capacity(self, t: _Type, pf: sysfs.PciFunction, parents: list[sysfs.PciFunction],
                  gpu: NvmlGpu | None) -> tuple[int | None, str | None]:
        """How many vGPUs of ``t`` the card holds in all, and who said so. (None, 'kernel'):
        the kernel's per-type count on the PF is the whole truth."""
        cap: int | None = None
        source: str | None = None
        if t.max_instances is not None:
            cap, source = t.max_instances, "nvml"
        else:
            for key in (t.name, t.key, str(t.vendor_id)):
                if key in self.max_instances:
                    cap, source = self.max_instances[key], "config"
                    break
        if source is None and t.description:
            match = _MAX_INSTANCE.search(t.description)
            if match:
                cap, source = int(match.group(1)), "mdev-description"
        if source is None and t.kind == "mdev" and parents and parents[0] is pf:
            source = "kernel"
        if cap is not None and t.gi_profile is not None and gpu is not None:
            cap = min(cap, gpu.gpu_instance_profiles.count(t.gi_profile))
        return cap, source

    # --- handles -------------------------------------------------------------------

    def _mdev_handles(self, t: _Type, on_parents: list[_MdevType], cap: int | None,
                      per_vf: bool) -> list[AttachHandle]:
        ours: list[tuple[str, int]] = []  # (parent, slot)
        free: list[tuple[str, int]] = []
        foreign = 0
        for m in on_parents:
            created = set(m.created)
            if per_vf:
                uuid = self.slot_uuid(m.parent, t.key, 0)
                mine = uuid in created
                ours += [(m.parent, 0)] if mine else []
                foreign += len(created) - int(mine)
                if not created and m.available > 0:
                    free.append((m.parent, 0))
                continue
            bound = max(MIN_SLOT_PROBE, m.available + len(created))
            mine_slots = [s for s in range(bound) if self.slot_uuid(m.parent, t.key, s) in created]
            ours += [(m.parent, s) for s in mine_slots]
            foreign += len(created) - len(mine_slots)
            taken = set(mine_slots)
            free += [(m.parent, s) for s in range(bound) if s not in taken][:m.available]
        count = len(ours) + len(free)
        if cap is not None:
            count = min(count, cap - foreign)
        chosen = ours + free[:max(0, count - len(ours))]
        return [mdev_handle(parent, t.key, slot, self.slot_uuid(parent, t.key, slot))
                for parent, slot in sorted(chosen)]

    @staticmethod
    def _vfio_handles(t: _Type, vfio: list[_VfioVf], cap: int | None) -> list[AttachHandle]:
        # A VF running this type is taken to be acceld's (nothing else may set types on VFs
        # acceld offers; docs/drivers.md); a free VF qualifies while it can create the type.
        running = [vf.address for vf in vfio if vf.current == t.vendor_id]
        free = [vf.address for vf in vfio if vf.current == 0 and vf.creatable
                and t.vendor_id in vf.creatable]
        count = len(running) + len(free)
        if cap is not None:
            count = max(len(running), min(count, cap))
        chosen = running + free[:max(0, count - len(running))]
        return [vfio_handle(vf, t.name) for vf in sorted(chosen)]
