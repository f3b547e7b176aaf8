"""Intel FPGA cards (PAC, N3000, D5005, OFS) through OPAE sysfs; programs with ``fpgaconf``.

Both kernel stacks are read:

- upstream DFL (``dfl-pci``): ``<pf>/fpga_region/regionN/dfl-fme.M`` holds the
  FME (``bitstream_id``; the PR interface id is
  ``dfl-fme-region.*/fpga_region/region*/compat_id``) and ``dfl-port.K``
  holds a port's ``afu_id``;
- the legacy out-of-tree OPAE driver: ``<pf>/fpga/intel-fpga-dev.N/
  intel-fpga-fme.M/{bitstream_id,pr/interface_id}`` and ``intel-fpga-port.K/afu_id``.

A device is a PF. Its deployables are its VFs when SR-IOV is enabled (each VF
carries one port), otherwise the PF itself; a PF whose port was released for
SR-IOV but has no VF yet is reported as ``setup_required``. Programming always
goes to the PF (the FME stays there) with ``fpgaconf``.
"""

from __future__ import annotations

import glob
import logging
import os

from oslo_config import cfg

from acceld import privileged
from acceld.drivers import sysfs
from acceld.drivers.health import DEGRADED, HEALTHY, UNHEALTHY, UNKNOWN, Health, worst
from acceld.drivers.pci_health import PciHealthMonitor
from acceld.drivers.pci_isolation import is_vfio_driver, require_isolation
from acceld.drivers.remembered_ids import RememberedIds
from acceld.drivers.base import (Deployable, Driver, DriverError, HardwareRecord, NotSupported,
                                 hardware_uuid, pci_address_parts, pci_controlpath, pci_handle)
from acceld.drivers.tools import resolve_tool, run_tool
from acceld.drivers.traits import attributes

LOG = logging.getLogger(__name__)

VENDORS = ("0x8086", "0x1c2c")
# (vendor, PF device id) -> product (drivers/fpga/dfl-pci.c).
PF_PRODUCTS = {
    ("0x8086", "0x09c4"): "PAC_ARRIA10", ("0x8086", "0x0b30"): "PAC_N3000",
    ("0x8086", "0x0b2b"): "PAC_D5005", ("0x8086", "0xbcc0"): "XEON_FPGA",
    ("0x8086", "0xbcbd"): "XEON_FPGA", ("0x8086", "0xbcce"): "OFS",
    ("0x1c2c", "0x1000"): "N5010", ("0x1c2c", "0x1001"): "N5011",
}
VF_IDS = {("0x8086", d) for d in ("0x09c5", "0x0b2c", "0xbcc1", "0xbcbf", "0xbccf")}
# OFS cards share one PF id and differ by subsystem id.
OFS_SUBSYSTEMS = {"0x138d": "D5005", "0x1770": "N6000", "0x1771": "N6001", "0x17d4": "C6100"}


def guid(value: str | None) -> str | None:
    """An AFU or interface id as 32 lower-case hex digits (dashes dropped), or None."""
    if not value:
        return None
    text = value.strip().lower().replace("-", "")
    if text.startswith("0x"):
        text = text[2:]
    if len(text) != 32 or any(c not in "0123456789abcdef" for c in text):
        return None
    return text


# FME error registers (sysfs-platform-dfl-fme; the legacy driver has the same names, its
# FME's own register under fme-errors/errors) -> the state a non-zero value means.
# Catastrophic/fatal errors stop the card; the others are logged by the FME and the card
# keeps working.
FME_ERROR_REGISTERS = (("catfatal_errors", UNHEALTHY), ("nonfatal_errors", DEGRADED),
                       ("pcie0_errors", DEGRADED), ("pcie1_errors", DEGRADED),
                       ("fme_errors", DEGRADED), ("fme-errors/errors", DEGRADED))


def _register(path: str) -> int | None:
    """A hex error register ('0x0', '0x8000000000000000'), or None when absent."""
    text = sysfs.read_attr(path)
    if text is None:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


def fpga_error_health(fme: str | None, ports: list[str]) -> Health:
    """Health from the FME's and the ports' error registers: a set bit in the FME's
    catastrophic/fatal register or in a port's ``errors`` (the port stops accepting
    requests until the error is cleared) is unhealthy; others degraded. Counters are
    the number of set bits per register."""
    found: list[Health] = []
    counters: dict[str, int] = {}
    registers = [(os.path.join(fme, "errors", name), f"fpga_fme_{name.replace('/', '_')}",
                  state, f"FME {name}") for name, state in FME_ERROR_REGISTERS] if fme else []
    for port in ports:
        registers.append((os.path.join(port, "errors", "errors"),
                          f"fpga_{os.path.basename(port)}_errors", UNHEALTHY,
                          f"port {os.path.basename(port)} errors"))
    for path, counter, state, what in registers:
        value = _register(path)
        if value is None:
            continue
        counters[counter] = bin(value).count("1")
        # The reason names the register, not its value: the value is in the counters, and
        # a reason that changed with each new error bit would make every report "changed".
        found.append(Health(state, f"{what} non-zero") if value else Health(HEALTHY))
    if not found:
        return Health(UNKNOWN)
    health = worst(*found)
    health.counters = counters
    return health


