"""nvidia_gpu: discovery through NVML (a stand-in module) and through sysfs alone."""

from __future__ import annotations

import importlib

import pytest

from acceld.drivers.base import AttachHandle, DriverError, NotSupported, hardware_uuid
from acceld.drivers.nvidia_gpu import NvidiaGpuDriver, product_of, read_vgpu_types
from tests.conftest import make_conf
from tests.support.fake_pynvml import API_NAMES, FakeGpu, FakeMig, make_pynvml
from tests.support.sysfs_fixtures import SysfsTree

H200 = "0000:3b:00.0"
GIB = 1024 ** 3


def driver(tmp_path, tree: SysfsTree, nvml=None, **opts) -> NvidiaGpuDriver:
    overrides = {"nvidia_gpu__sysfs_root": str(tree.root)}
    overrides.update({f"nvidia_gpu__{k}": v for k, v in opts.items()})
    return NvidiaGpuDriver(make_conf(str(tmp_path), **overrides), "node1", nvml=nvml)


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
    assert traits(dep) == ["CUSTOM_NVIDIA_H200"]
    assert [(h.attach_type, h.attach_info) for h in dep.attach_handles] == [
        ("PCI", {"domain": "0000", "bus": "3b", "device": "00", "function": "0"})]
    # An id outside the product table falls back to the device id.
    assert traits(found["65:00.0"].deployables[0]) == ["CUSTOM_NVIDIA_2684"]


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
    records = by_address(driver(tmp_path, tree, nvml=nvml).discover())
    h200 = records["3b:00.0"]
    assert h200.model == "NVIDIA H200"
    info = h200.vendor_board_info
    assert info["discovered_by"] == "nvml"
    assert info["memory_mib"] == 141 * 1024
    assert info["driver_version"] == "570.86.15"
    assert info["gpu_uuid"] == "GPU-0e8f1c3a-5b7d-4c2e-9a1f-3d6b8e0c2a47"
    assert info["serial"] == "1654123456789"
    assert info["mig_mode"] == "disabled" and "mig_devices" not in info
    # Same uuid and same traits as the sysfs path: a node losing NVML keeps its inventory.
    assert h200.uuid == hardware_uuid("node1", "nvidia_gpu", H200)
    assert traits(h200.deployables[0]) == ["CUSTOM_NVIDIA_H200"]
    # The GeForce bound to vfio-pci is invisible to NVML but still reported from sysfs.
    assert records["65:00.0"].vendor_board_info["discovered_by"] == "sysfs"
    assert nvml.state["init_calls"] == 1 and nvml.state["shutdown_calls"] == 1


def test_nvml_and_sysfs_paths_agree_on_identity(tmp_path, tree):
    with_nvml = driver(tmp_path, tree, nvml=make_pynvml([h200_nvml()])).discover()
    without = driver(tmp_path, tree, use_nvml=False).discover()
    key = [(r.uuid, r.type, [(d.name, d.attributes["rc"], d.num_accelerators)
                             for d in r.deployables]) for r in with_nvml]
    assert key == [(r.uuid, r.type, [(d.name, d.attributes["rc"], d.num_accelerators)
                                     for d in r.deployables]) for r in without]


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


def test_unsupported_facts_are_left_out(tmp_path, tree):
    """A T4 has no MIG and may not report a serial: NotSupported loses only those facts."""
    tree.add_pci("0000:06:00.0", "0x10de", "0x1eb8", "0x030200", driver="nvidia")
    t4 = FakeGpu(bus_id="0000:06:00.0", device_id=0x1eb8, name="Tesla T4",
                 uuid="GPU-1", memory_total=15 * GIB)
    records = by_address(driver(tmp_path, tree, nvml=make_pynvml([t4])).discover())
    info = records["06:00.0"].vendor_board_info
    assert "serial" not in info and "mig_mode" not in info
    assert info["memory_mib"] == 15 * 1024
    assert traits(records["06:00.0"].deployables[0]) == ["CUSTOM_NVIDIA_T4"]


