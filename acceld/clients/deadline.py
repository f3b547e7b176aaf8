"""A total deadline for HTTP calls to peers (Nova, Placement, Glance, agents, drivers).

requests' ``timeout`` bounds the connection and each single read of the socket, not
the call: a peer that trickles a byte every few seconds, or keystoneauth retrying
after each timeout, keeps a call going for as long as the peer likes. Inside
``with bounded(seconds, what):`` every request a watched :class:`requests.Session`
(:func:`watch`) sends from this thread is held to one end time:

- each attempt's connect and read timeouts are cut to the time left, and an attempt
  that would start after the end is refused (:class:`DeadlinePassed`, which
  keystoneauth does not retry: it is neither a timeout nor a connection error);
- a watchdog thread shuts down the socket of a call still running at the end, so a
  peer that trickles or never answers ends the call there;
- whatever the call then raises leaves the block as :class:`DeadlinePassed`.

Blocks nest: the inner one ends no later than the outer one (a bind's Nova call
ends when the bind job's lease would). :func:`overdue` tells another thread (the
bind lease renewal) that a thread is stuck in a call past its end, which the
watchdog cannot cut (a name lookup): its claim is then not renewed.
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import itertools
import logging
import socket
import threading
import time
from typing import Any, Iterator

import requests
import requests.adapters
import urllib3.exceptions
from keystoneauth1 import exceptions as ks_exc
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

_clock = time.monotonic


class DeadlinePassed(requests.exceptions.RequestException):
    """A call ran out of its total deadline (``what``: whose deadline, ``seconds``)."""

    def __init__(self, what: str, seconds: float) -> None:
        super().__init__(f"no answer within the {seconds:g} s deadline of {what}")
        self.what = what
        self.seconds = seconds


# What a call cut by the watchdog raises, depending on where it was reading.
_TRANSPORT = (requests.RequestException, urllib3.exceptions.HTTPError, OSError,
              http.client.HTTPException, ks_exc.ClientException)


class Deadline:
    """One ``bounded`` block: its end (monotonic), and the connections it watches."""

    def __init__(self, end: float, what: str, seconds: float) -> None:
        self.end = end
        self.what = what
        self.seconds = seconds
        self.fired = False  # its end came with the block open
        self.cut = False  # ... and a call was running: its socket was shut down
        self.done = False  # the block was left
        self._conns: set[Any] = set()
        self._guard = threading.Lock()

    def remaining(self) -> float:
        return self.end - _clock()

    @property
    def expired(self) -> bool:
        return self.fired or self.remaining() <= 0

    def passed(self) -> DeadlinePassed:
        return DeadlinePassed(self.what, self.seconds)

    def watch(self, conn: Any) -> None:
        with self._guard:
            self._conns.add(conn)
            late = self.fired
        if late:
            _shut(conn)

    def forget(self, conn: Any) -> None:
        with self._guard:
            self._conns.discard(conn)

    def fire(self) -> None:
        """The end came with the block still open: cut every call it watches."""
        with self._guard:
            if self.done:
                return
            self.fired = True
            conns = list(self._conns)
            self.cut = bool(conns)
        for conn in conns:
            _shut(conn)

    def close(self) -> None:
        with self._guard:
            self.done = True
            self._conns.clear()


def _shut(conn: Any) -> None:
    """Unblock a thread reading ``conn``'s socket (plain or TLS): its read sees the end."""
    sock = getattr(conn, "sock", None)
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _Watchdog:
    """One thread for the whole process: fires each open deadline at its end."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, deadline: Deadline) -> None:
        with self._cond:
            heapq.heappush(self._heap, (deadline.end, next(self._seq), deadline))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="call-deadlines",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)  # left in time: nothing to cut
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - _clock()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                _, _, due = heapq.heappop(self._heap)
            due.fire()


_WATCHDOG = _Watchdog()


class _CutCallsQuiet(logging.Filter):
    """urllib3 logs a traceback for the half header a cut call leaves: the cut is the
    caller's to report (once, as an outage), not urllib3's at every cut."""

    def filter(self, record: logging.LogRecord) -> bool:
        deadline = current()
        return deadline is None or not deadline.fired


logging.getLogger("urllib3.connection").addFilter(_CutCallsQuiet())
_local = threading.local()
# Thread ident -> its open blocks, innermost last (read by overdue() from other threads).
_OPEN: dict[int, list[Deadline]] = {}
_OPEN_GUARD = threading.Lock()


def _stack() -> list[Deadline]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
        with _OPEN_GUARD:
            _OPEN[threading.get_ident()] = stack
    return stack


def current() -> Deadline | None:
    """The innermost open block of this thread, if any."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def now() -> float:
    """The deadlines' clock (monotonic): a reading for :func:`bounded`'s ``since``."""
    return _clock()


