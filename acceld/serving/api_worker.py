"""The public API's gunicorn worker: requests served by the thread that reads them, with
deadlines for a client's request.

gunicorn's threaded worker (gthread) hands each request from its selector thread to a
pool and back; on one GIL those hand-offs cost more per request than acceld's
handlers (docs/performance.md). This worker runs acceld.serving.connection_loop instead:
``[api] threads`` threads wait on one epoll and each serves the requests it reads,
with gunicorn's own HTTP parser, WSGI environ and response writer.

Slow and idle clients hold no thread:

- a new connection has ``[api] client_header_timeout`` to send its request line and
  headers, which are buffered without blocking; a kept-alive connection may idle
  ``keepalive`` seconds (gunicorn's setting), then has the same budget from its next
  request's first byte. A late connection is closed, nothing answered;
- once the headers are in, a body of at most ``[api] max_request_body_size`` is read by
  the loop too, before the request reaches a thread, and must arrive within ``[api]
  client_body_timeout``: a slower client gets 408 and the connection is closed. A
  request whose body is not read first (announced over the limit, or framed
  ambiguously) is answered at once (413, 400) and its connection closed: no thread
  ever waits for a client's body, not even to drain one the application did not read
  (a 401 from keystonemiddleware);
- a closed connection waits for the client's FIN in the epoll, not in a thread.

Writing an answer is bounded too (:data:`SEND_TIMEOUT_MIN` or the body timeout, the
longer): a client that stops reading cannot hold a thread for ever.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import socket
import ssl
import time
from typing import Any

import falcon
from gunicorn import http, sock as gsock
from gunicorn.http import wsgi
from gunicorn.http.body import LengthReader
from gunicorn.workers import base

from acceld.api.errors import error_body
from acceld.serving import serving_slot
from acceld.serving.connection_loop import (BodyBuffering, Conn, ConnectionLoop, Outcome,
                                            send_refusal)

LOG = logging.getLogger(__name__)

SEND_TIMEOUT_MIN = 60.0
FLUSH_BYTES = 256 * 1024


_M_ARENA_MAX = -8  # glibc's mallopt parameter
ARENA_MAX = 2
TRIM_AFTER_BYTES = 1024 * 1024  # an answer this large: give_back_memory after it


def _libc() -> Any:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return None


def give_back_memory() -> None:
    """Return the free pages of glibc's heaps to the system (after a large answer: the
    memory that built it is free, but glibc keeps it mapped)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def limit_malloc_arenas() -> None:
    """glibc gives each thread that allocates its own malloc arena, up to 8 per core, and
    keeps their freed memory: four threads each building a 10,000-device list at once
    left the worker at 157 MB RSS, against 83 at start. Two arenas, and
    :func:`give_back_memory` after large answers: 128-134 MB (40 such lists, 4 clients).
    Under the GIL the threads seldom allocate at once, so sharing arenas costs nothing
    measurable. Called before the worker starts its threads."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(_M_ARENA_MAX, ARENA_MAX)


class BodyTimeout(falcon.HTTPError):
    """The body did not arrive in time. Raised inside the application's read, so the
    API's error handlers answer 408 (the worker then closes the connection)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(falcon.HTTP_408, title="Request Timeout",
                         description=f"The request body did not arrive within {seconds:g} s.")


