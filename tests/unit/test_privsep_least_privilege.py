"""acceld.privileged grants only what acceld needs (issue 25, item 1).

The entry points are called directly, as the privsep daemon calls them for whatever code
runs as the ``acceld`` user. Run in process, they check against the config the drivers
adopted (here: :func:`adopted`, built as the drivers build it); with nothing adopted,
against the config files the process was started with, as in a daemon. Every refusal
is a NotAllowed (or the OSError of a missing file) and leaves the filesystem as it was.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from oslo_config import cfg

from acceld import privileged
from acceld.privileged import policy as privileged_policy
from acceld.privileged import NotAllowed
from tests.conftest import make_conf
from tests.support.fake_tools import calls, make_tool
from tests.support.sysfs_fixtures import SysfsTree

GPU = "0000:06:00.0"
VF = "0000:06:00.4"
MDEV = "2d7c3c0a-0000-4000-8000-000000000001"
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")


@dataclass
class Node:
    tmp: Path
    tree: SysfsTree
    fpgaconf: Path
    xbmgmt: Path
    images: Path
    image: str

    @property
    def sys(self) -> Path:
        return self.tree.root

    def pci(self, address: str) -> Path:
        return self.sys / "bus" / "pci" / "devices" / address

    def fpgaconf_argv(self, image: str | None = None) -> list[str]:
        return [str(self.fpgaconf), "--bus", "0x06", "--device", "0x00", "--function", "0x0",
                image or self.image]


def snapshot(top: Path) -> dict[str, object]:
    """Every entry under ``top``: file contents, link targets, directories."""
    seen: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                seen[path] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                seen[path] = "dir"
            elif stat.S_ISREG(os.lstat(path).st_mode):
                seen[path] = Path(path).read_bytes()
            else:
                seen[path] = stat.S_IFMT(os.lstat(path).st_mode)
    return seen


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    monkeypatch.setattr(privileged_policy, "_adopted", {})
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci(GPU, "0x10de", "0x1eb8", "0x030200")
    tree.add_mdev_type(GPU, "nvidia-223", "GRID T4-2B", 8)
    tree.add_mdev(GPU, "nvidia-223", MDEV)
    tree.add_pci(VF, "0x10de", "0x2335", "0x030200")
    tree.add_nvidia_vfio(VF, {1054: "NVIDIA H200X-1-18C"})
    (tmp_path / "bin").mkdir()
    fpgaconf = make_tool(tmp_path / "bin" / "fpgaconf")
    xbmgmt = make_tool(tmp_path / "bin" / "xbmgmt")
    images = tmp_path / "images"
    images.mkdir()
    (images / "nlb0.gbs").write_bytes(b"GBS")
    conf = make_conf(str(tmp_path), nvidia_gpu__sysfs_root=str(tree.root),
                     intel_fpga__fpgaconf_path=str(fpgaconf),
                     xilinx_fpga__xbmgmt_path=str(xbmgmt),
                     agent__bitstream_dir=str(images))
    for section in ("nvidia_gpu", "intel_fpga", "xilinx_fpga"):
        privileged.adopt(conf, section)
    return Node(tmp_path, tree, fpgaconf, xbmgmt, images, str(images / "nlb0.gbs"))


def refused_tool(node: Node, argv: list[str], match: str | None = None) -> None:
    before = snapshot(node.tmp)
    with pytest.raises(NotAllowed, match=match):
        privileged.run_tool(argv, 10)
    assert calls(node.fpgaconf) == [] and calls(node.xbmgmt) == []
    assert snapshot(node.tmp) == before


def refused_write(node: Node, path: Path | str, value: str,
                  error: type[Exception] | tuple[type[Exception], ...] = NotAllowed) -> None:
    before = snapshot(node.tmp)
    with pytest.raises(error):
        privileged.write_sysfs(str(path), value)
    assert snapshot(node.tmp) == before


# --- tools: what runs ----------------------------------------------------------------

def test_the_configured_tools_run_with_their_drivers_arguments(node: Node) -> None:
    assert privileged.run_tool(node.fpgaconf_argv(), 10) == (0, "", "")
    segment = [str(node.fpgaconf), "--segment", "0x0001", "--bus", "0x5e", "--device", "0x1f",
               "--function", "0x7", node.image]
    assert privileged.run_tool(segment, 10)[0] == 0
    assert calls(node.fpgaconf) == [node.fpgaconf_argv()[1:], segment[1:]]
    shell = [str(node.xbmgmt), "program", "--device", GPU, "--shell", node.image, "--force"]
    base = [str(node.xbmgmt), "program", "--device", GPU, "--base", "--image", node.image,
            "--force"]
    assert privileged.run_tool(shell, 10)[0] == 0 and privileged.run_tool(base, 10)[0] == 0
    assert calls(node.xbmgmt) == [shell[1:], base[1:]]


def test_a_tool_only_runs_at_exactly_its_configured_path(node: Node) -> None:
    (node.tmp / "planted").mkdir()
    planted = make_tool(node.tmp / "planted" / "fpgaconf")
    refused_tool(node, node.fpgaconf_argv()[:0] + [str(planted)] + node.fpgaconf_argv()[1:],
                 "not a vendor tool")
    assert calls(planted) == []
    dotted = str(node.tmp / "bin" / ".." / "bin" / "fpgaconf")
    refused_tool(node, [dotted] + node.fpgaconf_argv()[1:], "is not \\[intel_fpga\\]")
    (node.tmp / "links").mkdir()
    (node.tmp / "links" / "fpgaconf").symlink_to(node.fpgaconf)
    refused_tool(node, [str(node.tmp / "links" / "fpgaconf")] + node.fpgaconf_argv()[1:])
    refused_tool(node, ["fpgaconf"] + node.fpgaconf_argv()[1:], "not a vendor tool")
    refused_tool(node, ["/bin/sh", "-c", "id"], "not a vendor tool")
    refused_tool(node, [], "not a vendor tool")


def test_a_tool_others_could_replace_is_refused(node: Node) -> None:
    os.chmod(node.fpgaconf, 0o775)
    refused_tool(node, node.fpgaconf_argv(), "writable by group or others")
    os.chmod(node.fpgaconf, 0o755)
    os.chmod(node.tmp / "bin", 0o777)  # no sticky bit: anyone may swap the tool
    refused_tool(node, node.fpgaconf_argv(), "bin is writable by group or others")
    os.chmod(node.tmp / "bin", 0o1777)  # sticky: only root may rename root's entry
    assert privileged.run_tool(node.fpgaconf_argv(), 10)[0] == 0


def test_a_configured_link_is_checked_where_it_leads(node: Node) -> None:
    (node.tmp / "open").mkdir(mode=0o777)
    os.chmod(node.tmp / "open", 0o777)
    target = make_tool(node.tmp / "open" / "real-fpgaconf")
    node.fpgaconf.unlink()
    node.fpgaconf.symlink_to(target)
    refused_tool(node, node.fpgaconf_argv(), "open is writable by group or others")


@ROOT_ONLY
def test_a_tool_not_owned_by_root_is_refused(node: Node) -> None:
    os.chown(node.fpgaconf, 4321, 4321)
    refused_tool(node, node.fpgaconf_argv(), "owned by uid 4321")
    os.chown(node.fpgaconf, 0, 0)
    os.chown(node.tmp / "bin", 4321, 4321)
    refused_tool(node, node.fpgaconf_argv(), "owned by uid 4321")


def test_a_relative_configured_tool_is_refused(node: Node) -> None:
    conf = make_conf(str(node.tmp), intel_fpga__fpgaconf_path="fpgaconf")
    privileged.adopt(conf, "intel_fpga")
    refused_tool(node, ["fpgaconf"] + node.fpgaconf_argv()[1:], "not a vendor tool")


@pytest.mark.parametrize("args", [
    ["--bus", "0x06", "--device", "0x00", "--function", "0x0"],  # no image
    ["--bus", "0x06", "--device", "0x00", "--function", "0x0", "--force", "IMAGE"],
    ["--device", "0x00", "--bus", "0x06", "--function", "0x0", "IMAGE"],  # reordered
    ["--bus", "6", "--device", "0x00", "--function", "0x0", "IMAGE"],
    ["--bus", "0x06;id", "--device", "0x00", "--function", "0x0", "IMAGE"],
    ["--bus", "0x06", "--device", "0x20", "--function", "0x0", "IMAGE"],  # device is 5 bits
    ["--bus", "0x06", "--device", "0x00", "--function", "0x8", "IMAGE"],
    ["--bus", "0x06\n", "--device", "0x00", "--function", "0x0", "IMAGE"],
    ["--segment", "0x1", "--bus", "0x06", "--device", "0x00", "--function", "0x0", "IMAGE"],
    ["-B", "0x06", "IMAGE"],
])
def test_fpgaconf_arguments_other_than_the_drivers_are_refused(node: Node, args) -> None:
    refused_tool(node, [str(node.fpgaconf)] + [node.image if a == "IMAGE" else a for a in args],
                 "not the fpgaconf arguments")


@pytest.mark.parametrize("args", [
    ["program", "--device", "0000:06:00.0\n", "--shell", "IMAGE", "--force"],
    ["program", "--device", "06:00.0", "--shell", "IMAGE", "--force"],
    ["program", "--device", "0000:06:00.A", "--shell", "IMAGE", "--force"],
    ["program", "--device", "0000:06:00.0", "--shell", "IMAGE"],
    ["program", "--device", "0000:06:00.0", "--shell", "IMAGE", "--force", "--yes"],
    ["examine", "--device", "0000:06:00.0", "--shell", "IMAGE", "--force"],
    ["program", "--device", "0000:06:00.0", "--image", "IMAGE", "--base", "--force"],
    ["program", "--device", "0000:06:00.0", "--base", "--shell", "IMAGE", "--force"],
])
def test_xbmgmt_arguments_other_than_the_drivers_are_refused(node: Node, args) -> None:
    refused_tool(node, [str(node.xbmgmt)] + [node.image if a == "IMAGE" else a for a in args],
                 "not the xbmgmt arguments")


def test_images_only_from_the_image_directories(node: Node) -> None:
    outside = node.tmp / "secret"
    outside.write_bytes(b"root's")
    refused_tool(node, node.fpgaconf_argv("/etc/passwd"), "neither under")
    refused_tool(node, node.fpgaconf_argv(str(node.images / ".." / "secret")), "neither under")
    (node.images / "escape.gbs").symlink_to(outside)
    refused_tool(node, node.fpgaconf_argv(str(node.images / "escape.gbs")), "neither under")
    refused_tool(node, node.fpgaconf_argv("images/nlb0.gbs"), "must be absolute")
    refused_tool(node, node.fpgaconf_argv(str(node.images / "missing.gbs")),
                 "No such file")
    (node.images / "adir").mkdir()
    refused_tool(node, node.fpgaconf_argv(str(node.images / "adir")), "not a regular file")
    os.mkfifo(node.images / "fifo")
    refused_tool(node, node.fpgaconf_argv(str(node.images / "fifo")), "not a regular file")
    refused_tool(node, node.fpgaconf_argv(str(node.images)), "neither under")


@ROOT_ONLY
def test_an_image_another_user_could_swap_is_refused(node: Node) -> None:
    """Under [agent] bitstream_dir the tool opens the image after the check: a directory
    on its path, or the file, that the ``acceld`` user owns or others may write would
    let that user put a link to root's files in its place in between."""
    (node.images / "sub").mkdir()
    (node.images / "sub" / "x.gbs").write_bytes(b"GBS")
    os.chown(node.images / "sub", 65534, 65534)
    refused_tool(node, node.fpgaconf_argv(str(node.images / "sub" / "x.gbs")),
                 "sub is owned by uid 65534, not root")
    os.chown(node.images / "sub", 0, 0)
    (node.images / "sub").chmod(0o777)
    refused_tool(node, node.fpgaconf_argv(str(node.images / "sub" / "x.gbs")),
                 "writable by group or others")
    (node.images / "sub").chmod(0o755)
    os.chown(node.images / "sub" / "x.gbs", 65534, 65534)
    refused_tool(node, node.fpgaconf_argv(str(node.images / "sub" / "x.gbs")),
                 "x.gbs is owned by uid 65534")
    os.chown(node.images / "sub" / "x.gbs", 0, 0)
    assert privileged.run_tool(node.fpgaconf_argv(str(node.images / "sub" / "x.gbs")),
                               10)[0] == 0


