"""No accidental open door: ``auth_strategy = noauth`` stays on loopback unless told otherwise.

noauth trusts identity headers and makes a request without them an admin, so
anyone who reaches the API's port is an admin. The API refuses to start with
noauth on an address other than loopback (127.0.0.0/8, ::1, ``localhost``)
unless ``[api] allow_insecure_noauth = true``, and warns at start either way.
"""

from __future__ import annotations

import logging

from oslo_config import cfg

from acceld.addresses import is_loopback

LOG = logging.getLogger(__name__)


class InsecureNoauth(Exception):
    """noauth was asked to listen beyond loopback without the explicit insecure option."""


def check(conf: cfg.ConfigOpts, *, warn: bool = True) -> None:
    """Refuse (InsecureNoauth) or warn, for the public API's configured address."""
    if conf.auth_strategy != "noauth":
        return
    host = conf.api.host_ip
    where = f"{host}:{conf.api.port}"
    if not is_loopback(host) and not conf.api.allow_insecure_noauth:
        raise InsecureNoauth(
            f"auth_strategy = noauth makes anyone who reaches the API an admin, and [api] "
            f"host_ip = {host} is not a loopback address. Listen on 127.0.0.1 (or ::1), "
            "configure auth_strategy = keystone, or, if something else authenticates every "
            "request before it reaches acceld, set [api] allow_insecure_noauth = true.")
    if warn:
        LOG.warning("auth_strategy = noauth: requests are not authenticated; anyone who "
                    "can reach %s is an admin.%s", where,
                    "" if is_loopback(host) else
                    " [api] allow_insecure_noauth = true lets it listen beyond loopback.")
