"""NVMe controllers as SSD accelerators (PCI passthrough of whole controllers).

Controllers are PCI functions of class 0x010802 (any vendor). A controller the
host's nvme driver holds also appears as ``/sys/class/nvme/nvmeN`` (model,
serial and firmware, space-padded by the kernel); one bound to vfio-pci only
shows its PCI facts. Fabrics controllers (tcp, rdma, fc) are not PCI functions
and are not reported.

Safety first. Only the controllers ``[nvme] addresses`` names are offered (an
empty list offers none: a free-looking disk may still be the host's), and never
one the host uses (:mod:`acceld.drivers.nvme_usage`): a namespace or partition
that is mounted, active swap, held by LVM/MD/dm-crypt, or carrying a member
signature (ZFS, LVM, MD) in udev's database, including under native NVMe
multipath, where the disk the host uses is the subsystem's head
(``nvme-subsys*/nvme0n1``), not the controller's hidden path (``nvme0c0n1``).

Health: PCIe (AER, link) always, and the SMART critical warning through nvme-cli
(``nvme smart-log``) where it is installed and the controller is host-bound.
"""

from __future__ import annotations

import logging

from oslo_config import cfg

from acceld.drivers import sysfs
from acceld.drivers.base import (Deployable, Driver, HardwareRecord, hardware_uuid,
                                 pci_controlpath, pci_handle)
from acceld.drivers.health import worst
from acceld.drivers.nvme_usage import (NAMESPACE_RE, Controller, HostUsage, read_mounted_devices,
                                       smart_health)
from acceld.drivers.pci_health import PciHealthMonitor
from acceld.drivers.pci_isolation import require_isolation
from acceld.drivers.traits import attributes, product_id_part, upstream_vendor

LOG = logging.getLogger(__name__)
NVME_CLASS = 0x010802
__all__ = ["NvmeDriver", "read_mounted_devices", "NVME_CLASS"]


class NvmeDriver(Driver):
    """NVMe controllers; type SSD; rc from ``[nvme] resource_class``."""

    name = "nvme"
    hardware_type = "SSD"

    def __init__(self, conf: cfg.ConfigOpts, hostname: str) -> None:
        super().__init__(conf, hostname)
        self.opts = conf.nvme
        self.root = self.opts.sysfs_root
        self.pci_health = PciHealthMonitor()
        self._warned_empty = False
        self._held_back: dict[str, str] = {}  # address -> why, last logged

    @classmethod
    def claims_pci(cls, conf: cfg.ConfigOpts, function: sysfs.PciFunction) -> bool:
        """The controllers this driver is configured to report (see acceld.drivers.claims)."""
        wanted = {a.strip().lower() for a in conf.nvme.addresses}
        return function.class_code == NVME_CLASS and function.address in wanted

    def _controllers(self) -> dict[str, Controller]:
        base = f"{self.root}/class/nvme"
        found = {}
        for entry in sysfs.list_dir(base):
            controller = Controller(self.root, f"{base}/{entry}")
            address = controller.pci_address
            if address:
                found[address] = controller
        return found

    def discover(self) -> list[HardwareRecord]:
        wanted = {a.strip().lower() for a in self.opts.addresses}
        if not wanted:
            if not self._warned_empty:
                LOG.info("nvme: [nvme] addresses is empty: no controller is offered")
                self._warned_empty = True
            return []
        controllers = self._controllers()
        usage = HostUsage.read(self.opts.mounts_path, self.opts.swaps_path,
                               self.opts.udev_data_dir, self.root)
        records = []
        seen = set()
        for function in sysfs.list_pci_functions(self.root):
            if function.class_code != NVME_CLASS or function.address not in wanted:
                continue
            seen.add(function.address)
            controller = controllers.get(function.address)
            reason = controller.in_use(usage) if controller else None
            if reason:
                if self._held_back.get(function.address) != reason:  # once per change
                    LOG.info("nvme: %s not offered: %s", function.address, reason)
                    self._held_back[function.address] = reason
                continue
            self._held_back.pop(function.address, None)
            records.append(require_isolation(self._record(function, controller), self.root))
        for address in sorted(wanted - seen):
            LOG.warning("nvme: configured address %s is not an NVMe controller on this node",
                        address)
        self.pci_health.forget(seen)
        return records

    def _record(self, function: sysfs.PciFunction, controller: Controller | None
                ) -> HardwareRecord:
        info: dict[str, object] = {}
        # The model names the PCI ids, so that it does not change when the controller is
        # rebound to vfio-pci (which hides the kernel's model string).
        model = f"NVMe {function.vendor}:{function.device}"
        status, reason = "ready", None
        sources = [self.pci_health.check(function.address, function.path)]
        if controller is not None:
            for key in ("model", "serial", "firmware_rev", "state", "subsysnqn"):
                value = controller.attr(key)
                if value:
                    info[key] = value
            info["controller"] = controller.name
            info["namespaces"] = sum(1 for name, _ in controller.block_devices()
                                     if NAMESPACE_RE.match(name))
            state = info.get("state")
            if state is not None and state != "live":
                status, reason = "setup_required", f"controller {controller.name} is {state}"
            sources.append(smart_health(self.opts.nvme_cli_path, controller.name,
                                        self.opts.smart_timeout))
        vendor_name = upstream_vendor(function.vendor)
        product = product_id_part(function.device)
        # Upstream's SSD traits (CUSTOM_SSD_<VENDOR>, CUSTOM_SSD_PRODUCT_ID_<pid>), then acceld's.
        traits = ([f"CUSTOM_SSD_{vendor_name}"] if vendor_name else [])
        traits += [f"CUSTOM_SSD_PRODUCT_ID_{product}", "CUSTOM_SSD", "CUSTOM_NVME"]
        deployable = Deployable(
            name=function.address, num_accelerators=1,
            attributes=attributes(self.opts.resource_class, traits),
            attach_handles=[pci_handle(function.address)])
        return HardwareRecord(
            uuid=hardware_uuid(self.hostname, self.name, function.address),
            type="SSD", vendor=function.vendor, model=model, driver_name=self.name,
            controlpath_id=pci_controlpath(function.address),
            acc_specs={"device_type": "SSD", "remote": False, "num": 1},
            acc_status=status, status_reason=reason, std_board_info=function.std_board_info(),
            vendor_board_info=info, deployables=[deployable],
            health=worst(*sources).to_dict())