class ClientSocket:
    """What gunicorn's parser and response writer see: reads come from the connection
    (buffered head first, then the socket under its deadline); writes are gathered and
    go out in one ``sendall`` per answer (or per :data:`FLUSH_BYTES`) under the send
    timeout: gunicorn writes the status and headers, then each body chunk, and every
    write is a loopback packet and a wake-up of the client."""

    def __init__(self, conn: Conn, send_timeout: float) -> None:
        self._conn = conn
        self._sock = conn.sock
        self._send_timeout = send_timeout
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.sent = 0

    def recv(self, size: int, *_flags: int) -> bytes:
        return self._conn.recv(size)

    def sendall(self, data: bytes) -> None:
        self._pending.append(bytes(data))
        self._pending_bytes += len(data)
        if self._pending_bytes >= FLUSH_BYTES:
            self.flush()

    def send(self, data: bytes) -> int:
        """Written at once (gunicorn sends ``100 Continue`` this way: the client waits),
        unless the loop sent ``100 Continue`` already, before it read the body."""
        if self._conn.continued and data.startswith(b"HTTP/1.1 100 "):
            return len(data)
        self.sendall(data)
        self.flush()
        return len(data)

    def flush(self) -> None:
        """Send what is gathered: at once what the socket's buffer takes (nearly every
        answer), and the rest outside the serving slot, as a client that reads slowly
        must not stop the worker's other requests."""
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        self.sent += len(data)
        sent = 0
        if not isinstance(self._sock, ssl.SSLSocket):  # TLS sockets take no flags
            try:
                sent = self._sock.send(data, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                sent = 0
            if sent == len(data):
                return
        with serving_slot.stepped_out():
            self._sock.settimeout(self._send_timeout)
            try:
                self._sock.sendall(memoryview(data)[sent:])
            finally:
                self._sock.settimeout(None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class LoopWorker(base.Worker):
    """A gunicorn worker on acceld.serving.connection_loop (see the module docstring).

    :func:`worker_class` makes the subclass gunicorn runs, with the configured timeouts.
    """

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_body: int = 1024 * 1024

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.loop: ConnectionLoop | None = None
        self.send_timeout = max(SEND_TIMEOUT_MIN, self.body_timeout)

    def run(self) -> None:
        limit_malloc_arenas()
        context = gsock.ssl_context(self.cfg) if self.cfg.is_ssl else None
        listeners = [getattr(s, "sock", s) for s in self.sockets]
        self.loop = ConnectionLoop(
            listeners, self.serve, threads=self.cfg.threads,
            max_connections=self.cfg.worker_connections,
            header_timeout=self.header_timeout, idle_timeout=max(1, self.cfg.keepalive),
            ssl_context=context, name="api", on_header_timeout=self._header_timeout,
            body=BodyBuffering(self.max_body, self.body_timeout, refuse=self._refuse_body),
            slot=serving_slot.Slot())
        self.loop.start()
        try:
            while self.alive:
                self.notify()
                if self.ppid != os.getppid():
                    self.log.info("Parent changed, shutting down: %s", self)
                    break
                # Signals write to PIPE (set_wakeup_fd): wake at once for a stop.
                try:
                    ready, _, _ = select.select([self.PIPE[0]], [], [], 1.0)
                    if ready:
                        os.read(self.PIPE[0], 4096)
                except (InterruptedError, BlockingIOError):
                    pass
        finally:
            self.loop.stop(grace=self.cfg.graceful_timeout)

    def _refuse_body(self, conn: Conn, status: int) -> None:
        """The loop's answer to a body it gave up on: 408 late, 413 a chunked body over
        ``[api] max_request_body_size`` (one with a Content-Length is the API's to refuse)."""
        message = (BodyTimeout(self.body_timeout).description if status == 408 else
                   f"The request body is over the limit of {self.max_body} bytes.")
        send_refusal(conn, status, error_body(status, message or ""))

    def _header_timeout(self, conn: Conn) -> None:
        LOG.info("Closing the connection from %s: its request headers did not arrive "
                 "within %g s ([api] client_header_timeout).", conn.peer(),
                 self.header_timeout)

    def serve(self, conn: Conn) -> Outcome:
        """One request whose head is buffered on ``conn`` (a loop thread runs this)."""
        timed_out: list[bool] = []

        def body_late() -> Exception:
            LOG.info("Answering 408 to %s: its request body did not arrive within %g s "
                     "([api] client_body_timeout).", conn.peer(), self.body_timeout)
            timed_out.append(True)
            return BodyTimeout(self.body_timeout)

        conn.deadline = time.monotonic() + self.body_timeout
        conn.on_expired = body_late
        client = ClientSocket(conn, self.send_timeout)
        try:
            outcome = self._serve(conn, client, timed_out)
            client.flush()
            if client.sent >= TRIM_AFTER_BYTES:
                give_back_memory()
            return outcome
        except OSError as exc:
            self.log.debug("Client connection error: %s", exc)
            return Outcome.ABORT
        finally:
            conn.deadline = None

    def _serve(self, conn: Conn, client: ClientSocket, timed_out: list[bool]) -> Outcome:
        parser = http.get_parser(self.cfg, client, conn.address)
        req = None
        try:
            req = next(parser)
            if not req:
                return Outcome.CLOSE
            keepalive = self.handle_request(req, client, conn)
            if not keepalive or timed_out:
                return Outcome.CLOSE
            if not _body_consumed(req) and not _skip_buffered_body(parser, conn):
                return Outcome.CLOSE
            conn.buffer[:0] = parser.unreader.take_buffered()
            return Outcome.KEEP
        except http.errors.NoMoreData as exc:
            self.log.debug("Ignored premature client disconnection. %s", exc)
        except StopIteration as exc:
            self.log.debug("Closing connection. %s", exc)
        except ssl.SSLError as exc:
            if exc.args[0] != ssl.SSL_ERROR_EOF:
                self.handle_error(req, client, conn.address, exc)
                return Outcome.CLOSE
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, None):
                self.log.exception("Socket error processing request.")
            else:
                self.log.debug("Client connection error: %s", exc)
        except Exception as exc:  # noqa: BLE001 - gunicorn answers 400/500 and logs
            self.handle_error(req, client, conn.address, exc)
            return Outcome.CLOSE
        return Outcome.ABORT

    def handle_request(self, req, client: ClientSocket, conn: Conn) -> bool:  # type: ignore[no-untyped-def]
        """gunicorn's request handling (as its gthread worker): True to keep alive."""
        environ: dict[str, Any] = {}
        resp = None
        try:
            self.cfg.pre_request(self, req)
            started = time.monotonic()
            resp, environ = wsgi.create(req, client, conn.address,
                                        conn.sock.getsockname(), self.cfg)
            environ["wsgi.multithread"] = True
            self.nr += 1
            if self.nr >= self.max_requests:
                if self.alive:
                    self.log.info("Autorestarting worker after current request.")
                    self.alive = False
                resp.force_close()
            if not self.alive or not self.cfg.keepalive:
                resp.force_close()
            respiter = self.wsgi(environ, resp.start_response)
            try:
                if isinstance(respiter, environ["wsgi.file_wrapper"]):
                    resp.write_file(respiter)
                else:
                    for item in respiter:
                        resp.write(item)
                resp.close()
            finally:
                if self.cfg.accesslog:
                    from datetime import timedelta

                    self.log.access(resp, req, environ,
                                    timedelta(seconds=time.monotonic() - started))
                if hasattr(respiter, "close"):
                    respiter.close()
            return not resp.should_close()
        except OSError:
            raise
        except (Exception, SystemExit):
            if resp and resp.headers_sent:
                # The answer began: a 500 written now would corrupt it. Close instead.
                self.log.exception("Error handling request")
                raise StopIteration() from None
            raise
        finally:
            try:
                self.cfg.post_request(self, req, environ, resp)
            except Exception:  # noqa: BLE001
                self.log.exception("Exception in post_request hook")


def _body_consumed(req) -> bool:  # type: ignore[no-untyped-def]
    """Whether the request's body was read off the wire to its end (no drain needed)."""
    reader = getattr(req.body, "reader", None)
    return isinstance(reader, LengthReader) and reader.length == 0


def _skip_buffered_body(parser, conn: Conn) -> bool:  # type: ignore[no-untyped-def]
    """Skip the part of the request's body the application did not read, from what the
    loop buffered, without waiting for the client: False (close the connection) when the
    rest is still to come."""
    conn.deadline = time.monotonic()
    conn.on_expired = lambda: TimeoutError("the rest of the body is not buffered")
    return bool(parser.finish_body(deadline=time.monotonic() + 1.0))


def worker_class(header_timeout: float, body_timeout: float,
                 max_body: int = LoopWorker.max_body) -> type[LoopWorker]:
    """The worker class for gunicorn's ``worker_class`` setting, with these limits."""
    return type("AcceldApiWorker", (LoopWorker,),
                {"header_timeout": float(header_timeout), "body_timeout": float(body_timeout),
                 "max_body": int(max_body)})

