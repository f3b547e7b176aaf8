"""One driver per device: which PCI functions a type-specific driver claims from ``pci``.

With a type-specific driver (``nvidia_gpu``, ``intel_fpga``, ...) and the generic ``pci``
driver both in ``[agent] enabled_drivers``, the same function would otherwise be reported
twice: two devices, two Placement providers, two control paths for one piece of hardware.
The specific driver wins, whatever the order of the list: ``pci`` asks every other
enabled driver's class whether it claims a function and reports only the rest.

A driver declares what it claims with a class method (no instance, no discovery run)::

    @classmethod
    def claims_pci(cls, conf, function: acceld.drivers.sysfs.PciFunction) -> bool

An in-tree driver without one falls back to :data:`FALLBACK_CLAIMS`; a driver from another
package without one claims nothing (``pci`` then warns once that it may double-report).
"""

from __future__ import annotations

import logging
from typing import Callable

from oslo_config import cfg

from acceld.drivers import loader
from acceld.drivers.sysfs import PciFunction

LOG = logging.getLogger(__name__)
Claim = Callable[[cfg.ConfigOpts, PciFunction], bool]
_GPU_CLASSES = frozenset({0x0300, 0x0302, 0x0380})


def _nvidia_gpu_claims(conf: cfg.ConfigOpts, function: PciFunction) -> bool:
    """NVIDIA display-class functions (GPUs and their VFs): what nvidia_gpu reports."""
    return function.vendor == "0x10de" and function.class_prefix in _GPU_CLASSES


# For in-tree drivers that declare no claims_pci (yet): kept in step with their discovery.
FALLBACK_CLAIMS: dict[str, Claim] = {"nvidia_gpu": _nvidia_gpu_claims}
_warned: set[str] = set()


def claim_of(name: str) -> Claim | None:
    """The claim predicate of driver ``name``, or None when it declares none."""
    try:
        cls = loader.driver_class(name)
    except loader.UnknownDriver:
        return None  # the agent reports an unknown driver itself
    method = getattr(cls, "claims_pci", None)
    return method if callable(method) else FALLBACK_CLAIMS.get(name)


def claimed_by_others(conf: cfg.ConfigOpts, me: str,
                      functions: list[PciFunction]) -> dict[str, str]:
    """Address -> name of the first other enabled driver that claims that function."""
    claimed: dict[str, str] = {}
    for name in loader.enabled(conf):
        if name == me:
            continue
        claim = claim_of(name)
        if claim is None:
            if name not in _warned and name != "fake":
                LOG.warning("Driver %s declares no claims_pci: %s may report the same PCI "
                            "devices as it does", name, me)
                _warned.add(name)
            continue
        for function in functions:
            if function.address in claimed:
                continue
            try:
                if claim(conf, function):
                    claimed[function.address] = name
            except Exception as exc:  # noqa: BLE001 - another driver's bug must not stop pci
                if name not in _warned:
                    LOG.warning("Driver %s failed to say whether it claims %s (%s): %s may "
                                "report its devices too", name, function.address, exc, me)
                    _warned.add(name)
    return claimed
