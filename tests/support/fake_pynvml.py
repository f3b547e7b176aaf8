"""A stand-in for the ``pynvml`` module (nvidia-ml-py) for tests without GPUs.

It keeps the real module's names and behaviour where the driver depends on
them: ``NVMLError(value)`` returns the per-code subclass (``NVMLError_NotSupported``
...), ``nvmlDeviceGetPciInfo`` returns bytes bus ids with an 8-digit upper-case
domain, MIG calls raise NotSupported on GPUs without MIG and NotFound for empty
MIG slots, and every call before ``nvmlInit`` raises Uninitialized.
``tests/unit/test_driver_nvidia_gpu.py`` checks the names against the real
module when it is installed.
"""

from __future__ import annotations

import ctypes
import types
from dataclasses import dataclass, field
from typing import Any

ERROR_CODES = {
    "Uninitialized": (1, "Uninitialized"),
    "InvalidArgument": (2, "Invalid Argument"),
    "NotSupported": (3, "Not Supported"),
    "NoPermission": (4, "Insufficient Permissions"),
    "NotFound": (6, "Not Found"),
    "DriverNotLoaded": (9, "Driver Not Loaded"),
    "Timeout": (10, "Timeout"),
    "LibraryNotFound": (12, "NVML Shared Library Not Found"),
    "FunctionNotFound": (13, "Function Not Found"),
    "GpuIsLost": (15, "GPU is lost"),
    "Unknown": (999, "Unknown Error"),
}


@dataclass
class FakeMig:
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    memory_total: int


@dataclass
class FakeVgpuType:
    type_id: int
    name: str
    max_instances: int
    gpu_instance_profile: int = 0xFFFFFFFF  # time-sliced; a GI profile id if MIG-backed


@dataclass
class FakeGpu:
    bus_id: str  # sysfs form, e.g. '0000:3b:00.0'
    device_id: int  # e.g. 0x2335
    name: str
    uuid: str
    memory_total: int
    serial: str | None = None  # None: NotSupported
    mig_mode: tuple[int, int] | None = None  # None: NotSupported
    mig_slots: list[FakeMig | None] = field(default_factory=list)
    lost: bool = False  # every call on it raises GpuIsLost
    # Every handle lookup of it raises this error (by its ERROR_CODES name): "Unknown" for
    # a GPU that fell off the bus the way nvidia-smi shows ("Unable to determine the device
    # handle for GPU 0000:3B:00.0: Unknown Error"), "NoPermission" for one the cgroup denies.
    handle_error: str | None = None
    vgpu_types: list[FakeVgpuType] = field(default_factory=list)  # [] : no vGPU manager
    active_vgpus: list[int] = field(default_factory=list)  # type id per running vGPU
    gpu_instances: dict[int, int] = field(default_factory=dict)  # GI id -> profile id
    ecc_volatile_uncorrected: int | None = 0  # None: NotSupported (GeForce)
    retired_pages_pending: int | None = 0  # NVML_FEATURE_ENABLED (1) / DISABLED (0)
    remapped_rows: tuple[int, int, int, int] | None = None  # None: NotSupported (pre-Ampere)
    hidden: bool = False  # not enumerated (GetCount skips it), as a GPU that fell off
    minor: int = 0  # nvmlDeviceGetMinorNumber: the N of /dev/nvidiaN
    # nvmlDeviceGetGpuInstanceById raises NoPermission unless the module was made
    # privileged=True (NVML: "requires privileged user"; the agent runs unprivileged).
    gi_needs_privilege: bool = False
    # nvmlDeviceGetGpuFabricInfo: None raises NotSupported (PCIe boards); else (state,
    # status, cluster uuid bytes, clique id) as an HGX GPU with NVSwitch answers.
    fabric: tuple[int, int, bytes, int] | None = None


@dataclass
class _Handle:
    gpu: FakeGpu
    mig: FakeMig | None = None


class _PciInfo:
    def __init__(self, gpu: FakeGpu) -> None:
        domain, bus, rest = gpu.bus_id.split(":")
        device = rest.split(".")[0]
        self.domain, self.bus, self.device = int(domain, 16), int(bus, 16), int(device, 16)
        self.busIdLegacy = f"{self.domain:04X}:{self.bus:02X}:{self.device:02X}.0".encode()
        self.busId = f"{self.domain:08X}:{self.bus:02X}:{self.device:02X}.0".encode()
        self.pciDeviceId = (gpu.device_id << 16) | 0x10DE
        self.pciSubSystemId = 0x162610DE


class _GpuInstanceInfo:
    def __init__(self, gi_id: int, profile_id: int) -> None:
        self.id, self.profileId = gi_id, profile_id


