"""PCIe health every PCI-based driver reports: AER error counters and link training.

Two sources, both plain sysfs (``Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats``
and ``sysfs-bus-pci``):

- AER counters ``aer_dev_fatal``, ``aer_dev_nonfatal`` and ``aer_dev_correctable``: one
  ``<Name> <count>`` line per error bit and a ``TOTAL_ERR_*`` line. The counts grow from
  boot, so a device is judged by what happened *since the agent first saw it*: a rise in
  fatal errors is ``unhealthy``, in non-fatal errors ``degraded``. Correctable errors are
  corrected by the link itself; they are only counted (operators see them, nothing reacts).
- Link training: a link running below what both ends support (``current_link_speed`` vs
  ``max_link_speed``, ``current_link_width`` vs ``max_link_width``, the upstream port's
  maximum taken into account so a Gen4 card in a Gen3 slot is not flagged) is ``degraded``:
  a reseated card, a bad riser or a dirty connector. GPUs lower their link speed on their
  own while idle, so callers that drive such devices can judge the width only.

Counters are reported but never decide "changed" by themselves (see acceld.drivers.health).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass

from acceld.drivers import sysfs
from acceld.drivers.health import DEGRADED, HEALTHY, UNHEALTHY, UNKNOWN, Health, worst

# counter name in the health record -> (sysfs file, its total line)
AER_FILES = {
    "aer_fatal": ("aer_dev_fatal", "TOTAL_ERR_FATAL"),
    "aer_nonfatal": ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
    "aer_correctable": ("aer_dev_correctable", "TOTAL_ERR_COR"),
}
_SPEED_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")


def read_aer_total(path: str, total_name: str) -> int | None:
    """The total of one ``aer_dev_*`` file: its ``TOTAL_ERR_*`` line, else the sum of the
    per-bit lines (older kernels); None when the file is absent (no AER capability)."""
    text = sysfs.read_attr(path)
    if text is None:
        return None
    total = 0
    for line in text.splitlines():
        name, _, count = line.strip().rpartition(" ")
        if not count.isdigit():
            continue
        if name.strip() == total_name:
            return int(count)
        total += int(count)
    return total


def read_aer_counts(device_path: str) -> dict[str, int]:
    """Counter name -> total for each AER file the device has."""
    counts = {}
    for counter, (filename, total_name) in AER_FILES.items():
        value = read_aer_total(os.path.join(device_path, filename), total_name)
        if value is not None:
            counts[counter] = value
    return counts


def parse_link_speed(text: str | None) -> float | None:
    """'16.0 GT/s PCIe' (or '8 GT/s') -> 16.0; None for 'Unknown' or anything else."""
    match = _SPEED_RE.match(text or "")
    return float(match.group(1)) if match else None


def parse_link_width(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class LinkState:
    """What the link runs at and the most both of its ends could train to."""

    speed: float | None
    max_speed: float | None
    width: int | None
    max_width: int | None


def read_link(device_path: str) -> LinkState:
    """The link of a device, capped by its upstream port's maximum when that is a PCI
    function (the parent directory of the device's real path)."""
    real = os.path.realpath(device_path)
    speed = parse_link_speed(sysfs.read_attr(os.path.join(real, "current_link_speed")))
    max_speed = parse_link_speed(sysfs.read_attr(os.path.join(real, "max_link_speed")))
    width = parse_link_width(sysfs.read_attr(os.path.join(real, "current_link_width")))
    max_width = parse_link_width(sysfs.read_attr(os.path.join(real, "max_link_width")))
    parent = os.path.dirname(real)
    if sysfs.is_pci_address(os.path.basename(parent)):
        port_speed = parse_link_speed(sysfs.read_attr(os.path.join(parent, "max_link_speed")))
        port_width = parse_link_width(sysfs.read_attr(os.path.join(parent, "max_link_width")))
        if max_speed is not None and port_speed is not None:
            max_speed = min(max_speed, port_speed)
        if max_width is not None and port_width:
            max_width = min(max_width, port_width)
    return LinkState(speed, max_speed, width, max_width)


# Base class 0x03 (display: VGA 0x0300, 3D 0x0302, other 0x0380): GPUs drop their link to
# 2.5 GT/s when idle and raise it under load, so a slow link is not a fault there. Their
# width does not change with load: a narrower link than the slot allows is.
_SPEED_VARIES_WITH_LOAD = frozenset({0x03})


def judges_link_speed(class_code: int) -> bool:
    """Whether a function's link speed tells its health (24-bit class code): not for
    display and 3D controllers, whose speed follows the load; for every other class."""
    return (class_code >> 16) not in _SPEED_VARIES_WITH_LOAD


def link_health(device_path: str, *, judge_speed: bool = True) -> Health:
    """``degraded`` when the link trained below its maximum speed (if judged) or width;
    ``unknown`` when sysfs shows no link figures (a VF, a virtual device)."""
    link = read_link(device_path)
    problems = []
    judged = False
    if judge_speed and link.speed is not None and link.max_speed is not None:
        judged = True
        if link.speed < link.max_speed:
            problems.append(f"PCIe link at {link.speed:g} GT/s, below its maximum "
                            f"{link.max_speed:g} GT/s")
    if link.width is not None and link.max_width:
        judged = True
        if link.width < link.max_width:
            problems.append(f"PCIe link at x{link.width}, below its maximum x{link.max_width}")
    if problems:
        return Health(DEGRADED, "; ".join(problems))
    return Health(HEALTHY) if judged else Health(UNKNOWN)


class PciHealthMonitor:
    """Judges PCI functions' health; remembers each one's AER counts when first seen.

    One per driver instance (the agent keeps its drivers for its lifetime). A count lower
    than the remembered one means the device was removed and re-created (counts restart
    at zero): the lower count becomes the new starting point.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first_seen: dict[str, dict[str, int]] = {}

    def aer_health(self, address: str, device_path: str) -> Health:
        counts = read_aer_counts(device_path)
        if not counts:
            return Health(UNKNOWN)
        with self._lock:
            base = self._first_seen.setdefault(address, dict(counts))
            for name, value in counts.items():
                if value < base.get(name, value) or name not in base:
                    base[name] = value
            rises = {name: counts[name] - base[name] for name in counts}
        counters = dict(counts)
        # The reason names no count: a reason that changed with every new error would make
        # each heartbeat a changed report (the counts are in the counters).
        if rises.get("aer_fatal", 0) > 0:
            return Health(UNHEALTHY, f"fatal PCIe (AER) errors on {address} since the agent "
                                     f"first saw it", counters)
        if rises.get("aer_nonfatal", 0) > 0:
            return Health(DEGRADED, f"non-fatal PCIe (AER) errors on {address} since the agent "
                                    f"first saw it", counters)
        return Health(HEALTHY, None, counters)

    def check(self, address: str, device_path: str, *, link: bool = True,
              judge_speed: bool = True) -> Health:
        """AER and (unless ``link`` is false, as for a VF) link health of one function."""
        sources = [self.aer_health(address, device_path)]
        if link:
            sources.append(link_health(device_path, judge_speed=judge_speed))
        return worst(*sources)

    def check_many(self, functions: list[tuple[str, str]], *,
                   judge_speed: bool = True) -> Health:
        """A device made of several functions (a PF and its VFs): the first is the device
        itself (link judged), the rest are judged by their AER counts only. Counters are
        the sums over all functions."""
        if not functions:
            return Health(UNKNOWN)
        first, *rest = functions
        healths = [self.check(first[0], first[1], judge_speed=judge_speed)]
        healths += [self.check(address, path, link=False) for address, path in rest]
        combined = worst(*healths)
        totals: dict[str, int] = {}
        for health in healths:
            for name, value in health.counters.items():
                totals[name] = totals.get(name, 0) + value
        combined.counters = totals
        return combined

    def forget(self, addresses: set[str]) -> None:
        """Drop what was remembered of functions no longer present."""
        with self._lock:
            for address in set(self._first_seen) - addresses:
                del self._first_seen[address]
