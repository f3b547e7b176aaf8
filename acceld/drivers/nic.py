"""SR-IOV NICs: the PFs the operator maps to a physical network, their VFs as handles.

Only PFs named in ``[nic] physical_device_mappings`` are reported (the same
``physnet:interface`` pairs as Neutron's SR-IOV agent; a PCI address works in
place of the interface), so the host's management NIC is never offered by
accident. A mapped PF is one device with one deployable whose attach handles
are its VFs; every VF carries the trait ``CUSTOM_PHYSNET_<PHYSNET>``. A mapped
PF without VFs is ``setup_required``.
"""

from __future__ import annotations

import logging
import os

from oslo_config import cfg

from acceld.drivers import sysfs
from acceld.drivers.base import (AttachHandle, Deployable, Driver, HardwareRecord,
                                 hardware_uuid, pci_controlpath, pci_handle)
from acceld.drivers.pci_health import PciHealthMonitor
from acceld.drivers.pci_isolation import require_isolation
from acceld.drivers.traits import attributes, trait_part

LOG = logging.getLogger(__name__)
# (vendor, PF id) -> product family (i40e_devids.h, ice).
PRODUCTS = {
    ("0x8086", "0x1572"): "INTEL_X710", ("0x8086", "0x15ff"): "INTEL_X710",
    ("0x8086", "0x1583"): "INTEL_XL710", ("0x8086", "0x1584"): "INTEL_XL710",
    ("0x8086", "0x158b"): "INTEL_XXV710",
    ("0x8086", "0x1591"): "INTEL_E810", ("0x8086", "0x1592"): "INTEL_E810",
    ("0x8086", "0x1593"): "INTEL_E810", ("0x8086", "0x1599"): "INTEL_E810",
    ("0x8086", "0x159a"): "INTEL_E810", ("0x8086", "0x159b"): "INTEL_E810",
}


def parse_mappings(entries: list[str], option: str = "physical_device_mappings",
                   what: str = "physnet") -> list[tuple[str, str]]:
    """``["physnet2:enp94s0f0", "physnet3:0000:5e:00.1"]`` -> [(physnet, interface)].

    Upstream's ``name:dev1|dev2`` form (one name, several interfaces) is accepted too."""
    pairs = []
    for entry in entries:
        name, sep, interfaces = entry.strip().partition(":")
        if not sep or not name or not interfaces:
            raise ValueError(f"[nic] {option} entry {entry!r} is not {what}:interface")
        if sysfs.is_pci_address(interfaces.lower()):
            pairs.append((name, interfaces))
            continue
        for interface in interfaces.split("|"):
            if not interface:
                raise ValueError(f"[nic] {option} entry {entry!r} names an empty interface")
            pairs.append((name, interface))
    return pairs


def _address_of(root: str, interface: str) -> str | None:
    """A PF's PCI address from a netdev name (``/sys/class/net/<if>/device``) or an address."""
    if sysfs.is_pci_address(interface.lower()):
        return interface.lower()
    return sysfs.link_name(os.path.join(root, "class", "net", interface, "device"))


def _address(info: dict[str, str]) -> str:
    return f"{info['domain']}:{info['bus']}:{info['device']}.{info['function']}"


def physnet_handle(address: str, physnet: str) -> AttachHandle:
    """A VF's PCI handle carrying its ``physical_network``, as upstream's NIC handles do
    (Nova's port path reads it from the attach handle)."""
    handle = pci_handle(address)
    handle.attach_info["physical_network"] = physnet
    return handle


