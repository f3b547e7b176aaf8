"""The generic PCI driver: any PCI function the allow-list admits, found in sysfs.

It reads ``<sysfs_root>/bus/pci/devices/*`` (vendor, device, class, ...), keeps
the functions that a Nova-style allow-list (``[pci_driver] device_spec``)
admits and whose class is one of ``[pci_driver] device_classes``, and types
each by its class code: 03xx GPU, 1200 FPGA (FPGA vendors, Intel's FPGA ids) or
AICHIP (an Intel NPU, Ascend, Gaudi), 0b40 QAT, 0108 SSD, 02xx NIC. Each function
is one device with one deployable and one PCI attach handle, except an SR-IOV PF
with admitted VFs: its VFs become the attach handles of the PF's deployable.

Functions another enabled driver claims (``nvidia_gpu``, ``intel_fpga`` ...; see
acceld.drivers.claims) are left to it. A function that cannot be given to a VM (the
boot VGA device, or an IOMMU group shared with a device the host keeps; see
acceld.drivers.pci_isolation) is reported ``setup_required`` with the reason.
Traits are upstream Cyborg's (``OWNER_CYBORG``, ``CUSTOM_PCI_<VENDOR>``,
``CUSTOM_PCI_PRODUCT_ID_<pid>``) followed by acceld's ``CUSTOM_PCI_<vid>_<pid>``.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson

from acceld.drivers import sysfs
from acceld.drivers.base import (Deployable, Driver, DriverError,
                                 HardwareRecord, hardware_uuid, pci_controlpath, pci_handle)
from acceld.drivers.claims import claimed_by_others
from acceld.drivers.intel_fpga import PF_PRODUCTS as INTEL_FPGA_PFS, VF_IDS as INTEL_FPGA_VFS
from acceld.drivers.pci_health import PciHealthMonitor, judges_link_speed
from acceld.drivers.pci_isolation import one_offer_per_group, split_assignable, vfio_refuses
from acceld.drivers.traits import upstream_vendor
from acceld.drivers.vgpu_presence import vgpu_managed, vgpu_reason

LOG = logging.getLogger(__name__)

_ADDRESS = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")
# Vendors whose "processing accelerators" (class 1200) are all FPGAs: Xilinx/AMD Alveo,
# Altera, Silicom (N5010). Intel's class-1200 functions are FPGAs only by id (PAC, N3000,
# D5005, OFS): its NPUs and Gaudi accelerators share the class.
FPGA_VENDORS = {0x10EE, 0x1172, 0x1C2C}
INTEL_FPGA_IDS = {int(device, 16) for vendor, device in (*INTEL_FPGA_PFS, *INTEL_FPGA_VFS)
                  if vendor == "0x8086"}
STANDARD_RCS = {"PGPU", "VGPU", "FPGA", "PCI_DEVICE", "SRIOV_NET_VF"}
STANDARD_TRAIT_PREFIXES = ("CUSTOM_", "HW_", "COMPUTE_", "OWNER_", "STORAGE_", "MISC_")
_SPEC_KEYS = {"vendor_id", "product_id", "address", "resource_class", "traits"}
# Nova tags that mean nothing to acceld; accepted so Nova's lines can be copied as they are.
_NOVA_ONLY_KEYS = {"physical_network", "trusted", "remote_managed", "managed",
                   "live_migratable", "one_time_use"}
_GLOB_LIMITS = (0xFFFF, 0xFF, 0x1F, 0x7)
_REGEX_FIELDS = (("domain", "%04x"), ("bus", "%02x"), ("slot", "%02x"), ("function", "%1x"))


def device_type(class_code: int, vendor: int, product: int | None = None) -> str | None:
    """The API's device type for a PCI class code (24 bits), or None if not an accelerator."""
    base_sub = class_code >> 8
    base = base_sub >> 8
    if base == 0x03:
        return "GPU"
    if base_sub == 0x1200:
        fpga = vendor in FPGA_VENDORS or (vendor == 0x8086 and product in INTEL_FPGA_IDS)
        return "FPGA" if fpga else "AICHIP"
    if base_sub == 0x0B40:
        return "QAT"
    if base_sub == 0x0108:
        return "SSD"
    if base == 0x02:
        return "NIC"
    return None


