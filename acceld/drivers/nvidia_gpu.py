"""NVIDIA GPUs: whole GPUs (PGPU), vGPU types (VGPU) and MIG state.

Two sources, merged per PCI address:

- NVML (``nvidia-ml-py``, module ``pynvml``) when it imports and initialises:
  product name, GPU uuid, memory, driver version, MIG mode and MIG devices.
- sysfs always: which functions are NVIDIA GPUs (vendor 0x10de *and* a
  display class, so NVSwitch bridges and HDMI audio functions are not GPUs),
  their driver binding, SR-IOV VFs, mdev vGPU types, and the vGPU 17+
  vendor-specific VFIO type files. Without NVML (no driver, or GPUs bound to
  vfio-pci, which NVML cannot see) sysfs alone describes the GPUs.

What is offered. A GPU is offered either whole (one ``PGPU`` deployable with
one PCI handle) or, when ``[nvidia_gpu] enabled_vgpu_types`` names a type it
supports, as vGPUs of the first such type (one ``VGPU`` deployable; a GPU runs
one vGPU type at a time, and offering both would double-book it):

- mdev vGPUs (pre-Ampere on the PF; Ampere+ on each VF after sriov-manage):
  ``MDEV`` handles whose uuid is derived from the slot, created on bind
  (:meth:`prepare_attach_handle` writes it to ``create``) and removed on unbind.
- vendor-specific VFIO (vGPU 17+, kernels >= 6.8; no mdev): ``PCI`` handles
  on the VFs; bind writes the type id to ``nvidia/current_vgpu_type``, unbind
  writes 0.

MIG: when MIG mode is enabled (NVML), the GPU's MIG devices are reported in
``vendor_board_info["mig_devices"]`` and the deployable carries the trait
``CUSTOM_NVIDIA_MIG_ENABLED``. A MIG instance is not a PCI function and has no
attach type Nova can attach, so it is not a deployable of its own; VMs get MIG
slices through MIG-backed vGPU types (e.g. ``NVIDIA H200X-1-18C``).
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import uuid as uuidlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

from oslo_config import cfg

from acceld.drivers import sysfs
from acceld.drivers.traits import attributes, trait_part
from acceld.drivers.base import (AttachHandle, Deployable, Driver, DriverError, HardwareRecord,
                                 hardware_uuid, pci_controlpath, pci_handle)

LOG = logging.getLogger(__name__)

VENDOR = "0x10de"
# Display classes (base+sub): VGA, 3D controller, other display. Not 0x0680 (NVSwitch)
# nor 0x0403 (the HDMI audio function of consumer cards).
GPU_CLASSES = {0x0300, 0x0302, 0x0380}
# Device id -> product, for traits that do not depend on whether NVML answered.
PRODUCTS = {
    "0x1eb8": "T4", "0x20b0": "A100", "0x20b2": "A100_80GB", "0x20b5": "A100_80GB",
    "0x20b7": "A30", "0x2235": "A40", "0x2330": "H100", "0x2331": "H100",
    "0x2321": "H100_NVL", "0x2335": "H200", "0x233b": "H200_NVL",
}
_MIB = 1024 * 1024
_SLOT_NAMESPACE = uuidlib.UUID("1f0a8a0e-6f4c-4b53-9a57-6a0c8f3d2b11")


def product_of(device_id: str, nvml_name: str | None) -> str:
    """The trait's product part: from the id table, else NVML's name, else the device id."""
    if device_id in PRODUCTS:
        return PRODUCTS[device_id]
    if nvml_name:
        name = nvml_name.strip()
        for prefix in ("NVIDIA ", "Tesla "):
            if name.startswith(prefix):
                name = name[len(prefix):]
        return trait_part(name)
    return device_id[2:].upper()


@dataclass
class NvmlGpu:
    """What NVML says about one GPU."""

    address: str
    name: str | None = None
    device_id: str | None = None
    gpu_uuid: str | None = None
    serial: str | None = None
    memory_mib: int | None = None
    mig_mode: str | None = None  # 'enabled' | 'disabled' | None (not supported)
    mig_devices: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class NvmlReport:
    gpus: dict[str, NvmlGpu]
    driver_version: str | None
    cuda_driver_version: int | None


@dataclass
class VgpuOffer:
    """One vGPU type a GPU can run, with a handle per instance it can hold."""

    key: str  # mdev type id (nvidia-223) or the vendor VFIO type name
    name: str
    kind: str  # 'mdev' | 'vfio'
    handles: list[AttachHandle]


def _load_pynvml() -> ModuleType | None:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


class NvidiaGpuDriver(Driver):
    """NVIDIA GPUs through NVML when available, sysfs always."""

    name = "nvidia_gpu"
    hardware_type = "GPU"

    def __init__(self, conf: cfg.ConfigOpts, hostname: str,
                 nvml: ModuleType | None = None) -> None:
        super().__init__(conf, hostname)
        self.opts = conf.nvidia_gpu
        self.root = self.opts.sysfs_root
        # Tests pass a stand-in module; production imports pynvml lazily.
        self._nvml = nvml

    # --- NVML ------------------------------------------------------------------

    def _nvml_module(self) -> ModuleType | None:
        if not self.opts.use_nvml:
            return None
        return self._nvml if self._nvml is not None else _load_pynvml()

    def read_nvml(self) -> NvmlReport | None:
        """Everything NVML knows, or None (not installed, no driver, disabled)."""
        nvml = self._nvml_module()
        if nvml is None:
            return None
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            LOG.info("nvidia_gpu: NVML unavailable (%s); reading sysfs only", exc)
            return None
        try:
            return self._read_nvml(nvml)
        except nvml.NVMLError as exc:
            LOG.warning("nvidia_gpu: NVML enumeration failed (%s); reading sysfs only", exc)
            return None
        finally:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass

    def _read_nvml(self, nvml: ModuleType) -> NvmlReport:
        def soft(fn: Callable[..., Any], *args: Any) -> Any:
            """A call whose failure (NotSupported, NoPermission, ...) only loses one fact."""
            try:
                return fn(*args)
            except nvml.NVMLError:
                return None

        gpus: dict[str, NvmlGpu] = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                pci = nvml.nvmlDeviceGetPciInfo(handle)
            except nvml.NVMLError as exc:
                LOG.warning("nvidia_gpu: NVML GPU %d unreadable (%s)", index, exc)
                continue
            address = _nvml_address(pci)
            gpu = NvmlGpu(address=address,
                          device_id=f"0x{(pci.pciDeviceId >> 16) & 0xffff:04x}")
            gpu.name = soft(nvml.nvmlDeviceGetName, handle)
            gpu.gpu_uuid = soft(nvml.nvmlDeviceGetUUID, handle)
            gpu.serial = soft(nvml.nvmlDeviceGetSerial, handle)
            memory = soft(nvml.nvmlDeviceGetMemoryInfo, handle)
            if memory is not None:
                gpu.memory_mib = int(memory.total) // _MIB
            self._read_mig(nvml, handle, gpu, soft)
            gpus[address] = gpu
        return NvmlReport(gpus=gpus,
                          driver_version=soft(nvml.nvmlSystemGetDriverVersion),
                          cuda_driver_version=soft(nvml.nvmlSystemGetCudaDriverVersion))

    @staticmethod
    def _read_mig(nvml: ModuleType, handle: Any, gpu: NvmlGpu,
                  soft: Callable[..., Any]) -> None:
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError:  # NotSupported on GPUs without MIG (T4, A40, L40S ...)
            return
        gpu.mig_mode = "enabled" if current == nvml.NVML_DEVICE_MIG_ENABLE else "disabled"
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return
        for index in range(soft(nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except nvml.NVMLError_NotFound:  # an empty slot
                continue
            except nvml.NVMLError:
                continue
            memory = soft(nvml.nvmlDeviceGetMemoryInfo, mig)
            gpu.mig_devices.append({
                "uuid": soft(nvml.nvmlDeviceGetUUID, mig),
                "gpu_instance_id": soft(nvml.nvmlDeviceGetGpuInstanceId, mig),
                "compute_instance_id": soft(nvml.nvmlDeviceGetComputeInstanceId, mig),
                "memory_mib": int(memory.total) // _MIB if memory is not None else None,
            })

    # --- discovery -------------------------------------------------------------

    def discover(self) -> list[HardwareRecord]:
        report = self.read_nvml()
        functions = {f.address: f for f in sysfs.list_pci_functions(self.root, vendors=[VENDOR])}
        gpus = {a for a, f in functions.items() if f.class_prefix in GPU_CLASSES and not f.is_vf}
        nvml_gpus = report.gpus if report else {}
        driver_version = (report.driver_version if report and report.driver_version
                          else sysfs.read_attr(os.path.join(self.root, "module", "nvidia",
                                                            "version")))
        records = []
        for address in sorted(gpus | set(nvml_gpus)):
            records.append(self._record(address, functions.get(address), nvml_gpus.get(address),
                                        functions, driver_version, report))
        return records

    def _record(self, address: str, function: sysfs.PciFunction | None, gpu: NvmlGpu | None,
                functions: dict[str, sysfs.PciFunction], driver_version: str | None,
                report: NvmlReport | None) -> HardwareRecord:
        device_id = function.device if function else (gpu.device_id if gpu else "0x0000")
        product = product_of(device_id, gpu.name if gpu else None)
        model = gpu.name if gpu and gpu.name else f"NVIDIA {product}"
        vendor_info: dict[str, Any] = {"product": product, "discovered_by":
                                       "nvml" if gpu else "sysfs"}
        if driver_version:
            vendor_info["driver_version"] = driver_version
        if report and report.cuda_driver_version:
            vendor_info["cuda_driver_version"] = report.cuda_driver_version
        if gpu:
            for key in ("gpu_uuid", "serial", "memory_mib", "mig_mode"):
                value = getattr(gpu, key)
                if value is not None:
                    vendor_info[key] = value
            if gpu.mig_mode == "enabled":
                vendor_info["mig_devices"] = gpu.mig_devices
        std_info = function.std_board_info() if function else {"vendor_id": VENDOR,
                                                                "product_id": device_id}
        traits = [f"CUSTOM_NVIDIA_{product}"]
        if gpu and gpu.mig_mode == "enabled":
            traits.append("CUSTOM_NVIDIA_MIG_ENABLED")
        offer = self._vgpu_offer(address, function, functions) if function else None
        if offer:
            deployable = Deployable(
                name=f"{address}_{re.sub(r'[^A-Za-z0-9_.:-]', '_', offer.key)}",
                num_accelerators=len(offer.handles),
                attributes=attributes("VGPU", traits + [f"CUSTOM_VGPU_{trait_part(offer.name)}"],
                                       vgpu_type=offer.key, vgpu_name=offer.name,
                                       vgpu_kind=offer.kind),
                attach_handles=offer.handles)
        else:
            deployable = Deployable(name=address, num_accelerators=1,
                                    attributes=attributes("PGPU", traits),
                                    attach_handles=[pci_handle(address)])
        deployables = [deployable] if deployable.num_accelerators > 0 else []
        return HardwareRecord(
            uuid=hardware_uuid(self.hostname, self.name, address),
            type="GPU", vendor=VENDOR, model=model, driver_name=self.name,
            controlpath_id=pci_controlpath(address),
            acc_specs={"device_type": "GPU", "remote": False,
                       "num": sum(d.num_accelerators for d in deployables)},
            std_board_info=std_info, vendor_board_info=vendor_info,
            deployables=deployables)

    # --- vGPU ------------------------------------------------------------------

    def _enabled(self, key: str, name: str) -> bool:
        return key in self.opts.enabled_vgpu_types or name in self.opts.enabled_vgpu_types

    def _vgpu_offer(self, pf: str, function: sysfs.PciFunction,
                    functions: dict[str, sysfs.PciFunction]) -> VgpuOffer | None:
        """The first enabled vGPU type (config order) this GPU offers, with its handles."""
        if not self.opts.enabled_vgpu_types:
            return None
        vfs = [functions[a] for a in function.virtfns if a in functions]
        offers = self._mdev_offers(function, vfs) + self._vfio_offers(vfs)
        for wanted in self.opts.enabled_vgpu_types:
            for offer in offers:
                if wanted in (offer.key, offer.name):
                    return offer
        return None

    def slot_uuid(self, parent: str, type_id: str, slot: int) -> str:
        """The mdev uuid of a slot: stable, so unbind finds the mdev that bind made."""
        return str(uuidlib.uuid5(_SLOT_NAMESPACE, f"{self.hostname}/{parent}/{type_id}/{slot}"))

    def _mdev_offers(self, pf: sysfs.PciFunction, vfs: list[sysfs.PciFunction]
                     ) -> list[VgpuOffer]:
        # Pre-Ampere: types on the PF. Ampere+ (mdev releases): types on each VF.
        parents = [pf] if os.path.isdir(pf.join("mdev_supported_types")) else [
            vf for vf in vfs if os.path.isdir(vf.join("mdev_supported_types"))]
        offers: dict[str, VgpuOffer] = {}
        for parent in parents:
            types_dir = parent.join("mdev_supported_types")
            for type_id in sysfs.list_dir(types_dir):
                tdir = os.path.join(types_dir, type_id)
                available = sysfs.read_int(os.path.join(tdir, "available_instances"))
                if available is None or sysfs.read_attr(os.path.join(tdir, "device_api")) is None:
                    continue  # both are mandatory in the mdev ABI
                name = sysfs.read_attr(os.path.join(tdir, "name")) or type_id
                if not self._enabled(type_id, name):
                    continue
                created = set(sysfs.list_dir(os.path.join(tdir, "devices")))
                candidates = available + len(created)
                ours = sum(1 for s in range(candidates)
                           if self.slot_uuid(parent.address, type_id, s) in created)
                offer = offers.setdefault(type_id, VgpuOffer(type_id, name, "mdev", []))
                for slot in range(available + ours):
                    offer.handles.append(AttachHandle(attach_type="MDEV", attach_info={
                        "parent": parent.address, "asked_type": type_id,
                        "vgpu_mark": f"{type_id}_{slot}",
                        "uuid": self.slot_uuid(parent.address, type_id, slot)}))
        return list(offers.values())

    def _vfio_offers(self, vfs: list[sysfs.PciFunction]) -> list[VgpuOffer]:
        """vGPU 17+: each VF takes one vGPU through ``nvidia/current_vgpu_type``."""
        per_vf = {vf.address: read_vgpu_types(vf.join("nvidia", "creatable_vgpu_types"))
                  for vf in vfs if os.path.isdir(vf.join("nvidia"))}
        names = {tid: name for types in per_vf.values() if types for tid, name in types.items()}
        offers: dict[str, VgpuOffer] = {}
        for address, creatable in per_vf.items():
            if creatable is None:
                continue
            current = sysfs.read_int(os.path.join(functions_path(self.root, address),
                                                  "nvidia", "current_vgpu_type"))
            if current is None:
                continue
            usable = set(creatable.values()) if current == 0 else (
                {names[current]} if current in names else set())
            for name in sorted(usable):
                if not self._enabled(name, name):
                    continue
                handle = pci_handle(address)
                handle.attach_info["vgpu_type"] = name
                offers.setdefault(name, VgpuOffer(name, name, "vfio", [])).handles.append(handle)
        return list(offers.values())

    # --- attach handles ----------------------------------------------------------

    def prepare_attach_handle(self, handle: AttachHandle) -> AttachHandle:
        info = handle.attach_info
        if handle.attach_type == "MDEV":
            if os.path.exists(self._mdev_path(info)):
                return handle  # already created (a retried bind)
            create = os.path.join(functions_path(self.root, info["parent"]),
                                  "mdev_supported_types", info["asked_type"], "create")
            try:
                sysfs.write_attr(create, info["uuid"])
            except OSError as exc:
                raise DriverError(f"could not create vGPU {info['uuid']} of type "
                                  f"{info['asked_type']} on {info['parent']}: {exc}") from exc
        elif handle.attach_type == "PCI" and "vgpu_type" in info:
            self._set_vfio_type(info, info["vgpu_type"])
        return handle

    def release_attach_handle(self, handle: AttachHandle) -> None:
        info = handle.attach_info
        if handle.attach_type == "MDEV":
            path = self._mdev_path(info)
            if not os.path.exists(path):
                return  # already gone
            try:
                sysfs.write_attr(os.path.join(path, "remove"), "1")
            except OSError as exc:
                raise DriverError(f"could not remove vGPU {info['uuid']}: {exc}") from exc
        elif handle.attach_type == "PCI" and "vgpu_type" in info:
            self._set_vfio_type(info, None)

    def prepared_attach_handles(self) -> list[AttachHandle]:
        """The mdevs acceld created: those whose uuid is the slot uuid
        (:meth:`slot_uuid`, derived from this host, the parent, the type and the slot) of
        a slot discovery offers. An mdev with any other uuid (made by Nova, libvirt or an
        operator) is never reported. Vendor-specific VFIO vGPU types carry no such mark
        and are not reported either."""
        found: list[AttachHandle] = []
        for parent in sorted(sysfs.list_dir(os.path.join(self.root, "class", "mdev_bus"))):
            types_dir = os.path.join(functions_path(self.root, parent), "mdev_supported_types")
            for type_id in sorted(sysfs.list_dir(types_dir)):
                tdir = os.path.join(types_dir, type_id)
                created = set(sysfs.list_dir(os.path.join(tdir, "devices")))
                if not created:
                    continue
                available = sysfs.read_int(os.path.join(tdir, "available_instances")) or 0
                for slot in range(available + len(created)):
                    uuid = self.slot_uuid(parent, type_id, slot)
                    if uuid in created:
                        found.append(AttachHandle(attach_type="MDEV", attach_info={
                            "parent": parent, "asked_type": type_id,
                            "vgpu_mark": f"{type_id}_{slot}", "uuid": uuid}))
        return found

    def _mdev_path(self, info: dict[str, str]) -> str:
        for key in ("parent", "asked_type", "uuid"):
            if key not in info:
                raise DriverError(f"MDEV attach handle lacks {key!r}: {info}")
        return os.path.join(self.root, "bus", "mdev", "devices", info["uuid"])

    def _set_vfio_type(self, info: dict[str, str], name: str | None) -> None:
        address = _address_of(info)
        vdir = os.path.join(functions_path(self.root, address), "nvidia")
        current = sysfs.read_int(os.path.join(vdir, "current_vgpu_type"))
        if current is None:
            raise DriverError(f"{address} has no nvidia/current_vgpu_type (vGPU manager "
                              f"not loaded or not a vGPU VF)")
        if name is None:
            value = 0
        else:
            creatable = read_vgpu_types(os.path.join(vdir, "creatable_vgpu_types")) or {}
            ids = [tid for tid, tname in creatable.items() if tname == name]
            if not ids:
                if current != 0:
                    return  # the VF already runs a vGPU; it is ours from an earlier try
                raise DriverError(f"vGPU type {name!r} cannot be created on {address} now")
            if current not in (0, ids[0]):
                raise DriverError(f"{address} already runs vGPU type id {current}")
            value = ids[0]
        try:
            sysfs.write_attr(os.path.join(vdir, "current_vgpu_type"), str(value))
        except OSError as exc:
            raise DriverError(f"could not set the vGPU type of {address}: {exc}") from exc


def functions_path(root: str, address: str) -> str:
    return os.path.join(sysfs.pci_devices_dir(root), address)


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


def _address_of(info: dict[str, str]) -> str:
    try:
        return f"{info['domain']}:{info['bus']}:{info['device']}.{info['function']}"
    except KeyError as exc:
        raise DriverError(f"PCI attach handle lacks {exc}: {info}") from exc


def _nvml_address(pci: Any) -> str:
    """NVML's bus id ('00000000:3B:00.0', bytes) as a sysfs address ('0000:3b:00.0')."""
    legacy = getattr(pci, "busIdLegacy", b"")
    if isinstance(legacy, bytes):
        legacy = legacy.decode("ascii", "replace")
    legacy = legacy.strip().lower()
    if sysfs.is_pci_address(legacy):
        return legacy
    return f"{pci.domain:04x}:{pci.bus:02x}:{pci.device:02x}.0"

