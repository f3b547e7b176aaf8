"""`acceld simulate`: many node agents in one process, against a real conductor.

Each simulated agent is what the conductor sees of a real one: its own
internal endpoint (a port on 127.0.0.1) answering the signed ``GET /hardware``
and ``POST /discovery`` with the same credential checks, and a heartbeat,
``POST /hello`` with the digest of its hardware, signed with its own node key
(derived from the cloud's secret, as the conductor derives it), every heartbeat
interval; its endpoint accepts only that key and signs its answers. The hardware is the fake driver's records under the
agent's host name (``sim-00000`` ...), so the conductor's whole path runs:
hello, pull on a new digest, validation, reconciliation into the database.

One asyncio loop does it all: it serves every agent's port and sends the hellos
over a few kept-alive HTTP/1.1 connections per conductor (as real agents reuse
theirs), so ten thousand agents fit in one process without it being the
bottleneck. With several ``--conductor-url``s the agents are spread over them
and an agent whose conductor stops answering fails over to the next at once.
Phases, each announced on stdout as one JSON line (``{"event": ...}``) so a
benchmark can sample the conductors between them:

1. ``registered``: every agent said hello once and was pulled (from empty this
   is the time to reconcile the whole fleet);
2. ``steady``: ``--steady-seconds`` of heartbeats with no change;
3. ``churn``: ``--churn-seconds`` during which ``--change-percent`` of the
   devices change every ``--change-every`` seconds;
4. ``hold``: ``--hold-seconds`` of heartbeats only, while a benchmark does
   something else (kills a conductor); ``--status-every`` prints ``status``
   lines meanwhile (hellos, failovers, the oldest answered hello).

A final ``summary`` line gives the counts (hellos, pulls served, errors).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import resource
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson
from oslo_config import cfg

from acceld.agent.hardware import digest
from acceld.clients.conductor import conductor_urls
from acceld.drivers.fake import TYPES, FakeDriver
from acceld.internal import auth
from acceld.runtime.secrets import internal_secret

LOG = logging.getLogger(__name__)
DEVICE_TYPES = list(TYPES)


@dataclass
class SimulatedAgent:
    """One node: its host name, its port, its hardware and the digest sent in hellos."""

    index: int
    hostname: str
    records: list[dict[str, Any]]
    port: int = 0
    digest: str = ""
    generation: int = 0
    hellos: int = 0
    pulls: int = 0
    registered: bool = False
    body: bytes = b""
    key: bytes = b""  # the node's key, derived from the cloud's secret

    @property
    def signer(self) -> auth.Signer:
        return auth.Signer(self.key, self.hostname)

    def refresh(self) -> None:
        self.digest = digest(self.records)
        self.body = orjson.dumps({"hardware": self.records, "digest": self.digest})

    def change_one(self, device: int) -> None:
        """A hardware change the conductor must notice: the device's model string."""
        self.generation += 1
        self.records[device]["model"] = f"simulated model rev {self.generation}"
        self.refresh()


def build_agents(conf: cfg.ConfigOpts, count: int, devices: int,
                 prefix: str, secret: bytes = b"") -> list[SimulatedAgent]:
    """``count`` nodes with ``devices`` fake devices each, cycling through the fake types."""
    conf.set_override("devices", [DEVICE_TYPES[i % len(DEVICE_TYPES)] for i in range(devices)],
                      group="fake_driver")
    conf.set_override("spec_file", None, group="fake_driver")
    agents = []
    for index in range(count):
        hostname = f"{prefix}-{index:05d}"
        records = [r.to_dict() for r in FakeDriver(conf, hostname).discover()]
        agent = SimulatedAgent(index, hostname, records, key=auth.node_key(secret, hostname))
        agent.refresh()
        agents.append(agent)
    return agents


# ---- the agents' internal endpoints ------------------------------------------------------------

