"""One HTTP GET held to bounds the peer cannot stretch: a total deadline, a size cap, no
redirect.

requests bounds the connection and each single read, not the call, and buffers all the
peer sends: a peer that trickles its answer keeps the caller's thread for as long as it
likes, one that sends 256 MiB has it held in memory, and a 3xx is followed wherever it
points. Here every receive of the socket (the TLS handshake, the status line, the
headers, the body) gets the time left before the call's end as its timeout; the bytes
received are counted as they arrive, and no more than one past the cap is ever read; a
redirect is an answer like any other status. A failure is :class:`ReadFailed`: its
``reason`` is fixed wording a caller may pass on, its ``detail`` (the exception, what
the peer said) is for the log only.

The host is connected to as given: callers pass an address (no name is looked up, a
lookup could not be held to the deadline).
"""

from __future__ import annotations

import http.client
import io
import select
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

# Bytes of status line and headers allowed on top of the body's cap.
HEAD_ALLOWANCE = 64 * 1024
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Bounds:
    connect: float  # seconds to connect
    read: float  # seconds any one receive may wait
    total: float  # seconds for the whole call, however the peer answers
    max_bytes: int  # of the answer's body


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes
    received: int  # bytes read from the socket, head and body


class ReadFailed(Exception):
    """The GET did not bring a whole answer; ``reason`` is fixed wording (no peer text)."""

    def __init__(self, reason: str, detail: str, received: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail
        self.received = received


class _OverCap(Exception):
    pass


class _BoundedSocket:
    """The socket as http.client sees it: each receive waits at most the time left and
    stops one byte past ``limit`` in all."""

    def __init__(self, sock: socket.socket, end: float, read_timeout: float,
                 limit: int) -> None:
        self.sock = sock
        self.end = end
        self.read_timeout = read_timeout
        self.limit = limit
        self.received = 0

    def _timeout(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the call's deadline passed")
        return min(self.read_timeout, left)

    def sendall(self, data: bytes) -> None:
        self.sock.settimeout(self._timeout())
        self.sock.sendall(data)

    def recv_into(self, buffer: memoryview | bytearray) -> int:
        room = self.limit + 1 - self.received
        if room <= 0:
            raise _OverCap()
        self.sock.settimeout(self._timeout())
        count = self.sock.recv_into(memoryview(buffer)[:room])
        self.received += count
        if self.received > self.limit:
            raise _OverCap()
        return count

    def makefile(self, mode: str = "rb", *args: object, **kwargs: object) -> io.BufferedReader:
        assert mode == "rb", mode
        return io.BufferedReader(_Raw(self))

    def close(self) -> None:
        """http.client closes its connection once an answer that ends at the close has
        begun; the body is still to be read from this socket, closed by :func:`get`."""


class _Raw(io.RawIOBase):
    def __init__(self, sock: _BoundedSocket) -> None:
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        return self._sock.recv_into(buffer)


def _context(verify: str | bool) -> ssl.SSLContext:
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)


def _handshake(tls: ssl.SSLSocket, end: float, read_timeout: float) -> None:
    """The TLS handshake, each wait cut to the time left (a blocking handshake's waits
    each get the whole timeout)."""
    tls.setblocking(False)
    while True:
        try:
            tls.do_handshake()
            return
        except ssl.SSLWantReadError:
            wanted = ([tls], [])
        except ssl.SSLWantWriteError:
            wanted = ([], [tls])
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the call's deadline passed in the TLS handshake")
        ready = select.select(*wanted, [], min(read_timeout, left))
        if not any(ready):
            raise TimeoutError("the TLS handshake timed out")


def get(url: str, headers: dict[str, str], bounds: Bounds, *,
        verify: str | bool = True) -> Answer:
    """GET ``url`` (http or https, the host an address) within ``bounds``; the answer
    whatever its status (a 3xx is not followed), or ReadFailed."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    end = time.monotonic() + bounds.total
    wrapped: _BoundedSocket | None = None
    try:
        sock = socket.create_connection((host, port),
                                        timeout=min(bounds.connect, bounds.total))
        try:
            if tls:
                sock = _context(verify).wrap_socket(sock, server_hostname=host,
                                                    do_handshake_on_connect=False)
                _handshake(sock, end, bounds.read)  # type: ignore[arg-type]
            wrapped = _BoundedSocket(sock, end, bounds.read, bounds.max_bytes + HEAD_ALLOWANCE)
            conn = http.client.HTTPConnection(host, port)  # framing only: the socket is ours
            conn.sock = wrapped  # type: ignore[assignment]
            conn.request("GET", target, headers=headers)
            resp = conn.getresponse()
            length = resp.getheader("Content-Length")
            if length is not None and length.isdigit() and int(length) > bounds.max_bytes:
                raise _OverCap()
            body = bytearray()
            while chunk := resp.read(_CHUNK):
                body += chunk
                if len(body) > bounds.max_bytes:
                    raise _OverCap()
            return Answer(resp.status, resp.msg, bytes(body), wrapped.received)
        finally:
            sock.close()
    except _OverCap:
        raise ReadFailed(f"answer over {bounds.max_bytes} bytes",
                         f"more than {bounds.max_bytes} bytes of body",
                         _received(wrapped)) from None
    except TimeoutError as exc:
        raise ReadFailed("timed out", f"no whole answer within {bounds.total:g} s ({exc})",
                         _received(wrapped)) from None
    except ssl.SSLError as exc:
        raise ReadFailed("TLS failed", f"{exc.__class__.__name__}: {exc}",
                         _received(wrapped)) from None
    except ConnectionRefusedError as exc:
        raise ReadFailed("connection refused", str(exc)) from None
    except http.client.RemoteDisconnected as exc:
        raise ReadFailed("closed without an answer", str(exc), _received(wrapped)) from None
    except http.client.IncompleteRead as exc:
        raise ReadFailed("answer cut short", repr(exc), _received(wrapped)) from None
    except http.client.HTTPException as exc:  # a status line or framing that is not HTTP
        raise ReadFailed("not an HTTP answer", f"{exc.__class__.__name__}: {exc!r}",
                         _received(wrapped)) from None
    except OSError as exc:
        raise ReadFailed("connection failed", f"{exc.__class__.__name__}: {exc}",
                         _received(wrapped)) from None


def _received(sock: _BoundedSocket | None) -> int:
    return sock.received if sock is not None else 0
