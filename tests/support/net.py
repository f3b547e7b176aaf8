"""Loopback helpers for tests that start servers."""

from __future__ import annotations

import os
import random
import socket
import threading

# Ports handed out come from below the kernel's ephemeral range (32768-60999 by default), so
# a client socket's automatic port never takes one between free_port() and the server's
# bind, and bind(0) elsewhere never returns one. Each pytest-xdist worker gets its own slice,
# and a process never hands out the same port twice: two servers of one test (an all-in-one's
# API and agent) cannot be given the same port.
_LOW, _HIGH = 20000, 32000
_handed_out: set[int] = set()
_lock = threading.Lock()


def _slice() -> range:
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    size = (_HIGH - _LOW) // max(count, 1)
    start = _LOW + (index % max(count, 1)) * size
    return range(start, start + size)


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that this process has
    not handed out before."""
    ports = _slice()
    with _lock:
        for _ in range(len(ports)):
            port = random.choice(ports)
            if port not in _handed_out and _is_free(port):
                _handed_out.add(port)
                return port
    raise RuntimeError(f"no free port left in {ports.start}-{ports.stop - 1}")


def read_until_closed(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything the server sends on ``sock`` until it closes it (a reset ends it too);
    socket.timeout if it stays open past ``timeout`` seconds."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data
