"""nvidia_gpu: discovery through NVML (a stand-in module) and through sysfs alone."""

from __future__ import annotations

import importlib
import inspect

import pytest

from acceld.drivers.base import AttachHandle, DriverError, NotSupported, hardware_uuid
from acceld.drivers.nvidia_gpu import (NvidiaGpuDriver, product_of, read_vgpu_types,
                                       upstream_vgpu_trait)
from tests.conftest import make_conf
from tests.support.fake_pynvml import API_NAMES, FakeGpu, FakeMig, FakeVgpuType, make_pynvml
from tests.support.sysfs_fixtures import SysfsTree

H200 = "0000:3b:00.0"
GIB = 1024 ** 3


def driver(tmp_path, tree: SysfsTree, nvml=None, **opts) -> NvidiaGpuDriver:
    overrides = {"nvidia_gpu__sysfs_root": str(tree.root)}
    overrides.update({f"nvidia_gpu__{k}": v for k, v in opts.items()})
    return NvidiaGpuDriver(make_conf(str(tmp_path), **overrides), "node1", nvml=nvml)


def identity(records) -> list:
    """What must not depend on NVML or the driver binding: uuid, model, rc, traits."""
    return [(r.uuid, r.type, r.model, [(d.name, d.attributes["rc"], d.num_accelerators,
                                        traits(d)) for d in r.deployables]) for r in records]


@pytest.fixture
def tree(tmp_path) -> SysfsTree:
    """An HGX-like node: one H200, an NVSwitch, a GeForce with its audio function, a NIC."""
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(H200, "0x10de", "0x2335", "0x030200", driver="nvidia", revision="0xa1",
              iommu_group=21, bridge="0000:3a:00.0")
    t.add_pci("0000:05:00.0", "0x10de", "0x22a3", "0x068000", driver="nvidia")  # NVSwitch
    t.add_pci("0000:65:00.0", "0x10de", "0x2684", "0x030000", driver="vfio-pci")  # GeForce
    t.add_pci("0000:65:00.1", "0x10de", "0x22ba", "0x040300", driver="snd_hda_intel")
    t.add_pci("0000:5e:00.0", "0x8086", "0x1572", "0x020000", driver="i40e")
    t.add_module_version("nvidia", "550.54.15")
    return t


def by_address(records):
    return {r.controlpath_id["cpid_info"]["bus"] + ":" + r.controlpath_id["cpid_info"]["device"]
            + "." + r.controlpath_id["cpid_info"]["function"]: r for r in records}


def traits(deployable) -> list[str]:
    return [v for k, v in sorted(deployable.attributes.items()) if k.startswith("trait")]


def h200_nvml(**kw) -> FakeGpu:
    return FakeGpu(bus_id=H200, device_id=0x2335, name="NVIDIA H200",
                   uuid="GPU-0e8f1c3a-5b7d-4c2e-9a1f-3d6b8e0c2a47", memory_total=141 * GIB,
                   serial="1654123456789", **kw)


# --- sysfs path ---------------------------------------------------------------------


def test_sysfs_path_reports_gpus_only(tmp_path, tree):
    records = driver(tmp_path, tree, use_nvml=False).discover()
    found = by_address(records)
    # Neither the NVSwitch (0x0680), the audio function (0x0403) nor the NIC is a GPU.
    assert sorted(found) == ["3b:00.0", "65:00.0"]
    h200 = found["3b:00.0"]
    assert (h200.type, h200.vendor, h200.model, h200.driver_name) == (
        "GPU", "0x10de", "NVIDIA H200", "nvidia_gpu")
    assert h200.uuid == hardware_uuid("node1", "nvidia_gpu", H200)
    assert h200.std_board_info["product_id"] == "0x2335"
    assert h200.std_board_info["iommu_group"] == "21"
    assert h200.vendor_board_info["driver_version"] == "550.54.15"
    assert h200.vendor_board_info["discovered_by"] == "sysfs"
    [dep] = h200.deployables
    assert dep.name == H200 and dep.num_accelerators == 1
    assert dep.attributes["rc"] == "PGPU"
    # Upstream Cyborg's trait (the PCI product id) first, acceld's readable one beside it.
    assert traits(dep) == ["CUSTOM_NVIDIA_2335", "CUSTOM_NVIDIA_H200"]
    assert [(h.attach_type, h.attach_info) for h in dep.attach_handles] == [
        ("PCI", {"domain": "0000", "bus": "3b", "device": "00", "function": "0"})]
    # An id outside the product table: both are the device id, reported once.
    assert traits(found["65:00.0"].deployables[0]) == ["CUSTOM_NVIDIA_2684"]
    assert found["65:00.0"].model == "NVIDIA 2684"
    # No NVML and no AER/link files in this tree: nothing to judge health by.
    assert h200.health["state"] == "unknown"


def test_sysfs_path_skips_functions_with_missing_or_bad_files(tmp_path, tree):
    tree.add_pci("0000:81:00.0", "0x10de", "0x2335", "0x030200")
    (tree.device_dir("0000:81:00.0") / "class").unlink()
    tree.add_pci("0000:82:00.0", "0x10de", "0x2335", "0x030200")
    (tree.device_dir("0000:82:00.0") / "device").write_text("garbage\n")
    (tree.root / "module" / "nvidia" / "version").unlink()
    records = driver(tmp_path, tree, use_nvml=False).discover()
    assert sorted(by_address(records)) == ["3b:00.0", "65:00.0"]
    assert "driver_version" not in by_address(records)["3b:00.0"].vendor_board_info


def test_empty_or_missing_sysfs_finds_nothing(tmp_path):
    assert driver(tmp_path, SysfsTree(tmp_path / "empty"), use_nvml=False).discover() == []
    conf = make_conf(str(tmp_path), nvidia_gpu__sysfs_root=str(tmp_path / "absent"),
                     nvidia_gpu__use_nvml=False)
    assert NvidiaGpuDriver(conf, "node1").discover() == []


