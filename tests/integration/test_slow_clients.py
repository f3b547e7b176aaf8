"""Slow and idle clients cannot stall the public API (issue 16, item 2).

A real `acceld all` with its default worker layout and short client timeouts:
idle connections and slowloris clients (partial headers, a stalled body) are
held open while another client is served, and each stalled connection is
dropped once its timeout passed.
"""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import pytest
import requests

from tests.support import allinone
from tests.support.net import free_port
from tests.support.slow_bodies import SlowBodies

HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
IDLE_CONNECTIONS = 20  # more than the default 2 workers x 4 threads


@pytest.fixture(scope="module")
def aio(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slow-clients")
    conf = tmp / "acceld.conf"
    conf.write_text(
        f"[DEFAULT]\nhost = slow-node\n"
        f"[api]\nclient_header_timeout = {HEADER_TIMEOUT}\n"
        f"client_body_timeout = {BODY_TIMEOUT}\n"
        f"[conductor]\nport = {free_port()}\n"
        f"[agent]\nport = {free_port()}\nenabled_drivers = fake\n")
    launched = allinone.launch(str(tmp / "state"), str(conf))
    yield launched
    allinone.stop(launched.proc)


def _address(aio) -> tuple[str, int]:
    parts = urlsplit(aio.url)
    return parts.hostname, parts.port


def _connect(aio) -> socket.socket:
    return socket.create_connection(_address(aio), timeout=10)


def _timed_get(aio) -> float:
    started = time.monotonic()
    resp = requests.get(aio.url, timeout=5)
    assert resp.status_code == 200
    return time.monotonic() - started


def _closed_after(sock: socket.socket, limit: float) -> tuple[float, bytes]:
    """Seconds until the server closed ``sock`` (and what it sent first); fails after ``limit``."""
    started = time.monotonic()
    sock.settimeout(limit)
    received = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
    except ConnectionResetError:
        pass
    except socket.timeout:
        pytest.fail(f"the server kept the stalled connection open for {limit} s")
    return time.monotonic() - started, received


def test_idle_connections_and_slowloris_do_not_delay_others(aio):
    idle = [_connect(aio) for _ in range(IDLE_CONNECTIONS)]
    slow = [_connect(aio) for _ in range(2)]
    try:
        for sock in slow:  # a request line and one header, never the blank line
            sock.sendall(b"GET /accelerator/v2 HTTP/1.1\r\nHost: slow\r\n")
        opened = time.monotonic()
        for _ in range(5):
            assert _timed_get(aio) < 1.0
        # All of them still waiting, before their header timeout ran out.
        assert time.monotonic() - opened < HEADER_TIMEOUT
        elapsed, received = _closed_after(slow[0], HEADER_TIMEOUT + 5)
        waited = time.monotonic() - opened
        assert received == b""
        assert HEADER_TIMEOUT - 0.5 <= waited <= HEADER_TIMEOUT + 3, waited
        elapsed, received = _closed_after(idle[0], HEADER_TIMEOUT + 5)
        assert received == b""
        # The API still answers at once after dropping them.
        assert _timed_get(aio) < 1.0
    finally:
        for sock in idle + slow:
            sock.close()


def test_a_slowloris_sending_a_byte_at_a_time_is_dropped_at_the_deadline(aio):
    sock = _connect(aio)
    try:
        started = time.monotonic()
        closed_at = None
        # One header byte every 0.2 s: every read is quick, the headers never complete.
        for byte in b"GET /accelerator/v2 HTTP/1.1\r\nX-Slow: " + b"a" * 100:
            try:
                sock.sendall(bytes([byte]))
                sock.settimeout(0.2)
                if sock.recv(1) == b"":
                    closed_at = time.monotonic()
            except socket.timeout:
                continue  # still open: send the next byte
            except (BrokenPipeError, ConnectionResetError):
                closed_at = time.monotonic()
            break
        assert closed_at is not None, "the connection outlived every byte it was sent"
        assert HEADER_TIMEOUT - 0.5 <= closed_at - started <= HEADER_TIMEOUT + 1.5
    finally:
        sock.close()


def test_a_stalled_body_gets_408_and_is_closed(aio):
    sock = _connect(aio)
    try:
        host, port = _address(aio)
        sock.sendall(b"POST /accelerator/v2/device_profiles HTTP/1.1\r\n"
                     + f"Host: {host}:{port}\r\n".encode()
                     + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                     + b'{"name": ')
        started = time.monotonic()
        assert _timed_get(aio) < 1.0
        elapsed, received = _closed_after(sock, BODY_TIMEOUT + 5)
        assert received.startswith(b"HTTP/1.1 408 "), received[:200]
        assert b"did not arrive within" in received
        assert BODY_TIMEOUT - 0.5 <= time.monotonic() - started <= BODY_TIMEOUT + 3
    finally:
        sock.close()


def test_bodies_sent_slowly_or_never_hold_no_thread(aio):
    """64 connections announcing a body they never send and 64 trickling one (issue 26):
    the loop reads bodies before a thread serves the request, so the API's 2 workers x
    4 threads all stay free (before: every thread waited for a body until
    client_body_timeout, and every other client with them)."""
    host, port = _address(aio)

    def head(_: int) -> bytes:
        return (b"POST /accelerator/v2/device_profiles HTTP/1.1\r\n"
                + f"Host: {host}:{port}\r\n".encode()
                + b"Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n")

    slow = SlowBodies((host, port), head, silent=64, trickling=64)
    try:
        opened = time.monotonic()
        for _ in range(5):
            assert _timed_get(aio) < 1.0
        started = time.monotonic()
        resp = requests.post(aio.url + "/device_profiles", json=[{
            "name": "slow-bodies-beside", "groups": [{"resources:FPGA": "1"}]}], timeout=5)
        assert resp.status_code == 201, resp.text
        assert time.monotonic() - started < 1.0
        assert time.monotonic() - opened < BODY_TIMEOUT  # all of them still waiting
        deadline = time.monotonic() + BODY_TIMEOUT + 5
        while slow.open_count() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert slow.open_count() == 0, "late bodies' connections were not closed"
        assert len(slow.answers) == 128
        assert {answer.split(b"\r\n", 1)[0] for answer in slow.answers.values()} == {
            b"HTTP/1.1 408 Request Timeout"}, slow.answers
    finally:
        slow.close()


def _profile(name: str) -> bytes:
    return json.dumps([{"name": name, "groups": [{"resources:FPGA": "1"}]}]).encode()


def _post_head(aio, framing: bytes) -> bytes:
    host, port = _address(aio)
    return (b"POST /accelerator/v2/device_profiles HTTP/1.1\r\n"
            + f"Host: {host}:{port}\r\n".encode()
            + b"Content-Type: application/json\r\n" + framing + b"\r\n")


def test_a_chunked_body_is_read_by_the_loop_and_served(aio):
    body = _profile("framing-chunked")
    with _connect(aio) as sock:
        sock.sendall(_post_head(aio, b"Transfer-Encoding: chunked\r\n"))
        for at in range(0, len(body), 10):  # many chunks, each its own write
            piece = body[at:at + 10]
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        sock.sendall(b"0\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 201 ")


def test_expect_100_continue_gets_one_100_continue(aio):
    body = _profile("framing-continue")
    with _connect(aio) as sock:
        sock.sendall(_post_head(aio, b"Content-Length: %d\r\nExpect: 100-continue\r\n"
                                % len(body)))
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 201 "), answer[:300]  # no second 100 Continue


@pytest.mark.parametrize("framing", [
    b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
    b"Content-Length: 5\r\nContent-Length: 6\r\n",
])
def test_smuggling_shaped_framing_is_refused_400_at_once(aio, framing):
    with _connect(aio) as sock:
        sock.sendall(_post_head(aio, framing))
        started = time.monotonic()
        elapsed, received = _closed_after(sock, 5)
        assert time.monotonic() - started < 1.0
    assert received.startswith(b"HTTP/1.1 400 "), received[:300]


def test_a_body_announced_over_the_limit_is_refused_413_unread_and_closed(aio):
    with _connect(aio) as sock:
        sock.sendall(_post_head(aio, b"Content-Length: %d\r\n" % (64 * 1024 * 1024)))
        started = time.monotonic()
        elapsed, received = _closed_after(sock, 5)
        assert time.monotonic() - started < 1.0  # not waiting for (nor draining) a body
    assert received.startswith(b"HTTP/1.1 413 "), received[:300]


def test_kept_alive_connections_still_serve_requests(aio):
    with requests.Session() as session:
        for _ in range(3):
            assert session.get(aio.url, timeout=5).status_code == 200


def test_clients_that_never_close_do_not_stall_the_workers(aio):
    """Answered with Connection: close, a client that keeps its end open is waited for
    (up to 2 s, as gunicorn does) without holding up the worker's other connections."""
    host, port = _address(aio)
    lingering = []
    try:
        for _ in range(6):
            sock = _connect(aio)
            sock.sendall(f"GET /accelerator/v2 HTTP/1.1\r\nHost: {host}:{port}\r\n"
                         "Connection: close\r\n\r\n".encode())
            received = b""
            while b"\r\n\r\n" not in received:
                received += sock.recv(4096)
            assert received.startswith(b"HTTP/1.1 200 ")
            lingering.append(sock)  # read the answer, never close
        for _ in range(3):
            assert _timed_get(aio) < 1.0
    finally:
        for sock in lingering:
            sock.close()
