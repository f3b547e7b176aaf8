"""A compromised node's key harms only that node: the conductor's pulls of GET /hardware.

A node's key lets its holder register an endpoint and have the conductor pull it inside
the hello. Real conductor and agent internal servers on loopback (SQLite), hostile
endpoints on real sockets (tests/support/hostile_peer.py): a trickling answer ends at
the pull's deadline and holds no other host's hello; hellos of the same host while its
pull runs, and hellos beyond the pull slots, are answered without a pull; a huge answer
is cut at the cap by the bytes read; no redirect is followed; the 502 never carries what
the peer said; an endpoint must be where its hello came from (acceld.conductor.fleet.endpoints).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import pytest
from sqlalchemy import func, select

from acceld.agent.service import Agent
from acceld.clients.internal import READ_CHUNK, InternalClient, InternalError
from acceld.conductor.fleet import endpoints
from acceld.conductor.fleet.agents import AgentsComponent, host_is_up
from acceld.conductor.service import Conductor
from acceld.db.models import agents, devices
from acceld.drivers.fake import FakeDriver
from acceld.internal import auth
from acceld.runtime.secrets import ensure_secret_file, internal_secret
from tests.conftest import make_conf
from tests.support.hostile_peer import HostilePeer

PULL_TIMEOUT = 4.0
CAP = 1024 * 1024


@pytest.fixture
def setup(tmp_path, sqlite_db):
    ensure_secret_file(str(tmp_path))
    conf = make_conf(str(tmp_path), conductor__port=0, agent__port=0,
                     agent__heartbeat_interval=1, conductor__agent_down_intervals=3,
                     conductor__agent_check_interval=3600,
                     conductor__heartbeat_flush_interval=3600,
                     conductor__hardware_pull_timeout=PULL_TIMEOUT,
                     conductor__max_hardware_report=CAP,
                     conductor__hardware_pulls=2, internal__server_threads=4)
    conf.set_override("connection", str(sqlite_db.url), group="database")
    component = AgentsComponent(conf, sqlite_db)
    conductor = Conductor(conf, sqlite_db, [component])
    conductor.start()
    conf.set_override("url", conductor.server.url, group="conductor")
    started: list[Any] = []

    def agent(host: str) -> Agent:
        a = Agent(conf, host, drivers=[FakeDriver(conf, host)])
        started.append(a)
        return a.start()

    def peer(*args: Any, **kwargs: Any) -> HostilePeer:
        p = HostilePeer(*args, **kwargs)
        started.append(p)
        return p.start()

    yield conf, sqlite_db, component, agent, peer
    for thing in started:
        thing.stop()
    conductor.stop()


def as_node(conf, host: str) -> InternalClient:
    return InternalClient(conf.conductor.url[0],
                          auth.Signer(auth.node_key(internal_secret(conf), host), host),
                          destination=auth.CONDUCTOR)


def hello(conf, host: str, endpoint: str, timeout: float = 30.0) -> Any:
    """One hello of ``host`` naming ``endpoint`` and a digest the conductor lacks (it
    pulls); the answer, or the InternalError."""
    client = as_node(conf, host)
    try:
        return client.call("POST", "/hello", {"status": "READY", "endpoint": endpoint,
                                              "hardware_digest": "x" * 64}, timeout=timeout)
    except InternalError as exc:
        return exc
    finally:
        client.close()


def in_threads(calls: list) -> tuple[list[threading.Thread], list[Any]]:
    results: list[Any] = []

    def run(call):
        results.append(call())

    threads = [threading.Thread(target=run, args=(call,), daemon=True) for call in calls]
    for thread in threads:
        thread.start()
    return threads, results


def wait_for(check, timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def registered(db, host: str) -> bool:
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(devices).where(
            devices.c.hostname == host)).scalar_one() > 0


def good_hello_answered(conf, good: Agent) -> None:
    """A hello of the honest agent, answered within a second or two (a thread was free)."""
    client = as_node(conf, good.hostname)
    try:
        answer = client.call("POST", "/hello", good.hello_body(), timeout=3)
    finally:
        client.close()
    assert answer["status"] == "OK"


def all_up(component, db, hosts: list[str]) -> None:
    component.liveness.flush()
    component.sweep()
    with db.read() as conn:
        assert all(host_is_up(conn, host) for host in hosts)


def test_hellos_of_a_host_whose_pull_trickles_hold_no_thread(setup):
    """Six hellos of one node at once against four server threads: one pulls (ended by its
    deadline), the others are answered at once; an honest agent heartbeats meanwhile."""
    conf, db, component, agent, peer = setup
    good = agent("good")
    wait_for(lambda: registered(db, "good"))
    trickle = peer("trickle")
    started = time.monotonic()
    threads, results = in_threads([lambda: hello(conf, "evil", trickle.endpoint)] * 6)
    assert trickle.requested.wait(10)
    beats = good.hello.beats
    good_hello_answered(conf, good)
    wait_for(lambda: good.hello.beats > beats)  # its own loop too
    assert not trickle.closed.is_set()  # ... while the trickled pull still ran
    wait_for(lambda: len(results) == 5)  # the other five hellos did not wait for it
    assert all(isinstance(r, dict) and r["pulled"] is False for r in results), results
    for thread in threads:
        thread.join(PULL_TIMEOUT + 10)
    assert time.monotonic() - started < PULL_TIMEOUT + 5
    failed = [r for r in results if isinstance(r, InternalError)]
    assert [f.status for f in failed] == [502]
    assert "could not be read" in failed[0].message and "timed out" in failed[0].message
    assert trickle.requests == 1  # one pull of the host at a time
    all_up(component, db, ["good", "evil"])


def test_slow_nodes_take_at_most_the_pull_slots(setup):
    """Four trickling nodes, two pull slots, four server threads: two pull, two are
    answered without a pull, and the honest agent's hellos still get a thread."""
    conf, db, component, agent, peer = setup
    good = agent("good")
    wait_for(lambda: registered(db, "good"))
    trickles = [peer("trickle") for _ in range(4)]
    threads, results = in_threads([lambda t=t, i=i: hello(conf, f"evil{i}", t.endpoint)
                                   for i, t in enumerate(trickles)])
    wait_for(lambda: sum(t.requested.is_set() for t in trickles) == 2 and len(results) == 2)
    assert all(isinstance(r, dict) and r["pulled"] is False for r in results), results
    good_hello_answered(conf, good)
    assert not any(t.closed.is_set() for t in trickles)
    for thread in threads:
        thread.join(PULL_TIMEOUT + 10)
    assert sum(t.requests for t in trickles) == 2
    all_up(component, db, ["good"] + [f"evil{i}" for i in range(4)])