def _norm(name: str) -> str:
    return re.sub(r"[^A-Z0-9_]", "_", name.strip().upper())


def normalize_rc(name: str) -> str:
    name = _norm(name)
    return name if name in STANDARD_RCS or name.startswith("CUSTOM_") else f"CUSTOM_{name}"


def normalize_trait(name: str) -> str:
    name = _norm(name)
    return name if name.startswith(STANDARD_TRAIT_PREFIXES) else f"CUSTOM_{name}"


@dataclass
class PciFunction:
    """What sysfs says about one PCI function."""

    address: str
    vendor: int
    product: int
    class_code: int
    subsystem_vendor: int | None = None
    subsystem_device: int | None = None
    revision: int | None = None
    numa_node: int | None = None
    driver: str | None = None
    physfn: str | None = None  # the PF's address, for a VF
    sriov_totalvfs: int = 0
    sriov_numvfs: int = 0

    @property
    def parts(self) -> tuple[int, int, int, int]:
        match = _ADDRESS.match(self.address)
        assert match is not None
        return tuple(int(g, 16) for g in match.groups())  # type: ignore[return-value]


class SpecError(ValueError):
    """A malformed allow-list entry; the message names it."""


@dataclass
class DeviceSpec:
    """One allow-list entry: vendor, product and address must all match (``*`` = any)."""

    vendor: int | None = None
    product: int | None = None
    address_match: Callable[[PciFunction], bool] = lambda dev: True
    exact_address: str | None = None  # a single fully named address (PF expansion)
    resource_class: str | None = None
    traits: list[str] = field(default_factory=list)

    def match(self, dev: PciFunction, functions: dict[str, PciFunction]) -> bool:
        if self.vendor is not None and dev.vendor != self.vendor:
            return False
        if self.product is not None and dev.product != self.product:
            return False
        if self.address_match(dev):
            return True
        # Nova's PF expansion: an entry naming a PF's exact address also covers its VFs.
        if self.exact_address and dev.physfn == self.exact_address:
            parent = functions.get(self.exact_address)
            return parent is not None and parent.sriov_totalvfs > 0
        return False


def _hex_id(value: Any, what: str) -> int | None:
    if value is None or value == "*":
        return None
    try:
        number = int(str(value), 16)
    except ValueError:
        raise SpecError(f"{what} {value!r} is not a hex id") from None
    if not 0 <= number <= 0xFFFF:
        raise SpecError(f"{what} {value!r} is out of range")
    return number


def _glob_address(text: str) -> tuple[Callable[[PciFunction], bool], str | None]:
    """Nova's glob form ``[[[[dom]:]bus]:][slot][.[func]]``; ``*`` or empty = any."""
    dbs, _, func = text.partition(".")
    fields = dbs.split(":") if dbs else []
    if len(fields) > 3:
        raise SpecError(f"address {text!r} has too many ':' fields")
    fields = ["*"] * (3 - len(fields)) + fields + [func]
    wanted: list[int | None] = []
    for value, limit in zip(fields, _GLOB_LIMITS):
        if value in ("", "*"):
            wanted.append(None)
            continue
        try:
            number = int(value, 16)
        except ValueError:
            raise SpecError(f"address {text!r}: {value!r} is not hex") from None
        if number > limit:
            raise SpecError(f"address {text!r}: {value!r} exceeds {limit:x}")
        wanted.append(number)

    def match(dev: PciFunction) -> bool:
        return all(w is None or w == p for w, p in zip(wanted, dev.parts))

    exact = None
    if all(w is not None for w in wanted):
        exact = "%04x:%02x:%02x.%x" % tuple(wanted)  # type: ignore[str-format]
    return match, exact


