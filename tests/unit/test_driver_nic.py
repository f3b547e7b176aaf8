"""nic: mapped SR-IOV PFs, VFs as handles, physnet traits."""

from __future__ import annotations

import pytest

from acceld.drivers.base import NotSupported, hardware_uuid
from acceld.drivers.nic import NicDriver, parse_mappings
from tests.conftest import make_conf
from tests.support.sysfs_fixtures import SysfsTree

PF = "0000:5e:00.0"
VFS = ["0000:5e:02.0", "0000:5e:02.1"]


def driver(tmp_path, tree: SysfsTree, mappings: list[str], **opts) -> NicDriver:
    overrides = {"nic__sysfs_root": str(tree.root), "nic__physical_device_mappings": mappings}
    overrides.update({f"nic__{k}": v for k, v in opts.items()})
    return NicDriver(make_conf(str(tmp_path), **overrides), "node1")


@pytest.fixture
def tree(tmp_path) -> SysfsTree:
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(PF, "0x8086", "0x1572", "0x020000", driver="i40e", bridge="0000:5d:00.0")
    t.add_netdev(PF, "enp94s0f0")
    t.add_vfs(PF, VFS, "0x154c", driver="iavf", total=64)
    t.add_netdev(VFS[0], "enp94s0f0v0")
    t.add_pci("0000:5e:00.1", "0x8086", "0x1572", "0x020000", driver="i40e",
              bridge="0000:5d:00.0")
    t.add_netdev("0000:5e:00.1", "enp94s0f1")
    t.set_sriov("0000:5e:00.1", total=64)
    t.add_pci("0000:00:03.0", "0x1af4", "0x1041", "0x020000", driver="virtio-pci")
    t.add_netdev("0000:00:03.0", "eth0")
    t.add_pci("0000:3b:00.0", "0x10de", "0x2335", "0x030200", driver="nvidia")
    return t


def test_only_mapped_pfs_are_reported(tmp_path, tree):
    [record] = driver(tmp_path, tree, ["physnet2:enp94s0f0"]).discover()
    assert (record.type, record.vendor, record.model, record.driver_name) == (
        "NIC", "0x8086", "NIC INTEL_X710", "nic")
    assert record.uuid == hardware_uuid("node1", "nic", PF)
    assert record.vendor_board_info == {
        "physical_network": "physnet2", "interface": "enp94s0f0", "sriov_totalvfs": 64,
        "vf_product_id": "0x154c", "netdevs": ["enp94s0f0"]}
    [dep] = record.deployables
    assert dep.name == PF and dep.num_accelerators == 2
    # Upstream's traits (CUSTOM_VF, CUSTOM_<PHYSNET>) and acceld's beside them.
    assert dep.attributes == {"rc": "CUSTOM_NIC", "trait0": "CUSTOM_VF",
                              "trait1": "CUSTOM_PHYSNET2", "trait2": "CUSTOM_PHYSNET_PHYSNET2",
                              "trait3": "CUSTOM_NIC_INTEL_X710", "physical_network": "physnet2"}
    # Handles carry the physical network, as upstream's NIC handles do.
    assert [h.attach_info for h in dep.attach_handles] == [
        {"domain": "0000", "bus": "5e", "device": "02", "function": "0",
         "physical_network": "physnet2"},
        {"domain": "0000", "bus": "5e", "device": "02", "function": "1",
         "physical_network": "physnet2"}]


