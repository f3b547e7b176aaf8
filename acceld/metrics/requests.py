"""Falcon middleware counting the public API's requests by route template.

The route label is the template Falcon matched (``/v2/devices/{uuid}``), with the
``/accelerator`` mount folded into the bare one, never the raw path: a client
cannot make new series by asking for new URLs. A request no route matched is
``unmatched``; a method outside HTTP's usual set is ``other``.
"""

from __future__ import annotations

import time

import falcon

from acceld.metrics import families as m

MOUNT = "/accelerator"
UNMATCHED = "unmatched"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def route_label(template: str | None) -> str:
    if not template:
        return UNMATCHED
    if template == MOUNT or template.startswith(MOUNT + "/"):
        template = template[len(MOUNT):] or "/"
    return template


class RequestMetrics:
    """First in the middleware list, so that its start time precedes every other step and
    its response hook runs for every answer, errors included."""

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.metrics_started = time.perf_counter()

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         req_succeeded: bool) -> None:
        started = getattr(req.context, "metrics_started", None)
        if started is None:
            return
        route = route_label(req.uri_template)
        method = req.method if req.method in METHODS else "other"
        m.API_REQUESTS.labels(route, method, str(resp.status_code)).inc()
        m.API_LATENCY.labels(route, method).observe(time.perf_counter() - started)
