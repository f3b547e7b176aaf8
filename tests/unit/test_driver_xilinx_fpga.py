"""xilinx_fpga: Alveo management/user pairs and xbmgmt programming."""

from __future__ import annotations

import pytest

from acceld.drivers.base import DriverError, NotSupported, hardware_uuid
from acceld.drivers.xilinx_fpga import XilinxFpgaDriver
from tests.conftest import make_conf
from tests.support.fake_tools import calls, make_tool
from tests.support.sysfs_fixtures import SysfsTree

MGMT, USER = "0000:3b:00.0", "0000:3b:00.1"


def driver(tmp_path, tree: SysfsTree, **opts) -> XilinxFpgaDriver:
    # The images the tests program lie in tmp_path: the bitstream directory, the one
    # place the privileged tool accepts an image from (acceld.privileged.policy).
    overrides = {"xilinx_fpga__sysfs_root": str(tree.root), "agent__bitstream_dir": str(tmp_path)}
    overrides.update({f"xilinx_fpga__{k}": v for k, v in opts.items()})
    return XilinxFpgaDriver(make_conf(str(tmp_path), **overrides), "node1")


@pytest.fixture
def tree(tmp_path) -> SysfsTree:
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(MGMT, "0x10ee", "0x5000", "0x120000", driver="xclmgmt", iommu_group=7)
    t.add_pci(USER, "0x10ee", "0x5001", "0x120000", driver="xocl", iommu_group=7)
    t.add_pci("0000:d8:00.0", "0x10ee", "0x9038", "0x058000")  # Xilinx, not an Alveo accelerator
    t.add_pci("0000:5e:00.0", "0x8086", "0x09c4", "0x120000", driver="dfl-pci")  # Intel FPGA
    return t


def test_card_is_reported_with_the_user_function_as_handle(tmp_path, tree):
    [record] = driver(tmp_path, tree).discover()
    assert (record.type, record.vendor, record.model, record.driver_name) == (
        "FPGA", "0x10ee", "Xilinx Alveo U200", "xilinx_fpga")
    assert record.uuid == hardware_uuid("node1", "xilinx_fpga", MGMT)
    assert record.controlpath_id["cpid_info"]["function"] == "0"
    assert record.vendor_board_info == {"card": "U200", "mgmt_address": MGMT,
                                        "mgmt_driver": "xclmgmt", "user_address": USER,
                                        "user_driver": "xocl"}
    [dep] = record.deployables
    assert dep.name == USER
    # Upstream's traits (CUSTOM_FPGA_XILINX, CUSTOM_FPGA_PRODUCT_ID_<pid> of either function
    # of the card, as upstream names it after whichever lspci lists first), then acceld's.
    assert dep.attributes == {"rc": "FPGA", "trait0": "CUSTOM_FPGA_XILINX",
                              "trait1": "CUSTOM_FPGA_PRODUCT_ID_5000",
                              "trait2": "CUSTOM_FPGA_PRODUCT_ID_5001",
                              "trait3": "CUSTOM_FPGA_XILINX_U200", "mgmt_address": MGMT}
    assert [h.attach_info["function"] for h in dep.attach_handles] == ["1"]


def test_missing_user_function_needs_setup(tmp_path, tree):
    (tree.root / "bus" / "pci" / "devices" / USER).unlink()
    [record] = driver(tmp_path, tree).discover()
    assert record.acc_status == "setup_required"
    assert "xocl" in record.status_reason and record.deployables == []


def test_mismatched_neighbour_is_not_the_user_function(tmp_path, tree):
    (tree.device_dir(USER) / "device").write_text("0x5005\n")  # a U250 user id next to a U200
    [record] = driver(tmp_path, tree).discover()
    assert record.deployables == []


def test_unknown_card_is_recognised_by_its_driver(tmp_path):
    t = SysfsTree(tmp_path / "sys")
    t.add_pci("0000:af:00.0", "0x10ee", "0x5058", "0x120000", driver="xclmgmt")
    t.add_pci("0000:af:00.1", "0x10ee", "0x5059", "0x120000", driver="xocl")
    t.add_pci("0000:b0:00.0", "0x10ee", "0x5070", "0x120000")  # unbound, unknown id
    [record] = driver(tmp_path, t).discover()
    assert record.model == "Xilinx Alveo 5058"
    assert record.deployables[0].name == "0000:af:00.1"


def test_unreadable_class_is_skipped(tmp_path, tree):
    (tree.device_dir(MGMT) / "class").write_text("\n")
    assert driver(tmp_path, tree).discover() == []


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "shell.xsabin"
    path.write_bytes(b"XSABIN")
    return str(path)


def test_program_bitstream_and_firmware(tmp_path, tree, image):
    tool = make_tool(tmp_path / "xbmgmt")
    drv = driver(tmp_path, tree, xbmgmt_path=str(tool))
    drv.program(USER, image)
    drv.program(MGMT, image, kind="firmware")
    assert calls(tool) == [
        ["program", "--device", MGMT, "--shell", image, "--force"],
        ["program", "--device", MGMT, "--base", "--image", image, "--force"]]


def test_program_failure_carries_the_tool_stderr(tmp_path, tree, image):
    tool = make_tool(tmp_path / "xbmgmt", exit_code=2,
                     stderr="ERROR: Shell does not match the platform\n")
    with pytest.raises(DriverError, match="exit status 2: ERROR: Shell does not match"):
        driver(tmp_path, tree, xbmgmt_path=str(tool)).program(USER, image)


def test_program_with_a_missing_tool_says_so(tmp_path, tree, image):
    with pytest.raises(DriverError, match="xbmgmt not found at"):
        driver(tmp_path, tree, xbmgmt_path=str(tmp_path / "nope")).program(USER, image)


def test_program_refusals(tmp_path, tree, image):
    tool = make_tool(tmp_path / "xbmgmt")
    drv = driver(tmp_path, tree, xbmgmt_path=str(tool))
    with pytest.raises(NotSupported):
        drv.program(USER, image, kind="microcode")
    with pytest.raises(DriverError, match="no Xilinx FPGA deployable"):
        drv.program("0000:5e:00.0", image)
    with pytest.raises(DriverError, match="does not exist"):
        drv.program(USER, str(tmp_path / "absent.xsabin"))
    assert calls(tool) == []


def test_health_of_both_functions(tmp_path, tree):
    tree.set_aer(MGMT)
    tree.set_aer(USER)
    drv = driver(tmp_path, tree)
    [record] = [r for r in drv.discover() if r.deployables]
    assert record.health["state"] == "healthy"
    tree.set_aer(USER, nonfatal=1)
    [record] = [r for r in drv.discover() if r.deployables]
    assert record.health["state"] == "degraded" and USER in record.health["reason"]