def test_glance_downloads_are_accepted_only_as_the_image_source_writes_them(
        node: Node) -> None:
    """acceld.agent.images writes a Glance image to mkstemp(prefix='acceld-<id>-')."""
    image_id = "6f1b1c1e-8a55-4f35-a7e4-0c1f3a0c2b9d"
    fd, download = tempfile.mkstemp(prefix=f"acceld-{image_id}-")
    os.close(fd)
    try:
        assert privileged.run_tool(node.fpgaconf_argv(download), 10)[0] == 0
        # The tool got a private copy of what was checked (the caller could replace the
        # download itself before the tool opens it), under the download's name; gone after.
        copy = calls(node.fpgaconf)[-1][-1]
        assert os.path.basename(copy) == os.path.basename(download) and copy != download
        assert os.path.dirname(os.path.dirname(copy)) == tempfile.gettempdir()
        assert os.path.basename(os.path.dirname(copy)).startswith("acceld-image-")
        assert not os.path.exists(os.path.dirname(copy))
        # A hard link of another file, named as a download, is not one.
        hardlinked = f"{download}x"
        os.link(node.image, hardlinked)
        try:
            with pytest.raises(NotAllowed, match="other links"):
                privileged.run_tool(node.fpgaconf_argv(hardlinked), 10)
        finally:
            os.unlink(hardlinked)
    finally:
        os.unlink(download)
    fpgaconf_calls = calls(node.fpgaconf)
    # Any other file of the temporary directory, or one named like a download elsewhere.
    (node.tmp / "secret").write_bytes(b"root's")
    (node.tmp / f"acceld-{image_id}-abc123").write_bytes(b"GBS")
    for other in (node.tmp / "secret", node.tmp / f"acceld-{image_id}-abc123"):
        with pytest.raises(NotAllowed, match="neither under"):
            privileged.run_tool(node.fpgaconf_argv(str(other)), 10)
    assert calls(node.fpgaconf) == fpgaconf_calls


