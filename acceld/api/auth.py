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

This module is imported only when Keystone is on: keystonemiddleware and its
dependencies cost each API worker several megabytes.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from oslo_config import cfg

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


def keystone_pipeline(app: WSGIApp, conf: cfg.ConfigOpts) -> WSGIApp:
    """``app`` behind auth_token, configured from ``[keystone_authtoken]`` in ``conf``."""
    from keystonemiddleware import auth_token

    register_opts(conf)
    settings: dict[str, Any] = {"oslo_config_project": "acceld", "oslo_config_config": conf}
    protected = auth_token.AuthProtocol(_RequireIdentity(app), settings)
    return _PublicVersions(app, protected)
