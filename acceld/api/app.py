"""The WSGI application: routes, middleware, error handling, and the services handlers use."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import falcon
from oslo_config import cfg

from acceld import dashboard
from acceld.api import errors, middleware, routes
from acceld.api.policy import Policy
from acceld.db.engine import Database
from acceld.metrics import serve as metrics

LOG = logging.getLogger(__name__)


@dataclass
class ApiServices:
    """What handlers reach through ``req.context.api``."""

    conf: cfg.ConfigOpts
    db: Database
    policy: Policy
    conductor: object | None = None  # acceld.clients.conductor.ConductorClient, when running
    _placement: list = field(default_factory=list)  # the client, once made (explain, claims)
    _nova: list = field(default_factory=list)  # Nova's instances, once made (claims)

    def placement(self) -> Any:
        """acceld's Placement client from ``[placement]`` (None when not configured), made
        at the first request that needs it: only explain and a standalone claim (its host, and
        whose its ``consumer_uuid`` is) ask Placement from the API (reads; the conductor
        writes the claim's allocation)."""
        if not self._placement:
            from acceld.clients import placement

            self._placement.append(placement.from_conf(self.conf))
        return self._placement[0]

    def nova(self) -> Any:
        """Nova's instances (acceld.clients.nova.NovaInstances; None when ``[nova]`` is not
        configured), made at the first claim with a ``consumer_uuid``: the only call from
        the API to Nova, a read."""
        if not self._nova:
            from acceld.clients import nova

            found = nova.NovaInstances(self.conf)
            self._nova.append(found if found.configured else None)
        return self._nova[0]


def build_app(conf: cfg.ConfigOpts, db: Database, conductor: object | None = None) -> falcon.App:
    """The Falcon app alone (no auth middleware): what in-process tests drive."""
    services = ApiServices(conf=conf, db=db, policy=Policy(conf), conductor=conductor)
    app = falcon.App(middleware=[*metrics.api_middleware(conf),
                                 middleware.RequestPlumbing(services)])
    app.req_options.strip_url_path_trailing_slash = True
    app.req_options.auto_parse_form_urlencoded = False
    app.resp_options.secure_cookies_by_default = False
    errors.install(app)
    routes.install(app)
    dashboard.install(app)  # /dashboard: static files reading this API
    return app


def wsgi_app(conf: cfg.ConfigOpts, db: Database, conductor: object | None = None):  # type: ignore[no-untyped-def]
    """The full WSGI pipeline, with Keystone authentication when configured, inside the
    access log (which also gives every request, refused ones too, its request ids),
    inside the edge (acceld.api.edge: /healthcheck, proxy headers, CORS)."""
    from acceld.api.access_log import AccessLog

    from acceld.api import edge

    if conf.debug:  # a DEBUG line per database call; no listener on the engine otherwise
        # (a worker builds its app again after a SIGHUP that switches debug on)
        from acceld.db import call_log

        call_log.install(db.engine)
    app = build_app(conf, db, conductor)
    if conf.auth_strategy == "keystone":
        from acceld.api.auth import keystone_pipeline

        return edge.wrap(AccessLog(keystone_pipeline(app, conf)), conf, db)
    return edge.wrap(AccessLog(app), conf, db)
