"""acceld started from upstream Cyborg's cyborg.conf (kolla-ansible's and devstack's, in
tests/support/upstream_conf/): renamed options through their aliases, upstream's driver
names, Keystone implied, the options acceld does not use named in one warning, upstream's
policy.yaml enforced, and a failure at start on stderr as well as in the log file."""

from __future__ import annotations

import logging
import shutil
import string
import subprocess
import sys
from pathlib import Path

import pytest
from oslo_config import cfg

from acceld import config, upstream_conf
from acceld.api import errors
from acceld.api.context import RequestContext
from acceld.api.policy import Policy
from acceld.drivers import loader

FIXTURES = Path(__file__).resolve().parents[1] / "support" / "upstream_conf"


def render(name: str, directory: Path, **values: object) -> Path:
    """Fixture ``name`` with its $-names filled in, written into ``directory`` beside
    upstream's policy.yaml."""
    defaults = {"log_dir": directory / "log", "host": "compute-01", "api_port": 6666,
                "keystone_url": "http://127.0.0.1:5000", "state_path": directory / "state"}
    text = string.Template((FIXTURES / name).read_text()).substitute({**defaults, **values})
    path = directory / "cyborg.conf"
    path.write_text(text)
    shutil.copy(FIXTURES / "policy.yaml", directory / "policy.yaml")
    return path


def load(path: Path) -> cfg.ConfigOpts:
    return config.load(config_files=[str(path)], conf=cfg.ConfigOpts())


def test_kolla_options_reach_acceld_through_their_aliases(tmp_path) -> None:
    conf = load(render("kolla-cyborg.conf", tmp_path))
    assert conf.api.workers == 2  # [api] api_workers
    assert conf.database.pool_size == 3  # [database] max_pool_size (oslo.db's name)
    assert conf.api.port == 6666 and conf.host == "compute-01"
    assert loader.enabled(conf) == ["fake"]  # fake_driver
    assert conf.auth_strategy == "keystone"  # upstream always validates tokens


def test_devstack_options_reach_acceld_through_their_aliases(tmp_path) -> None:
    conf = load(render("devstack-cyborg.conf", tmp_path))
    assert conf.api.workers == 2
    assert conf.auth_strategy == "keystone"
    assert conf.pci_driver.device_spec == ['{"vendor_id": "10de", "product_id": "1eb8"}']
    assert conf.state_path == str(tmp_path / "state")


def test_other_renamed_options(tmp_path) -> None:
    path = tmp_path / "cyborg.conf"
    path.write_text("[DEFAULT]\nbind_timeout = 120\n"
                    "[x710_static]\nphysical_device_mappings = physnet1:enp94s0f0|enp94s0f1\n"
                    "function_device_mappings = GTPv1:enp94s0f0\n")
    conf = load(path)
    assert conf.conductor.bind_timeout == 120
    assert conf.nic.physical_device_mappings == ["physnet1:enp94s0f0|enp94s0f1"]
    assert conf.nic.function_device_mappings == ["GTPv1:enp94s0f0"]


def test_acceld_names_win_and_stay_the_default(tmp_path) -> None:
    path = tmp_path / "acceld.conf"
    path.write_text("[api]\nworkers = 4\n")
    conf = load(path)
    assert conf.api.workers == 4
    assert conf.auth_strategy == "noauth"  # no [keystone_authtoken]: acceld's default


def test_an_explicit_auth_strategy_is_kept(tmp_path) -> None:
    path = render("kolla-cyborg.conf", tmp_path)
    path.write_text(path.read_text().replace("[DEFAULT]\n", "[DEFAULT]\nauth_strategy = noauth\n"))
    assert load(path).auth_strategy == "noauth"


def test_upstream_driver_names_map_to_acceld_drivers() -> None:
    expected = {"fake_driver": "fake", "pci_driver": "pci", "nvidia_gpu_driver": "nvidia_gpu",
                "intel_fpga_driver": "intel_fpga", "xilinx_fpga_driver": "xilinx_fpga",
                "intel_qat_driver": "intel_qat", "inspur_nvme_ssd_driver": "nvme",
                "intel_nic_driver": "nic", "huawei_ascend_driver": "ascend"}
    for upstream, ours in expected.items():
        assert loader.driver_class(upstream) is loader.driver_class(ours)
    # Every upstream 17 entry point is either mapped or refused with what to do instead.
    upstream_17 = set(expected) | {"inspur_fpga_driver", "nvmf_spdk_driver"}
    assert upstream_17 == set(loader.UPSTREAM_NAMES) | set(loader.UPSTREAM_WITHOUT_EQUIVALENT)
    with pytest.raises(loader.UnknownDriver, match="pci driver reports Inspur FPGAs"):
        loader.driver_class("inspur_fpga_driver")


def test_enabled_drivers_are_canonical_and_once(tmp_path) -> None:
    path = tmp_path / "cyborg.conf"
    path.write_text("[agent]\nenabled_drivers = fake_driver, pci_driver, fake\n")
    assert loader.enabled(load(path)) == ["fake", "pci"]


def test_pci_does_not_take_itself_for_another_driver_under_its_upstream_name(tmp_path) -> None:
    """claims.claimed_by_others skips the asking driver: under upstream's name pci_driver
    it would otherwise claim every function it reports itself, and report nothing."""
    from acceld.drivers import claims
    from acceld.drivers.sysfs import PciFunction

    path = tmp_path / "cyborg.conf"
    path.write_text("[agent]\nenabled_drivers = pci_driver\n")
    function = PciFunction(address="0000:3b:00.0", path="/sys/bus/pci/devices/0000:3b:00.0",
                           vendor="0x10de", device="0x1eb8", class_code=0x0302)
    assert claims.claimed_by_others(load(path), "pci", [function]) == {}


