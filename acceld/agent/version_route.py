"""The agent's ``GET /version``: which acceld release the node runs, so that
``acceld-status upgrade check`` on a controller can find agents older than it."""

from __future__ import annotations

from typing import Any

import falcon

from acceld.internal.server import respond
from acceld.version import VERSION


def agent_routes(agent: Any) -> dict[str, dict[str, Any]]:
    def on_version(req: falcon.Request, resp: falcon.Response) -> None:
        respond(resp, {"version": VERSION})

    return {"/version": {"GET": on_version}}
