"""The generic PCI driver on fixture sysfs trees, and once on this machine's real sysfs."""

import json
import os

import pytest

from acceld.drivers.base import DriverError
from acceld.drivers.pci import PciDriver, device_type, parse_spec, scan
from acceld.drivers.record_schema import check_node
from tests.conftest import make_conf
from tests.support.sysfs_fixtures import SysfsTree

ALL_CLASSES = ["0x0300", "0x0302", "0x0380", "0x1200", "0x0b40", "0x0108", "0x0200"]

# A mixed node: accelerators, and what a naive "vendor = NVIDIA" or "all devices" rule would
# wrongly report.
NODE = [
    ("0000:17:00.0", "0x10de", "0x2335", "0x030200"),  # H200: 3D controller
    ("0000:17:00.1", "0x10de", "0x22e8", "0x040300"),  # HDA audio function of a GPU
    ("0000:18:00.0", "0x10de", "0x22a3", "0x068000"),  # NVSwitch: bridge
    ("0000:02:00.0", "0x1a03", "0x2000", "0x030000"),  # ASPEED BMC VGA
    ("0000:6b:00.0", "0x8086", "0x4940", "0x0b4000"),  # QAT 4xxx: co-processor
    ("0000:3b:00.0", "0x10ee", "0x5000", "0x120000"),  # Alveo U200
    ("0000:81:00.0", "0x19e5", "0xd100", "0x120000"),  # Ascend 310
    ("0000:00:03.0", "0x1af4", "0x1041", "0x020000"),  # virtio NIC
    ("0000:5e:00.0", "0x144d", "0xa808", "0x010802"),  # Samsung NVMe
    ("0000:00:00.0", "0x8086", "0x0d57", "0x060000"),  # host bridge
]


def make_tree(tmp_path, functions=NODE) -> SysfsTree:
    tree = SysfsTree(tmp_path / "sys")
    for address, vendor, device, cls in functions:
        tree.add_pci(address, vendor, device, cls, driver="vfio-pci")
    return tree


def driver(tmp_path, tree, specs=None, classes=None, host="node1", **overrides):
    conf = make_conf(str(tmp_path), pci_driver__sysfs_root=str(tree.root), **overrides)
    if specs is not None:
        conf.set_override("device_spec", [json.dumps(s) for s in specs], group="pci_driver")
    if classes is not None:
        conf.set_override("device_classes", classes, group="pci_driver")
    return PciDriver(conf, host)


def by_address(records):
    return {r.deployables[0].name: r for r in records}


def test_default_allow_list_reports_only_accelerators(tmp_path):
    records = driver(tmp_path, make_tree(tmp_path)).discover()
    found = {name: r.type for name, r in by_address(records).items()}
    assert found == {"0000:17:00.0": "GPU", "0000:6b:00.0": "QAT", "0000:3b:00.0": "FPGA",
                     "0000:81:00.0": "AICHIP"}
    assert not check_node([r.to_dict() for r in records]).problems


def test_record_shape(tmp_path):
    records = driver(tmp_path, make_tree(tmp_path)).discover()
    gpu = by_address(records)["0000:17:00.0"]
    assert (gpu.vendor, gpu.model, gpu.driver_name) == ("0x10de", "0x2335", "pci")
    assert gpu.controlpath_id == {"cpid_type": "PCI", "cpid_info": {
        "domain": "0000", "bus": "17", "device": "00", "function": "0"}}
    assert gpu.std_board_info["class"] == "0x030200"
    assert gpu.std_board_info["driver"] == "vfio-pci"
    (dep,) = gpu.deployables
    assert dep.num_accelerators == 1
    # Upstream's traits first (OWNER_CYBORG, CUSTOM_PCI_<VENDOR>, CUSTOM_PCI_PRODUCT_ID_<pid>),
    # then acceld's.
    assert dep.attributes == {"rc": "CUSTOM_PCI", "trait0": "OWNER_CYBORG",
                              "trait1": "CUSTOM_PCI_NVIDIA", "trait2": "CUSTOM_PCI_PRODUCT_ID_2335",
                              "trait3": "CUSTOM_PCI_10DE_2335"}
    # A vendor upstream's map does not name gets no vendor trait.
    fpga = by_address(records)["0000:3b:00.0"].deployables[0].attributes
    assert [v for k, v in sorted(fpga.items()) if k.startswith("trait")] == [
        "OWNER_CYBORG", "CUSTOM_PCI_PRODUCT_ID_5000", "CUSTOM_PCI_10EE_5000"]
    assert [(h.attach_type, h.attach_info) for h in dep.attach_handles] == [
        ("PCI", {"domain": "0000", "bus": "17", "device": "00", "function": "0"})]