def _regex_address(spec: dict[str, Any]) -> Callable[[PciFunction], bool]:
    """Nova's regex form: each field ``re.match``-ed against the zero-padded hex field."""
    unknown = set(spec) - {name for name, _ in _REGEX_FIELDS}
    if unknown:
        raise SpecError(f"address has unknown field(s) {', '.join(sorted(unknown))}")
    patterns = []
    for (name, fmt), index in zip(_REGEX_FIELDS, range(4)):
        try:
            patterns.append((re.compile(str(spec.get(name, ".*"))), fmt, index))
        except re.error as exc:
            raise SpecError(f"address {name} regex {spec.get(name)!r}: {exc}") from None

    def match(dev: PciFunction) -> bool:
        parts = dev.parts
        return all(p.match(fmt % parts[i]) for p, fmt, i in patterns)

    return match


def parse_spec(entry: dict[str, Any]) -> DeviceSpec:
    if not isinstance(entry, dict):
        raise SpecError(f"each entry must be a JSON object, not {entry!r}")
    if "devname" in entry:
        raise SpecError("'devname' is not supported; name the PCI address instead")
    unknown = set(entry) - _SPEC_KEYS - _NOVA_ONLY_KEYS
    if unknown:
        raise SpecError(f"unknown key(s) {', '.join(sorted(unknown))}")
    spec = DeviceSpec(vendor=_hex_id(entry.get("vendor_id"), "vendor_id"),
                      product=_hex_id(entry.get("product_id"), "product_id"))
    address = entry.get("address")
    if isinstance(address, str):
        spec.address_match, spec.exact_address = _glob_address(address)
    elif isinstance(address, dict):
        spec.address_match = _regex_address(address)
    elif address is not None:
        raise SpecError(f"address must be a string or an object, not {address!r}")
    if entry.get("resource_class"):
        spec.resource_class = normalize_rc(str(entry["resource_class"]))
    traits = entry.get("traits") or ""
    if not isinstance(traits, str):
        raise SpecError("traits must be a comma-separated string")
    spec.traits = [normalize_trait(t) for t in traits.split(",") if t.strip()]
    return spec


def parse_specs(values: list[str]) -> list[DeviceSpec]:
    """``[pci_driver] device_spec`` values: each a JSON object or a list of them."""
    specs = []
    for value in values:
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise SpecError(f"device_spec {value!r} is not JSON: {exc}") from None
        for entry in parsed if isinstance(parsed, list) else [parsed]:
            try:
                specs.append(parse_spec(entry))
            except SpecError as exc:
                raise SpecError(f"device_spec {orjson.dumps(entry).decode()}: {exc}") from None
    return specs


def parse_classes(values: list[str]) -> set[int]:
    classes = set()
    for value in values:
        try:
            number = int(value, 16)
        except ValueError:
            raise SpecError(f"device_classes: {value!r} is not hex (0xBBSS)") from None
        if not 0 <= number <= 0xFFFF:
            raise SpecError(f"device_classes: {value!r} is not a base and sub class (0xBBSS)")
        classes.add(number)
    return classes


# --- sysfs ------------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _read_hex(path: str) -> int | None:
    text = _read(path)
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None


def _read_int(path: str) -> int | None:
    text = _read(path)
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _link_name(path: str) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def read_function(directory: str) -> PciFunction | None:
    """One function's sysfs directory, or None if it lacks the ids (not a PCI function)."""
    address = os.path.basename(directory)
    if not _ADDRESS.match(address):
        return None
    vendor = _read_hex(os.path.join(directory, "vendor"))
    product = _read_hex(os.path.join(directory, "device"))
    class_code = _read_hex(os.path.join(directory, "class"))
    if vendor is None or product is None or class_code is None:
        return None
    return PciFunction(
        address=address, vendor=vendor, product=product, class_code=class_code,
        subsystem_vendor=_read_hex(os.path.join(directory, "subsystem_vendor")),
        subsystem_device=_read_hex(os.path.join(directory, "subsystem_device")),
        revision=_read_hex(os.path.join(directory, "revision")),
        numa_node=_read_int(os.path.join(directory, "numa_node")),
        driver=_link_name(os.path.join(directory, "driver")),
        physfn=_link_name(os.path.join(directory, "physfn")),
        sriov_totalvfs=_read_int(os.path.join(directory, "sriov_totalvfs")) or 0,
        sriov_numvfs=_read_int(os.path.join(directory, "sriov_numvfs")) or 0,
    )


