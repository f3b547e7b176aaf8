"""API errors and their wire shape.

Clients (openstacksdk in particular) read upstream Cyborg's error body:
``{"error_message": "<JSON string of {faultcode, faultstring, debuginfo}>"}``.
Handlers raise an :class:`ApiError` subclass; the app turns it, and Falcon's
own HTTP errors (unknown route, wrong method, ...), into that shape. Any other
exception is a bug: it is logged with its traceback and answered with a bare
500 that reveals nothing, except an unreachable database (acceld.db.outage),
which is an outage: 503 with ``Retry-After``, one WARNING when it starts and
one when it ends, no traceback; and a transaction the database rolled back to
break a deadlock or a Galera write conflict (acceld.db.retry) that was not run
again: 503 with ``Retry-After: 1`` and a WARNING, nothing of it was kept; and a statement
that waited ``[api] database_lock_timeout`` for a lock another transaction held
(acceld.db.lock_wait): 503 with ``Retry-After`` and a WARNING, nothing of it was kept.
"""

from __future__ import annotations

import logging

import falcon
import orjson

from acceld.db import lock_wait
from acceld.db import outage as db_outage
from acceld.db.retry import is_deadlock
from acceld.outages import RETRY_AFTER_SECONDS

LOG = logging.getLogger(__name__)


class ApiError(Exception):
    """A client-visible failure with an HTTP status and a message for humans."""

    status: int = 500
    headers: dict[str, str] | None = None

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if headers:
            self.headers = headers


class BadRequest(ApiError):
    status = 400


class Unauthorized(ApiError):
    status = 401


class Forbidden(ApiError):
    status = 403


class NotFound(ApiError):
    status = 404


class MethodNotAllowed(ApiError):
    status = 405


class NotAcceptable(ApiError):
    status = 406


class Conflict(ApiError):
    status = 409


class PayloadTooLarge(ApiError):
    status = 413


class UnsupportedMediaType(ApiError):
    status = 415


class BadGateway(ApiError):
    """502: a backend acceld relies on (agent, driver, Glance) failed; the message says which."""

    status = 502


class ServiceUnavailable(ApiError):
    """503: a backend acceld relies on (conductor, agent, Glance) cannot be reached now."""

    status = 503


class Locked(ApiError):
    """423: the answer is not known yet (an ARQ bind still resolving). Empty body, as upstream."""

    status = 423


def error_body(status: int, message: str) -> bytes:
    fault = {"faultcode": "Server" if status >= 500 else "Client",
             "faultstring": message, "debuginfo": None}
    return orjson.dumps({"error_message": orjson.dumps(fault).decode()})


def _respond(resp: falcon.Response, status: int, message: str,
             headers: dict[str, str] | None = None) -> None:
    resp.status = status
    if headers:
        resp.set_headers(headers)
    if status == 423:
        resp.data = b""
        return
    resp.content_type = falcon.MEDIA_JSON
    resp.data = error_body(status, message)


def handle_api_error(req: falcon.Request, resp: falcon.Response, ex: ApiError,
                     params: dict) -> None:
    if ex.status >= 500:
        LOG.error("%s %s failed: %s", req.method, req.path, ex.message)
    _respond(resp, ex.status, ex.message, ex.headers)


def handle_falcon_error(req: falcon.Request, resp: falcon.Response, ex: falcon.HTTPError,
                        params: dict) -> None:
    message = ex.description or ex.title or "Error"
    if ex.status_code == 404 and not ex.description:
        message = f"The resource could not be found: {req.method} {req.path}"
    elif ex.status_code == 405:
        allowed = (ex.headers or {}).get("Allow", "")
        message = f"Method {req.method} is not allowed on {req.path}; allowed: {allowed}"
    _respond(resp, ex.status_code, message, dict(ex.headers or {}))


def handle_unexpected(req: falcon.Request, resp: falcon.Response, ex: Exception,
                      params: dict) -> None:
    if isinstance(ex, falcon.HTTPError):
        handle_falcon_error(req, resp, ex, params)
        return
    watcher = _database_outage(req)
    if watcher is not None and watcher.is_outage(ex):
        watcher.down(ex, "the API answers 503 until it is back")
        _respond(resp, 503, "The database cannot be reached; try again later.",
                 {"Retry-After": str(RETRY_AFTER_SECONDS)})
        return
    if is_deadlock(ex):
        LOG.warning("%s %s: the database rolled the request's transaction back (deadlock "
                    "or write conflict); answered 503, to be retried: %s", req.method,
                    req.path, getattr(ex, "orig", ex))
        _respond(resp, 503, "The request conflicted with a concurrent one and was rolled "
                            "back; try again.", {"Retry-After": "1"})
        return
    if lock_wait.is_lock_timeout(ex):
        LOG.warning("%s %s: a database lock another transaction holds did not come free in "
                    "time ([api] database_lock_timeout); answered 503, rolled back: %s",
                    req.method, req.path, getattr(ex, "orig", ex))
        _respond(resp, 503, "The database is busy: a lock held by another transaction (a "
                            "migration, a long write) did not come free in time; nothing was "
                            "changed, try again.", {"Retry-After": str(RETRY_AFTER_SECONDS)})
        return
    LOG.exception("Unexpected error in %s %s", req.method, req.path)
    _respond(resp, 500, "An unexpected error prevented the server from fulfilling the request.")


def _database_outage(req: falcon.Request) -> db_outage.DatabaseOutage | None:
    api = getattr(req.context, "api", None)
    return getattr(getattr(api, "db", None), "outage", None)


def install(app: falcon.App) -> None:
    """Register the handlers; later registrations win, so the most general goes first."""
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(falcon.HTTPError, handle_falcon_error)
    app.add_error_handler(ApiError, handle_api_error)