def test_nvml_only_gpu_is_reported(tmp_path):
    """A GPU NVML sees but the sysfs root lacks (e.g. a container's partial /sys)."""
    nvml = make_pynvml([FakeGpu(bus_id="0000:c1:00.0", device_id=0x26b9, name="NVIDIA L40S",
                                uuid="GPU-2", memory_total=45 * GIB)])
    [record] = driver(tmp_path, SysfsTree(tmp_path / "sys"), nvml=nvml).discover()
    assert record.model == "NVIDIA L40S"
    assert record.std_board_info == {"vendor_id": "0x10de", "product_id": "0x26b9"}
    assert traits(record.deployables[0]) == ["CUSTOM_NVIDIA_L40S"]


def test_mig_devices_are_reported_when_mig_is_enabled(tmp_path, tree):
    slots = [FakeMig("MIG-aaaa", 1, 0, 18 * GIB), None, FakeMig("MIG-bbbb", 2, 0, 35 * GIB),
             None, None, None, None]
    nvml = make_pynvml([h200_nvml(mig_mode=(1, 1), mig_slots=slots)])
    h200 = by_address(driver(tmp_path, tree, nvml=nvml).discover())["3b:00.0"]
    assert h200.vendor_board_info["mig_mode"] == "enabled"
    assert h200.vendor_board_info["mig_devices"] == [
        {"uuid": "MIG-aaaa", "gpu_instance_id": 1, "compute_instance_id": 0,
         "memory_mib": 18 * 1024},
        {"uuid": "MIG-bbbb", "gpu_instance_id": 2, "compute_instance_id": 0,
         "memory_mib": 35 * 1024}]
    assert traits(h200.deployables[0]) == ["CUSTOM_NVIDIA_H200", "CUSTOM_NVIDIA_MIG_ENABLED"]


