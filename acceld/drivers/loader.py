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


class UnknownDriver(Exception):
    """No entry point of that name, or it does not load to a Driver subclass."""


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
