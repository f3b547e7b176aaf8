"""intel_fpga: OPAE sysfs discovery (DFL and legacy stacks) and fpgaconf programming."""

from __future__ import annotations

import os

import pytest

from acceld.drivers.base import DriverError, NotSupported, hardware_uuid
from acceld.drivers.intel_fpga import IntelFpgaDriver, guid
from tests.conftest import make_conf
from tests.support.fake_tools import calls, make_tool
from tests.support.sysfs_fixtures import SysfsTree

PF = "0000:5e:00.0"
IFID = "9346116d-a52d-5ca8-b06a-a9a389ef7c8d"
NLB0 = "d8424dc4a4a3c413f89e433683f9040b"


def driver(tmp_path, tree: SysfsTree, **opts) -> IntelFpgaDriver:
    # The images the tests program lie in tmp_path: the bitstream directory, the one
    # place the privileged tool accepts an image from (acceld.privileged.policy).
    overrides = {"intel_fpga__sysfs_root": str(tree.root), "agent__bitstream_dir": str(tmp_path)}
    overrides.update({f"intel_fpga__{k}": v for k, v in opts.items()})
    return IntelFpgaDriver(make_conf(str(tmp_path), **overrides), "node1")


def traits(dep) -> list[str]:
    return [v for k, v in sorted(dep.attributes.items()) if k.startswith("trait")]


@pytest.fixture
def tree(tmp_path) -> SysfsTree:
    """A PAC Arria10 on the upstream DFL driver, plus Intel devices that are not FPGAs."""
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(PF, "0x8086", "0x09c4", "0x120000", driver="dfl-pci", iommu_group=40,
              bridge="0000:5d:00.0")
    t.add_dfl_pf(PF, region=0, fme=0, port=0, bitstream_id="0x2300011001030f",
                 interface_id=IFID.replace("-", ""), afu_id=NLB0)
    t.add_pci("0000:5f:00.0", "0x8086", "0x1572", "0x020000", driver="i40e")  # a NIC
    t.add_pci("0000:00:00.0", "0x8086", "0x0d57", "0x060000")  # host bridge
    t.add_pci("0000:3b:00.0", "0x10ee", "0x5000", "0x120000", driver="xclmgmt")  # Xilinx
    return t


def test_dfl_pf_without_vfs(tmp_path, tree):
    [record] = driver(tmp_path, tree).discover()
    assert (record.type, record.vendor, record.model, record.driver_name) == (
        "FPGA", "0x8086", "Intel FPGA PAC_ARRIA10", "intel_fpga")
    assert record.uuid == hardware_uuid("node1", "intel_fpga", PF)
    assert record.controlpath_id == {"cpid_type": "PCI", "cpid_info": {
        "domain": "0000", "bus": "5e", "device": "00", "function": "0"}}
    assert record.acc_status == "ready"
    assert record.vendor_board_info == {
        "product": "PAC_ARRIA10", "stack": "dfl", "interface_id": IFID.replace("-", ""),
        "fme_bitstream_id": "0x2300011001030f", "ports_num": 1}
    [dep] = record.deployables
    assert dep.name == PF and dep.num_accelerators == 1
    assert dep.attributes["rc"] == "FPGA"
    assert dep.attributes["region_id"] == IFID.replace("-", "")
    assert dep.attributes["function_id"] == NLB0
    assert traits(dep) == [
        "CUSTOM_FPGA_INTEL", "CUSTOM_FPGA_INTEL_PAC_ARRIA10",
        "CUSTOM_FPGA_REGION_INTEL_9346116DA52D5CA8B06AA9A389EF7C8D",
        "CUSTOM_FPGA_FUNCTION_ID_INTEL_D8424DC4A4A3C413F89E433683F9040B"]
    assert [h.attach_info for h in dep.attach_handles] == [
        {"domain": "0000", "bus": "5e", "device": "00", "function": "0"}]


def test_vfs_become_the_deployables(tmp_path, tree):
    vfs = ["0000:5e:00.1", "0000:5e:00.2"]
    tree.add_vfs(PF, vfs, "0x09c5", driver="dfl-pci", total=2)
    # The port moved to the VFs: the PF keeps only the FME.
    port = tree.device_dir(PF) / "fpga_region" / "region0" / "dfl-port.0"
    for f in port.iterdir():
        f.unlink()
    port.rmdir()
    tree.add_dfl_vf(vfs[0], region=2, port=1, afu_id=NLB0)
    tree.add_dfl_vf(vfs[1], region=3, port=2, afu_id=None)  # afu_id EBUSY / unknown
    [record] = driver(tmp_path, tree).discover()
    assert [d.name for d in record.deployables] == vfs
    assert record.deployables[0].attributes["function_id"] == NLB0
    assert "function_id" not in record.deployables[1].attributes
    assert traits(record.deployables[1])[-1].startswith("CUSTOM_FPGA_REGION_INTEL_")


