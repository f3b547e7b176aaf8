"""An endpoint a compromised node could register: answers GET /hardware badly, on purpose.

Listens on 127.0.0.1 on a free port, one thread per connection, in the test process.
``mode``:

- ``"trickle"``: a valid status line, then one header byte every ``interval`` seconds,
  forever (no single read waits long: only a total deadline ends the call);
- ``"huge"``: a 200 and ``size`` bytes of body, without a Content-Length (``declare``:
  with one), sent as fast as the reader takes them; ``sent`` counts what the kernel took;
- ``"raw"``: ``payload`` as is (a status line and body of the test's choosing, or a
  service's banner that is no HTTP at all).

``requested`` is set once a request arrived, ``closed`` once the caller hung up on an
answer in progress (a send failed), ``requests`` counts the requests, so tests sequence
on what the peer saw.
"""

from __future__ import annotations

import socket
import threading
import time

from tests.support.loopback_listener import LoopbackListener


class HostilePeer(LoopbackListener):
    def __init__(self, mode: str, *, interval: float = 0.05, size: int = 0,
                 declare: bool = False, payload: bytes = b"") -> None:
        assert mode in ("trickle", "huge", "raw")
        super().__init__(f"{mode}-peer", backlog=32)
        self.mode = mode
        self.interval = interval
        self.size = size
        self.declare = declare
        self.payload = payload
        self.requested = threading.Event()
        self.closed = threading.Event()
        self.requests = 0
        self.sent = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        head = b""
        try:
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    return
                head += data
        except OSError:
            return
        self.requests += 1
        self.requested.set()
        try:
            getattr(self, f"_{self.mode}")(conn)
        except OSError:
            self.closed.set()

    def _trickle(self, conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Pad: ")
        while not self._stop.is_set():
            conn.sendall(b"a")
            time.sleep(self.interval)

    def _huge(self, conn: socket.socket) -> None:
        length = f"Content-Length: {self.size}\r\n".encode() if self.declare else b""
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + length
                     + b"Connection: close\r\n\r\n")
        chunk = b'{"hardware": [' + b" " * (64 * 1024 - 14)
        while self.sent < self.size and not self._stop.is_set():
            conn.sendall(chunk)
            self.sent += len(chunk)
        conn.close()

    def _raw(self, conn: socket.socket) -> None:
        conn.sendall(self.payload)
        conn.close()