def _first(pattern: str) -> str | None:
    found = sorted(glob.glob(pattern))
    return found[0] if found else None


class FpgaFunction:
    """The OPAE view of one PCI function: its FME (PFs) and its port."""

    def __init__(self, function: sysfs.PciFunction) -> None:
        self.function = function
        path = function.path
        dfl_fme = _first(os.path.join(path, "fpga_region", "region*", "dfl-fme.*"))
        legacy_dev = _first(os.path.join(path, "fpga", "intel-fpga-dev.*"))
        self.stack: str | None = None
        self.fme: str | None = None
        self.interface_id: str | None = None
        if dfl_fme:
            self.stack, self.fme = "dfl", dfl_fme
            self.interface_id = guid(sysfs.read_attr(_first(os.path.join(
                dfl_fme, "dfl-fme-region.*", "fpga_region", "region*", "compat_id")) or ""))
            port = _first(os.path.join(path, "fpga_region", "region*", "dfl-port.*"))
        elif legacy_dev:
            self.stack = "intel-fpga"
            self.fme = _first(os.path.join(legacy_dev, "intel-fpga-fme.*"))
            if self.fme:
                self.interface_id = guid(sysfs.read_attr(os.path.join(self.fme, "pr",
                                                                      "interface_id")))
            port = _first(os.path.join(legacy_dev, "intel-fpga-port.*"))
        else:
            port = _first(os.path.join(path, "fpga_region", "region*", "dfl-port.*"))
            self.stack = "dfl" if port else None
        self.port = port
        # afu_id reads EBUSY while the port is disabled: then the AFU is unknown.
        self.afu_id = guid(sysfs.read_attr(os.path.join(port, "afu_id"))) if port else None

    @property
    def bitstream_id(self) -> str | None:
        return sysfs.read_attr(os.path.join(self.fme, "bitstream_id")) if self.fme else None

    @property
    def ports_num(self) -> int | None:
        return sysfs.read_int(os.path.join(self.fme, "ports_num")) if self.fme else None


