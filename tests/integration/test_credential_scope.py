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
from acceld.runtime.secrets import ensure_secret_file, internal_secret
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


class NonceWrites:
    """Statements a database ran that write the shared nonce table (event hook)."""

    def __init__(self, db) -> None:  # type: ignore[no-untyped-def]
        self.db, self.count = db, 0

    def _seen(self, conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        if "internal_nonces" in statement and statement.lstrip().upper().startswith("INSERT"):
            self.count += 1

    def __enter__(self) -> "NonceWrites":
        from sqlalchemy import event
        event.listen(self.db.engine, "before_cursor_execute", self._seen)
        return self

    def __exit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
        from sqlalchemy import event
        event.remove(self.db.engine, "before_cursor_execute", self._seen)


def hello_conductor(conf, db, name: str) -> Conductor:
    from acceld.conductor.fleet.agents import AgentsComponent

    node = Conductor(conf, db, [AgentsComponent(conf, db)], instance_id=name)
    node.start()
    return node


def test_a_heartbeat_made_for_one_conductor_process_needs_no_nonce_write_and_is_refused_elsewhere(
        conf, db, node_a, monkeypatch, caplog):
    """An agent's heartbeat, signed for the conductor process that answered it before,
    is remembered in that process's memory alone (no INSERT into internal_nonces) and
    refused on replay there (memory), at another conductor and after a restart (its name
    is not theirs). What is signed for the shared name still goes through the table."""
    from acceld.clients.conductor import FailoverClient

    c1, c2 = hello_conductor(conf, db, "c1"), hello_conductor(conf, db, "c2")
    client = FailoverClient([c1.server.url], node_a.signer, timeout=30)
    try:
        with capture(monkeypatch) as sent:
            client.call("POST", "/hello", node_a.hello_body())  # registers: shared name
            with NonceWrites(db) as writes:
                answer = client.call("POST", "/hello", node_a.hello_body())
                assert answer["pulled"] is False  # an unchanged heartbeat
                assert writes.count == 0  # its nonce is in c1's memory only
                first, beat = [s for s in sent if s.path == "/hello"]
                # Replayed to the same conductor: refused from memory, still no write.
                assert refused(caplog, beat.replay(c1.server.url)).endswith(
                    "replayed credential")
                assert writes.count == 0
                # To another conductor on the database: not its name.
                assert "wrong credential" in refused(caplog, beat.replay(c2.server.url))
        # The first hello was signed for the shared name: refused via the table, anywhere.
        assert refused(caplog, first.replay(c1.server.url)).endswith("replayed credential")
        assert refused(caplog, first.replay(c2.server.url)).endswith("replayed credential")
        # The same conductor restarted on the same port: another process, another name.
        port = c1.server.port
        c1.stop()
        conf.set_override("port", port, group="conductor")
        c1 = hello_conductor(conf, db, "c1-restarted")
        assert "wrong credential" in refused(caplog, beat.replay(c1.server.url))
        # The agent's client: its learned name is refused (nothing ran), the call is sent
        # again for the shared name and answered.
        with capture(monkeypatch) as sent:
            assert client.call("POST", "/hello", node_a.hello_body())["status"] == "OK"
        assert [call.replay(c1.server.url) for call in sent] == [401, 401]  # both used
        caplog.clear()
    finally:
        client.close()
        c1.stop()
        c2.stop()


def test_behind_a_load_balancer_a_client_keeps_to_the_shared_name(conf, sqlite_db, node_a,
                                                                   monkeypatch, caplog):
    """One URL whose calls reach one conductor, then another (a load balancer): the call
    refused for the first one's name is sent again for the shared name, and the URL keeps
    to the shared name (no refusal per call); its nonces go through the shared table."""
    from acceld.clients.conductor import FailoverClient

    c1, c2 = hello_conductor(conf, sqlite_db, "c1"), hello_conductor(conf, sqlite_db, "c2")
    client = FailoverClient([c1.server.url], node_a.signer, timeout=30)
    try:
        client.call("POST", "/hello", node_a.hello_body())
        client.call("POST", "/hello", node_a.hello_body())  # for c1's own name
        client.base_url = c2.server.url  # the balancer picks c2 now
        with capture(monkeypatch) as sent, NonceWrites(sqlite_db) as writes:
            for _ in range(3):
                assert client.call("POST", "/hello", node_a.hello_body())["status"] == "OK"
            assert len(sent) == 4  # one refusal, then the shared name only
            assert writes.count == 3
        client.base_url = c1.server.url  # and back to c1: the shared name still
        with capture(monkeypatch) as sent:
            client.call("POST", "/hello", node_a.hello_body())
        assert refused(caplog, sent[0].replay(c2.server.url)).endswith("replayed credential")
    finally:
        client.close()
        c1.stop()
        c2.stop()
