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


class StallingPeer:
    """``mode``: ``"silent"`` (never answers) or ``"trickle"`` (a byte per ``interval``)."""

    def __init__(self, mode: str = "silent", interval: float = 0.2) -> None:
        assert mode in ("silent", "trickle")
        self.mode = mode
        self.interval = interval
        self.accepted = threading.Event()
        self.requested = threading.Event()
        self.connections = 0
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.1)
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name=f"{mode}-peer", daemon=True)

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "StallingPeer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self._held:
            conn.close()
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.connections += 1
            self._held.append(conn)
            self.accepted.set()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

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