def test_released_port_without_vfs_needs_setup(tmp_path, tree):
    port = tree.device_dir(PF) / "fpga_region" / "region0" / "dfl-port.0"
    for f in port.iterdir():
        f.unlink()
    port.rmdir()
    tree.set_sriov(PF, total=1, numvfs=0)
    [record] = driver(tmp_path, tree).discover()
    assert record.acc_status == "setup_required"
    assert "sriov_numvfs" in record.status_reason
    assert record.deployables == []


def test_legacy_opae_stack(tmp_path):
    t = SysfsTree(tmp_path / "sys")
    t.add_pci("0000:be:00.0", "0x8086", "0x0b30", "0x120000", driver="intel-fpga-pci")
    t.add_intel_fpga_legacy("0000:be:00.0", dev=0, fme=0, port=0, bitstream_id="0x123",
                            interface_id="69528db6eb31577a8c3668f9faa081f6", afu_id=NLB0)
    [record] = driver(tmp_path, t).discover()
    assert record.vendor_board_info["stack"] == "intel-fpga"
    assert record.vendor_board_info["interface_id"] == "69528db6eb31577a8c3668f9faa081f6"
    assert record.deployables[0].attributes["function_id"] == NLB0
    assert traits(record.deployables[0])[1] == "CUSTOM_FPGA_INTEL_PAC_N3000"


def test_unknown_intel_processing_accelerator_needs_an_fme(tmp_path):
    t = SysfsTree(tmp_path / "sys")
    t.add_pci("0000:17:00.0", "0x8086", "0x0b25", "0x120000")  # Intel DSA-like, no FME
    t.add_pci("0000:18:00.0", "0x8086", "0xbcce", "0x120000", subsystem_device="0x1770")
    records = driver(tmp_path, t).discover()
    # Only the OFS card (a known PF id) is reported; with no FME it needs setup.
    assert [r.model for r in records] == ["Intel FPGA N6000"]
    assert records[0].acc_status == "setup_required"
    assert "dfl-pci" in records[0].status_reason


def test_unreadable_ids_are_left_out(tmp_path, tree):
    fme = tree.device_dir(PF) / "fpga_region" / "region0" / "dfl-fme.0"
    compat = next(fme.glob("dfl-fme-region.*/fpga_region/region*/compat_id"))
    compat.write_text("not-a-guid\n")
    (tree.device_dir(PF) / "fpga_region" / "region0" / "dfl-port.0" / "afu_id").unlink()
    [record] = driver(tmp_path, tree).discover()
    assert "interface_id" not in record.vendor_board_info
    assert traits(record.deployables[0]) == ["CUSTOM_FPGA_INTEL", "CUSTOM_FPGA_INTEL_PAC_ARRIA10"]


def test_guid_normalisation():
    assert guid(IFID) == IFID.replace("-", "")
    assert guid(NLB0.upper()) == NLB0
    assert guid("0x" + NLB0) == NLB0
    assert guid("123") is None and guid(None) is None and guid("z" * 32) is None


# --- programming --------------------------------------------------------------------


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "nlb0.gbs"
    path.write_bytes(b"GBS")
    return str(path)


def test_program_runs_fpgaconf_on_the_pf(tmp_path, tree, image):
    tool = make_tool(tmp_path / "fpgaconf")
    driver(tmp_path, tree, fpgaconf_path=str(tool)).program(PF, image)
    assert calls(tool) == [["--bus", "0x5e", "--device", "0x00", "--function", "0x0", image]]


def test_program_of_a_vf_targets_its_pf(tmp_path, tree, image):
    tree.add_vfs(PF, ["0000:5e:00.1"], "0x09c5", total=1)
    tool = make_tool(tmp_path / "fpgaconf")
    driver(tmp_path, tree, fpgaconf_path=str(tool)).program("0000:5e:00.1", image)
    assert calls(tool)[0][:2] == ["--bus", "0x5e"] and calls(tool)[0][5] == "0x0"


def test_program_failure_carries_the_tool_stderr(tmp_path, tree, image):
    tool = make_tool(tmp_path / "fpgaconf", exit_code=1,
                     stderr="Error: Interface ID mismatch between GBS and FPGA\n")
    with pytest.raises(DriverError, match="exit status 1: Error: Interface ID mismatch"):
        driver(tmp_path, tree, fpgaconf_path=str(tool)).program(PF, image)


