"""NVMe controllers as SSD accelerators (PCI passthrough of whole controllers).

Controllers are PCI functions of class 0x010802 (any vendor). A controller the
host's nvme driver holds also appears as ``/sys/class/nvme/nvmeN`` (model,
serial and firmware, space-padded by the kernel); one bound to vfio-pci only
shows its PCI facts. Fabrics controllers (tcp, rdma, fc) are not PCI functions
and are not reported.

Safety first: a controller with a namespace (or a partition of one) that is
mounted, or that has holders (LVM, MD, dm-crypt), is never reported: giving
it to a VM would pull the disk from under the host. ``[nvme] addresses``
narrows the report to a list of PCI addresses.
"""

from __future__ import annotations

import logging
import os
import re

from oslo_config import cfg

from acceld.drivers import sysfs
from acceld.drivers.base import (Deployable, Driver, HardwareRecord, hardware_uuid,
                                 pci_controlpath, pci_handle)
from acceld.drivers.traits import attributes

LOG = logging.getLogger(__name__)
NVME_CLASS = 0x010802
_NAMESPACE_RE = re.compile(r"^nvme\d+(c\d+)?n\d+$")


def read_mounted_devices(mounts_path: str) -> set[str] | None:
    """Device basenames in a mount table (`/dev/nvme0n1p2` -> `nvme0n1p2`); None: unreadable."""
    try:
        with open(mounts_path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    return {os.path.basename(line.split()[0]) for line in lines
            if line.split() and line.split()[0].startswith("/dev/")}


class Controller:
    """A host-bound controller's ``/sys/class/nvme/nvmeN`` directory."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = os.path.basename(path)

    def attr(self, name: str) -> str | None:
        return sysfs.read_attr(os.path.join(self.path, name))

    @property
    def pci_address(self) -> str | None:
        if self.attr("transport") != "pcie":
            return None
        address = (self.attr("address") or "").lower()
        if sysfs.is_pci_address(address):
            return address
        return sysfs.link_name(os.path.join(self.path, "device"))

    def block_names(self) -> list[tuple[str, str]]:
        """(name, sysfs dir) of each namespace block device and its partitions."""
        out = []
        for entry in sysfs.list_dir(self.path):
            if not _NAMESPACE_RE.match(entry):
                continue
            ns = os.path.join(self.path, entry)
            out.append((entry, ns))
            for sub in sysfs.list_dir(ns):
                if os.path.isfile(os.path.join(ns, sub, "partition")):
                    out.append((sub, os.path.join(ns, sub)))
        return out

    def in_use(self, mounted: set[str] | None) -> str | None:
        """Why the host uses (or may use) this controller, or None."""
        for name, path in self.block_names():
            if mounted is None:
                return "the mount table is unreadable"
            # nvme0c1n1 (a multipath path) is mounted as nvme0n1.
            if name in mounted or re.sub(r"c\d+n", "n", name) in mounted:
                return f"{name} is mounted"
            holders = sysfs.list_dir(os.path.join(path, "holders"))
            if holders:
                return f"{name} is held by {', '.join(holders)}"
        return None


class NvmeDriver(Driver):
    """NVMe controllers; type SSD; rc from ``[nvme] resource_class``."""

    name = "nvme"
    hardware_type = "SSD"

    def __init__(self, conf: cfg.ConfigOpts, hostname: str) -> None:
        super().__init__(conf, hostname)
        self.opts = conf.nvme
        self.root = self.opts.sysfs_root

    def _controllers(self) -> dict[str, Controller]:
        base = os.path.join(self.root, "class", "nvme")
        found = {}
        for entry in sysfs.list_dir(base):
            controller = Controller(os.path.join(base, entry))
            address = controller.pci_address
            if address:
                found[address] = controller
        return found

    def discover(self) -> list[HardwareRecord]:
        controllers = self._controllers()
        mounted = read_mounted_devices(self.opts.mounts_path)
        wanted = {a.strip().lower() for a in self.opts.addresses}
        records = []
        for function in sysfs.list_pci_functions(self.root):
            if function.class_code != NVME_CLASS:
                continue
            if wanted and function.address not in wanted:
                continue
            controller = controllers.get(function.address)
            reason = controller.in_use(mounted) if controller else None
            if reason:
                LOG.debug("nvme: %s not offered: %s", function.address, reason)
                continue
            records.append(self._record(function, controller))
        return records

    def _record(self, function: sysfs.PciFunction, controller: Controller | None
                ) -> HardwareRecord:
        info: dict[str, object] = {}
        model = f"NVMe {function.vendor}:{function.device}"
        status, reason = "ready", None
        if controller is not None:
            for key in ("model", "serial", "firmware_rev", "state", "subsysnqn"):
                value = controller.attr(key)
                if value:
                    info[key] = value
            info["controller"] = controller.name
            info["namespaces"] = sum(1 for name, _ in controller.block_names()
                                     if _NAMESPACE_RE.match(name))
            model = str(info.get("model") or model)
            state = info.get("state")
            if state is not None and state != "live":
                status, reason = "setup_required", f"controller {controller.name} is {state}"
        deployable = Deployable(
            name=function.address, num_accelerators=1,
            attributes=attributes(self.opts.resource_class, ["CUSTOM_SSD", "CUSTOM_NVME"]),
            attach_handles=[pci_handle(function.address)])
        return HardwareRecord(
            uuid=hardware_uuid(self.hostname, self.name, function.address),
            type="SSD", vendor=function.vendor, model=model, driver_name=self.name,
            controlpath_id=pci_controlpath(function.address),
            acc_specs={"device_type": "SSD", "remote": False, "num": 1},
            acc_status=status, status_reason=reason, std_board_info=function.std_board_info(),
            vendor_board_info=info, deployables=[deployable])
