"""``[healthcheck]``, ``[oslo_middleware]`` and ``[cors]``: oslo.middleware's options for
what stands at the public API's edge (acceld.api.edge); their namespaces list them in the
sample. Registered here so that config files and overrides can set them before the
middleware (which registers them too) is built."""

from __future__ import annotations

from oslo_config import cfg


def register_opts(conf: cfg.ConfigOpts) -> None:
    from oslo_middleware import opts

    set_defaults()
    for list_opts in (opts.list_opts_healthcheck, opts.list_opts_http_proxy_to_wsgi,
                      opts.list_opts_cors):
        for group, group_opts in list_opts():
            conf.register_opts(group_opts, group=group)


def list_opts() -> dict[str, list[cfg.Opt]]:
    return {}


def set_defaults() -> None:
    """acceld's defaults for oslo.middleware's options (the oslo.config.opts.defaults entry
    point, so that generated samples show them): CORS lets browsers send and read the
    headers the API uses."""
    from oslo_middleware import cors

    cors.set_defaults(
        allow_headers=["X-Auth-Token", "X-OpenStack-Request-ID", "X-Identity-Status",
                       "X-Roles", "X-Service-Catalog", "X-User-Id", "X-Project-Id",
                       "OpenStack-API-Version"],
        expose_headers=["X-Auth-Token", "X-OpenStack-Request-ID", "X-Subject-Token",
                        "X-Service-Token", "OpenStack-API-Version"],
        allow_methods=["GET", "PUT", "POST", "DELETE", "PATCH"])
