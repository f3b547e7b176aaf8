"""Every acceld option, one module per option group (or family of driver groups).

Each module defines its group and options and has ``register_opts(conf)`` and
``list_opts()``; this package registers them all (:func:`register_opts`) and
:mod:`acceld.conf.opts` collects them for the sample config. Nothing here imports
anything of acceld outside this package: the modules that use options import it, never
the reverse. Reading the config files is acceld.config's.

A module registers its options by group name, never its OptGroup object: oslo.config
copies a registered OptGroup shallowly, so every ConfigOpts given the same object would
share its options' defaults and overrides (tests build many).

Defaults describe the all-in-one: SQLite under the state path, no Keystone, every
service on 127.0.0.1.
"""

from __future__ import annotations

from oslo_config import cfg

from acceld.conf import (agent, api, conductor, database, default, driver, drivers, glance,
                         internal, metrics, middleware, nova, placement, policy, quota)

CONF = cfg.CONF

# In the order they register ([DEFAULT] first, for oslo.log's command-line options).
MODULES = (default, api, database, internal, conductor, agent, driver, drivers, nova,
           placement, glance, quota, metrics, policy, middleware)


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register every option group on ``conf`` (idempotent). The privsep contexts' groups
    are oslo.privsep's to register (acceld.conf.privsep)."""
    for module in MODULES:
        module.register_opts(conf)
