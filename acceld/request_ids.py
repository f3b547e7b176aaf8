"""Request ids across acceld's processes, the way every OpenStack service carries them.

Each request a service handles gets its own ``req-<uuid>`` (the *request id*); the
*global request id* is the one the caller started with (Nova's, in
``X-OpenStack-Request-Id``) and is passed on unchanged to every service a request
leads to: the conductor and agents (internal calls), bind jobs (stored with the job)
and Placement, Nova and the image service (keystoneauth's ``global_request_id``).
Without a caller's id, a service passes on its own request id (oslo.context's
``global_id``), so one grep of that id still follows the request.

The ids live in oslo.context's per-thread context, which oslo.log's formatter reads
for every line (``[global_request_id request_id user project ...]``).
"""

from __future__ import annotations

import contextlib
import re
import uuid
from typing import Iterator

from oslo_context import context as oslo_context

HEADER = "X-OpenStack-Request-Id"
# What oslo.middleware's request-id middleware accepts as a caller's global id: anything
# else (a forged, overlong or malformed header) is ignored, never logged or passed on.
_GLOBAL_ID = re.compile(r"req-[a-f0-9]{8}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{12}\Z")


def new() -> str:
    """A fresh request id."""
    return f"req-{uuid.uuid4()}"


def valid_global_id(value: str | None) -> str | None:
    """``value`` when it is a well-formed global request id, else None."""
    if value and _GLOBAL_ID.match(value):
        return value
    return None


def current() -> oslo_context.RequestContext | None:
    """This thread's context (the request or job it works on), if any."""
    return oslo_context.get_current()


def current_global_id() -> str | None:
    """The id to pass on to another service: the caller's global id, else this request's."""
    ctx = oslo_context.get_current()
    return ctx.global_id if ctx is not None else None


def outgoing_headers() -> dict[str, str]:
    """The header that carries the global id to an internal server ({} outside a request)."""
    global_id = current_global_id()
    return {HEADER: global_id} if global_id else {}


def make(request_id: str | None = None, global_request_id: str | None = None,
         **identity: object) -> oslo_context.RequestContext:
    """An oslo.context context (not yet this thread's) for the ids and identity given."""
    return oslo_context.RequestContext(request_id=request_id or new(),
                                       global_request_id=global_request_id,
                                       overwrite=False, **identity)  # type: ignore[arg-type]


def activate(ctx: oslo_context.RequestContext) -> None:
    """Make ``ctx`` this thread's context: every log line from here on names its ids."""
    ctx.update_store()


def deactivate(ctx: oslo_context.RequestContext | None = None) -> None:
    """Forget this thread's context (only if it still is ``ctx``, when given), so that a
    pooled thread's next lines do not name a finished request."""
    current_ctx = oslo_context.get_current()
    if current_ctx is not None and (ctx is None or current_ctx is ctx):
        # oslo.context offers no public reset; its store is this thread-local attribute.
        del oslo_context._request_store.context


@contextlib.contextmanager
def bound(global_request_id: str | None = None, request_id: str | None = None,
          **identity: object) -> Iterator[oslo_context.RequestContext]:
    """Work under a context of its own (a bind job, an internal call), then put back the
    thread's previous one."""
    previous = oslo_context.get_current()
    ctx = make(request_id, global_request_id, **identity)
    activate(ctx)
    try:
        yield ctx
    finally:
        if previous is not None:
            previous.update_store()
        else:
            deactivate(ctx)


# WSGI environ keys: oslo.middleware's, so that WSGI middleware of either kind agrees on the
# ids, and acceld's own for the log context the access log line is written with.
ENV_REQUEST_ID = "openstack.request_id"
ENV_GLOBAL_REQUEST_ID = "openstack.global_request_id"
ENV_LOG_CONTEXT = "acceld.log_context"


def from_environ(environ: dict) -> tuple[str, str | None]:
    """This request's id and its caller's (validated) global id, decided once per request
    by whichever layer sees it first and kept in ``environ`` for the others."""
    request_id = environ.get(ENV_REQUEST_ID)
    if request_id is None:
        request_id = environ[ENV_REQUEST_ID] = new()
        environ[ENV_GLOBAL_REQUEST_ID] = valid_global_id(
            environ.get("HTTP_X_OPENSTACK_REQUEST_ID"))
    return request_id, environ.get(ENV_GLOBAL_REQUEST_ID)
