"""acceld.serving.connection_loop's BodyBuffering: a request reaches ``serve`` with its whole body
buffered, or at once when the owner is to refuse it; a late or oversized body is
answered by the loop. ``serve`` here never reads the socket: it answers from
``conn.buffer`` alone, so a request served before its body was in shows as a short body.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Iterator

import pytest

from acceld.serving.connection_loop import (HEAD_END, BodyBuffering, Conn, ConnectionLoop,
                                            Outcome, send_refusal)
from acceld.serving.request_framing import chunked_end, framing
from tests.support.net import read_until_closed

MAX_BODY = 1024
BODY_TIMEOUT = 1.0


class Server:
    def __init__(self, admit=None) -> None:  # type: ignore[no-untyped-def]
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.served: list[tuple[bytes, bool]] = []  # (what was buffered of it, continued)
        self.loop = ConnectionLoop(
            [self.listener], self.serve, threads=2, max_connections=64, header_timeout=5.0,
            idle_timeout=5.0, name="test",
            body=BodyBuffering(MAX_BODY, BODY_TIMEOUT, admit=admit,
                               refuse=lambda conn, status: send_refusal(conn, status, b"{}")))
        self.loop.start()

    def serve(self, conn: Conn) -> Outcome:
        end = conn.buffer.index(HEAD_END) + len(HEAD_END)
        frame = framing(bytes(conn.buffer[:end - len(HEAD_END)]))
        if frame.chunked:
            body_end = chunked_end(conn.buffer, end, MAX_BODY) or len(conn.buffer)
        else:
            body_end = min(len(conn.buffer), end + (frame.content_length or 0))
        body = bytes(conn.buffer[end:body_end])
        del conn.buffer[:body_end]
        self.served.append((body, conn.continued))
        answer = str(len(body)).encode()
        conn.sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                          % (len(answer), answer))
        return Outcome.KEEP

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)

    def stop(self) -> None:
        self.loop.stop()
        self.listener.close()


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server()
    yield srv
    srv.stop()


def _post(length: int, extra: bytes = b"") -> bytes:
    return b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n" % (length, extra)


def _chunked_head(extra: bytes = b"") -> bytes:
    return b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n%s\r\n" % extra


def _answer(sock: socket.socket) -> bytes:
    """One answer (status line to the end of its Content-Length body)."""
    data = b""
    while HEAD_END not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(HEAD_END)
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(4096)
    return head + HEAD_END + body


def _in_pieces(sock: socket.socket, data: bytes, pieces: int = 4) -> None:
    """``data`` in ``pieces`` writes with a pause between: the loop sees several reads."""
    step = max(1, len(data) // pieces)
    for at in range(0, len(data), step):
        sock.sendall(data[at:at + step])
        time.sleep(0.02)


def test_a_body_sent_in_pieces_is_served_whole_once_in(server) -> None:
    body = b"b" * 1000
    with server.connect() as sock:
        sock.sendall(_post(len(body)))
        _in_pieces(sock, body, 5)
        assert _answer(sock).endswith(b"1000")
    assert server.served == [(body, False)]


def test_a_chunked_body_sent_in_pieces_is_served_whole_once_in(server) -> None:
    body = b"5\r\nhello\r\n3\r\nabc\r\n0\r\nTrailer: t\r\n\r\n"
    with server.connect() as sock:
        sock.sendall(_chunked_head())
        _in_pieces(sock, body, 8)
        assert _answer(sock).endswith(b"%d" % len(body))
    assert server.served == [(body, False)]


def test_pipelined_requests_with_bodies_are_each_served_whole(server) -> None:
    with server.connect() as sock:
        sock.sendall(_post(3) + b"abc" + _chunked_head() + b"2\r\nde\r\n0\r\n\r\n"
                     + _post(0))
        data = b""
        while data.count(b"HTTP/1.1 200 OK") < 3 or not data.endswith(b"\r\n\r\n0"):
            data += sock.recv(4096)
    assert [a.rsplit(b"\r\n", 1)[1] for a in data.split(b"HTTP/1.1 200 OK")[1:]] == [
        b"3", b"12", b"0"]
    assert [body for body, _ in server.served] == [b"abc", b"2\r\nde\r\n0\r\n\r\n", b""]


def test_a_body_announced_over_the_limit_is_served_at_once_unread(server) -> None:
    """The owner answers 413 from the head; the loop read none of the body."""
    with server.connect() as sock:
        sock.sendall(_post(MAX_BODY + 1) + b"x" * 10)
        assert _answer(sock).endswith(b"10")  # what had arrived, never waited for more
    assert len(server.served) == 1


@pytest.mark.parametrize("framing_headers", [
    b"Content-Length: 5\r\nContent-Length: 5\r\n",
    b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: gzip\r\n",
    b"Content-Length: -1\r\n",
])
def test_ambiguous_framing_is_served_at_once_for_the_owner_to_refuse(
        server, framing_headers: bytes) -> None:
    with server.connect() as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\n" + framing_headers + b"\r\n")
        assert _answer(sock).startswith(b"HTTP/1.1 200")
    assert len(server.served) == 1


def test_a_chunked_body_over_the_limit_is_refused_413_and_closed(server) -> None:
    with server.connect() as sock:
        sock.sendall(_chunked_head() + b"%x\r\n" % (MAX_BODY + 1))
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert server.served == []


def test_a_late_body_is_refused_408_at_its_deadline_and_closed(server) -> None:
    with server.connect() as sock:
        sock.sendall(_post(100) + b"a" * 10)
        started = time.monotonic()
        answer = read_until_closed(sock)
        assert BODY_TIMEOUT - 0.2 < time.monotonic() - started < BODY_TIMEOUT + 2
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
    assert server.served == []


def test_a_client_that_expects_100_continue_gets_it_once_then_sends_its_body(server) -> None:
    with server.connect() as sock:
        sock.sendall(_post(5, b"Expect: 100-continue\r\n"))
        sock.settimeout(5)
        assert sock.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"hello")
        assert _answer(sock).endswith(b"5")
    assert server.served == [(b"hello", True)]  # the owner knows not to send another


def test_a_body_sent_with_its_head_gets_no_100_continue(server) -> None:
    with server.connect() as sock:
        sock.sendall(_post(5, b"Expect: 100-continue\r\n") + b"hello")
        assert _answer(sock).startswith(b"HTTP/1.1 200")
    assert server.served == [(b"hello", False)]


def test_a_head_not_admitted_is_served_at_once_without_its_body() -> None:
    seen: list[bytes] = []

    def admit(head: bytes) -> bool:
        seen.append(head)
        return b"X-Genuine: yes" in head

    srv = Server(admit=admit)
    try:
        with srv.connect() as sock:
            sock.sendall(_post(5))  # not admitted: served with no body
            assert _answer(sock).endswith(b"0")
        with srv.connect() as sock:
            sock.sendall(_post(5, b"X-Genuine: yes\r\n"))
            sock.sendall(b"hello")
            assert _answer(sock).endswith(b"5")
    finally:
        srv.stop()
    assert [body for body, _ in srv.served] == [b"", b"hello"]
    assert len(seen) == 2


def test_slow_bodies_hold_no_thread_while_others_are_served(server) -> None:
    """Both loop threads stay free while 20 bodies are still to come."""
    waiting = [server.connect() for _ in range(20)]
    try:
        for sock in waiting:
            sock.sendall(_post(100))
        done = threading.Event()

        def other() -> None:
            with server.connect() as sock:
                sock.sendall(_post(2) + b"ok")
                _answer(sock)
            done.set()

        threading.Thread(target=other, daemon=True).start()
        assert done.wait(1.0)
        assert server.served == [(b"ok", False)]  # none of the 20 reached serve
    finally:
        for sock in waiting:
            sock.close()
