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


class _Memory:
    def __init__(self, total: int) -> None:
        self.total, self.free, self.used = total, total, 0


def make_pynvml(gpus: list[FakeGpu], *, init_error: str | None = None,
                driver_version: str = "550.54.15") -> types.ModuleType:
    """A module object with the real names; ``init_error`` makes nvmlInit raise that error."""
    mod = types.ModuleType("pynvml")
    state: dict[str, Any] = {"initialised": False, "init_calls": 0, "shutdown_calls": 0}
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
    for suffix, (code, _text) in ERROR_CODES.items():
        sub = type(f"NVMLError_{suffix}", (NVMLError,), {})
        NVMLError._valClassMapping[code] = sub
        setattr(mod, f"NVMLError_{suffix}", sub)
    mod.NVML_DEVICE_MIG_DISABLE = 0  # type: ignore[attr-defined]
    mod.NVML_DEVICE_MIG_ENABLE = 1  # type: ignore[attr-defined]

    def error(name: str) -> Exception:
        return NVMLError(ERROR_CODES[name][0])

    def check(handle: _Handle | None = None) -> None:
        if not state["initialised"]:
            raise error("Uninitialized")
        if handle is not None and handle.gpu.lost:
            raise error("GpuIsLost")

    def nvmlInit() -> None:
        state["init_calls"] += 1
        if init_error:
            raise error(init_error)
        state["initialised"] = True

    def nvmlShutdown() -> None:
        check()
        state["shutdown_calls"] += 1
        state["initialised"] = False

    def nvmlDeviceGetCount() -> int:
        check()
        return len(gpus)

    def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
        check()
        if not 0 <= index < len(gpus):
            raise error("InvalidArgument")
        return _Handle(gpus[index])

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

    for fn in (nvmlInit, nvmlShutdown, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex,
               nvmlDeviceGetPciInfo, nvmlDeviceGetName, nvmlDeviceGetUUID, nvmlDeviceGetSerial,
               nvmlDeviceGetMemoryInfo, nvmlSystemGetDriverVersion,
               nvmlSystemGetCudaDriverVersion, nvmlDeviceGetMigMode,
               nvmlDeviceGetMaxMigDeviceCount, nvmlDeviceGetMigDeviceHandleByIndex,
               nvmlDeviceGetGpuInstanceId, nvmlDeviceGetComputeInstanceId):
        setattr(mod, fn.__name__, fn)
    return mod


#: Every name the fake defines that the real module must also define.
API_NAMES = [
    "NVMLError", *(f"NVMLError_{s}" for s in ERROR_CODES), "NVML_DEVICE_MIG_DISABLE",
    "NVML_DEVICE_MIG_ENABLE", "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetPciInfo", "nvmlDeviceGetName",
    "nvmlDeviceGetUUID", "nvmlDeviceGetSerial", "nvmlDeviceGetMemoryInfo",
    "nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion", "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId",
]
