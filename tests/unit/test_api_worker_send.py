"""acceld.serving.api_worker.ClientSocket: an answer goes out in one send when the socket
takes it; a client that does not read a large answer blocks its own thread only, outside
the serving slot, so the worker's other requests are served meanwhile."""

from __future__ import annotations

import socket
import threading

import pytest

from acceld.serving import serving_slot
from acceld.serving.api_worker import ClientSocket
from acceld.serving.connection_loop import Conn, Phase


@pytest.fixture
def pair():
    left, right = socket.socketpair()
    yield left, right
    left.close()
    right.close()


def _client(sock: socket.socket) -> ClientSocket:
    return ClientSocket(Conn(sock, ("test", 0), 0.0, Phase.HEAD), send_timeout=10.0)


def _read(sock: socket.socket, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        chunk = sock.recv(1 << 20)
        assert chunk
        got += chunk
    return bytes(got)


def test_gathered_writes_arrive_whole_in_order(pair):
    server, peer = pair
    client = _client(server)
    client.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
    client.sendall(b"body")
    client.flush()
    assert client.sent == 23
    assert _read(peer, 23) == b"HTTP/1.1 200 OK\r\n\r\nbody"


def test_a_client_that_does_not_read_holds_no_serving_slot(pair):
    server, peer = pair
    server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    answer = bytes(range(256)) * 16384  # 4 MiB: far over the socket's buffers
    slot = serving_slot.Slot()
    sending, done = threading.Event(), threading.Event()
    after: list[bool] = []

    def serve() -> None:
        with slot.held():
            client = _client(server)
            sending.set()  # the slot is held: the test's take below waits for the step out
            client.sendall(answer)  # over FLUSH_BYTES: sent now, blocked until the peer reads
            client.flush()
            after.append(serving_slot.holds_slot())
        done.set()

    thread = threading.Thread(target=serve)
    thread.start()
    assert sending.wait(5)
    with slot.held():  # another request can be served while the answer waits
        assert not done.is_set()
    assert _read(peer, len(answer)) == answer
    thread.join(10)
    assert after == [True]
