"""A WSGI server for the internal APIs that strangers cannot exhaust.

Why not ``wsgiref`` with a thread per connection: every connection, idle or
not, then held a thread forever. Here

- one selector thread accepts connections, completes their TLS handshake and
  reads each request's head (request line and headers) without blocking;
  idle connections cost a file descriptor and no thread;
- a connection that has not sent its whole head within ``header_timeout``
  seconds is closed; at ``max_connections`` the longest-waiting idle
  connection is closed to make room for a new one, so an idle flood cannot
  lock others out;
- a fixed pool of ``threads`` workers runs the application, one request per
  connection (HTTP/1.0 and close, as before); a request whose head is ready
  waits in a queue for a free worker;
- a worker reads the body and writes the answer under ``request_timeout``
  seconds in all, so a slow client holds a worker for a bounded time.

The application itself checks the credential from the headers before it reads
the body (acceld.internal.server), so a stranger never gets a body read.
"""

from __future__ import annotations

import io
import logging
import queue
import selectors
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIRequestHandler

LOG = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024  # request line and headers; internal calls send a few hundred bytes
_HEAD_END = b"\r\n\r\n"


@dataclass
class Limits:
    """How much one server spends on its clients."""

    threads: int = 16
    max_connections: int = 256
    header_timeout: float = 10.0
    request_timeout: float = 60.0


@dataclass
class _Pending:
    """A connection in the selector: handshaking or reading its head."""

    sock: socket.socket
    address: tuple
    deadline: float
    handshaking: bool = False
    head: bytearray = field(default_factory=bytearray)


