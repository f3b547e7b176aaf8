"""HTTP connections served by the thread that reads them, for the public and internal APIs.

Why not a selector thread feeding a pool (gunicorn's gthread, the internal server
before this): each request then crosses threads three times (the selector hands it
to the pool through a queue, the pool hands the connection back through a wake-up
pipe, the selector re-registers it), and on one GIL those switches cost more than
acceld's handlers. Measured under four kept-alive clients: 0.66 ms per version
document with gthread against 0.26 ms for gunicorn's sync worker, whose one
thread does everything (docs/performance.md).

Here ``threads`` threads all wait on one epoll. Every connection is registered
one-shot, so a readiness event wakes exactly one thread and the connection is
that thread's until it re-arms it:

- reading a request's head (request line and headers), and a TLS handshake, never
  blocks: bytes are buffered on the connection until the head is complete, so a
  slow or idle client holds no thread, only a file descriptor;
- a request's body is read the same way, before the request is served, when the owner
  asks for it (:class:`BodyBuffering`): up to a size limit, within a deadline for the
  whole body, and (for the internal API) only once the head's credential is found
  genuine. A client that announces a body and sends it slowly, or never, holds a file
  descriptor until that deadline, never a thread;
- the thread that completes a request serves it itself (``serve``): the application
  reads the buffered body and writes the answer with blocking calls under the
  owner's deadlines, then re-arms the kept-alive connection. No hand-off, no queue;
- with a ``slot`` (acceld.serving.serving_slot; the public API's), only the slot's holder polls
  the epoll and handles events, so one thread at a time runs the application and threads
  do not trade the GIL at every system call; a request that waits for another service
  steps out of the slot and the next thread takes over meanwhile. Without one (the
  internal API), the threads poll and serve side by side;
- a new connection has ``header_timeout`` to send its whole head; a kept-alive one
  may idle ``idle_timeout``, then has ``header_timeout`` from its next first byte;
  a sweep (one thread at a time, twice a second) closes the late ones;
- at ``max_connections`` the idle connection nearest its deadline is closed to make
  room, so an idle flood cannot lock others out;
- a connection closed after an answer lingers in the epoll, not in a thread, until
  the client's FIN (at most ``LINGER_SECONDS``), so the answer is not destroyed by a
  reset and a client that never closes stalls no one.

``serve`` is the owner's: the gunicorn worker of the public API
(acceld.serving.api_worker) and the conductor's and agents' internal server
(acceld.serving.pool_server).
"""

from __future__ import annotations

import enum
import logging
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Callable

from acceld.serving import request_framing
from acceld.serving.serving_slot import Slot

LOG = logging.getLogger(__name__)

HEAD_END = b"\r\n\r\n"
MAX_HEAD = 64 * 1024
LINGER_SECONDS = 2.0
LINGER_MAX_BYTES = 64 * 1024
SWEEP_INTERVAL = 0.5

_READ = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLONESHOT
_WRITE = select.EPOLLOUT | select.EPOLLONESHOT


class Outcome(enum.Enum):
    """What ``serve`` wants done with the connection after a request."""

    KEEP = "keep"  # kept alive: ``Conn.buffer`` holds whatever was read past the request
    CLOSE = "close"  # close after the client's FIN (lingering in the epoll)
    ABORT = "abort"  # close at once (the client broke a deadline or the protocol)


class Phase(enum.Enum):
    HANDSHAKE = "handshake"
    HEAD = "head"  # reading a head: header_timeout runs
    BODY = "body"  # head read, body being buffered: BodyBuffering.timeout runs
    IDLE = "idle"  # kept alive, no byte of the next request yet: idle_timeout runs
    LINGER = "linger"  # answered and half-closed: waiting for the client's FIN


# A connection in these phases has a request on its way that a graceful stop still serves.
_ARRIVING = frozenset((Phase.HANDSHAKE, Phase.HEAD, Phase.BODY))