def test_physnet_and_function_per_device_as_upstream_configures_them(tmp_path, tree):
    tree.add_vfs("0000:5e:00.1", ["0000:5e:0a.0"], "0x154c", driver="vfio-pci", total=64)
    records = driver(tmp_path, tree, ["physnet1:enp94s0f0|enp94s0f1"],
                     function_device_mappings=["GTPv1:enp94s0f1"]).discover()
    by_pf = {r.deployables[0].name: r.deployables[0] for r in records}
    assert [v for k, v in sorted(by_pf[PF].attributes.items()) if k.startswith("trait")] == [
        "CUSTOM_VF", "CUSTOM_PHYSNET1", "CUSTOM_PHYSNET_PHYSNET1", "CUSTOM_NIC_INTEL_X710"]
    second = by_pf["0000:5e:00.1"]
    assert second.attributes["trait1"] == "CUSTOM_GTPV1"
    assert second.attach_handles[0].attach_info["physical_network"] == "physnet1"
    # Different physical networks per PF.
    records = driver(tmp_path, tree, ["physnet1:enp94s0f0", "physnet9:enp94s0f1"]).discover()
    assert {r.deployables[0].name: r.deployables[0].attach_handles[0].attach_info[
        "physical_network"] for r in records} == {PF: "physnet1", "0000:5e:00.1": "physnet9"}


def test_health_from_the_pf_link_and_vf_aer(tmp_path, tree):
    tree.set_link(PF, speed="8.0 GT/s PCIe", max_speed="8.0 GT/s PCIe", width=4, max_width=8)
    [record] = driver(tmp_path, tree, ["physnet2:enp94s0f0"]).discover()
    assert record.health["state"] == "degraded" and "x4" in record.health["reason"]


def test_pf_by_address_without_vfs_needs_setup(tmp_path, tree):
    [record] = driver(tmp_path, tree, ["physnet-3:0000:5e:00.1"],
                      resource_class="CUSTOM_SRIOV_VF").discover()
    assert record.acc_status == "setup_required"
    assert "up to 64" in record.status_reason and record.deployables == []


def test_sriov_vf_device_in_the_new_kernel_format(tmp_path, tree):
    (tree.device_dir(PF) / "sriov_vf_device").write_text("0x154c\n")
    [record] = driver(tmp_path, tree, ["physnet2:enp94s0f0"]).discover()
    assert record.vendor_board_info["vf_product_id"] == "0x154c"


def test_non_sriov_nic_and_bad_mappings(tmp_path, tree):
    records = driver(tmp_path, tree, ["physnet1:eth0", "physnet1:nosuchif",
                                      "physnet1:0000:3b:00.0", "physnet1:0000:5e:02.0"]
                     ).discover()
    # eth0 is virtio without SR-IOV; the GPU is not a NIC; a VF is not a PF; nosuchif is absent.
    assert [(r.controlpath_id["cpid_info"]["bus"], r.acc_status, r.status_reason)
            for r in records] == [("00", "setup_required", "the PF is not SR-IOV capable")]


def test_custom_physnet_trait_is_normalised_and_rc_configurable(tmp_path, tree):
    [record] = driver(tmp_path, tree, ["data-net.1:enp94s0f0"],
                      resource_class="CUSTOM_VF_NIC").discover()
    attrs = record.deployables[0].attributes
    assert attrs["trait2"] == "CUSTOM_PHYSNET_DATA_NET_1" and attrs["rc"] == "CUSTOM_VF_NIC"
    assert attrs["trait1"] == "CUSTOM_DATA_NET_1"


def test_unreadable_vf_is_skipped(tmp_path, tree):
    (tree.device_dir(VFS[1]) / "class").unlink()
    [record] = driver(tmp_path, tree, ["physnet2:enp94s0f0"]).discover()
    assert record.deployables[0].num_accelerators == 1


def test_no_mappings_report_nothing(tmp_path, tree):
    assert driver(tmp_path, tree, []).discover() == []


def test_parse_mappings():
    assert parse_mappings(["physnet2:enp94s0f0", " p:0000:5e:00.1 ", "q:eth2|eth3"]) == [
        ("physnet2", "enp94s0f0"), ("p", "0000:5e:00.1"), ("q", "eth2"), ("q", "eth3")]
    for bad in ("enp94s0f0", ":eth0", "physnet:", "physnet:eth0|"):
        with pytest.raises(ValueError, match="physnet:interface|empty interface"):
            parse_mappings([bad])


def test_programming_is_not_supported(tmp_path, tree):
    with pytest.raises(NotSupported):
        driver(tmp_path, tree, ["physnet2:enp94s0f0"]).program(PF, "/tmp/x")