def test_class_decides_the_type_never_all_gpu(tmp_path):
    records = driver(tmp_path, make_tree(tmp_path), specs=[{}], classes=ALL_CLASSES).discover()
    found = {name: r.type for name, r in by_address(records).items()}
    assert found == {"0000:17:00.0": "GPU", "0000:02:00.0": "GPU", "0000:6b:00.0": "QAT",
                     "0000:3b:00.0": "FPGA", "0000:81:00.0": "AICHIP", "0000:00:03.0": "NIC",
                     "0000:5e:00.0": "SSD"}


@pytest.mark.parametrize(("class_code", "vendor", "expected"), [
    (0x030000, 0x10DE, "GPU"), (0x030200, 0x1002, "GPU"), (0x120000, 0x10EE, "FPGA"),
    (0x120000, 0x1DA3, "AICHIP"), (0x0B4000, 0x8086, "QAT"), (0x010802, 0x144D, "SSD"),
    (0x020000, 0x15B3, "NIC"), (0x040300, 0x10DE, None), (0x068000, 0x10DE, None),
    (0x060400, 0x8086, None),
])
def test_device_type(class_code, vendor, expected):
    assert device_type(class_code, vendor) == expected


@pytest.mark.parametrize(("product", "expected"), [
    (0x09C4, "FPGA"), (0x09C5, "FPGA"), (0x0B30, "FPGA"), (0xBCCE, "FPGA"),
    (0x7D1D, "AICHIP"),  # Meteor Lake NPU: a processing accelerator, not an FPGA
    (0x643E, "AICHIP"),  # Lunar Lake NPU
])
def test_intel_processing_accelerators_are_fpgas_only_by_id(product, expected):
    assert device_type(0x120000, 0x8086, product) == expected


@pytest.mark.parametrize(("spec", "expected"), [
    ({"vendor_id": "10de"}, {"0000:17:00.0"}),
    ({"vendor_id": "0x10DE", "product_id": "2335"}, {"0000:17:00.0"}),
    ({"vendor_id": "10de", "product_id": "9999"}, set()),
    ({"product_id": "*", "vendor_id": "*"}, {"0000:17:00.0", "0000:6b:00.0", "0000:3b:00.0",
                                             "0000:81:00.0", "0000:02:00.0"}),
    ({"address": "*:3b:00.*"}, {"0000:3b:00.0"}),
    ({"address": ":3b:00."}, {"0000:3b:00.0"}),
    ({"address": "0000:6b:00.0"}, {"0000:6b:00.0"}),
    ({"address": "0000:6b:00.1"}, set()),
    ({"address": "0000:17:"}, {"0000:17:00.0"}),
    ({"address": {"domain": ".*", "bus": "(17|81)", "slot": "00", "function": "0"}},
     {"0000:17:00.0", "0000:81:00.0"}),
    ({"vendor_id": "8086", "address": {"bus": "6"}}, {"0000:6b:00.0"}),
])
def test_allow_list_matching(tmp_path, spec, expected):
    classes = ["0x0300", "0x0302", "0x1200", "0x0b40"]
    records = driver(tmp_path, make_tree(tmp_path), specs=[spec], classes=classes).discover()
    assert set(by_address(records)) == expected


def test_first_matching_entry_gives_resource_class_and_traits(tmp_path):
    specs = [{"vendor_id": "10de", "resource_class": "h200", "traits": "fast, HW_GPU_API_CUDA"},
             {"vendor_id": "*"}]
    records = by_address(driver(tmp_path, make_tree(tmp_path), specs=specs).discover())
    gpu_attrs = records["0000:17:00.0"].deployables[0].attributes
    assert gpu_attrs["rc"] == "CUSTOM_H200"
    assert sorted(v for k, v in gpu_attrs.items() if k.startswith("trait")) == [
        "CUSTOM_FAST", "CUSTOM_PCI_10DE_2335", "CUSTOM_PCI_NVIDIA", "CUSTOM_PCI_PRODUCT_ID_2335",
        "HW_GPU_API_CUDA", "OWNER_CYBORG"]
    assert records["0000:6b:00.0"].deployables[0].attributes["rc"] == "CUSTOM_PCI"


def test_rc_from_config(tmp_path):
    records = driver(tmp_path, make_tree(tmp_path), pci_driver__rc="CUSTOM_ACCEL").discover()
    assert {r.deployables[0].attributes["rc"] for r in records} == {"CUSTOM_ACCEL"}