# --- NVML path ----------------------------------------------------------------------


def test_nvml_path_adds_name_memory_uuid_and_driver_version(tmp_path, tree):
    nvml = make_pynvml([h200_nvml(mig_mode=(0, 0))], driver_version="570.86.15")
    drv = driver(tmp_path, tree, nvml=nvml)
    records = by_address(drv.discover())
    h200 = records["3b:00.0"]
    assert h200.model == "NVIDIA H200"
    info = h200.vendor_board_info
    assert info["discovered_by"] == "nvml" and info["name"] == "NVIDIA H200"
    assert info["memory_mib"] == 141 * 1024
    assert info["driver_version"] == "570.86.15"
    assert info["gpu_uuid"] == "GPU-0e8f1c3a-5b7d-4c2e-9a1f-3d6b8e0c2a47"
    assert info["serial"] == "1654123456789"
    assert info["mig_mode"] == "disabled" and "mig_devices" not in info
    # Same uuid and same traits as the sysfs path: a node losing NVML keeps its inventory.
    assert h200.uuid == hardware_uuid("node1", "nvidia_gpu", H200)
    assert traits(h200.deployables[0]) == ["CUSTOM_NVIDIA_2335", "CUSTOM_NVIDIA_H200"]
    assert h200.health["state"] == "healthy"
    # The GeForce bound to vfio-pci is invisible to NVML but still reported from sysfs.
    assert records["65:00.0"].vendor_board_info["discovered_by"] == "sysfs"
    # Discovery's own NVML session is closed; the XID monitor holds one reference until
    # the driver is closed (events reach only a set registered before they happen).
    assert nvml.state["initialised"] == 1
    drv.close()
    assert nvml.state["initialised"] == 0


def test_nvml_and_sysfs_paths_agree_on_identity(tmp_path, tree):
    """An H200 seen with NVML and with sysfs only: same uuid, model, rc and traits."""
    with_nvml = driver(tmp_path, tree, nvml=make_pynvml([h200_nvml()])).discover()
    without = driver(tmp_path, tree, use_nvml=False).discover()
    assert with_nvml[0].vendor_board_info["discovered_by"] == "nvml"
    assert identity(with_nvml) == identity(without)


def test_identity_survives_a_rebind_to_vfio_pci(tmp_path):
    """An H100 PCIe whose NVML name ('NVIDIA H100 PCIe') is not the table's: once rebound
    to vfio-pci NVML no longer sees it, and nothing a device profile matches changes."""
    t = SysfsTree(tmp_path / "sys")
    t.add_pci("0000:17:00.0", "0x10de", "0x2331", "0x030200", driver="nvidia", iommu_group=5)
    nvml = make_pynvml([FakeGpu(bus_id="0000:17:00.0", device_id=0x2331,
                                name="NVIDIA H100 PCIe", uuid="GPU-9", memory_total=80 * GIB)])
    before = driver(tmp_path, t, nvml=nvml).discover()
    t.bind("0000:17:00.0", "vfio-pci")
    after = driver(tmp_path, t, nvml=make_pynvml([])).discover()
    assert before[0].vendor_board_info["name"] == "NVIDIA H100 PCIe"
    assert after[0].vendor_board_info["discovered_by"] == "sysfs"
    assert identity(before) == identity(after)
    assert traits(after[0].deployables[0]) == ["CUSTOM_NVIDIA_2331", "CUSTOM_NVIDIA_H100"]


@pytest.mark.parametrize("error", ["LibraryNotFound", "DriverNotLoaded", "NoPermission"])
def test_nvml_init_failure_falls_back_to_sysfs(tmp_path, tree, error):
    nvml = make_pynvml([h200_nvml()], init_error=error)
    records = by_address(driver(tmp_path, tree, nvml=nvml).discover())
    assert records["3b:00.0"].vendor_board_info["discovered_by"] == "sysfs"
    assert records["3b:00.0"].vendor_board_info["driver_version"] == "550.54.15"
    assert nvml.state["shutdown_calls"] == 0


def test_use_nvml_false_never_initialises_nvml(tmp_path, tree):
    nvml = make_pynvml([h200_nvml()])
    driver(tmp_path, tree, nvml=nvml, use_nvml=False).discover()
    assert nvml.state["init_calls"] == 0


def test_lost_gpu_is_still_reported_from_sysfs(tmp_path, tree):
    nvml = make_pynvml([h200_nvml(lost=True)])
    records = by_address(driver(tmp_path, tree, nvml=nvml).discover())
    assert records["3b:00.0"].vendor_board_info["discovered_by"] == "sysfs"
    assert records["3b:00.0"].health["state"] == "unhealthy"
    assert "lost from the bus" in records["3b:00.0"].health["reason"]


def test_gpus_of_another_container_are_not_reported(tmp_path, tree):
    """/sys shows every GPU of the host; NVML only this container's. A GPU bound to nvidia
    that NVML does not know is not this node's to offer (vfio-pci ones still are)."""
    tree.add_pci("0000:9b:00.0", "0x10de", "0x2335", "0x030200", driver="nvidia")
    records = by_address(driver(tmp_path, tree, nvml=make_pynvml([h200_nvml()])).discover())
    assert sorted(records) == ["3b:00.0", "65:00.0"]
    # Without NVML there is no telling: sysfs alone reports every GPU it sees.
    records = by_address(driver(tmp_path, tree, use_nvml=False).discover())
    assert sorted(records) == ["3b:00.0", "65:00.0", "9b:00.0"]


