"""MIG under the unprivileged agent (issue 27 item 3).

NVML documents ``nvmlDeviceGetGpuInstanceById`` as requiring a privileged user: the
agent (user ``acceld``) gets ``NVMLError_NoPermission`` (4) for every id, while root, or
a process with CAP_SYS_ADMIN (which NVIDIA says holds every nvidia-capability), reads the
instances. The driver asks the privsep daemon (``acceld.privileged.read_gpu_instances``,
context ``privsep_nvml``); failing that it reads the MIG capability files every user may
read (``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<id>/access``: ids, no
profiles); failing that it says NoPermission, and never that no instance exists.
"""

from __future__ import annotations

import pytest

from acceld import privileged
from acceld.privileged import policy as privileged_policy
from acceld.privileged import NotAllowed
from tests.support.fake_pynvml import make_pynvml
from tests.support.sysfs_fixtures import SysfsTree
from tests.unit.test_driver_nvidia_gpu import (H200_PF, T1_18C, by_address, driver,
                                               h200_vfio_tree, h200_vgpu_nvml)

MIG_TYPE = ["NVIDIA H200X-1-18C"]
THREE_1G = {7: 19, 8: 19, 9: 19}


def mig_gpu(**kw):
    gpu = h200_vgpu_nvml(gi_needs_privilege=True, **kw)
    gpu.mig_mode = (1, 1)
    gpu.gpu_instances = dict(THREE_1G)
    return gpu


def mig_tree(tmp_path) -> SysfsTree:
    return h200_vfio_tree(tmp_path, creatable={T1_18C: "NVIDIA H200X-1-18C"})


@pytest.fixture(autouse=True)
def no_adopted(monkeypatch):
    monkeypatch.setattr(privileged_policy, "_adopted", {})


@pytest.fixture
def daemon_nvml(monkeypatch):
    """The privsep daemon's NVML: the same GPUs, seen by a privileged process."""
    def install(gpus):
        monkeypatch.setattr(privileged, "_nvml_module",
                            lambda: make_pynvml(gpus, privileged=True))
    return install


@pytest.fixture
def no_daemon_nvml(monkeypatch):
    def missing():
        raise ImportError("No module named 'pynvml'")
    monkeypatch.setattr(privileged, "_nvml_module", missing)


def record_of(drv):
    return by_address(drv.discover())["41:00.0"]


def test_gpu_instances_are_read_through_the_privsep_daemon(tmp_path, daemon_nvml):
    gpu = mig_gpu()
    daemon_nvml([gpu])
    drv = driver(tmp_path, mig_tree(tmp_path), nvml=make_pynvml([gpu]),
                 enabled_vgpu_types=MIG_TYPE)
    record = record_of(drv)
    assert record.acc_status == "ready", record.status_reason
    assert record.deployables[0].num_accelerators == 3
    info = record.vendor_board_info
    assert info["mig_gpu_instances_source"] == "privsep"
    assert info["mig_gpu_instances"] == [{"gpu_instance_id": i, "profile_id": 19}
                                         for i in (7, 8, 9)]
    assert "mig_gpu_instances_error" not in info


def test_without_the_daemon_the_capability_files_give_the_ids(tmp_path, no_daemon_nvml):
    proc = tmp_path / "proc"
    for gi in THREE_1G:
        access = proc / "driver" / "nvidia" / "capabilities" / "gpu0" / "mig" / f"gi{gi}"
        access.mkdir(parents=True)
        (access / "access").write_text("DeviceFileMinor: 12\nDeviceFileMode: 292\n")
    gpu = mig_gpu()
    tree = mig_tree(tmp_path)
    drv = driver(tmp_path, tree, nvml=make_pynvml([gpu]), enabled_vgpu_types=MIG_TYPE,
                 proc_root=str(proc))
    record = record_of(drv)
    # The profiles stay unknown: a MIG-backed type is not guessed, and the reason says
    # NoPermission, not "none exist".
    assert record.acc_status == "setup_required"
    assert "none exist" not in record.status_reason
    assert "NoPermission (4: Insufficient Permissions)" in record.status_reason
    info = record.vendor_board_info
    assert info["mig_gpu_instances_source"] == "capabilities"
    assert [g["gpu_instance_id"] for g in info["mig_gpu_instances"]] == [7, 8, 9]
    assert info["mig_gpu_instances_error"] == "NoPermission (4: Insufficient Permissions)"
    # Offered whole? Never while GPU instances exist.
    drv = driver(tmp_path, tree, nvml=make_pynvml([gpu]), proc_root=str(proc))
    record = record_of(drv)
    assert record.deployables == [] and "3 MIG GPU instance(s)" in record.status_reason


def test_when_nothing_can_read_them_no_permission_is_reported(tmp_path, no_daemon_nvml):
    gpu = mig_gpu()
    drv = driver(tmp_path, mig_tree(tmp_path), nvml=make_pynvml([gpu]),
                 proc_root=str(tmp_path / "no-proc"))
    record = record_of(drv)
    assert record.deployables == [] and record.acc_status == "setup_required"
    assert record.status_reason.startswith(
        "not offered whole: its MIG GPU instances cannot be read (NVML: NoPermission")
    assert record.vendor_board_info["mig_gpu_instances_error"].startswith("NoPermission")


def test_a_privileged_agent_reads_them_itself(tmp_path, monkeypatch):
    def never():
        raise AssertionError("no privileged read needed")
    monkeypatch.setattr(privileged, "_nvml_module", never)
    gpu = mig_gpu()
    drv = driver(tmp_path, mig_tree(tmp_path), nvml=make_pynvml([gpu], privileged=True),
                 enabled_vgpu_types=MIG_TYPE)
    record = record_of(drv)
    assert record.acc_status == "ready"
    assert record.vendor_board_info["mig_gpu_instances_source"] == "nvml"


# --- the privileged entry point reads GPUs and nothing else --------------------------------


@pytest.fixture
def policy_tree(tmp_path, monkeypatch, daemon_nvml):
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci(H200_PF, "0x10de", "0x2335", "0x030200", driver="nvidia")
    tree.add_pci("0000:05:00.0", "0x10de", "0x22a3", "0x068000", driver="nvidia")  # NVSwitch
    tree.add_pci("0000:5e:00.0", "0x8086", "0x1572", "0x020000", driver="i40e")
    from tests.conftest import make_conf
    privileged_policy.adopt(make_conf(str(tmp_path), nvidia_gpu__sysfs_root=str(tree.root)),
                            "nvidia_gpu")
    gpu = mig_gpu()
    daemon_nvml([gpu])
    return tree


def test_the_entry_point_reads_a_gpu_s_instances(policy_tree):
    assert privileged.read_gpu_instances(H200_PF) == [[7, 19], [8, 19], [9, 19]]


@pytest.mark.parametrize("address", [
    "0000:05:00.0",  # an NVSwitch: NVIDIA, not a GPU
    "0000:5e:00.0",  # a NIC
    "0000:99:00.0",  # nothing there
    "../../../etc/passwd", "0000:41:00.0/../../x", "", 41, None])
def test_the_entry_point_refuses_everything_but_a_gpu(policy_tree, address):
    with pytest.raises(NotAllowed):
        privileged.read_gpu_instances(address)


def test_an_nvml_refusal_in_the_daemon_comes_back_by_name(policy_tree, monkeypatch):
    gpu = mig_gpu()
    monkeypatch.setattr(privileged, "_nvml_module", lambda: make_pynvml([gpu]))
    with pytest.raises(RuntimeError, match=r"NVML: NoPermission \(4: Insufficient"):
        privileged.read_gpu_instances(H200_PF)
