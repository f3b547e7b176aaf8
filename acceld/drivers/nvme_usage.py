"""Whether the host uses an NVMe controller, and its SMART critical warning.

An NVMe controller handed to a VM takes every namespace on it away from the host. So a
controller is in use when any block device that reaches the host through it is in use:

- its namespaces ``nvme0n1`` (no native multipath) and their partitions;
- under native NVMe multipath the controller only holds hidden paths (``nvme0c0n1``);
  the disks the host uses are the subsystem's heads, ``/sys/class/nvme-subsystem/
  nvme-subsysN/nvmeNnM``, and their partitions. Every head of every subsystem the
  controller belongs to counts.

A block device is in use when it is mounted (matched by major:minor from
``/proc/self/mountinfo``, so a root file system mounted as ``/dev/root`` counts, and by
source name), is active swap, is a member of a mounted btrfs (``/sys/fs/btrfs/<fsid>/
devices/``: only one member of a multi-device btrfs shows in the mount table), is built
on by another block device (``slaves/``: md, LVM, dm-crypt) or has ``holders/``, or
carries a member signature in udev's database (``ID_FS_TYPE`` ``zfs_member``,
``LVM2_member``, ``linux_raid_member``, ...: ZFS opens its vdevs without holders and an
inactive volume group shows none either). When in doubt it is in use: a table that
cannot be read, or a block device whose major:minor cannot be read, makes the controller
unsafe.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass, field

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


_DEV_NUMBER = re.compile(r"^(\d+):(\d+)$")


@dataclass
class DeviceTable:
    """Block devices a host table names: by major:minor and by device basename."""

    numbers: set[str] = field(default_factory=set)  # "259:2"
    names: set[str] = field(default_factory=set)  # "nvme0n1p2", "root", "vg-root"

    def add_source(self, device: str, stat_node: bool = True) -> None:
        """A ``/dev`` path: its basename, a symlink's target, and (``stat_node``: the table
        is this host's and so is the sysfs read) the device node's own major:minor
        (``/dev/dm-1`` for ``/dev/mapper/vg-swap``)."""
        device = device.replace("\\040", " ")
        self.names.add(os.path.basename(device))
        if not stat_node:
            return
        if os.path.islink(device):
            self.names.add(os.path.basename(os.path.realpath(device)))
        try:
            st = os.stat(device)
        except OSError:
            return
        if stat.S_ISBLK(st.st_mode):
            self.numbers.add(f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")

    def has(self, name: str, number: str | None) -> bool:
        return name in self.names or (number is not None and number in self.numbers)


def read_mount_table(mounts_path: str, stat_nodes: bool = True) -> DeviceTable | None:
    """The mounted block devices; None: unreadable.

    ``/proc/self/mountinfo`` (the default) gives each mount's major:minor (field 3), which
    matches the device even when the source reads ``/dev/root`` (a root file system the
    kernel mounted without an initramfs) or a name this host does not resolve. Major 0 is
    an anonymous device (btrfs, overlay, tmpfs, NFS) and names no block device: a btrfs is
    matched by its source and its ``devices/`` (:func:`read_btrfs_members`). The
    ``/proc/mounts`` format is read too, by source name alone.
    """
    try:
        with open(mounts_path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    table = DeviceTable()
    for line in lines:
        fields = line.split()
        if " - " in line and len(fields) > 4 and _DEV_NUMBER.match(fields[2]):
            if not fields[2].startswith("0:"):
                table.numbers.add(fields[2])
            after = line.split(" - ", 1)[1].split()
            source = after[1] if len(after) > 1 else ""
        else:
            source = fields[0] if fields else ""
        if source.startswith("/dev/"):
            table.add_source(source, stat_nodes)
    return table


def read_mounted_devices(mounts_path: str) -> set[str] | None:
    """Device basenames in a mount table (`/dev/nvme0n1p2` -> `nvme0n1p2`); None: unreadable.

    A ``/dev`` path that is a symlink on this host (``/dev/disk/by-uuid/...``) is resolved.
    """
    table = read_mount_table(mounts_path)
    return None if table is None else table.names


def read_swap_table(swaps_path: str, stat_nodes: bool = True) -> DeviceTable | None:
    """Active swap devices (``/proc/swaps``, a header line first); None: unreadable."""
    try:
        with open(swaps_path) as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return None
    table = DeviceTable()
    for line in lines:
        fields = line.split()
        if fields and fields[0].startswith("/dev/"):
            table.add_source(fields[0], stat_nodes)
    return table


def read_swap_devices(swaps_path: str) -> set[str] | None:
    """Device basenames of active swap (``/proc/swaps``, a header line first)."""
    table = read_swap_table(swaps_path)
    return None if table is None else table.names


def _block_number(block_dir: str) -> str | None:
    dev = sysfs.read_attr(os.path.join(block_dir, "dev"))
    return dev if dev and _DEV_NUMBER.match(dev) else None


def read_btrfs_members(sysfs_root: str) -> dict[str, str]:
    """Every member of every mounted btrfs (``<sysfs>/fs/btrfs/<fsid>/devices/<dev>``, one
    link per member: only one of a RAID1's members shows in the mount table), by name and
    by major:minor -> fsid."""
    base = os.path.join(sysfs_root, "fs", "btrfs")
    members: dict[str, str] = {}
    for fsid in sysfs.list_dir(base):
        devices = os.path.join(base, fsid, "devices")
        for name in sysfs.list_dir(devices):
            members[name] = fsid
            number = _block_number(os.path.realpath(os.path.join(devices, name)))
            if number:
                members[number] = fsid
    return members


def read_stacked_members(sysfs_root: str) -> dict[str, str]:
    """Block devices another block device is built on (``<sysfs>/block/<dev>/slaves/``:
    md arrays, LVM and dm-crypt's dm devices), member name -> the device built on it. The
    member's own ``holders/`` says the same; either is enough."""
    base = os.path.join(sysfs_root, "block")
    members: dict[str, str] = {}
    for upper in sysfs.list_dir(base):
        for name in sysfs.list_dir(os.path.join(base, upper, "slaves")):
            members[name] = upper
    return members


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

    mounted: DeviceTable | None
    swaps: DeviceTable | None
    udev_data_dir: str
    btrfs: dict[str, str] = field(default_factory=dict)
    stacked: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, mounts_path: str, swaps_path: str, udev_data_dir: str,
             sysfs_root: str = "/sys") -> "HostUsage":
        # This host's /dev nodes describe its own /sys only, not a fixture tree's.
        host = os.path.realpath(sysfs_root) == "/sys"
        return cls(read_mount_table(mounts_path, host), read_swap_table(swaps_path, host),
                   udev_data_dir, read_btrfs_members(sysfs_root),
                   read_stacked_members(sysfs_root))

    def why_in_use(self, name: str, block_dir: str) -> str | None:
        """Why the host uses (or may use) a block device; when in doubt, it does."""
        if self.mounted is None:
            return "the mount table is unreadable"
        if self.swaps is None:
            return "the swap table is unreadable"
        number = _block_number(block_dir)
        if name in self.mounted.names:
            return f"{name} is mounted"
        if number in self.mounted.numbers:
            return f"{name} is mounted (by major:minor {number})"
        if self.swaps.has(name, number):
            return f"{name} is active swap"
        fsid = self.btrfs.get(name) or (self.btrfs.get(number) if number else None)
        if fsid:
            return f"{name} is a member of the mounted btrfs {fsid}"
        if name in self.stacked:
            return f"{name} is a member of {self.stacked[name]}"
        holders = sysfs.list_dir(os.path.join(block_dir, "holders"))
        if holders:
            return f"{name} is held by {', '.join(holders)}"
        fs_type = udev_fs_type(self.udev_data_dir, block_dir)
        if fs_type and fs_type.endswith(_MEMBER_SUFFIX):
            return f"{name} is a {fs_type}"
        if number is None:
            return f"{name} has no readable major:minor (cannot tell whether it is mounted)"
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
