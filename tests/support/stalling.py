"""Peers that hold a call open: one accepts the connection and never answers, one trickles.

Both listen on 127.0.0.1 on a free port, in a thread of the test process. ``accepted``
is set once a connection came in (and ``requested`` once a request's first bytes
arrived), so a test sequences on what the peer saw, not on sleeps. The trickling peer
sends a valid status line and then one header byte every ``interval`` seconds, forever:
no single read waits long, so only a total deadline ends the call.
"""

from __future__ import annotations

import socket
import threading
import time

from tests.support.loopback_listener import LoopbackListener


class StallingPeer(LoopbackListener):
    """``mode``: ``"silent"`` (never answers) or ``"trickle"`` (a byte per ``interval``)."""

    def __init__(self, mode: str = "silent", interval: float = 0.2) -> None:
        assert mode in ("silent", "trickle")
        super().__init__(f"{mode}-peer")
        self.mode = mode
        self.interval = interval
        self.accepted = threading.Event()
        self.requested = threading.Event()
        self.connections = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accepted(self, conn: socket.socket) -> None:
        self.connections += 1
        self.accepted.set()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.1)
        while not self._stop.is_set() and not self.requested.is_set():
            try:
                if conn.recv(65536):
                    self.requested.set()
                    break
            except socket.timeout:
                continue
            except OSError:
                return
        if self.mode == "silent":
            return  # holds the connection open, says nothing
        try:
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not self._stop.is_set():
                conn.sendall(b"X")  # one header that never ends
                time.sleep(self.interval)
        except OSError:
            return
