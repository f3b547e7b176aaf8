"""`acceld simulate`: many node agents in one process, against a real conductor.

Each simulated agent is what the conductor sees of a real one: its own
internal endpoint (a port on 127.0.0.1) answering the signed ``GET /hardware``
and ``POST /discovery`` with the same credential checks, and a heartbeat,
``POST /hello`` with the digest of its hardware, signed with its own node key
(derived from the cloud's secret, as the conductor derives it), every heartbeat
interval; its endpoint accepts only that key and signs its answers. The hardware is the fake driver's records under the
agent's host name (``sim-00000`` ...), so the conductor's whole path runs:
hello, pull on a new digest, validation, reconciliation into the database.

One asyncio loop serves all the agents' ports, and a small thread pool sends
the hellos, so a thousand agents fit in one process. Phases, each announced on
stdout as one JSON line (``{"event": ...}``) so a benchmark can sample the
conductor between them:

1. ``registered``: every agent said hello once and was pulled (from empty this
   is the time to reconcile the whole fleet);
2. ``steady``: ``--steady-seconds`` of heartbeats with no change;
3. ``churn``: ``--churn-seconds`` during which ``--change-percent`` of the
   devices change every ``--change-every`` seconds.

A final ``summary`` line gives the counts (hellos, pulls served, errors).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import logging
import queue
import resource
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import requests
from oslo_config import cfg

from acceld.agent.hardware import digest
from acceld.clients.conductor import conductor_url
from acceld.clients.internal import InternalClient, InternalError
from acceld.drivers.fake import TYPES, FakeDriver
from acceld.internal import auth
from acceld.services.secrets import internal_secret

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
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length") or 0)
                body = await reader.readexactly(length) if length else b""
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
    last_error: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


class Heartbeats:
    """Sends each agent's hello when due, from a pool of threads with one client each."""

    def __init__(self, agents: list[SimulatedAgent], url: str, interval: float,
                 threads: int) -> None:
        self.agents = agents
        self.url = url
        self.interval = interval
        self.stats = HelloStats()
        self._due: list[tuple[float, int]] = []
        self._cond = threading.Condition()
        self._work: queue.Queue[SimulatedAgent | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._sender, name=f"sim-hello-{i}", daemon=True)
                         for i in range(threads)]
        self._scheduler = threading.Thread(target=self._schedule, name="sim-schedule",
                                           daemon=True)

    def start(self) -> None:
        now = time.monotonic()
        with self._cond:
            self._due = [(now, a.index) for a in self.agents]
            heapq.heapify(self._due)
        for thread in self._threads:
            thread.start()
        self._scheduler.start()

    def wake(self, agent: SimulatedAgent) -> None:
        """Hello now (a changed node reports at once, as a real agent does after discovery)."""
        with self._cond:
            heapq.heappush(self._due, (time.monotonic(), agent.index))
            self._cond.notify()

    def _schedule(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                while not self._stop.is_set():
                    now = time.monotonic()
                    if self._due and self._due[0][0] <= now:
                        _, index = heapq.heappop(self._due)
                        break
                    timeout = self._due[0][0] - now if self._due else 1.0
                    self._cond.wait(min(timeout, 1.0))
                else:
                    return
            self._work.put(self.agents[index])

    def _sender(self) -> None:
        client = InternalClient(self.url, b"", timeout=120,  # each hello: its node's key
                                destination=auth.CONDUCTOR)
        while True:
            agent = self._work.get()
            if agent is None:
                client.close()
                return
            body = {"status": "READY", "endpoint": f"127.0.0.1:{agent.port}",
                    "hostname": agent.hostname, "heartbeat_interval": max(1, int(self.interval)),
                    "hardware_digest": agent.digest, "drivers": ["fake"]}
            ok = False
            try:
                answer = client.call("POST", "/hello", body, signer=agent.signer)
                ok = True
                pulled = bool(answer and answer.get("pulled"))
            except (InternalError, requests.RequestException) as exc:
                pulled = False
                with self.stats.lock:
                    self.stats.failed += 1
                    self.stats.last_error = str(exc)[:300]
            with self.stats.lock:
                self.stats.sent += 1
                self.stats.pulled += pulled
            agent.hellos += 1
            if ok:
                agent.registered = True
            with self._cond:
                heapq.heappush(self._due, (time.monotonic() + (self.interval if ok else 1.0),
                                           agent.index))
                self._cond.notify()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._scheduler.join(timeout=5)
        for _ in self._threads:
            self._work.put(None)
        for thread in self._threads:
            thread.join(timeout=30)


# ---- the run -----------------------------------------------------------------------------------

def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "time": round(time.time(), 3), **fields}), flush=True)


