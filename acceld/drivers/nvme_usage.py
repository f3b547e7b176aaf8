"""Whether the host uses an NVMe controller, and its SMART critical warning.

An NVMe controller handed to a VM takes every namespace on it away from the host. So a
controller is in use when any block device that reaches the host through it is in use:

- its namespaces ``nvme0n1`` (no native multipath) and their partitions;
- under native NVMe multipath the controller only holds hidden paths (``nvme0c0n1``);
  the disks the host uses are the subsystem's heads, ``/sys/class/nvme-subsystem/
  nvme-subsysN/nvmeNnM``, and their partitions. Every head of every subsystem the
  controller belongs to counts.

A block device is in use when it is mounted, is active swap, has ``holders/`` (LVM,
MD, dm-crypt, multipath dm), or carries a member signature in udev's database
(``ID_FS_TYPE`` ``zfs_member``, ``LVM2_member``, ``linux_raid_member``, ...: ZFS opens
its vdevs without holders and an inactive volume group shows none either). A table
that cannot be read makes every host-bound controller unsafe.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from acceld.drivers import sysfs
from acceld.drivers.health import DEGRADED, HEALTHY, UNHEALTHY, UNKNOWN, Health

LOG = logging.getLogger(__name__)
NAMESPACE_RE = re.compile(r"^nvme\d+n\d+$")
PATH_RE = re.compile(r"^nvme(\d+)c\d+n(\d+)$")
_MEMBER_SUFFIX = "_member"

# SMART critical warning bits (NVMe base spec, SMART / Health Information log, byte 0).
CRITICAL_WARNING_BITS = (
    (0x01, DEGRADED, "available spare below its threshold"),
    (0x02, DEGRADED, "temperature outside its thresholds"),
    (0x04, UNHEALTHY, "NVM subsystem reliability degraded"),
    (0x08, UNHEALTHY, "media in read-only mode"),
    (0x10, UNHEALTHY, "volatile memory backup device failed"),
    (0x20, DEGRADED, "persistent memory region in read-only mode"),
)


def read_mounted_devices(mounts_path: str) -> set[str] | None:
    """Device basenames in a mount table (`/dev/nvme0n1p2` -> `nvme0n1p2`); None: unreadable.

    A ``/dev`` path that is a symlink on this host (``/dev/disk/by-uuid/...``) is resolved.
    """
    return _device_column(mounts_path, skip_header=False)


def read_swap_devices(swaps_path: str) -> set[str] | None:
    """Device basenames of active swap (``/proc/swaps``, a header line first)."""
    return _device_column(swaps_path, skip_header=True)


def _device_column(path: str, skip_header: bool) -> set[str] | None:
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    if skip_header:
        lines = lines[1:]
    out = set()
    for line in lines:
        fields = line.split()
        if fields and fields[0].startswith("/dev/"):
            device = fields[0].replace("\\040", " ")
            out.add(os.path.basename(device))
            if os.path.islink(device):
                out.add(os.path.basename(os.path.realpath(device)))
    return out


def udev_fs_type(udev_data_dir: str, block_dir: str) -> str | None:
    """``ID_FS_TYPE`` udev recorded for a block device (by its ``dev`` major:minor)."""
    dev = sysfs.read_attr(os.path.join(block_dir, "dev"))
    if not dev:
        return None
    text = sysfs.read_attr(os.path.join(udev_data_dir, f"b{dev}"))
    for line in (text or "").splitlines():
        if line.startswith("E:ID_FS_TYPE="):
            return line.split("=", 1)[1].strip() or None
    return None


@dataclass
class HostUsage:
    """The host's tables, read once per discovery; None where a table is unreadable."""

    mounted: set[str] | None
    swaps: set[str] | None
    udev_data_dir: str

    @classmethod
    def read(cls, mounts_path: str, swaps_path: str, udev_data_dir: str) -> "HostUsage":
        return cls(read_mounted_devices(mounts_path), read_swap_devices(swaps_path),
                   udev_data_dir)

    def why_in_use(self, name: str, block_dir: str) -> str | None:
        if self.mounted is None:
            return "the mount table is unreadable"
        if self.swaps is None:
            return "the swap table is unreadable"
        if name in self.mounted:
            return f"{name} is mounted"
        if name in self.swaps:
            return f"{name} is active swap"
        holders = sysfs.list_dir(os.path.join(block_dir, "holders"))
        if holders:
            return f"{name} is held by {', '.join(holders)}"
        fs_type = udev_fs_type(self.udev_data_dir, block_dir)
        if fs_type and fs_type.endswith(_MEMBER_SUFFIX):
            return f"{name} is a {fs_type}"
        return None


