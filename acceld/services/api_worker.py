"""The public API's gunicorn worker: gthread, plus deadlines for a client's request.

gunicorn's threaded worker keeps idle and kept-alive connections in its
selector, not in a thread, but once a connection is handed to a thread the
thread reads the request with blocking calls and no limit: a client that sends
half its headers (a slowloris) or stops mid-body holds that thread for ever.
This worker bounds both:

- a new connection waits in the selector (no thread) until it sends a byte,
  and is closed if it has not sent its complete headers within
  ``[api] client_header_timeout`` of connecting; a kept-alive connection gets
  the same budget from its next request's first byte;
- once the headers are in, the body must arrive within
  ``[api] client_body_timeout``; a slower client gets 408 and the connection
  is closed.

Every read on the connection goes through :class:`DeadlineSocket`, which gives
the underlying ``recv`` only the time left before the current deadline.

gthread also closes a finished connection "gracefully" on its main thread:
it half-closes and then waits up to 2 s for the client's FIN, during which the
worker accepts and dispatches nothing. A client that never closes its end
would stall the whole worker 2 s per connection; here that wait (the linger)
happens in the selector instead, and a connection dropped for a deadline is
closed at once.
It relies on gunicorn 27's ``gthread`` internals (``TConn``, the pending-connection
queue), hence the version pin in pyproject.toml.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import ssl
import time
from collections import deque
from functools import partial
from typing import Any

import falcon
from gunicorn import util
from gunicorn.http.errors import NoMoreData
from gunicorn.workers import gthread

LOG = logging.getLogger(__name__)

# Where a connection stands: what its deadline is for.
HEADERS = "headers"
BODY = "body"

# As gunicorn's close_graceful: how long a closed connection waits for the client's FIN,
# and how much it reads meanwhile.
LINGER_SECONDS = 2.0
LINGER_MAX_BYTES = 65536


class HeaderTimeout(NoMoreData):
    """The request line and headers did not arrive in time: gunicorn closes the
    connection as for a client that went away (nothing is answered)."""


class BodyTimeout(falcon.HTTPError):
    """The body did not arrive in time. Raised inside the application's read, so the
    API's error handlers answer 408 (the worker then closes the connection)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(falcon.HTTP_408, title="Request Timeout",
                         description=f"The request body did not arrive within {seconds:g} s.")


class DeadlineSocket:
    """A socket whose reads end at the connection's deadline (``conn.deadline``,
    absolute ``time.monotonic()``; None: no limit). Everything else is the socket's."""

    def __init__(self, sock: socket.socket, conn: "DeadlineConn") -> None:
        self._sock = sock
        self._conn = conn

    def recv(self, size: int, *flags: int) -> bytes:
        conn = self._conn
        if conn.deadline is None:
            return self._sock.recv(size, *flags)
        # Past the deadline, bytes already received are still taken (the application may
        # have been slow to read them); only waiting for more is refused.
        remaining = max(0.0, conn.deadline - time.monotonic())
        prior = self._sock.gettimeout()
        self._sock.settimeout(remaining)
        try:
            return self._sock.recv(size, *flags)
        except (socket.timeout, TimeoutError, BlockingIOError, ssl.SSLWantReadError):
            raise conn.expired() from None
        finally:
            self._sock.settimeout(prior)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class DeadlineConn(gthread.TConn):
    """A connection that knows which deadline its reads are under."""

    def __init__(self, cfg, sock, client, server, *, header_timeout: float,  # type: ignore[no-untyped-def]
                 body_timeout: float, linger=None) -> None:
        super().__init__(cfg, sock, client, server)
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.linger = linger  # takes over a graceful close, in the worker's selector
        self.aborted = False  # dropped for a deadline: close at once, no linger
        self.linger_until = 0.0
        self.drained = 0
        self.phase = HEADERS
        self.timed_out = False  # the body deadline passed: close after the 408
        # A new connection's header deadline runs from the accept.
        self.deadline: float | None = time.monotonic() + header_timeout

    def init(self) -> None:
        if self.initialized:
            return
        if self.cfg.is_ssl:
            # The TLS handshake reads too: bound each of its reads by what is left.
            self.sock = _HandshakeSocket(self.sock, self)
        try:
            super().init()
        except (socket.timeout, TimeoutError):
            raise self.expired() from None
        if self.cfg.is_ssl:
            self.sock.settimeout(None)
        if self.parser is not None and hasattr(self.parser, "unreader"):
            unreader = self.parser.unreader
            if hasattr(unreader, "sock"):
                unreader.sock = DeadlineSocket(unreader.sock, self)

    def close(self, graceful: bool = False) -> None:
        if not graceful or self.aborted:
            util.close(self.sock)
        elif self.linger is not None:
            self.linger(self)
        else:
            super().close(graceful=True)  # gunicorn's own: blocks while it lingers

    def start_headers(self) -> None:
        """A kept-alive connection's next request: a fresh header budget from now."""
        if self.deadline is None:
            self.deadline = time.monotonic() + self.header_timeout
        self.phase = HEADERS

    def start_body(self) -> None:
        self.phase = BODY
        self.deadline = time.monotonic() + self.body_timeout

    def finish(self) -> None:
        """The request was answered: gunicorn's own drain (bounded) takes over."""
        self.deadline = None

    def expired(self) -> Exception:
        if self.phase == HEADERS:
            LOG.info("Closing the connection from %s: its request headers did not arrive "
                     "within %g s ([api] client_header_timeout).", _peer(self.client),
                     self.header_timeout)
            self.aborted = True
            return HeaderTimeout()
        LOG.info("Answering 408 to %s: its request body did not arrive within %g s "
                 "([api] client_body_timeout).", _peer(self.client), self.body_timeout)
        self.timed_out = True
        return BodyTimeout(self.body_timeout)


