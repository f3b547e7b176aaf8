"""Internal HTTP servers (conductor, agent, external drivers): Falcon apps behind credentials.

They run in a thread of their service's process (the service also runs
periodic work beside them), on a threaded WSGI server bound to 127.0.0.1
unless configured otherwise, with optional TLS.
"""

from __future__ import annotations

import logging
import socketserver
import ssl
import threading
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import falcon
import orjson

from acceld.internal import auth

LOG = logging.getLogger(__name__)

Handler = Callable[..., None]


# The largest internal body: a node's whole hardware report (about 1 KiB a device).
MAX_BODY = 32 * 1024 * 1024


class _Authenticate:
    """401 for a missing, wrong, expired or replayed credential, before any handler runs."""

    def __init__(self, verifier: auth.Verifier, max_body: int) -> None:
        self.verifier = verifier
        self.max_body = max_body

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        # The body is read before the credential can be checked: bound what a caller
        # without a credential can make the server hold.
        if (req.content_length or 0) > self.max_body:
            raise falcon.HTTPContentTooLarge(
                description=f"Internal request bodies are limited to {self.max_body} bytes.")
        body = req.bounded_stream.read(self.max_body + 1)
        if len(body) > self.max_body:
            raise falcon.HTTPContentTooLarge(
                description=f"Internal request bodies are limited to {self.max_body} bytes.")
        req.context.raw_body = body
        path = req.path + (f"?{req.query_string}" if req.query_string else "")
        try:
            self.verifier.verify(req.method, path, body, req.get_header(auth.HEADER))
        except auth.CredentialError as exc:
            LOG.warning("Refused internal call %s %s from %s: %s", req.method, req.path,
                        req.remote_addr, exc)
            raise falcon.HTTPUnauthorized(title="Unauthorized",
                                          description="A valid internal credential is required.")


def _error_serializer(req: falcon.Request, resp: falcon.Response, ex: falcon.HTTPError) -> None:
    resp.content_type = falcon.MEDIA_JSON
    resp.data = orjson.dumps({"error": ex.description or ex.title})


def json_body(req: falcon.Request) -> object:
    """The (already read and authenticated) body as JSON; 400 if malformed."""
    raw = req.context.raw_body
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise falcon.HTTPBadRequest(description=f"Malformed JSON: {exc}") from None


def respond(resp: falcon.Response, body: object, status: int = 200) -> None:
    resp.status = status
    resp.content_type = falcon.MEDIA_JSON
    resp.data = orjson.dumps(body)


class _Resource:
    def __init__(self, methods: dict[str, Handler]) -> None:
        for method, handler in methods.items():
            setattr(self, f"on_{method.lower()}", handler)


def build_app(secret: bytes, ttl: int, routes: dict[str, dict[str, Handler]]) -> falcon.App:
    app = falcon.App(middleware=[_Authenticate(auth.Verifier(secret, ttl), MAX_BODY)])
    app.set_error_serializer(_error_serializer)
    for path, methods in routes.items():
        app.add_route(path, _Resource(methods))
    return app


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args) -> None:  # type: ignore[no-untyped-def]
        LOG.debug("internal %s - %s", self.address_string(), format % args)


class InternalServer:
    """A running internal server; ``url`` is where it listens."""

    def __init__(self, app: falcon.App, host: str, port: int, *, cert_file: str | None = None,
                 key_file: str | None = None) -> None:
        self._server = make_server(host, port, app, server_class=_ThreadingWSGIServer,
                                   handler_class=_QuietHandler)
        scheme = "http"
        if cert_file:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert_file, key_file)
            # The handshake happens in the request's thread, not in the accept loop, so
            # a client that connects and stalls cannot block the server.
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True,
                                                      do_handshake_on_connect=False)
            scheme = "https"
        self.port = self._server.server_address[1]
        self.url = f"{scheme}://{host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="internal-api",
                                        daemon=True)

    def start(self) -> "InternalServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve(conf, secret: bytes, routes: dict[str, dict[str, Handler]],  # type: ignore[no-untyped-def]
          host: str, port: int) -> InternalServer:
    """Start the authenticated internal app for ``routes``, with TLS from ``[internal]``."""
    app = build_app(secret, conf.internal.credential_ttl, routes)
    return InternalServer(app, host, port, cert_file=conf.internal.tls_cert_file,
                          key_file=conf.internal.tls_key_file).start()


def advertised_endpoint(conf, host: str, port: int) -> str:  # type: ignore[no-untyped-def]
    """What a server tells its peer to call: ``host:port``, or an https URL under TLS."""
    host_port = f"{host}:{port}"
    return f"https://{host_port}" if conf.internal.tls_cert_file else host_port