def test_sriov_vfs_become_handles_of_their_pf(tmp_path):
    tree = make_tree(tmp_path, [("0000:6b:00.0", "0x8086", "0x4940", "0x0b4000")])
    tree.add_vfs("0000:6b:00.0", ["0000:6b:00.1", "0000:6b:00.2"], "0x4941",
                 driver="vfio-pci")
    # Nova's PF expansion: the PF's exact address also covers its VFs (any product id).
    records = driver(tmp_path, tree, specs=[{"address": "0000:6b:00.0"}]).discover()
    (qat,) = records
    dep = qat.deployables[0]
    assert dep.num_accelerators == 2
    assert [h.attach_info["function"] for h in dep.attach_handles] == ["1", "2"]
    assert qat.std_board_info["sriov_numvfs"] == 2
    # The PF's product id does not cover the VFs (a VF has its own): the PF stands alone.
    records = driver(tmp_path, tree, specs=[{"vendor_id": "8086",
                                             "product_id": "4940"}]).discover()
    assert [r.deployables[0].num_accelerators for r in records] == [1]
    # VFs admitted without their PF are devices of their own.
    records = driver(tmp_path, tree, specs=[{"product_id": "4941"}]).discover()
    assert sorted(by_address(records)) == ["0000:6b:00.1", "0000:6b:00.2"]


@pytest.mark.parametrize(("value", "message"), [
    ("{not json", "not JSON"),
    ('{"devname": "eth0"}', "devname"),
    ('{"vendor": "10de"}', "unknown key"),
    ('{"vendor_id": "xyz"}', "not a hex id"),
    ('{"vendor_id": "10000"}', "out of range"),
    ('{"address": "0:0:0:0.0"}', "too many"),
    ('{"address": "0000:00:20.0"}', "exceeds"),
    ('{"address": {"bus": "("}}', "regex"),
    ('{"address": {"socket": "1"}}', "unknown field"),
    ('{"traits": ["A"]}', "comma-separated"),
    ('"just a string"', "JSON object"),
])
def test_bad_allow_list_is_a_clear_error(tmp_path, value, message):
    tree = make_tree(tmp_path)
    conf = make_conf(str(tmp_path), pci_driver__sysfs_root=str(tree.root))
    conf.set_override("device_spec", [value], group="pci_driver")
    with pytest.raises(DriverError, match=message):
        PciDriver(conf, "node1")


def test_bad_class_list_is_a_clear_error(tmp_path):
    with pytest.raises(DriverError, match="device_classes"):
        driver(tmp_path, make_tree(tmp_path), classes=["GPU"])


def test_nova_tags_are_accepted(tmp_path):
    spec = parse_spec({"vendor_id": "8086", "physical_network": None, "trusted": "true"})
    assert spec.vendor == 0x8086


def test_missing_sysfs_is_an_empty_node(tmp_path):
    conf = make_conf(str(tmp_path), pci_driver__sysfs_root=str(tmp_path / "nothing"))
    assert PciDriver(conf, "node1").discover() == []


def test_a_device_removed_from_sysfs_disappears(tmp_path):
    tree = make_tree(tmp_path)
    drv = driver(tmp_path, tree)
    assert "0000:3b:00.0" in by_address(drv.discover())
    os.unlink(tree.root / "bus" / "pci" / "devices" / "0000:3b:00.0")
    assert "0000:3b:00.0" not in by_address(drv.discover())


REAL = "/sys/bus/pci/devices"


@pytest.mark.skipif(not os.path.isdir(REAL), reason="no PCI sysfs on this machine")
def test_real_sysfs(tmp_path):
    """Every function of an accepted class on this machine is reported once, typed by class."""
    accepted = {int(x, 16) for x in ALL_CLASSES}
    expected = {}
    for name in os.listdir(REAL):
        with open(os.path.join(REAL, name, "class")) as handle:
            cls = int(handle.read(), 16)
        with open(os.path.join(REAL, name, "vendor")) as handle:
            vendor = int(handle.read(), 16)
        with open(os.path.join(REAL, name, "device")) as handle:
            product = int(handle.read(), 16)
        kind = device_type(cls, vendor, product)
        if kind is not None and cls >> 8 in accepted:
            expected[name] = kind
    conf = make_conf(str(tmp_path))  # sysfs_root defaults to /sys
    conf.set_override("device_spec", ["{}"], group="pci_driver")
    conf.set_override("device_classes", ALL_CLASSES, group="pci_driver")
    records = PciDriver(conf, "real").discover()
    assert not check_node([r.to_dict() for r in records]).problems
    covered = {}
    for rec in records:
        for handle in rec.deployables[0].attach_handles:
            info = handle.attach_info
            covered[f"{info['domain']}:{info['bus']}:{info['device']}.{info['function']}"] = \
                rec.type
        info = rec.controlpath_id["cpid_info"]
        covered.setdefault(f"{info['domain']}:{info['bus']}:{info['device']}.{info['function']}",
                           rec.type)
    assert covered == expected
    assert len(scan("/sys")) == len(os.listdir(REAL))


