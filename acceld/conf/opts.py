"""acceld's options for the sample config: the ``oslo.config.opts`` entry point
``acceld`` (``oslo-config-generator --namespace acceld``, ``acceld config sample``).

Every module of this package lists its options with ``list_opts()``; a module without
one is refused, so that no group is left out of the sample. Modules whose names start
with ``_`` are helpers of the others, with no group of their own.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from oslo_config import cfg

_PACKAGE = "acceld.conf"


def _modules() -> list[str]:
    here = [str(Path(__file__).parent)]
    return [name for _finder, name, ispkg in pkgutil.iter_modules(here)
            if not ispkg and name != "opts" and not name.startswith("_")]


def list_opts() -> list[tuple[cfg.OptGroup | str, list[cfg.Opt]]]:
    """Every group of every module with its options, a group listed by several modules
    once."""
    groups: dict[str, tuple[cfg.OptGroup | str, list[cfg.Opt]]] = {}
    for name in _modules():
        module = importlib.import_module(f"{_PACKAGE}.{name}")
        if not callable(getattr(module, "list_opts", None)):
            raise RuntimeError(f"{_PACKAGE}.{name} has no list_opts(): every module of "
                               f"{_PACKAGE} lists its options for the sample config")
        for group, opts in module.list_opts().items():
            key = group.name if isinstance(group, cfg.OptGroup) else group
            groups.setdefault(key, (group, []))[1].extend(opts)
    return list(groups.values())