_CHUNKED = -1  # Conn.request_end while a chunked body's end is not yet in the buffer


@dataclass(frozen=True)
class BodyBuffering:
    """Which request bodies the loop reads before ``serve`` runs, so that no thread that
    runs the application waits for a client's body.

    A body is buffered when its head announces at most ``max_bytes`` (by Content-Length,
    or chunked when ``chunked``) and ``admit`` (if given) accepts the head; it must
    arrive within ``timeout`` seconds of the head's end. Any other request is served as
    soon as its head is in: the owner refuses it (413 by its Content-Length, 400 for
    ambiguous framing, 401 for a credential) without reading a body it will not use,
    and closes the connection. ``refuse(conn, status)`` writes a short answer (408 for a
    late body, 413 for a chunked body over ``max_bytes``) before the loop closes it."""

    max_bytes: int
    timeout: float
    chunked: bool = True
    admit: Callable[[bytes], bool] | None = None
    refuse: Callable[["Conn", int], None] | None = None


class Conn:
    """One client connection. While ``serve`` runs, the socket is blocking and
    :meth:`recv` gives the buffered bytes first, then reads until ``deadline``."""

    __slots__ = ("sock", "address", "buffer", "deadline", "phase", "busy", "closed",
                 "drained", "on_expired", "head_end", "request_end", "continued")

    def __init__(self, sock: socket.socket, address: Any, deadline: float,
                 phase: Phase) -> None:
        self.sock = sock
        self.address = address
        self.buffer = bytearray()
        self.deadline: float | None = deadline
        self.phase = phase
        self.busy = False  # a thread owns it (serving, or handling its event)
        self.closed = False
        self.drained = 0
        # While serving: what a read past ``deadline`` raises (the owner's choice).
        self.on_expired: Callable[[], BaseException] = lambda: TimeoutError("deadline passed")
        # Offsets in ``buffer`` of the current request's head end and request end (None
        # until the head is in; _CHUNKED until a chunked body's end is).
        self.head_end: int | None = None
        self.request_end: int | None = None
        self.continued = False  # the loop answered the head's "Expect: 100-continue"

    def recv(self, size: int) -> bytes:
        """Buffered bytes first; then one read from the socket, bounded by ``deadline``."""
        if self.buffer:
            data = bytes(self.buffer[:size])
            del self.buffer[:size]
            return data
        if self.deadline is None:
            return self.sock.recv(size)
        # Past the deadline, bytes already received are still taken (the application may
        # have been slow to read them); only waiting for more is refused.
        self.sock.settimeout(max(0.0, self.deadline - time.monotonic()))
        try:
            return self.sock.recv(size)
        except (socket.timeout, TimeoutError, BlockingIOError, ssl.SSLWantReadError):
            raise self.on_expired() from None
        finally:
            self.sock.settimeout(None)

    def peer(self) -> str:
        if isinstance(self.address, tuple) and len(self.address) >= 2:
            return f"{self.address[0]}:{self.address[1]}"
        return str(self.address)


Serve = Callable[[Conn], Outcome]


