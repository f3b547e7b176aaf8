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
    """No access line per scrape on standard error."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


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
        self.server = make_server(host, port, metrics_app(registry), ThreadingWSGIServer,
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