def test_unsupported_facts_are_left_out(tmp_path, tree):
    """A T4 has no MIG and may not report a serial: NotSupported loses only those facts."""
    tree.add_pci("0000:06:00.0", "0x10de", "0x1eb8", "0x030200", driver="nvidia")
    t4 = FakeGpu(bus_id="0000:06:00.0", device_id=0x1eb8, name="Tesla T4",
                 uuid="GPU-1", memory_total=15 * GIB)
    records = by_address(driver(tmp_path, tree, nvml=make_pynvml([t4])).discover())
    info = records["06:00.0"].vendor_board_info
    assert "serial" not in info and "mig_mode" not in info
    assert info["memory_mib"] == 15 * 1024
    assert traits(records["06:00.0"].deployables[0]) == ["CUSTOM_NVIDIA_1EB8", "CUSTOM_NVIDIA_T4"]


def test_nvml_only_gpu_is_reported(tmp_path):
    """A GPU NVML sees but the sysfs root lacks (e.g. a container's partial /sys)."""
    nvml = make_pynvml([FakeGpu(bus_id="0000:c1:00.0", device_id=0x26b9, name="NVIDIA L40S",
                                uuid="GPU-2", memory_total=45 * GIB)])
    [record] = driver(tmp_path, SysfsTree(tmp_path / "sys"), nvml=nvml).discover()
    assert record.model == "NVIDIA 26B9" and record.vendor_board_info["name"] == "NVIDIA L40S"
    assert record.std_board_info == {"vendor_id": "0x10de", "product_id": "0x26b9"}
    assert traits(record.deployables[0]) == ["CUSTOM_NVIDIA_26B9"]


def test_mig_devices_are_reported_and_the_gpu_is_not_offered_whole(tmp_path, tree):
    slots = [FakeMig("MIG-aaaa", 1, 0, 18 * GIB), None, FakeMig("MIG-bbbb", 2, 0, 35 * GIB),
             None, None, None, None]
    nvml = make_pynvml([h200_nvml(mig_mode=(1, 1), mig_slots=slots,
                                  gpu_instances={1: 19, 2: 15})])
    h200 = by_address(driver(tmp_path, tree, nvml=nvml).discover())["3b:00.0"]
    assert h200.vendor_board_info["mig_mode"] == "enabled"
    assert h200.vendor_board_info["mig_devices"] == [
        {"uuid": "MIG-aaaa", "gpu_instance_id": 1, "compute_instance_id": 0,
         "memory_mib": 18 * 1024},
        {"uuid": "MIG-bbbb", "gpu_instance_id": 2, "compute_instance_id": 0,
         "memory_mib": 35 * 1024}]
    # Live MIG devices: handing the GPU whole to a VM would take them from their users.
    assert h200.deployables == [] and h200.acc_specs["num"] == 0
    assert h200.acc_status == "setup_required"
    assert h200.status_reason == "not offered whole: 2 MIG device(s) live on it"


def test_mig_enabled_without_mig_devices_is_offered_whole(tmp_path, tree):
    nvml = make_pynvml([h200_nvml(mig_mode=(1, 1), mig_slots=[None] * 7)])
    h200 = by_address(driver(tmp_path, tree, nvml=nvml).discover())["3b:00.0"]
    assert h200.vendor_board_info["mig_mode"] == "enabled"
    assert h200.acc_status == "ready"
    # Traits do not depend on what NVML says (the sysfs path could not report MIG).
    assert traits(h200.deployables[0]) == ["CUSTOM_NVIDIA_2335", "CUSTOM_NVIDIA_H200"]


def test_fake_pynvml_uses_the_real_module_names():
    try:
        real = importlib.import_module("pynvml")
    except ImportError:
        pytest.skip("nvidia-ml-py is not installed")
    assert [n for n in API_NAMES if not hasattr(real, n)] == []
    fake = make_pynvml([])
    for name in API_NAMES:
        if name.isupper() or name.startswith("nvmlEventType") or name.startswith("NVML_"):
            assert getattr(fake, name) == getattr(real, name), name
        elif name.startswith("nvml"):  # called the same way: as many parameters
            assert len(inspect.signature(getattr(fake, name)).parameters) == len(
                inspect.signature(getattr(real, name)).parameters), name
    # NVMLError(code) gives the per-code subclass in both.
    for name, code in (("NotSupported", 3), ("NotFound", 6), ("Timeout", 10),
                       ("LibraryNotFound", 12), ("GpuIsLost", 15)):
        assert isinstance(real.NVMLError(code), getattr(real, f"NVMLError_{name}"))
        assert isinstance(fake.NVMLError(code), getattr(fake, f"NVMLError_{name}"))
        assert str(fake.NVMLError(code)) == str(real.NVMLError(code))
    assert isinstance(fake.NVMLError(3), fake.NVMLError_NotSupported)


# --- mdev vGPU ----------------------------------------------------------------------


@pytest.fixture
def t4_tree(tmp_path) -> SysfsTree:
    t = SysfsTree(tmp_path / "sys")
    t.add_pci("0000:06:00.0", "0x10de", "0x1eb8", "0x030200", driver="nvidia")
    t.add_mdev_type("0000:06:00.0", "nvidia-222", "GRID T4-1B", 16,
                    description="num_heads=4, frl_config=45, framebuffer=1024M")
    t.add_mdev_type("0000:06:00.0", "nvidia-223", "GRID T4-2B", 8)
    return t


def test_mdev_types_not_enabled_offer_the_whole_gpu(tmp_path, t4_tree):
    [record] = driver(tmp_path, t4_tree, use_nvml=False).discover()
    assert [d.attributes["rc"] for d in record.deployables] == ["PGPU"]