class _EventData:
    """nvmlEventData_t: device handle, eventType bit, eventData (the XID)."""

    def __init__(self, device: "_Handle", event_type: int, data: int) -> None:
        self.device, self.eventType, self.eventData = device, event_type, data
        self.gpuInstanceId = self.computeInstanceId = 0xFFFFFFFF


class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    """nvml.h's nvmlGpuFabricInfo_t, as pynvml declares it."""

    _fields_ = [("clusterUuid", ctypes.c_char * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint)]


class _Memory:
    def __init__(self, total: int) -> None:
        self.total, self.free, self.used = total, total, 0


def make_pynvml(gpus: list[FakeGpu], *, init_error: str | None = None,
                driver_version: str = "550.54.15", privileged: bool = False) -> types.ModuleType:
    """A module object with the real names; ``init_error`` makes nvmlInit raise that error;
    ``privileged``: the process is root (or has CAP_SYS_ADMIN), as the privsep daemon."""
    mod = types.ModuleType("pynvml")
    # NVML counts nvmlInit calls: it stays initialised until as many nvmlShutdown calls.
    state: dict[str, Any] = {"initialised": 0, "init_calls": 0, "shutdown_calls": 0,
                             "event_sets": {}, "next_set": 1}
    mod.state = state  # type: ignore[attr-defined]

    class NVMLError(Exception):
        _valClassMapping: dict[int, type] = {}

        def __new__(cls, value: int):  # type: ignore[no-untyped-def]
            if cls is NVMLError:
                cls = NVMLError._valClassMapping.get(value, cls)
            obj = Exception.__new__(cls)
            obj.value = value
            return obj

        def __init__(self, value: int) -> None:
            super().__init__(value)

        def __str__(self) -> str:
            for code, text in ERROR_CODES.values():
                if code == self.value:
                    return text
            return f"NVML error {self.value}"

    mod.NVMLError = NVMLError  # type: ignore[attr-defined]
    mod.c_nvmlGpuFabricInfo_t = c_nvmlGpuFabricInfo_t  # type: ignore[attr-defined]
    for suffix, (code, _text) in ERROR_CODES.items():
        sub = type(f"NVMLError_{suffix}", (NVMLError,), {})
        NVMLError._valClassMapping[code] = sub
        setattr(mod, f"NVMLError_{suffix}", sub)
    constants = {
        "NVML_DEVICE_MIG_DISABLE": 0, "NVML_DEVICE_MIG_ENABLE": 1, "NVML_FEATURE_DISABLED": 0,
        "NVML_FEATURE_ENABLED": 1, "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
        "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1, "NVML_VOLATILE_ECC": 0,
        "NVML_AGGREGATE_ECC": 1, "nvmlEventTypeXidCriticalError": 0x8,
        "nvmlEventTypeDoubleBitEccError": 0x2, "NVML_ERROR_TIMEOUT": 10,
        "NVML_ERROR_GPU_IS_LOST": 15,
    }
    for name, value in constants.items():
        setattr(mod, name, value)

    def error(name: str) -> Exception:
        return NVMLError(ERROR_CODES[name][0])

    visible = [g for g in gpus if not g.hidden]

    def check(handle: _Handle | None = None) -> None:
        if not state["initialised"]:
            raise error("Uninitialized")
        if handle is not None and handle.gpu.lost:
            raise error("GpuIsLost")

    def nvmlInit() -> None:
        state["init_calls"] += 1
        if init_error:
            raise error(init_error)
        state["initialised"] += 1

    def nvmlShutdown() -> None:
        check()
        state["shutdown_calls"] += 1
        state["initialised"] -= 1

    def nvmlDeviceGetCount() -> int:
        check()
        return len(visible)

    def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
        check()
        if not 0 <= index < len(visible):
            raise error("InvalidArgument")
        if visible[index].handle_error:
            raise error(visible[index].handle_error)
        return _Handle(visible[index])

    def nvmlDeviceGetHandleByPciBusId(bus_id: str) -> _Handle:
        check()
        wanted = bus_id.lower()[-12:]
        for gpu in gpus:
            if gpu.bus_id.lower() == wanted:
                if gpu.handle_error:
                    raise error(gpu.handle_error)
                if gpu.lost:
                    raise error("GpuIsLost")
                return _Handle(gpu)
        raise error("NotFound")

    def nvmlDeviceGetPciInfo(handle: _Handle) -> _PciInfo:
        check(handle)
        return _PciInfo(handle.gpu)

    def nvmlDeviceGetName(handle: _Handle) -> str:
        check(handle)
        return handle.gpu.name

    def nvmlDeviceGetUUID(handle: _Handle) -> str:
        check(handle)
        return handle.mig.uuid if handle.mig else handle.gpu.uuid

    def nvmlDeviceGetSerial(handle: _Handle) -> str:
        check(handle)
        if handle.gpu.serial is None:
            raise error("NotSupported")
        return handle.gpu.serial

    def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None) -> _Memory:
        check(handle)
        return _Memory(handle.mig.memory_total if handle.mig else handle.gpu.memory_total)

    def nvmlDeviceGetGpuFabricInfo(handle: _Handle, info_ref: Any) -> int:
        check(handle)
        if handle.gpu.fabric is None:
            raise error("NotSupported")
        info = info_ref._obj  # ctypes.byref(struct)
        state, status, cluster, clique = handle.gpu.fabric
        info.state, info.status, info.cliqueId = state, status, clique
        # All 16 bytes (assigning bytes to a c_char array stops at a NUL).
        ctypes.memmove(ctypes.addressof(info) + type(info).clusterUuid.offset, cluster, 16)
        return 0

    def nvmlDeviceGetMinorNumber(handle: _Handle) -> int:
        check(handle)
        return handle.gpu.minor

    def nvmlSystemGetDriverVersion() -> str:
        check()
        return driver_version

    def nvmlSystemGetCudaDriverVersion() -> int:
        check()
        return 12040

    def nvmlDeviceGetMigMode(handle: _Handle) -> list[int]:
        check(handle)
        if handle.gpu.mig_mode is None:
            raise error("NotSupported")
        return list(handle.gpu.mig_mode)

    def nvmlDeviceGetMaxMigDeviceCount(handle: _Handle) -> int:
        check(handle)
        mode = handle.gpu.mig_mode
        return len(handle.gpu.mig_slots) if mode and mode[0] == 1 else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(handle: _Handle, index: int) -> _Handle:
        check(handle)
        slots = handle.gpu.mig_slots
        if not 0 <= index < len(slots):
            raise error("InvalidArgument")
        if slots[index] is None:
            raise error("NotFound")
        return _Handle(handle.gpu, slots[index])

    def nvmlDeviceGetGpuInstanceId(handle: _Handle) -> int:
        check(handle)
        if handle.mig is None:
            raise error("InvalidArgument")
        return handle.mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(handle: _Handle) -> int:
        check(handle)
        if handle.mig is None:
            raise error("InvalidArgument")
        return handle.mig.compute_instance_id

    def _vgpu_type(type_id: int) -> FakeVgpuType:
        for gpu in gpus:
            for t in gpu.vgpu_types:
                if t.type_id == type_id:
                    return t
        raise error("InvalidArgument")

    def nvmlDeviceGetSupportedVgpus(handle: _Handle) -> list[int]:
        check(handle)
        return [t.type_id for t in handle.gpu.vgpu_types]

    def nvmlVgpuTypeGetName(type_id: int) -> str:
        check()
        return _vgpu_type(type_id).name

    def nvmlVgpuTypeGetMaxInstances(handle: _Handle, type_id: int) -> int:
        check(handle)
        if type_id not in [t.type_id for t in handle.gpu.vgpu_types]:
            raise error("InvalidArgument")
        return _vgpu_type(type_id).max_instances

    def nvmlVgpuTypeGetGpuInstanceProfileId(type_id: int) -> int:
        check()
        return _vgpu_type(type_id).gpu_instance_profile

    def nvmlDeviceGetActiveVgpus(handle: _Handle) -> list[int]:
        check(handle)
        # vGPU instance ids: opaque numbers; the fake encodes (gpu index, position).
        return [1000 * gpus.index(handle.gpu) + i for i in range(len(handle.gpu.active_vgpus))]

    def nvmlVgpuInstanceGetType(instance: int) -> int:
        check()
        gpu_index, position = divmod(instance, 1000)
        if not 0 <= gpu_index < len(gpus) or position >= len(gpus[gpu_index].active_vgpus):
            raise error("NotFound")
        return gpus[gpu_index].active_vgpus[position]

    def nvmlDeviceGetGpuInstanceById(handle: _Handle, gi_id: int) -> tuple[FakeGpu, int]:
        check(handle)
        mode = handle.gpu.mig_mode
        if mode is None:
            raise error("NotSupported")
        if mode[0] != 1:
            raise error("InvalidArgument")
        if handle.gpu.gi_needs_privilege and not privileged:
            raise error("NoPermission")
        if gi_id not in handle.gpu.gpu_instances:
            raise error("NotFound")
        return (handle.gpu, gi_id)

    def nvmlGpuInstanceGetInfo(instance: tuple[FakeGpu, int]) -> _GpuInstanceInfo:
        check()
        gpu, gi_id = instance
        return _GpuInstanceInfo(gi_id, gpu.gpu_instances[gi_id])

    def nvmlDeviceGetTotalEccErrors(handle: _Handle, error_type: int, counter_type: int) -> int:
        check(handle)
        if handle.gpu.ecc_volatile_uncorrected is None:
            raise error("NotSupported")
        if (error_type, counter_type) != (1, 0):
            return 0  # only volatile uncorrected counts are modelled
        return handle.gpu.ecc_volatile_uncorrected

    def nvmlDeviceGetRetiredPagesPendingStatus(handle: _Handle) -> int:
        check(handle)
        if handle.gpu.retired_pages_pending is None:
            raise error("NotSupported")
        return handle.gpu.retired_pages_pending

    def nvmlDeviceGetRemappedRows(handle: _Handle) -> tuple[int, int, int, int]:
        check(handle)
        if handle.gpu.remapped_rows is None:
            raise error("NotSupported")
        return handle.gpu.remapped_rows

    # --- events: a set buffers what happens to its registered GPUs after registration.
    def nvmlEventSetCreate() -> int:
        check()
        number = state["next_set"]
        state["next_set"] += 1
        state["event_sets"][number] = {"gpus": {}, "queue": []}
        return number

    def nvmlDeviceRegisterEvents(handle: _Handle, event_types: int, event_set: int) -> None:
        check(handle)
        state["event_sets"][event_set]["gpus"][handle.gpu.bus_id] = event_types

    def nvmlEventSetWait_v2(event_set: int, timeout_ms: int) -> _EventData:
        check()
        queue = state["event_sets"][event_set]["queue"]
        if not queue:
            raise error("Timeout")  # the fake never blocks: nothing will arrive meanwhile
        return queue.pop(0)

    def nvmlEventSetFree(event_set: int) -> None:
        check()
        del state["event_sets"][event_set]

    def emit_xid(bus_id: str, xid: int) -> None:
        """Test hook: the driver reports XID ``xid`` on a GPU (the real one's kernel log)."""
        gpu = next(g for g in gpus if g.bus_id == bus_id)
        for event_set in state["event_sets"].values():
            if event_set["gpus"].get(bus_id, 0) & 0x8:
                event_set["queue"].append(_EventData(_Handle(gpu), 0x8, xid))

    mod.emit_xid = emit_xid  # type: ignore[attr-defined]

    for fn in (nvmlInit, nvmlShutdown, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex,
               nvmlDeviceGetHandleByPciBusId, nvmlDeviceGetSupportedVgpus, nvmlVgpuTypeGetName,
               nvmlVgpuTypeGetMaxInstances, nvmlVgpuTypeGetGpuInstanceProfileId,
               nvmlDeviceGetActiveVgpus, nvmlVgpuInstanceGetType, nvmlDeviceGetGpuInstanceById,
               nvmlGpuInstanceGetInfo, nvmlDeviceGetTotalEccErrors,
               nvmlDeviceGetRetiredPagesPendingStatus, nvmlDeviceGetRemappedRows,
               nvmlEventSetCreate, nvmlDeviceRegisterEvents, nvmlEventSetWait_v2,
               nvmlEventSetFree, nvmlDeviceGetPciInfo, nvmlDeviceGetName, nvmlDeviceGetUUID, nvmlDeviceGetSerial,
               nvmlDeviceGetMemoryInfo, nvmlSystemGetDriverVersion,
               nvmlSystemGetCudaDriverVersion, nvmlDeviceGetMigMode,
               nvmlDeviceGetMaxMigDeviceCount, nvmlDeviceGetMigDeviceHandleByIndex,
               nvmlDeviceGetGpuInstanceId, nvmlDeviceGetComputeInstanceId,
               nvmlDeviceGetMinorNumber, nvmlDeviceGetGpuFabricInfo):
        setattr(mod, fn.__name__, fn)
    return mod