async def _read_message(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    """One HTTP/1.1 message from a kept-alive stream: its start line, its headers (names in
    lower case) and its body by Content-Length."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length") or 0)
    return lines[0], headers, (await reader.readexactly(length) if length else b"")


class HardwareServers:
    """One listening socket per agent on 127.0.0.1, all served by one asyncio loop."""

    def __init__(self, agents: list[SimulatedAgent], ttl: int) -> None:
        self.agents = agents
        # Each agent's endpoint accepts its own node's key only, as a real agent does.
        self.verifiers = {a.index: auth.Verifier(
            auth.NodeKeys(a.hostname, a.key), ttl,
            destination=auth.agent_destination(a.hostname)) for a in agents}
        self.refused = 0
        self.loop = asyncio.new_event_loop()
        self._servers: list[asyncio.base_events.Server] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-servers", daemon=True)

    def start(self) -> None:
        _raise_fd_limit(len(self.agents) + 512)
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("simulated agents' servers did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._listen())
        self._ready.set()
        self.loop.run_forever()

    async def _listen(self) -> None:
        for agent in self.agents:
            server = await asyncio.start_server(
                lambda r, w, a=agent: self._serve(a, r, w), "127.0.0.1", 0, backlog=64)
            agent.port = server.sockets[0].getsockname()[1]
            self._servers.append(server)

    async def _serve(self, agent: SimulatedAgent, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                start, headers, body = await _read_message(reader)
                method, target, _ = start.split(" ", 2)
                status, answer, signature = self._answer(agent, method, target, body, headers)
                close = headers.get("connection", "").lower() == "close"
                signed = b"%s: %s\r\n" % (auth.RESPONSE_HEADER.encode(),
                                           signature.encode()) if signature else b""
                writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n%s%s\r\n" % (
                                 status, _REASONS[status], len(answer), signed,
                                 b"Connection: close\r\n" if close else b"") + answer)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    def _answer(self, agent: SimulatedAgent, method: str, target: str, body: bytes,
                headers: dict[str, str]) -> tuple[int, bytes, str | None]:
        """Status, body and the answer's signature (None when the caller was refused)."""
        try:
            identity = self.verifiers[agent.index].verify(
                method, target, body, headers.get(auth.HEADER.lower()),
                node=headers.get(auth.NODE_HEADER.lower()),
                digest=headers.get(auth.DIGEST_HEADER.lower()))
        except auth.CredentialError:
            self.refused += 1
            return 401, b'{"error": "A valid internal credential is required."}', None
        path = target.split("?", 1)[0]
        if method == "GET" and path == "/hardware":
            agent.pulls += 1
            status, answer = 200, agent.body
        elif method == "POST" and path == "/discovery":
            status, answer = 202, b'{"status": "IN-PROGRESS"}'
        else:
            status, answer = 404, b'{"error": "Not found"}'
        return status, answer, auth.response_mac(identity.key, identity.nonce, status, answer)

    def stop(self) -> None:
        def _close() -> None:
            for server in self._servers:
                server.close()
            self.loop.stop()

        self.loop.call_soon_threadsafe(_close)
        self._thread.join(timeout=10)


_REASONS = {200: b"OK", 202: b"Accepted", 401: b"Unauthorized", 404: b"Not Found"}


def _raise_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(wanted, soft), hard), hard))


# ---- heartbeats --------------------------------------------------------------------------------

