"""A WSGI server for the internal APIs that strangers cannot exhaust.

Why not ``wsgiref`` with a thread per connection: every connection, idle or
not, then held a thread forever. This server runs on
:class:`acceld.serving.connection_loop.ConnectionLoop`:

- ``threads`` threads wait on one epoll; a request's head (request line and
  headers) and a TLS handshake are read without blocking, so idle connections
  cost a file descriptor and no thread;
- a connection that has not sent its whole head within ``header_timeout``
  seconds is closed; at ``max_connections`` the longest-waiting idle
  connection is closed to make room for a new one, so an idle flood cannot
  lock others out;
- a body (Content-Length, at most ``max_body`` bytes) is read the same way, before a
  thread runs the application, and only for a head whose credential is genuine
  (``admit``, acceld.internal.server.genuine_calls: the MAC over method, path, node
  and body hash holds; no nonce is taken): a stranger never gets a byte of its body
  read, and a node that sends its body slowly or never holds a file descriptor for
  ``request_timeout`` seconds (then 408), no thread. A request whose body is not read
  first is answered at once (401, 413) and its connection closed. Without ``admit``
  the application reads every body itself, within ``request_timeout``;
- the thread that completes a request runs the application for it (no hand-off to
  a pool: an agent's heartbeat is a few hundred microseconds of work, and crossing
  threads cost more than that); requests beyond ``threads`` wait in the epoll; it
  writes the answer within ``request_timeout``;
- HTTP/1.1 connections are kept alive (agents heartbeat over one connection
  instead of a TCP handshake and an accept per hello): after a successful
  answer whose request body was read to its end, the connection goes back to
  the epoll, idle for at most ``idle_timeout`` seconds, and counts as idle for
  ``max_connections`` (evicted first when full). Its next request's head must
  arrive within ``header_timeout`` of its first byte. An error answer, a body
  left unread, ``Connection: close`` or HTTP/1.0 close it.

The application itself checks the credential from the headers before it reads
the body (acceld.internal.server), so a stranger never gets a body read.
"""

from __future__ import annotations

import io
import logging
import socket
import ssl
import sys
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Callable
from urllib.parse import unquote

from acceld.serving.connection_loop import (HEAD_END, BodyBuffering, Conn, ConnectionLoop,
                                            Outcome, send_refusal)

LOG = logging.getLogger(__name__)


@dataclass
class Limits:
    """How much one server spends on its clients."""

    threads: int = 16
    max_connections: int = 256
    header_timeout: float = 10.0
    request_timeout: float = 60.0
    idle_timeout: float = 60.0  # a kept-alive connection waiting for its next request
    max_body: int = 1024 * 1024  # bodies the loop reads before the application runs


_PARSED = 1024  # heads admitted and not served yet that PoolServer keeps parsed

# Whether a request's body may be read before it is served: (method, target, headers by
# lower-case name). The internal app's credential check from the headers alone.
Admit = Callable[[str, str, dict[str, str]], bool]


class _BodyReader(io.RawIOBase):
    """The request body: bytes already buffered on the connection, then the socket,
    never beyond ``Content-Length`` and never after the connection's deadline."""

    def __init__(self, conn: Conn, length: int) -> None:
        self._conn = conn
        self.left = length

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def,override]
        if self.left <= 0:
            return 0
        data = self._conn.recv(min(len(buffer), self.left))
        if not data:
            raise ConnectionError("the client closed the connection mid-body")
        n = len(data)
        buffer[:n] = data
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
                 limits: Limits | None = None, admit: Admit | None = None) -> None:
        self.app = app
        self.limits = limits or Limits()
        self._admit = admit
        # Heads parsed by _admit_head, by their bytes, taken by _serve (a head is parsed
        # once, not twice). Bounded: a head whose body never comes is left until the dict
        # is emptied when full.
        self._parsed: dict[bytes, _Request] = {}
        self._ssl = ssl_context
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        self._listener = socket.create_server((host, port), family=family, backlog=128)
        self.port = self._listener.getsockname()[1]
        self.base_environ = {"SERVER_NAME": host, "GATEWAY_INTERFACE": "CGI/1.1",
                             "SERVER_PORT": str(self.port), "REMOTE_HOST": "",
                             "CONTENT_LENGTH": "", "SCRIPT_NAME": ""}
        if ssl_context is not None:
            self.base_environ["HTTPS"] = "on"
        self._loop = ConnectionLoop(
            [self._listener], self._serve_conn, threads=self.limits.threads,
            max_connections=self.limits.max_connections,
            header_timeout=self.limits.header_timeout, idle_timeout=self.limits.idle_timeout,
            ssl_context=ssl_context, name="internal",
            body=BodyBuffering(self.limits.max_body, self.limits.request_timeout,
                               chunked=False, admit=self._admit_head, refuse=self._refuse))

    @property
    def open_connections(self) -> int:
        return self._loop.open_connections

    @property
    def loop(self) -> ConnectionLoop:
        return self._loop

    def start(self) -> "PoolServer":
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop()
        self._listener.close()

    def _admit_head(self, head: bytes) -> bool:
        """Whether the loop may read this head's body before serving it."""
        if self._admit is None:
            return False  # no credential check: every body is the application's to read
        try:
            request = _parse(head)
        except _BadRequest:
            return False  # answered 400 at once
        if len(self._parsed) >= _PARSED:
            self._parsed.clear()
        self._parsed[head] = request  # served next: parsed once
        return self._admit(request.method, request.target, dict(request.headers))

    def _refuse(self, conn: Conn, status: int) -> None:
        """408: the body of a genuine call did not arrive within ``request_timeout``."""
        send_refusal(conn, status, b'{"error": "The request body did not arrive within %g s."}'
                     % self.limits.request_timeout)

    def _serve_conn(self, conn: Conn) -> Outcome:
        conn.deadline = time.monotonic() + self.limits.request_timeout
        try:
            keep = self._serve(conn)
        except Exception as exc:  # noqa: BLE001 - one client's failure is its own
            LOG.debug("Internal request from %s failed: %s", conn.peer(), exc)
            return Outcome.ABORT
        return Outcome.KEEP if keep else Outcome.CLOSE

    def _serve(self, conn: Conn) -> bool:
        """Answer the request whose head starts ``conn.buffer``; True when the connection
        stays open (``conn.buffer`` then holds what was read past the request)."""
        sock, address = conn.sock, conn.address
        end = conn.buffer.index(HEAD_END)
        head = bytes(conn.buffer[:end])
        del conn.buffer[:end + len(HEAD_END)]
        try:
            request = self._parsed.pop(head, None) or _parse(head)
            length = request.header("content-length")
            if request.header("transfer-encoding") is not None:
                raise _BadRequest("chunked request bodies are not accepted; send Content-Length")
            if length is not None and not (length.isdigit() and len(length) < 19):
                raise _BadRequest("malformed Content-Length")
        except _BadRequest as exc:
            LOG.debug("Bad internal request from %s: %s", address, exc)
            body = b'{"error": "Bad request: %s"}' % str(exc).replace('"', "'").encode()
            self._send(sock, 400, [("Content-Type", "application/json")], body, False)
            return False
        reader = _BodyReader(conn, int(length or 0))
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
        return keep

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

