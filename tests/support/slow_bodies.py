"""Clients that announce a request body and send it slowly or never (issue 26): each
connection sends its whole head at once, then either nothing more (``silent``) or one
byte of its body every ``TRICKLE_EVERY`` seconds (``trickling``), from one thread, until
:meth:`SlowBodies.close`. What a server must survive without a thread held for any."""

from __future__ import annotations

import socket
import threading
from typing import Callable

TRICKLE_EVERY = 0.25


class SlowBodies:
    def __init__(self, address: tuple[str, int], head: Callable[[int], bytes], *,
                 silent: int, trickling: int, body_length: int = 4096) -> None:
        """``head(i)``: the i-th connection's request head (announcing ``body_length``)."""
        self.silent: list[socket.socket] = []
        self.trickling: list[socket.socket] = []
        for i in range(silent + trickling):
            sock = socket.create_connection(address, timeout=5)
            sock.sendall(head(i))
            (self.silent if i < silent else self.trickling).append(sock)
        self._sent = 0
        self._closed: set[socket.socket] = set()
        self.answers: dict[socket.socket, bytes] = {}
        self._length = body_length
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, daemon=True,
                                        name="slow-bodies")
        self._thread.start()

    def _trickle(self) -> None:
        while not self._stop.wait(TRICKLE_EVERY) and self._sent < self._length - 1:
            for sock in self.trickling:
                try:
                    sock.send(b" ")
                except OSError:
                    pass
            self._sent += 1

    def open_count(self) -> int:
        """Connections the server has not closed yet (what it answered before closing
        is kept in :attr:`answers`)."""
        count = 0
        for sock in self.silent + self.trickling:
            if sock in self._closed:
                continue
            sock.setblocking(False)
            try:
                while data := sock.recv(65536):
                    self.answers[sock] = self.answers.get(sock, b"") + data
                self._closed.add(sock)
            except BlockingIOError:
                count += 1
            except OSError:
                self._closed.add(sock)
            finally:
                sock.setblocking(True)
        return count

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for sock in self.silent + self.trickling:
            sock.close()