@dataclass
class HelloStats:
    sent: int = 0
    failed: int = 0
    pulled: int = 0
    failovers: int = 0
    last_error: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Connection:
    """One kept-alive HTTP/1.1 connection to a conductor, on the simulator's loop."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, head: bytes, body: bytes, timeout: float) -> tuple[int, dict, bytes]:
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), timeout)
        assert self.reader is not None
        self.writer.write(head + body)
        answer = await asyncio.wait_for(self._answer(self.reader), timeout)
        if answer[1].get("connection", "").lower() == "close":
            self.close()
        return answer

    @staticmethod
    async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict, bytes]:
        start, headers, body = await _read_message(reader)
        return int(start.split(" ", 2)[1]), headers, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Heartbeats:
    """Each agent's hello when due, from the simulator's event loop.

    Agents are spread over the conductor URLs (agent ``i`` starts on URL ``i % n``) and
    each URL gets ``connections`` kept-alive connections, as agents that reuse their
    connection. A hello that cannot reach its conductor (refused, reset, timed out,
    503) moves its agent to the next URL at once, as a real agent fails over, and is
    retried there; the time of each agent's last answered hello is kept, so that a
    benchmark can tell when every agent heartbeats to a live conductor again.

    The hellos of registered agents go ahead of the first hellos still waiting: real
    agents each have their own connection, so a registered node's heartbeat never waits
    behind other nodes' registrations (a plain FIFO held heartbeats back for longer than
    the down window while thousands of nodes registered, and they were marked down).
    """

    def __init__(self, agents: list[SimulatedAgent], urls: list[str], interval: float,
                 connections: int, loop: asyncio.AbstractEventLoop,
                 timeout: float = 30.0) -> None:
        self.agents = agents
        self.urls = urls
        self.interval = interval
        self.timeout = timeout
        self.loop = loop
        self.stats = HelloStats()
        self.conductor_of = [a.index % len(urls) for a in agents]
        self.last_ok = [0.0] * len(agents)  # time.time() of each agent's last answered hello
        self._targets = []
        for url in urls:
            parts = urlsplit(url if "://" in url else f"http://{url}")
            if parts.scheme != "http":
                raise ValueError(f"simulate speaks plain HTTP to conductors, not {url}")
            self._targets.append((parts.hostname or "127.0.0.1", parts.port or 80,
                                  parts.path.rstrip("/")))
        self._connections = connections
        # The name each conductor announced as its own process's (X-Acceld-Destination):
        # hellos are signed for it once known, as acceld's conductor client does, so that
        # the conductor keeps their nonces in memory (acceld.clients.internal).
        self._names: list[str | None] = [None] * len(urls)
        # Each agent is in exactly one place: a timer, a queue, or a hello in flight.
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._busy: set[int] = set()  # queued or in flight
        self._again: set[int] = set()  # woken while busy: hello again as soon as done
        # (0 registered / 1 first hello, order, agent index) per conductor URL.
        self._queues: list[asyncio.PriorityQueue[tuple[int, int, int]]] = []
        self._order = itertools.count()
        self._tasks: list[asyncio.Task] = []
        self._stopping = False

    def start(self) -> None:
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self) -> None:
        self._queues = [asyncio.PriorityQueue() for _ in self.urls]
        for agent in self.agents:
            self._due(agent.index)
        for target, queue_ in enumerate(self._queues):
            for _ in range(self._connections):
                self._tasks.append(asyncio.ensure_future(self._sender(target, queue_)))

    def wake(self, agent: SimulatedAgent) -> None:
        """Hello now (a changed node reports at once, as a real agent does after discovery)."""
        self.loop.call_soon_threadsafe(self._wake, agent.index)

    def _wake(self, index: int) -> None:
        if index in self._busy:
            self._again.add(index)
            return
        timer = self._timers.pop(index, None)
        if timer is not None:
            timer.cancel()
        self._due(index)

    def _due(self, index: int) -> None:
        self._timers.pop(index, None)
        if not self._stopping:
            self._busy.add(index)
            registered = self.agents[index].registered
            self._queues[self.conductor_of[index]].put_nowait(
                (0 if registered else 1, next(self._order), index))

    def _later(self, index: int, delay: float) -> None:
        self._busy.discard(index)
        if index in self._again:
            self._again.discard(index)
            delay = 0.0
        self._timers[index] = self.loop.call_later(delay, self._due, index)

    async def _sender(self, target: int,
                      queue_: asyncio.PriorityQueue[tuple[int, int, int]]) -> None:
        host, port, prefix = self._targets[target]
        conn = _Connection(host, port)
        try:
            while not self._stopping:
                _, _, index = await queue_.get()
                if self.conductor_of[index] != target:  # moved since it was queued
                    self._due(index)
                    continue
                ok = await self._hello(conn, prefix, self.agents[index], target)
                if ok:
                    self._later(index, self.interval)
                else:  # fail over: the next conductor, at once
                    conn.close()
                    self.conductor_of[index] = (target + 1) % len(self.urls)
                    with self.stats.lock:
                        self.stats.failovers += len(self.urls) > 1
                    self._later(index, 0.0 if len(self.urls) > 1 else 1.0)
        finally:
            conn.close()

    async def _hello(self, conn: _Connection, prefix: str, agent: SimulatedAgent,
                     target: int) -> bool:
        body = orjson.dumps({
            "status": "READY", "endpoint": f"127.0.0.1:{agent.port}",
            "hostname": agent.hostname, "heartbeat_interval": max(1, int(self.interval)),
            "hardware_digest": agent.digest, "drivers": ["fake"]})
        path = prefix + "/hello"
        signer = agent.signer
        name = self._names[target]
        headers, nonce = signer.headers("POST", path, body, destination=name or auth.CONDUCTOR)
        head = (f"POST {path} HTTP/1.1\r\nHost: {conn.host}:{conn.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
        error = ""
        pulled = False
        reachable = True
        try:
            status, answer_headers, answer = await conn.request(head, body, self.timeout)
            if status < 400 or auth.RESPONSE_HEADER.lower() in answer_headers:
                signer.check_response(nonce, status, answer,
                                      answer_headers.get(auth.RESPONSE_HEADER.lower()))
            if status == 401 and name is not None \
                    and auth.RESPONSE_HEADER.lower() not in answer_headers:
                self._names[target] = None  # another process there now: the shared name
            announced = answer_headers.get(auth.DESTINATION_HEADER.lower())
            if status < 400 and auth.is_conductor_instance(announced):
                self._names[target] = announced
            if status >= 400:  # answered: tried again an interval later, same conductor
                error = f"{status}: {answer[:200]!r}"
            else:
                pulled = bool(orjson.loads(answer).get("pulled")) if answer else False
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError, ValueError, auth.ResponseError) as exc:
            conn.close()
            error = f"{exc.__class__.__name__}: {exc}"
            reachable = False
        with self.stats.lock:
            self.stats.sent += 1
            self.stats.pulled += pulled
            if error:
                self.stats.failed += 1
                self.stats.last_error = error[:300]
        agent.hellos += 1
        if not error:
            agent.registered = True
            self.last_ok[agent.index] = time.time()
            return True
        return reachable

    def stop(self) -> None:
        def _stop() -> None:
            self._stopping = True
            for task in self._tasks:
                task.cancel()

        self.loop.call_soon_threadsafe(_stop)


# ---- the run -----------------------------------------------------------------------------------

_EMIT = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout (whole: the status thread emits beside the phases)."""
    line = json.dumps({"event": event, "time": round(time.time(), 3), **fields}) + "\n"
    with _EMIT:
        sys.stdout.write(line)
        sys.stdout.flush()


