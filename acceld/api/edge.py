"""What stands at the public API's edge, outside authentication: ``/healthcheck``,
the proxy headers and CORS (oslo.middleware, configured as in other services).

* ``[oslo_middleware] enable_proxy_headers_parsing = true``: behind a proxy that
  terminates TLS, ``X-Forwarded-Proto`` / ``-Host`` / ``-Prefix`` (or ``Forwarded``)
  make the API's links name what clients reach (https://...). Off by default:
  a client could otherwise choose the links' scheme and host.
* ``[cors] allowed_origin``: browsers from those origins may call the API
  (dashboards); no origin configured, no CORS headers.
* ``/healthcheck``: see acceld.healthcheck; the public API's includes its database.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from oslo_config import cfg
from oslo_middleware import cors, http_proxy_to_wsgi

from acceld import healthcheck
from acceld.conf import middleware

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]


def wrap(app: WSGIApp, conf: cfg.ConfigOpts, database: Any) -> WSGIApp:
    """The edge around ``app``. The proxy-header and CORS middlewares are put in only when
    configured (read at start, as every WSGI pipeline is built): each builds webob request
    and response objects and inspects its handler's signature on every request, which
    took about 70 us a request, three quarters of a small GET's whole cost, doing nothing."""
    middleware.register_opts(conf)
    if conf.oslo_middleware.enable_proxy_headers_parsing:
        app = http_proxy_to_wsgi.HTTPProxyToWSGI(app, conf)
    if _cors_configured(conf):
        app = cors.CORS(app, conf)
    return healthcheck.mount(app, conf, database)


def _cors_configured(conf: cfg.ConfigOpts) -> bool:
    """An origin in ``[cors]`` or in a ``[cors.<name>]`` section of a config file (oslo's
    CORS reads both)."""
    if conf.cors.allowed_origin:
        return True
    return any(section.startswith("cors.") for section in conf.list_all_sections())
