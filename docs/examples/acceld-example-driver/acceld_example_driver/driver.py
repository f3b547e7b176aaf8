"""The ``example`` driver: PCI functions picked by vendor:device id, offered whole.

Everything a real driver needs is here: its own config group, discovery from
sysfs through acceld's helpers, stable uuids, a resource class and traits,
a PCI attach handle per function, and a readiness check (an unbound function
is recorded but not offered).
"""

from __future__ import annotations

from oslo_config import cfg

from acceld.drivers import sysfs
from acceld.drivers.base import (DEVICE_TYPES, Deployable, Driver, HardwareRecord,
                                 hardware_uuid, pci_controlpath, pci_handle)
from acceld.drivers.traits import attributes

OPTS = [
    cfg.StrOpt("sysfs_root", default="/sys", help="Where sysfs is mounted."),
    cfg.ListOpt("pci_ids", default=["8086:0b25"],
                help="vendor:device ids to offer (default: Intel DSA)."),
    cfg.StrOpt("device_type", default="FPGA", choices=list(DEVICE_TYPES),
               help="The device type the API shows for them."),
    cfg.StrOpt("resource_class", default="CUSTOM_EXAMPLE",
               help="Placement resource class of the deployables."),
]


class ExampleDriver(Driver):
    name = "example"            # must equal the entry point name
    hardware_type = "FPGA"      # sent in POST /hello when run as a process

    def __init__(self, conf: cfg.ConfigOpts, hostname: str) -> None:
        super().__init__(conf, hostname)
        conf.register_opts(OPTS, group="example_driver")  # idempotent
        self.opts = conf.example_driver
        self.wanted = {self._pair(p) for p in self.opts.pci_ids}

    @staticmethod
    def _pair(text: str) -> tuple[str | None, str | None]:
        vendor, _, device = text.partition(":")
        return sysfs.normalise_id(vendor), sysfs.normalise_id(device)

    def discover(self) -> list[HardwareRecord]:
        vendors = {vendor for vendor, _ in self.wanted if vendor}
        return [self._record(f)
                for f in sysfs.list_pci_functions(self.opts.sysfs_root, vendors=vendors)
                if (f.vendor, f.device) in self.wanted]

    def _record(self, function: sysfs.PciFunction) -> HardwareRecord:
        product = f"{function.vendor[2:]}_{function.device[2:]}".upper()
        bound = function.driver is not None
        return HardwareRecord(
            uuid=hardware_uuid(self.hostname, self.name, function.address),
            type=self.opts.device_type,
            vendor=function.vendor,
            model=f"Example {function.vendor}:{function.device}",
            driver_name=self.name,
            controlpath_id=pci_controlpath(function.address),
            acc_specs={"remote": False, "num": 1},
            acc_status="ready" if bound else "setup_required",
            status_reason=None if bound else "no kernel driver bound to the function",
            std_board_info=function.std_board_info(),
            deployables=[Deployable(
                name=function.address,
                num_accelerators=1,
                attributes=attributes(self.opts.resource_class,
                                      ["CUSTOM_EXAMPLE", f"CUSTOM_EXAMPLE_{product}"]),
                attach_handles=[pci_handle(function.address)],
            )],
        )