def run(conf: cfg.ConfigOpts, args: argparse.Namespace) -> int:
    secret = internal_secret(conf)
    urls = ([u.strip() for u in args.conductor_url.split(",") if u.strip()]
            if args.conductor_url else conductor_urls(conf))
    interval = args.heartbeat_interval or conf.agent.heartbeat_interval
    started = time.monotonic()
    conf.set_override("attach_handles", args.attach_handles, group="fake_driver")
    agents = build_agents(conf, args.agents, args.devices_per_agent, args.hostname_prefix,
                          secret)
    servers = HardwareServers(agents, conf.internal.credential_ttl)
    servers.start()
    emit("listening", agents=len(agents), devices=len(agents) * args.devices_per_agent,
         seconds=round(time.monotonic() - started, 3))

    beats = Heartbeats(agents, urls, interval, args.connections or args.threads, servers.loop)
    t0 = time.monotonic()
    beats.start()
    reporter = _StatusReporter(beats, servers, interval, args.status_every)
    reporter.start()
    deadline = t0 + args.register_timeout
    while not all(a.registered for a in agents):
        if time.monotonic() > deadline:
            missing = sum(not a.registered for a in agents)
            emit("failed", reason=f"{missing} agents not registered within "
                                  f"{args.register_timeout} s", last_error=beats.stats.last_error)
            reporter.stop()
            beats.stop()
            servers.stop()
            return 1
        time.sleep(0.05)
    emit("registered", seconds=round(time.monotonic() - t0, 3), agents=len(agents),
         pulls=sum(a.pulls for a in agents), hellos=beats.stats.sent,
         failed=beats.stats.failed)

    def snapshot() -> dict[str, int]:
        return {"hellos": beats.stats.sent, "failed": beats.stats.failed,
                "failovers": beats.stats.failovers,
                "pulls": sum(a.pulls for a in agents), "refused": servers.refused}

    if args.steady_seconds > 0:
        before = snapshot()
        emit("steady_start", **before)
        time.sleep(args.steady_seconds)
        after = snapshot()
        emit("steady_end", seconds=args.steady_seconds,
             **{k: after[k] - before[k] for k in after})

    if args.churn_seconds > 0:
        total_devices = len(agents) * args.devices_per_agent
        per_round = max(1, round(total_devices * args.change_percent / 100))
        before = snapshot()
        emit("churn_start", devices_per_round=per_round, every=args.change_every, **before)
        churn_end = time.monotonic() + args.churn_seconds
        rounds = changed = 0
        cursor = 0
        while time.monotonic() < churn_end:
            for _ in range(per_round):
                agent = agents[cursor % len(agents)]
                agent.change_one((cursor // len(agents)) % args.devices_per_agent)
                beats.wake(agent)
                cursor += 1
                changed += 1
            rounds += 1
            time.sleep(max(0.0, min(args.change_every, churn_end - time.monotonic())))
        time.sleep(min(5.0, interval))  # let the last changes be pulled
        after = snapshot()
        emit("churn_end", seconds=args.churn_seconds, rounds=rounds, devices_changed=changed,
             **{k: after[k] - before[k] for k in after})

    if args.hold_seconds > 0:  # heartbeats only, while a benchmark does its part
        before = snapshot()
        emit("hold_start", **before)
        time.sleep(args.hold_seconds)
        after = snapshot()
        emit("hold_end", seconds=args.hold_seconds,
             **{k: after[k] - before[k] for k in after})

    reporter.stop()
    beats.stop()
    servers.stop()
    emit("summary", agents=len(agents), devices_per_agent=args.devices_per_agent,
         seconds=round(time.monotonic() - started, 3), **snapshot())
    return 0 if beats.stats.failed == 0 or args.hold_seconds > 0 else 2


class _StatusReporter:
    """A ``status`` line every ``every`` seconds: counts, and how fresh the agents are
    (``oldest_ok``: the oldest of the agents' last answered hellos; ``late``: agents
    whose last answered hello is older than twice the interval)."""

    def __init__(self, beats: Heartbeats, servers: HardwareServers, interval: float,
                 every: float) -> None:
        self.beats, self.servers, self.interval, self.every = beats, servers, interval, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-status", daemon=True)

    def start(self) -> None:
        if self.every > 0:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            now = time.time()
            last = self.beats.last_ok
            per: dict[str, int] = {}
            for target in self.beats.conductor_of:
                url = self.beats.urls[target]
                per[url] = per.get(url, 0) + 1
            emit("status", hellos=self.beats.stats.sent, failed=self.beats.stats.failed,
                 failovers=self.beats.stats.failovers, oldest_ok=round(min(last), 3),
                 late=sum(1 for t in last if now - t > 2 * self.interval),
                 agents_per_conductor=per, last_error=self.beats.stats.last_error[:120])

    def stop(self) -> None:
        self._stop.set()


def main_from_cli(conf: cfg.ConfigOpts, args: argparse.Namespace) -> int:
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    try:
        return run(conf, args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover - use `acceld simulate`
    sys.exit("run `acceld simulate`")
