"""nvidia_gpu on NVML fakes answering what real H200 hosts answer (issue 27 items 4 and 6).

A GPU that fell off the bus: ``nvidia-smi`` prints ``Unable to determine the device handle
for GPU0000:3B:00.0: Unknown Error``; NVML still counts it, and its handle lookups (by index
and by bus id) raise ``NVMLError_Unknown`` (999). A GPU the container's cgroup denies
answers ``NoPermission`` (4) or is simply not found (``NotFound``, 6).

MIG: ``nvmlDeviceGetMigMode`` returns ``[current, pending]``; after ``nvidia-smi -i 0
-mig 1`` on a GPU in use the pending mode is 1 while the current one stays 0 until the
GPU is reset. GPU instances can exist without compute instances (``nvidia-smi mig -cgi
19`` without ``-C``): no MIG device handle shows them, ``nvmlDeviceGetGpuInstanceById``
does.
"""

from __future__ import annotations

import logging

import pytest

from tests.support.fake_pynvml import FakeMig, make_pynvml
from tests.unit.test_driver_nvidia_gpu import H200, by_address, driver, h200_nvml
from tests.support.sysfs_fixtures import SysfsTree

GIB = 1024 ** 3


@pytest.fixture
def tree(tmp_path) -> SysfsTree:
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(H200, "0x10de", "0x2335", "0x030200", driver="nvidia", revision="0xa1",
              iommu_group=21)
    t.add_module_version("nvidia", "550.54.15")
    return t


# --- item 4: a failing GPU is reported unhealthy, not dropped ------------------------------


def test_a_gpu_answering_unknown_error_is_reported_unhealthy(tmp_path, tree, caplog):
    caplog.set_level(logging.WARNING, logger="acceld.drivers.nvidia_nvml")
    drv = driver(tmp_path, tree, nvml=make_pynvml([h200_nvml(handle_error="Unknown")]))
    records = by_address(drv.discover())
    assert "3b:00.0" in records, "a failing GPU must not be taken for another container's"
    record = records["3b:00.0"]
    assert record.vendor_board_info["discovered_by"] == "sysfs"
    assert record.health["state"] == "unhealthy"
    assert record.health["reason"] == (
        "NVML cannot reach the GPU: Unknown (999: Unknown Error)")
    assert "NVML cannot reach 0000:3b:00.0: Unknown" in caplog.text
    drv.close()


@pytest.mark.parametrize("error", ["Unknown", "Timeout", "DriverNotLoaded"])
def test_every_error_but_not_found_and_no_permission_is_unhealthy(tmp_path, tree, error):
    drv = driver(tmp_path, tree, nvml=make_pynvml([h200_nvml(handle_error=error)]))
    health = by_address(drv.discover())["3b:00.0"].health
    assert health["state"] == "unhealthy" and error in health["reason"]
    drv.close()


@pytest.mark.parametrize("error", ["NoPermission", "NotFound"])
def test_no_permission_and_not_found_mean_another_container_s(tmp_path, tree, error):
    drv = driver(tmp_path, tree, nvml=make_pynvml([h200_nvml(handle_error=error)]))
    assert drv.discover() == []
    drv.close()


def test_a_lost_gpu_keeps_its_reason(tmp_path, tree):
    drv = driver(tmp_path, tree, nvml=make_pynvml([h200_nvml(lost=True, hidden=True)]))
    health = by_address(drv.discover())["3b:00.0"].health
    assert health["reason"] == "GPU lost from the bus (NVML: GPU is lost)"
    drv.close()


def test_a_gpu_enumeration_missed_but_its_bus_id_answers_is_read(tmp_path, tree):
    """Not enumerated, yet reachable by bus id: it is this node's, read through NVML."""
    drv = driver(tmp_path, tree, nvml=make_pynvml([h200_nvml(hidden=True)]))
    record = by_address(drv.discover())["3b:00.0"]
    assert record.vendor_board_info["discovered_by"] == "nvml"
    assert record.health["state"] == "healthy"
    drv.close()


# --- item 6: MIG state read completely ------------------------------------------------------


def test_gpu_instances_without_compute_instances_block_the_whole_gpu(tmp_path, tree):
    nvml = make_pynvml([h200_nvml(mig_mode=(1, 1), mig_slots=[None] * 7,
                                  gpu_instances={1: 19, 2: 14})])
    record = by_address(driver(tmp_path, tree, nvml=nvml).discover())["3b:00.0"]
    assert record.deployables == [] and record.acc_status == "setup_required"
    assert record.status_reason == ("not offered whole: 2 MIG GPU instance(s) exist on it "
                                    "(ids 1, 2)")
    assert record.vendor_board_info["mig_gpu_instances"] == [
        {"gpu_instance_id": 1, "profile_id": 19}, {"gpu_instance_id": 2, "profile_id": 14}]


def test_mig_enabled_with_no_instance_at_all_is_still_offered_whole(tmp_path, tree):
    nvml = make_pynvml([h200_nvml(mig_mode=(1, 1), mig_slots=[None] * 7)])
    record = by_address(driver(tmp_path, tree, nvml=nvml).discover())["3b:00.0"]
    assert record.acc_status == "ready" and record.deployables[0].attributes["rc"] == "PGPU"


@pytest.mark.parametrize(("mode", "now", "then"), [((0, 1), "disabled", "enabled"),
                                                   ((1, 0), "enabled", "disabled")])
def test_a_pending_mig_mode_change_is_reboot_required(tmp_path, tree, mode, now, then):
    slots = [FakeMig("MIG-aaaa", 1, 0, 18 * GIB)] + [None] * 6 if mode[0] == 1 else []
    nvml = make_pynvml([h200_nvml(mig_mode=mode, mig_slots=slots)])
    record = by_address(driver(tmp_path, tree, nvml=nvml).discover())["3b:00.0"]
    assert record.acc_status == "reboot_required" and record.deployables == []
    assert record.status_reason == (
        f"MIG mode is {now}, {then} at the next GPU reset (nvidia-smi -r -i {H200}, or a "
        "reboot): nothing offered until then")
    assert record.vendor_board_info["mig_mode"] == now
    assert record.vendor_board_info["mig_mode_pending"] == then


def test_no_pending_mode_no_pending_key(tmp_path, tree):
    nvml = make_pynvml([h200_nvml(mig_mode=(0, 0))])
    record = by_address(driver(tmp_path, tree, nvml=nvml).discover())["3b:00.0"]
    assert record.acc_status == "ready" and "mig_mode_pending" not in record.vendor_board_info