#: Every name the fake defines that the real module must also define.
API_NAMES = [
    "NVMLError", *(f"NVMLError_{s}" for s in ERROR_CODES), "NVML_DEVICE_MIG_DISABLE",
    "NVML_DEVICE_MIG_ENABLE", "NVML_FEATURE_DISABLED", "NVML_FEATURE_ENABLED",
    "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
    "NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC", "nvmlEventTypeXidCriticalError",
    "nvmlEventTypeDoubleBitEccError", "NVML_ERROR_TIMEOUT", "NVML_ERROR_GPU_IS_LOST",
    "nvmlDeviceGetHandleByPciBusId", "nvmlDeviceGetSupportedVgpus", "nvmlVgpuTypeGetName",
    "nvmlVgpuTypeGetMaxInstances", "nvmlVgpuTypeGetGpuInstanceProfileId",
    "nvmlDeviceGetActiveVgpus", "nvmlVgpuInstanceGetType", "nvmlDeviceGetGpuInstanceById",
    "nvmlGpuInstanceGetInfo", "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows",
    "nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2",
    "nvmlEventSetFree", "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetPciInfo", "nvmlDeviceGetName",
    "nvmlDeviceGetUUID", "nvmlDeviceGetSerial", "nvmlDeviceGetMemoryInfo",
    "nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion", "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId", "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t",
]
