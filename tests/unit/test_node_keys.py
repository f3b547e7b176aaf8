"""A node speaks only for itself; answers cannot be swapped; secrets are strong and private.

Issue 16, item 4. Real internal servers on loopback (conductor with its agents
component, agents, a forwarding "man in the middle"), SQLite.
"""

from __future__ import annotations

import http.server
import logging
import os
import threading
from typing import Callable, Iterator

import pytest
import requests
from sqlalchemy import select

from acceld.agent.service import Agent
from acceld.clients.internal import InternalClient, InternalError
from acceld.cmd import main as cli
from acceld.conductor.fleet.agents import AgentsComponent
from acceld.conductor.service import Conductor
from acceld.db.models import agents
from acceld.drivers.fake import FakeDriver
from acceld.internal import auth
from acceld.internal.server import (InternalServer, build_app, json_body, respond, serve,
                                    warn_if_exposed)
from acceld.runtime import secrets
from tests.conftest import make_conf
from tests.support.tls import self_signed

CLOUD = b"cloud-secret-for-node-key-tests-0123456789"


def signer(host: str, cloud: bytes = CLOUD) -> auth.Signer:
    return auth.Signer(auth.node_key(cloud, host), host)


# ---- keys -----------------------------------------------------------------------------------

def test_a_node_key_is_bound_to_its_host_and_reveals_nothing_else() -> None:
    a, b = auth.node_key(CLOUD, "node-a"), auth.node_key(CLOUD, "node-b")
    assert a == auth.node_key(CLOUD, "node-a") and len(a) == 64
    assert a != b and CLOUD not in a
    keys = auth.NodeKeys("node-a", a)
    cred = signer("node-a").headers("GET", "/hardware")[0]
    auth.Verifier(keys).check("GET", "/hardware", cred[auth.HEADER], "node-a",
                              cred[auth.DIGEST_HEADER])
    # node-b's key, whatever node it claims, and the cloud's secret are all refused.
    for claimed, key in (("node-b", b), ("node-a", b), (None, CLOUD)):
        cred = auth.Signer(key, claimed).headers("GET", "/hardware")[0]
        with pytest.raises(auth.CredentialError):
            auth.Verifier(keys).check("GET", "/hardware", cred[auth.HEADER], claimed,
                                      cred[auth.DIGEST_HEADER])


# ---- the conductor and its agents ----------------------------------------------------------

@pytest.fixture
def cloud(tmp_path, sqlite_db):
    """A conductor (agents component) and a way to start agents, on the cloud's secret."""
    conf = make_conf(str(tmp_path), conductor__port=0, agent__port=0,
                     agent__heartbeat_interval=3600, conductor__agent_check_interval=3600,
                     internal__shared_secret=CLOUD.decode())
    conf.set_override("connection", str(sqlite_db.url), group="database")
    conductor = Conductor(conf, sqlite_db, [AgentsComponent(conf, sqlite_db)])
    conductor.start()
    conf.set_override("url", conductor.server.url, group="conductor")
    started: list[Agent] = []

    def agent(host: str, agent_conf=None) -> Agent:  # type: ignore[no-untyped-def]
        a = Agent(agent_conf or conf, host, drivers=[FakeDriver(conf, host)])
        started.append(a)
        return a.start()

    yield conf, sqlite_db, agent
    for a in started:
        a.stop()
    conductor.stop()


def endpoints(db) -> dict[str, str]:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return dict(conn.execute(select(agents.c.hostname, agents.c.endpoint)).all())


def _wait(check: Callable[[], bool], timeout: float = 10.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.05)):
        if check():
            return
        done.wait(0.05)
    raise AssertionError("timed out")


