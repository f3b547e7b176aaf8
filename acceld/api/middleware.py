"""Per-request plumbing that every endpoint shares: request id, limits, version, identity."""

from __future__ import annotations

import uuid

import falcon

from acceld.api import context, errors, microversion

REQUEST_ID_HEADER = "X-OpenStack-Request-Id"
_V2_PREFIXES = ("/v2", "/accelerator/v2")


def is_v2_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in _V2_PREFIXES)


def is_version_document(path: str) -> bool:
    return path.rstrip("/") in ("", "/accelerator", "/v2", "/accelerator/v2")


class RequestPlumbing:
    """Sets ``req.context`` (api, ctx, version, request_id) and the response headers."""

    def __init__(self, api) -> None:  # type: ignore[no-untyped-def]
        self.api = api

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        request_id = f"req-{uuid.uuid4()}"
        req.context.request_id = request_id
        req.context.api = self.api
        resp.set_header(REQUEST_ID_HEADER, request_id)
        req.context.version = microversion.DEFAULT_VERSION
        path = req.path
        v2 = is_v2_path(path)
        if v2:
            # Headers first, so that even a 406 tells the client the supported range.
            resp.set_headers(microversion.response_headers(microversion.DEFAULT_VERSION))
            if not is_version_document(path):
                req.context.version = microversion.from_header(req.get_header(microversion.HEADER))
                resp.set_headers(microversion.response_headers(req.context.version))
        if "\x00" in path:
            # Path segments reach queries as text (names, hostnames); PostgreSQL refuses NUL.
            raise errors.BadRequest("The request path holds a NUL character.")
        length = req.content_length
        if length is not None and length > self.api.conf.api.max_request_body_size:
            raise errors.PayloadTooLarge(
                f"Request body is {length} bytes; the limit is "
                f"{self.api.conf.api.max_request_body_size} bytes.")
        ctx = req.context.ctx = context.from_headers(req.headers, self.api.conf, request_id)
        if ctx.project_id and "\x00" in ctx.project_id:
            # Only noauth lets a client choose it; it filters and is stored with ARQs.
            raise errors.BadRequest("The X-Project-Id header holds a NUL character.")
