"""The whole public API on one page: path -> method -> handler.

Every path is served both at the root and under ``/accelerator`` (how
deployments mount Cyborg). Handlers are plain functions ``(req, resp, **params)``.
"""

from __future__ import annotations

from typing import Callable

import falcon

from acceld.api.handlers import accelerator_requests as arqs
from acceld.api.handlers import (attributes, deployables, device_profiles, devices, explain,
                                 hosts, root)

Handler = Callable[..., None]

ROUTES: dict[str, dict[str, Handler]] = {
    "/": {"GET": root.versions},
    "/v2": {"GET": root.v2},
    "/v2/device_profiles": {
        "GET": device_profiles.list_profiles,
        "POST": device_profiles.create_profile,
        "DELETE": device_profiles.delete_by_query,
    },
    "/v2/device_profiles/{ident}": {
        "GET": device_profiles.show_profile,
        "DELETE": device_profiles.delete_profiles,
    },
    # acceld 2.7: why the profile can or cannot get an accelerator (admin).
    "/v2/device_profiles/{ident}/explain": {"GET": explain.explain_profile},
    "/v2/accelerator_requests": {
        "GET": arqs.list_arqs,
        "POST": arqs.create_arqs,
        "PATCH": arqs.patch_collection,
        "DELETE": arqs.delete_by_query,
    },
    "/v2/accelerator_requests/{uuid}": {
        "GET": arqs.show_arq,
        "PATCH": arqs.patch_arq,
        "DELETE": arqs.delete_arq,
    },
    "/v2/devices": {"GET": devices.list_devices},
    "/v2/devices/{uuid}": {"GET": devices.show_device, "PATCH": devices.patch_device},
    "/v2/devices/{uuid}/enable": {"POST": devices.enable_device},
    "/v2/devices/{uuid}/disable": {"POST": devices.disable_device},
    "/v2/devices/{uuid}/events": {"GET": devices.list_events},
    "/v2/deployables": {"GET": deployables.list_deployables},
    "/v2/deployables/{uuid}": {
        "GET": deployables.show_deployable,
        "PATCH": deployables.patch_deployable,
    },
    "/v2/deployables/{uuid}/program": {"PATCH": deployables.program},
    # openstacksdk and the CLI repeat the uuid after /program.
    "/v2/deployables/{uuid}/program/{again}": {"PATCH": deployables.program},
    "/v2/attributes": {
        "GET": attributes.list_attributes,
        "POST": attributes.create_attribute,
    },
    "/v2/attributes/{uuid}": {
        "GET": attributes.show_attribute,
        "DELETE": attributes.delete_attribute,
    },
    # acceld 2.4: node agents and their liveness (admin only; 404 below 2.4); 2.5: retire one.
    "/v2/hosts": {"GET": hosts.list_hosts},
    "/v2/hosts/{hostname}": {"GET": hosts.show_host, "DELETE": hosts.delete_host},
}

PREFIXES = ("", "/accelerator")


class _Resource:
    """Adapts one route's method table to Falcon's ``on_<method>`` responders."""

    def __init__(self, methods: dict[str, Handler]) -> None:
        for method, handler in methods.items():
            setattr(self, f"on_{method.lower()}", handler)


def install(app: falcon.App) -> None:
    for path, methods in ROUTES.items():
        resource = _Resource(methods)
        for prefix in PREFIXES:
            full = (prefix + path).rstrip("/") or "/"
            app.add_route(full, resource)
