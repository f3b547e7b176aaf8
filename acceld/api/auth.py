"""Keystone authentication for the public API (``auth_strategy = keystone``).

keystonemiddleware's ``auth_token`` validates the ``X-Auth-Token`` (and an
optional ``X-Service-Token``) and replaces every identity header with what
Keystone says: ``X-Project-Id``, ``X-Roles``, ``X-Service-Roles``, ... which
``acceld.api.context`` turns into the request context. Its options come from
the ``[keystone_authtoken]`` section of acceld's own config files.

The version documents stay public: openstacksdk and the CLI fetch them
without a token during discovery, so those paths go around auth_token. So do
the dashboard's static files (acceld.dashboard): they hold no data, and the page
reads the API with the token its user gives it.

A token check waits on Keystone (and on memcached, with ``memcached_servers``), which the
worker does not control: every HTTP call auth_token's session makes runs stepped out of
the worker's serving slot, and the whole check runs as a blocking call, which loses the
slot if it takes longer than ``serving_slot.HAND_OFF_AFTER`` (acceld.serving.serving_slot): a
hung Keystone holds the request's thread, not the worker. ``http_connect_timeout``
defaults to ``acceld.conf._keystoneauth.KEYSTONE_TIMEOUT`` seconds here (upstream: none, so a Keystone that
accepts and never answers held the thread for ever).

This module is imported only when Keystone is on: keystonemiddleware and its
dependencies cost each API worker several megabytes.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from oslo_config import cfg

from acceld.conf._keystoneauth import KEYSTONE_TIMEOUT
from acceld.serving import serving_slot
from acceld.api import errors, middleware
from acceld.dashboard import is_dashboard_path

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]

GROUP = "keystone_authtoken"

# Identity headers (as WSGI environ keys) a client could forge on a public path.
_IDENTITY_ENVIRON = ("HTTP_X_USER_ID", "HTTP_X_PROJECT_ID", "HTTP_X_ROLES", "HTTP_X_DOMAIN_ID",
                     "HTTP_X_USER_DOMAIN_ID", "HTTP_X_PROJECT_DOMAIN_ID", "HTTP_X_IS_ADMIN_PROJECT",
                     "HTTP_X_SERVICE_ROLES", "HTTP_X_SERVICE_USER_ID",
                     "HTTP_X_SERVICE_USER_DOMAIN_ID", "HTTP_X_SERVICE_PROJECT_ID",
                     "HTTP_X_SERVICE_PROJECT_DOMAIN_ID", "HTTP_X_SERVICE_PROJECT_NAME",
                     "HTTP_X_SERVICE_PROJECT_DOMAIN_NAME", "HTTP_OPENSTACK_SYSTEM_SCOPE",
                     "HTTP_X_IDENTITY_STATUS", "HTTP_X_SERVICE_IDENTITY_STATUS")


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register auth_token's options on ``conf``, with acceld's safer defaults.

    A service token must carry a service role to count (upstream's default
    accepts any valid one and only logs a warning).
    """
    from keystonemiddleware import auth_token

    for group, opts in auth_token.list_opts():
        conf.register_opts(opts, group=group)
    conf.set_default("service_token_roles_required", True, group=GROUP)
    conf.set_default("http_connect_timeout", KEYSTONE_TIMEOUT, group=GROUP)


class _RequireIdentity:
    """401 unless Keystone confirmed the token.

    With ``delay_auth_decision = true`` auth_token lets unauthenticated
    requests through marked ``X-Identity-Status: Invalid``; acceld has no
    anonymous operations beyond the version documents, so they stop here.
    """

    def __init__(self, app: WSGIApp) -> None:
        self.app = app

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("HTTP_X_IDENTITY_STATUS") != "Confirmed":
            body = errors.error_body(401, "The request you have made requires authentication.")
            start_response("401 Unauthorized", [("Content-Type", "application/json"),
                                                ("Content-Length", str(len(body)))])
            return [body]
        return self.app(environ, start_response)


class _PublicVersions:
    """Send the version documents straight to the app, everything else through auth_token."""

    def __init__(self, app: WSGIApp, protected: WSGIApp) -> None:
        self.app = app
        self.protected = protected

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") in ("GET", "HEAD") and (
                middleware.is_version_document(path) or is_dashboard_path(path)):
            for key in _IDENTITY_ENVIRON:
                environ.pop(key, None)
            return self.app(environ, start_response)
        return self.protected(environ, start_response)


def _auth_token_class() -> type:
    """auth_token's middleware, its waits for Keystone out of the serving slot."""
    from keystonemiddleware import auth_token

    class AuthToken(auth_token.AuthProtocol):
        def _create_session(self, **kwargs):  # type: ignore[no-untyped-def]
            session = super()._create_session(**kwargs)
            send = session.request

            def request(*args, **kw):  # type: ignore[no-untyped-def]
                with serving_slot.stepped_out():  # an HTTP call to Keystone: always a wait
                    return send(*args, **kw)

            session.request = request
            return session

        def process_request(self, request):  # type: ignore[no-untyped-def]
            with serving_slot.blocking():  # a cached token returns at once
                return super().process_request(request)

    return AuthToken


def keystone_pipeline(app: WSGIApp, conf: cfg.ConfigOpts) -> WSGIApp:
    """``app`` behind auth_token, configured from ``[keystone_authtoken]`` in ``conf``."""
    register_opts(conf)
    settings: dict[str, Any] = {"oslo_config_project": "acceld", "oslo_config_config": conf}
    protected = _auth_token_class()(_RequireIdentity(app), settings)
    return _PublicVersions(app, protected)
