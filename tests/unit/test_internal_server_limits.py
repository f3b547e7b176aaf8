"""Internal servers spend nothing on strangers and bounded resources on everyone (issue 16, 3).

Each test talks to a real internal server on loopback over raw sockets, where
the point is what the server does before a request is complete.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Iterator

import pytest

from acceld.clients.internal import InternalClient
from acceld.internal import auth
from acceld.internal.server import InternalServer, build_app, json_body, respond
from acceld.serving.pool_server import Limits

SECRET = b"limits-test-secret-0123456789abcdef"
BIG = 32 * 1024 * 1024


def _wait_until(condition, seconds: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def _echo(req, resp) -> None:  # type: ignore[no-untyped-def]
    respond(resp, {"got": json_body(req)})


def _server(**limits) -> InternalServer:  # type: ignore[no-untyped-def]
    app = build_app(SECRET, 60, {"/echo": {"POST": _echo}})
    return InternalServer(app, "127.0.0.1", 0, limits=Limits(**limits)).start()


@pytest.fixture
def server() -> Iterator[InternalServer]:
    srv = _server(threads=4, max_connections=200, header_timeout=30.0, request_timeout=30.0)
    yield srv
    srv.stop()


def _head(length: int, extra: dict[str, str] | None = None) -> bytes:
    lines = ["POST /echo HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
             f"Content-Length: {length}"]
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(sock: socket.socket, timeout: float = 2.0) -> bytes:
    """Everything the server sends until it closes (within ``timeout`` seconds)."""
    sock.settimeout(timeout)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def _connect(srv: InternalServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=5)


# Credentials are built in the test from these kinds: parameter ids must be the same in every
# collecting process (pytest-xdist), so no clock reading here.
_STRANGER_CREDENTIALS = {
    "none": lambda: None,
    "malformed": lambda: "1.2",
    "expired": lambda: f"{int(time.time()) - 3600}.{'ab' * 12}.{'0' * 64}",
    "wrong-mac": lambda: f"{int(time.time())}.{'ab' * 12}.{'0' * 64}",
}


@pytest.mark.parametrize("credential_kind", sorted(_STRANGER_CREDENTIALS))
def test_a_stranger_announcing_32_mib_gets_401_without_the_body_being_read(
        server, credential_kind) -> None:
    """Only the headers are sent: a server that waited for the body would never answer."""
    credential = _STRANGER_CREDENTIALS[credential_kind]()
    extra = {auth.DIGEST_HEADER: "0" * 64}
    if credential is not None:
        extra[auth.HEADER] = credential
    with _connect(server) as sock:
        started = time.monotonic()
        sock.sendall(_head(BIG, extra))
        answer = _answer(sock)
    assert answer.split(b"\r\n", 1)[0].split(b" ")[1] == b"401", answer[:200]
    assert time.monotonic() - started < 1.0
    assert b"A valid internal credential is required." in answer


def test_a_credential_holder_announcing_32_mib_gets_413_without_the_body_being_read(
        server) -> None:
    with _connect(server) as sock:
        sock.sendall(_head(BIG, auth.headers(SECRET, "POST", "/echo", b"x" * 10)))
        answer = _answer(sock)
    assert b" 413 " in answer.split(b"\r\n", 1)[0], answer[:200]


def test_a_body_that_does_not_match_its_signed_hash_is_401(server) -> None:
    signed = auth.headers(SECRET, "POST", "/echo", b'{"a": 1}')
    with _connect(server) as sock:
        sock.sendall(_head(8, signed) + b'{"a": 2}')
        answer = _answer(sock)
    assert b" 401 " in answer.split(b"\r\n", 1)[0], answer[:200]


def test_idle_connections_hold_no_thread_and_delay_nobody(server) -> None:
    """Far more idle connections than workers: another client is still answered at once."""
    client = InternalClient(server.url, SECRET)
    assert client.call("POST", "/echo", {"warm": 1}) == {"got": {"warm": 1}}
    threads_before = threading.active_count()
    idle = [_connect(server) for _ in range(100)]
    try:
        _wait_until(lambda: server.open_connections >= 101)  # accepted: waiting in the epoll
        started = time.monotonic()
        assert client.call("POST", "/echo", {"n": 1}, timeout=5) == {"got": {"n": 1}}
        assert time.monotonic() - started < 1.0
        assert threading.active_count() <= threads_before + 1, (
            threading.active_count(), threads_before)
    finally:
        for sock in idle:
            sock.close()


def test_half_sent_heads_hold_no_worker(server) -> None:
    """Clients that send part of their headers and stall do not take the 4 workers."""
    client = InternalClient(server.url, SECRET)
    stalled = [_connect(server) for _ in range(10)]
    try:
        for sock in stalled:
            sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        assert client.call("POST", "/echo", {"n": 2}, timeout=5) == {"got": {"n": 2}}
        assert time.monotonic() - started < 1.0
    finally:
        for sock in stalled:
            sock.close()


def test_a_silent_connection_is_closed_after_the_header_timeout() -> None:
    srv = _server(header_timeout=0.3)
    try:
        with _connect(srv) as sock:
            started = time.monotonic()
            assert _answer(sock, timeout=5) == b""
            assert 0.2 < time.monotonic() - started < 3.0
        assert srv.open_connections == 0
    finally:
        srv.stop()


def test_a_body_that_stalls_gets_408_at_the_request_timeout() -> None:
    srv = _server(request_timeout=0.5)
    try:
        body = b'{"a": 1}'
        with _connect(srv) as sock:
            started = time.monotonic()
            sock.sendall(_head(len(body), auth.headers(SECRET, "POST", "/echo", body)) + b"{")
            answer = _answer(sock, timeout=5)
            assert 0.4 < time.monotonic() - started < 3.0
        assert b" 408 " in answer.split(b"\r\n", 1)[0], answer[:200]
    finally:
        srv.stop()


def test_at_the_connection_limit_the_oldest_idle_connection_makes_room() -> None:
    srv = _server(max_connections=10, header_timeout=30.0)
    try:
        idle = [_connect(srv) for _ in range(10)]
        client = InternalClient(srv.url, SECRET)
        try:
            assert client.call("POST", "/echo", {"n": 3}, timeout=5) == {"got": {"n": 3}}
            assert _answer(idle[0], timeout=2) == b""  # the oldest was closed for it
            assert srv.open_connections <= 10
        finally:
            for sock in idle:
                sock.close()
    finally:
        srv.stop()


def test_busy_workers_make_requests_wait_not_threads_grow() -> None:
    """More concurrent requests than workers: all answered, by the same few threads."""
    release = threading.Event()
    entered = threading.Semaphore(0)

    def slow(req, resp) -> None:  # type: ignore[no-untyped-def]
        entered.release()
        release.wait(10)
        respond(resp, {"ok": True})

    app = build_app(SECRET, 60, {"/slow": {"POST": slow}})
    srv = InternalServer(app, "127.0.0.1", 0, limits=Limits(threads=2)).start()
    results: list[object] = []
    try:
        threads_before = set(threading.enumerate())
        callers = [threading.Thread(target=lambda: results.append(
            InternalClient(srv.url, SECRET).call("POST", "/slow", {}, timeout=10)))
            for _ in range(6)]
        for caller in callers:
            caller.start()
        assert entered.acquire(timeout=5) and entered.acquire(timeout=5)
        assert not entered.acquire(timeout=0.3)  # the third waits for a worker
        # Only the 6 calling threads were added: the server made none. (Compared as sets:
        # an earlier test's stopped server may still be letting its workers exit.)
        assert set(threading.enumerate()) - threads_before == set(callers)
        release.set()
        for caller in callers:
            caller.join(10)
        assert results == [{"ok": True}] * 6
    finally:
        release.set()
        srv.stop()


def _read_answers(sock: socket.socket, count: int) -> list[tuple[bytes, bytes]]:
    """``count`` answers (head, body) from a connection that stays open, each by its
    Content-Length: pipelined answers can arrive in one recv."""
    answers: list[tuple[bytes, bytes]] = []
    data = b""
    while len(answers) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"closed before an answer: {data!r}"
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        while len(rest) < length:
            chunk = sock.recv(65536)
            assert chunk, f"closed inside an answer: {head!r}"
            rest += chunk
        answers.append((head, rest[:length]))
        data = rest[length:]
    assert data == b"", f"more than {count} answers: {data!r}"
    return answers


def _read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """One answer (head, body) from a connection that stays open."""
    return _read_answers(sock, 1)[0]


def _signed_echo(n: int) -> bytes:
    body = f'{{"n": {n}}}'.encode()
    return _head(len(body), auth.headers(SECRET, "POST", "/echo", body)) + body


def test_one_connection_serves_request_after_request(server) -> None:
    """HTTP/1.1 keep-alive: agents heartbeat over one connection, not one per hello."""
    with _connect(server) as sock:
        for n in range(3):
            sock.sendall(_signed_echo(n))
            head, body = _read_answer(sock)
            assert head.startswith(b"HTTP/1.1 200 "), head
            assert b"connection: close" not in head.lower()
            assert body == f'{{"got":{{"n":{n}}}}}'.encode()
        # Two requests sent at once (pipelined) are answered in order.
        sock.sendall(_signed_echo(7) + _signed_echo(8))
        assert [body for _, body in _read_answers(sock, 2)] == [b'{"got":{"n":7}}',
                                                              b'{"got":{"n":8}}']
    client = InternalClient(server.url, SECRET)
    try:
        client.call("POST", "/echo", {"a": 1})
        before = server.loop.accepted
        for n in range(5):
            client.call("POST", "/echo", {"n": n})
        assert server.loop.accepted == before  # the same connection each time
    finally:
        client.close()


def test_error_answers_and_connection_close_end_the_connection(server) -> None:
    signed = auth.headers(SECRET, "POST", "/echo", b'{"a": 1}')
    with _connect(server) as sock:  # refused (body does not match): closed after the 401
        sock.sendall(_head(8, signed) + b'{"a": 2}')
        answer = _answer(sock)
    assert b" 401 " in answer.split(b"\r\n", 1)[0] and b"Connection: close" in answer
    body = b'{"n": 1}'
    with _connect(server) as sock:
        sock.sendall(_head(len(body), {**auth.headers(SECRET, "POST", "/echo", body),
                                       "Connection": "close"}) + body)
        answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b'{"got":{"n":1}}')
    with _connect(server) as sock:  # not HTTP at all: 400, closed
        sock.sendall(b"HELLO\r\n\r\n")
        assert b" 400 " in _answer(sock).split(b"\r\n", 1)[0]


def test_a_kept_alive_connection_is_closed_after_the_idle_timeout() -> None:
    srv = _server(idle_timeout=0.4, header_timeout=30.0)
    try:
        with _connect(srv) as sock:
            sock.sendall(_signed_echo(1))
            _read_answer(sock)
            started = time.monotonic()
            assert _answer(sock, timeout=5) == b""
            assert 0.3 < time.monotonic() - started < 3.0
        deadline = time.monotonic() + 2
        while srv.open_connections and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.open_connections == 0
    finally:
        srv.stop()


def test_kept_alive_connections_are_idle_ones_at_the_connection_limit() -> None:
    """Kept-alive connections cannot lock newcomers out: the oldest makes room."""
    srv = _server(max_connections=4, header_timeout=30.0, idle_timeout=30.0)
    try:
        kept: list[socket.socket] = []
        try:
            for n in range(4):
                kept.append(_connect(srv))
                kept[n].sendall(_signed_echo(n))
                _read_answer(kept[n])
                # Idle in this order: a thread re-arms its connection after the answer
                # went out, so the next one could otherwise go idle first.
                _wait_until(lambda: srv.loop.idle_connections == n + 1)
            client = InternalClient(srv.url, SECRET)
            assert client.call("POST", "/echo", {"n": 9}, timeout=5) == {"got": {"n": 9}}
            client.close()
            assert _answer(kept[0], timeout=2) == b""  # the oldest idle one was closed
        finally:
            for sock in kept:
                sock.close()
    finally:
        srv.stop()