# --- IOMMU groups and the boot VGA device ------------------------------------------------

GPU, AUDIO = "0000:17:00.0", "0000:17:00.1"


def gpu_with_audio(tmp_path, audio_driver):
    """A consumer GPU and its HDMI audio function in one IOMMU group (no ACS between the
    functions of one device), behind a root port that is in a group of its own."""
    tree = SysfsTree(tmp_path / "sys")
    tree.add_root_port("0000:16:01.0")
    tree.add_pci(GPU, "0x10de", "0x2684", "0x030000", driver="vfio-pci", iommu_group=27,
                 bridge="0000:16:01.0")
    tree.add_pci(AUDIO, "0x10de", "0x22ba", "0x040300", driver=audio_driver, iommu_group=27,
                 bridge="0000:16:01.0")
    return tree


@pytest.mark.parametrize("audio_driver", ["vfio-pci", None, "pci-stub"])
def test_gpu_offered_when_its_group_can_leave_the_host(tmp_path, audio_driver):
    tree = gpu_with_audio(tmp_path, audio_driver)
    [record] = driver(tmp_path, tree).discover()
    assert (record.deployables[0].name, record.acc_status) == (GPU, "ready")


def test_gpu_not_offered_while_its_audio_function_is_held_by_the_host(tmp_path):
    tree = gpu_with_audio(tmp_path, "snd_hda_intel")
    [record] = driver(tmp_path, tree).discover()
    assert record.acc_status == "setup_required"
    assert record.status_reason == (
        f"IOMMU group 27 of {GPU} also holds {AUDIO} (bound to snd_hda_intel): bind it to "
        "vfio-pci (or unbind) so the group can be given to a VM")


def test_gpu_and_audio_offered_together_pass(tmp_path):
    """A group member offered with the device leaves the host with it."""
    from acceld.drivers.pci_isolation import isolation_problem
    tree = gpu_with_audio(tmp_path, "snd_hda_intel")
    assert isolation_problem(str(tree.root), GPU, offered_with=[AUDIO]) is None
    assert isolation_problem(str(tree.root), GPU) is not None


def test_bridges_in_the_group_do_not_block(tmp_path):
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci("0000:00:1c.0", "0x8086", "0xa110", "0x060400", driver="pcieport",
                 iommu_group=8)
    tree.add_pci("0000:02:00.0", "0x10de", "0x1eb8", "0x030200", driver="nvidia",
                 iommu_group=8, bridge="0000:00:1c.0")
    [record] = driver(tmp_path, tree).discover()
    assert record.acc_status == "ready"


def test_the_boot_vga_device_is_never_offered(tmp_path):
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci(GPU, "0x10de", "0x2684", "0x030000", driver="nvidia", iommu_group=27)
    (tree.device_dir(GPU) / "boot_vga").write_text("1\n")
    tree.add_pci("0000:65:00.0", "0x10de", "0x2684", "0x030000", driver="nvidia",
                 iommu_group=28)
    (tree.device_dir("0000:65:00.0") / "boot_vga").write_text("0\n")
    records = by_address(driver(tmp_path, tree).discover())
    assert records[GPU].acc_status == "setup_required"
    assert "boot VGA" in records[GPU].status_reason
    assert records["0000:65:00.0"].acc_status == "ready"


# --- one driver per device ---------------------------------------------------------------

@pytest.mark.parametrize("order", [["pci", "nvidia_gpu", "intel_qat", "xilinx_fpga", "ascend"],
                                   ["ascend", "xilinx_fpga", "intel_qat", "nvidia_gpu", "pci"]])
def test_specific_drivers_claim_their_devices_whatever_the_order(tmp_path, order):
    tree = make_tree(tmp_path)
    records = driver(tmp_path, tree, agent__enabled_drivers=order).discover()
    # The H200 (nvidia_gpu), QAT (intel_qat), Alveo (xilinx_fpga) and Ascend (ascend) are
    # left to their drivers; the BMC's VGA function is nobody else's.
    assert set(by_address(records)) == set()
    records = driver(tmp_path, tree, specs=[{}], classes=ALL_CLASSES,
                     agent__enabled_drivers=order).discover()
    assert set(by_address(records)) == {"0000:02:00.0", "0000:00:03.0", "0000:5e:00.0"}


