"""No accidental open door: ``auth_strategy = noauth`` stays on loopback unless told otherwise.

noauth trusts identity headers and makes a request without them an admin, so
anyone who reaches the API's port is an admin. The API refuses to start with
noauth on an address other than loopback (127.0.0.0/8, ::1, ``localhost``)
unless ``[api] allow_insecure_noauth = true``, and warns at start either way.

A WSGI server of the operator's own (``acceld.wsgi.api:application``) binds where its
command line says, which the application never learns: there noauth is refused outright
unless the option is set (:func:`check_wsgi`).
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


def check_wsgi(conf: cfg.ConfigOpts) -> None:
    """Refuse (InsecureNoauth) noauth under a WSGI server of the operator's own, whose listen
    address acceld cannot see, unless ``[api] allow_insecure_noauth = true``; warn when it
    is set."""
    if conf.auth_strategy != "noauth":
        return
    if not conf.api.allow_insecure_noauth:
        raise InsecureNoauth(
            "acceld.wsgi.api refuses auth_strategy = noauth (the default): noauth makes "
            "anyone who reaches the API an admin, and a WSGI server's listen address is not "
            "known to the application. Configure auth_strategy = keystone, or, if the server "
            "listens on loopback only or something else authenticates every request before "
            "it reaches acceld, set [api] allow_insecure_noauth = true.")
    LOG.warning("auth_strategy = noauth under a WSGI server ([api] allow_insecure_noauth = "
                "true): requests are not authenticated; anyone who can reach the server is "
                "an admin.")
