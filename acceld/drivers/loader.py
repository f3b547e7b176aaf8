"""Finding drivers by name: Python entry points in the ``acceld.drivers`` group.

Another package adds a driver by declaring an entry point in that group; the
agent (``[agent] enabled_drivers``) and ``acceld driver NAME`` load it by name.
"""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points

from oslo_config import cfg

from acceld.drivers.base import Driver

GROUP = "acceld.drivers"


# Upstream Cyborg's driver names (its ``cyborg.accelerator.driver`` entry points) -> the
# acceld driver for the same hardware, so that [agent] enabled_drivers from an upstream
# cyborg.conf loads unchanged (docs/drivers.md lists what each reports).
UPSTREAM_NAMES = {
    "fake_driver": "fake",
    "pci_driver": "pci",
    "nvidia_gpu_driver": "nvidia_gpu",
    "intel_fpga_driver": "intel_fpga",
    "xilinx_fpga_driver": "xilinx_fpga",
    "intel_qat_driver": "intel_qat",
    "inspur_nvme_ssd_driver": "nvme",
    "intel_nic_driver": "nic",
    "huawei_ascend_driver": "ascend",
}
# Upstream drivers without an acceld counterpart of their own: what to enable instead.
UPSTREAM_WITHOUT_EQUIVALENT = {
    "inspur_fpga_driver": "acceld's pci driver reports Inspur FPGAs: enable pci with "
                          "[pci_driver] device_spec = {\"vendor_id\": \"1bd4\", "
                          "\"resource_class\": \"FPGA\", \"traits\": "
                          "\"CUSTOM_FPGA_INSPUR\"}",
    "nvmf_spdk_driver": "upstream's SPDK driver does not run under upstream's own agent "
                        "either (it has no discover()); remove it",
}


class UnknownDriver(Exception):
    """No entry point of that name, or it does not load to a Driver subclass."""


def canonical_name(name: str) -> str:
    """acceld's name for driver ``name``: an upstream Cyborg name is translated, any other
    name (acceld's own, another package's entry point) is kept."""
    return UPSTREAM_NAMES.get(name.strip(), name.strip())


def enabled(conf: cfg.ConfigOpts) -> list[str]:
    """``[agent] enabled_drivers`` in acceld's names, each once (an upstream cyborg.conf's
    ``fake_driver`` and acceld's ``fake`` are one driver)."""
    return list(dict.fromkeys(canonical_name(name) for name in conf.agent.enabled_drivers))


@lru_cache(maxsize=1)
def _entry_points() -> tuple[EntryPoint, ...]:
    """The group's entry points, read once per process: scanning every installed
    distribution's metadata costs tens of milliseconds, and ``pci`` asks at each discovery
    about the other enabled drivers (acceld.drivers.claims). A name not found is looked
    up afresh (a package installed since)."""
    return tuple(entry_points(group=GROUP))


def available() -> list[str]:
    _entry_points.cache_clear()
    return sorted(ep.name for ep in _entry_points())


def driver_class(name: str) -> type[Driver]:
    if name in UPSTREAM_WITHOUT_EQUIVALENT:
        raise UnknownDriver(f"Upstream Cyborg's driver {name!r} has no acceld equivalent: "
                            f"{UPSTREAM_WITHOUT_EQUIVALENT[name]}")
    name = canonical_name(name)
    matches = [ep for ep in _entry_points() if ep.name == name]
    if not matches:
        _entry_points.cache_clear()
        matches = [ep for ep in _entry_points() if ep.name == name]
    if not matches:
        raise UnknownDriver(f"No driver named {name!r}; installed: {', '.join(available())}")
    try:
        cls = matches[0].load()
    except (ImportError, AttributeError) as exc:
        raise UnknownDriver(f"Driver {name!r} cannot be loaded: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Driver)):
        raise UnknownDriver(f"Entry point {name!r} is not an acceld Driver class")
    return cls


def load(name: str, conf: cfg.ConfigOpts, hostname: str) -> Driver:
    """An instance of driver ``name`` for this node."""
    return driver_class(name)(conf, hostname)