def test_enabled_mdev_type_is_offered_as_vgpus(tmp_path, t4_tree):
    drv = driver(tmp_path, t4_tree, use_nvml=False, enabled_vgpu_types=["GRID T4-2B"])
    [record] = drv.discover()
    [dep] = record.deployables
    assert dep.name == "0000:06:00.0_nvidia-223"
    assert dep.num_accelerators == 8 and record.acc_specs["num"] == 8
    assert dep.attributes["rc"] == "VGPU"
    # Upstream's vGPU trait (CUSTOM_NVIDIA_<product id>_<type>) leads.
    assert traits(dep) == ["CUSTOM_NVIDIA_1EB8_T4_2B", "CUSTOM_NVIDIA_1EB8", "CUSTOM_NVIDIA_T4",
                           "CUSTOM_VGPU_GRID_T4_2B"]
    assert (dep.attributes["vgpu_type"], dep.attributes["vgpu_name"]) == (
        "nvidia-223", "GRID T4-2B")
    assert record.vendor_board_info["vgpu_capacity_source"] == "kernel"
    assert {h.attach_type for h in dep.attach_handles} == {"MDEV"}
    uuids = [h.attach_info["uuid"] for h in dep.attach_handles]
    assert len(set(uuids)) == 8
    # Upstream Cyborg's MDEV attach_info keys (the parent's address, asked_type, vgpu_mark)
    # plus the mdev's uuid.
    assert dep.attach_handles[0].attach_info == {
        "domain": "0000", "bus": "06", "device": "00", "function": "0",
        "asked_type": "nvidia-223", "vgpu_mark": "nvidia-223_0",
        "uuid": drv.slot_uuid("0000:06:00.0", "nvidia-223", 0)}
    # The type id works as well as the name.
    by_id = driver(tmp_path, t4_tree, use_nvml=False, enabled_vgpu_types=["nvidia-223"])
    assert by_id.discover()[0].deployables[0].name == "0000:06:00.0_nvidia-223"


def test_mdev_created_on_bind_and_removed_on_unbind(tmp_path, t4_tree):
    drv = driver(tmp_path, t4_tree, use_nvml=False, enabled_vgpu_types=["nvidia-223"])
    handle = drv.discover()[0].deployables[0].attach_handles[3]
    uuid = handle.attach_info["uuid"]
    type_dir = t4_tree.device_dir("0000:06:00.0") / "mdev_supported_types" / "nvidia-223"
    assert drv.prepare_attach_handle(handle) is handle
    assert (type_dir / "create").read_text() == uuid
    # The kernel makes the mdev and lowers available_instances; a foreign mdev is not ours.
    t4_tree.add_mdev("0000:06:00.0", "nvidia-223", uuid)
    t4_tree.add_mdev("0000:06:00.0", "nvidia-223", "5d0a2b44-0000-4000-8000-000000000001")
    (type_dir / "available_instances").write_text("6\n")
    [dep] = drv.discover()[0].deployables
    assert dep.num_accelerators == 7  # 6 free + ours; the foreign one is not offered
    assert uuid in [h.attach_info["uuid"] for h in dep.attach_handles]
    # A retried bind does not write create again.
    (type_dir / "create").write_text("")
    drv.prepare_attach_handle(handle)
    assert (type_dir / "create").read_text() == ""
    drv.release_attach_handle(handle)
    assert (t4_tree.device_dir("0000:06:00.0") / uuid / "remove").read_text() == "1"


def test_release_of_a_missing_mdev_is_a_no_op(tmp_path, t4_tree):
    drv = driver(tmp_path, t4_tree, use_nvml=False, enabled_vgpu_types=["nvidia-223"])
    handle = drv.discover()[0].deployables[0].attach_handles[0]
    drv.release_attach_handle(handle)  # nothing created: nothing to remove


def test_mdev_create_failure_is_a_driver_error(tmp_path, t4_tree):
    drv = driver(tmp_path, t4_tree, use_nvml=False, enabled_vgpu_types=["nvidia-223"])
    handle = drv.discover()[0].deployables[0].attach_handles[0]
    type_dir = t4_tree.device_dir("0000:06:00.0") / "mdev_supported_types" / "nvidia-223"
    (type_dir / "create").unlink()
    (type_dir / "create").mkdir()  # writing fails with EISDIR, as a gone parent would
    with pytest.raises(DriverError, match="could not create vGPU"):
        drv.prepare_attach_handle(handle)
    with pytest.raises(DriverError, match="lacks 'uuid'"):
        info = {k: v for k, v in handle.attach_info.items() if k != "uuid"}
        drv.prepare_attach_handle(AttachHandle("MDEV", info))
    with pytest.raises(DriverError, match="names no PCI address"):
        drv.prepare_attach_handle(AttachHandle("MDEV", {**handle.attach_info, "bus": "../x"}))


def test_mdev_of_another_type_under_the_same_uuid_is_refused(tmp_path, t4_tree):
    drv = driver(tmp_path, t4_tree, use_nvml=False, enabled_vgpu_types=["nvidia-223"])
    handle = drv.discover()[0].deployables[0].attach_handles[0]
    t4_tree.add_mdev("0000:06:00.0", "nvidia-222", handle.attach_info["uuid"])
    with pytest.raises(DriverError, match="exists as type nvidia-222"):
        drv.prepare_attach_handle(handle)


def test_mdev_type_without_mandatory_files_is_ignored(tmp_path, t4_tree):
    type_dir = t4_tree.device_dir("0000:06:00.0") / "mdev_supported_types" / "nvidia-223"
    (type_dir / "available_instances").unlink()
    [record] = driver(tmp_path, t4_tree, use_nvml=False,
                      enabled_vgpu_types=["nvidia-223"]).discover()
    # The broken type is not a type; the one configured is then unknown: not served, and
    # not silently a whole GPU either.
    assert (record.acc_status, record.deployables) == ("setup_required", [])
    assert record.status_reason == ("configured vGPU type(s) 'nvidia-223' unknown on this "
                                    "host; 0000:06:00.0 offers: GRID T4-1B")
    # A type that is fine on the same GPU is served.
    [record] = driver(tmp_path, t4_tree, use_nvml=False,
                      enabled_vgpu_types=["nvidia-223", "GRID T4-1B"]).discover()
    assert record.deployables[0].attributes["vgpu_type"] == "nvidia-222"