@pytest.mark.parametrize("declare", [False, True], ids=["streamed", "content-length"])
def test_a_huge_answer_is_cut_at_the_cap(setup, caplog, declare):
    conf, db, component, agent, peer = setup
    good = agent("good")
    wait_for(lambda: registered(db, "good"))
    huge = peer("huge", size=128 * 1024 * 1024, declare=declare)
    with caplog.at_level(logging.WARNING, logger="acceld.conductor.fleet.pulls"):
        threads, results = in_threads([lambda: hello(conf, "evil", huge.endpoint)])
        good_hello_answered(conf, good)
        threads[0].join(PULL_TIMEOUT + 10)
    (failed,) = results
    assert isinstance(failed, InternalError) and failed.status == 502
    assert f"answer over {CAP} bytes" in failed.message
    # The conductor read at most one chunk past the cap (nothing of a declared length)...
    (line,) = [r.getMessage() for r in caplog.records if "Cannot pull" in r.getMessage()]
    read = int(re.search(r"\((\d+) bytes of body read\)", line).group(1))
    assert read <= (0 if declare else CAP + READ_CHUNK)
    # ... and the peer could hand the kernel little more than that (socket buffers).
    wait_for(huge.closed.is_set)
    assert huge.sent < 32 * 1024 * 1024
    all_up(component, db, ["good"])