def scan(sysfs_root: str) -> dict[str, PciFunction]:
    """Every PCI function under ``<sysfs_root>/bus/pci/devices``, by address."""
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return {}
    functions = {}
    for name in names:
        dev = read_function(os.path.join(base, name))
        if dev is not None:
            functions[dev.address] = dev
    return functions


# --- the driver --------------------------------------------------------------------------


class PciDriver(Driver):
    name = "pci"
    hardware_type = "PCI"

    def __init__(self, conf, hostname: str) -> None:  # type: ignore[no-untyped-def]
        super().__init__(conf, hostname)
        try:
            self.specs = parse_specs(list(conf.pci_driver.device_spec or []))
            self.classes = parse_classes(list(conf.pci_driver.device_classes or []))
        except SpecError as exc:
            raise DriverError(f"[pci_driver] {exc}") from None
        self.default_rc = normalize_rc(conf.pci_driver.rc)
        self.pci_health = PciHealthMonitor()
        self._warned_denylist: set[str] = set()

    def admitted(self, functions: dict[str, PciFunction]) -> dict[str, tuple[PciFunction,
                                                                             DeviceSpec]]:
        """Functions of an accepted class that some entry admits, with the first such entry."""
        out = {}
        for address, dev in functions.items():
            if (dev.class_code >> 8) not in self.classes:
                continue
            if device_type(dev.class_code, dev.vendor, dev.product) is None:
                continue
            spec = next((s for s in self.specs if s.match(dev, functions)), None)
            if spec is not None:
                out[address] = (dev, spec)
        return out

    def _unclaimed(self, admitted: dict[str, tuple[PciFunction, DeviceSpec]]
                   ) -> dict[str, tuple[PciFunction, DeviceSpec]]:
        """``admitted`` less what another enabled driver claims (one driver per device)."""
        root = self.conf.pci_driver.sysfs_root
        functions = [f for f in (sysfs.read_pci_function(root, a) for a in admitted) if f]
        claimed = claimed_by_others(self.conf, self.name, functions)
        for address, owner in claimed.items():
            LOG.debug("pci: %s is left to the %s driver", address, owner)
        return {a: v for a, v in admitted.items() if a not in claimed}

    def _warn_denylisted(self, dev: PciFunction) -> None:
        if dev.address in self._warned_denylist or not vfio_refuses(
                self.conf.pci_driver.sysfs_root, f"0x{dev.vendor:04x}", f"0x{dev.product:04x}"):
            return
        self._warned_denylist.add(dev.address)
        LOG.warning("pci: %s (%04x:%04x) is on vfio-pci's denylist: vfio-pci will refuse to "
                    "bind it (and a VM cannot get it) unless the vfio_pci module is loaded "
                    "with disable_denylist=1", dev.address, dev.vendor, dev.product)

    def discover(self) -> list[HardwareRecord]:
        functions = scan(self.conf.pci_driver.sysfs_root)
        admitted = self._unclaimed(self.admitted(functions))
        vfs_of: dict[str, list[PciFunction]] = {}
        for dev, _spec in admitted.values():
            if dev.physfn and dev.physfn in admitted:
                vfs_of.setdefault(dev.physfn, []).append(dev)
        records = []
        for address, (dev, spec) in admitted.items():
            if dev.physfn and dev.physfn in admitted:
                continue  # an attach handle of its PF's deployable
            records.append(self._record(dev, spec, vfs_of.get(address, []), functions))
        self.pci_health.forget(set(admitted))
        return one_offer_per_group(records, self.conf.pci_driver.sysfs_root)

    def _vgpu_reason(self, dev: PciFunction, functions: dict[str, PciFunction]) -> str | None:
        """Why the vGPU manager keeps this function (or, for a PF, any of its VFs) from
        being a plain PCI device; None when it does not (acceld.drivers.vgpu_presence)."""
        root = self.conf.pci_driver.sysfs_root
        if dev.physfn:
            return vgpu_reason(root, dev.address, dev.physfn)
        all_vfs = sorted(f.address for f in functions.values() if f.physfn == dev.address)
        if all_vfs:
            return vgpu_managed(root, dev.address, all_vfs)
        return vgpu_reason(root, dev.address, None)

    def _record(self, dev: PciFunction, spec: DeviceSpec, vfs: list[PciFunction],
                functions: dict[str, PciFunction]) -> HardwareRecord:
        kind = device_type(dev.class_code, dev.vendor, dev.product)
        assert kind is not None
        root = self.conf.pci_driver.sysfs_root
        handle_functions = vfs or [dev]
        handles = [pci_handle(f.address) for f in handle_functions]
        for function in handle_functions:
            self._warn_denylisted(function)
        # Upstream's traits (OWNER_CYBORG, CUSTOM_PCI_<VENDOR> when it names the vendor,
        # CUSTOM_PCI_PRODUCT_ID_<pid>), then acceld's, then the allow-list entry's.
        vendor_name = upstream_vendor(f"{dev.vendor:04x}")
        traits = ["OWNER_CYBORG"] + ([f"CUSTOM_PCI_{vendor_name}"] if vendor_name else [])
        traits += [f"CUSTOM_PCI_PRODUCT_ID_{dev.product:04X}",
                   f"CUSTOM_PCI_{dev.vendor:04X}_{dev.product:04X}"]
        traits += [t for t in spec.traits if t not in traits]
        isolation = split_assignable(root, [f.address for f in handle_functions])
        status, reason = ("setup_required", isolation.reason()) if isolation.problems else (
            "ready", None)
        vgpu = self._vgpu_reason(dev, functions)
        if vgpu:
            # vGPU guests run here (or may): never a plain PCI device, nothing offered.
            handles = []
            status, reason = "setup_required", (
                f"{vgpu}: not offered as PCI devices (enable the nvidia_gpu driver to offer "
                f"its vGPUs)")
        devices_dir = os.path.join(root, "bus", "pci", "devices")
        # Display and 3D controllers slow their link down when idle: width only (pci_health).
        health = self.pci_health.check_many(
            [(f.address, os.path.join(devices_dir, f.address))
             for f in [dev, *vfs]], judge_speed=judges_link_speed(dev.class_code))
        attributes = {"rc": spec.resource_class or self.default_rc}
        attributes.update({f"trait{i}": trait for i, trait in enumerate(traits)})
        board: dict[str, Any] = {
            "vendor_id": f"0x{dev.vendor:04x}",
            "product_id": f"0x{dev.product:04x}",
            "class": f"0x{dev.class_code:06x}",
        }
        for key, value, fmt in (("subsystem_vendor", dev.subsystem_vendor, "0x%04x"),
                                ("subsystem_device", dev.subsystem_device, "0x%04x"),
                                ("revision", dev.revision, "0x%02x")):
            if value is not None:
                board[key] = fmt % value
        if dev.numa_node is not None:
            board["numa_node"] = dev.numa_node
        board["driver"] = dev.driver
        if dev.sriov_totalvfs:
            board["sriov_totalvfs"] = dev.sriov_totalvfs
            board["sriov_numvfs"] = dev.sriov_numvfs
        return HardwareRecord(
            uuid=hardware_uuid(self.hostname, self.name, dev.address),
            type=kind,
            vendor=f"0x{dev.vendor:04x}",
            model=f"0x{dev.product:04x}",
            driver_name=self.name,
            controlpath_id=pci_controlpath(dev.address),
            acc_specs={"remote": 0, "num": len(handles), "device_type": kind},
            acc_status=status, status_reason=reason,
            std_board_info=board,
            vendor_board_info={},
            deployables=[Deployable(name=dev.address, num_accelerators=len(handles),
                                    attributes=attributes, attach_handles=handles)]
            if handles else [],
            health=health.to_dict(),
        )
