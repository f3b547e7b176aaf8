"""The API worker's read deadline (acceld.services.api_worker.DeadlineSocket) on a real
socket pair: what a read past the deadline does with bytes already received."""

from __future__ import annotations

import socket
import time

import pytest

from acceld.services.api_worker import DeadlineSocket


class Expired(Exception):
    pass


class _Conn:
    """What DeadlineSocket reads of its connection: the deadline and what to raise."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline

    def expired(self) -> Exception:
        return Expired()


@pytest.fixture
def pair():
    left, right = socket.socketpair()
    yield left, right
    left.close()
    right.close()


def test_bytes_already_received_are_read_after_the_deadline(pair):
    server, client = pair
    client.sendall(b"body")
    time.sleep(0.05)
    reader = DeadlineSocket(server, _Conn(time.monotonic() - 5))
    assert reader.recv(10) == b"body"
    with pytest.raises(Expired):  # nothing more came: no waiting past the deadline
        reader.recv(10)
    assert server.gettimeout() is None  # the socket's own mode is given back


def test_a_read_waits_only_until_the_deadline(pair):
    server, _client = pair
    reader = DeadlineSocket(server, _Conn(time.monotonic() + 0.3))
    started = time.monotonic()
    with pytest.raises(Expired):
        reader.recv(10)
    assert 0.25 <= time.monotonic() - started < 2


def test_no_deadline_reads_as_the_socket_does(pair):
    server, client = pair
    client.sendall(b"x")
    assert DeadlineSocket(server, _Conn(None)).recv(10) == b"x"
