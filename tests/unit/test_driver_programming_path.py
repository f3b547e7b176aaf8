"""The agent's programming route driving the real FPGA drivers (fake vendor tools).

The deployable name and driver name come from the driver's own discovery, so this also checks
that names match between discovery and programming.
"""

from __future__ import annotations

import pytest

from acceld.agent.programming import ProgramFailed, Programming
from acceld.drivers.intel_fpga import IntelFpgaDriver
from acceld.drivers.xilinx_fpga import XilinxFpgaDriver
from tests.conftest import make_conf
from tests.support.fake_tools import calls, make_tool
from tests.support.sysfs_fixtures import SysfsTree, populate_node

IMAGE = "6f1b1c1e-8a55-4f35-a7e4-0c1f3a0c2b9d"


@pytest.fixture
def setup(tmp_path):
    tree = populate_node(SysfsTree(tmp_path / "sys"))
    images = tmp_path / "bitstreams"
    images.mkdir()
    (images / IMAGE).write_bytes(b"GBS image")
    fpgaconf, xbmgmt = tmp_path / "fpgaconf", tmp_path / "xbmgmt"
    conf = make_conf(str(tmp_path), agent__bitstream_dir=str(images),
                     intel_fpga__sysfs_root=str(tree.root),
                     intel_fpga__fpgaconf_path=str(fpgaconf),
                     xilinx_fpga__sysfs_root=str(tree.root),
                     xilinx_fpga__xbmgmt_path=str(xbmgmt))
    drivers = {d.name: d for d in (IntelFpgaDriver(conf, "n1"), XilinxFpgaDriver(conf, "n1"))}
    return Programming(conf, drivers.get), drivers, fpgaconf, xbmgmt, images


def request(driver, kind="bitstream"):
    [record] = driver.discover()
    return {"driver_name": record.driver_name, "deployable_name": record.deployables[0].name,
            "kind": kind, "image_id": IMAGE}


def test_intel_fpga_programs_through_the_agent(setup):
    programming, drivers, fpgaconf, _, images = setup
    make_tool(fpgaconf)
    assert programming.program(request(drivers["intel_fpga"])) == {"image_id": IMAGE,
                                                                   "kind": "bitstream"}
    [argv] = calls(fpgaconf)
    assert argv[:6] == ["--bus", "0x5e", "--device", "0x00", "--function", "0x0"]
    assert argv[6] == str(images / IMAGE)


def test_tool_failure_is_a_502_with_its_stderr(setup):
    programming, drivers, fpgaconf, _, _ = setup
    make_tool(fpgaconf, exit_code=1, stderr="Error: Interface ID mismatch\n")
    with pytest.raises(ProgramFailed) as failed:
        programming.program(request(drivers["intel_fpga"]))
    assert failed.value.status == 502
    assert "Interface ID mismatch" in failed.value.message


def test_missing_tool_is_a_502_naming_it(setup):
    programming, drivers, _, _, _ = setup
    with pytest.raises(ProgramFailed) as failed:
        programming.program(request(drivers["xilinx_fpga"]))
    assert failed.value.status == 502 and "xbmgmt not found" in failed.value.message


def test_unsupported_kind_is_a_400(setup):
    programming, drivers, fpgaconf, _, _ = setup
    make_tool(fpgaconf)
    with pytest.raises(ProgramFailed) as failed:
        programming.program(request(drivers["intel_fpga"], kind="firmware"))
    assert failed.value.status == 400 and calls(fpgaconf) == []


def test_xilinx_firmware_through_the_agent(setup):
    programming, drivers, _, xbmgmt, images = setup
    make_tool(xbmgmt)
    programming.program(request(drivers["xilinx_fpga"], kind="firmware"))
    assert calls(xbmgmt) == [["program", "--device", "0000:3b:00.0", "--base", "--image",
                              str(images / IMAGE), "--force"]]
