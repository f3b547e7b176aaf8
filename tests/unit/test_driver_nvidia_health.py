"""nvidia_gpu health (issue 13): NVML critical XIDs, ECC, page retirement, row remapping,
a GPU lost from the bus, and PCIe AER beside them; on the stand-in pynvml."""

from __future__ import annotations

import pytest

from tests.support.fake_pynvml import make_pynvml
from tests.support.sysfs_fixtures import SysfsTree
from tests.unit.test_driver_nvidia_gpu import H200, by_address, driver, h200_nvml


@pytest.fixture
def tree(tmp_path) -> SysfsTree:
    t = SysfsTree(tmp_path / "sys")
    t.add_pci(H200, "0x10de", "0x2335", "0x030200", driver="nvidia", iommu_group=21)
    t.set_aer(H200)
    return t


def health_of(drv) -> dict:
    return by_address(drv.discover())["3b:00.0"].health


def test_a_well_gpu_is_healthy_with_its_counters(tmp_path, tree):
    gpu = h200_nvml(remapped_rows=(0, 0, 0, 0))
    drv = driver(tmp_path, tree, nvml=make_pynvml([gpu]))
    health = health_of(drv)
    assert (health["state"], health["reason"]) == ("healthy", None)
    assert health["counters"] == {
        "xid_critical": 0, "ecc_volatile_uncorrected": 0, "remapped_rows_correctable": 0,
        "remapped_rows_uncorrectable": 0, "row_remap_pending": 0, "row_remap_failure": 0,
        "retired_pages_pending": 0, "aer_fatal": 0, "aer_nonfatal": 0, "aer_correctable": 0}
    drv.close()


def test_a_critical_xid_makes_the_gpu_unhealthy_until_the_agent_restarts(tmp_path, tree):
    nvml = make_pynvml([h200_nvml()])
    drv = driver(tmp_path, tree, nvml=nvml)
    assert health_of(drv)["state"] == "healthy"  # registers for events
    nvml.emit_xid(H200, 79)
    health = health_of(drv)
    assert health["state"] == "unhealthy"
    assert health["reason"] == "critical XID 79 (GPU has fallen off the bus)"
    assert (health["counters"]["xid_critical"], health["counters"]["last_xid"]) == (1, 79)
    # Drained once, kept: a later discovery with no new event still says unhealthy.
    assert health_of(drv)["state"] == "unhealthy"
    nvml.emit_xid(H200, 48)
    health = health_of(drv)
    assert health["reason"] == ("critical XID 48 (double-bit ECC error), 2 critical XIDs since "
                                "the agent started")
    drv.close()
    assert nvml.state["initialised"] == 0 and nvml.state["event_sets"] == {}


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_are_ignored_as_nvidia_s_plugin_does(tmp_path, tree, xid):
    nvml = make_pynvml([h200_nvml()])
    drv = driver(tmp_path, tree, nvml=nvml)
    health_of(drv)
    nvml.emit_xid(H200, xid)
    assert health_of(drv)["state"] == "healthy"
    drv.close()


def test_ignored_xids_are_configurable(tmp_path, tree):
    nvml = make_pynvml([h200_nvml()])
    drv = driver(tmp_path, tree, nvml=nvml, ignored_xids=[79])
    health_of(drv)
    nvml.emit_xid(H200, 79)
    nvml.emit_xid(H200, 13)
    health = health_of(drv)
    assert health["reason"] == "critical XID 13" and health["counters"]["xid_critical"] == 1
    drv.close()


@pytest.mark.parametrize("facts,state,reason", [
    ({"ecc_volatile_uncorrected": 2}, "unhealthy",
     "2 uncorrectable (double-bit) ECC error(s) since the driver loaded"),
    ({"retired_pages_pending": 1}, "degraded",
     "page retirement pending (takes effect at the next GPU reset)"),
    ({"remapped_rows": (0, 1, 1, 0)}, "degraded",
     "row remapping pending (takes effect at the next GPU reset)"),
    ({"remapped_rows": (0, 8, 0, 1)}, "unhealthy", "row remapping failed (no spare rows left)"),
    # A board answering none of them (NotSupported) loses only those facts.
    ({"ecc_volatile_uncorrected": None, "retired_pages_pending": None}, "healthy", None),
])
def test_memory_error_facts(tmp_path, tree, facts, state, reason):
    drv = driver(tmp_path, tree, nvml=make_pynvml([h200_nvml(**facts)]))
    health = health_of(drv)
    assert (health["state"], health["reason"]) == (state, reason)
    drv.close()


def test_a_gpu_lost_from_the_bus_is_unhealthy(tmp_path, tree):
    """After XID 79 the GPU is no longer enumerated; looked up by its bus id NVML says lost."""
    drv = driver(tmp_path, tree, nvml=make_pynvml([h200_nvml(lost=True, hidden=True)]))
    health = health_of(drv)
    assert (health["state"], health["reason"]) == (
        "unhealthy", "GPU lost from the bus (NVML: GPU is lost)")
    drv.close()


def test_pcie_aer_and_nvml_health_combine_worst_first(tmp_path, tree):
    drv = driver(tmp_path, tree, nvml=make_pynvml([h200_nvml(retired_pages_pending=1)]))
    assert health_of(drv)["state"] == "degraded"
    tree.set_aer(H200, fatal=1)
    health = health_of(drv)
    assert health["state"] == "unhealthy"
    assert health["reason"].startswith("fatal PCIe (AER) errors on ")
    assert health["counters"]["retired_pages_pending"] == 1 and health["counters"]["aer_fatal"] == 1
    drv.close()


def test_without_nvml_health_comes_from_pcie_only(tmp_path, tree):
    drv = driver(tmp_path, tree, use_nvml=False)
    assert health_of(drv)["state"] == "healthy"  # AER counters read, nothing risen
    tree.set_aer(H200, nonfatal=3)
    assert health_of(drv)["state"] == "degraded"


def test_health_counters_do_not_change_the_node_report_identity(tmp_path, tree):
    """Only state and reason matter to 'changed'; a growing counter is just a counter."""
    from acceld.drivers.health import Health
    drv = driver(tmp_path, tree, nvml=make_pynvml([h200_nvml()]), use_nvml=False)
    tree.set_aer(H200, correctable=5)
    first = Health.from_dict(health_of(drv))
    tree.set_aer(H200, correctable=500)
    second = Health.from_dict(health_of(drv))
    assert (first.state, first.reason) == (second.state, second.reason) == ("healthy", None)
    assert second.counters["aer_correctable"] == 500


def test_without_event_sets_xids_are_not_watched_and_not_asked_again(tmp_path, tree, caplog):
    nvml = make_pynvml([h200_nvml()])

    def refuse():
        raise nvml.NVMLError(3)  # NotSupported

    nvml.nvmlEventSetCreate = refuse
    drv = driver(tmp_path, tree, nvml=nvml)
    for _ in range(3):
        assert health_of(drv)["state"] == "healthy"  # ECC and friends still judged
    assert [r.message for r in caplog.records].count(
        "nvidia_gpu: no NVML event set (Not Supported); XID events are not watched") == 1
    assert nvml.state["initialised"] == 0  # no reference kept