class _DeadlineReader(io.RawIOBase):
    """The bytes already read by the selector, then the socket, until a deadline."""

    def __init__(self, sock: socket.socket, prefix: bytes, deadline: float) -> None:
        self._sock = sock
        self._prefix = memoryview(prefix)
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def,override]
        if self._prefix:
            n = min(len(buffer), len(self._prefix))
            buffer[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request read deadline passed")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _Writer(io.RawIOBase):
    """Writes the answer, each write bounded by the request timeout."""

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        self._sock = sock
        self._timeout = timeout

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[no-untyped-def,override]
        self._sock.settimeout(self._timeout)
        self._sock.sendall(data)
        return len(data)


class _Handler(WSGIRequestHandler):
    """wsgiref's request handling over a head the selector already read."""

    def __init__(self, sock: socket.socket, address: tuple, server: "PoolServer",
                 head: bytes) -> None:
        self._head = head
        super().__init__(sock, address, server)  # type: ignore[arg-type]

    def setup(self) -> None:
        server: PoolServer = self.server  # type: ignore[assignment]
        deadline = time.monotonic() + server.limits.request_timeout
        self.connection = self.request
        self.rfile = io.BufferedReader(_DeadlineReader(self.request, self._head, deadline))
        self.wfile = _Writer(self.request, server.limits.request_timeout)

    def finish(self) -> None:
        pass  # the worker closes the socket

    def log_message(self, format: str, *args) -> None:  # type: ignore[no-untyped-def]
        LOG.debug("internal %s - %s", self.address_string(), format % args)


class PoolServer:
    """Serve ``app`` on ``host:port`` within :class:`Limits`; TLS with ``ssl_context``."""

    def __init__(self, app, host: str, port: int, *,  # type: ignore[no-untyped-def]
                 ssl_context: ssl.SSLContext | None = None,
                 limits: Limits | None = None) -> None:
        self.app = app
        self.limits = limits or Limits()
        self._ssl = ssl_context
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        self._listener = socket.create_server((host, port), family=family, backlog=128)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self.base_environ = {"SERVER_NAME": host, "GATEWAY_INTERFACE": "CGI/1.1",
                             "SERVER_PORT": str(self.port), "REMOTE_HOST": "",
                             "CONTENT_LENGTH": "", "SCRIPT_NAME": ""}
        if ssl_context is not None:
            self.base_environ["HTTPS"] = "on"
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._pending: dict[int, _Pending] = {}
        self._queue: queue.SimpleQueue[tuple[socket.socket, tuple, bytes] | None] = \
            queue.SimpleQueue()
        self._busy = 0  # connections handed to the workers and not yet closed
        self._busy_lock = threading.Lock()
        self._stopping = threading.Event()
        self._loop = threading.Thread(target=self._run, name="internal-accept", daemon=True)
        self._workers = [threading.Thread(target=self._work, name=f"internal-worker-{i}",
                                          daemon=True) for i in range(self.limits.threads)]

    def get_app(self):  # type: ignore[no-untyped-def]
        """What wsgiref's handler calls."""
        return self.app

    @property
    def open_connections(self) -> int:
        with self._busy_lock:
            return len(self._pending) + self._busy

    def start(self) -> "PoolServer":
        for worker in self._workers:
            worker.start()
        self._loop.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._loop.join(timeout=10)
        for _ in self._workers:
            self._queue.put(None)
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()

    # The selector thread

    def _run(self) -> None:
        sel = self._selector
        sel.register(self._listener, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while not self._stopping.is_set():
                timeout = 1.0
                if self._pending:
                    soonest = min(p.deadline for p in self._pending.values())
                    timeout = max(0.0, min(timeout, soonest - time.monotonic()))
                for key, _events in sel.select(timeout):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        try:
                            self._wake_r.recv(64)
                        except OSError:
                            pass
                    else:
                        self._advance(key.data)
                self._expire()
        except Exception:  # noqa: BLE001 - logged; the service's other work goes on
            LOG.exception("Internal server loop failed")
        finally:
            for pending in list(self._pending.values()):
                self._drop(pending)
            sel.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, ...: try again at the next event
                LOG.warning("Internal server cannot accept: %s", exc)
                return
            if self.open_connections >= self.limits.max_connections and not self._evict():
                sock.close()  # every slot holds a request being served: refuse
                continue
            sock.setblocking(False)
            handshaking = False
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_side=True,
                                             do_handshake_on_connect=False)
                handshaking = True
            pending = _Pending(sock, address, time.monotonic() + self.limits.header_timeout,
                               handshaking)
            self._pending[sock.fileno()] = pending
            self._selector.register(sock, selectors.EVENT_READ, pending)

    def _evict(self) -> bool:
        """Close the idle connection closest to its deadline; False if none is idle."""
        if not self._pending:
            return False
        oldest = min(self._pending.values(), key=lambda p: p.deadline)
        LOG.debug("Internal server full: closing idle connection from %s", oldest.address)
        self._drop(oldest)
        return True

    def _advance(self, pending: _Pending) -> None:
        sock = pending.sock
        try:
            if pending.handshaking:
                sock.do_handshake()  # type: ignore[attr-defined]
                pending.handshaking = False
            while True:
                chunk = sock.recv(MAX_HEAD)
                if not chunk:
                    self._drop(pending)
                    return
                pending.head += chunk
                if _HEAD_END in pending.head:
                    self._hand_over(pending)
                    return
                if len(pending.head) > MAX_HEAD:
                    self._drop(pending)
                    return
                if not isinstance(sock, ssl.SSLSocket) or not sock.pending():
                    return
        except ssl.SSLWantReadError:
            self._selector.modify(sock, selectors.EVENT_READ, pending)
        except ssl.SSLWantWriteError:
            self._selector.modify(sock, selectors.EVENT_WRITE, pending)
        except (BlockingIOError, InterruptedError):
            pass
        except (OSError, ssl.SSLError) as exc:
            LOG.debug("Internal connection from %s failed: %s", pending.address, exc)
            self._drop(pending)

    def _hand_over(self, pending: _Pending) -> None:
        self._selector.unregister(pending.sock)
        with self._busy_lock:
            del self._pending[pending.sock.fileno()]
            self._busy += 1
        self._queue.put((pending.sock, pending.address, bytes(pending.head)))

    def _expire(self) -> None:
        now = time.monotonic()
        for pending in [p for p in self._pending.values() if p.deadline <= now]:
            LOG.debug("Internal connection from %s sent no request in %.0f s: closed",
                      pending.address, self.limits.header_timeout)
            self._drop(pending)

    def _drop(self, pending: _Pending) -> None:
        try:
            self._selector.unregister(pending.sock)
        except (KeyError, ValueError):
            pass
        with self._busy_lock:
            self._pending.pop(pending.sock.fileno(), None)
        pending.sock.close()

    # The workers

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            sock, address, head = item
            try:
                sock.setblocking(True)
                _Handler(sock, address, self, head)
            except Exception as exc:  # noqa: BLE001 - one client's failure is its own
                LOG.debug("Internal request from %s failed: %s", address, exc)
            finally:
                _close(sock)
                with self._busy_lock:
                    self._busy -= 1


def _close(sock: socket.socket) -> None:
    """Close after the answer without resetting it: drain what the client already sent.

    A refused request's body is not read; closing with unread bytes makes the
    kernel send a reset, which can destroy the answer in flight. Whatever has
    already arrived (up to 64 KiB) is discarded first, without waiting for more.
    """
    try:
        sock.setblocking(False)
        if not isinstance(sock, ssl.SSLSocket):
            sock.shutdown(socket.SHUT_WR)
        for _ in range(16):
            if not sock.recv(4096):
                break
    except (OSError, ValueError):
        pass
    finally:
        sock.close()
