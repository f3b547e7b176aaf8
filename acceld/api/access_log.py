"""One access log line per public API request, as other OpenStack APIs write them.

The outermost WSGI layer of the public API (outside Keystone authentication, so that
refused requests are logged too): it decides the request's ids (acceld.request_ids),
answers every request with its ``X-OpenStack-Request-Id`` and, once the response
body has been sent, logs::

    <client> "<METHOD> <path>?<query>" status: <code> len: <bytes> time: <seconds>

under the request's context, so the line's prefix names both request ids, the user
and the project. ``len`` counts the body bytes the application produced. The path,
query string and identity are the client's: acceld.logs escapes their control
characters (``%0A`` decoded into the path is written ``\\n``), so they cannot forge a line.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, Iterator

from acceld import request_ids
from acceld.api.middleware import ACCESS_LOGGED

LOG = logging.getLogger("acceld.api.access")


class AccessLog:
    """WSGI middleware: request ids for every request, and its access log line."""

    def __init__(self, app: Callable) -> None:
        self.app = app

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        started = time.monotonic()
        request_id, global_request_id = request_ids.from_environ(environ)
        environ[ACCESS_LOGGED] = True
        # Until the API knows the caller (after authentication), the ids alone.
        log_context = environ[request_ids.ENV_LOG_CONTEXT] = request_ids.make(
            request_id, global_request_id)
        request_ids.activate(log_context)
        status: list[str] = []

        def recording_start_response(code: str, headers: list, exc_info=None):  # type: ignore[no-untyped-def]
            status[:] = [code]
            if not any(name.lower() == "x-openstack-request-id" for name, _ in headers):
                headers.append((request_ids.HEADER, request_id))
            return start_response(code, headers, exc_info)

        try:
            body = self.app(environ, recording_start_response)
        except BaseException:
            self._log(environ, "500", 0, started)
            raise
        return _CountedBody(body, lambda sent: self._log(
            environ, status[0].split(" ", 1)[0] if status else "500", sent, started))

    @staticmethod
    def _log(environ: dict, status: str, sent: int, started: float) -> None:
        log_context = environ.get(request_ids.ENV_LOG_CONTEXT)
        try:
            path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
            query = environ.get("QUERY_STRING")
            LOG.info('%s "%s %s" status: %s len: %d time: %.4f',
                     environ.get("REMOTE_ADDR", "-"), environ.get("REQUEST_METHOD", "-"),
                     f"{path}?{query}" if query else path, status, sent,
                     time.monotonic() - started, extra={"context": log_context})
        finally:
            request_ids.deactivate(log_context)


class _CountedBody:
    """The application's response body, counted as the server sends it; ``done`` is
    called once with the byte count when the server closes it (WSGI's close())."""

    def __init__(self, body: Iterable[bytes], done: Callable[[int], None]) -> None:
        self._body = body
        self._done = done
        self._sent = 0
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._body:
            self._sent += len(chunk)
            yield chunk

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._done(self._sent)