def _with_partitions(name: str, path: str) -> list[tuple[str, str]]:
    out = [(name, path)]
    for sub in sysfs.list_dir(path):
        if sub.startswith(name) and os.path.isfile(os.path.join(path, sub, "partition")):
            out.append((sub, os.path.join(path, sub)))
    return out


class Controller:
    """A host-bound controller's ``/sys/class/nvme/nvmeN`` directory."""

    def __init__(self, sysfs_root: str, path: str) -> None:
        self.root = sysfs_root
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

    def subsystems(self) -> list[str]:
        """The ``nvme-subsysN`` directories that list this controller."""
        base = os.path.join(self.root, "class", "nvme-subsystem")
        return [os.path.join(base, s) for s in sysfs.list_dir(base)
                if os.path.exists(os.path.join(base, s, self.name))]

    def block_devices(self) -> list[tuple[str, str]]:
        """(name, sysfs dir) of every block device the host reaches through this controller:
        its own namespaces, the multipath heads of its subsystems, and their partitions."""
        out: list[tuple[str, str]] = []
        has_paths = False
        for entry in sysfs.list_dir(self.path):
            if NAMESPACE_RE.match(entry):
                out += _with_partitions(entry, os.path.join(self.path, entry))
            elif PATH_RE.match(entry):
                has_paths = True
        heads: list[tuple[str, str]] = []
        for subsystem in self.subsystems():
            for entry in sysfs.list_dir(subsystem):
                if NAMESPACE_RE.match(entry):
                    heads += _with_partitions(entry, os.path.join(subsystem, entry))
        if has_paths and not heads:
            # Paths without a readable head: name the head the kernel would give them.
            for entry in sysfs.list_dir(self.path):
                match = PATH_RE.match(entry)
                if match:
                    name = f"nvme{match.group(1)}n{match.group(2)}"
                    heads.append((name, os.path.join(self.root, "block", name)))
        return out + heads

    def in_use(self, usage: HostUsage) -> str | None:
        """Why the host uses (or may use) this controller, or None."""
        for name, path in self.block_devices():
            reason = usage.why_in_use(name, path)
            if reason:
                return reason
        return None


def critical_warning_health(warning: int) -> Health:
    """The SMART critical warning byte as health: the worst set bit decides."""
    if warning == 0:
        return Health(HEALTHY, None, {"nvme_critical_warning": 0})
    found = [(state, text) for bit, state, text in CRITICAL_WARNING_BITS if warning & bit]
    state = UNHEALTHY if any(s == UNHEALTHY for s, _ in found) else DEGRADED
    reason = "NVMe SMART critical warning " + f"{warning:#04x}: " + (
        ", ".join(text for _, text in found) or "unknown bits")
    return Health(state, reason, {"nvme_critical_warning": warning})


def parse_critical_warning(output: str) -> int | None:
    """``critical_warning`` from ``nvme smart-log -o json``: a number (nvme-cli 1.x/2.x) or
    an object with ``value`` (newer verbose output)."""
    try:
        data = json.loads(output)
    except ValueError:
        return None
    value = data.get("critical_warning") if isinstance(data, dict) else None
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def smart_health(tool: str, controller: str, timeout: float) -> Health:
    """SMART health of a host-bound controller through nvme-cli; unknown when the tool is
    not installed or fails (the failure is logged at debug: it repeats every discovery)."""
    path = tool if os.sep in tool else shutil.which(tool)
    if not path or not os.access(path, os.X_OK):
        return Health(UNKNOWN)
    argv = [path, "smart-log", f"/dev/{controller}", "--output-format=json"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        LOG.debug("nvme: %s failed: %s", " ".join(argv), exc)
        return Health(UNKNOWN)
    warning = parse_critical_warning(done.stdout) if done.returncode == 0 else None
    if warning is None:
        LOG.debug("nvme: %s gave no critical_warning (exit %s): %s", " ".join(argv),
                  done.returncode, (done.stderr or "").strip()[-300:])
        return Health(UNKNOWN)
    return critical_warning_health(warning)
