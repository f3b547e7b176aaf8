"""Internal HTTP servers (conductor, agent, external drivers): Falcon apps behind credentials.

They run in threads of their service's process (the service also runs
periodic work beside them), on :class:`acceld.serving.pool_server.PoolServer`
(bounded threads and connections, timeouts) bound to 127.0.0.1 unless
configured otherwise, with optional TLS.

Every request's credential is checked from its headers before its body is
read (acceld.internal.auth); the body is then read up to
``[internal] max_request_body`` bytes and must match the hash that was signed.
Every answer to an authenticated request is signed over the request's nonce.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any, Callable, Collection, Protocol
from urllib.parse import unquote

import falcon
import orjson

from acceld import request_ids
from acceld.addresses import is_loopback
from acceld.internal import auth
from acceld.outages import RETRY_AFTER_SECONDS
from acceld.serving.connection_loop import ConnectionLoop
from acceld.serving.pool_server import Admit, Limits, PoolServer

LOG = logging.getLogger(__name__)

Handler = Callable[..., None]

# The default cap on internal request bodies. Requests are small: a hello is under a
# KiB, a program or attach request a few hundred bytes; hardware reports, the large
# payloads, travel in answers (GET /hardware), which are not capped here.
MAX_BODY = 1024 * 1024

_REFUSED = "A valid internal credential is required."
RETRY_AFTER = str(RETRY_AFTER_SECONDS)  # what a 503 for an unreachable database says


class DatabaseOutage(Protocol):
    """What a server backed by a database needs of its outage log (acceld.db.outage)."""

    def is_outage(self, exc: BaseException) -> bool: ...

    def down(self, exc: BaseException, consequence: str = "") -> None: ...


_OUTAGE_CONSEQUENCE = "internal calls are answered 503 until it is back"


def _unavailable() -> falcon.HTTPError:
    return falcon.HTTPServiceUnavailable(
        description="The database cannot be reached; try again later.",
        headers={"Retry-After": RETRY_AFTER})


class _Authenticate:
    """401 for a missing, wrong, expired or replayed credential, before any body is read."""

    def __init__(self, verifier: auth.Verifier, max_body: int,
                 node_paths: Collection[str] | None,
                 outage: DatabaseOutage | None = None) -> None:
        self.verifier = verifier
        self.max_body = max_body
        self.node_paths = node_paths
        self.outage = outage

    def _refuse(self, req: falcon.Request, reason: str, tell: bool = False) -> falcon.HTTPError:
        """401; ``tell``: the reason is the caller's to know (a revoked key it proved it
        holds), else it is only logged."""
        LOG.warning("Refused internal call %s %s from %s: %s", req.method, req.path,
                    req.remote_addr, reason)
        return falcon.HTTPUnauthorized(title="Unauthorized",
                                       description=reason if tell else _REFUSED)

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        path = req.path + (f"?{req.query_string}" if req.query_string else "")
        try:
            identity = self.verifier.check(
                req.method, path, req.get_header(auth.HEADER), req.get_header(auth.NODE_HEADER),
                req.get_header(auth.DIGEST_HEADER))
        except auth.KeyRevoked as exc:
            raise self._refuse(req, str(exc), tell=True) from None
        except auth.CredentialError as exc:
            raise self._refuse(req, str(exc)) from None
        except auth.ReplayUnavailable as exc:
            cause = exc.__cause__
            if self.outage is not None and cause is not None and self.outage.is_outage(cause):
                self.outage.down(cause, _OUTAGE_CONSEQUENCE)  # once for the whole outage
                raise _unavailable() from None
            LOG.warning("Cannot check internal call %s %s for replay: %s", req.method,
                        req.path, exc)
            raise falcon.HTTPServiceUnavailable(
                description="Internal credentials cannot be checked right now.",
                headers={"Retry-After": RETRY_AFTER}) from None
        # From here on the caller holds a key: its answers are signed, even errors.
        req.context.identity = identity
        if identity.node is not None and self.node_paths is not None \
                and req.path not in self.node_paths:
            raise self._refuse(req, f"node {identity.node}'s key is not accepted for this call")
        if (req.content_length or 0) > self.max_body:
            raise falcon.HTTPContentTooLarge(
                description=f"Internal request bodies are limited to {self.max_body} bytes.")
        try:
            body = req.bounded_stream.read(self.max_body + 1)
        except TimeoutError:  # the server's request_timeout: a slow or stalled sender
            raise falcon.HTTPError(falcon.HTTP_408,
                                   description="The request body did not arrive in time.") \
                from None
        if len(body) > self.max_body:
            raise falcon.HTTPContentTooLarge(
                description=f"Internal request bodies are limited to {self.max_body} bytes.")
        if auth.body_digest(body) != identity.digest:
            raise self._refuse(req, "the body does not match its signed hash")
        req.context.raw_body = body

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         req_succeeded: bool) -> None:
        if self.verifier.own_destination is not None:
            # This process's own name: the caller's next calls made for it are checked
            # against this process's memory instead of the shared nonce table. Unsigned:
            # a forged one only makes a client's next call be refused (401) and sent again
            # for the shared name (acceld.clients.internal).
            resp.set_header(auth.DESTINATION_HEADER, self.verifier.own_destination)
        identity: auth.Identity | None = getattr(req.context, "identity", None)
        if identity is None:
            return  # nothing to sign with: the caller was refused
        body = resp.render_body() or b""
        resp.data = body
        status = resp.status_code
        resp.set_header(auth.RESPONSE_HEADER,
                        auth.response_mac(identity.key, identity.nonce, status, body))


class _RequestIds:
    """Each call under a log context of its own: a new request id, and the caller's global
    request id (``X-OpenStack-Request-Id``, well-formed only) when it acts for a user's
    request, so this service's lines for it name the request that started it. Calls made
    for a request are logged at INFO (they are few: binds, programs), the periodic rest at
    DEBUG. The header is not signed: it names a request in logs and grants nothing."""

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        global_id = request_ids.valid_global_id(req.get_header(request_ids.HEADER))
        req.context.log_context = request_ids.make(global_request_id=global_id)
        request_ids.activate(req.context.log_context)

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         req_succeeded: bool) -> None:
        log_context = getattr(req.context, "log_context", None)
        if log_context is None:
            return
        LOG.log(logging.INFO if log_context.global_request_id else logging.DEBUG,
                "Internal call %s %s answered %s", req.method, req.path, resp.status_code)
        request_ids.deactivate(log_context)


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


def caller_node(req: falcon.Request) -> str | None:
    """The node whose key signed this request; None for the cloud's secret."""
    return req.context.identity.node


