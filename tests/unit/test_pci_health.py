"""PCIe health (AER counters, link training) on fixture sysfs trees shaped like the kernel's."""

from acceld.drivers.health import DEGRADED, HEALTHY, UNHEALTHY, UNKNOWN
from acceld.drivers.pci_health import (PciHealthMonitor, link_health, parse_link_speed,
                                       read_aer_total)
from tests.support.sysfs_fixtures import SysfsTree

GPU = "0000:41:00.0"
PORT = "0000:40:01.0"


def tree_with_gpu(tmp_path, *, port_speed="32.0 GT/s PCIe", port_width=16) -> SysfsTree:
    tree = SysfsTree(tmp_path / "sys")
    tree.add_root_port(PORT, max_speed=port_speed, max_width=port_width)
    tree.add_pci(GPU, "0x10de", "0x2335", "0x030200", driver="vfio-pci", bridge=PORT)
    tree.set_aer(GPU)
    tree.set_link(GPU, speed="32.0 GT/s PCIe", max_speed="32.0 GT/s PCIe")
    return tree


def path(tree, address=GPU):
    return str(tree.root / "bus" / "pci" / "devices" / address)


def test_fixture_nests_the_gpu_under_its_root_port(tmp_path):
    tree = tree_with_gpu(tmp_path)
    assert tree.device_dir(GPU).parent == tree.device_dir(PORT)
    assert tree.device_dir(PORT).parent.name == "pci0000:40"


def test_quiet_device_is_healthy_with_counters(tmp_path):
    tree = tree_with_gpu(tmp_path)
    health = PciHealthMonitor().check(GPU, path(tree))
    assert health.state == HEALTHY and health.reason is None
    assert health.counters == {"aer_fatal": 0, "aer_nonfatal": 0, "aer_correctable": 0}


def test_errors_before_the_agent_saw_the_device_do_not_count(tmp_path):
    tree = tree_with_gpu(tmp_path)
    tree.set_aer(GPU, fatal=2, nonfatal=5, correctable=100)
    health = PciHealthMonitor().check(GPU, path(tree))
    assert health.state == HEALTHY
    assert health.counters["aer_fatal"] == 2


def test_a_rise_in_fatal_errors_is_unhealthy(tmp_path):
    tree = tree_with_gpu(tmp_path)
    monitor = PciHealthMonitor()
    assert monitor.check(GPU, path(tree)).state == HEALTHY
    tree.set_aer(GPU, fatal=1, nonfatal=3)
    health = monitor.check(GPU, path(tree))
    assert health.state == UNHEALTHY
    assert health.reason == f"fatal PCIe (AER) errors on {GPU} since the agent first saw it"
    # It stays so: the errors happened. More errors change the counters, not the reason.
    tree.set_aer(GPU, fatal=7, nonfatal=3)
    again = monitor.check(GPU, path(tree))
    assert (again.state, again.reason) == (UNHEALTHY, health.reason)
    assert again.counters["aer_fatal"] == 7


def test_a_rise_in_nonfatal_errors_is_degraded(tmp_path):
    tree = tree_with_gpu(tmp_path)
    monitor = PciHealthMonitor()
    monitor.check(GPU, path(tree))
    tree.set_aer(GPU, nonfatal=2)
    health = monitor.check(GPU, path(tree))
    assert health.state == DEGRADED and health.reason.startswith("non-fatal PCIe (AER)")


def test_correctable_errors_are_only_counted(tmp_path):
    tree = tree_with_gpu(tmp_path)
    monitor = PciHealthMonitor()
    monitor.check(GPU, path(tree))
    tree.set_aer(GPU, correctable=5000)
    health = monitor.check(GPU, path(tree))
    assert health.state == HEALTHY and health.counters["aer_correctable"] == 5000


