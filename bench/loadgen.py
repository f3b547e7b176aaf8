"""A small closed-loop HTTP load generator: N worker processes, bounded by count and time.

Each worker runs one *operation* in a loop (a single request, or a short
sequence such as a whole ARQ lifecycle) until the shared request budget or the
time limit is spent, and records each operation's latency. Processes, not
threads, so that the generator's own Python does not serialise on one GIL; raw
sockets. Each worker keeps its connection alive, as real clients do (Nova's and
the SDK's keystoneauth sessions): a server that answers ``Connection: close``
(gunicorn's sync workers, upstream's) costs a new connection per request as
before, one that keeps it (acceld's threaded workers) does not.
``keep_alive=False`` sends ``Connection: close`` on every request instead.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import statistics
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

import orjson


class HttpError(Exception):
    pass


@dataclass
class Response:
    status: int
    body: bytes

    def json(self):  # type: ignore[no-untyped-def]
        return orjson.loads(self.body)


class Client:
    """HTTP/1.1 with Content-Length bodies (what gunicorn sends), over a kept-alive
    connection unless ``keep_alive`` is off or the server closes it."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None,
                 timeout: float = 60.0, keep_alive: bool = True) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.keep_alive = keep_alive
        self.connections = 0  # opened so far (the bench reports reuse)
        self._sock: socket.socket | None = None
        fixed = {"Host": f"{self.host}:{self.port}", "Accept": "application/json",
                 **({} if keep_alive else {"Connection": "close"}), **(headers or {})}
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connections += 1
        return sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def request(self, method: str, path: str, body: object | None = None,
                headers: dict[str, str] | None = None) -> Response:
        data = orjson.dumps(body) if body is not None else b""
        head = f"{method} {self.prefix}{path} HTTP/1.1\r\n{self._fixed}"
        if headers:
            head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        if body is not None:
            head += "Content-Type: application/json\r\n"
        head += f"Content-Length: {len(data)}\r\n\r\n"
        payload = head.encode() + data
        reused = self._sock is not None
        try:
            return self._exchange(method, path, payload)
        except (ConnectionError, HttpError) as exc:
            # A kept-alive connection the server closed while idle: once more, afresh.
            self.close()
            if not reused or (isinstance(exc, HttpError)
                              and "incomplete response (0 bytes)" not in str(exc)):
                raise
            return self._exchange(method, path, payload)

    def _exchange(self, method: str, path: str, payload: bytes) -> Response:
        sock = self._sock or self._connect()
        self._sock = sock
        sock.sendall(payload)
        # Read the head, then exactly Content-Length bytes; close when the server says so
        # (without waiting for its FIN, as HTTP clients do).
        raw = b""
        while (header_end := raw.find(b"\r\n\r\n")) < 0:
            chunk = sock.recv(65536)
            if not chunk:
                raise HttpError(f"{method} {path}: incomplete response ({len(raw)} bytes)")
            raw += chunk
        head = raw[:header_end]
        status = int(raw[9:12])
        length = 0 if status in (204, 304) else _content_length(head)  # no body by definition
        body = bytearray(raw[header_end + 4:])
        while (length is None or len(body) < length):
            chunk = sock.recv(262144)
            if not chunk:
                break
            body += chunk
        if length is not None and len(body) < length:
            self.close()
            raise HttpError(f"{method} {path}: body cut short ({len(body)} of {length} bytes)")
        if length is None or not self.keep_alive or _closes(head):
            self.close()
        return Response(status, bytes(body))

    def expect(self, status: int | tuple[int, ...], method: str, path: str,
               body: object | None = None) -> Response:
        resp = self.request(method, path, body)
        wanted = (status,) if isinstance(status, int) else status
        if resp.status not in wanted:
            raise HttpError(f"{method} {path}: {resp.status} {resp.body[:300]!r}")
        return resp


def _closes(head: bytes) -> bool:
    """The server will close after this answer (``Connection: close``, or HTTP/1.0
    without keep-alive)."""
    lower = head.lower()
    if b"\r\nconnection: close" in lower:
        return True
    return lower.startswith(b"http/1.0") and b"\r\nconnection: keep-alive" not in lower


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return None


# An operation gets (client, worker index, iteration) and performs one unit of work.
Operation = Callable[[Client, int, int], None]


@dataclass
class Result:
    name: str
    ops: int
    errors: int
    seconds: float
    latencies: list[float]
    first_error: str = ""

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1000 if self.latencies else float("nan")


def _worker(index: int, base_url: str, headers: dict[str, str], op: Operation,
            budget, deadline: float, timeout: float, out) -> None:  # type: ignore[no-untyped-def]
    client = Client(base_url, headers, timeout=timeout)
    latencies: list[float] = []
    errors = 0
    first_error = ""
    iteration = 0
    while time.monotonic() < deadline:
        with budget.get_lock():
            if budget.value <= 0:
                break
            budget.value -= 1
        started = time.perf_counter()
        try:
            op(client, index, iteration)
            latencies.append(time.perf_counter() - started)
        except Exception as exc:  # noqa: BLE001 - counted and reported, not fatal
            errors += 1
            first_error = first_error or f"{type(exc).__name__}: {exc}"[:300]
        iteration += 1
    client.close()
    out.put((latencies, errors, first_error))


def run(name: str, base_url: str, op: Operation, *, headers: dict[str, str] | None = None,
        concurrency: int = 4, max_ops: int = 2000, max_seconds: float = 5.0,
        timeout: float = 60.0) -> Result:
    """Run ``op`` from ``concurrency`` processes until ``max_ops`` or ``max_seconds``."""
    ctx = mp.get_context("fork")
    budget = ctx.Value("l", max_ops)
    out = ctx.Queue()
    started = time.monotonic()
    deadline = started + max_seconds
    procs = [ctx.Process(target=_worker, args=(i, base_url, headers or {}, op, budget, deadline,
                                               timeout, out), daemon=True)
             for i in range(concurrency)]
    for proc in procs:
        proc.start()
    latencies: list[float] = []
    errors = 0
    first_error = ""
    for _ in procs:
        lat, err, msg = out.get(timeout=max_seconds + timeout + 600)
        latencies += lat
        errors += err
        first_error = first_error or msg
    elapsed = time.monotonic() - started
    for proc in procs:
        proc.join(timeout=10)
    return Result(name, len(latencies), errors, elapsed, latencies, first_error)


def unique_suffix(index: int, iteration: int) -> str:
    return f"{os.getpid()}-{index}-{iteration}"
