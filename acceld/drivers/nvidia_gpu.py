"""NVIDIA GPUs: whole GPUs (PGPU), vGPU types (VGPU), MIG state and GPU health.

Two sources, merged per PCI address:

- NVML (``nvidia-ml-py``, module ``pynvml``) when it imports and initialises: product
  name, GPU uuid, memory, driver version, MIG state, the vGPU types the GPU supports with
  their maximum instances, running vGPUs, and health (:mod:`acceld.drivers.nvidia_nvml`,
  :mod:`acceld.drivers.nvidia_health`).
- sysfs always: which functions are NVIDIA GPUs (vendor 0x10de *and* a display class, so
  NVSwitch bridges and HDMI audio functions are not GPUs), their driver binding, SR-IOV
  VFs, mdev vGPU types, the vGPU 17+ vendor-specific VFIO files, and PCIe AER/link health.
  Without NVML (no driver, or GPUs bound to vfio-pci, which NVML cannot see) sysfs alone
  describes the GPUs.

When NVML answers, a GPU bound to the ``nvidia`` driver that NVML does not enumerate is
looked up by its bus id: NotFound or NoPermission mean it is not this node's to offer (a
container sees every GPU in /sys but only its own through NVML) and it is left out; any
other error (GpuIsLost, Unknown ...) is a GPU in trouble, reported ``unhealthy`` with the
error's name.

Identity never depends on the source: the model and the traits come from the PCI device
id, so a GPU keeps them when NVML is down or when it is rebound from ``nvidia`` to
``vfio-pci``. Traits are upstream Cyborg's ``CUSTOM_NVIDIA_<PRODUCT_ID>`` (and
``CUSTOM_NVIDIA_<PRODUCT_ID>_<VGPU_TYPE>`` for vGPUs) with acceld's readable
``CUSTOM_NVIDIA_<PRODUCT>`` and ``CUSTOM_VGPU_<TYPE NAME>`` beside them.

What is offered (:mod:`acceld.drivers.nvidia_vgpu` plans the vGPU side):

- vGPUs of the first type in ``[nvidia_gpu] enabled_vgpu_types`` the GPU knows: one
  ``VGPU`` deployable whose handles never exceed what the card can hold;
- else the whole GPU (one ``PGPU`` deployable, one PCI handle), unless vGPU guests or live
  MIG devices run on it, or a configured type it should serve cannot be served (SR-IOV
  not enabled, the MIG instances a MIG-backed type needs missing, an unknown type name):
  then the hardware is ``setup_required`` with the reason and offers nothing.

mdev vGPUs are created by acceld when an ARQ binds (before it is Bound) under the uuid the
handle carries, which is also the attach handle's uuid; the consumer (Nova) attaches that
existing mdev and must not create or remove it. The kernel refuses a second mdev with the
same uuid, so the two can never both create it.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import uuid as uuidlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, Sequence

from acceld.drivers import sysfs
from acceld.drivers.base import (AttachHandle, Deployable, Driver, DriverError, HardwareRecord,
                                 hardware_uuid, pci_controlpath, pci_handle)
from acceld.drivers.health import Health, worst
from acceld.drivers.nvidia_health import DEFAULT_IGNORED_XIDS, XidMonitor, judge
from acceld.drivers.nvidia_nvml import (NvmlGpu, NvmlReport, capability_gpu_instances,
                                        read_nvml, set_gpu_instances)
from acceld.drivers.nvidia_vgpu import (MIN_SLOT_PROBE, VgpuPlan, VgpuPlanner, mdev_handle,
                                        read_vgpu_types)
from acceld.drivers.pci_health import PciHealthMonitor
from acceld.drivers.pci_isolation import one_offer_per_group, require_isolation
from acceld.drivers.remembered_ids import RememberedIds
from acceld.drivers.traits import attributes, trait_part

if TYPE_CHECKING:
    from oslo_config import cfg

__all__ = ["NvidiaGpuDriver", "product_of", "upstream_vgpu_trait", "read_vgpu_types"]

LOG = logging.getLogger(__name__)

VENDOR = "0x10de"
# Display classes (base+sub): VGA, 3D controller, other display. Not 0x0680 (NVSwitch)
# nor 0x0403 (the HDMI audio function of consumer cards).
GPU_CLASSES = {0x0300, 0x0302, 0x0380}
# Device id -> product, for acceld's readable trait and the model.
PRODUCTS = {
    "0x1eb8": "T4", "0x20b0": "A100", "0x20b2": "A100_80GB", "0x20b5": "A100_80GB",
    "0x20b7": "A30", "0x2235": "A40", "0x2330": "H100", "0x2331": "H100",
    "0x2321": "H100_NVL", "0x2335": "H200", "0x233b": "H200_NVL",
}
_SLOT_NAMESPACE = uuidlib.UUID("1f0a8a0e-6f4c-4b53-9a57-6a0c8f3d2b11")


def product_of(device_id: str) -> str:
    """The readable product: from the id table, else the device id ('2684'). Never from
    NVML, so that it does not change when NVML is away."""
    return PRODUCTS.get(device_id) or device_id[2:].upper()


def upstream_product_id(device_id: str) -> str:
    """Upstream's ``<PRODUCT_ID>``: lspci's hex device id, upper-cased ('2335')."""
    return device_id[2:].upper() if device_id.startswith("0x") else device_id.upper()


def upstream_vgpu_trait(device_id: str, vgpu_name: str) -> str:
    """``CUSTOM_NVIDIA_<PRODUCT_ID>_<type>``, the type being the vGPU name's second word
    with '-' as '_' (upstream: 'GRID T4-2B' on 1eb8 -> CUSTOM_NVIDIA_1EB8_T4_2B)."""
    words = vgpu_name.split()
    part = words[1] if len(words) > 1 else vgpu_name
    return f"CUSTOM_NVIDIA_{upstream_product_id(device_id)}_{trait_part(part)}"


def _load_pynvml() -> ModuleType | None:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


class NvidiaGpuDriver(Driver):
    """NVIDIA GPUs through NVML when available, sysfs always."""

    name = "nvidia_gpu"
    hardware_type = "GPU"

    def __init__(self, conf: "cfg.ConfigOpts", hostname: str,
                 nvml: ModuleType | None = None) -> None:
        super().__init__(conf, hostname)
        self.opts = conf.nvidia_gpu
        self.root = self.opts.sysfs_root
        # Tests pass a stand-in module; production imports pynvml lazily.
        self._nvml = nvml
        self._learnt_names: dict[str, dict[int, str]] = {}
        self._pci_health = PciHealthMonitor()
        self._xids: XidMonitor | None = None
        self._said: set[str] = set()
        # The NVLink fabric clique last read through NVML, so that its trait stays while
        # NVML is away (and across restarts, under state_path).
        state_path = getattr(conf, "state_path", None)
        self._fabric_ids = RememberedIds(os.path.join(state_path, self.name)
                                         if state_path else None)

    @classmethod
    def claims_pci(cls, conf: "cfg.ConfigOpts", function: sysfs.PciFunction) -> bool:
        """NVIDIA display-class functions (GPUs and their VFs): the ``pci`` driver leaves
        them to this one (acceld.drivers.claims)."""
        return function.vendor == VENDOR and function.class_prefix in GPU_CLASSES

    # --- NVML ------------------------------------------------------------------

    def _nvml_module(self) -> ModuleType | None:
        if not self.opts.use_nvml:
            return None
        return self._nvml if self._nvml is not None else _load_pynvml()

    def read_nvml(self, probe_addresses: Sequence[str] = ()) -> NvmlReport | None:
        """Everything NVML knows, or None (not installed, no driver, disabled)."""
        nvml = self._nvml_module()
        if nvml is None:
            return None
        report = read_nvml(nvml, probe_addresses)
        for gpu in (report.gpus.values() if report else ()):
            if gpu.gpu_instances_error and gpu.gpu_instances_error.startswith("NoPermission"):
                self._read_gpu_instances_elsewhere(gpu)
        return report

    def _read_gpu_instances_elsewhere(self, gpu: NvmlGpu) -> None:
        """NVML refused this (unprivileged) process the GPU instances: read them through
        the privsep daemon; failing that, their ids from the MIG capability files (no
        profiles); failing that, they stay unknown and ``gpu_instances_error`` says why."""
        try:
            # Lazily: the offline GPU check (bench/gpu_check.py) runs without oslo.
            from acceld import privileged

            privileged.adopt(self.conf, "nvidia_gpu")
            instances = privileged.read_gpu_instances(gpu.address)
        except Exception as exc:  # noqa: BLE001 - no daemon, refused, NVML error: fall back
            said = f"{gpu.address}: {exc}"
            if said not in self._said:  # once per GPU and reason, not every discovery
                self._said.add(said)
                LOG.warning("nvidia_gpu: NVML refused the GPU instances of %s to this process "
                            "(%s) and the privsep daemon could not read them either (%s)",
                            gpu.address, gpu.gpu_instances_error, exc)
        else:
            set_gpu_instances(gpu, instances, "privsep")
            gpu.gpu_instances_error = None  # read after all: the source says how
            return
        if gpu.minor_number is None:
            return
        ids = capability_gpu_instances(getattr(self.opts, "proc_root", "/proc"),
                                       gpu.minor_number)
        if ids is not None:
            gpu.gpu_instance_ids = ids
            gpu.gpu_instances_source = "capabilities"

    def _critical_xids(self) -> tuple[dict[str, list[int]], dict[str, int]]:
        nvml = self._nvml_module()
        if nvml is None:
            return {}, {}
        if self._xids is None:
            ignored = getattr(self.opts, "ignored_xids", None)
            self._xids = XidMonitor(nvml, set(DEFAULT_IGNORED_XIDS if ignored is None
                                              else ignored))
        seen = self._xids.poll()
        return seen, dict(self._xids.totals)

    def close(self) -> None:
        """Release the XID event set (and NVML's reference) the driver holds."""
        if self._xids is not None:
            self._xids.close()
            self._xids = None

    # --- discovery -------------------------------------------------------------

    def discover(self) -> list[HardwareRecord]:
        functions = {f.address: f for f in sysfs.list_pci_functions(self.root, vendors=[VENDOR])}
        gpus = {a for a, f in functions.items() if f.class_prefix in GPU_CLASSES and not f.is_vf}
        bound_nvidia = sorted(a for a in gpus if functions[a].driver == "nvidia")
        report = self.read_nvml(bound_nvidia)
        nvml_gpus = report.gpus if report else {}
        failed = report.failed if report else {}
        xids, xid_totals = self._critical_xids() if report else ({}, {})
        if report:
            hidden = [a for a in bound_nvidia if a not in nvml_gpus and a not in failed]
            if hidden:
                LOG.info("nvidia_gpu: %s bound to nvidia but not visible to NVML here (another "
                         "container's or host's GPUs); not reported", ", ".join(hidden))
            gpus -= set(hidden)
        driver_version = (report.driver_version if report and report.driver_version
                          else sysfs.read_attr(os.path.join(self.root, "module", "nvidia",
                                                            "version")))
        addresses = sorted(gpus | set(nvml_gpus))
        planner = VgpuPlanner(list(self.opts.enabled_vgpu_types),
                              dict(getattr(self.opts, "vgpu_max_instances", None) or {}),
                              self.slot_uuid, self._learnt_names)
        plans = {}
        for address in addresses:
            function = functions.get(address)
            if function is not None:
                vfs = [functions[a] for a in function.virtfns if a in functions]
                plans[address] = planner.plan(function, vfs, nvml_gpus.get(address))
        known = set().union(*(p.known_names for p in plans.values())) if plans else set()
        unknown = [t for t in self.opts.enabled_vgpu_types if t not in known]
        self._pci_health.forget({a for a in addresses if a in functions})
        records = []
        for address in addresses:
            health = worst(
                judge(nvml_gpus.get(address), failure=failed.get(address),
                      xids=xids.get(address, []),
                      xid_total=xid_totals.get(address, 0)),
                self._pci_health.check(address, functions[address].path, judge_speed=False)
                if address in functions else Health())
            record = self._record(address, functions.get(address), nvml_gpus.get(address),
                                  plans.get(address), unknown, driver_version, report, health)
            # A GPU whose IOMMU group holds a function the host keeps (the HDMI audio
            # function on snd_hda_intel), or the host's console, cannot go to a VM.
            records.append(require_isolation(record, self.root))
        return one_offer_per_group(records, self.root)

    def _record(self, address: str, function: sysfs.PciFunction | None, gpu: NvmlGpu | None,
                plan: VgpuPlan | None, unknown_types: list[str], driver_version: str | None,
                report: NvmlReport | None, health: Health) -> HardwareRecord:
        device_id = function.device if function else (gpu.device_id if gpu else "0x0000")
        product = product_of(device_id)
        vendor_info: dict[str, Any] = {"product": product, "discovered_by":
                                       "nvml" if gpu else "sysfs"}
        if driver_version:
            vendor_info["driver_version"] = driver_version
        if report and report.cuda_driver_version:
            vendor_info["cuda_driver_version"] = report.cuda_driver_version
        if gpu:
            for key, value in (("name", gpu.name), ("gpu_uuid", gpu.gpu_uuid),
                               ("serial", gpu.serial), ("memory_mib", gpu.memory_mib),
                               ("mig_mode", gpu.mig_mode),
                               ("mig_mode_pending", gpu.mig_mode_pending)):
                if value is not None:
                    vendor_info[key] = value
            if gpu.mig_mode == "enabled":
                vendor_info["mig_devices"] = gpu.mig_devices
                profiles = gpu.gpu_instance_profiles or [None] * len(gpu.gpu_instance_ids)
                vendor_info["mig_gpu_instances"] = [
                    {"gpu_instance_id": gi, "profile_id": profile}
                    for gi, profile in zip(gpu.gpu_instance_ids, profiles)]
                for key, value in (("mig_gpu_instances_source", gpu.gpu_instances_source),
                                   ("mig_gpu_instances_error", gpu.gpu_instances_error)):
                    if value is not None:
                        vendor_info[key] = value
        std_info = function.std_board_info() if function else {"vendor_id": VENDOR,
                                                                "product_id": device_id}
        traits = [f"CUSTOM_NVIDIA_{upstream_product_id(device_id)}", f"CUSTOM_NVIDIA_{product}"]
        clique = self._fabric_clique(function, gpu)
        if clique is not None:
            traits.append(f"CUSTOM_NVIDIA_FABRIC_CLIQUE_{clique}")
            vendor_info["fabric_clique_id"] = int(clique)
        if gpu and gpu.fabric:
            vendor_info["fabric_state"] = gpu.fabric.state
            for key, value in (("fabric_status", gpu.fabric.status),
                               ("fabric_cluster_uuid", gpu.fabric.cluster_uuid)):
                if value is not None:
                    vendor_info[key] = value
        deployables, status, reason = self._offer(address, device_id, traits, gpu, plan,
                                                  unknown_types)
        if plan and plan.offer:
            vendor_info["vgpu_capacity_source"] = plan.offer.capacity_source
        return HardwareRecord(
            uuid=hardware_uuid(self.hostname, self.name, address),
            type="GPU", vendor=VENDOR, model=f"NVIDIA {product}", driver_name=self.name,
            controlpath_id=pci_controlpath(address),
            acc_specs={"device_type": "GPU", "remote": False,
                       "num": sum(d.num_accelerators for d in deployables)},
            acc_status=status, status_reason=reason,
            std_board_info=std_info, vendor_board_info=vendor_info,
            deployables=deployables, health=health.to_dict())

    def _offer(self, address: str, device_id: str, traits: list[str], gpu: NvmlGpu | None,
               plan: VgpuPlan | None, unknown_types: list[str]
               ) -> tuple[list[Deployable], str, str | None]:
        """The deployables, acc_status and status_reason of one GPU."""
        fabric = gpu.fabric if gpu else None
        if fabric and fabric.state != "completed":
            return [], "setup_required", (
                f"NVLink fabric not initialised (state {fabric.state}): the Fabric Manager "
                f"(nvidia-fabricmanager) has not registered this GPU yet; CUDA refuses work "
                f"on it until then")
        if fabric and fabric.status not in (None, "Success"):
            return [], "setup_required", (
                f"NVLink fabric registration failed ({fabric.status}): see the Fabric "
                f"Manager's log")
        if gpu and gpu.mig_mode_pending:
            # What the GPU can offer (whole, vGPU types, MIG-backed types) changes at the
            # reset that applies the mode: nothing until then.
            return [], "reboot_required", (
                f"MIG mode is {gpu.mig_mode}, {gpu.mig_mode_pending} at the next GPU reset "
                f"(nvidia-smi -r -i {address}, or a reboot): nothing offered until then")
        if plan and plan.offer:
            offer = plan.offer
            if not offer.handles:
                return [], "ready", None  # full of vGPUs another tool made
            vgpu_traits = [upstream_vgpu_trait(device_id, offer.name), *traits,
                           f"CUSTOM_VGPU_{trait_part(offer.name)}"]
            return [Deployable(
                name=f"{address}_{re.sub(r'[^A-Za-z0-9_.:-]', '_', offer.key)}",
                num_accelerators=len(offer.handles),
                attributes=attributes("VGPU", vgpu_traits, vgpu_type=offer.key,
                                      vgpu_name=offer.name, vgpu_kind=offer.kind),
                attach_handles=offer.handles)], "ready", None
        if plan and plan.setup_reason:
            return [], "setup_required", plan.setup_reason
        if plan and plan.unmatched and unknown_types:
            offers = ", ".join(sorted(n for n in plan.known_names if not n.startswith("nvidia-")))
            return [], "setup_required", (
                f"configured vGPU type(s) {', '.join(map(repr, unknown_types))} unknown on this "
                f"host; {address} offers: {offers or 'no vGPU types'}")
        if plan and plan.busy_reason:
            return [], "setup_required", (
                f"not offered whole: {plan.busy_reason} (enable their type in [nvidia_gpu] "
                f"enabled_vgpu_types to offer it as vGPUs)")
        if gpu and gpu.mig_devices:
            return [], "setup_required", (
                f"not offered whole: {len(gpu.mig_devices)} MIG device(s) live on it")
        if gpu and gpu.mig_mode == "enabled" and gpu.gpu_instances_source is None \
                and gpu.gpu_instances_error:
            # Whether MIG partitions exist is unknown: when in doubt, not whole.
            return [], "setup_required", (
                f"not offered whole: its MIG GPU instances cannot be read (NVML: "
                f"{gpu.gpu_instances_error}; the privsep daemon and the MIG capability files "
                f"did not tell either)")
        if gpu and gpu.gpu_instance_ids:
            # GPU instances without compute instances are still MIG partitions someone made
            # (MIG-backed vGPUs need only the GPU instance): the GPU is not free whole.
            return [], "setup_required", (
                f"not offered whole: {len(gpu.gpu_instance_ids)} MIG GPU instance(s) exist "
                f"on it (ids {', '.join(map(str, sorted(gpu.gpu_instance_ids)))})")
        return [Deployable(name=address, num_accelerators=1,
                           attributes=attributes("PGPU", traits),
                           attach_handles=[pci_handle(address)])], "ready", None

    def _fabric_clique(self, function: sysfs.PciFunction | None,
                       gpu: NvmlGpu | None) -> str | None:
        """The GPU's NVLink fabric clique (the partition its VMs' GPUs must share), as NVML
        says once registration completed; the last one read while NVML is away."""
        fabric = gpu.fabric if gpu else None
        if fabric and fabric.state == "completed" and fabric.clique_id is not None:
            if function is not None:
                self._fabric_ids.put("fabric_clique_id", function, str(fabric.clique_id))
            return str(fabric.clique_id)
        if gpu is None and function is not None:
            return self._fabric_ids.get("fabric_clique_id", function)
        return None

    # --- vGPU ------------------------------------------------------------------

    def slot_uuid(self, parent: str, type_id: str, slot: int) -> str:
        """The mdev uuid of a slot: stable, so unbind finds the mdev that bind made, and
        derived from this host, so no other tool's mdev is ever taken for acceld's."""
        return str(uuidlib.uuid5(_SLOT_NAMESPACE, f"{self.hostname}/{parent}/{type_id}/{slot}"))

    # --- attach handles ----------------------------------------------------------

    def prepare_attach_handle(self, handle: AttachHandle) -> AttachHandle:
        info = handle.attach_info
        if handle.attach_type == "MDEV":
            parent, type_id, path = self._mdev_target(info)
            if os.path.exists(path):
                made_as = sysfs.link_name(os.path.join(path, "mdev_type"))
                if made_as not in (None, type_id):
                    raise DriverError(f"mdev {info['uuid']} exists as type {made_as}, not "
                                      f"{type_id}")
                return handle  # already created (a retried bind)
            create = os.path.join(functions_path(self.root, parent), "mdev_supported_types",
                                  type_id, "create")
            try:
                self._write_attr(create, info["uuid"])
            except OSError as exc:
                raise DriverError(f"could not create vGPU {info['uuid']} of type "
                                  f"{type_id} on {parent}: {exc}") from exc
        elif handle.attach_type == "PCI" and "vgpu_type" in info:
            self._set_vfio_type(info, info["vgpu_type"])
        return handle

    def _write_attr(self, path: str, value: str) -> None:
        """A privileged sysfs write, checked in process against this driver's config
        (acceld.privileged.adopt). Adopted here rather than when the driver is built: the
        offline GPU check (bench/gpu_check.py) runs discovery with the standard library
        alone, and acceld.privileged needs oslo."""
        from acceld import privileged

        privileged.adopt(self.conf, "nvidia_gpu")
        sysfs.write_attr(path, value)

    def release_attach_handle(self, handle: AttachHandle) -> None:
        info = handle.attach_info
        if handle.attach_type == "MDEV":
            _parent, _type_id, path = self._mdev_target(info)
            if not os.path.exists(path):
                return  # already gone
            try:
                self._write_attr(os.path.join(path, "remove"), "1")
            except OSError as exc:
                raise DriverError(f"could not remove vGPU {info['uuid']}: {exc}") from exc
        elif handle.attach_type == "PCI" and "vgpu_type" in info:
            self._set_vfio_type(info, None)

    def prepared_attach_handles(self) -> list[AttachHandle]:
        """The mdevs acceld created: those whose uuid is a slot uuid (:meth:`slot_uuid`) of
        their parent and type. An mdev with any other uuid (made by Nova, libvirt or an
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
                for slot in range(max(MIN_SLOT_PROBE, available + len(created))):
                    uuid = self.slot_uuid(parent, type_id, slot)
                    if uuid in created:
                        found.append(mdev_handle(parent, type_id, slot, uuid))
        return found

    def _mdev_target(self, info: dict[str, str]) -> tuple[str, str, str]:
        """(parent address, type id, /sys/bus/mdev/devices/<uuid>) of an MDEV handle."""
        for key in ("asked_type", "uuid"):
            if key not in info:
                raise DriverError(f"MDEV attach handle lacks {key!r}: {info}")
        # Handles stored before upstream's keys named the parent as "parent".
        legacy = info.get("parent") if "domain" not in info else None
        if legacy is not None and not sysfs.is_pci_address(legacy):
            raise DriverError(f"attach handle names no PCI address: {info}")
        parent = legacy or _address_of(info)
        return parent, info["asked_type"], os.path.join(self.root, "bus", "mdev", "devices",
                                                        info["uuid"])

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
                if current != 0 and self._type_name(address, current) == name:
                    return  # the VF already runs it: ours from an earlier try
                if current != 0:
                    raise DriverError(f"{address} already runs vGPU type id {current}")
                raise DriverError(f"vGPU type {name!r} cannot be created on {address} now")
            if current not in (0, ids[0]):
                raise DriverError(f"{address} already runs vGPU type id {current}")
            value = ids[0]
        try:
            self._write_attr(os.path.join(vdir, "current_vgpu_type"), str(value))
        except OSError as exc:
            raise DriverError(f"could not set the vGPU type of {address}: {exc}") from exc

    def _type_name(self, vf: str, type_id: int) -> str | None:
        """A vendor type id's name as discovery learnt it for the VF's GPU."""
        physfn = sysfs.link_name(os.path.join(functions_path(self.root, vf), "physfn"))
        return self._learnt_names.get(physfn or "", {}).get(type_id)


def functions_path(root: str, address: str) -> str:
    return os.path.join(sysfs.pci_devices_dir(root), address)


def _address_of(info: dict[str, str]) -> str:
    try:
        address = f"{info['domain']}:{info['bus']}:{info['device']}.{info['function']}"
    except KeyError as exc:
        raise DriverError(f"attach handle lacks {exc}: {info}") from exc
    if not sysfs.is_pci_address(address):
        raise DriverError(f"attach handle names no PCI address: {info}")
    return address
