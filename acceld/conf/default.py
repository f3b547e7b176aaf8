"""``[DEFAULT]``: this node's name, its state directory, how the API authenticates, and
oslo.log's options (debug, log_file, log_config_append, use_journal, use_json, ...)."""

from __future__ import annotations

import socket

from oslo_config import cfg
from oslo_log import _options as _oslo_log_options
from oslo_log import log as oslo_log

default_opts = [
    cfg.StrOpt("host", default=socket.gethostname(), sample_default="<hostname>",
               help="Name of this node. The agent reports its hardware under this name "
                    "and the conductor finds the compute-node provider in Placement by it, "
                    "so it must match Nova's hypervisor hostname."),
    cfg.StrOpt("state_path", default="./.acceld",
               help="Directory for local state: the SQLite database and generated secrets."),
    cfg.StrOpt("auth_strategy", default="noauth", choices=["noauth", "keystone"],
               help="noauth trusts identity headers (X-User-Id, X-Project-Id, X-Roles, "
                    "X-Service-Roles); keystone validates tokens with keystonemiddleware."),
]

# Libraries whose INFO/DEBUG lines are noise in a service log (oslo.log's list, plus ours).
_QUIET = ("alembic=WARN", "gunicorn.access=WARN")
# acceld's defaults, set on import so that every process and the sample config
# (oslo-config-generator imports this module through acceld.conf.opts) agree.
oslo_log.set_defaults(default_log_levels=oslo_log.get_default_log_levels() + list(_QUIET))


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(default_opts)
    if "log_config_append" not in conf:  # oslo.log's, before the command line is parsed
        oslo_log.register_options(conf)


def list_opts() -> dict[str, list[cfg.Opt]]:
    log_opts = [opt for _group, opts in _oslo_log_options.list_opts() for opt in opts]
    return {"DEFAULT": default_opts + log_opts}
