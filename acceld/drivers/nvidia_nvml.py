"""What NVML (``nvidia-ml-py``, module ``pynvml``) says about this node's NVIDIA GPUs.

Reading only: identity (name, uuid, memory), MIG state, the vGPU types a GPU supports with
NVML's maximum instances per type, the vGPU instances running on it, and the health facts
the driver judges (volatile uncorrectable ECC errors, pending page retirement, row
remapping). Each fact NVML refuses (NotSupported on a T4, NoPermission, an old driver
without the function) is left out alone; it never loses the GPU.

Kept free of anything beyond the standard library (the module object is passed in), so the
offline GPU check (``bench/gpu_check.py``) runs it where no package index is reachable.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import uuid
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Sequence

LOG = logging.getLogger(__name__)

_MIB = 1024 * 1024
# nvmlVgpuTypeGetGpuInstanceProfileId answers this for time-sliced (not MIG-backed) types.
NO_GPU_INSTANCE_PROFILE = 0xFFFFFFFF
# GPU instance ids are small (7 instances at most, ids below 15 on A100/H100/H200).
_MAX_GPU_INSTANCE_ID = 32
# pynvml's constants, with their values in case an old binding lacks one.
_VOLATILE_ECC = 0
_UNCORRECTED = 1
_FEATURE_ENABLED = 1


@dataclass
class NvmlVgpuType:
    """One vGPU type a GPU supports (``nvmlDeviceGetSupportedVgpus``: it never empties)."""

    type_id: int
    name: str
    max_instances: int | None = None  # nvmlVgpuTypeGetMaxInstances on this GPU
    gpu_instance_profile: int | None = None  # MIG-backed types: the GI profile id they need


@dataclass
class NvmlHealthFacts:
    """Raw facts the health judgement reads; None where NVML did not answer."""

    ecc_volatile_uncorrected: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows: tuple[int, int, bool, bool] | None = None  # corr, unc, pending, failure
    lost: bool = False


# nvmlGpuFabricState_t
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


@dataclass
class NvmlFabric:
    """A GPU's NVLink fabric registration (``nvmlDeviceGetGpuFabricInfo``): on HGX systems
    with NVSwitch the Fabric Manager registers each GPU; CUDA refuses work on a GPU whose
    registration has not completed ("system not yet initialized")."""

    state: str  # not_started | in_progress | completed (not_supported is not kept)
    status: str | None = None  # once completed: 'Success' or the NVML error's name
    cluster_uuid: str | None = None  # the NVLink domain (all zeros: none)
    clique_id: int | None = None  # the GPUs' fabric partition (v1: partitionId)


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
    # The mode at the next GPU reset, when it differs from the current one (nvidia-smi -mig 1
    # on a GPU in use, or before the reset that applies it): None when nothing is pending.
    mig_mode_pending: str | None = None
    mig_devices: list[dict[str, Any]] = field(default_factory=list)
    gpu_instance_profiles: list[int] = field(default_factory=list)  # one per GPU instance
    gpu_instance_ids: list[int] = field(default_factory=list)  # the same instances' ids
    # Where the GPU instances were read: 'nvml' (this process), 'privsep' (the privileged
    # daemon, when NVML refused this process), 'capabilities' (the MIG capability files:
    # ids only, no profiles); None when they could not be read at all.
    gpu_instances_source: str | None = None
    # How NVML refused to list them in this process ('NoPermission (4: Insufficient
    # Permissions)': NVML documents nvmlDeviceGetGpuInstanceById as needing a privileged
    # user); None when it did not.
    gpu_instances_error: str | None = None
    minor_number: int | None = None  # the N of /dev/nvidiaN (MIG capability files' gpuN)
    fabric: NvmlFabric | None = None  # None: no NVLink fabric (PCIe boards, old drivers)
    vgpu_types: dict[int, NvmlVgpuType] = field(default_factory=dict)
    active_vgpu_types: list[int] = field(default_factory=list)  # a type id per running vGPU
    health: NvmlHealthFacts = field(default_factory=NvmlHealthFacts)


@dataclass
class NvmlReport:
    gpus: dict[str, NvmlGpu]
    driver_version: str | None
    cuda_driver_version: int | None
    # GPUs NVML cannot read (GpuIsLost, Unknown, ...), sysfs address -> the error as
    # error_name() gives it: known only by bus id lookups. A GPU answering NotFound or
    # NoPermission is not here: it is not this node's (another container's).
    failed: dict[str, str] = field(default_factory=dict)


# Errors that mean "not this node's GPU" (a container sees every GPU in /sys but only its
# own through NVML); every other error is a GPU in trouble.
NOT_OURS = frozenset({"NoPermission", "NotFound"})
_ERROR_NAMES = {1: "Uninitialized", 2: "InvalidArgument", 3: "NotSupported",
                4: "NoPermission", 6: "NotFound", 9: "DriverNotLoaded", 10: "Timeout",
                12: "LibraryNotFound", 13: "FunctionNotFound", 15: "GpuIsLost",
                999: "Unknown"}


def error_name(exc: BaseException) -> str:
    """An NVMLError's short name ('GpuIsLost', 'Unknown'), from its class
    (``NVMLError_Unknown``) or its code."""
    cls = type(exc).__name__
    if cls.startswith("NVMLError_"):
        return cls[len("NVMLError_"):]
    value = getattr(exc, "value", None)
    return _ERROR_NAMES.get(value, f"error {value}") if isinstance(value, int) else cls


def error_text(exc: BaseException) -> str:
    """How the failure reads in a reason: 'Unknown (999: Unknown Error)'."""
    value = getattr(exc, "value", None)
    return f"{error_name(exc)} ({value}: {exc})" if isinstance(value, int) else str(exc)


def nvml_address(pci: Any) -> str:
    """NVML's bus id ('00000000:3B:00.0', bytes) as a sysfs address ('0000:3b:00.0')."""
    legacy = getattr(pci, "busIdLegacy", b"")
    if isinstance(legacy, bytes):
        legacy = legacy.decode("ascii", "replace")
    legacy = legacy.strip().lower()
    if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", legacy):
        return legacy
    return f"{pci.domain:04x}:{pci.bus:02x}:{pci.device:02x}.0"


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class NvmlReader:
    """One pass over NVML between an init and a shutdown the caller owns."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml

    def soft(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A call whose failure (NotSupported, NoPermission, ...) only loses one fact."""
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None

    def read(self, probe_addresses: Sequence[str] = ()) -> NvmlReport:
        """Every GPU NVML enumerates; ``probe_addresses`` (GPUs sysfs shows bound to the
        nvidia driver that enumeration missed) are looked up by bus id to tell a lost GPU."""
        nvml = self.nvml
        gpus: dict[str, NvmlGpu] = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                pci = nvml.nvmlDeviceGetPciInfo(handle)
            except nvml.NVMLError as exc:
                LOG.warning("nvidia_gpu: NVML GPU %d unreadable (%s)", index, exc)
                continue
            gpu = self.read_gpu(handle, pci)
            gpus[gpu.address] = gpu
        failed: dict[str, str] = {}
        for address in probe_addresses:
            if address in gpus:
                continue
            found = self._probe(address)
            if isinstance(found, NvmlGpu):
                gpus[address] = found
            elif found is not None:
                failed[address] = found
        return NvmlReport(gpus=gpus,
                          driver_version=_text(self.soft(nvml.nvmlSystemGetDriverVersion)),
                          cuda_driver_version=self.soft(nvml.nvmlSystemGetCudaDriverVersion),
                          failed=failed)

    def _probe(self, address: str) -> NvmlGpu | str | None:
        """A GPU sysfs shows on nvidia that enumeration missed, by its bus id: read when it
        answers; None when NVML says it is not ours (NotFound, NoPermission); else the
        failure (GpuIsLost, Unknown ...), which makes it unhealthy, never dropped."""
        nvml = self.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByPciBusId(address)
            pci = nvml.nvmlDeviceGetPciInfo(handle)
        except nvml.NVMLError as exc:
            if error_name(exc) in NOT_OURS:
                return None
            LOG.warning("nvidia_gpu: NVML cannot reach %s: %s", address, error_text(exc))
            return error_text(exc)
        return self.read_gpu(handle, pci)

    def read_gpu(self, handle: Any, pci: Any) -> NvmlGpu:
        nvml, soft = self.nvml, self.soft
        gpu = NvmlGpu(address=nvml_address(pci),
                      device_id=f"0x{(pci.pciDeviceId >> 16) & 0xffff:04x}")
        gpu.name = _text(soft(nvml.nvmlDeviceGetName, handle))
        gpu.gpu_uuid = _text(soft(nvml.nvmlDeviceGetUUID, handle))
        gpu.serial = _text(soft(nvml.nvmlDeviceGetSerial, handle))
        memory = soft(nvml.nvmlDeviceGetMemoryInfo, handle)
        if memory is not None:
            gpu.memory_mib = int(memory.total) // _MIB
        minor = soft(nvml.nvmlDeviceGetMinorNumber, handle)
        gpu.minor_number = int(minor) if minor is not None else None
        self._read_mig(handle, gpu)
        gpu.fabric = self._read_fabric(handle)
        self._read_vgpu(handle, gpu)
        self._read_health(handle, gpu)
        return gpu

    def _read_mig(self, handle: Any, gpu: NvmlGpu) -> None:
        nvml, soft = self.nvml, self.soft
        try:
            current, pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError:  # NotSupported on GPUs without MIG (T4, A40, L40S ...)
            return
        enable = nvml.NVML_DEVICE_MIG_ENABLE
        gpu.mig_mode = "enabled" if current == enable else "disabled"
        if pending != current:
            gpu.mig_mode_pending = "enabled" if pending == enable else "disabled"
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return
        for index in range(soft(nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except nvml.NVMLError:  # NotFound: an empty slot
                continue
            memory = soft(nvml.nvmlDeviceGetMemoryInfo, mig)
            gpu.mig_devices.append({
                "uuid": _text(soft(nvml.nvmlDeviceGetUUID, mig)),
                "gpu_instance_id": soft(nvml.nvmlDeviceGetGpuInstanceId, mig),
                "compute_instance_id": soft(nvml.nvmlDeviceGetComputeInstanceId, mig),
                "memory_mib": int(memory.total) // _MIB if memory is not None else None,
            })
        # GPU instances exist without compute instances (MIG-backed vGPUs need only the GI),
        # so they are probed by id rather than found through MIG device handles.
        try:
            instances = probe_gpu_instances(nvml, handle)
        except nvml.NVMLError as exc:
            gpu.gpu_instances_error = error_text(exc)
            LOG.info("nvidia_gpu: NVML refused to list the GPU instances of %s: %s",
                     gpu.address, gpu.gpu_instances_error)
            return
        set_gpu_instances(gpu, instances, "nvml")

    def _read_fabric(self, handle: Any) -> NvmlFabric | None:
        """The GPU's fabric info; None where NVML has none (NotSupported, a binding or
        driver without the call, state not_supported)."""
        nvml = self.nvml
        struct = getattr(nvml, "c_nvmlGpuFabricInfo_t", None)
        call = getattr(nvml, "nvmlDeviceGetGpuFabricInfo", None)
        if struct is None or call is None:
            return None
        info = struct()
        try:
            call(handle, ctypes.byref(info))
        except nvml.NVMLError:
            return None
        state = FABRIC_STATES.get(int(info.state), f"state {int(info.state)}")
        if state == "not_supported":
            return None
        fabric = NvmlFabric(state=state)
        if state == "completed":
            status = int(info.status)
            fabric.status = "Success" if status == 0 else _ERROR_NAMES.get(status,
                                                                             f"error {status}")
            # A c_char array reads up to its first NUL: take the 16 bytes themselves.
            raw = ctypes.string_at(ctypes.addressof(info) + type(info).clusterUuid.offset, 16)
            fabric.cluster_uuid = str(uuid.UUID(bytes=raw))
            clique = getattr(info, "cliqueId", getattr(info, "partitionId", None))
            fabric.clique_id = int(clique) if clique is not None else None
        return fabric

    def _read_vgpu(self, handle: Any, gpu: NvmlGpu) -> None:
        nvml, soft = self.nvml, self.soft
        for type_id in soft(nvml.nvmlDeviceGetSupportedVgpus, handle) or []:
            type_id = int(type_id)
            name = _text(soft(nvml.nvmlVgpuTypeGetName, type_id))
            if not name:
                continue
            profile = soft(nvml.nvmlVgpuTypeGetGpuInstanceProfileId, type_id)
            gpu.vgpu_types[type_id] = NvmlVgpuType(
                type_id=type_id, name=str(name).strip(),
                max_instances=soft(nvml.nvmlVgpuTypeGetMaxInstances, handle, type_id),
                gpu_instance_profile=(None if profile in (None, NO_GPU_INSTANCE_PROFILE)
                                      else int(profile)))
        for instance in soft(nvml.nvmlDeviceGetActiveVgpus, handle) or []:
            type_id = soft(nvml.nvmlVgpuInstanceGetType, instance)
            gpu.active_vgpu_types.append(int(type_id) if type_id is not None else -1)

    def _read_health(self, handle: Any, gpu: NvmlGpu) -> None:
        nvml, soft = self.nvml, self.soft
        facts = gpu.health
        facts.ecc_volatile_uncorrected = soft(
            nvml.nvmlDeviceGetTotalEccErrors, handle,
            getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", _UNCORRECTED),
            getattr(nvml, "NVML_VOLATILE_ECC", _VOLATILE_ECC))
        pending = soft(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        if pending is not None:
            facts.retired_pages_pending = int(pending) == getattr(
                nvml, "NVML_FEATURE_ENABLED", _FEATURE_ENABLED)
        rows = soft(nvml.nvmlDeviceGetRemappedRows, handle)
        if rows is not None:
            corr, unc, is_pending, failure = rows
            facts.remapped_rows = (int(corr), int(unc), bool(is_pending), bool(failure))


def probe_gpu_instances(nvml: ModuleType, handle: Any) -> list[tuple[int, int]]:
    """(GPU instance id, profile id) of every GPU instance on a MIG-enabled GPU, probed by
    id. Raises the NVMLError of a refusal that is not about one id (NoPermission: NVML
    wants a privileged user); NotFound/InvalidArgument for an id is "no such instance"."""
    found: list[tuple[int, int]] = []
    for gi_id in range(1, _MAX_GPU_INSTANCE_ID):
        try:
            instance = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
            info = nvml.nvmlGpuInstanceGetInfo(instance)
        except nvml.NVMLError as exc:
            if error_name(exc) in ("NotFound", "InvalidArgument"):
                continue
            raise
        found.append((int(getattr(info, "id", gi_id)), int(info.profileId)))
    return found


def set_gpu_instances(gpu: NvmlGpu, instances: Sequence[Sequence[int]], source: str) -> None:
    gpu.gpu_instance_ids = [int(i[0]) for i in instances]
    gpu.gpu_instance_profiles = [int(i[1]) for i in instances]
    gpu.gpu_instances_source = source


def gpu_instances_at(nvml: ModuleType, address: str) -> list[tuple[int, int]]:
    """The GPU instances of the GPU at ``address``, in a process of its own NVML session
    (the privileged daemon: acceld.privileged.read_gpu_instances)."""
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByPciBusId(address)
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        return probe_gpu_instances(nvml, handle)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def capability_gpu_instances(proc_root: str, minor: int) -> list[int] | None:
    """GPU instance ids from the MIG capability files every user may read: the driver
    keeps ``<proc>/driver/nvidia/capabilities/gpu<minor>/mig/gi<id>/access`` for each GPU
    instance that exists (NVIDIA's MIG user guide, "Device Nodes and Capabilities").
    None when the GPU's ``mig`` directory is not there (no such files on this host)."""
    base = os.path.join(proc_root, "driver", "nvidia", "capabilities", f"gpu{minor}", "mig")
    try:
        names = os.listdir(base)
    except OSError:
        return None
    ids = [int(n[2:]) for n in names if re.fullmatch(r"gi\d+", n)
           and os.path.exists(os.path.join(base, n, "access"))]
    return sorted(ids)


def read_nvml(nvml: ModuleType, probe_addresses: Sequence[str]) -> NvmlReport | None:
    """Init, read, shut down. None when NVML cannot start (no library, no driver)."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        LOG.info("nvidia_gpu: NVML unavailable (%s); reading sysfs only", exc)
        return None
    try:
        return NvmlReader(nvml).read(probe_addresses)
    except nvml.NVMLError as exc:
        LOG.warning("nvidia_gpu: NVML enumeration failed (%s); reading sysfs only", exc)
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
