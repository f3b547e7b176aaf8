"""Per-request plumbing that every endpoint shares: request id, limits, version, identity."""

from __future__ import annotations

import functools
import logging
import re

import falcon

from acceld import request_ids
from acceld.api import context, errors, microversion

LOG = logging.getLogger(__name__)
REQUEST_ID_HEADER = request_ids.HEADER
_PADDED_SEGMENT = re.compile(r"(?:^|/)\s|\s(?:/|\Z)")
_V2_PREFIXES = ("/v2", "/accelerator/v2")


def is_v2_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in _V2_PREFIXES)


def is_version_document(path: str) -> bool:
    return path.rstrip("/") in ("", "/accelerator", "/v2", "/accelerator/v2")


class RequestPlumbing:
    """Sets ``req.context`` (api, ctx, version, request_id) and the response headers.

    Runs on every request, so what it needs from the configuration is read once here."""

    def __init__(self, api) -> None:  # type: ignore[no-untyped-def]
        self.api = api
        self.max_body = api.conf.api.max_request_body_size
        self.contexts = context.ContextFactory(api.conf)

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        # The ids: the access log's (acceld.api.access_log) when it runs outside, else new.
        request_id, global_request_id = request_ids.from_environ(req.env)
        req_context = req.context
        req_context.request_id = request_id
        req_context.global_request_id = global_request_id
        req_context.api = self.api
        resp.set_header(REQUEST_ID_HEADER, request_id)
        req_context.version = microversion.DEFAULT_VERSION
        path = req.path
        if is_v2_path(path):
            if is_version_document(path):
                resp.set_headers(_DEFAULT_VERSION_HEADERS)
            else:
                requested = req.get_header(microversion.HEADER)
                try:
                    version = microversion.from_header(requested)
                except Exception:
                    # Even a 406 tells the client the supported range.
                    resp.set_headers(_DEFAULT_VERSION_HEADERS)
                    raise
                req_context.version = version
                resp.set_headers(_version_headers(version))
                if LOG.isEnabledFor(logging.DEBUG):
                    LOG.debug("microversion %s for %s %s (requested: %s)", version,
                              req.method, path, requested or "none, the default")
        if "\x00" in path:
            # Path segments reach queries as text (names, hostnames); PostgreSQL refuses NUL.
            raise errors.BadRequest("The request path holds a NUL character.")
        if _PADDED_SEGMENT.search(path):
            # No uuid, name or hostname starts or ends with white space, and MariaDB compares
            # with PAD SPACE ('node1 ' = 'node1'): such a segment names nothing.
            raise errors.NotFound(f"No resource is named {path!r}: a path segment starts or "
                                  "ends with white space.")
        length = req.content_length
        if length is not None and length > self.max_body:
            raise errors.PayloadTooLarge(
                f"Request body is {length} bytes; the limit is {self.max_body} bytes.")
        ctx = req_context.ctx = self.contexts.build(req.get_header, request_id,
                                                    global_request_id)
        # From here on this thread's log lines name the caller too (oslo.log's format).
        log_context = req.env[request_ids.ENV_LOG_CONTEXT] = ctx.log_context()
        request_ids.activate(log_context)
        if ctx.project_id and "\x00" in ctx.project_id:
            # Only noauth lets a client choose it; it filters and is stored with ARQs.
            raise errors.BadRequest("The X-Project-Id header holds a NUL character.")


    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         req_succeeded: bool) -> None:
        log_context = req.env.get(request_ids.ENV_LOG_CONTEXT)
        if log_context is not None and not req.env.get(ACCESS_LOGGED):
            # No access log outside to end the request's log context: end it here.
            request_ids.deactivate(log_context)


# Set in the WSGI environ by acceld.api.access_log, which ends the log context itself.
ACCESS_LOGGED = "acceld.access_logged"

_DEFAULT_VERSION_HEADERS = microversion.response_headers(microversion.DEFAULT_VERSION)


@functools.lru_cache(maxsize=None)
def _version_headers(version: microversion.Version) -> dict[str, str]:
    """The response headers for each version, built once (read only by ``set_headers``)."""
    return microversion.response_headers(version)
