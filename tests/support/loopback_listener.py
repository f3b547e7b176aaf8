"""A listening socket on 127.0.0.1 (a free port) that serves each connection on a thread of
its own, in the test process: the common part of the peers that misbehave on purpose
(tests.support.stalling, tests.support.hostile_peer). Subclasses write ``_serve``."""

from __future__ import annotations

import socket
import threading


class LoopbackListener:
    def __init__(self, name: str, backlog: int = 16) -> None:
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(backlog)
        self._sock.settimeout(0.1)
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name=name, daemon=True)

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    def start(self):  # type: ignore[no-untyped-def]
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, join the accept thread, close every connection it took."""
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._sock.close()

    def _accepted(self, conn: socket.socket) -> None:
        """Called on the accept thread for each connection, before it is served."""

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self._conns.append(conn)
            self._accepted(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        raise NotImplementedError