def test_full_gpu_of_acceld_s_own_vgpus_stays_a_full_provider(tmp_path, t4_tree):
    """All 8 T4-2B slots made by acceld: available_instances is 0, the provider keeps 8."""
    drv = driver(tmp_path, t4_tree, use_nvml=False, enabled_vgpu_types=["nvidia-223"])
    handles = drv.discover()[0].deployables[0].attach_handles
    for handle in handles:
        t4_tree.add_mdev("0000:06:00.0", "nvidia-223", handle.attach_info["uuid"])
    type_dir = t4_tree.device_dir("0000:06:00.0") / "mdev_supported_types"
    (type_dir / "nvidia-223" / "available_instances").write_text("0\n")
    (type_dir / "nvidia-222" / "available_instances").write_text("0\n")
    [record] = drv.discover()
    [dep] = record.deployables
    assert dep.attributes["rc"] == "VGPU" and dep.num_accelerators == 8
    assert [h.attach_info for h in dep.attach_handles] == [h.attach_info for h in handles]


def test_gpu_full_of_another_tool_s_vgpus_offers_nothing_and_never_whole(tmp_path, t4_tree):
    """Nova (or an operator) filled the T4 with T4-1B mdevs: T4-2B shows 0 available (one
    type at a time), and the GPU is neither a vGPU provider nor a whole GPU."""
    type_dir = t4_tree.device_dir("0000:06:00.0") / "mdev_supported_types"
    for i in range(16):
        t4_tree.add_mdev("0000:06:00.0", "nvidia-222", f"5d0a2b44-0000-4000-8000-{i:012d}")
    (type_dir / "nvidia-222" / "available_instances").write_text("0\n")
    (type_dir / "nvidia-223" / "available_instances").write_text("0\n")
    [record] = driver(tmp_path, t4_tree, use_nvml=False,
                      enabled_vgpu_types=["nvidia-223"]).discover()
    assert record.deployables == [] and record.acc_specs["num"] == 0
    # Nothing enabled: still never offered whole while vGPU guests run on it.
    [record] = driver(tmp_path, t4_tree, use_nvml=False).discover()
    assert record.deployables == [] and record.acc_status == "setup_required"
    assert record.status_reason.startswith("not offered whole: 16 vGPU(s) run on it")


def test_foreign_mdevs_count_against_nvml_capacity(tmp_path, t4_tree):
    """NVML's maximum is the card's total: instances another tool made come off it."""
    t4_tree.add_mdev("0000:06:00.0", "nvidia-223", "5d0a2b44-0000-4000-8000-000000000001")
    type_dir = t4_tree.device_dir("0000:06:00.0") / "mdev_supported_types" / "nvidia-223"
    (type_dir / "available_instances").write_text("7\n")
    t4 = FakeGpu(bus_id="0000:06:00.0", device_id=0x1eb8, name="Tesla T4", uuid="GPU-1",
                 memory_total=15 * GIB, vgpu_types=[FakeVgpuType(223, "GRID T4-2B", 8)],
                 active_vgpus=[223])
    [record] = driver(tmp_path, t4_tree, nvml=make_pynvml([t4]),
                      enabled_vgpu_types=["GRID T4-2B"]).discover()
    assert record.deployables[0].num_accelerators == 7
    assert record.vendor_board_info["vgpu_capacity_source"] == "nvml"


# --- SR-IOV GPUs: mdev on VFs (Ampere) ---------------------------------------------


def vf_addresses(pf: str, count: int) -> list[str]:
    """VFs from offset 4, stride 1: 41:00.4 ... 41:00.7, 41:01.0 ... (as sriov-manage makes)."""
    bus = pf[:7]  # '0000:41'
    return [f"{bus}:{(4 + i) // 8:02x}.{(4 + i) % 8}" for i in range(count)]


@pytest.fixture
def a40_tree(tmp_path) -> SysfsTree:
    """An A40 after sriov-manage -e with 8 VFs, each VF holding at most one A40-24Q."""
    t = SysfsTree(tmp_path / "sys")
    t.add_pci("0000:41:00.0", "0x10de", "0x2235", "0x030200", driver="nvidia")
    vfs = vf_addresses("0000:41:00.0", 8)
    t.add_vfs("0000:41:00.0", vfs, "0x2235", driver="nvidia", total=32)
    for vf in vfs:
        t.add_mdev_type(vf, "nvidia-566", "NVIDIA A40-24Q", 1,
                        description="num_heads=4, frl_config=60, framebuffer=24576M")
    return t


def a40_nvml(**kw) -> FakeGpu:
    return FakeGpu(bus_id="0000:41:00.0", device_id=0x2235, name="NVIDIA A40", uuid="GPU-a40",
                   memory_total=48 * GIB, vgpu_types=[FakeVgpuType(566, "NVIDIA A40-24Q", 2)],
                   **kw)


