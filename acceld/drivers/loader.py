"""Finding drivers by name: Python entry points in the ``acceld.drivers`` group.

Another package adds a driver by declaring an entry point in that group; the
agent (``[agent] enabled_drivers``) and ``acceld driver NAME`` load it by name.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from oslo_config import cfg

from acceld.drivers.base import Driver

GROUP = "acceld.drivers"


class UnknownDriver(Exception):
    """No entry point of that name, or it does not load to a Driver subclass."""


def available() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=GROUP))


def driver_class(name: str) -> type[Driver]:
    matches = [ep for ep in entry_points(group=GROUP) if ep.name == name]
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
