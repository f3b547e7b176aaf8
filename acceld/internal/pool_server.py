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
- a fixed pool of ``threads`` workers runs the application; a request whose
  head is ready waits in a queue for a free worker;
- a worker reads the body and writes the answer under ``request_timeout``
  seconds in all, so a slow client holds a worker for a bounded time;
- HTTP/1.1 connections are kept alive (agents heartbeat over one connection
  instead of a TCP handshake, an accept and a thread hand-off per hello): after
  a successful answer whose request body was read to its end, the connection
  goes back to the selector, idle for at most ``idle_timeout`` seconds, and
  counts as idle for ``max_connections`` (evicted first when full). Its next
  request's head must arrive within ``header_timeout`` of its first byte. An
  error answer, a body left unread, ``Connection: close`` or HTTP/1.0 close it.

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
import sys
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Callable
from urllib.parse import unquote

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
    idle_timeout: float = 60.0  # a kept-alive connection waiting for its next request


@dataclass
class _Pending:
    """A connection in the selector: handshaking, reading its head, or kept alive."""

    sock: socket.socket
    address: tuple
    deadline: float
    handshaking: bool = False
    head: bytearray = field(default_factory=bytearray)
    kept: bool = False  # idle between two requests: header_timeout starts at its first byte


class _BodyReader(io.RawIOBase):
    """The request body: bytes the selector already read, then the socket, never beyond
    ``Content-Length`` and never after the deadline. What the selector read past the
    body (a pipelined next request) stays in ``rest``."""

    def __init__(self, sock: socket.socket, prefix: bytes, length: int,
                 deadline: float) -> None:
        self._sock = sock
        self._prefix = prefix[:length]
        self.rest = prefix[length:]
        self.left = length
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def,override]
        if self.left <= 0:
            return 0
        if self._prefix:
            n = min(len(buffer), len(self._prefix))
            buffer[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            self.left -= n
            return n
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request read deadline passed")
        self._sock.settimeout(left)
        view = memoryview(buffer)[:min(len(buffer), self.left)]
        n = self._sock.recv_into(view)
        if n == 0:
            raise ConnectionError("the client closed the connection mid-body")
        self.left -= n
        return n


class _BadRequest(Exception):
    """A head that is not an HTTP/1.x request: answered 400 and closed."""


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def header(self, name: str) -> str | None:
        name = name.lower()
        for key, value in self.headers:
            if key == name:
                return value
        return None


def _parse(head: bytes) -> _Request:
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ")
    except ValueError:
        raise _BadRequest(f"malformed request line {lines[0][:80]!r}") from None
    if not version.startswith("HTTP/1."):
        raise _BadRequest(f"unsupported protocol {version[:20]!r}")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _BadRequest(f"malformed header line {line[:80]!r}")
        headers.append((name.lower(), value.strip()))
    return _Request(method, target, version, headers)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


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
        # Kept-alive connections a worker answered, back to the selector thread (which
        # alone touches the selector and _pending): (socket, address, bytes read ahead).
        self._returned: queue.SimpleQueue[tuple[socket.socket, tuple, bytes]] = \
            queue.SimpleQueue()
        self._busy = 0  # connections handed to the workers and not yet closed
        self._busy_lock = threading.Lock()
        self._stopping = threading.Event()
        self._loop = threading.Thread(target=self._run, name="internal-accept", daemon=True)
        self._workers = [threading.Thread(target=self._work, name=f"internal-worker-{i}",
                                          daemon=True) for i in range(self.limits.threads)]

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
                            self._wake_r.recv(4096)
                        except OSError:
                            pass
                        self._take_back()
                    else:
                        self._advance(key.data)
                self._expire()
        except Exception:  # noqa: BLE001 - logged; the service's other work goes on
            LOG.exception("Internal server loop failed")
        finally:
            for pending in list(self._pending.values()):
                self._drop(pending)
            self._take_back()  # and close what workers still return
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
            if self.open_connections >= self.limits.max_connections:
                self._take_back()  # kept-alive connections in transit count as idle
            if self.open_connections >= self.limits.max_connections and not self._evict():
                sock.close()  # every slot holds a request being served: refuse
                continue
            sock.setblocking(False)
            try:  # answers go out in one write; do not wait for an ACK of the last one
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
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
                if pending.kept:  # the next request began: its head has header_timeout
                    pending.kept = False
                    pending.deadline = min(pending.deadline,
                                           time.monotonic() + self.limits.header_timeout)
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

    def _take_back(self) -> None:
        """Selector thread: register the kept-alive connections the workers returned."""
        while True:
            try:
                sock, address, ahead = self._returned.get_nowait()
            except queue.Empty:
                return
            if self._stopping.is_set():
                sock.close()
                with self._busy_lock:
                    self._busy -= 1
                continue
            if _HEAD_END in ahead:  # a pipelined request came with the last: still busy
                self._queue.put((sock, address, ahead))
                continue
            pending = _Pending(sock, address, time.monotonic() + self.limits.idle_timeout,
                               head=bytearray(ahead), kept=not ahead)
            if ahead:  # the next request began
                pending.deadline = time.monotonic() + self.limits.header_timeout
            sock.setblocking(False)
            with self._busy_lock:
                self._busy -= 1
                self._pending[sock.fileno()] = pending
            self._selector.register(sock, selectors.EVENT_READ, pending)
            if isinstance(sock, ssl.SSLSocket) and sock.pending():
                self._advance(pending)  # decrypted already: the selector will not fire

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
            ahead: bytes | None = None
            try:
                sock.setblocking(True)
                ahead = self._serve(sock, address, head)
            except Exception as exc:  # noqa: BLE001 - one client's failure is its own
                LOG.debug("Internal request from %s failed: %s", address, exc)
            if ahead is not None and not self._stopping.is_set():
                self._returned.put((sock, address, ahead))  # still counted busy until then
                try:
                    self._wake_w.send(b"k")
                except OSError:  # stopping: the socket pair is closed
                    pass
                continue
            _close(sock)
            with self._busy_lock:
                self._busy -= 1

    def _serve(self, sock: socket.socket, address: tuple, data: bytes) -> bytes | None:
        """Answer the request whose head starts ``data``; return the bytes read past it
        when the connection stays open, None when it is to be closed."""
        head, _, prefix = data.partition(_HEAD_END)
        deadline = time.monotonic() + self.limits.request_timeout
        try:
            request = _parse(head)
            length = request.header("content-length")
            if request.header("transfer-encoding") is not None:
                raise _BadRequest("chunked request bodies are not accepted; send Content-Length")
            if length is not None and not (length.isdigit() and len(length) < 19):
                raise _BadRequest("malformed Content-Length")
        except _BadRequest as exc:
            LOG.debug("Bad internal request from %s: %s", address, exc)
            body = b'{"error": "Bad request: %s"}' % str(exc).replace('"', "'").encode()
            self._send(sock, 400, [("Content-Type", "application/json")], body, False)
            return None
        reader = _BodyReader(sock, prefix, int(length or 0), deadline)
        environ = self._environ(request, address, reader)
        answer: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]],
                           exc_info: Any = None) -> Callable[[bytes], None]:
            answer["status"], answer["headers"] = status, headers
            return lambda chunk: None  # write() is not used by Falcon

        result = self.app(environ, start_response)
        try:
            body = b"".join(result)
        finally:
            if hasattr(result, "close"):
                result.close()
        status = int(answer["status"].split(" ", 1)[0])
        keep = (request.version == "HTTP/1.1" and status < 400 and reader.left == 0
                and (request.header("connection") or "").lower() != "close")
        headers = [(k, v) for k, v in answer["headers"] if k.lower() != "connection"]
        if not any(k.lower() == "content-length" for k, _ in headers):
            headers.append(("Content-Length", str(len(body))))
        if request.method == "HEAD":
            body = b""
        self._send(sock, status, headers, body, keep, answer["status"])
        return reader.rest if keep else None

    def _environ(self, request: _Request, address: tuple, reader: _BodyReader
                 ) -> dict[str, Any]:
        path, _, query = request.target.partition("?")
        environ = dict(self.base_environ)
        environ.update({
            "SERVER_PROTOCOL": request.version, "REQUEST_METHOD": request.method,
            "PATH_INFO": unquote(path, "iso-8859-1"), "QUERY_STRING": query,
            "REMOTE_ADDR": address[0] if address else "",
            "CONTENT_TYPE": request.header("content-type") or "",
            "CONTENT_LENGTH": request.header("content-length") or "",
            "wsgi.version": (1, 0), "wsgi.url_scheme": "https" if self._ssl else "http",
            "wsgi.input": io.BufferedReader(reader), "wsgi.errors": sys.stderr,
            "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False})
        for name, value in request.headers:
            if name in ("content-type", "content-length") or "_" in name:
                continue  # as wsgiref: a header spelt with "_" could pose as another
            key = "HTTP_" + name.replace("-", "_").upper()
            environ[key] = f"{environ[key]},{value}" if key in environ else value
        return environ

    def _send(self, sock: socket.socket, status: int, headers: list[tuple[str, str]],
              body: bytes, keep: bool, status_line: str | None = None) -> None:
        """The whole answer in one write, bounded by the request timeout."""
        lines = [f"HTTP/1.1 {status_line or f'{status} {_reason(status)}'}"]
        lines += [f"{k}: {v}" for k, v in headers]
        if not any(k.lower() == "content-length" for k, _ in headers):
            lines.append(f"Content-Length: {len(body)}")
        if not keep:
            lines.append("Connection: close")
        sock.settimeout(self.limits.request_timeout)
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


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