def test_mdev_on_vfs_never_exceeds_the_card_s_capacity(tmp_path, a40_tree):
    """8 VFs each say 1 available, but an A40 holds 2 A40-24Q: 2 handles, not 8."""
    drv = driver(tmp_path, a40_tree, nvml=make_pynvml([a40_nvml()]),
                 enabled_vgpu_types=["NVIDIA A40-24Q"])
    [record] = drv.discover()
    [dep] = record.deployables  # VFs are not GPUs of their own
    assert dep.name == "0000:41:00.0_nvidia-566" and dep.num_accelerators == 2
    assert [h.attach_info["function"] for h in dep.attach_handles] == ["4", "5"]
    assert traits(dep)[0] == "CUSTOM_NVIDIA_2235_A40_24Q"
    # acceld's vGPU on the third VF stays offered; a foreign one on another VF takes the
    # card's second place.
    ours = "0000:41:00.6"
    a40_tree.add_mdev(ours, "nvidia-566", drv.slot_uuid(ours, "nvidia-566", 0))
    (a40_tree.device_dir(ours) / "mdev_supported_types" / "nvidia-566" /
     "available_instances").write_text("0\n")
    [dep] = drv.discover()[0].deployables
    assert [h.attach_info["function"] for h in dep.attach_handles] == ["4", "6"]
    foreign = "0000:41:00.7"
    a40_tree.add_mdev(foreign, "nvidia-566", "5d0a2b44-0000-4000-8000-000000000001")
    for vf in vf_addresses("0000:41:00.0", 8):  # the card is full: every VF says 0 now
        (a40_tree.device_dir(vf) / "mdev_supported_types" / "nvidia-566" /
         "available_instances").write_text("0\n")
    [dep] = drv.discover()[0].deployables
    assert [h.attach_info["function"] for h in dep.attach_handles] == ["6"]


def test_mdev_on_vfs_without_nvml_uses_the_configured_cap(tmp_path, a40_tree):
    [record] = driver(tmp_path, a40_tree, use_nvml=False,
                      enabled_vgpu_types=["NVIDIA A40-24Q"]).discover()
    assert record.acc_status == "setup_required" and record.deployables == []
    assert "vgpu_max_instances" in record.status_reason
    [record] = driver(tmp_path, a40_tree, use_nvml=False, enabled_vgpu_types=["nvidia-566"],
                      vgpu_max_instances={"NVIDIA A40-24Q": 2}).discover()
    assert record.deployables[0].num_accelerators == 2
    assert record.vendor_board_info["vgpu_capacity_source"] == "config"


def test_sriov_not_enabled_is_setup_required(tmp_path):
    """NVML lists the A40's vGPU types but sriov-manage has not made the VFs yet."""
    t = SysfsTree(tmp_path / "sys")
    t.add_pci("0000:41:00.0", "0x10de", "0x2235", "0x030200", driver="nvidia")
    t.set_sriov("0000:41:00.0", total=32, numvfs=0, vf_device="0x2235")
    [record] = driver(tmp_path, t, nvml=make_pynvml([a40_nvml()]),
                      enabled_vgpu_types=["NVIDIA A40-24Q"]).discover()
    assert (record.acc_status, record.deployables) == ("setup_required", [])
    assert "sriov-manage -e 0000:41:00.0" in record.status_reason


# --- vGPU 17+ vendor-specific VFIO (H200) ---------------------------------------------

H200_PF = "0000:41:00.0"
T18C, T141C, T1_18C = 1418, 1428, 1414
TIME_SLICED = {T18C: "NVIDIA H200X-18C", T141C: "NVIDIA H200X-141C"}


def h200_vfio_tree(tmp_path, running: dict[int, int] | None = None, vfs: int = 12,
                   creatable: dict[int, str] | None = None) -> SysfsTree:
    """An H200 (MIG off) with ``vfs`` VFs; ``running`` maps a VF index to the type it runs.
    Free VFs list what the card can still make: nothing once full, and only the running
    type once one runs (time-sliced vGPUs on one card share a type)."""
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(H200_PF, "0x10de", "0x2335", "0x030200", driver="nvidia")
    addresses = vf_addresses(H200_PF, vfs)
    t.add_vfs(H200_PF, addresses, "0x2335", driver="nvidia", total=32)
    running = running or {}
    kinds = set(running.values())
    if creatable is None:
        full = T141C in kinds or list(running.values()).count(T18C) >= 7
        creatable = {} if full else ({t: n for t, n in TIME_SLICED.items() if t in kinds}
                                     if kinds else dict(TIME_SLICED))
    for i, vf in enumerate(addresses):
        t.add_nvidia_vfio(vf, {} if i in running else creatable, current=running.get(i, 0))
    return t


def h200_vgpu_nvml(running: dict[int, int] | None = None, **kw) -> FakeGpu:
    return FakeGpu(bus_id=H200_PF, device_id=0x2335, name="NVIDIA H200", uuid="GPU-h200",
                   memory_total=141 * GIB, mig_mode=(0, 0),
                   vgpu_types=[FakeVgpuType(T18C, "NVIDIA H200X-18C", 7),
                               FakeVgpuType(T141C, "NVIDIA H200X-141C", 1),
                               FakeVgpuType(T1_18C, "NVIDIA H200X-1-18C", 7, 19)],
                   active_vgpus=list((running or {}).values()), **kw)


@pytest.mark.parametrize("wanted,expected", [("NVIDIA H200X-18C", 7), ("NVIDIA H200X-141C", 1)])
def test_h200_with_32_vfs_offers_what_the_card_holds(tmp_path, wanted, expected):
    tree = h200_vfio_tree(tmp_path, vfs=32)
    [record] = driver(tmp_path, tree, nvml=make_pynvml([h200_vgpu_nvml()]),
                      enabled_vgpu_types=[wanted]).discover()
    [dep] = record.deployables
    assert (dep.attributes["rc"], dep.num_accelerators) == ("VGPU", expected)
    assert dep.attributes["vgpu_kind"] == "vfio"
    handle = dep.attach_handles[0]
    assert handle.attach_type == "PCI"
    # The VF must not be rebound by Nova (managed no); acceld sets its type on bind.
    assert handle.attach_info == {"domain": "0000", "bus": "41", "device": "00",
                                  "function": "4", "vgpu_type": wanted, "managed": "no"}
    assert traits(dep) == [upstream_vgpu_trait("0x2335", wanted), "CUSTOM_NVIDIA_2335",
                           "CUSTOM_NVIDIA_H200", f"CUSTOM_VGPU_NVIDIA_{wanted[7:].replace('-', '_')}"]