class ConnectionLoop:
    """Serve the connections of ``listeners`` with ``serve`` on ``threads`` threads."""

    def __init__(self, listeners: list[socket.socket], serve: Serve, *, threads: int,
                 max_connections: int, header_timeout: float, idle_timeout: float,
                 ssl_context: ssl.SSLContext | None = None, name: str = "http",
                 on_header_timeout: Callable[[Conn], None] | None = None,
                 body: BodyBuffering | None = None, slot: Slot | None = None) -> None:
        self.serve = serve
        # With a slot, one thread at a time handles events (acceld.serving.serving_slot).
        self.slot = slot
        self.body = body
        self.threads = threads
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.idle_timeout = idle_timeout
        self.name = name
        self._ssl = ssl_context
        self._on_header_timeout = on_header_timeout
        self._epoll = select.epoll()
        self._listeners = {s.fileno(): s for s in listeners}
        for sock in listeners:
            sock.setblocking(False)
            self._epoll.register(sock.fileno(), select.EPOLLIN | select.EPOLLONESHOT)
        self._wake_r, self._wake_w = socket.socketpair()
        # Level-triggered and never read: once written, it wakes every thread to stop.
        self._epoll.register(self._wake_r.fileno(), select.EPOLLIN)
        # With a slot: a thread back from a wait wants it, and wakes the holder out of
        # its epoll through this pair (read when it fires).
        self._wants: tuple[socket.socket, socket.socket] | None = None
        self._want_fd = -1
        if slot is not None:
            self._wants = socket.socketpair()
            for sock in self._wants:
                sock.setblocking(False)
            self._want_fd = self._wants[0].fileno()
            self._epoll.register(self._want_fd, select.EPOLLIN)
            slot.on_wanted = self._signal_want
        self._conns: dict[int, Conn] = {}
        self._lock = threading.Lock()
        self._sweeping = threading.Lock()
        self._next_sweep = 0.0
        self._serving = 0  # connections inside ``serve`` now
        self.accepted = 0  # connections accepted since the start
        self._stopping = False
        self._accepting = True
        self._threads: list[threading.Thread] = []

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._conns)

    @property
    def idle_connections(self) -> int:
        """Open connections no thread holds (waiting for a request, or lingering)."""
        with self._lock:
            return sum(1 for conn in self._conns.values() if not conn.busy)

    @property
    def serving(self) -> int:
        with self._lock:
            return self._serving

    def start(self) -> "ConnectionLoop":
        for i in range(self.threads):
            thread = threading.Thread(target=self._run, name=f"{self.name}-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop_accepting(self) -> None:
        """Take the listeners out of the epoll (a graceful stop: others take new clients)."""
        with self._lock:
            self._accepting = False
            for fd in self._listeners:
                try:
                    self._epoll.unregister(fd)
                except (OSError, ValueError):
                    pass

    @property
    def arriving(self) -> int:
        """Connections whose request is on its way (a handshake, a head or a body being
        read): accepted by this loop, so no other worker will answer them."""
        with self._lock:
            return sum(1 for conn in self._conns.values() if conn.phase in _ARRIVING)

    def stop(self, grace: float = 0.0) -> None:
        """Stop accepting; wait up to ``grace`` seconds for requests being served and for
        those on their way (each also bounded by its header or body deadline); then end the
        threads and close every connection, idle kept-alive ones at once (the listeners
        are the caller's)."""
        self.stop_accepting()
        until = time.monotonic() + grace
        while (self.serving or self.arriving) and time.monotonic() < until:
            time.sleep(0.05)
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self.slot is not None:
            self.slot.close()  # the threads waiting for it go on, see the stop, and end
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=max(0.1, until - time.monotonic()) + 1)
        with self._lock:
            conns = list(self._conns.values())
            self._conns.clear()
        for conn in conns:
            if not conn.busy:
                _close_now(conn.sock)
        self._epoll.close()
        for sock in (self._wake_r, self._wake_w, *(self._wants or ())):
            sock.close()

    # One thread's loop

    def _run(self) -> None:
        epoll = self._epoll
        slot = self.slot
        if slot is not None:
            slot.take()  # only the slot's holder polls (acceld.serving.serving_slot)
        try:
            while not self._stopping:
                try:
                    # One event a wait: events taken in a batch would be disarmed
                    # (one-shot) and wait behind this thread's request.
                    events = epoll.poll(SWEEP_INTERVAL, 1)
                except (OSError, ValueError):  # closed under us by stop()
                    return
                self._handle(events)
                if slot is not None and slot.wanted():
                    slot.give()  # to a thread back from a wait; then wait our turn
                    slot.take()
        finally:
            if slot is not None:
                slot.give()

    def _handle(self, events: list[tuple[int, int]]) -> None:
        for fd, mask in events:
            if self._stopping:
                return
            try:
                if fd == self._want_fd:
                    self._drain_wants()
                elif fd in self._listeners:
                    self._accept(self._listeners[fd])
                else:
                    self._on_event(fd, mask)
            except Exception:  # noqa: BLE001 - one connection's failure is its own
                LOG.exception("%s: connection handling failed", self.name)
        now = time.monotonic()
        if now >= self._next_sweep and self._sweeping.acquire(blocking=False):
            try:
                self._next_sweep = now + SWEEP_INTERVAL
                self._sweep(now)
            finally:
                self._sweeping.release()

    def _signal_want(self) -> None:
        try:
            self._wants[1].send(b"w")  # type: ignore[index]
        except OSError:  # full (wakes pending already) or closed by stop()
            pass

    def _drain_wants(self) -> None:
        try:
            while self._wants[0].recv(4096):  # type: ignore[index]
                pass
        except OSError:
            pass

    def _accept(self, listener: socket.socket) -> None:
        try:
            for _ in range(64):
                try:
                    sock, address = listener.accept()
                except (BlockingIOError, InterruptedError):
                    return
                except OSError as exc:  # out of descriptors, ...: try at the next event
                    LOG.warning("%s: cannot accept: %s", self.name, exc)
                    return
                self.accepted += 1
                self._admit(sock, address)
        finally:
            with self._lock:
                if self._accepting and not self._stopping:
                    try:
                        self._epoll.modify(listener.fileno(),
                                           select.EPOLLIN | select.EPOLLONESHOT)
                    except (OSError, ValueError):
                        pass

    def _admit(self, sock: socket.socket, address: Any) -> None:
        if len(self._conns) >= self.max_connections and not self._evict():
            _close_now(sock)  # every slot holds a request being served: refuse
            return
        sock.setblocking(False)
        try:  # an answer goes out in one write: do not wait for the ACK of the last
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        phase = Phase.HEAD
        if self._ssl is not None:
            try:
                sock = self._ssl.wrap_socket(sock, server_side=True,
                                             do_handshake_on_connect=False)
            except (OSError, ssl.SSLError) as exc:
                LOG.debug("%s: TLS setup for %s failed: %s", self.name, address, exc)
                _close_now(sock)
                return
            phase = Phase.HANDSHAKE
        conn = Conn(sock, address, time.monotonic() + self.header_timeout, phase)
        with self._lock:
            self._conns[sock.fileno()] = conn
        self._epoll.register(sock.fileno(), _READ)

    def _evict(self) -> bool:
        """Close the idle connection nearest its deadline; False if none is idle."""
        with self._lock:
            idle = [c for c in self._conns.values() if not c.busy and c.deadline is not None]
            if not idle:
                return False
            victim = min(idle, key=lambda c: c.deadline or 0.0)
            self._forget(victim)
        LOG.debug("%s: full, closing the idle connection from %s", self.name, victim.peer())
        _close_now(victim.sock)
        return True

    def _forget(self, conn: Conn) -> None:
        """Under the lock: the connection is no longer ours to serve."""
        conn.closed = True
        self._conns.pop(conn.sock.fileno(), None)

    def _sweep(self, now: float) -> None:
        with self._lock:
            late = [c for c in self._conns.values()
                    if not c.busy and c.deadline is not None and c.deadline <= now]
            for conn in late:
                self._forget(conn)
        for conn in late:
            if conn.phase in (Phase.HEAD, Phase.HANDSHAKE) and self._on_header_timeout:
                self._on_header_timeout(conn)
            elif conn.phase is Phase.BODY and self.body and self.body.refuse:
                LOG.info("%s: closing the connection from %s: its request body did not "
                         "arrive within %g s", self.name, conn.peer(), self.body.timeout)
                self.body.refuse(conn, 408)
            _close_now(conn.sock)

    def _on_event(self, fd: int, mask: int) -> None:
        with self._lock:
            conn = self._conns.get(fd)
            if conn is None or conn.busy or conn.closed:
                return  # closed by a sweep after its event fired
            conn.busy = True
        try:
            outcome = self._advance(conn, mask)
        except Exception:
            self._close(conn, Outcome.ABORT)
            raise
        if outcome is not None:
            self._close(conn, outcome)

    def _advance(self, conn: Conn, mask: int) -> Outcome | None:
        """Read what arrived; serve complete requests. None: the connection was re-armed."""
        sock = conn.sock
        try:
            if conn.phase is Phase.LINGER:
                return self._drain(conn)
            if conn.phase is Phase.HANDSHAKE:
                sock.do_handshake()  # type: ignore[attr-defined]
                conn.phase = Phase.HEAD
            if self._complete(conn):  # pipelined behind the last request
                return self._serve(conn)
            while True:
                chunk = sock.recv(MAX_HEAD)
                if not chunk:
                    return Outcome.ABORT
                if conn.phase is Phase.IDLE:  # the next request began: header_timeout runs
                    conn.phase = Phase.HEAD
                    conn.deadline = min(conn.deadline or float("inf"),
                                        time.monotonic() + self.header_timeout)
                conn.buffer += chunk
                if self._complete(conn):
                    return self._serve(conn)
                if conn.head_end is None and len(conn.buffer) > MAX_HEAD:
                    LOG.debug("%s: head from %s over %d bytes: closed", self.name,
                              conn.peer(), MAX_HEAD)
                    return Outcome.ABORT
                if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                    self._rearm(conn, _READ)
                    return None
        except request_framing.ChunkedTooLarge as exc:
            LOG.info("%s: closing the connection from %s: %s", self.name, conn.peer(), exc)
            if self.body and self.body.refuse:
                self.body.refuse(conn, 413)
            return Outcome.ABORT
        except ssl.SSLWantReadError:
            self._rearm(conn, _READ)
        except ssl.SSLWantWriteError:
            self._rearm(conn, _WRITE)
        except (BlockingIOError, InterruptedError):
            self._rearm(conn, _READ)
        except (OSError, ssl.SSLError) as exc:
            LOG.debug("%s: connection from %s failed: %s", self.name, conn.peer(), exc)
            return Outcome.ABORT
        return None

    def _complete(self, conn: Conn) -> bool:
        """Whether ``conn.buffer`` holds a request to serve: its head, and its body when
        the loop reads it first (:class:`BodyBuffering`). Entering the body's wait, the
        phase becomes BODY with the body's deadline."""
        if conn.head_end is None:
            end = conn.buffer.find(HEAD_END)
            if end < 0:
                return False
            conn.head_end = end + len(HEAD_END)
            conn.request_end = self._request_end(conn, bytes(conn.buffer[:end]))
            if conn.request_end == conn.head_end:
                return True
            conn.phase = Phase.BODY
            conn.deadline = time.monotonic() + self.body.timeout  # type: ignore[union-attr]
        if conn.request_end == _CHUNKED:
            assert self.body is not None
            try:
                end_of_body = request_framing.chunked_end(conn.buffer, conn.head_end,
                                                          self.body.max_bytes)
            except request_framing.ChunkedMalformed:
                return True  # the parser answers 400 from the bytes buffered
            if end_of_body is None:
                return False
            conn.request_end = end_of_body
        return len(conn.buffer) >= (conn.request_end or 0)

    def _request_end(self, conn: Conn, head: bytes) -> int:
        """Where the request whose head ends at ``conn.head_end`` ends (or _CHUNKED): its
        body's end when the loop is to read it, else the head's end (served at once)."""
        start = conn.head_end or 0
        if self.body is None:
            return start
        frame = request_framing.framing(head)
        if not frame.has_body or frame.ambiguous:
            return start
        if frame.chunked and not self.body.chunked:
            return start
        if frame.content_length is not None and frame.content_length > self.body.max_bytes:
            return start
        if self.body.admit is not None and not self.body.admit(head):
            return start
        if frame.expect_continue and start == len(conn.buffer):
            _send_continue(conn)
        return _CHUNKED if frame.chunked else start + (frame.content_length or 0)

    def _serve(self, conn: Conn) -> Outcome | None:
        """Serve the request buffered on ``conn`` in this thread, then re-arm or close."""
        conn.head_end = conn.request_end = None  # what follows is the next request's
        with self._lock:
            self._serving += 1
        try:
            conn.sock.setblocking(True)
            conn.deadline = None
            outcome = self.serve(conn)
        finally:
            conn.continued = False
            with self._lock:
                self._serving -= 1
        if outcome is not Outcome.KEEP:
            return outcome
        if self._stopping or not self._accepting:
            return Outcome.CLOSE
        sock = conn.sock
        sock.setblocking(False)
        now = time.monotonic()
        if conn.buffer:  # the next request began already
            conn.phase, conn.deadline = Phase.HEAD, now + self.header_timeout
        else:
            conn.phase, conn.deadline = Phase.IDLE, now + self.idle_timeout
        if HEAD_END in conn.buffer:
            # A pipelined request is complete already: the socket is writable, so this
            # fires at once, after the other connections' events (one request a turn).
            self._rearm(conn, _WRITE)
        elif isinstance(sock, ssl.SSLSocket) and sock.pending():
            return self._advance(conn, 0)  # decrypted already: epoll will not fire
        else:
            self._rearm(conn, _READ)
        return None

    def _rearm(self, conn: Conn, events: int) -> None:
        with self._lock:
            if conn.closed:
                return
            conn.busy = False
        try:
            self._epoll.modify(conn.sock.fileno(), events)
        except (OSError, ValueError):  # swept and closed meanwhile
            pass

    def _close(self, conn: Conn, outcome: Outcome) -> None:
        sock = conn.sock
        if outcome is Outcome.CLOSE and not isinstance(sock, ssl.SSLSocket) \
                and not self._stopping:
            try:
                sock.shutdown(socket.SHUT_WR)
                sock.setblocking(False)
                conn.phase, conn.deadline = Phase.LINGER, time.monotonic() + LINGER_SECONDS
                conn.buffer.clear()
                self._rearm(conn, _READ)
                return
            except OSError:
                pass
        with self._lock:
            self._forget(conn)
        if outcome is Outcome.CLOSE:
            _close_after_answer(sock)
        else:
            _close_now(sock)

    def _drain(self, conn: Conn) -> Outcome | None:
        """A lingering connection: discard what the client sends until its FIN."""
        try:
            while True:
                data = conn.sock.recv(65536)
                conn.drained += len(data)
                if not data or conn.drained >= LINGER_MAX_BYTES:
                    return Outcome.ABORT  # its FIN (or enough): close now
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
            self._rearm(conn, _READ)
            return None
        except OSError:
            return Outcome.ABORT


def send_refusal(conn: Conn, status: int, body: bytes,
                 content_type: str = "application/json") -> None:
    """A short answer the loop gives before it closes a connection (a
    :attr:`BodyBuffering.refuse`), written without blocking: one that does not fit the
    socket's buffer at once is dropped (the client is not reading)."""
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n")
    try:
        conn.sock.setblocking(False)
        conn.sock.send(head.encode("latin-1") + body)
    except (OSError, ssl.SSLError):
        pass


def _send_continue(conn: Conn) -> None:
    """Tell a client that waits for it to send its body (non-blocking: 25 bytes fit any
    socket buffer; a client that cannot take them is late with its body anyway)."""
    try:
        conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        conn.continued = True
    except (OSError, ssl.SSLError):
        pass


def _close_now(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def _close_after_answer(sock: socket.socket) -> None:
    """Close without resetting the answer: discard what the client already sent (up to
    64 KiB, not waiting for more), as closing with unread bytes sends a reset."""
    try:
        sock.setblocking(False)
        for _ in range(16):
            if not sock.recv(4096):
                break
    except (OSError, ValueError):
        pass
    finally:
        _close_now(sock)
