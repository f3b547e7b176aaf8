"""The services acceld reaches through keystoneauth ([nova], [placement], [glance]): the
standard session, auth and adapter options in each, with acceld's defaults where
keystoneauth's do not fit. A helper of those groups' modules, with no group of its own."""

from __future__ import annotations

import copy

from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

# Seconds acceld waits for one answer of Keystone by default: [oslo_limit] timeout
# (acceld.conf.quota) and [keystone_authtoken] http_connect_timeout (acceld.api.auth).
# keystoneauth and keystonemiddleware wait for ever by default: a Keystone that accepts and
# never answers would hold a request's thread (outside the serving slot) without end.
KEYSTONE_TIMEOUT = 10

# acceld's defaults for keystoneauth's retry options where keystoneauth's (none) do not
# fit: Nova's events (also on a 502/504 from a proxy in front of it) and the agent's image
# downloads are retried a few times (delays 0.5, 1, 2 s); Placement keeps none, as its
# callers wait out an outage themselves (the sync's backoff, a bind's deadline) instead of
# holding a worker in a call. keystoneauth's ``timeout`` (each attempt's connect and read;
# its default, None, waits forever) gets a value in every group; the whole call's deadline
# is acceld's [nova] and [placement] deadline, and [conductor] program_timeout for Glance
# (acceld.clients.deadline).
DEFAULTS = {"nova": {"connect_retries": 3, "status_code_retries": 3,
                      "retriable_status_codes": [502, 503, 504], "timeout": 10},
            "placement": {"timeout": 30},
            "glance": {"connect_retries": 3, "status_code_retries": 3, "timeout": 30}}


def register_opts(conf: cfg.ConfigOpts, group: cfg.OptGroup) -> None:
    """keystoneauth's session, auth and adapter options in ``group``, with acceld's
    retry and timeout defaults."""
    ks_loading.register_session_conf_options(conf, group.name)
    ks_loading.register_auth_conf_options(conf, group.name)
    ks_loading.register_adapter_conf_options(conf, group.name)
    for name, value in DEFAULTS.get(group.name, {}).items():
        conf.set_default(name, value, group=group.name)


def list_opts(group: cfg.OptGroup) -> list[cfg.Opt]:
    """keystoneauth's session, adapter and auth options, with the password plugin's
    (auth_url, username, password, ...) and acceld's defaults of ``group``: what a sample
    shows for [placement], [nova] and [glance], as other services' samples do."""
    opts: list[cfg.Opt] = []
    for more in (ks_loading.get_session_conf_options(),
                 ks_loading.get_adapter_conf_options(),
                 ks_loading.get_auth_common_conf_options(),
                 ks_loading.get_auth_plugin_conf_options("password")):
        opts += [o for o in more if o.dest not in {x.dest for x in opts}]
    wanted = DEFAULTS.get(group.name, {})
    out = []
    for opt in opts:
        if opt.dest in wanted:
            opt = copy.copy(opt)
            opt.default = wanted[opt.dest]
        out.append(opt)
    return out