def test_fake_pynvml_uses_the_real_module_names():
    try:
        real = importlib.import_module("pynvml")
    except ImportError:
        pytest.skip("nvidia-ml-py is not installed")
    assert [n for n in API_NAMES if not hasattr(real, n)] == []
    fake = make_pynvml([])
    assert fake.NVML_DEVICE_MIG_ENABLE == real.NVML_DEVICE_MIG_ENABLE
    # NVMLError(code) gives the per-code subclass in both.
    for name, code in (("NotSupported", 3), ("NotFound", 6), ("LibraryNotFound", 12)):
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
    assert traits(dep) == ["CUSTOM_NVIDIA_T4", "CUSTOM_VGPU_GRID_T4_2B"]
    assert (dep.attributes["vgpu_type"], dep.attributes["vgpu_name"]) == (
        "nvidia-223", "GRID T4-2B")
    assert {h.attach_type for h in dep.attach_handles} == {"MDEV"}
    uuids = [h.attach_info["uuid"] for h in dep.attach_handles]
    assert len(set(uuids)) == 8
    assert dep.attach_handles[0].attach_info == {
        "parent": "0000:06:00.0", "asked_type": "nvidia-223", "vgpu_mark": "nvidia-223_0",
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
        drv.prepare_attach_handle(AttachHandle("MDEV", {"parent": "0000:06:00.0",
                                                        "asked_type": "nvidia-223"}))


def test_mdev_type_without_mandatory_files_is_ignored(tmp_path, t4_tree):
    type_dir = t4_tree.device_dir("0000:06:00.0") / "mdev_supported_types" / "nvidia-223"
    (type_dir / "available_instances").unlink()
    [record] = driver(tmp_path, t4_tree, use_nvml=False,
                      enabled_vgpu_types=["nvidia-223"]).discover()
    assert [d.attributes["rc"] for d in record.deployables] == ["PGPU"]


def test_ampere_mdev_types_on_vfs(tmp_path):
    t = SysfsTree(tmp_path / "sys")
    t.add_pci("0000:41:00.0", "0x10de", "0x2235", "0x030200", driver="nvidia")
    vfs = [f"0000:41:00.{i}" for i in range(4, 8)]
    t.add_vfs("0000:41:00.0", vfs, "0x2235", driver="nvidia", total=32)
    for i, vf in enumerate(vfs):
        t.add_mdev_type(vf, "nvidia-558", "NVIDIA A40-2Q", 0 if i == 3 else 1)
    [record] = driver(tmp_path, t, use_nvml=False, enabled_vgpu_types=["nvidia-558"]).discover()
    [dep] = record.deployables  # VFs are not GPUs of their own
    assert dep.name == "0000:41:00.0_nvidia-558"
    assert [h.attach_info["parent"] for h in dep.attach_handles] == vfs[:3]
    assert traits(dep) == ["CUSTOM_NVIDIA_A40", "CUSTOM_VGPU_NVIDIA_A40_2Q"]


def test_full_gpu_offers_no_deployable(tmp_path, t4_tree):
    type_dir = t4_tree.device_dir("0000:06:00.0") / "mdev_supported_types" / "nvidia-223"
    (type_dir / "available_instances").write_text("0\n")
    [record] = driver(tmp_path, t4_tree, use_nvml=False,
                      enabled_vgpu_types=["nvidia-223"]).discover()
    assert record.deployables == [] and record.acc_specs["num"] == 0


# --- vGPU 17+ vendor-specific VFIO --------------------------------------------------


@pytest.fixture
def vfio_tree(tmp_path) -> SysfsTree:
    t = SysfsTree(tmp_path / "sys")
    t.add_pci("0000:41:00.0", "0x10de", "0x2335", "0x030200", driver="nvidia")
    vfs = [f"0000:41:00.{i}" for i in range(4, 7)]
    t.add_vfs("0000:41:00.0", vfs, "0x2335", driver="nvidia", total=16)
    types = {1414: "NVIDIA H200X-1-18C", 1428: "NVIDIA H200X-141C"}
    t.add_nvidia_vfio(vfs[0], types)
    t.add_nvidia_vfio(vfs[1], types)
    t.add_nvidia_vfio(vfs[2], {}, current=1428)  # full card: header only, runs another type
    return t


def test_vendor_vfio_types_are_offered_on_vfs(tmp_path, vfio_tree):
    drv = driver(tmp_path, vfio_tree, use_nvml=False, enabled_vgpu_types=["NVIDIA H200X-1-18C"])
    [record] = drv.discover()
    [dep] = record.deployables
    assert dep.name == "0000:41:00.0_NVIDIA_H200X-1-18C"
    assert dep.attributes["vgpu_kind"] == "vfio" and dep.attributes["rc"] == "VGPU"
    assert [h.attach_type for h in dep.attach_handles] == ["PCI", "PCI"]
    assert [h.attach_info["function"] for h in dep.attach_handles] == ["4", "5"]
    assert dep.attach_handles[0].attach_info["vgpu_type"] == "NVIDIA H200X-1-18C"


def test_vendor_vfio_prepare_and_release(tmp_path, vfio_tree):
    drv = driver(tmp_path, vfio_tree, use_nvml=False, enabled_vgpu_types=["NVIDIA H200X-1-18C"])
    handle = drv.discover()[0].deployables[0].attach_handles[0]
    current = vfio_tree.device_dir("0000:41:00.4") / "nvidia" / "current_vgpu_type"
    drv.prepare_attach_handle(handle)
    assert current.read_text() == "1414"
    drv.release_attach_handle(handle)
    assert current.read_text() == "0"


def test_vendor_vfio_busy_vf_refuses(tmp_path, vfio_tree):
    drv = driver(tmp_path, vfio_tree, use_nvml=False, enabled_vgpu_types=["NVIDIA H200X-1-18C"])
    handle = drv.discover()[0].deployables[0].attach_handles[1]
    (vfio_tree.device_dir("0000:41:00.5") / "nvidia" / "current_vgpu_type").write_text("1428\n")
    with pytest.raises(DriverError, match="already runs vGPU type id 1428"):
        drv.prepare_attach_handle(handle)
    (vfio_tree.device_dir("0000:41:00.5") / "nvidia" / "current_vgpu_type").unlink()
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


def test_product_names():
    assert product_of("0x2335", "NVIDIA H200") == "H200"
    assert product_of("0x9999", "NVIDIA H100 80GB HBM3") == "H100_80GB_HBM3"
    assert product_of("0x9999", "Tesla V100-SXM2-16GB") == "V100_SXM2_16GB"
    assert product_of("0x9999", None) == "9999"
