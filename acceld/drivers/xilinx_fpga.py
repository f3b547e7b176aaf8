"""Xilinx/AMD Alveo cards: a management and a user function per card; programs with ``xbmgmt``.

An Alveo card shows two PCI functions in the same slot (vendor 0x10ee, class
0x1200): PF0 the management function (even device id, driver ``xclmgmt``) and
PF1 the user function (id + 1, driver ``xocl``). The host keeps the
management function and programs through it; a VM gets the user function,
which is the deployable's attach handle. A card whose user function is
missing is reported as ``setup_required``.

Programming with XRT's ``xbmgmt`` on the management function:

- ``bitstream``: ``xbmgmt program --device <mgmt> --shell <file> --force``
  (the shell partition of 2RP platforms);
- ``firmware``: ``xbmgmt program --device <mgmt> --base --image <file> --force``
  (flashes the base partition; the card needs a cold reboot afterwards).
"""

from __future__ import annotations

import os

from oslo_config import cfg

from acceld import privileged
from acceld.drivers import sysfs
from acceld.drivers.base import (Deployable, Driver, DriverError, HardwareRecord, NotSupported,
                                 hardware_uuid, pci_controlpath, pci_handle)
from acceld.drivers.pci_health import PciHealthMonitor
from acceld.drivers.pci_isolation import require_isolation
from acceld.drivers.tools import resolve_tool, run_tool
from acceld.drivers.traits import attributes, product_id_part

VENDOR = "0x10ee"
# Management function id -> card (XRT devices.h); the user function is id + 1.
CARDS = {"0x5000": "U200", "0x5004": "U250", "0x5008": "U280_ES1", "0x500c": "U280",
         "0x5020": "U50", "0x505c": "U55C"}
MGMT_DRIVER, USER_DRIVER = "xclmgmt", "xocl"


def _user_id(mgmt_id: str) -> str:
    return f"0x{int(mgmt_id, 16) + 1:04x}"


class XilinxFpgaDriver(Driver):
    """Alveo cards; rc FPGA; the user function is attached, the management one programs."""

    name = "xilinx_fpga"
    hardware_type = "FPGA"

    def __init__(self, conf: cfg.ConfigOpts, hostname: str) -> None:
        super().__init__(conf, hostname)
        self.opts = conf.xilinx_fpga
        self.root = self.opts.sysfs_root
        privileged.adopt(conf, "xilinx_fpga")  # in process: which xbmgmt may run
        self.pci_health = PciHealthMonitor()

    @classmethod
    def claims_pci(cls, conf: cfg.ConfigOpts, function: sysfs.PciFunction) -> bool:
        """Every Xilinx processing-accelerator function: both halves of a card."""
        return function.vendor == VENDOR and function.class_prefix == 0x1200

    def _is_mgmt(self, function: sysfs.PciFunction) -> bool:
        if function.vendor != VENDOR or function.class_prefix != 0x1200 or function.is_vf:
            return False
        if function.device in CARDS:
            return True
        # A card we have no id for: trust the XRT management driver binding.
        return function.driver == MGMT_DRIVER

    def _cards(self) -> list[tuple[sysfs.PciFunction, sysfs.PciFunction | None]]:
        functions = {f.address: f for f in sysfs.list_pci_functions(self.root, vendors=[VENDOR])}
        cards = []
        for function in functions.values():
            if not self._is_mgmt(function):
                continue
            slot, fn = function.address.rsplit(".", 1)
            user = functions.get(f"{slot}.{int(fn) + 1}")
            if user is not None and (user.device != _user_id(function.device)
                                     or user.class_prefix != 0x1200):
                user = None
            cards.append((function, user))
        return cards

    def discover(self) -> list[HardwareRecord]:
        cards = self._cards()
        records = [require_isolation(self._record(mgmt, user), self.root) for mgmt, user in cards]
        self.pci_health.forget({f.address for card in cards for f in card if f is not None})
        return records

    def _record(self, mgmt: sysfs.PciFunction, user: sysfs.PciFunction | None) -> HardwareRecord:
        card = CARDS.get(mgmt.device, mgmt.device[2:].upper())
        deployables = []
        if user is not None:
            deployables.append(Deployable(
                name=user.address, num_accelerators=1,
                # Upstream's CUSTOM_FPGA_XILINX and CUSTOM_FPGA_PRODUCT_ID_<pid> (upstream takes
                # the pid of whichever function lspci lists first: both are reported).
                attributes=attributes("FPGA", [
                    "CUSTOM_FPGA_XILINX", f"CUSTOM_FPGA_PRODUCT_ID_{product_id_part(mgmt.device)}",
                    f"CUSTOM_FPGA_PRODUCT_ID_{product_id_part(user.device)}",
                    f"CUSTOM_FPGA_XILINX_{card}"], mgmt_address=mgmt.address),
                attach_handles=[pci_handle(user.address)]))
        vendor_info = {"card": card, "mgmt_address": mgmt.address, "mgmt_driver": mgmt.driver,
                       "user_address": user.address if user else None,
                       "user_driver": user.driver if user else None}
        return HardwareRecord(
            uuid=hardware_uuid(self.hostname, self.name, mgmt.address),
            type="FPGA", vendor=VENDOR, model=f"Xilinx Alveo {card}", driver_name=self.name,
            controlpath_id=pci_controlpath(mgmt.address),
            acc_specs={"device_type": "FPGA", "remote": False, "num": len(deployables)},
            acc_status="ready" if user else "setup_required",
            status_reason=None if user else (
                f"user function of {mgmt.address} not found: load the xocl driver"),
            std_board_info=mgmt.std_board_info(),
            vendor_board_info={k: v for k, v in vendor_info.items() if v is not None},
            deployables=deployables,
            health=self.pci_health.check_many([(f.address, f.path) for f in (mgmt, user)
                                               if f is not None]).to_dict())

    def program(self, deployable_name: str, image_path: str, kind: str = "bitstream") -> None:
        """Load a shell (bitstream) or flash the base partition (firmware) through xbmgmt."""
        if kind not in ("bitstream", "firmware"):
            raise NotSupported(f"driver {self.name} cannot program {kind} images")
        mgmt = self._mgmt_of(deployable_name)
        if not os.path.isfile(image_path):
            raise DriverError(f"image file {image_path!r} does not exist")
        tool = resolve_tool(self.opts.xbmgmt_path, "xbmgmt")
        if kind == "bitstream":
            argv = [tool, "program", "--device", mgmt, "--shell", image_path, "--force"]
        else:
            argv = [tool, "program", "--device", mgmt, "--base", "--image", image_path, "--force"]
        run_tool(argv, self.opts.program_timeout, "xbmgmt")

    def _mgmt_of(self, deployable_name: str) -> str:
        for mgmt, user in self._cards():
            if deployable_name in (mgmt.address, user.address if user else None):
                return mgmt.address
        raise DriverError(f"no Xilinx FPGA deployable {deployable_name!r} on this node")
