"""acceld.privileged: the root operations' narrow forms, in process (as tests and the
all-in-one run them) and through a real privsep daemon started by acceld-privsep-helper (as
an unprivileged agent runs them; needs root to start the daemon)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest
from oslo_config import cfg

from acceld import privileged
from acceld.conf import privsep as privsep_opts
from acceld.drivers import sysfs, tools
from acceld.drivers.base import DriverError
from acceld.privileged import policy as privileged_policy
from tests.conftest import make_conf
from tests.support.fake_tools import calls, make_tool
from tests.support.sysfs_fixtures import SysfsTree

GPU = "0000:06:00.0"


def test_in_process_by_default_and_until_configured(tmp_path: Path) -> None:
    assert all(not c.client_mode for c in privileged.CONTEXTS)
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci(GPU, "0x10de", "0x1eb8", "0x030200")
    attribute = tree.add_mdev_type(GPU, "nvidia-1", "GRID T4-1B", 16) / "create"
    privileged.adopt(make_conf(str(tmp_path), nvidia_gpu__sysfs_root=str(tree.root)),
                     "nvidia_gpu")
    sysfs.write_attr(str(tree.root / "bus" / "pci" / "devices" / GPU / "mdev_supported_types"
                         / "nvidia-1" / "create"), "2d7c3c0a-0000-4000-8000-000000000001")
    assert attribute.read_text() == "2d7c3c0a-0000-4000-8000-000000000001"


def test_only_known_attributes_are_written(tmp_path: Path) -> None:
    other = tmp_path / "driver_override"
    other.write_text("old")
    with pytest.raises(PermissionError, match="not a sysfs attribute acceld writes"):
        sysfs.write_attr(str(other), "vfio-pci")
    # A link named like an attribute does not carry a write elsewhere.
    (tmp_path / "create").symlink_to(other)
    with pytest.raises(PermissionError):
        sysfs.write_attr(str(tmp_path / "create"), "x")
    assert other.read_text() == "old"


def test_only_known_tools_run(tmp_path: Path) -> None:
    shell = make_tool(tmp_path / "sh")
    with pytest.raises(DriverError, match="not a vendor tool acceld runs"):
        tools.run_tool([str(shell), "-c", "id"], 5, "fpgaconf")
    assert calls(shell) == []
    with pytest.raises(DriverError, match="not a vendor tool"):
        tools.run_tool(["fpgaconf", "x.gbs"], 5, "fpgaconf")  # relative: PATH decides


def test_configure_chooses_the_daemon_unless_in_process(tmp_path: Path) -> None:
    try:
        privileged.configure(make_conf(str(tmp_path)))
        assert all(c.client_mode for c in privileged.CONTEXTS)
        privileged.configure(make_conf(str(tmp_path), agent__privileged_calls="in_process"))
        assert all(not c.client_mode for c in privileged.CONTEXTS)
    finally:
        for context in privileged.CONTEXTS:
            context.set_client_mode(False)


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch) -> Iterator[None]:
    """Both contexts through acceld-privsep-helper daemons (the production path, with the
    helper started directly instead of through sudo: the test already runs as root), each
    with its own config file naming the fixture sysfs tree and the fake tool."""
    if os.geteuid() != 0:
        pytest.skip("starting a privsep daemon needs root")
    for name in ("SUDO_UID", "SUDO_GID"):  # root starts it here, not a user through sudo
        monkeypatch.delenv(name, raising=False)
    conf_file = tmp_path / "privsep.conf"
    conf_file.write_text(f"[nvidia_gpu]\nsysfs_root = {tmp_path / 'sys'}\n"
                         f"[intel_fpga]\nfpgaconf_path = {tmp_path / 'fpgaconf'}\n"
                         f"[agent]\nbitstream_dir = {tmp_path / 'images'}\n")
    for context in privileged.CONTEXTS:
        cfg.CONF.set_override("helper_command",
                              f"{sys.executable} -m acceld.cmd.privsep_helper "
                              f"--config-file {conf_file}", group=context.cfg_section)
        context.set_client_mode(True)
    try:
        yield
    finally:
        for context in privileged.CONTEXTS:
            if context.channel is not None:
                context.stop()
            context.set_client_mode(False)
            cfg.CONF.clear_override("helper_command", group=context.cfg_section)


@pytest.mark.slow
def test_through_the_privsep_daemons(tmp_path: Path, daemon: None, monkeypatch) -> None:
    # The daemon reads its own config file; nothing this process adopted reaches it.
    monkeypatch.setattr(privileged_policy, "_adopted", {})
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci(GPU, "0x10de", "0x1eb8", "0x030200")
    tree.add_mdev_type(GPU, "nvidia-1", "GRID T4-1B", 16)
    uuid = "2d7c3c0a-0000-4000-8000-000000000001"
    attribute = tree.add_mdev(GPU, "nvidia-1", uuid) / "remove"
    sysfs.write_attr(str(tree.root / "bus" / "mdev" / "devices" / uuid / "remove"), "1")
    assert attribute.read_text() == "1"
    assert privileged.sysfs.channel is not None  # it went through the daemon
    # The daemon refuses other files, and the refusal comes back as itself.
    with pytest.raises(PermissionError, match="not a sysfs attribute"):
        sysfs.write_attr(str(tree.device_dir(GPU) / "unbind"), GPU)

    tool = make_tool(tmp_path / "fpgaconf", exit_code=1, stderr="Error: bad bitstream\n")
    (tmp_path / "images").mkdir()
    image = tmp_path / "images" / "x.gbs"
    image.write_bytes(b"GBS")
    argv = ["--bus", "0x3b", "--device", "0x00", "--function", "0x0", str(image)]
    with pytest.raises(DriverError, match="fpgaconf failed with exit status 1: Error: bad"):
        tools.run_tool([str(tool), *argv], 30, "fpgaconf")
    assert calls(tool) == [argv]
    assert privileged.tools.channel is not None
    # A tool the daemon's config does not name is refused there.
    (tmp_path / "elsewhere").mkdir()
    other = make_tool(tmp_path / "elsewhere" / "fpgaconf")
    with pytest.raises(DriverError, match="not a vendor tool acceld runs"):
        tools.run_tool([str(other), *argv], 30, "fpgaconf")
    assert calls(other) == []


def test_each_daemon_keeps_only_its_capabilities() -> None:
    from oslo_privsep import capabilities as caps

    assert cfg.CONF.privsep_sysfs.capabilities == [caps.CAP_DAC_OVERRIDE]
    assert cfg.CONF.privsep_tools.capabilities == [caps.CAP_SYS_ADMIN, caps.CAP_DAC_OVERRIDE]
    assert cfg.CONF.privsep_nvml.capabilities == [caps.CAP_SYS_ADMIN]
    # The sample config says the same.
    shown = {group: [o.sample_default for o in opts if o.dest == "capabilities"]
             for group, opts in privsep_opts.list_opts().items()}
    assert shown == {"privsep_sysfs": ["CAP_DAC_OVERRIDE"],
                     "privsep_tools": ["CAP_SYS_ADMIN,CAP_DAC_OVERRIDE"],
                     "privsep_nvml": ["CAP_SYS_ADMIN"]}