def test_vfio_vgpus_in_use_count_and_keep_their_handles(tmp_path):
    running = {0: T18C, 5: T18C, 9: T18C}
    tree = h200_vfio_tree(tmp_path, running)
    [record] = driver(tmp_path, tree, nvml=make_pynvml([h200_vgpu_nvml(running)]),
                      enabled_vgpu_types=["NVIDIA H200X-18C"]).discover()
    [dep] = record.deployables
    functions = [(h.attach_info["device"], h.attach_info["function"]) for h in dep.attach_handles]
    assert dep.num_accelerators == 7  # 3 running + 4 free, never 12
    for i in running:  # each running VF stays a handle (its ARQ is bound to it)
        vf = vf_addresses(H200_PF, 12)[i]
        assert (vf[8:10], vf[-1]) in functions


def test_full_h200_stays_a_full_vgpu_provider_with_names_from_nvml(tmp_path):
    """Seven 18C run: every VF's creatable_vgpu_types is its header only. The type is
    still named (NVML), the GPU is still a 7-vGPU provider, never a whole GPU."""
    running = {i: T18C for i in range(7)}
    tree = h200_vfio_tree(tmp_path, running)
    [record] = driver(tmp_path, tree, nvml=make_pynvml([h200_vgpu_nvml(running)]),
                      enabled_vgpu_types=["NVIDIA H200X-18C"]).discover()
    [dep] = record.deployables
    assert (dep.attributes["rc"], dep.num_accelerators) == ("VGPU", 7)


def test_full_h200_without_nvml_uses_names_learnt_earlier(tmp_path):
    tree = h200_vfio_tree(tmp_path)
    drv = driver(tmp_path, tree, use_nvml=False, enabled_vgpu_types=["NVIDIA H200X-18C"],
                 vgpu_max_instances={"NVIDIA H200X-18C": 7})
    assert drv.discover()[0].deployables[0].num_accelerators == 7
    full = h200_vfio_tree(tmp_path / "full", {i: T18C for i in range(7)})
    drv.root = str(full.root)
    [dep] = drv.discover()[0].deployables
    assert (dep.attributes["rc"], dep.num_accelerators) == ("VGPU", 7)
    # A fresh agent without NVML cannot name the running type: never a whole GPU.
    [record] = driver(tmp_path, full, use_nvml=False, enabled_vgpu_types=["NVIDIA H200X-18C"],
                      vgpu_max_instances={"NVIDIA H200X-18C": 7}).discover()
    assert (record.acc_status, record.deployables) == ("setup_required", [])
    assert "type id(s) 1418" in record.status_reason


def test_mig_backed_type_needs_mig_mode_and_gpu_instances(tmp_path):
    # MIG off: the VFs list the time-sliced types only.
    tree = h200_vfio_tree(tmp_path)
    enabled = ["NVIDIA H200X-1-18C"]
    [record] = driver(tmp_path, tree, nvml=make_pynvml([h200_vgpu_nvml()]),
                      enabled_vgpu_types=enabled).discover()
    assert record.acc_status == "setup_required" and "needs MIG mode" in record.status_reason
    # MIG on without GPU instances: nothing can be made.
    gpu = h200_vgpu_nvml()
    gpu.mig_mode = (1, 1)
    tree = h200_vfio_tree(tmp_path / "no-gi", creatable={})
    [record] = driver(tmp_path, tree, nvml=make_pynvml([gpu]),
                      enabled_vgpu_types=enabled).discover()
    assert record.acc_status == "setup_required"
    assert "GPU instances of MIG profile id 19" in record.status_reason
    # Three 1g GPU instances: the VFs can make 1-18C vGPUs, three at most.
    gpu.gpu_instances = {7: 19, 8: 19, 9: 19}
    tree = h200_vfio_tree(tmp_path / "mig", creatable={T1_18C: "NVIDIA H200X-1-18C"})
    [record] = driver(tmp_path, tree, nvml=make_pynvml([gpu]),
                      enabled_vgpu_types=enabled).discover()
    assert record.acc_status == "ready" and record.deployables[0].num_accelerators == 3


def test_unknown_vgpu_type_name_is_setup_required(tmp_path, t4_tree):
    tree = h200_vfio_tree(tmp_path)
    [record] = driver(tmp_path, tree, nvml=make_pynvml([h200_vgpu_nvml()]),
                      enabled_vgpu_types=["NVIDIA H200X-99C"]).discover()
    assert (record.acc_status, record.deployables) == ("setup_required", [])
    assert "'NVIDIA H200X-99C'" in record.status_reason
    assert "NVIDIA H200X-18C" in record.status_reason  # what it does offer


def test_a_type_meant_for_another_gpu_leaves_this_one_whole(tmp_path, t4_tree):
    """A host with a T4 (mdev) and an H200 (vendor VFIO): the H200's type does not turn
    the T4 into a setup_required device."""
    t4_tree.add_pci(H200_PF, "0x10de", "0x2335", "0x030200", driver="nvidia")
    vfs = vf_addresses(H200_PF, 4)
    t4_tree.add_vfs(H200_PF, vfs, "0x2335", driver="nvidia", total=32)
    for vf in vfs:
        t4_tree.add_nvidia_vfio(vf, TIME_SLICED)
    records = by_address(driver(tmp_path, t4_tree, use_nvml=False,
                                enabled_vgpu_types=["NVIDIA H200X-141C"],
                                vgpu_max_instances={"NVIDIA H200X-141C": 1}).discover())
    assert records["06:00.0"].deployables[0].attributes["rc"] == "PGPU"
    assert records["41:00.0"].deployables[0].num_accelerators == 1


