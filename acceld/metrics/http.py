"""The ``/metrics`` listener: its own address, apart from the public API and the
internal APIs (docs/observability.md says why).

A small threaded WSGI server in a daemon thread. Only ``GET``/``HEAD /metrics`` is
served (404 for any other path, 405 for any other method); prometheus-client builds
the text, gzip when the scraper asks for it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

LOG = logging.getLogger(__name__)

PATH = "/metrics"


class _QuietHandler(WSGIRequestHandler):
    """No access line per scrape on standard error; a scrape that failed is logged
    (wsgiref would print its traceback to standard error, outside the service's log)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass

    def get_stderr(self) -> Any:
        return _ErrorsToLog()


class _ErrorsToLog:
    """wsgiref's error stream (where it writes a failed request's traceback), as one
    ERROR line of this service's log."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> None:
        self.parts.append(text)

    def flush(self) -> None:
        text = "".join(self.parts).strip()
        self.parts.clear()
        if text:
            LOG.error("A metrics scrape failed: %s", text)


class _Server(ThreadingWSGIServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A scraper that went away mid-answer, or a broken request: logged, not printed
        to standard error by socketserver."""
        LOG.debug("Metrics request from %s ended with an error", client_address[0],
                  exc_info=True)


def metrics_app(registry: CollectorRegistry) -> Callable:
    """WSGI: ``GET /metrics`` from ``registry``; nothing else."""
    export = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"Not found: metrics are at /metrics\n"]
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"),
                                                      ("Content-Type", "text/plain")])
            return [b"Method not allowed\n"]
        return export(environ, start_response)
    return app


class MetricsServer:
    """Serves ``registry`` on ``host:port`` until :meth:`stop`."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.server = make_server(host, port, metrics_app(registry), _Server,
                                  handler_class=_QuietHandler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics",
                                       daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}{PATH}"

    def start(self) -> "MetricsServer":
        self.thread.start()
        LOG.info("Metrics served on %s", self.url)
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