def test_a_redirect_is_not_followed(setup):
    conf, db, component, agent, peer = setup
    target = peer("raw", payload=b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    redirect = peer("raw", payload=(b"HTTP/1.1 302 Found\r\nLocation: http://"
                                    + target.endpoint.encode()
                                    + b"/hardware\r\nContent-Length: 0\r\n\r\n"))
    failed = hello(conf, "evil", redirect.endpoint)
    assert isinstance(failed, InternalError) and failed.status == 502
    assert "status 302" in failed.message
    assert redirect.requests == 1 and target.requests == 0


@pytest.mark.parametrize("payload, reason", [
    (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 41\r\n\r\n"
     b'{"error": "PostgreSQL 16.1 SECRETMARKER"}', "status 500"),
    (b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n\r\n"
     b'{"error": {"message": "SECRETMARKER Keystone: the request you have made requires '
     b'authentication"}}', "status 401"),
    (b"J\x00\x00\x005.5.5-10.11.6-MariaDB SECRETMARKER\x00\x01\x02\n", "not an HTTP answer"),
], ids=["500", "keystone-401", "mariadb-banner"])
def test_the_502_says_nothing_the_peer_said(setup, caplog, payload, reason):
    conf, db, component, agent, peer = setup
    raw = peer("raw", payload=payload)
    with caplog.at_level(logging.WARNING, logger="acceld.conductor.fleet.pulls"):
        failed = hello(conf, "evil", raw.endpoint)
    assert isinstance(failed, InternalError) and failed.status == 502
    assert reason in failed.message
    for word in ("SECRETMARKER", "PostgreSQL", "MariaDB", "Keystone", "5.5.5"):
        assert word not in failed.message
    # The detail went to the conductor's log, once, escaped.
    (line,) = [r.getMessage() for r in caplog.records if "Cannot pull" in r.getMessage()]
    assert "SECRETMARKER" in line and "\n" not in line


def test_repeated_failures_are_logged_once(setup, caplog):
    conf, db, component, agent, peer = setup
    raw = peer("raw", payload=b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n")
    with caplog.at_level(logging.WARNING, logger="acceld.conductor.fleet.pulls"):
        for _ in range(3):
            assert hello(conf, "evil", raw.endpoint).status == 502
    assert len([r for r in caplog.records if "Cannot pull" in r.getMessage()]) == 1


@pytest.mark.parametrize("endpoint", ["192.0.2.10:6668", "db.example.com:3306",
                                      "https://keystone.example.com:5000", "0.0.0.0:6668"])
def test_an_endpoint_not_where_the_hello_came_from_is_refused(setup, endpoint):
    conf, db, component, agent, peer = setup
    refused = hello(conf, "evil", endpoint, timeout=10)
    assert isinstance(refused, InternalError) and refused.status == 400
    assert "endpoint" in refused.message
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(agents)).scalar_one() == 0


@pytest.mark.parametrize("endpoint, source, networks, allowed", [
    ("10.0.0.5:6668", "10.0.0.5", [], True),
    ("https://10.0.0.5:6668", "::ffff:10.0.0.5", [], True),
    ("[2001:db8::5]:6668", "2001:db8::5", [], True),
    ("10.0.0.6:6668", "10.0.0.5", [], False),  # another host's address
    ("10.0.0.6:6668", "10.0.0.5", ["10.0.0.0/24"], True),  # behind a NAT or balancer
    ("10.0.1.6:6668", "10.0.0.5", ["10.0.0.0/24"], False),
    ("127.0.0.1:3306", "10.0.0.5", [], False),  # the controller's loopback
    ("127.0.0.1:3306", "10.0.0.5", ["0.0.0.0/0"], False),
    ("localhost:5432", "10.0.0.5", [], False),
    ("[::1]:5000", "10.0.0.5", [], False),
    ("127.0.0.1:6668", "127.0.0.1", [], True),  # an agent on the conductor's host
    ("localhost:6668", "::1", [], True),
    ("compute-1.example.com:6668", "10.0.0.5", ["0.0.0.0/0"], False),
    ("224.0.0.1:6668", "10.0.0.5", ["0.0.0.0/0"], False),
])
def test_endpoint_rule(endpoint, source, networks, allowed):
    why = endpoints.refusal(endpoint, source, endpoints.networks(networks))
    assert (why is None) is allowed, why


def test_pulls_over_internal_tls(tmp_path, sqlite_db):
    """The bounded pull speaks TLS to an agent serving HTTPS, verifying its certificate."""
    from tests.support.tls import self_signed

    ensure_secret_file(str(tmp_path))
    cert, key = self_signed(tmp_path)
    conf = make_conf(str(tmp_path), conductor__port=0, agent__port=0,
                     agent__heartbeat_interval=3600, conductor__agent_check_interval=3600,
                     conductor__heartbeat_flush_interval=3600,
                     internal__tls_cert_file=str(cert), internal__tls_key_file=str(key),
                     internal__tls_ca_file=str(cert))
    conf.set_override("connection", str(sqlite_db.url), group="database")
    conductor = Conductor(conf, sqlite_db, [AgentsComponent(conf, sqlite_db)])
    conductor.start()
    conf.set_override("url", conductor.server.url, group="conductor")
    node = Agent(conf, "node1", drivers=[FakeDriver(conf, "node1")]).start()
    try:
        assert node.endpoint().startswith("https://127.0.0.1:")
        wait_for(lambda: registered(sqlite_db, "node1"))
    finally:
        node.stop()
        conductor.stop()


def test_a_row_recorded_before_the_rule_does_not_keep_its_endpoint(setup):
    """An unchanged hello repeating a row with an endpoint elsewhere (recorded by an older
    release) is refused too, not answered from the row."""
    conf, db, component, agent, peer = setup
    with db.write() as conn:
        conn.execute(agents.insert().values(
            hostname="evil", endpoint="192.0.2.10:6668", state="up", heartbeat_interval=10,
            last_seen_at=func.now(), hardware_digest="x" * 64, last_discovery=None))
    client = as_node(conf, "evil")
    try:
        with pytest.raises(InternalError) as refused:
            client.call("POST", "/hello", {"status": "READY", "endpoint": "192.0.2.10:6668",
                                           "heartbeat_interval": 10,
                                           "hardware_digest": "x" * 64})
    finally:
        client.close()
    assert refused.value.status == 400 and "came from" in refused.value.message


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("status", [b"302 Found", b"307 Temporary Redirect"])
def test_internal_calls_follow_no_redirect(tmp_path, method, status):
    """The conductor's other calls to a node's endpoint (prepare, release, program) go
    through InternalClient: a redirect there is refused as an unsigned answer."""
    target = HostilePeer("raw", payload=b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    redirect = HostilePeer("raw", payload=(b"HTTP/1.1 " + status + b"\r\nLocation: http://"
                                           + target.endpoint.encode()
                                           + b"/attach-handles/prepare\r\n"
                                           b"Content-Length: 0\r\n\r\n"))
    target.start(), redirect.start()
    client = InternalClient(redirect.endpoint, auth.Signer(b"k" * 32, "evil"),
                            destination=auth.agent_destination("evil"))
    try:
        with pytest.raises(InternalError) as refused:
            client.call(method, "/attach-handles/prepare", {} if method == "POST" else None)
        assert refused.value.status == 502
        assert redirect.requests == 1 and target.requests == 0
    finally:
        client.close()
        target.stop(), redirect.stop()