def test_a_hello_for_another_host_is_401_and_changes_nothing(cloud, caplog) -> None:
    conf, db, agent = cloud
    b = agent("node-b")
    _wait(lambda: "node-b" in endpoints(db))
    before = endpoints(db)
    as_a = InternalClient(conf.conductor.url[0], signer("node-a"), destination=auth.CONDUCTOR)
    hijack = {"status": "READY", "hostname": "node-b", "endpoint": "127.0.0.1:9",
              "hardware_digest": None}
    with caplog.at_level(logging.WARNING):
        with pytest.raises(InternalError) as refused:
            as_a.call("POST", "/hello", hijack)
    assert refused.value.status == 401
    assert endpoints(db) == before and before["node-b"] == b.endpoint()
    assert any("Refused a hello for host node-b signed with the key of node node-a"
               in r.getMessage() for r in caplog.records)
    # The cloud's secret names no node: it cannot say hello for one either.
    with pytest.raises(InternalError) as refused:
        InternalClient(conf.conductor.url[0], CLOUD, destination=auth.CONDUCTOR).call(
            "POST", "/hello", hijack)
    assert refused.value.status == 401
    assert endpoints(db) == before
    # node-a's key says hello for node-a, its host name taken from the key when omitted
    # (nothing answers at 127.0.0.1:9, so the pull fails: 502, but the hello is recorded).
    with pytest.raises(InternalError) as unreachable:
        as_a.call("POST", "/hello", {"status": "READY", "endpoint": "127.0.0.1:9"})
    assert unreachable.value.status == 502
    assert endpoints(db) == {**before, "node-a": "127.0.0.1:9"}


def test_a_node_key_opens_only_the_routes_meant_for_nodes() -> None:
    def ok(req, resp) -> None:  # type: ignore[no-untyped-def]
        respond(resp, {"ok": True, "node": req.context.identity.node})

    app = build_app(auth.CloudKeys(CLOUD), 60, {"/hello": {"POST": ok},
                                               "/binds/wake": {"POST": ok}},
                    node_paths=["/hello"])
    srv = InternalServer(app, "127.0.0.1", 0).start()
    try:
        node = InternalClient(srv.url, signer("node-a"))
        assert node.call("POST", "/hello", {}) == {"ok": True, "node": "node-a"}
        with pytest.raises(InternalError) as refused:
            node.call("POST", "/binds/wake", {})
        assert refused.value.status == 401
        controller = InternalClient(srv.url, CLOUD)
        assert controller.call("POST", "/binds/wake", {}) == {"ok": True, "node": None}
    finally:
        srv.stop()


def test_an_agent_accepts_only_its_own_key(cloud) -> None:
    conf, db, agent = cloud
    a = agent("node-a")
    to_a = auth.agent_destination("node-a")
    assert len(InternalClient(a.server.url, signer("node-a"), destination=to_a).call(
        "GET", "/hardware")["hardware"]) == 1
    for wrong in (signer("node-b"), auth.Signer(auth.node_key(CLOUD, "node-b"), "node-a"),
                  auth.Signer(CLOUD)):
        with pytest.raises(InternalError) as refused:
            InternalClient(a.server.url, wrong, destination=to_a).call("GET", "/hardware")
        assert refused.value.status == 401


