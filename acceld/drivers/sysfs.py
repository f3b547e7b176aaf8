"""Reading Linux sysfs the way every acceld driver needs it.

Drivers get a *sysfs root* from config (``/sys`` on a real node, a fixture
tree in tests) and read through these helpers, so that one place knows the
kernel's file formats: values end in a newline, ids are ``0x%04x``, a missing
``driver`` link means "unbound", a read may fail with EOPNOTSUPP or EBUSY.
Reads never raise: a missing or unreadable attribute is ``None``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Iterable

PCI_ADDRESS_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_VIRTFN_RE = re.compile(r"^virtfn(\d+)$")


def is_pci_address(value: str) -> bool:
    """True for a full, lower-case PCI address such as ``0000:5e:00.1``."""
    return bool(PCI_ADDRESS_RE.match(value))


def read_attr(path: str) -> str | None:
    """The stripped text of a sysfs attribute, or None when missing or unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read(65536)
    except OSError:  # ENOENT, EACCES, EOPNOTSUPP (phys_port_name), EBUSY (afu_id), EISDIR
        return None
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None


def read_int(path: str, base: int = 10) -> int | None:
    """An integer attribute (``base`` 16 accepts an optional ``0x``), or None."""
    text = read_attr(path)
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


def normalise_id(value: str | None) -> str | None:
    """'0x10DE', '10de', '10DE\\n' -> '0x10de'; None for anything that is not a 16-bit hex id."""
    if value is None:
        return None
    text = value.strip().lower()
    if text.startswith("0x"):
        text = text[2:]
    if not text or len(text) > 4 or not all(c in "0123456789abcdef" for c in text):
        return None
    return f"0x{int(text, 16):04x}"


def link_name(path: str) -> str | None:
    """The name a symlink leads to (``driver`` -> 'vfio-pci'), or None when it is no link.

    Resolved rather than read: a netdev's ``device`` link may be ``../../..``-style
    and only the resolved path ends in the PCI address.
    """
    if not os.path.islink(path):
        return None
    return os.path.basename(os.path.realpath(path)) or None


def list_dir(path: str) -> list[str]:
    """Sorted entries of a directory; empty when it is missing or unreadable."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def write_attr(path: str, value: str) -> None:
    """Write a sysfs attribute with root's privileges (acceld.privileged: the sysfs
    context of privsep). Raises OSError, which callers turn into DriverError; an
    attribute acceld never writes is refused the same way."""
    from acceld import privileged

    try:
        privileged.write_sysfs(path, value)
    except privileged.NotAllowed as exc:
        raise PermissionError(str(exc)) from None


@dataclass(frozen=True)
class PciFunction:
    """One PCI function as sysfs shows it. Ids are normalised ``0x%04x`` strings."""

    address: str
    path: str
    vendor: str
    device: str
    class_code: int
    subsystem_vendor: str | None = None
    subsystem_device: str | None = None
    revision: str | None = None
    driver: str | None = None
    numa_node: int | None = None
    iommu_group: str | None = None
    physfn: str | None = None
    virtfns: tuple[str, ...] = field(default_factory=tuple)
    sriov_totalvfs: int | None = None
    sriov_numvfs: int | None = None

    @property
    def is_vf(self) -> bool:
        return self.physfn is not None

    @property
    def is_sriov_pf(self) -> bool:
        """An SR-IOV capable PF (nova's test: ``sriov_totalvfs`` above 0)."""
        return bool(self.sriov_totalvfs)

    @property
    def base_class(self) -> int:
        """The class code's base class byte (0x03 display, 0x12 processing accelerator ...)."""
        return self.class_code >> 16

    @property
    def class_prefix(self) -> int:
        """Base class and subclass without the programming interface (0x0302, 0x0108 ...)."""
        return self.class_code >> 8

    def attr(self, *parts: str) -> str | None:
        """Read an attribute under this function's directory."""
        return read_attr(os.path.join(self.path, *parts))

    def join(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)

    def std_board_info(self) -> dict[str, object]:
        """The PCI facts every driver puts in ``std_board_info``."""
        info: dict[str, object] = {
            "vendor_id": self.vendor,
            "product_id": self.device,
            "class": f"0x{self.class_code:06x}",
            "driver": self.driver,
        }
        if self.subsystem_vendor:
            info["subsystem_vendor_id"] = self.subsystem_vendor
        if self.subsystem_device:
            info["subsystem_product_id"] = self.subsystem_device
        if self.numa_node is not None and self.numa_node >= 0:
            info["numa_node"] = self.numa_node
        if self.iommu_group is not None:
            info["iommu_group"] = self.iommu_group
        return info


def pci_devices_dir(sysfs_root: str) -> str:
    return os.path.join(sysfs_root, "bus", "pci", "devices")


def _link_address(path: str) -> str | None:
    name = link_name(path)
    return name if name and is_pci_address(name) else None


def _virtfns(path: str) -> tuple[str, ...]:
    found: list[tuple[int, str]] = []
    for entry in list_dir(path):
        match = _VIRTFN_RE.match(entry)
        if match:
            address = _link_address(os.path.join(path, entry))
            if address:
                found.append((int(match.group(1)), address))
    return tuple(address for _, address in sorted(found))


def read_pci_function(sysfs_root: str, address: str) -> PciFunction | None:
    """Read one function; None when it is absent or lacks vendor, device or class."""
    if not is_pci_address(address):
        return None
    path = os.path.join(pci_devices_dir(sysfs_root), address)
    vendor = normalise_id(read_attr(os.path.join(path, "vendor")))
    device = normalise_id(read_attr(os.path.join(path, "device")))
    class_code = read_int(os.path.join(path, "class"), 16)
    if vendor is None or device is None or class_code is None:
        return None
    iommu = link_name(os.path.join(path, "iommu_group"))
    return PciFunction(
        address=address,
        path=os.path.realpath(path),
        vendor=vendor,
        device=device,
        class_code=class_code,
        subsystem_vendor=normalise_id(read_attr(os.path.join(path, "subsystem_vendor"))),
        subsystem_device=normalise_id(read_attr(os.path.join(path, "subsystem_device"))),
        revision=read_attr(os.path.join(path, "revision")),
        driver=link_name(os.path.join(path, "driver")),
        numa_node=read_int(os.path.join(path, "numa_node")),
        iommu_group=iommu,
        physfn=_link_address(os.path.join(path, "physfn")),
        virtfns=_virtfns(path),
        sriov_totalvfs=read_int(os.path.join(path, "sriov_totalvfs")),
        sriov_numvfs=read_int(os.path.join(path, "sriov_numvfs")),
    )


def list_pci_functions(sysfs_root: str, vendors: Iterable[str] | None = None) -> list[PciFunction]:
    """Every readable PCI function under ``<sysfs_root>/bus/pci/devices``, by address.

    ``vendors`` (normalised ids) limits the result; the vendor file is read
    first so that other vendors' functions cost one read each.
    """
    wanted = {normalise_id(v) for v in vendors} if vendors is not None else None
    base = pci_devices_dir(sysfs_root)
    out: list[PciFunction] = []
    for address in list_dir(base):
        if not is_pci_address(address):
            continue
        if wanted is not None:
            if normalise_id(read_attr(os.path.join(base, address, "vendor"))) not in wanted:
                continue
        function = read_pci_function(sysfs_root, address)
        if function is not None:
            out.append(function)
    return out


def parse_hex_id(text: str | None) -> str | None:
    """``sriov_vf_device``: '154c' today, '0x154c' after a 2025 kernel change; both -> '0x154c'."""
    return normalise_id(text)

