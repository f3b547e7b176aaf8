"""NVIDIA GPU health from NVML: critical XID events, ECC, page retirement, row remapping.

Judged per GPU as NVIDIA's own Kubernetes device plugin does for XIDs: every XID is fatal
except the application errors a guest or a CUDA program causes on its own (13, 31, 43,
45, 68, 109; ``[nvidia_gpu] ignored_xids``). Beyond XIDs:

- volatile uncorrectable (double-bit) ECC errors since the driver loaded: ``unhealthy``;
- a row-remapping failure (the spare rows are used up): ``unhealthy``;
- a pending row remap or page retirement (takes effect at the next GPU reset):
  ``degraded``;
- a GPU NVML reports lost (``GpuIsLost``: fallen off the bus), or cannot reach with any
  error but NotFound and NoPermission (``Unknown``, 999, as ``nvidia-smi`` shows for a GPU
  that fell off the bus): ``unhealthy``, with the error's name.

XID events reach only an event set registered before they happen, so
:class:`XidMonitor` keeps NVML initialised (init/shutdown nest by reference count) and one
set open for the agent's lifetime; each discovery drains it without waiting. A critical
XID keeps the GPU ``unhealthy`` until the agent restarts (after the GPU was reset), as in
NVIDIA's plugin: the conductor's quarantine and an operator decide what happens next.

Standard library only (the module object is passed in), for the offline GPU check.
"""

from __future__ import annotations

import logging
import threading
from types import ModuleType
from typing import Any

from acceld.drivers.health import DEGRADED, HEALTHY, UNHEALTHY, UNKNOWN, Health
from acceld.drivers.nvidia_nvml import NvmlGpu, nvml_address

LOG = logging.getLogger(__name__)

#: XIDs NVIDIA's k8s device plugin does not treat as fatal (application errors).
DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)
_XID_CRITICAL_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_TIMEOUT = 10  # NVML_ERROR_TIMEOUT: nothing more queued
XID_MEANINGS = {
    48: "double-bit ECC error", 63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapper failure", 74: "NVLink error",
    79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout",
    120: "GSP error",
}


