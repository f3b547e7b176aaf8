"""The agent's ``GET /version``: which acceld release the node runs, so that
``acceld-status upgrade check`` on a controller can find agents older than it."""

from __future__ import annotations

from typing import Any

import falcon

from acceld.internal import versions
from acceld.internal.server import respond
from acceld.version import VERSION


def agent_routes(agent: Any) -> dict[str, dict[str, Any]]:
    def on_version(req: falcon.Request, resp: falcon.Response) -> None:
        # api_version from 1.1 on: an agent of 1.0 answers only its release.
        respond(resp, {"version": VERSION, versions.FIELD: versions.text(versions.CURRENT)})

    return {"/version": {"GET": on_version}}
