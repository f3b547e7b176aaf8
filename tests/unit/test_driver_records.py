"""All hardware drivers together: names match entry points, records pass the schema,
no device is claimed twice, and each runs on this machine's real sysfs without failing."""

from __future__ import annotations

import pytest

from acceld.drivers import loader, record_schema
from acceld.drivers.base import DEVICE_TYPES
from tests.conftest import make_conf
from tests.support.sysfs_fixtures import SysfsTree, node_overrides, populate_node

HARDWARE_DRIVERS = ["nvidia_gpu", "intel_fpga", "xilinx_fpga", "intel_qat", "nvme", "nic",
                    "ascend"]
EXPECTED = {  # driver -> (device type, resource classes on the populated node)
    "nvidia_gpu": ("GPU", {"PGPU", "VGPU"}),
    "intel_fpga": ("FPGA", {"FPGA"}),
    "xilinx_fpga": ("FPGA", {"FPGA"}),
    "intel_qat": ("QAT", {"CUSTOM_QAT"}),
    "nvme": ("SSD", {"CUSTOM_SSD"}),
    "nic": ("NIC", {"CUSTOM_NIC"}),
    "ascend": ("AICHIP", {"CUSTOM_ASCEND"}),
}


@pytest.fixture
def node(tmp_path):
    tree = populate_node(SysfsTree(tmp_path / "sys"))
    return make_conf(str(tmp_path), **node_overrides(tree, tmp_path))


@pytest.mark.parametrize("name", HARDWARE_DRIVERS)
def test_entry_point_name_matches_the_driver(name):
    cls = loader.driver_class(name)
    assert cls.name == name
    assert cls.hardware_type in DEVICE_TYPES


@pytest.mark.parametrize("name", HARDWARE_DRIVERS)
def test_records_pass_the_hardware_record_schema(node, name):
    records = loader.load(name, node, "node1").discover()
    assert records, f"{name} found nothing on the populated node"
    checked = record_schema.check_node([r.to_dict() for r in records])
    assert checked.problems == []
    device_type, rcs = EXPECTED[name]
    assert {r.type for r in records} == {device_type}
    assert {r.driver_name for r in records} == {name}
    assert {d.attributes["rc"] for r in records for d in r.deployables} == rcs


def test_no_device_is_claimed_by_two_drivers(node):
    claimed: dict[str, str] = {}
    for name in HARDWARE_DRIVERS:
        for record in loader.load(name, node, "node1").discover():
            key = record_schema.identity(record.controlpath_id)
            assert key not in claimed, f"{name} and {claimed.get(key)} both claim {key}"
            claimed[key] = name
    # And the whole node's report (every driver at once) passes as one.
    everything = [r.to_dict() for n in HARDWARE_DRIVERS
                  for r in loader.load(n, node, "node1").discover()]
    assert record_schema.check_node(everything).problems == []


@pytest.mark.parametrize("name", HARDWARE_DRIVERS)
def test_real_sysfs_of_this_machine(tmp_path, name):
    """Defaults (/sys, NVML if installed) on a real kernel: whatever is there, no failure."""
    conf = make_conf(str(tmp_path))
    records = loader.load(name, conf, "node1").discover()
    assert record_schema.check_node([r.to_dict() for r in records]).problems == []
