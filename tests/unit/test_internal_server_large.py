"""Large bodies and answers on the internal server (acceld.serving.pool_server): a request
body or an answer larger than the socket's buffers is waited for, not lost or cut, over
plain TCP and TLS and over one kept-alive connection; a client that stops taking its
answer is dropped at the request timeout without holding a server thread."""

from __future__ import annotations

import hashlib
import socket
import time

import pytest

from acceld.clients.internal import InternalClient
from acceld.internal import auth
from acceld.internal.server import InternalServer, build_app, json_body, respond
from acceld.serving.pool_server import Limits
from tests.support.tls import self_signed

SECRET = b"large-answer-test-secret-0123456789a"
ANSWER_BYTES = 6 * 1024 * 1024  # far beyond a loopback socket's send buffer


BIG_ANSWER = {"records": "0123456789abcdef" * (ANSWER_BYTES // 16)}


def _hardware(req, resp) -> None:  # type: ignore[no-untyped-def]
    """A large answer, as GET /hardware of a big node is."""
    respond(resp, BIG_ANSWER)


def _digest(req, resp) -> None:  # type: ignore[no-untyped-def]
    body = json_body(req)
    respond(resp, {"sha256": hashlib.sha256(body["blob"].encode()).hexdigest()})


def _server(tmp_path, tls: bool,  # type: ignore[no-untyped-def]
            **limits) -> tuple[InternalServer, object]:
    """A started server, and its certificate's path under TLS (else None)."""
    app = build_app(SECRET, 60, {"/hardware": {"GET": _hardware}, "/digest": {"POST": _digest}},
                    max_body=8 * 1024 * 1024)
    cert = key = None
    if tls:
        cert, key = self_signed(tmp_path)
    return InternalServer(app, "127.0.0.1", 0, cert_file=cert and str(cert),
                          key_file=key and str(key),
                          limits=Limits(threads=2, **limits)).start(), cert


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_large_bodies_and_answers_arrive_whole(tmp_path, tls: bool) -> None:
    srv, cert = _server(tmp_path, tls)
    try:
        client = InternalClient(srv.url, SECRET, verify=str(cert) if cert else True)
        blob = "x" * (5 * 1024 * 1024)
        for _ in range(2):  # twice over one kept-alive connection
            assert client.call("POST", "/digest", {"blob": blob}, timeout=30) == {
                "sha256": hashlib.sha256(blob.encode()).hexdigest()}
            assert client.call("GET", "/hardware", timeout=30) == BIG_ANSWER
    finally:
        srv.stop()


def test_a_client_that_stops_reading_is_dropped_at_the_request_timeout(tmp_path) -> None:
    srv, _ = _server(tmp_path, tls=False, request_timeout=1.0)
    client = InternalClient(srv.url, SECRET)
    try:
        headers = auth.Signer(SECRET).headers("GET", "/hardware", b"")[0]
        sock = socket.create_connection(("127.0.0.1", srv.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        head = "GET /hardware HTTP/1.1\r\nHost: x\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        sock.sendall(head.encode())
        # Never read: the server's write waits for room, then gives up at the deadline.
        deadline = time.monotonic() + 10
        while srv.loop.serving == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        while srv.loop.serving and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.loop.serving == 0, "the stalled answer still holds a server thread"
        # The server keeps serving others meanwhile and after.
        blob = "y" * 1000
        assert client.call("POST", "/digest", {"blob": blob}, timeout=5)["sha256"] == \
            hashlib.sha256(blob.encode()).hexdigest()
        sock.close()
    finally:
        srv.stop()
