"""NVLink fabric state on HGX systems with NVSwitch (issue 27 item 9).

``nvmlDeviceGetGpuFabricInfo`` fills an ``nvmlGpuFabricInfo_t``: ``state`` (0 not
supported, 1 not started, 2 in progress, 3 completed), ``status`` (an nvmlReturn_t, to be
read once completed), ``clusterUuid`` (16 bytes) and ``cliqueId``. A PCIe board answers
NotSupported. Until the Fabric Manager has registered a GPU, CUDA refuses work on it.
"""

from __future__ import annotations

import uuid

import pytest

from tests.support.fake_pynvml import make_pynvml
from tests.support.sysfs_fixtures import SysfsTree
from tests.unit.test_driver_nvidia_gpu import H200, by_address, driver, h200_nvml, traits

CLUSTER = uuid.UUID("6a1e3f0c-2b4d-4e5f-8a9b-0c1d2e3f4a5b")


@pytest.fixture
def tree(tmp_path) -> SysfsTree:
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(H200, "0x10de", "0x2335", "0x030200", driver="nvidia", iommu_group=21)
    t.add_pci("0000:05:00.0", "0x10de", "0x22a3", "0x068000", driver="nvidia")  # NVSwitch
    return t


def record(tmp_path, tree, **gpu):
    drv = driver(tmp_path, tree, nvml=make_pynvml([h200_nvml(**gpu)]))
    return by_address(drv.discover())["3b:00.0"]


def test_a_registered_gpu_reports_its_clique_as_attribute_and_trait(tmp_path, tree):
    rec = record(tmp_path, tree, fabric=(3, 0, CLUSTER.bytes, 4))
    assert rec.acc_status == "ready"
    info = rec.vendor_board_info
    assert (info["fabric_state"], info["fabric_status"], info["fabric_clique_id"],
            info["fabric_cluster_uuid"]) == ("completed", "Success", 4, str(CLUSTER))
    assert traits(rec.deployables[0]) == ["CUSTOM_NVIDIA_2335", "CUSTOM_NVIDIA_H200",
                                          "CUSTOM_NVIDIA_FABRIC_CLIQUE_4"]


def test_a_cluster_uuid_with_zero_bytes_is_read_whole(tmp_path, tree):
    raw = b"\x00" * 8 + b"\x01" * 8
    rec = record(tmp_path, tree, fabric=(3, 0, raw, 0))
    assert rec.vendor_board_info["fabric_cluster_uuid"] == str(uuid.UUID(bytes=raw))


@pytest.mark.parametrize(("state", "word"), [(1, "not_started"), (2, "in_progress")])
def test_a_gpu_not_yet_registered_is_setup_required(tmp_path, tree, state, word):
    rec = record(tmp_path, tree, fabric=(state, 0, b"\x00" * 16, 0))
    assert rec.acc_status == "setup_required" and rec.deployables == []
    assert rec.status_reason.startswith(f"NVLink fabric not initialised (state {word})")
    assert "fabric_clique_id" not in rec.vendor_board_info


def test_a_failed_registration_is_setup_required_with_the_error(tmp_path, tree):
    rec = record(tmp_path, tree, fabric=(3, 10, CLUSTER.bytes, 4))  # NVML_ERROR_TIMEOUT
    assert rec.acc_status == "setup_required"
    assert rec.status_reason.startswith("NVLink fabric registration failed (Timeout)")


def test_a_pcie_board_has_no_fabric(tmp_path, tree):
    rec = record(tmp_path, tree)
    assert rec.acc_status == "ready"
    assert not any(k.startswith("fabric_") for k in rec.vendor_board_info)


def test_the_clique_trait_stays_while_nvml_is_away_and_across_restarts(tmp_path, tree):
    nvml = make_pynvml([h200_nvml(fabric=(3, 0, CLUSTER.bytes, 4))])
    before = by_address(driver(tmp_path, tree, nvml=nvml).discover())["3b:00.0"]
    away = by_address(driver(tmp_path, tree, use_nvml=False).discover())["3b:00.0"]
    assert away.deployables[0].attributes == before.deployables[0].attributes
    assert (tmp_path / "nvidia_gpu" / "remembered_ids.json").is_file()