def test_without_specific_drivers_pci_reports_everything_it_admits(tmp_path):
    records = driver(tmp_path, make_tree(tmp_path), agent__enabled_drivers=["pci"]).discover()
    assert set(by_address(records)) == {"0000:17:00.0", "0000:6b:00.0", "0000:3b:00.0",
                                        "0000:81:00.0"}


def test_every_function_is_reported_by_one_driver_only(tmp_path):
    """The whole node with every driver enabled: no PCI address reported twice."""
    from acceld.drivers import loader
    from tests.support.sysfs_fixtures import node_overrides, populate_node
    tree = populate_node(SysfsTree(tmp_path / "sys"))
    names = ["pci", "nvidia_gpu", "intel_fpga", "xilinx_fpga", "intel_qat", "nvme", "nic",
             "ascend"]
    conf = make_conf(str(tmp_path), pci_driver__sysfs_root=str(tree.root),
                     agent__enabled_drivers=names, **node_overrides(tree, tmp_path))
    conf.set_override("device_spec", ["{}"], group="pci_driver")
    conf.set_override("device_classes", ALL_CLASSES, group="pci_driver")
    seen: dict[str, str] = {}
    for name in names:
        for record in loader.load(name, conf, "node1").discover():
            for dep in record.deployables:
                for handle in dep.attach_handles:
                    info = handle.attach_info
                    if "bus" not in info:
                        continue
                    address = f"{info['domain']}:{info['bus']}:{info['device']}.{info['function']}"
                    assert address not in seen, f"{address}: {seen[address]} and {name}"
                    seen[address] = name
    pci_only = {a for a, n in seen.items() if n == "pci"}
    # What pci keeps: the NVMe controller nvme does not list, the virtio and Huawei NICs.
    assert pci_only == {"0000:00:03.0", "0000:3d:00.0"}


# --- vfio-pci's denylist, health -----------------------------------------------------------

def test_denylisted_device_warns_once(tmp_path, caplog):
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci("0000:3d:00.0", "0x8086", "0x37c8", "0x0b4000", driver="c6xx")
    drv = driver(tmp_path, tree, agent__enabled_drivers=["pci"])
    drv.discover()
    drv.discover()
    warnings = [r for r in caplog.records if "denylist" in r.getMessage()]
    assert len(warnings) == 1 and "0000:3d:00.0 (8086:37c8)" in warnings[0].getMessage()
    caplog.clear()
    param = tree.root / "module" / "vfio_pci" / "parameters"
    param.mkdir(parents=True)
    (param / "disable_denylist").write_text("Y\n")
    driver(tmp_path, tree, agent__enabled_drivers=["pci"]).discover()
    assert "denylist" not in caplog.text


def test_health_from_aer(tmp_path):
    tree = make_tree(tmp_path)
    tree.set_aer(GPU)
    drv = driver(tmp_path, tree, agent__enabled_drivers=["pci"])
    assert by_address(drv.discover())[GPU].health["state"] == "healthy"
    tree.set_aer(GPU, fatal=1)
    health = by_address(drv.discover())[GPU].health
    assert health["state"] == "unhealthy" and health["counters"]["aer_fatal"] == 1


def test_traits_and_model_do_not_change_on_a_rebind_to_vfio(tmp_path):
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci(GPU, "0x10de", "0x2335", "0x030200", driver="nvidia", iommu_group=27)
    drv = driver(tmp_path, tree, agent__enabled_drivers=["pci"])
    [before] = drv.discover()
    tree.bind(GPU, "vfio-pci")
    [after] = drv.discover()
    assert after.std_board_info["driver"] == "vfio-pci"
    assert (after.model, after.type) == (before.model, before.type)
    assert after.deployables[0].attributes == before.deployables[0].attributes


def test_a_driver_whose_claim_fails_does_not_stop_pci(tmp_path, caplog, monkeypatch):
    """A bad [nic] mapping makes nic's claim raise: pci still reports, with one WARNING."""
    from acceld.drivers import claims
    monkeypatch.setattr(claims, "_warned", set())
    tree = make_tree(tmp_path)
    drv = driver(tmp_path, tree, agent__enabled_drivers=["pci", "nic"],
                 nic__physical_device_mappings=["no-colon"])
    assert len(drv.discover()) == 4
    drv.discover()
    assert len([r for r in caplog.records if "failed to say whether it claims" in
                r.getMessage()]) == 1