class IntelFpgaDriver(Driver):
    """Intel FPGA PFs and VFs; rc FPGA; program with fpgaconf."""

    name = "intel_fpga"
    hardware_type = "FPGA"

    def __init__(self, conf: cfg.ConfigOpts, hostname: str) -> None:
        super().__init__(conf, hostname)
        self.opts = conf.intel_fpga
        self.root = self.opts.sysfs_root
        privileged.adopt(conf, "intel_fpga")  # in process: which fpgaconf may run
        self.pci_health = PciHealthMonitor()
        # The ids last read, kept under state_path so that a restart of the agent while a
        # function is in a VM (vfio-pci hides its FME/port files) keeps its traits.
        self._ids = RememberedIds(os.path.join(conf.state_path, self.name))

    @classmethod
    def claims_pci(cls, conf: cfg.ConfigOpts, function: sysfs.PciFunction) -> bool:
        """Known Intel/Silicom FPGA PFs and VFs (see acceld.drivers.claims)."""
        ids = (function.vendor, function.device)
        return ids in PF_PRODUCTS or ids in VF_IDS

    def _remembered(self, kind: str, function: sysfs.PciFunction,
                    value: str | None) -> str | None:
        """An id read now is remembered (under state_path); while the function is bound to
        a VFIO driver (given to a VM: the FME or port files are gone from the host) the
        remembered one is used, so that its traits do not change when libvirt rebinds it,
        nor when the agent restarts meanwhile."""
        if value:
            self._ids.put(kind, function, value)
            return value
        return self._ids.get(kind, function) if is_vfio_driver(function.driver) else None

    def _product(self, function: sysfs.PciFunction) -> str | None:
        product = PF_PRODUCTS.get((function.vendor, function.device))
        if product == "OFS" and function.subsystem_device in OFS_SUBSYSTEMS:
            product = OFS_SUBSYSTEMS[function.subsystem_device]
        return product

    def _pfs(self) -> tuple[list[tuple[sysfs.PciFunction, FpgaFunction]],
                            dict[str, sysfs.PciFunction]]:
        functions = {f.address: f for f in sysfs.list_pci_functions(self.root, vendors=VENDORS)}
        pfs = []
        for function in functions.values():
            if function.is_vf:
                continue
            known = (function.vendor, function.device) in PF_PRODUCTS
            # A PF id we know, or any function of these vendors with an FME (a new card).
            fpga = FpgaFunction(function) if known or function.base_class == 0x12 else None
            if fpga is not None and (known or fpga.fme):
                pfs.append((function, fpga))
        return pfs, functions

    def discover(self) -> list[HardwareRecord]:
        pfs, functions = self._pfs()
        records = [require_isolation(self._record(pf, fpga, functions), self.root)
                   for pf, fpga in pfs]
        self.pci_health.forget(set(functions))
        return records

    def _record(self, pf: sysfs.PciFunction, fpga: FpgaFunction,
                functions: dict[str, sysfs.PciFunction]) -> HardwareRecord:
        product = self._product(pf) or pf.device[2:].upper()
        interface_id = self._remembered("interface_id", pf, fpga.interface_id)
        base_traits = ["CUSTOM_FPGA_INTEL", f"CUSTOM_FPGA_INTEL_{product}"]
        if interface_id:
            base_traits.append(f"CUSTOM_FPGA_REGION_INTEL_{interface_id.upper()}")
        units: list[tuple[sysfs.PciFunction, FpgaFunction]] = []
        for vf_address in pf.virtfns:
            vf = functions.get(vf_address)
            if vf is not None:
                units.append((vf, FpgaFunction(vf)))
        if not units and (fpga.port or is_vfio_driver(pf.driver)):
            units.append((pf, fpga))  # on vfio-pci its port is inside a VM now
        deployables = []
        for function, unit in units:
            afu_id = self._remembered("afu_id", function, unit.afu_id)
            traits = list(base_traits)
            if afu_id:
                traits.append(f"CUSTOM_FPGA_FUNCTION_ID_INTEL_{afu_id.upper()}")
            deployables.append(Deployable(
                name=function.address, num_accelerators=1,
                attributes=attributes("FPGA", traits, region_id=interface_id,
                                      function_id=afu_id),
                attach_handles=[pci_handle(function.address)]))
        status, reason = "ready", None
        if not deployables:
            status = "setup_required"
            reason = ("no port to offer: the port was released for SR-IOV but no VF is "
                      "enabled (write sriov_numvfs)" if fpga.fme else
                      "no FME or port found in sysfs: is the dfl-pci or intel-fpga driver "
                      "bound?")
        members = [pf] + [function for function, _unit in units if function is not pf]
        health = worst(self.pci_health.check_many([(f.address, f.path) for f in members]),
                       fpga_error_health(fpga.fme, [u.port for _f, u in units if u.port]))
        vendor_info = {"product": product, "stack": fpga.stack, "interface_id": interface_id,
                       "fme_bitstream_id": fpga.bitstream_id, "ports_num": fpga.ports_num}
        return HardwareRecord(
            uuid=hardware_uuid(self.hostname, self.name, pf.address),
            type="FPGA", vendor=pf.vendor, model=f"Intel FPGA {product}", driver_name=self.name,
            controlpath_id=pci_controlpath(pf.address),
            acc_specs={"device_type": "FPGA", "remote": False, "num": len(deployables)},
            acc_status=status, status_reason=reason, std_board_info=pf.std_board_info(),
            vendor_board_info={k: v for k, v in vendor_info.items() if v is not None},
            deployables=deployables, health=health.to_dict())

    def program(self, deployable_name: str, image_path: str, kind: str = "bitstream") -> None:
        """Write a GBS bitstream into the PR region of the deployable's card."""
        if kind != "bitstream":
            raise NotSupported(f"driver {self.name} cannot program {kind} images: it loads "
                               f"partial-reconfiguration bitstreams (.gbs) with fpgaconf")
        pf = self._pf_of(deployable_name)
        if not os.path.isfile(image_path):
            raise DriverError(f"bitstream file {image_path!r} does not exist")
        tool = resolve_tool(self.opts.fpgaconf_path, "fpgaconf")
        parts = pci_address_parts(pf)
        argv = [tool]
        if parts["domain"] != "0000":
            argv += ["--segment", f"0x{parts['domain']}"]
        argv += ["--bus", f"0x{parts['bus']}", "--device", f"0x{parts['device']}",
                 "--function", f"0x{parts['function']}", image_path]
        run_tool(argv, self.opts.program_timeout, "fpgaconf")

    def _pf_of(self, deployable_name: str) -> str:
        pfs, functions = self._pfs()
        for pf, _fpga in pfs:
            if deployable_name == pf.address or deployable_name in pf.virtfns:
                return pf.address
        raise DriverError(f"no Intel FPGA deployable {deployable_name!r} on this node")
