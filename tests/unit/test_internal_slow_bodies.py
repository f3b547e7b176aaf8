"""No internal-server thread waits for a client's body (issue 26): the connection loop
reads a body before a thread runs the application, and only for a genuine credential.

The server is the production one (acceld.internal.server.serve) with 4 threads and a
10 s request timeout: before bodies were read by the loop, 4 connections announcing a
body they never sent held every thread for those 10 s, and a heartbeat waited with them.
"""

from __future__ import annotations

import socket
import time
from typing import Iterator

import falcon
import pytest

from acceld.clients.internal import InternalClient
from acceld.internal import auth
from acceld.internal.server import InternalServer, json_body, respond, serve
from tests.conftest import make_conf
from tests.support.net import read_until_closed
from tests.support.slow_bodies import SlowBodies

SECRET = b"slow-bodies-test-secret-0123456789abcdef"
DESTINATION = "slow-bodies"
THREADS = 4
REQUEST_TIMEOUT = 10.0
BODY = b" " * 4096


SERVED: list[object] = []  # the bodies the application was called with


def _echo(req: falcon.Request, resp: falcon.Response) -> None:
    SERVED.append(json_body(req))
    respond(resp, {"echo": SERVED[-1]})


@pytest.fixture
def server(tmp_path) -> Iterator[InternalServer]:
    conf = make_conf(str(tmp_path), internal__server_threads=THREADS,
                     internal__request_timeout=REQUEST_TIMEOUT,
                     internal__max_connections=512)
    srv = serve(conf, SECRET, {"/echo": {"POST": _echo}}, "127.0.0.1", 0,
                destination=DESTINATION)
    SERVED.clear()
    yield srv
    srv.stop()


def _head(extra: dict[str, str], length: int = len(BODY)) -> bytes:
    lines = ["POST /echo HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
             f"Content-Length: {length}", *(f"{k}: {v}" for k, v in extra.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _genuine_head(_: int = 0) -> bytes:
    """A head whose credential is genuine, for BODY (which it never sends whole)."""
    return _head(auth.headers(SECRET, "POST", "/echo", BODY, destination=DESTINATION))


def _timed_echo(srv: InternalServer) -> float:
    client = InternalClient(srv.url, SECRET, destination=DESTINATION, timeout=5)
    try:
        started = time.monotonic()
        assert client.call("POST", "/echo", {"n": 1}) == {"echo": {"n": 1}}
        return time.monotonic() - started
    finally:
        client.close()


def test_genuine_calls_sending_bodies_slowly_or_never_hold_no_thread(server) -> None:
    slow = SlowBodies(("127.0.0.1", server.port), _genuine_head, silent=64, trickling=64)
    try:
        time.sleep(0.5)  # every head is in and the trickle runs
        for _ in range(5):
            assert _timed_echo(server) < 1.0
        assert SERVED == [{"n": 1}] * 5  # none of the 128 reached the application
        assert slow.open_count() == 128
    finally:
        slow.close()


def test_a_genuine_call_whose_body_stalls_gets_408_and_is_closed(tmp_path) -> None:
    conf = make_conf(str(tmp_path), internal__request_timeout=1.0)
    srv = serve(conf, SECRET, {"/echo": {"POST": _echo}}, "127.0.0.1", 0,
                destination=DESTINATION)
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
            sock.sendall(_genuine_head() + b" " * 10)
            started = time.monotonic()
            answer = read_until_closed(sock, 5)
            assert 0.5 < time.monotonic() - started < 3.0
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"did not arrive within 1 s" in answer
    finally:
        srv.stop()


def test_a_strangers_body_is_not_read_it_is_refused_at_once(server) -> None:
    """No credential, a forged one, one for another server: 401 from the head alone, the
    body never sent, and the connection closed."""
    forged = auth.headers(b"another-secret-0123456789abcdef0123", "POST", "/echo", BODY,
                          destination=DESTINATION)
    elsewhere = auth.headers(SECRET, "POST", "/echo", BODY, destination="another-server")
    for extra in ({}, forged, elsewhere):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            started = time.monotonic()
            sock.sendall(_head(extra))
            answer = read_until_closed(sock, 5)
            assert time.monotonic() - started < 1.0
        assert answer.startswith(b"HTTP/1.1 401 "), (extra, answer[:200])


def test_a_genuine_call_sent_whole_is_served_with_its_body(server) -> None:
    """The body the loop read is the application's: the signed hash matches it."""
    body = b'{"n": 2}'
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        head = _head(auth.headers(SECRET, "POST", "/echo", body, destination=DESTINATION),
                     len(body))
        for piece in (head, body[:3], body[3:]):  # the body in two writes, after the head
            sock.sendall(piece)
            time.sleep(0.05)
        sock.settimeout(5)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert answer.endswith(b'{"echo":{"n":2}}'), answer[-200:]