def run(conf: cfg.ConfigOpts, args: argparse.Namespace) -> int:
    secret = internal_secret(conf)
    url = args.conductor_url or conductor_url(conf)
    interval = args.heartbeat_interval or conf.agent.heartbeat_interval
    started = time.monotonic()
    conf.set_override("attach_handles", args.attach_handles, group="fake_driver")
    agents = build_agents(conf, args.agents, args.devices_per_agent, args.hostname_prefix,
                          secret)
    servers = HardwareServers(agents, conf.internal.credential_ttl)
    servers.start()
    emit("listening", agents=len(agents), devices=len(agents) * args.devices_per_agent,
         seconds=round(time.monotonic() - started, 3))

    beats = Heartbeats(agents, url, interval, args.threads)
    t0 = time.monotonic()
    beats.start()
    deadline = t0 + args.register_timeout
    while not all(a.registered for a in agents):
        if time.monotonic() > deadline:
            missing = sum(not a.registered for a in agents)
            emit("failed", reason=f"{missing} agents not registered within "
                                  f"{args.register_timeout} s", last_error=beats.stats.last_error)
            beats.stop()
            servers.stop()
            return 1
        time.sleep(0.05)
    emit("registered", seconds=round(time.monotonic() - t0, 3), agents=len(agents),
         pulls=sum(a.pulls for a in agents), hellos=beats.stats.sent,
         failed=beats.stats.failed)

    def snapshot() -> dict[str, int]:
        return {"hellos": beats.stats.sent, "failed": beats.stats.failed,
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

    beats.stop()
    servers.stop()
    emit("summary", agents=len(agents), devices_per_agent=args.devices_per_agent,
         seconds=round(time.monotonic() - started, 3), **snapshot())
    return 0 if beats.stats.failed == 0 else 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agents", type=int, default=100, help="Simulated nodes (default 100).")
    parser.add_argument("--devices-per-agent", type=int, default=8,
                        help="Fake devices per node (default 8).")
    parser.add_argument("--attach-handles", type=int, default=1,
                        help="Attach handles per device (default 1, a passthrough device).")
    parser.add_argument("--conductor-url", help="Default: from [conductor] url/host_ip/port.")
    parser.add_argument("--heartbeat-interval", type=float,
                        help="Seconds between hellos (default [agent] heartbeat_interval).")
    parser.add_argument("--threads", type=int, default=8, help="Hello sender threads.")
    parser.add_argument("--hostname-prefix", default="sim")
    parser.add_argument("--register-timeout", type=float, default=600.0)
    parser.add_argument("--steady-seconds", type=float, default=0.0,
                        help="Heartbeats only, no change, for this long (0: skip).")
    parser.add_argument("--churn-seconds", type=float, default=0.0,
                        help="Change devices for this long (0: skip).")
    parser.add_argument("--change-percent", type=float, default=1.0,
                        help="Share of all devices changed per round (default 1%%).")
    parser.add_argument("--change-every", type=float, default=10.0,
                        help="Seconds between change rounds (default 10).")


def main_from_cli(conf: cfg.ConfigOpts, args: argparse.Namespace) -> int:
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    try:
        return run(conf, args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover - use `acceld simulate`
    sys.exit("run `acceld simulate`")