class XidMonitor:
    """Collects critical XID events per GPU address between discoveries."""

    def __init__(self, nvml: ModuleType, ignored: set[int]) -> None:
        self.nvml = nvml
        self.ignored = set(ignored)
        self._lock = threading.Lock()
        self._set: Any = None
        self._registered: set[str] = set()
        self._no_events = False  # this NVML has no event sets: not asked again
        self.seen: dict[str, list[int]] = {}  # address -> latest critical XIDs, oldest first
        self.totals: dict[str, int] = {}  # address -> critical XIDs since the agent started

    def _open(self) -> bool:
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError:
            return False
        try:
            self._set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            LOG.warning("nvidia_gpu: no NVML event set (%s); XID events are not watched", exc)
            self._no_events = True
            self._shutdown()
            return False
        self._registered = set()
        return True

    def _shutdown(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass

    def _register_new(self) -> None:
        nvml = self.nvml
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                address = nvml_address(nvml.nvmlDeviceGetPciInfo(handle))
            except nvml.NVMLError:
                continue
            if address in self._registered:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(handle, _XID_CRITICAL_EVENT, self._set)
            except nvml.NVMLError as exc:  # NotSupported on some boards
                LOG.info("nvidia_gpu: XID events not available for %s (%s)", address, exc)
            self._registered.add(address)

    def poll(self) -> dict[str, list[int]]:
        """Drain queued events (never waits) and return every critical XID seen so far."""
        nvml = self.nvml
        with self._lock:
            if self._set is None and (self._no_events or not self._open()):
                return {a: list(x) for a, x in self.seen.items()}
            try:
                self._register_new()
                while True:
                    try:
                        data = nvml.nvmlEventSetWait_v2(self._set, 0)
                    except nvml.NVMLError as exc:
                        if int(getattr(exc, "value", 0)) != _TIMEOUT:
                            LOG.warning("nvidia_gpu: reading XID events failed (%s)", exc)
                        break
                    self._record(data)
            except nvml.NVMLError as exc:
                LOG.warning("nvidia_gpu: XID monitor reset after an NVML error (%s)", exc)
                self._close_locked()
            return {a: list(x) for a, x in self.seen.items()}

    def _record(self, data: Any) -> None:
        if not int(data.eventType) & _XID_CRITICAL_EVENT:
            return
        xid = int(data.eventData)
        if xid in self.ignored:
            return
        try:
            address = nvml_address(self.nvml.nvmlDeviceGetPciInfo(data.device))
        except self.nvml.NVMLError:
            return  # the GPU is gone; the lost check reports it
        LOG.warning("nvidia_gpu: critical XID %d on %s (%s)", xid, address,
                    XID_MEANINGS.get(xid, "see NVIDIA's XID catalogue"))
        self.seen.setdefault(address, []).append(xid)
        self.totals[address] = self.totals.get(address, 0) + 1
        del self.seen[address][:-16]  # the latest few are enough to explain

    def _close_locked(self) -> None:
        if self._set is not None:
            try:
                self.nvml.nvmlEventSetFree(self._set)
            except self.nvml.NVMLError:
                pass
            self._set = None
            self._shutdown()

    def close(self) -> None:
        with self._lock:
            self._close_locked()


def judge(gpu: NvmlGpu | None, *, failure: str | None, xids: list[int],
          xid_total: int) -> Health:
    """One GPU's NVML health. ``unknown`` when NVML said nothing about it. ``failure`` is
    how NVML failed to reach the GPU (nvidia_nvml.error_text), which is ``unhealthy``."""
    if failure is not None:
        reason = ("GPU lost from the bus (NVML: GPU is lost)" if failure.startswith("GpuIsLost")
                  else f"NVML cannot reach the GPU: {failure}")
        return Health(UNHEALTHY, reason, {"xid_critical": xid_total})
    counters: dict[str, int] = {"xid_critical": xid_total}
    if xids:
        counters["last_xid"] = xids[-1]
    if gpu is None:
        if xids:
            return Health(UNHEALTHY, _xid_reason(xids), counters)
        return Health(UNKNOWN)
    facts = gpu.health
    bad: list[str] = []
    worse: list[str] = []
    if xids:
        bad.append(_xid_reason(xids))
    if facts.ecc_volatile_uncorrected is not None:
        counters["ecc_volatile_uncorrected"] = int(facts.ecc_volatile_uncorrected)
        if facts.ecc_volatile_uncorrected > 0:
            bad.append(f"{facts.ecc_volatile_uncorrected} uncorrectable (double-bit) ECC "
                       f"error(s) since the driver loaded")
    if facts.remapped_rows is not None:
        corr, unc, pending, failure = facts.remapped_rows
        counters.update(remapped_rows_correctable=corr, remapped_rows_uncorrectable=unc,
                        row_remap_pending=int(pending), row_remap_failure=int(failure))
        if failure:
            bad.append("row remapping failed (no spare rows left)")
        elif pending:
            worse.append("row remapping pending (takes effect at the next GPU reset)")
    if facts.retired_pages_pending is not None:
        counters["retired_pages_pending"] = int(facts.retired_pages_pending)
        if facts.retired_pages_pending:
            worse.append("page retirement pending (takes effect at the next GPU reset)")
    if bad:
        return Health(UNHEALTHY, "; ".join(bad + worse), counters)
    if worse:
        return Health(DEGRADED, "; ".join(worse), counters)
    return Health(HEALTHY, None, counters)


def _xid_reason(xids: list[int]) -> str:
    last = xids[-1]
    meaning = XID_MEANINGS.get(last)
    text = f"critical XID {last}" + (f" ({meaning})" if meaning else "")
    if len(xids) > 1:
        text += f", {len(xids)} critical XIDs since the agent started"
    return text
