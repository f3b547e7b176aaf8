"""Reading acceld's configuration: the config files and the environment, into oslo.config's
global CONF (or a ConfigOpts of the caller's), with every option registered first.

The options themselves are in acceld.conf, one module per group. A config file
(``--config-file``) overrides their defaults, and any option can also come from the
environment as ``OS_<GROUP>__<OPTION>`` (oslo.config's environment source), e.g.
``OS_DATABASE__CONNECTION``.
"""

from __future__ import annotations

import os
from typing import Sequence

from oslo_config import cfg

import acceld.conf
from acceld.conf import CONF


def load(argv: Sequence[str] = (), config_files: Sequence[str] | None = None,
         conf: cfg.ConfigOpts | None = None, config_dirs: Sequence[str] | None = None,
         discover: bool = False) -> cfg.ConfigOpts:
    """Parse config files and the environment into ``conf`` (default: the global CONF).

    ``discover`` (the commands): without ``config_files`` and ``config_dirs``, read what
    oslo.config finds in the standard places, as every OpenStack service does
    (acceld.conf in ~/.acceld/, ~/, /etc/acceld/, /etc/; acceld.conf.d/ there). None
    found: the built-in defaults (the all-in-one's). In-process callers (tests) read
    only what they name."""
    conf = conf if conf is not None else CONF
    acceld.conf.register_opts(conf)
    files = list(config_files or [])
    dirs = list(config_dirs or [])
    if discover and not files and not dirs:
        # (oslo lists project and program files apart: the same name here, found once)
        files = list(dict.fromkeys(cfg.find_config_files(project="acceld", prog="acceld")))
        dirs = list(dict.fromkeys(cfg.find_config_dirs(project="acceld", prog="acceld")))
    conf(list(argv), project="acceld", prog="acceld", default_config_files=files,
         default_config_dirs=dirs, validate_default_values=True)
    from acceld import upstream_conf

    upstream_conf.adopt_defaults(conf)  # an upstream cyborg.conf means Keystone
    return conf


def database_url(conf: cfg.ConfigOpts) -> str:
    """The configured database URL, defaulting to SQLite under the state path."""
    if conf.database.connection:
        return conf.database.connection
    path = os.path.abspath(os.path.join(conf.state_path, "acceld.sqlite"))
    return f"sqlite:///{path}"
