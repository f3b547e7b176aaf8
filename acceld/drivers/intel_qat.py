"""Intel QuickAssist (QAT) crypto and compression: a PF per device, its VFs as handles.

A QAT PF (vendor 0x8086, class 0x0b40 co-processor; ids in ``GENERATIONS``) is
one device with one deployable whose attach handles are its SR-IOV VFs: the
VFs are what VMs get (vfio-pci refuses older PFs). A PF without VFs, or a
4xxx-family PF whose ``qat/state`` is ``down``, is ``setup_required``.
The configured services (``qat/cfg_services``, e.g. ``sym;asym`` or ``dc``)
become traits, so a profile can ask for compression or crypto.
"""

from __future__ import annotations

import logging

from oslo_config import cfg

from acceld.drivers import sysfs
from acceld.drivers.health import HEALTHY, UNHEALTHY, UNKNOWN, Health, worst
from acceld.drivers.pci_health import PciHealthMonitor
from acceld.drivers.pci_isolation import require_isolation, vfio_refuses
from acceld.drivers.base import (Deployable, Driver, HardwareRecord, hardware_uuid,
                                 pci_controlpath, pci_handle)
from acceld.drivers.traits import attributes, trait_part

LOG = logging.getLogger(__name__)
VENDOR = "0x8086"
# PF id -> (generation, VF id) (include/linux/pci_ids.h, qat adf_accel_devices.h).
GENERATIONS = {
    "0x0435": ("DH895XCC", "0x0443"), "0x37c8": ("C62X", "0x37c9"),
    "0x19e2": ("C3XXX", "0x19e3"), "0x4940": ("4XXX", "0x4941"),
    "0x4942": ("401XX", "0x4943"), "0x4944": ("402XX", "0x4945"),
    "0x4946": ("420XX", "0x4947"),
}


def state_health(address: str, state: str | None) -> Health:
    """``qat/state`` (4xxx and later): ``down`` is unhealthy (no ring serves requests, which
    is also what the kernel's error handling leaves after a failed reset); older
    generations have no such file: unknown."""
    if state is None:
        return Health(UNKNOWN)
    if state == "up":
        return Health(HEALTHY)
    return Health(UNHEALTHY, f"QAT device {address} is {state} (qat/state)")


CLAIMED_IDS = frozenset(GENERATIONS) | {vf for _gen, vf in GENERATIONS.values()}


class IntelQatDriver(Driver):
    """QAT PFs; their VFs are the accelerators."""

    name = "intel_qat"
    hardware_type = "QAT"

    def __init__(self, conf: cfg.ConfigOpts, hostname: str) -> None:
        super().__init__(conf, hostname)
        self.opts = conf.intel_qat
        self.root = self.opts.sysfs_root
        self.pci_health = PciHealthMonitor()
        self._warned_denylist: set[str] = set()

    @classmethod
    def claims_pci(cls, conf: cfg.ConfigOpts, function: sysfs.PciFunction) -> bool:
        """QAT PFs and their VFs, by id (see acceld.drivers.claims)."""
        return function.vendor == VENDOR and function.device in CLAIMED_IDS

    def discover(self) -> list[HardwareRecord]:
        functions = {f.address: f for f in sysfs.list_pci_functions(self.root, vendors=[VENDOR])}
        records = [require_isolation(self._record(f, functions), self.root)
                   for f in functions.values() if f.device in GENERATIONS and not f.is_vf]
        self.pci_health.forget(set(functions))
        return records

    def _record(self, pf: sysfs.PciFunction,
                functions: dict[str, sysfs.PciFunction]) -> HardwareRecord:
        generation, vf_id = GENERATIONS[pf.device]
        vfs = [functions[a] for a in pf.virtfns if a in functions and functions[a].device == vf_id]
        state = pf.attr("qat", "state")
        services_text = pf.attr("qat", "cfg_services")
        services = sorted(s for s in (services_text or "").split(";") if s)
        traits = ["CUSTOM_QAT", f"CUSTOM_QAT_{generation}"]
        traits += [f"CUSTOM_QAT_{trait_part(s)}" for s in services]
        status, reason = "ready", None
        if state is not None and state != "up":
            status, reason = "setup_required", f"QAT device is {state}: echo up > qat/state"
        elif not vfs:
            status = "setup_required"
            reason = (f"SR-IOV is not enabled: write the number of VFs (up to "
                      f"{pf.sriov_totalvfs}) to sriov_numvfs" if pf.sriov_totalvfs else
                      "no VFs and no SR-IOV capability reported")
        deployables = []
        if vfs:
            deployables.append(Deployable(
                name=pf.address, num_accelerators=len(vfs),
                attributes=attributes(self.opts.resource_class, traits,
                                      services=";".join(services) or None),
                attach_handles=[pci_handle(vf.address) for vf in vfs]))
        if vfs and pf.address not in self._warned_denylist and vfio_refuses(
                self.root, VENDOR, vf_id):
            self._warned_denylist.add(pf.address)
            LOG.warning("intel_qat: the VFs of %s (%s, 8086:%s) are on vfio-pci's denylist: "
                        "VMs cannot get them unless the vfio_pci module is loaded with "
                        "disable_denylist=1", pf.address, generation, vf_id[2:])
        health = worst(self.pci_health.check_many([(f.address, f.path) for f in [pf, *vfs]]),
                       state_health(pf.address, state))
        vendor_info = {"generation": generation, "state": state,
                       "services": ";".join(services) or None,
                       "sriov_totalvfs": pf.sriov_totalvfs,
                       "vf_driver": vfs[0].driver if vfs else None}
        return HardwareRecord(
            uuid=hardware_uuid(self.hostname, self.name, pf.address),
            type="QAT", vendor=VENDOR, model=f"Intel QAT {generation}", driver_name=self.name,
            controlpath_id=pci_controlpath(pf.address),
            acc_specs={"device_type": "QAT", "remote": False, "num": len(vfs),
                       "acc_capability": {"services": services}},
            acc_status=status, status_reason=reason, std_board_info=pf.std_board_info(),
            vendor_board_info={k: v for k, v in vendor_info.items() if v is not None},
            deployables=deployables, health=health.to_dict())