def test_vendor_vfio_prepare_and_release(tmp_path):
    tree = h200_vfio_tree(tmp_path, vfs=3)
    drv = driver(tmp_path, tree, use_nvml=False, enabled_vgpu_types=["NVIDIA H200X-18C"],
                 vgpu_max_instances={"NVIDIA H200X-18C": 7})
    handle = drv.discover()[0].deployables[0].attach_handles[0]
    current = tree.device_dir("0000:41:00.4") / "nvidia" / "current_vgpu_type"
    drv.prepare_attach_handle(handle)
    assert current.read_text() == "1418"
    # The kernel empties the VF's creatable list; a retried bind finds its vGPU running.
    (tree.device_dir("0000:41:00.4") / "nvidia" / "creatable_vgpu_types").write_text(
        "ID    : vGPU Name\n")
    drv.prepare_attach_handle(handle)
    drv.release_attach_handle(handle)
    assert current.read_text() == "0"


def test_vendor_vfio_busy_vf_refuses(tmp_path):
    tree = h200_vfio_tree(tmp_path, vfs=3)
    drv = driver(tmp_path, tree, use_nvml=False, enabled_vgpu_types=["NVIDIA H200X-18C"],
                 vgpu_max_instances={"NVIDIA H200X-18C": 7})
    handle = drv.discover()[0].deployables[0].attach_handles[1]
    (tree.device_dir("0000:41:00.5") / "nvidia" / "current_vgpu_type").write_text("1428\n")
    with pytest.raises(DriverError, match="already runs vGPU type id 1428"):
        drv.prepare_attach_handle(handle)
    (tree.device_dir("0000:41:00.5") / "nvidia" / "current_vgpu_type").unlink()
    with pytest.raises(DriverError, match="no nvidia/current_vgpu_type"):
        drv.prepare_attach_handle(handle)


def test_read_vgpu_types_parses_the_kernel_format(tmp_path):
    path = tmp_path / "creatable_vgpu_types"
    path.write_text("ID    : vGPU Name\n1414  : NVIDIA H200X-1-18C\n1428  : NVIDIA H200X-141C\n")
    assert read_vgpu_types(str(path)) == {1414: "NVIDIA H200X-1-18C", 1428: "NVIDIA H200X-141C"}
    path.write_text("ID    : vGPU Name\n")
    assert read_vgpu_types(str(path)) == {}
    assert read_vgpu_types(str(tmp_path / "absent")) is None


def test_programming_is_not_supported(tmp_path, tree):
    with pytest.raises(NotSupported):
        driver(tmp_path, tree, use_nvml=False).program(H200, "/tmp/image.bin")


def test_product_names_and_upstream_vgpu_traits():
    assert product_of("0x2335") == "H200"
    assert product_of("0x26b9") == "26B9"  # never from NVML's name, which a rebind loses
    # Upstream: 'CUSTOM_NVIDIA_' + product id + '_' + the name's second word, '-' -> '_'.
    assert upstream_vgpu_trait("0x1eb8", "GRID T4-2B") == "CUSTOM_NVIDIA_1EB8_T4_2B"
    assert upstream_vgpu_trait("0x2335", "NVIDIA H200X-1-18C") == "CUSTOM_NVIDIA_2335_H200X_1_18C"
    assert upstream_vgpu_trait("0x2235", "NVIDIA A40-24Q") == "CUSTOM_NVIDIA_2235_A40_24Q"


# --- IOMMU groups ---------------------------------------------------------------------


@pytest.mark.parametrize("audio_driver,status", [("snd_hda_intel", "setup_required"),
                                                 ("vfio-pci", "ready"), (None, "ready")])
def test_gpu_and_its_audio_function_in_one_iommu_group(tmp_path, audio_driver, status):
    """A consumer GPU shares its IOMMU group with its HDMI audio function: the GPU can go to
    a VM only once the audio function has left the host driver too."""
    t = SysfsTree(tmp_path / "sys")
    t.add_pci("0000:17:00.0", "0x10de", "0x2684", "0x030000", driver="vfio-pci", iommu_group=27)
    t.add_pci("0000:17:00.1", "0x10de", "0x22ba", "0x040300", driver=audio_driver,
              iommu_group=27)
    [record] = driver(tmp_path, t, use_nvml=False).discover()
    assert record.acc_status == status
    if status != "ready":
        assert "0000:17:00.1 (bound to snd_hda_intel)" in record.status_reason


def test_nvidia_gpu_claims_its_functions_from_the_pci_driver(tmp_path, tree):
    from acceld.drivers import sysfs
    claimed = {f.address for f in sysfs.list_pci_functions(str(tree.root))
               if NvidiaGpuDriver.claims_pci(None, f)}
    assert claimed == {H200, "0000:65:00.0"}  # not the NVSwitch, the audio function, the NIC


def test_an_mdev_handle_stored_in_the_earlier_shape_is_still_released(tmp_path, t4_tree):
    """Handles bound before the upstream keys named their parent "parent": unbinding them
    after an upgrade must still remove their mdev."""
    drv = driver(tmp_path, t4_tree, use_nvml=False, enabled_vgpu_types=["nvidia-223"])
    uuid = drv.slot_uuid("0000:06:00.0", "nvidia-223", 0)
    t4_tree.add_mdev("0000:06:00.0", "nvidia-223", uuid)
    old = AttachHandle("MDEV", {"parent": "0000:06:00.0", "asked_type": "nvidia-223",
                                "vgpu_mark": "nvidia-223_0", "uuid": uuid})
    drv.release_attach_handle(old)
    assert (t4_tree.device_dir("0000:06:00.0") / uuid / "remove").read_text() == "1"
    with pytest.raises(DriverError, match="names no PCI address"):
        drv.release_attach_handle(AttachHandle("MDEV", {**old.attach_info, "parent": "../x"}))