def respond(resp: falcon.Response, body: object, status: int = 200) -> None:
    resp.status = status
    resp.content_type = falcon.MEDIA_JSON
    resp.data = orjson.dumps(body)


class _Resource:
    def __init__(self, methods: dict[str, Handler]) -> None:
        for method, handler in methods.items():
            setattr(self, f"on_{method.lower()}", handler)


def build_app(keys: bytes | auth.Keyring, ttl: int, routes: dict[str, dict[str, Handler]],
              *, max_body: int | None = None,
              node_paths: Collection[str] | None = None, destination: str = "",
              replay: auth.ReplayGuard | None = None,
              not_before: int | None = None,
              verifier: auth.Verifier | None = None,
              outage: DatabaseOutage | None = None) -> falcon.App:
    """The app for ``routes``; calls signed with a node's key reach only ``node_paths``
    (None: every path, for servers whose keyring holds node keys only). ``destination``,
    ``replay`` and ``not_before``: see :class:`acceld.internal.auth.Verifier` (or give
    the ``verifier`` itself). ``outage``: the database's outage log, for a server whose
    routes use the database (the conductor): an unreachable database is then a 503 with
    ``Retry-After``, logged once per outage, not a 500 with a traceback per call."""
    if verifier is None:
        verifier = auth.Verifier(keys, ttl, destination=destination, replay=replay,
                                 not_before=not_before)
    app = falcon.App(middleware=[_RequestIds(), _Authenticate(verifier,
                                               max_body if max_body is not None else MAX_BODY,
                                               node_paths, outage)])
    app.set_error_serializer(_error_serializer)
    if outage is not None:
        app.add_error_handler(Exception, _database_errors(outage))
    for path, methods in routes.items():
        app.add_route(path, _Resource(methods))
    return app


def _database_errors(outage: DatabaseOutage) -> Callable[..., None]:
    """Falcon's handler of unexpected exceptions: an unreachable database is a 503 (logged
    once per outage); anything else is a bug, logged with its traceback, a bare 500."""

    def handle(req: falcon.Request, resp: falcon.Response, ex: Exception,
               params: dict) -> None:
        if isinstance(ex, falcon.HTTPError):  # Falcon picks the most specific handler;
            raise ex  # this is a safety net
        if outage.is_outage(ex):
            outage.down(ex, _OUTAGE_CONSEQUENCE)
            raise _unavailable() from None
        LOG.exception("Unexpected error in internal call %s %s", req.method, req.path)
        raise falcon.HTTPInternalServerError() from None

    return handle


