"""nvme: a host's own disks are never offered, as real hosts show them (issue 27 item 2).

The mount table is ``/proc/self/mountinfo``: ``<id> <parent> <major:minor> <root> <mount
point> <options> [optional...] - <fstype> <source> <super options>``. A root file system
the kernel mounted without an initramfs reads ``/dev/root`` as its source; only its
major:minor names the disk. A btrfs shows an anonymous ``0:NN`` and one member as its
source; every member is linked under ``/sys/fs/btrfs/<fsid>/devices/``.
"""

from __future__ import annotations

import os
import stat

from acceld.drivers import nvme_usage
from acceld.drivers.nvme import NvmeDriver
from acceld.drivers.nvme_usage import DeviceTable, read_mount_table
from tests.conftest import make_conf
from tests.support.sysfs_fixtures import SysfsTree

A, B, C = "0000:3c:00.0", "0000:3d:00.0", "0000:3e:00.0"
NO_SWAP = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
PROC = "22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"


def host(tmp_path) -> SysfsTree:
    tree = SysfsTree(tmp_path / "sys")
    for ctrl, address in enumerate((A, B, C)):
        tree.add_pci(address, "0x144d", "0xa80a", "0x010802", driver="nvme")
        tree.add_nvme(address, ctrl, model="SAMSUNG MZQL2960HCJR-00A07", serial=f"S64F{ctrl}")
        tree.add_nvme_partition(ctrl, 1, 1)
    return tree


def ns(tree: SysfsTree, ctrl: int, part: int | None = None):
    path = (tree.root / "class" / "nvme" / f"nvme{ctrl}").resolve() / f"nvme{ctrl}n1"
    return path / f"nvme{ctrl}n1p{part}" if part else path


def offered(tmp_path, tree, mountinfo: str, swaps: str = NO_SWAP) -> list[str]:
    (tmp_path / "mountinfo").write_text(mountinfo)
    (tmp_path / "swaps").write_text(swaps)
    conf = make_conf(str(tmp_path), nvme__sysfs_root=str(tree.root),
                     nvme__mounts_path=str(tmp_path / "mountinfo"),
                     nvme__swaps_path=str(tmp_path / "swaps"),
                     nvme__addresses=[A, B, C], nvme__udev_data_dir=str(tmp_path / "udev"),
                     nvme__nvme_cli_path=str(tmp_path / "no-nvme-cli"))
    return sorted(r.deployables[0].name for r in NvmeDriver(conf, "node1").discover())


def test_the_default_mount_table_is_mountinfo():
    conf = make_conf("/tmp")
    assert conf.nvme.mounts_path == "/proc/self/mountinfo"


def test_a_root_mounted_as_dev_root_is_recognised_by_major_minor(tmp_path):
    tree = host(tmp_path)
    root = tree.block_dev(ns(tree, 1, 1))
    mountinfo = (f"25 1 {root} / / rw,relatime shared:1 - ext4 /dev/root rw\n" + PROC)
    assert offered(tmp_path, tree, mountinfo) == [A, C]
    assert offered(tmp_path, tree, PROC) == [A, B, C]


def test_every_member_of_a_mounted_btrfs_raid1_is_in_use(tmp_path):
    """mkfs.btrfs -m raid1 -d raid1 /dev/nvme0n1p1 /dev/nvme2n1p1; mount /data: the mount
    table names the first member only, with btrfs's anonymous device number."""
    tree = host(tmp_path)
    tree.add_btrfs("5a1c0e4e-6f0b-4b8a-9d0c-2f1e3c4d5e6f", [ns(tree, 0, 1), ns(tree, 2, 1)])
    mountinfo = ("31 1 0:35 / /data rw,relatime shared:15 - btrfs /dev/nvme0n1p1 "
                 "rw,space_cache=v2,subvolid=5,subvol=/\n" + PROC)
    assert offered(tmp_path, tree, mountinfo) == [B]


def test_md_members_are_in_use(tmp_path):
    """mdadm --create /dev/md0 --level=1 /dev/nvme0n1 /dev/nvme1n1; md0 is mounted."""
    tree = host(tmp_path)
    md = tree.add_md("md0", [ns(tree, 0), ns(tree, 1)])
    mountinfo = f"40 1 {tree.block_dev(md)} / /srv rw - xfs /dev/md0 rw\n" + PROC
    assert offered(tmp_path, tree, mountinfo) == [C]


def test_a_stacked_member_counts_even_without_holders(tmp_path):
    tree = host(tmp_path)
    tree.add_md("md1", [ns(tree, 2)])
    (ns(tree, 2) / "holders" / "md1").unlink()  # only slaves/ tells
    assert offered(tmp_path, tree, PROC) == [A, B]


def test_when_the_major_minor_cannot_be_read_the_disk_is_held_back(tmp_path):
    tree = host(tmp_path)
    os.unlink(ns(tree, 2, 1) / "dev")
    assert offered(tmp_path, tree, PROC) == [A, B]


def test_the_proc_mounts_format_still_matches_by_name(tmp_path):
    tree = host(tmp_path)
    assert offered(tmp_path, tree, "/dev/nvme0n1p1 / ext4 rw 0 0\n") == [B, C]


def test_mountinfo_parsing(tmp_path):
    path = tmp_path / "mountinfo"
    path.write_text("25 1 259:2 / / rw,relatime shared:1 - ext4 /dev/root rw\n"
                    "31 1 0:35 / /data rw shared:15 - btrfs /dev/nvme0n1p1 rw\n"
                    "36 25 253:1 / /var rw master:1 opt:2 - xfs /dev/mapper/vg-var rw\n"
                    + PROC)
    table = read_mount_table(str(path))
    assert table.numbers == {"259:2", "253:1"}
    assert {"root", "nvme0n1p1", "vg-var"} <= table.names
    assert read_mount_table(str(tmp_path / "absent")) is None


def test_swap_is_matched_by_its_device_number_too(monkeypatch):
    """/proc/swaps names /dev/dm-1 (a swap LV); on the host the node's rdev is its number."""
    real_stat = os.stat

    def fake_stat(path, *args, **kwargs):
        if path == "/dev/dm-1":
            return os.stat_result((stat.S_IFBLK | 0o660, 0, 0, 1, 0, 0, 0, 0, 0, 0))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(nvme_usage.os, "stat", fake_stat)
    monkeypatch.setattr(nvme_usage.os, "major", lambda rdev: 253)
    monkeypatch.setattr(nvme_usage.os, "minor", lambda rdev: 1)
    table = DeviceTable()
    table.add_source("/dev/dm-1")
    assert table.has("swap-lv", "253:1") and "dm-1" in table.names