def test_program_with_a_missing_tool_says_so(tmp_path, tree, image):
    with pytest.raises(DriverError, match=r"fpgaconf not found at .*set its path"):
        driver(tmp_path, tree, fpgaconf_path=str(tmp_path / "absent")).program(PF, image)


def test_program_timeout(tmp_path, tree, image):
    tool = make_tool(tmp_path / "fpgaconf", sleep=5)
    with pytest.raises(DriverError, match="did not finish within 1 s"):
        driver(tmp_path, tree, fpgaconf_path=str(tool), program_timeout=1).program(PF, image)


def test_program_refusals(tmp_path, tree, image):
    tool = make_tool(tmp_path / "fpgaconf")
    drv = driver(tmp_path, tree, fpgaconf_path=str(tool))
    with pytest.raises(NotSupported, match="firmware"):
        drv.program(PF, image, kind="firmware")
    with pytest.raises(DriverError, match="no Intel FPGA deployable '0000:5f:00.0'"):
        drv.program("0000:5f:00.0", image)
    with pytest.raises(DriverError, match="does not exist"):
        drv.program(PF, str(tmp_path / "missing.gbs"))
    assert calls(tool) == []
    os.chmod(tool, 0o644)
    with pytest.raises(DriverError, match="not executable"):
        drv.program(PF, image)


def fme_dir(tree):
    return tree.device_dir(PF) / "fpga_region" / "region0" / "dfl-fme.0"


def port_dir(tree):
    return tree.device_dir(PF) / "fpga_region" / "region0" / "dfl-port.0"


def test_health_from_clear_error_registers_and_aer(tmp_path, tree):
    tree.set_aer(PF)
    tree.set_fpga_errors(fme_dir(tree), catfatal_errors=0, nonfatal_errors=0, pcie0_errors=0,
                         pcie1_errors=0, fme_errors=0, inject_errors=0)
    tree.set_fpga_errors(port_dir(tree), errors=0)
    [record] = driver(tmp_path, tree).discover()
    assert record.health["state"] == "healthy"
    assert record.health["counters"]["fpga_fme_catfatal_errors"] == 0
    assert record.health["counters"]["fpga_dfl-port.0_errors"] == 0
    assert record.health["counters"]["aer_fatal"] == 0


@pytest.mark.parametrize(("register", "where", "state"), [
    ("catfatal_errors", "fme", "unhealthy"),
    ("errors", "port", "unhealthy"),
    ("nonfatal_errors", "fme", "degraded"),
    ("pcie0_errors", "fme", "degraded"),
    ("fme_errors", "fme", "degraded"),
])
def test_non_zero_error_registers(tmp_path, tree, register, where, state):
    feature = fme_dir(tree) if where == "fme" else port_dir(tree)
    tree.set_fpga_errors(feature, **{register: 0x5})
    [record] = driver(tmp_path, tree).discover()
    assert record.health["state"] == state
    assert f"{register} non-zero" in record.health["reason"]
    assert 2 in record.health["counters"].values()  # two bits set


def test_legacy_stack_error_registers(tmp_path):
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(PF, "0x8086", "0x09c4", "0x120000", driver="intel-fpga-pci")
    dev = t.add_intel_fpga_legacy(PF, dev=0, fme=0, port=0, interface_id=IFID.replace("-", ""),
                                  afu_id=NLB0)
    t.set_fpga_errors(dev / "intel-fpga-fme.0", **{"fme-errors/errors": 0, "catfatal_errors": 0})
    [record] = driver(tmp_path, t).discover()
    assert record.health["state"] == "healthy"
    t.set_fpga_errors(dev / "intel-fpga-fme.0", **{"fme-errors/errors": 1})
    [record] = driver(tmp_path, t).discover()
    assert record.health["state"] == "degraded" and "fme-errors/errors" in record.health["reason"]


def test_aer_rise_on_a_vf_makes_the_card_unhealthy(tmp_path, tree):
    vfs = ["0000:5e:00.1"]
    tree.add_vfs(PF, vfs, "0x09c5", driver="dfl-pci", total=1)
    tree.add_dfl_vf(vfs[0], region=2, port=1, afu_id=NLB0)
    tree.set_aer(PF)
    tree.set_aer(vfs[0])
    drv = driver(tmp_path, tree)
    assert drv.discover()[0].health["state"] == "healthy"
    tree.set_aer(vfs[0], fatal=1)
    health = drv.discover()[0].health
    assert health["state"] == "unhealthy" and vfs[0] in health["reason"]