class NicDriver(Driver):
    """Mapped SR-IOV PFs; rc from ``[nic] resource_class``."""

    name = "nic"
    hardware_type = "NIC"

    def __init__(self, conf: cfg.ConfigOpts, hostname: str) -> None:
        super().__init__(conf, hostname)
        self.opts = conf.nic
        self.root = self.opts.sysfs_root
        self.mappings = parse_mappings(self.opts.physical_device_mappings)
        self.functions = parse_mappings(self.opts.function_device_mappings,
                                        "function_device_mappings", "function")
        self.pci_health = PciHealthMonitor()

    @classmethod
    def claims_pci(cls, conf: cfg.ConfigOpts, function: sysfs.PciFunction) -> bool:
        """Mapped PFs and their VFs (see acceld.drivers.claims)."""
        root = conf.nic.sysfs_root
        pfs = set()
        for _physnet, interface in parse_mappings(conf.nic.physical_device_mappings):
            address = _address_of(root, interface)
            if address:
                pfs.add(address)
        return function.address in pfs or function.physfn in pfs

    def _address_of(self, interface: str) -> str | None:
        return _address_of(self.root, interface)

    def _function_of(self, pf: sysfs.PciFunction, interface: str) -> str | None:
        """The function name ``function_device_mappings`` gives this PF, if any."""
        for function, named in self.functions:
            if named == interface or self._address_of(named) == pf.address:
                return function
        return None

    def discover(self) -> list[HardwareRecord]:
        records: list[HardwareRecord] = []
        seen: set[str] = set()
        for physnet, interface in self.mappings:
            address = self._address_of(interface)
            pf = sysfs.read_pci_function(self.root, address) if address else None
            if pf is None:
                LOG.warning("nic: %s (physnet %s) is not a PCI function on this node",
                            interface, physnet)
                continue
            if pf.base_class != 0x02 or pf.is_vf:
                LOG.warning("nic: %s (%s) is not a network PF; not reported", interface,
                            pf.address)
                continue
            if pf.address in seen:
                continue
            seen.add(pf.address)
            records.append(require_isolation(self._record(pf, physnet, interface), self.root))
        self.pci_health.forget({a for r in records for d in r.deployables
                                for a in [d.name] + [_address(h.attach_info)
                                                     for h in d.attach_handles]})
        return records

    def _record(self, pf: sysfs.PciFunction, physnet: str, interface: str) -> HardwareRecord:
        vfs = [vf for vf in (sysfs.read_pci_function(self.root, a) for a in pf.virtfns)
               if vf is not None]
        product = PRODUCTS.get((pf.vendor, pf.device),
                               f"{pf.vendor[2:].upper()}_{pf.device[2:].upper()}")
        # Upstream's traits first (CUSTOM_VF, CUSTOM_<FUNCTION>, CUSTOM_<PHYSNET>), then acceld's.
        function = self._function_of(pf, interface)
        traits = ["CUSTOM_VF"]
        traits += [f"CUSTOM_{trait_part(function)}"] if function else []
        traits += [f"CUSTOM_{trait_part(physnet)}", f"CUSTOM_PHYSNET_{trait_part(physnet)}",
                   f"CUSTOM_NIC_{product}"]
        deployables = []
        if vfs:
            deployables.append(Deployable(
                name=pf.address, num_accelerators=len(vfs),
                attributes=attributes(self.opts.resource_class, traits, physical_network=physnet),
                attach_handles=[physnet_handle(vf.address, physnet) for vf in vfs]))
        status, reason = "ready", None
        if not vfs:
            status = "setup_required"
            reason = (f"no VFs: write a count up to {pf.sriov_totalvfs} to sriov_numvfs"
                      if pf.is_sriov_pf else "the PF is not SR-IOV capable")
        info = {"physical_network": physnet, "interface": interface,
                "sriov_totalvfs": pf.sriov_totalvfs,
                "vf_product_id": sysfs.parse_hex_id(pf.attr("sriov_vf_device")),
                "netdevs": sysfs.list_dir(pf.join("net")) or None}
        return HardwareRecord(
            uuid=hardware_uuid(self.hostname, self.name, pf.address),
            type="NIC", vendor=pf.vendor, model=f"NIC {product}", driver_name=self.name,
            controlpath_id=pci_controlpath(pf.address),
            acc_specs={"device_type": "NIC", "remote": False, "num": len(vfs)},
            acc_status=status, status_reason=reason, std_board_info=pf.std_board_info(),
            vendor_board_info={k: v for k, v in info.items() if v is not None},
            deployables=deployables,
            health=self.pci_health.check_many([(f.address, f.path) for f in [pf, *vfs]]
                                              ).to_dict())