class InternalServer:
    """A running internal server; ``url`` is where it listens."""

    def __init__(self, app: Callable[..., Any], host: str, port: int, *,
                 cert_file: str | None = None,
                 key_file: str | None = None, limits: Limits | None = None,
                 admit: Admit | None = None) -> None:
        context = None
        scheme = "http"
        if cert_file:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert_file, key_file)
            scheme = "https"
        self._server = PoolServer(app, host, port, ssl_context=context, limits=limits,
                                  admit=admit)
        self.port = self._server.port
        self.url = f"{scheme}://{host}:{self.port}"

    @property
    def open_connections(self) -> int:
        return self._server.open_connections

    @property
    def loop(self) -> ConnectionLoop:
        """The server's connection loop (its counters, for tests and metrics)."""
        return self._server.loop

    def start(self) -> "InternalServer":
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()


def limits_from(conf) -> Limits:  # type: ignore[no-untyped-def]
    internal = conf.internal
    return Limits(threads=internal.server_threads, max_connections=internal.max_connections,
                  header_timeout=internal.header_timeout,
                  request_timeout=internal.request_timeout,
                  idle_timeout=internal.idle_timeout,
                  max_body=internal.max_request_body)


def serve(conf, keys: bytes | auth.Keyring,  # type: ignore[no-untyped-def]
          routes: dict[str, dict[str, Handler]], host: str, port: int, *,
          destination: str | Callable[[int], str],
          node_paths: Collection[str] | None = None,
          replay: auth.ReplayGuard | None = None,
          not_before: int | None = None,
          own_destination: str | None = None,
          outage: DatabaseOutage | None = None,
          database: object | None = None) -> InternalServer:
    """Start the authenticated internal app for ``routes``, with TLS and limits from
    ``[internal]``; warn when it listens beyond loopback without TLS. ``/healthcheck``
    answers without a credential (acceld.healthcheck), checking ``database`` if given.

    ``destination``: this server's name, or a function of the port it is bound to (for
    a server on a free port that is named by its address). ``own_destination``: a name
    only this process accepts, announced on every answer (see auth.Verifier)."""
    verifier = auth.Verifier(keys, conf.internal.credential_ttl, replay=replay,
                             not_before=not_before, own_destination=own_destination)
    app = build_app(keys, conf.internal.credential_ttl, routes,
                    max_body=conf.internal.max_request_body, node_paths=node_paths,
                    verifier=verifier, outage=outage)
    from acceld import healthcheck

    server = InternalServer(healthcheck.mount(app, conf, database), host, port,
                            cert_file=conf.internal.tls_cert_file,
                            key_file=conf.internal.tls_key_file,
                            limits=limits_from(conf), admit=genuine_calls(verifier))
    verifier.destination = destination(server.port) if callable(destination) else destination
    server.start()
    warn_if_exposed(conf, host, server.url)
    return server


def genuine_calls(verifier: auth.Verifier) -> Admit:
    """The pool server's ``admit``: a body is read before the call is served only for a
    head whose credential is genuine (the same path as :class:`_Authenticate` signs)."""

    def admit(method: str, target: str, headers: dict[str, str]) -> bool:
        path, _, query = target.partition("?")
        path = unquote(path, "iso-8859-1") + (f"?{query}" if query else "")
        return verifier.genuine(method, path, headers.get(auth.HEADER.lower()),
                                headers.get(auth.NODE_HEADER.lower()),
                                headers.get(auth.DIGEST_HEADER.lower()))

    return admit


def warn_if_exposed(conf, host: str, url: str) -> bool:  # type: ignore[no-untyped-def]
    """Log a WARNING (and return True) when ``host`` is beyond loopback and TLS is off."""
    if conf.internal.tls_cert_file or is_loopback(host):
        return False
    LOG.warning("Internal server %s listens beyond loopback without TLS: its calls and "
                "answers are signed but not encrypted, so anyone on the network can read "
                "them; set [internal] tls_cert_file and tls_key_file", url)
    return True


def advertised_endpoint(conf, host: str, port: int) -> str:  # type: ignore[no-untyped-def]
    """What a server tells its peer to call: ``host:port``, or an https URL under TLS."""
    host_port = f"{host}:{port}"
    return f"https://{host_port}" if conf.internal.tls_cert_file else host_port