class _HandshakeSocket:
    """Hands the TLS layer a socket whose blocking mode is "time left before the
    header deadline", so a stalled handshake cannot hold a thread for ever."""

    def __init__(self, sock: socket.socket, conn: DeadlineConn) -> None:
        self._sock = sock
        self._conn = conn

    def setblocking(self, flag: bool) -> None:
        if flag and self._conn.deadline is not None:
            self._sock.settimeout(max(0.001, self._conn.deadline - time.monotonic()))
        else:
            self._sock.setblocking(flag)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _peer(client: Any) -> str:
    if isinstance(client, tuple) and len(client) >= 2:
        return f"{client[0]}:{client[1]}"
    return str(client)


class DeadlineWorker(gthread.ThreadWorker):
    """gthread with header and body deadlines (see the module docstring).

    :func:`worker_class` makes the subclass gunicorn runs, with the configured timeouts.
    """

    header_timeout: float = 10.0
    body_timeout: float = 30.0

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.lingering: deque[DeadlineConn] = deque()  # by linger_until (all wait as long)

    def accept(self, listener) -> None:  # type: ignore[no-untyped-def]
        """Accept, then wait in the selector (no thread) for the first request byte."""
        try:
            client_sock, client_addr = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = DeadlineConn(self.cfg, client_sock, client_addr, listener.getsockname(),
                            header_timeout=self.header_timeout, body_timeout=self.body_timeout,
                            linger=self.linger)
        conn.timeout = conn.deadline  # murder_pending closes it if no byte came by then
        self.pending_conns.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ,
                             partial(self.on_pending_socket_readable, conn))

    def linger(self, conn: DeadlineConn) -> None:
        """Half-close, then wait for the client's FIN in the selector (not blocking)."""
        sock = conn.sock
        try:
            sock.shutdown(socket.SHUT_WR)
            sock.setblocking(False)
            conn.linger_until = time.monotonic() + LINGER_SECONDS
            self.poller.register(sock, selectors.EVENT_READ,
                                 partial(self._on_lingering_readable, conn))
        except (OSError, ValueError):
            util.close(sock)
            return
        self.lingering.append(conn)

    def _on_lingering_readable(self, conn: DeadlineConn, _sock) -> None:  # type: ignore[no-untyped-def]
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, ssl.SSLWantReadError):
            return
        except OSError:
            data = b""
        conn.drained += len(data)
        if not data or conn.drained >= LINGER_MAX_BYTES:
            self._end_linger(conn)

    def _end_linger(self, conn: DeadlineConn) -> None:
        try:
            self.poller.unregister(conn.sock)
        except (OSError, KeyError, ValueError):
            pass
        try:
            self.lingering.remove(conn)
        except ValueError:
            pass
        util.close(conn.sock)

    def murder_pending(self) -> None:
        """gthread's sweep of connections waiting for a first byte, plus the lingering
        ones whose time is up (the run loop calls this about once a second)."""
        super().murder_pending()
        now = time.monotonic()
        while self.lingering and self.lingering[0].linger_until <= now:
            self._end_linger(self.lingering[0])

    def handle(self, conn):  # type: ignore[no-untyped-def]
        if isinstance(conn, DeadlineConn):
            conn.start_headers()
        return super().handle(conn)

    def handle_request(self, req, conn):  # type: ignore[no-untyped-def]
        if not isinstance(conn, DeadlineConn):
            return super().handle_request(req, conn)
        conn.start_body()
        try:
            keepalive = super().handle_request(req, conn)
        finally:
            conn.finish()
        return keepalive and not conn.timed_out


def worker_class(header_timeout: float, body_timeout: float) -> type[DeadlineWorker]:
    """The worker class for gunicorn's ``worker_class`` setting, with these timeouts."""
    return type("AcceldApiWorker", (DeadlineWorker,),
                {"header_timeout": float(header_timeout), "body_timeout": float(body_timeout)})