def test_counts_that_restart_become_the_new_start(tmp_path):
    """A removed and rescanned device starts its counts at zero again."""
    tree = tree_with_gpu(tmp_path)
    tree.set_aer(GPU, fatal=4)
    monitor = PciHealthMonitor()
    monitor.check(GPU, path(tree))
    tree.set_aer(GPU, fatal=0)
    assert monitor.check(GPU, path(tree)).state == HEALTHY
    tree.set_aer(GPU, fatal=1)
    assert monitor.check(GPU, path(tree)).state == UNHEALTHY


def test_forgotten_device_starts_afresh(tmp_path):
    tree = tree_with_gpu(tmp_path)
    monitor = PciHealthMonitor()
    monitor.check(GPU, path(tree))
    tree.set_aer(GPU, fatal=1)
    monitor.forget(set())
    assert monitor.check(GPU, path(tree)).state == HEALTHY


def test_link_below_its_width_is_degraded(tmp_path):
    tree = tree_with_gpu(tmp_path)
    tree.set_link(GPU, speed="32.0 GT/s PCIe", max_speed="32.0 GT/s PCIe", width=8)
    health = PciHealthMonitor().check(GPU, path(tree))
    assert health.state == DEGRADED and "x8, below its maximum x16" in health.reason


def test_link_below_its_speed_is_degraded_unless_speed_is_not_judged(tmp_path):
    tree = tree_with_gpu(tmp_path)
    tree.set_link(GPU, speed="2.5 GT/s PCIe", max_speed="32.0 GT/s PCIe")
    health = link_health(path(tree))
    assert health.state == DEGRADED and "2.5 GT/s" in health.reason
    # GPUs drop their link speed while idle: their callers judge the width only.
    assert link_health(path(tree), judge_speed=False).state == HEALTHY


def test_a_gen5_card_in_a_gen4_slot_is_not_degraded(tmp_path):
    tree = tree_with_gpu(tmp_path, port_speed="16.0 GT/s PCIe", port_width=8)
    tree.set_link(GPU, speed="16.0 GT/s PCIe", max_speed="32.0 GT/s PCIe", width=8)
    assert link_health(path(tree)).state == HEALTHY


def test_no_aer_and_no_link_is_unknown(tmp_path):
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci("0000:00:03.0", "0x1af4", "0x1041", "0x020000", driver="virtio-pci")
    tree.set_link("0000:00:03.0", speed="Unknown", max_speed="Unknown", width=0, max_width=0)
    health = PciHealthMonitor().check("0000:00:03.0", path(tree, "0000:00:03.0"))
    assert health.state == UNKNOWN and health.counters == {}


def test_pf_and_vfs_are_summed_and_the_worst_wins(tmp_path):
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci("0000:6b:00.0", "0x8086", "0x4940", "0x0b4000", driver="4xxx")
    tree.add_vfs("0000:6b:00.0", ["0000:6b:00.1"], "0x4941", driver="vfio-pci")
    tree.set_aer("0000:6b:00.0", correctable=1)
    tree.set_aer("0000:6b:00.1", correctable=2)
    monitor = PciHealthMonitor()
    functions = [(a, path(tree, a)) for a in ("0000:6b:00.0", "0000:6b:00.1")]
    assert monitor.check_many(functions).counters["aer_correctable"] == 3
    tree.set_aer("0000:6b:00.1", fatal=1)
    health = monitor.check_many(functions)
    assert health.state == UNHEALTHY and "0000:6b:00.1" in health.reason


def test_parsers_accept_old_and_new_kernel_forms(tmp_path):
    assert parse_link_speed("8 GT/s") == 8.0
    assert parse_link_speed("16.0 GT/s PCIe") == 16.0
    assert parse_link_speed("Unknown") is None
    old = tmp_path / "aer_dev_fatal"
    old.write_text("Undefined 0\nDLP 2\nSDES 1\n")  # no TOTAL line: the bits are summed
    assert read_aer_total(str(old), "TOTAL_ERR_FATAL") == 3
    assert read_aer_total(str(tmp_path / "missing"), "TOTAL_ERR_FATAL") is None