@contextlib.contextmanager
def bounded(seconds: float, what: str, since: float | None = None) -> Iterator[Deadline]:
    """Hold every watched request this thread sends inside the block to ``seconds`` in all
    (or to an enclosing block's end, if sooner). A call the end cut raises
    :class:`DeadlinePassed` out of the block.

    ``since``: a :func:`now` reading the seconds count from instead of the block's start
    (the moment a bound was read, e.g. a lease's time left): a thread frozen between that
    reading and the block finds its end passed, and no request leaves."""
    stack = _stack()
    end = (_clock() if since is None else since) + max(0.0, seconds)
    outer = stack[-1] if stack else None
    if outer is not None and outer.end <= end:
        deadline = Deadline(outer.end, outer.what, outer.seconds)
    else:
        deadline = Deadline(end, what, seconds)
    with _OPEN_GUARD:
        stack.append(deadline)
    _WATCHDOG.add(deadline)
    try:
        yield deadline
        if deadline.cut:  # a peer's answer ended by the watchdog (EOF): not to be trusted
            raise deadline.passed()
    except DeadlinePassed:
        raise
    except _TRANSPORT as exc:
        if deadline.expired or passed_in(exc) is not None:
            raise deadline.passed() from exc
        raise
    finally:
        deadline.close()
        with _OPEN_GUARD:
            stack.pop()


def overdue(thread_ident: int, grace: float = 0.0) -> Deadline | None:
    """The block of thread ``thread_ident`` that is past its end by over ``grace`` s, if
    that thread is still in it (its call was not cut: e.g. a name lookup)."""
    with _OPEN_GUARD:
        stack = list(_OPEN.get(thread_ident) or ())
    now = _clock()
    return next((d for d in stack if not d.done and now - d.end > grace), None)


def passed_in(exc: BaseException | None) -> DeadlinePassed | None:
    """The DeadlinePassed that ``exc`` is, or was raised from (keystoneauth wraps it)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, DeadlinePassed):
            return exc
        wrapped = getattr(exc, "original", None)  # keystoneauth's UnknownConnectionError
        exc = wrapped if isinstance(wrapped, BaseException) else (exc.__cause__ or
                                                                    exc.__context__)
        seen += 1
    return None


# -- requests plumbing ---------------------------------------------------------------------

class _Pool(HTTPConnectionPool):
    """A pool whose connections join the deadline of the thread that takes them."""

    def _get_conn(self, timeout: float | None = None):  # type: ignore[no-untyped-def]
        conn = super()._get_conn(timeout)
        deadline = current()
        if deadline is not None:
            conn._acceld_deadline = deadline  # type: ignore[attr-defined]
            deadline.watch(conn)
        return conn

    def _put_conn(self, conn) -> None:  # type: ignore[no-untyped-def]
        deadline = getattr(conn, "_acceld_deadline", None)
        if deadline is not None:
            deadline.forget(conn)  # back in the pool: another call's, not to be cut
            conn._acceld_deadline = None
        super()._put_conn(conn)


class _HTTPPool(_Pool):
    pass


class _HTTPSPool(_Pool, HTTPSConnectionPool):
    pass


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


def _clamp(timeout: Any, remaining: float) -> tuple[Any, bool]:
    """``timeout`` (None, seconds or (connect, read)) cut to ``remaining``; whether cut."""
    if isinstance(timeout, tuple):
        connect, read = timeout
    else:
        connect = read = timeout
    cut = [remaining if t is None or t > remaining else t for t in (connect, read)]
    return (cut[0], cut[1]), cut != [connect, read]


class _DeadlineAdapter(requests.adapters.BaseAdapter):
    """Wraps a session's adapter (keystoneauth's keeps its TLS and keepalive settings)."""

    def __init__(self, inner: requests.adapters.HTTPAdapter) -> None:
        super().__init__()
        self.inner = inner
        _arm(inner.poolmanager)
        original = inner.proxy_manager_for

        def proxy_manager_for(proxy: str, **kwargs: Any) -> Any:
            return _arm(original(proxy, **kwargs))

        inner.proxy_manager_for = proxy_manager_for  # type: ignore[method-assign]

    def send(self, request, stream=False, timeout=None, **kwargs):  # type: ignore[no-untyped-def]
        deadline = current()
        if deadline is None:
            return self.inner.send(request, stream=stream, timeout=timeout, **kwargs)
        remaining = deadline.remaining()
        if remaining <= 0 or deadline.fired:
            raise deadline.passed()
        timeout, cut = _clamp(timeout, remaining)
        try:
            resp = self.inner.send(request, stream=stream, timeout=timeout, **kwargs)
            if not stream:
                resp.content  # noqa: B018 - read here, under the deadline, not in Session
            if deadline.cut:  # the watchdog's shutdown read as the end of the answer
                raise deadline.passed()
        except requests.RequestException as exc:
            if deadline.expired or (cut and isinstance(exc, requests.Timeout)):
                raise deadline.passed() from exc
            raise
        return resp

    def close(self) -> None:
        self.inner.close()


def _arm(manager: Any) -> Any:
    manager.pool_classes_by_scheme = dict(_POOLS)
    manager.clear()  # pools made before were of the plain classes
    return manager


def watch(session: requests.Session) -> requests.Session:
    """Hold ``session``'s requests to the deadline of the ``bounded`` block they are sent
    in (outside any block they are sent as before). Idempotent."""
    for prefix, adapter in list(session.adapters.items()):
        if isinstance(adapter, requests.adapters.HTTPAdapter):
            session.mount(prefix, _DeadlineAdapter(adapter))
    return session
