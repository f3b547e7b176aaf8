"""Huawei Ascend NPUs (AI chips), one PCI function per chip.

Vendor 0x19e5 is also Huawei's NIC and RAID vendor, so a function counts only
when its class is 0x1200 (processing accelerator) as well. Ascend exposes no
sysfs attributes of its own; the chip comes from the device id and the driver
version from ``version.info`` (``Version=...``) of the installed driver.
"""

from __future__ import annotations

from oslo_config import cfg

from acceld.drivers import sysfs
from acceld.drivers.base import (Deployable, Driver, HardwareRecord, hardware_uuid,
                                 pci_controlpath, pci_handle)
from acceld.drivers.pci_health import PciHealthMonitor
from acceld.drivers.pci_isolation import require_isolation
from acceld.drivers.traits import attributes

VENDOR = "0x19e5"
CHIPS = {"0xd100": "310", "0xd500": "310P", "0xd801": "910", "0xd802": "910B",
         "0xd803": "910C"}


def read_driver_version(path: str) -> str | None:
    """``Version=24.1.rc2`` from the driver's version.info, or None."""
    text = sysfs.read_attr(path)
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "version" and value.strip():
            return value.strip()
    return None


class AscendDriver(Driver):
    """Ascend NPUs; type AICHIP; rc from ``[ascend] resource_class``."""

    name = "ascend"
    hardware_type = "AICHIP"

    def __init__(self, conf: cfg.ConfigOpts, hostname: str) -> None:
        super().__init__(conf, hostname)
        self.opts = conf.ascend
        self.root = self.opts.sysfs_root
        self.pci_health = PciHealthMonitor()

    @classmethod
    def claims_pci(cls, conf: cfg.ConfigOpts, function: sysfs.PciFunction) -> bool:
        """Huawei processing accelerators (see acceld.drivers.claims)."""
        return function.vendor == VENDOR and function.class_prefix == 0x1200

    def discover(self) -> list[HardwareRecord]:
        version = read_driver_version(self.opts.version_info_path)
        chips = [f for f in sysfs.list_pci_functions(self.root, vendors=[VENDOR])
                 if f.class_prefix == 0x1200 and not f.is_vf]
        records = [require_isolation(self._record(f, version), self.root) for f in chips]
        self.pci_health.forget({f.address for f in chips})
        return records

    def _record(self, function: sysfs.PciFunction, version: str | None) -> HardwareRecord:
        chip = CHIPS.get(function.device, function.device[2:].upper())
        info = {"chip": chip, "driver_version": version}
        return HardwareRecord(
            uuid=hardware_uuid(self.hostname, self.name, function.address),
            type="AICHIP", vendor=VENDOR, model=f"Ascend {chip}", driver_name=self.name,
            controlpath_id=pci_controlpath(function.address),
            acc_specs={"device_type": "AICHIP", "remote": False, "num": 1},
            std_board_info=function.std_board_info(),
            health=self.pci_health.check(function.address, function.path).to_dict(),
            vendor_board_info={k: v for k, v in info.items() if v is not None},
            deployables=[Deployable(
                name=function.address, num_accelerators=1,
                attributes=attributes(self.opts.resource_class,
                                      ["CUSTOM_ASCEND", f"CUSTOM_ASCEND_{chip}"]),
                attach_handles=[pci_handle(function.address)])])