KOLLA_UNUSED = [
    "[DEFAULT] transport_url (acceld uses no message broker)",
    "[database] connection_recycle_time", "[database] max_retries",
    "[gpu_devices]", "[oslo_concurrency]", "[oslo_messaging_notifications]",
    "[oslo_messaging_rabbit]", "[vgpu_nvidia-35]",
]


def test_unused_upstream_options_are_named(tmp_path) -> None:
    conf = load(render("kolla-cyborg.conf", tmp_path))
    assert upstream_conf.unused(conf) == KOLLA_UNUSED
    conf = load(render("devstack-cyborg.conf", tmp_path))
    names = upstream_conf.unused(conf)
    assert "[DEFAULT] periodic_interval" in names
    assert ("[agent] resource_provider_name (acceld finds the compute node's provider by "
            "[DEFAULT] host)") in names
    assert any(name.startswith("[service_user] (acceld sends Nova") for name in names)
    # What acceld reads, directly or through an alias, is not named.
    assert not [n for n in names if "api_workers" in n or "passthrough_whitelist" in n
                or "logging_" in n or "enabled_drivers" in n or "[keystone_authtoken]" in n]


def test_the_unused_options_are_one_warning(tmp_path, caplog) -> None:
    conf = load(render("kolla-cyborg.conf", tmp_path))
    with caplog.at_level(logging.WARNING, logger="acceld.upstream_conf"):
        upstream_conf.warn_unused(conf)
    warnings = [r for r in caplog.records if r.name == "acceld.upstream_conf"]
    assert len(warnings) == 1
    assert all(name in warnings[0].getMessage() for name in KOLLA_UNUSED)


def test_an_acceld_conf_gets_no_warning(tmp_path, caplog) -> None:
    path = tmp_path / "acceld.conf"
    path.write_text("[DEFAULT]\ndebug = True\n[api]\nworkers = 3\n[agent]\nenabled_drivers = fake\n"
                    "[keystone_authtoken]\nauth_type = password\nusername = acceld\n")
    assert upstream_conf.unused(load(path)) == []


def test_upstream_policy_yaml_is_enforced(tmp_path) -> None:
    """The policy.yaml beside an upstream cyborg.conf ([oslo_policy] policy_file =
    policy.yaml), in upstream's rule names, overrides acceld's defaults."""
    policy = Policy(load(render("kolla-cyborg.conf", tmp_path)))
    member = RequestContext(user_id="u", project_id="p1", roles=["member", "reader"])
    admin = RequestContext(user_id="a", project_id="p1", roles=["admin", "member", "reader"])
    reader = RequestContext(user_id="r", project_id="p1", roles=["reader"])
    with pytest.raises(errors.Forbidden):  # acceld's default lets a project member create
        policy.authorize("cyborg:device_profile:create", member)
    policy.authorize("cyborg:device_profile:create", admin)
    policy.authorize("cyborg:arq:get_all", reader, {"project_id": "p1"})
    with pytest.raises(errors.Forbidden):
        policy.authorize("cyborg:arq:get_all", reader, {"project_id": "p2"})


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "acceld.cmd.main", *args], capture_output=True,
                          text=True, timeout=60)


def test_a_failure_at_start_reaches_stderr_and_the_log_file(tmp_path) -> None:
    """With log_dir set, the agent that cannot load a driver said nothing on stderr and
    exited 1: now one line there, and the traceback in the log file."""
    (tmp_path / "log").mkdir()
    path = tmp_path / "cyborg.conf"
    path.write_text(f"[DEFAULT]\nlog_dir = {tmp_path / 'log'}\nstate_path = {tmp_path}\n"
                    f"[internal]\nnode_key = {'ab' * 32}\n"
                    "[agent]\nenabled_drivers = fake_driver,no_such_driver\nport = 0\n")
    done = run_cli("agent", "--config-file", str(path))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    log = (tmp_path / "log" / "acceld-agent.log").read_text()  # as cyborg-agent.log
    assert lines == [f"acceld agent: failed: UnknownDriver: No driver named 'no_such_driver'; "
                     f"installed: {', '.join(loader.available())} "
                     f"(traceback in {tmp_path / 'log' / 'acceld-agent.log'})"]
    assert "Traceback" in log and "No driver named 'no_such_driver'" in log


def test_a_refusal_at_start_reaches_the_log_file_too(tmp_path) -> None:
    """A service refusing to start (SystemExit with its reason: here no node key) printed
    it on stderr only."""
    (tmp_path / "log").mkdir()
    path = tmp_path / "cyborg.conf"
    path.write_text(f"[DEFAULT]\nlog_dir = {tmp_path / 'log'}\nstate_path = {tmp_path}\n"
                    "host = cn-9\n[agent]\nenabled_drivers = fake_driver\nport = 0\n")
    done = run_cli("agent", "--config-file", str(path))
    assert done.returncode == 1
    assert done.stderr.strip().startswith("acceld agent: No key for node cn-9")
    assert "No key for node cn-9" in (tmp_path / "log" / "acceld-agent.log").read_text()


def test_a_bad_value_is_one_line(tmp_path) -> None:
    path = tmp_path / "cyborg.conf"
    path.write_text(f"[DEFAULT]\nstate_path = {tmp_path}\n[internal]\nnode_key = {'ab' * 32}\n"
                    "[agent]\nport = 0\nheartbeat_interval = often\n")
    done = run_cli("agent", "--config-file", str(path))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "heartbeat_interval" in done.stderr and "'often'" in done.stderr
