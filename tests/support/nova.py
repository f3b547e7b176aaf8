"""A stand-in for Nova's ``POST /os-server-external-events`` that records what it receives.

It listens on 127.0.0.1 on a free port, in a thread of the test process. By
default it answers as Nova does when every event is accepted (200, each event
echoed with ``code: 200``); tests queue other answers with :meth:`answer`
(a status, optionally per-event codes for a 207), or make it accept every connection
and never answer for a while (:meth:`silenced`). It also answers ``GET /servers/{uuid}``
as Nova does for the uuids in :attr:`servers` (200) and any other (404).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: dict
    received_at: float = field(default_factory=time.perf_counter)  # bench: event latency


class RecordingNova:
    def __init__(self, keep_alive: bool = False) -> None:
        # keep_alive: HTTP/1.1 with connections kept open (as Nova's API under uWSGI or
        # Apache keeps them for keystoneauth's session), for timings: with HTTP/1.0 each
        # event paid a TCP connection and a thread started for it here.
        self.keep_alive = keep_alive
        self.requests: list[Recorded] = []
        self._answers: list[tuple[int, dict[str, int] | None]] = []
        self._lock = threading.Lock()
        self._recorded = threading.Condition(self._lock)  # notified for each request
        self._first_seen: dict[str, float] = {}  # event tag -> its first request's arrival
        self._server: ThreadingHTTPServer | None = None
        self._speaking = threading.Event()
        self._speaking.set()
        self.unanswered = 0  # requests taken while silenced, never read nor answered
        # Instances GET /servers/{uuid} finds (Nova's answer for any other uuid is 404).
        self.servers: set[str] = set()
        # Whether acceld's credentials are an administrator's in Nova's eyes (False: only
        # the ``service`` role, as os-server-external-events needs in current Nova).
        self.admin = True
        # Whether they may filter by uuid (os_compute_api:servers:allow_all_filters): without
        # it Nova drops the filters it keeps for administrators and lists every server.
        self.all_filters = True

    # ------------------------------------------------------------------ control
    def start(self) -> "RecordingNova":
        nova = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                if not nova._speaking.is_set():
                    nova._hold(self)
                    return
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"unparseable": raw.decode(errors="replace")}
                status, payload = nova._record(Recorded("POST", self.path, dict(self.headers),
                                                        body))
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                """``GET /servers/{uuid}`` and ``GET /servers?all_tenants=1&uuid=...`` as
                Nova 34 answers them (nova/api/openstack/compute/servers.py): to an
                administrator, any project's server; to anyone else (``admin`` False: the
                uuids in :attr:`servers` are other projects'), a show is 404
                (``project_only`` in nova/db/main/api.py) and ``all_tenants`` is 403
                (``os_compute_api:servers:index:get_all_tenants`` is admin only)."""
                with nova._lock:  # recorded, taking none of the answers queued for events
                    nova.requests.append(Recorded("GET", self.path, dict(self.headers), {}))
                path, _, query = self.path.partition("?")
                params = urllib.parse.parse_qs(query)
                if path.rstrip("/") == "/servers":
                    if not nova.admin and "all_tenants" in params:
                        status, body = 403, {"forbidden": {
                            "code": 403, "message": "Policy doesn't allow os_compute_api:"
                            "servers:index:get_all_tenants to be performed."}}
                    else:
                        wanted = set(params.get("uuid", [])) if nova.admin else set()
                        if nova.admin and not nova.all_filters:
                            wanted = set(nova.servers)  # the uuid filter dropped
                        status, body = 200, {"servers": [
                            {"id": u, "links": [], "name": "shelved"}
                            for u in sorted(nova.servers & wanted)]}
                else:
                    uuid = path.rstrip("/").rsplit("/", 1)[-1]
                    found = path.startswith("/servers/") and uuid in nova.servers \
                        and nova.admin
                    status, body = (200, {"server": {"id": uuid,
                                                     "status": "SHELVED_OFFLOADED"}}) \
                        if found else (404, {"itemNotFound": {"code": 404}})
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
                pass

        if self.keep_alive:
            Handler.protocol_version = "HTTP/1.1"
            # Head and body are written apart: without this, Nagle's algorithm held the
            # body until the client's delayed ACK (40 ms).
            Handler.disable_nagle_algorithm = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True,
                         name="recording-nova").start()
        return self

    def stop(self) -> None:
        self._speaking.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def answer(self, status: int, codes: dict[str, int] | None = None) -> None:
        """Queue the answer to the next request; ``codes`` maps an ARQ uuid (tag) to its
        per-event code (others get 200)."""
        with self._lock:
            self._answers.append((status, codes))

    @contextlib.contextmanager
    def silenced(self) -> Iterator[None]:
        """While inside: every request is accepted and its head read, and nothing more is
        done with it (no body read, nothing recorded, no answer) until the block ends, when
        its connection is closed unanswered: a Nova that hangs. Its caller can only give up
        (Nova never processed it, so a later send is the event's first delivery)."""
        self._speaking.clear()
        try:
            yield
        finally:
            self._speaking.set()

    def _hold(self, handler: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.unanswered += 1
        self._speaking.wait()
        handler.close_connection = True

    # ------------------------------------------------------------------ reading
    def _record(self, recorded: Recorded) -> tuple[int, dict]:
        events = recorded.body.get("events") or []
        with self._lock:
            self.requests.append(recorded)
            status, codes = self._answers.pop(0) if self._answers else (200, None)
            for event in events:
                if isinstance(event, dict) and isinstance(event.get("tag"), str):
                    self._first_seen.setdefault(event["tag"], recorded.received_at)
            self._recorded.notify_all()
        if status >= 400:
            return status, {"error": "scripted failure"}
        return status, {"events": [{**e, "code": (codes or {}).get(e.get("tag"), 200)}
                                   for e in events if isinstance(e, dict)]}

    def events(self) -> list[dict]:
        with self._lock:
            return [e for r in self.requests for e in r.body.get("events") or []]

    def received_at(self, tag: str, timeout: float = 30.0) -> float:
        """``time.perf_counter()`` when the first event tagged ``tag`` (an ARQ uuid) came.
        Sleeps until a request is recorded (no polling: a poll every half millisecond took
        this process's GIL from the thread receiving the event it waited for)."""
        with self._recorded:
            if self._recorded.wait_for(lambda: tag in self._first_seen, timeout):
                return self._first_seen[tag]
        raise AssertionError(f"no event for {tag} within {timeout}s")

    def wait_for_events(self, count: int, timeout: float = 20.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self.events()
            if len(events) >= count:
                return events
            time.sleep(0.05)
        raise AssertionError(f"expected {count} events within {timeout}s, got {self.events()}")