def test_the_tool_is_given_the_resolved_image(node: Node) -> None:
    (node.images / "alias.gbs").symlink_to(node.images / "nlb0.gbs")
    privileged.run_tool(node.fpgaconf_argv(str(node.images / "alias.gbs")), 10)
    assert calls(node.fpgaconf)[0][-1] == os.path.realpath(node.image)


def test_a_download_is_copied_as_checked_and_never_through_a_link(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the tool reads is the download's content at the check; a download that is a
    link, a FIFO or has another name by then is refused, and nothing is left behind."""
    image_id = "6f1b1c1e-8a55-4f35-a7e4-0c1f3a0c2b9d"
    policy = privileged_policy.current()
    fd, download = tempfile.mkstemp(prefix=f"acceld-{image_id}-")
    os.write(fd, b"GBS")
    os.close(fd)
    copies = node.tmp / "copies"  # where the copies go from here on (mkdtemp's directory)
    copies.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(copies))
    try:
        argv = privileged_policy.check_tool(policy, node.fpgaconf_argv(download))
        with privileged_policy.pinned_downloads(policy, argv) as pinned:
            os.unlink(download)
            os.symlink(node.tmp / "secret", download)  # too late: the copy is made
            assert Path(pinned[-1]).read_bytes() == b"GBS"
            assert stat.S_IMODE(os.stat(os.path.dirname(pinned[-1])).st_mode) == 0o700
        assert os.path.dirname(os.path.dirname(pinned[-1])) == str(copies)
        assert not os.path.exists(os.path.dirname(pinned[-1]))
        with pytest.raises(OSError):  # a link in its place when the copy is made
            with privileged_policy.pinned_downloads(policy, argv):
                pass
        os.unlink(download)
        os.mkfifo(download)
        with pytest.raises(NotAllowed, match="changed after it was checked"):
            with privileged_policy.pinned_downloads(policy, argv):
                pass
        assert list(copies.iterdir()) == []
    finally:
        os.unlink(download)


@pytest.mark.parametrize("timeout", [0, -1, "10", None, True])
def test_an_odd_timeout_is_refused(node: Node, timeout) -> None:
    before = snapshot(node.tmp)
    with pytest.raises(NotAllowed, match="timeout"):
        privileged.run_tool(node.fpgaconf_argv(), timeout)
    assert calls(node.fpgaconf) == [] and snapshot(node.tmp) == before


# --- sysfs: what is written ----------------------------------------------------------

def test_the_drivers_writes_succeed_under_the_sysfs_root(node: Node) -> None:
    uuid = "5d0a2b44-0000-4000-8000-0000000000aa"
    create = node.pci(GPU) / "mdev_supported_types" / "nvidia-223" / "create"
    privileged.write_sysfs(str(create), uuid)
    assert create.read_text() == uuid
    remove = node.sys / "bus" / "mdev" / "devices" / MDEV / "remove"
    privileged.write_sysfs(str(remove), "1")
    assert remove.read_text() == "1"
    vgpu = node.pci(VF) / "nvidia" / "current_vgpu_type"
    privileged.write_sysfs(str(vgpu), "1054")
    assert vgpu.read_text() == "1054"
    privileged.write_sysfs(str(vgpu), "0")
    assert vgpu.read_text() == "0"


@pytest.mark.parametrize("vendor,class_code", [
    ("0x8086", "0x030000"),  # another vendor's GPU (Intel GVT-g), its mdevs a VM may use
    ("0x10de", "0x068000"),  # an NVIDIA function that is no GPU (an NVSwitch bridge)
])
def test_only_nvidia_gpus_mdevs_and_vgpu_types_are_written(node: Node, vendor: str,
                                                          class_code: str) -> None:
    """acceld's one sysfs writer is the nvidia_gpu driver: creating or removing another
    device's mediated devices (another service's, a running VM's) or setting its vGPU type
    is nothing acceld needs, whatever the attributes' names and places."""
    other, other_mdev = "0000:0a:00.0", "7e0b9c1d-0000-4000-8000-000000000002"
    node.tree.add_pci(other, vendor, "0x3e92", class_code)
    node.tree.add_mdev_type(other, "i915-GVTg_V5_4", None, 4)
    node.tree.add_mdev(other, "i915-GVTg_V5_4", other_mdev)
    node.tree.add_nvidia_vfio(other, {1054: "NVIDIA H200X-1-18C"})
    refused_write(node, node.pci(other) / "mdev_supported_types" / "i915-GVTg_V5_4" /
                  "create", "5d0a2b44-0000-4000-8000-0000000000aa")
    refused_write(node, node.sys / "bus" / "mdev" / "devices" / other_mdev / "remove", "1")
    refused_write(node, node.pci(other) / "nvidia" / "current_vgpu_type", "1054")


def test_other_attributes_are_refused(node: Node) -> None:
    for name, value in [("unbind", GPU), ("driver_override", "vfio-pci"),
                        ("sriov_numvfs", "4"), ("remove", "1")]:  # the PCI device's remove
        (node.tree.device_dir(GPU) / name).write_text("")
        refused_write(node, node.pci(GPU) / name, value)


def test_writes_outside_the_sysfs_root_are_refused(node: Node) -> None:
    fake = node.tmp / "fake" / "devices" / GPU / "mdev_supported_types" / "nvidia-223"
    fake.mkdir(parents=True)
    (fake / "create").write_text("")
    refused_write(node, fake / "create", MDEV)
    dotted = node.sys / "devices" / ".." / ".." / "fake" / "devices" / GPU
    refused_write(node, dotted / "mdev_supported_types" / "nvidia-223" / "create", MDEV)
    # A link in the tree, named and placed like an attribute, leading outside it.
    other = node.tree.device_dir(GPU) / "mdev_supported_types" / "nvidia-9"
    other.mkdir()
    (other / "create").symlink_to(fake / "create")
    refused_write(node, other / "create", MDEV)
    refused_write(node, "/etc/create", MDEV)
    refused_write(node, "sys/devices/create", MDEV)
    assert (fake / "create").read_text() == ""


def test_attributes_out_of_place_are_refused(node: Node) -> None:
    # The names, but not where the kernel puts them.
    loose = node.sys / "devices" / "create"
    loose.write_text("")
    refused_write(node, loose, MDEV)
    stray = node.tree.device_dir(GPU) / "nvidia"
    stray.mkdir()
    (stray / "remove").write_text("")
    refused_write(node, stray / "remove", "1")
    vgpu = node.tree.device_dir(GPU) / "current_vgpu_type"
    vgpu.write_text("0")
    refused_write(node, vgpu, "1054")


def test_missing_attributes_are_not_created(node: Node) -> None:
    empty = node.tree.device_dir(GPU) / "mdev_supported_types" / "nvidia-224"
    empty.mkdir()
    refused_write(node, node.pci(GPU) / "mdev_supported_types" / "nvidia-224" / "create",
                  MDEV, FileNotFoundError)
    assert not (empty / "create").exists()
    gone = "6e1b2c55-0000-4000-8000-000000000002"
    refused_write(node, node.sys / "bus" / "mdev" / "devices" / gone / "remove", "1")


def test_attributes_that_are_no_files_are_refused(node: Node) -> None:
    types = node.tree.device_dir(GPU) / "mdev_supported_types"
    (types / "nvidia-230").mkdir()
    os.mkfifo(types / "nvidia-230" / "create")
    refused_write(node, types / "nvidia-230" / "create", MDEV, (NotAllowed, OSError))
    (types / "nvidia-231" / "create").mkdir(parents=True)
    refused_write(node, types / "nvidia-231" / "create", MDEV, (NotAllowed, OSError))


@pytest.mark.parametrize("attribute, value", [
    ("create", "not-a-uuid"), ("create", MDEV + "\n"), ("create", ""),
    ("create", MDEV + " " + MDEV), ("remove", "0"), ("remove", "1\n"), ("remove", "yes"),
    ("current_vgpu_type", "-1"), ("current_vgpu_type", "0x10"), ("current_vgpu_type", " 5"),
    ("current_vgpu_type", "01"), ("current_vgpu_type", "12345678901"),
])
def test_odd_values_are_refused(node: Node, attribute: str, value: str) -> None:
    path = {"create": node.pci(GPU) / "mdev_supported_types" / "nvidia-223" / "create",
            "remove": node.sys / "bus" / "mdev" / "devices" / MDEV / "remove",
            "current_vgpu_type": node.pci(VF) / "nvidia" / "current_vgpu_type"}[attribute]
    refused_write(node, path, value)


# --- the daemon's own config -----------------------------------------------------------

def _config(path: Path, node: Node, fpgaconf: Path) -> Path:
    path.write_text(f"[intel_fpga]\nfpgaconf_path = {fpgaconf}\n"
                    f"[nvidia_gpu]\nsysfs_root = {node.sys}\n"
                    f"[agent]\nbitstream_dir = {node.images}\n")
    os.chmod(path, 0o644)
    return path


def _started_with(monkeypatch: pytest.MonkeyPatch, *files: Path) -> None:
    """The process's global config as privsep-helper leaves it: parsed from --config-file."""
    conf = cfg.ConfigOpts()
    conf([arg for f in files for arg in ("--config-file", str(f))], project="privsep")
    monkeypatch.setattr(privileged_policy.cfg, "CONF", conf)


def test_with_nothing_adopted_the_daemons_config_files_decide(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(privileged_policy, "_adopted", {})
    # The caller's environment is not the daemon's config.
    (node.tmp / "planted").mkdir()
    planted = make_tool(node.tmp / "planted" / "fpgaconf")
    monkeypatch.setenv("OS_INTEL_FPGA__FPGACONF_PATH", str(planted))
    _started_with(monkeypatch, _config(node.tmp / "acceld.conf", node, node.fpgaconf))
    assert privileged.run_tool(node.fpgaconf_argv(), 10)[0] == 0
    planted_argv = [str(planted)] + node.fpgaconf_argv()[1:]
    with pytest.raises(NotAllowed, match="not a vendor tool"):
        privileged.run_tool(planted_argv, 10)
    assert calls(planted) == []
    privileged.write_sysfs(str(node.pci(VF) / "nvidia" / "current_vgpu_type"), "1054")


def test_without_config_files_the_daemon_writes_only_under_sys(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(privileged_policy, "_adopted", {})
    _started_with(monkeypatch)
    assert privileged_policy.current().sysfs_roots == ("/sys",)
    refused_write(node, node.pci(VF) / "nvidia" / "current_vgpu_type", "1054")
    refused_tool(node, node.fpgaconf_argv(), "not a vendor tool")


def test_a_config_file_the_caller_could_write_is_refused(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(privileged_policy, "_adopted", {})
    good = _config(node.tmp / "acceld.conf", node, node.fpgaconf)
    appended = _config(node.tmp / "caller.conf", node, node.fpgaconf)
    os.chmod(appended, 0o666)  # as a --config-file appended through the sudoers '*'
    _started_with(monkeypatch, good, appended)
    refused_tool(node, node.fpgaconf_argv(), "privsep config file .* writable by group")
    refused_write(node, node.pci(VF) / "nvidia" / "current_vgpu_type", "1054")
    (node.tmp / "open").mkdir()
    os.chmod(node.tmp / "open", 0o777)
    in_open_dir = _config(node.tmp / "open" / "acceld.conf", node, node.fpgaconf)
    _started_with(monkeypatch, in_open_dir)
    refused_tool(node, node.fpgaconf_argv(), "open is writable by group or others")


@ROOT_ONLY
def test_a_config_file_not_owned_by_root_is_refused(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(privileged_policy, "_adopted", {})
    theirs = _config(node.tmp / "acceld.conf", node, node.fpgaconf)
    os.chown(theirs, 4321, 4321)
    _started_with(monkeypatch, theirs)
    refused_tool(node, node.fpgaconf_argv(), "owned by uid 4321")


def test_a_config_directory_is_checked_file_by_file(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(privileged_policy, "_adopted", {})
    conf_d = node.tmp / "acceld.conf.d"
    conf_d.mkdir()
    _config(conf_d / "10-node.conf", node, node.fpgaconf)
    assert privileged_policy.daemon_policy([], [str(conf_d)]).tools["fpgaconf"] == str(
        node.fpgaconf)
    os.chmod(conf_d / "10-node.conf", 0o646)
    with pytest.raises(NotAllowed, match="10-node.conf is writable"):
        privileged_policy.daemon_policy([], [str(conf_d)])