def _give_to_a_vm(tree, address):
    """What libvirt does for a managed hostdev: unbind from dfl-pci, bind vfio-pci. The
    FME/port devices dfl-pci made go away with it."""
    import shutil
    tree.bind(address, "vfio-pci")
    shutil.rmtree(tree.device_dir(address) / "fpga_region", ignore_errors=True)


def test_traits_and_model_survive_a_rebind_to_vfio(tmp_path, tree):
    drv = driver(tmp_path, tree)
    [before] = drv.discover()
    _give_to_a_vm(tree, PF)
    [after] = drv.discover()
    assert after.model == before.model and after.acc_status == "ready"
    assert after.deployables[0].attributes == before.deployables[0].attributes
    assert "CUSTOM_FPGA_FUNCTION_ID_INTEL_D8424DC4A4A3C413F89E433683F9040B" in \
        after.deployables[0].attributes.values()


def test_vf_traits_survive_a_rebind_to_vfio(tmp_path, tree):
    vf = "0000:5e:00.1"
    tree.add_vfs(PF, [vf], "0x09c5", driver="dfl-pci", total=1)
    port = tree.device_dir(PF) / "fpga_region" / "region0" / "dfl-port.0"
    for f in port.iterdir():
        f.unlink()
    port.rmdir()
    tree.add_dfl_vf(vf, region=2, port=1, afu_id=NLB0)
    drv = driver(tmp_path, tree)
    [before] = drv.discover()
    _give_to_a_vm(tree, vf)
    [after] = drv.discover()
    assert after.deployables[0].attributes == before.deployables[0].attributes
    # A function never seen with its port by this agent (a fresh state_path) keeps the
    # traits the PCI ids give.
    [fresh] = driver(tmp_path / "other-state", tree).discover()
    assert fresh.model == before.model
    assert "CUSTOM_FPGA_INTEL_PAC_ARRIA10" in fresh.deployables[0].attributes.values()


# --- issue 27 item 8: the ids last read survive an agent restart ------------------------

FUNCTION_TRAIT = f"CUSTOM_FPGA_FUNCTION_ID_INTEL_{NLB0.upper()}"


def test_function_id_survives_an_agent_restart_while_the_vf_is_in_a_vm(tmp_path, tree):
    """A PAC with SR-IOV: the VF's port carries the AFU; the VF goes to a VM (vfio-pci,
    port files gone), then the agent restarts: a new driver over the same state_path."""
    vf = "0000:5e:00.1"
    tree.add_vfs(PF, [vf], "0x09c5", driver="dfl-pci", total=1)
    port = tree.device_dir(PF) / "fpga_region" / "region0" / "dfl-port.0"
    for f in port.iterdir():
        f.unlink()
    port.rmdir()
    tree.add_dfl_vf(vf, region=2, port=1, afu_id=NLB0)
    [before] = driver(tmp_path, tree).discover()
    assert FUNCTION_TRAIT in before.deployables[0].attributes.values()
    _give_to_a_vm(tree, vf)
    [after_restart] = driver(tmp_path, tree).discover()
    assert after_restart.deployables[0].attributes == before.deployables[0].attributes
    assert (tmp_path / "intel_fpga" / "remembered_ids.json").is_file()


def test_pf_region_and_function_ids_survive_a_restart(tmp_path, tree):
    [before] = driver(tmp_path, tree).discover()
    _give_to_a_vm(tree, PF)
    [after] = driver(tmp_path, tree).discover()
    assert after.deployables[0].attributes == before.deployables[0].attributes
    assert after.vendor_board_info["interface_id"] == IFID.replace("-", "")


def test_another_card_in_the_slot_does_not_inherit_the_ids(tmp_path, tree):
    driver(tmp_path, tree).discover()
    # Swapped for a D5005 while the agent was down, and straight to vfio-pci.
    import shutil
    shutil.rmtree(tree.device_dir(PF))
    tree.add_pci(PF, "0x8086", "0x0b2b", "0x120000", driver="vfio-pci", iommu_group=40,
                 bridge="0000:5d:00.0")
    [record] = driver(tmp_path, tree).discover()
    assert FUNCTION_TRAIT not in record.deployables[0].attributes.values()
    assert "region_id" not in record.deployables[0].attributes


def test_an_unreadable_store_is_an_empty_one(tmp_path, tree, caplog):
    (tmp_path / "intel_fpga").mkdir()
    (tmp_path / "intel_fpga" / "remembered_ids.json").write_text("{not json")
    _give_to_a_vm(tree, PF)
    [record] = driver(tmp_path, tree).discover()
    assert FUNCTION_TRAIT not in record.deployables[0].attributes.values()
    assert "unreadable" in caplog.text
