"""Version documents: public, unauthenticated, what clients use for discovery."""

from __future__ import annotations

import falcon

from acceld.api import microversion, wire

NAME = "OpenStack Cyborg API (acceld)"
DESCRIPTION = ("acceld manages the lifecycle of hardware accelerators, such as GPUs, FPGAs, "
               "AI chips and security accelerators, for OpenStack clouds.")


def _v2(req: falcon.Request, trailing: str = "") -> dict:
    return {
        "id": "v2",
        "status": "CURRENT",
        "max_version": str(microversion.MAX_VERSION),
        "min_version": str(microversion.MIN_VERSION),
        "version": str(microversion.MAX_VERSION),
        "links": [{"href": f"{wire.base_url(req)}/accelerator/v2{trailing}", "rel": "self"}],
    }


def _v1(req: falcon.Request) -> dict:
    return {
        "id": "v1",
        "status": "DEPRECATED",
        "max_version": "",
        "min_version": "",
        "version": "",
        "links": [{"href": f"{wire.base_url(req)}/accelerator/v1", "rel": "self"}],
    }


def versions(req: falcon.Request, resp: falcon.Response) -> None:
    """GET /accelerator and GET /: every API version, v2 the default."""
    current = _v2(req)
    wire.respond(resp, {"name": NAME, "description": DESCRIPTION,
                        "versions": [current, _v1(req)], "default_version": current})


def v2(req: falcon.Request, resp: falcon.Response) -> None:
    """GET /accelerator/v2: the v2 document, as openstacksdk's discovery expects it."""
    doc = _v2(req, trailing="/")
    doc["id"] = "v2.0"
    # No "version" key here: keystoneauth's discovery reads body["version"] as a nested
    # version object, so a string there fails every SDK and CLI call (upstream sends none).
    del doc["version"]
    wire.respond(resp, doc)