def test_a_node_given_only_its_key_registers(cloud, tmp_path, capsys) -> None:
    """The operator's path: `acceld internal node-key HOST` on a controller, node_key on it."""
    conf, db, agent = cloud
    controller_conf = tmp_path / "controller.conf"
    controller_conf.write_text(f"[internal]\nshared_secret = {CLOUD.decode()}\n"
                               f"[database]\nconnection = {db.url}\n")
    assert cli.main(["internal", "node-key", "node-k", "--config-file",
                     str(controller_conf)]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == auth.node_key(CLOUD, "node-k").decode()
    node_state = tmp_path / "node-state"  # no secret file here, no shared_secret
    node_conf = make_conf(str(node_state), agent__port=0, agent__heartbeat_interval=3600,
                          conductor__url=conf.conductor.url, internal__node_key=printed)
    agent("node-k", node_conf)
    _wait(lambda: "node-k" in endpoints(db))
    assert not os.path.exists(node_state / secrets.SECRET_FILE)


# ---- signed answers --------------------------------------------------------------------------

class _Forwarder(http.server.BaseHTTPRequestHandler):
    """Passes calls to the real server; ``tamper`` rewrites its answer on the way back."""

    target = ""
    tamper: Callable[[int, dict, bytes], tuple[int, dict, bytes]] = staticmethod(
        lambda s, h, b: (s, h, b))

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        real = requests.request(self.command, self.target + self.path, data=body,
                                headers={k: v for k, v in self.headers.items()}, timeout=10)
        status, headers, data = type(self).tamper(
            real.status_code, {k.lower(): v for k, v in real.headers.items()}, real.content)
        self.send_response(status)
        for name in ("content-type", auth.RESPONSE_HEADER.lower()):
            if name in headers:
                self.send_header(name, headers[name])
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _forward

    def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
        pass


@pytest.fixture
def middle() -> Iterator[tuple[type[_Forwarder], str]]:
    def report(req, resp) -> None:  # type: ignore[no-untyped-def]
        respond(resp, {"hardware": [{"n": json_body(req)}], "digest": "d"})

    app = build_app(auth.NodeKeys("node-a", auth.node_key(CLOUD, "node-a")), 60,
                    {"/hardware": {"POST": report}})
    real = InternalServer(app, "127.0.0.1", 0).start()
    handler = type("Forwarder", (_Forwarder,), {"target": real.url})
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{proxy.server_address[1]}"
    proxy.shutdown()
    proxy.server_close()
    real.stop()


def test_answers_pass_untouched(middle) -> None:
    handler, url = middle
    client = InternalClient(url, signer("node-a"))
    assert client.call("POST", "/hardware", 1) == {"hardware": [{"n": 1}], "digest": "d"}


def test_an_unsigned_answer_is_refused(middle) -> None:
    handler, url = middle
    handler.tamper = staticmethod(lambda s, h, b: (s, {k: v for k, v in h.items()
                                                       if k != auth.RESPONSE_HEADER.lower()},
                                                   b))
    with pytest.raises(InternalError) as refused:
        InternalClient(url, signer("node-a")).call("POST", "/hardware", 1)
    assert refused.value.status == 502 and "not signed" in refused.value.message


def test_an_altered_answer_is_refused(middle) -> None:
    handler, url = middle
    handler.tamper = staticmethod(lambda s, h, b: (s, h, b.replace(b'"n":1', b'"n":2')))
    with pytest.raises(InternalError) as refused:
        InternalClient(url, signer("node-a")).call("POST", "/hardware", 1)
    assert refused.value.status == 502 and "does not match" in refused.value.message


def test_an_answer_swapped_from_another_call_is_refused(middle) -> None:
    handler, url = middle
    captured: list[tuple[int, dict, bytes]] = []

    def replay(s: int, h: dict, b: bytes) -> tuple[int, dict, bytes]:
        if not captured:
            captured.append((s, h, b))
        return captured[0]

    handler.tamper = staticmethod(replay)
    client = InternalClient(url, signer("node-a"))
    assert client.call("POST", "/hardware", 1)["hardware"] == [{"n": 1}]
    with pytest.raises(InternalError) as refused:  # the first call's answer, replayed
        client.call("POST", "/hardware", 2)
    assert refused.value.status == 502 and "does not match" in refused.value.message


def test_a_changed_status_is_refused(middle) -> None:
    handler, url = middle
    handler.tamper = staticmethod(lambda s, h, b: (202, h, b))
    with pytest.raises(InternalError) as refused:
        InternalClient(url, signer("node-a")).call("POST", "/hardware", 1)
    assert refused.value.status == 502


# ---- secrets, state, exposure -----------------------------------------------------------------

@pytest.mark.parametrize("option", ["shared_secret", "node_key"])
def test_a_short_secret_is_refused_with_a_clear_message(tmp_path, option) -> None:
    conf = make_conf(str(tmp_path), **{f"internal__{option}": "too-short-a-secret"})
    with pytest.raises(SystemExit, match=rf"\[internal\] {option} is 18 characters long; "
                                         r"at least 32"):
        secrets.internal_secret(conf) if option == "shared_secret" else \
            secrets.own_node_key(conf, "node-a")


def test_a_short_secret_file_is_refused(tmp_path) -> None:
    (tmp_path / secrets.SECRET_FILE).write_text("short\n")
    with pytest.raises(SystemExit, match="at least 32"):
        secrets.internal_secret(make_conf(str(tmp_path)))


def test_the_state_directory_is_created_private(tmp_path) -> None:
    state = tmp_path / "new" / "state"
    old = os.umask(0o022)
    try:
        path = secrets.ensure_secret_file(str(state))
    finally:
        os.umask(old)
    assert os.stat(state).st_mode & 0o777 == 0o700
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_an_open_state_directory_is_reported(tmp_path, caplog) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    with caplog.at_level(logging.WARNING):
        secrets.ensure_secret_file(str(state))
    assert any("open to other users" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("host,warned", [
    ("0.0.0.0", True), ("10.1.2.3", True), ("::", True), ("compute-1.example", True),
    ("127.0.0.1", False), ("127.0.0.5", False), ("::1", False), ("localhost", False),
])
def test_listening_beyond_loopback_without_tls_is_warned(tmp_path, caplog, host,
                                                         warned) -> None:
    with caplog.at_level(logging.WARNING):
        assert warn_if_exposed(make_conf(str(tmp_path)), host, f"http://{host}:1") is warned
        # With TLS there is nothing to warn about.
        tls = make_conf(str(tmp_path), internal__tls_cert_file="/etc/acceld/cert.pem")
        assert warn_if_exposed(tls, host, f"https://{host}:1") is False
    assert any("beyond loopback without TLS" in r.getMessage()
               for r in caplog.records) is warned


def test_serve_on_loopback_does_not_warn(tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        srv = serve(make_conf(str(tmp_path)), CLOUD, {}, "127.0.0.1", 0,
                    destination=auth.CONDUCTOR)
        srv.stop()
    assert not any("beyond loopback" in r.getMessage() for r in caplog.records)


def test_agent_and_conductor_with_node_keys_over_internal_tls(tmp_path, sqlite_db) -> None:
    """TLS on the pool server end to end: hello, pull and signed answers over HTTPS."""
    cert, key = self_signed(tmp_path)
    conf = make_conf(str(tmp_path), conductor__port=0, agent__port=0,
                     agent__heartbeat_interval=3600, conductor__agent_check_interval=3600,
                     internal__shared_secret=CLOUD.decode(), internal__tls_cert_file=str(cert),
                     internal__tls_key_file=str(key), internal__tls_ca_file=str(cert))
    conf.set_override("connection", str(sqlite_db.url), group="database")
    conductor = Conductor(conf, sqlite_db, [AgentsComponent(conf, sqlite_db)])
    conductor.start()
    agent = None
    try:
        assert conductor.server.url.startswith("https://")
        conf.set_override("url", conductor.server.url, group="conductor")
        agent = Agent(conf, "tls-node", drivers=[FakeDriver(conf, "tls-node")]).start()
        _wait(lambda: endpoints(sqlite_db).get("tls-node", "").startswith("https://"))
        client = InternalClient(agent.server.url, signer("tls-node"), verify=str(cert),
                                destination=auth.agent_destination("tls-node"))
        assert len(client.call("GET", "/hardware")["hardware"]) == 1
    finally:
        if agent is not None:
            agent.stop()
        conductor.stop()


def test_a_node_key_file_is_read_and_an_open_one_reported(tmp_path, caplog) -> None:
    key = auth.node_key(CLOUD, "node-f")
    path = tmp_path / "node.key"
    path.write_bytes(key + b"\n")
    os.chmod(path, 0o600)
    conf = make_conf(str(tmp_path / "state"), internal__node_key_file=str(path))
    with caplog.at_level(logging.WARNING):
        assert secrets.own_node_key(conf, "node-f") == auth.NodeKey(key, 0)
    assert not caplog.records
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING):
        assert secrets.own_node_key(conf, "node-f") == auth.NodeKey(key, 0)
    assert any("readable by other users" in r.getMessage() for r in caplog.records)
