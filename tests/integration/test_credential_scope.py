"""An internal credential is accepted once, by the one service it was made for.

Real internal servers on loopback (in process): conductors sharing a database (every
backend), agents and a driver process. Each test captures a call exactly as acceld's
own client sent it (headers and body, off the wire) and replays it elsewhere:

- to another conductor on the same database, and to the same conductor after a
  restart: refused (the nonce is in the shared ``internal_nonces`` table);
- a conductor's call to node-a's agent, to node-a's driver process (same node key),
  to node-b's agent, and to the conductor: refused (the MAC covers the destination);
- node-a's hello to the conductor, to node-a's own agent (it also has ``/hello``): refused;
- to node-a's agent after it restarted (it has no database: it refuses credentials
  stamped before it started).
"""

from __future__ import annotations

import contextlib
from typing import Iterator
from urllib.parse import urlsplit

import pytest
import requests

from acceld.agent.driver_process import DriverProcess
from acceld.agent.service import Agent
from acceld.clients.agent import AgentCaller
from acceld.clients.conductor import ConductorClient
from acceld.conductor.service import Conductor
from acceld.internal.server import respond
from acceld.services.secrets import ensure_secret_file, internal_secret
from tests.conftest import make_conf

pytestmark = pytest.mark.integration


class Sent:
    """One request as a client put it on the wire."""

    def __init__(self, method: str, url: str, headers: dict, body: bytes) -> None:
        self.method, self.path, self.headers, self.body = method, urlsplit(url).path, headers, body

    def replay(self, base_url: str) -> int:
        return requests.request(self.method, base_url.rstrip("/") + self.path, data=self.body,
                                headers=self.headers, timeout=10).status_code


def refused(caplog, status: int) -> str:
    """The reason the server logged for the refusal just seen (one per replay)."""
    assert status == 401
    reasons = [r.getMessage() for r in caplog.records
               if r.getMessage().startswith("Refused internal call")]
    assert reasons, "the refusal was not logged"
    caplog.clear()
    return reasons[-1]


@contextlib.contextmanager
def capture(monkeypatch) -> Iterator[list[Sent]]:
    sent: list[Sent] = []
    real = requests.Session.request

    def spy(self, method, url, *args, data=None, headers=None, **kwargs):  # type: ignore[no-untyped-def]
        sent.append(Sent(method, url, dict(headers or {}), data or b""))
        return real(self, method, url, *args, data=data, headers=headers, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(requests.Session, "request", spy)
        yield sent


def only(sent: list[Sent], path: str) -> Sent:
    """The one captured call to ``path`` (the services' own loops may call meanwhile)."""
    (call,) = [s for s in sent if s.path == path]
    return call


class Wake:
    """A conductor component with one controller route, as the binding component's."""

    def routes(self) -> dict:
        return {"/binds/wake": {"POST": lambda req, resp: respond(resp, {"ok": True}, 202)}}

    def periodic_tasks(self) -> list:
        return []

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


@pytest.fixture
def conf(tmp_path):
    ensure_secret_file(str(tmp_path))
    return make_conf(str(tmp_path), conductor__port=0, agent__port=0, driver__port=0,
                     agent__heartbeat_interval=3600, agent__discovery_interval=3600,
                     agent__enabled_drivers=[])


def conductor(conf, db, name: str) -> Conductor:
    node = Conductor(conf, db, [Wake()], instance_id=name)
    node.start()
    return node


def test_a_conductors_credential_is_refused_by_the_others_and_after_a_restart(
        conf, db, monkeypatch, caplog):
    c1, c2 = conductor(conf, db, "c1"), conductor(conf, db, "c2")
    try:
        with capture(monkeypatch) as sent:
            ConductorClient(c1.server.url, internal_secret(conf)).call("POST", "/binds/wake", {})
        call = only(sent, "/binds/wake")
        assert refused(caplog, call.replay(c1.server.url)).endswith("replayed credential")
        # Another conductor on the same database: the shared nonce table, not the key.
        assert refused(caplog, call.replay(c2.server.url)).endswith("replayed credential")
        c1.stop()
        c1 = conductor(conf, db, "c1-restarted")
        # The same service after a restart.
        assert refused(caplog, call.replay(c1.server.url)).endswith("replayed credential")
        # A fresh call still goes through.
        assert ConductorClient(c1.server.url, internal_secret(conf)).call(
            "POST", "/binds/wake", {}) == {"ok": True}
    finally:
        c1.stop()
        c2.stop()


@pytest.fixture
def node_a(conf):
    agent = Agent(conf, hostname="node-a", drivers=[]).start()
    yield agent
    agent.stop()


def test_a_call_for_one_agent_is_refused_by_every_other_service(conf, sqlite_db, node_a,
                                                                  monkeypatch, caplog):
    node_b = Agent(conf, hostname="node-b", drivers=[]).start()
    driver = DriverProcess(conf, "fake", hostname="node-a").start()
    c1 = conductor(conf, sqlite_db, "c1")
    try:
        with capture(monkeypatch) as sent:
            AgentCaller(conf, sqlite_db).post(node_a.server.url, "node-a", "/discovery", {},
                                              timeout=10, timeout_message="timed out")
        call = only(sent, "/discovery")
        # node-a's key, but not its agent: the destination differs.
        assert "wrong credential" in refused(caplog, call.replay(driver.server.url))
        assert "no key here for node 'node-a'" in refused(caplog,
                                                          call.replay(node_b.server.url))
        assert "wrong credential" in refused(caplog, call.replay(c1.server.url))
        assert refused(caplog, call.replay(node_a.server.url)).endswith("replayed credential")
    finally:
        c1.stop()
        driver.stop()
        node_b.stop()


def test_a_hello_for_the_conductor_is_refused_by_the_nodes_agent(conf, sqlite_db, node_a,
                                                                 monkeypatch):
    c1 = conductor(conf, sqlite_db, "c1")
    try:
        node_a.hello.client.base_url = c1.server.url
        with capture(monkeypatch) as sent:
            node_a.hello.once()
        call = only(sent, "/hello")
        assert call.replay(node_a.server.url) == 401
    finally:
        c1.stop()


def test_a_restarted_agent_refuses_what_its_previous_process_accepted(conf, sqlite_db,
                                                                      monkeypatch, caplog):
    first = Agent(conf, hostname="node-a", drivers=[]).start()
    try:
        with capture(monkeypatch) as sent:
            AgentCaller(conf, sqlite_db).post(first.server.url, "node-a", "/discovery", {},
                                              timeout=10, timeout_message="timed out")
        call = only(sent, "/discovery")
    finally:
        first.stop()
    second = Agent(conf, hostname="node-a", drivers=[]).start()
    try:
        assert refused(caplog, call.replay(second.server.url)).endswith(
            "credential made before this service started")
        assert AgentCaller(conf, sqlite_db).post(  # a fresh call goes through
            second.server.url, "node-a", "/discovery", {}, timeout=10,
            timeout_message="timed out") == {"status": "IN-PROGRESS"}
    finally:
        second.stop()
