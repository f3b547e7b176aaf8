"""One node's key is rotated or revoked alone; the other nodes' keys keep working.

Issue 25, item 6. A real conductor (agents component) and real agents on loopback, on
every backend; the conductors' reading of ``node_key_generations`` is driven by a test
clock (acceld.db.node_keys.KeyGenerations), so "within one credential lifetime" is
checked without waiting one.
"""

from __future__ import annotations

import threading
from typing import Callable

import pytest
from sqlalchemy import select

from acceld.agent.service import Agent
from acceld.clients.agent import AgentCallError, AgentCaller
from acceld.clients.internal import InternalClient, InternalError
from acceld.cmd import main as cli
from acceld.conductor.fleet.agents import AgentsComponent
from acceld.conductor.binding.handle_release import HOST_STEPS_PATH, HandleReleaseComponent
from acceld.conductor.service import Conductor
from acceld.db import node_keys
from acceld.db.models import agents
from acceld.drivers.fake import FakeDriver
from acceld.internal import auth
from tests.conftest import make_conf

CLOUD = b"cloud-secret-for-node-key-revocation-0123456789"
TTL = 60


class Clock:
    """The conductor's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _wait(check: Callable[[], bool], timeout: float = 20.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.05)):
        if check():
            return
        done.wait(0.05)
    raise AssertionError("timed out")


def endpoints(db) -> dict[str, str]:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return dict(conn.execute(select(agents.c.hostname, agents.c.endpoint)).all())


@pytest.fixture
def cloud(tmp_path, db):
    """A conductor on ``db`` whose key table reading follows a test clock; agents."""
    conf = make_conf(str(tmp_path), conductor__port=0, agent__port=0,
                     agent__heartbeat_interval=3600, conductor__agent_check_interval=3600,
                     internal__shared_secret=CLOUD.decode(), internal__credential_ttl=TTL)
    conf.set_override("connection", str(db.url), group="database")
    node_keys.forget(db)
    clock = Clock()
    cache = node_keys.generations(db, TTL)
    cache.clock = clock
    conductor = Conductor(conf, db, [AgentsComponent(conf, db),
                                     HandleReleaseComponent(conf, db)])
    conductor.start()
    conf.set_override("url", conductor.server.url, group="conductor")
    controller = tmp_path / "controller.conf"
    controller.write_text(f"[internal]\nshared_secret = {CLOUD.decode()}\n"
                          f"credential_ttl = {TTL}\n[database]\nconnection = {db.url}\n")
    started: list[Agent] = []

    def agent(host: str, agent_conf=None) -> Agent:  # type: ignore[no-untyped-def]
        a = Agent(agent_conf or conf, host, drivers=[FakeDriver(conf, host)])
        started.append(a)
        return a.start()

    yield conf, clock, cache, agent, str(controller)
    for a in started:
        a.stop()
    conductor.stop()
    node_keys.forget(db)


def hello(conf, signer: auth.Signer, endpoint: str):  # type: ignore[no-untyped-def]
    """A hello without a digest (the conductor pulls the node's hardware: a call to it)."""
    client = InternalClient(conf.conductor.url[0], signer, destination=auth.CONDUCTOR)
    try:
        return client.call("POST", "/hello", {"status": "READY", "endpoint": endpoint,
                                              "hardware_digest": None})
    finally:
        client.close()


def pulls(conf, signer: auth.Signer, endpoint: str) -> bool:  # type: ignore[no-untyped-def]
    """A hello that made the conductor pull the node's hardware (with ``signer``'s key).
    The agent's own hello may hold the host's one pull when this one comes (answered
    ``"pulled": false``): asked again until a pull of its own ran, for at most 5 s."""
    for _ in range(100):
        if hello(conf, signer, endpoint)["pulled"]:
            return True
        threading.Event().wait(0.05)
    return False


def host_steps(conf, signer: auth.Signer):  # type: ignore[no-untyped-def]
    """The other conductor route a node's key opens: its report of host steps."""
    client = InternalClient(conf.conductor.url[0], signer, destination=auth.CONDUCTOR)
    try:
        return client.call("POST", HOST_STEPS_PATH, {"host_steps": []})
    finally:
        client.close()


def old_signer(host: str) -> auth.Signer:
    return auth.Signer(auth.node_key(CLOUD, host), host)


def test_rotating_one_node_refuses_its_old_key_within_one_ttl(cloud, db, capsys,
                                                              tmp_path) -> None:
    conf, clock, cache, agent, controller = cloud
    a, b = agent("node-a"), agent("node-b")
    _wait(lambda: {"node-a", "node-b"} <= set(endpoints(db)))
    # Generation 0 is sent as no key id, as before generations: accepted.
    assert old_signer("node-a").headers("POST", "/hello")[0][auth.HEADER].count(".") == 2
    assert pulls(conf, old_signer("node-a"), a.endpoint())
    reads = cache.reads

    assert cli.main(["node-key", "rotate", "node-a", "--config-file", controller]) == 0
    out = capsys.readouterr().out
    new_key = out.strip().splitlines()[-1]
    assert new_key == "g1:" + auth.node_key(CLOUD, "node-a", 1).decode()
    assert "rotated to generation 1" in out and f"refuses generation 0 within {TTL} s" in out
    assert "set [internal] node_key to the key below" in out

    # Within the ttl the conductor's reading may be older than the rotation (no query
    # per call); one ttl later it is not, and node-a's old key is refused, node-b's not.
    hello(conf, old_signer("node-a"), a.endpoint())
    assert cache.reads == reads
    clock.now += TTL
    with pytest.raises(InternalError) as refused:
        hello(conf, old_signer("node-a"), a.endpoint())
    assert refused.value.status == 401
    assert ("Generation 0 of node node-a's key is revoked; its key is now generation 1"
            in refused.value.message)
    assert pulls(conf, old_signer("node-b"), b.endpoint())

    # The new generation is accepted, and the conductor signs its pull with it: the agent
    # still at generation 0 refuses it (502) until it is given the printed key.
    new = auth.Signer(auth.node_key(CLOUD, "node-a", 1), "node-a", 1)
    with pytest.raises(InternalError) as unpulled:
        hello(conf, new, a.endpoint())
    assert unpulled.value.status == 502 and "401" in unpulled.value.message  # the agent's
    a.stop()
    node_conf = make_conf(str(tmp_path / "node-a-state"), agent__port=0,
                          agent__heartbeat_interval=3600, conductor__url=conf.conductor.url,
                          internal__node_key=new_key)
    a2 = agent("node-a", node_conf)
    _wait(lambda: endpoints(db).get("node-a") == a2.endpoint())
    assert pulls(conf, new, a2.endpoint())
    assert pulls(conf, old_signer("node-b"), b.endpoint())


def test_a_new_generation_is_accepted_before_the_reading_is_due(cloud, db, capsys) -> None:
    """A node re-keyed at once is not refused for the conductor's older reading."""
    conf, clock, cache, agent, controller = cloud
    a = agent("node-a")
    _wait(lambda: "node-a" in endpoints(db))
    assert pulls(conf, old_signer("node-a"), a.endpoint())
    assert cli.main(["node-key", "rotate", "node-a", "--config-file", controller]) == 0
    capsys.readouterr()
    new = auth.Signer(auth.node_key(CLOUD, "node-a", 1), "node-a", 1)
    with pytest.raises(InternalError) as unpulled:  # accepted; the gen-0 agent refuses the pull
        hello(conf, new, a.endpoint())
    assert unpulled.value.status == 502
    with pytest.raises(InternalError) as refused:  # read anew just now: no clock move needed
        hello(conf, old_signer("node-a"), a.endpoint())
    assert refused.value.status == 401


def test_revoking_one_node_refuses_all_its_keys_and_stops_calls_to_it(cloud, db,
                                                                      capsys) -> None:
    conf, clock, cache, agent, controller = cloud
    a, b = agent("node-a"), agent("node-b")
    _wait(lambda: {"node-a", "node-b"} <= set(endpoints(db)))
    assert cli.main(["node-key", "revoke", "node-b", "--config-file", controller]) == 0
    out = capsys.readouterr().out
    assert "Node key of host node-b revoked (generation 0 and every earlier one)" in out
    assert f"within {TTL} s" in out and "acceld node-key rotate node-b" in out
    clock.now += TTL
    with pytest.raises(InternalError) as refused:
        hello(conf, old_signer("node-b"), b.endpoint())
    assert refused.value.status == 401 and "The key of node node-b is revoked" \
        in refused.value.message
    with pytest.raises(InternalError) as refused:
        host_steps(conf, old_signer("node-b"))
    assert refused.value.status == 401 and "revoked" in refused.value.message
    assert pulls(conf, old_signer("node-a"), a.endpoint())
    host_steps(conf, old_signer("node-a"))
    # No conductor call to a revoked node: the caller is told why, nothing is sent.
    caller = AgentCaller(conf, db, CLOUD)
    with pytest.raises(AgentCallError) as uncalled:
        caller.post(b.server.url, "node-b", "/program", {}, timeout=5, timeout_message="")
    assert uncalled.value.status == 503 and "revoked" in uncalled.value.message
    # `internal node-key` will not print a revoked key; a rotation re-keys the node.
    assert cli.main(["internal", "node-key", "node-b", "--config-file", controller]) == 1
    assert "is revoked" in capsys.readouterr().err
    assert cli.main(["node-key", "rotate", "node-b", "--config-file", controller]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert cli.main(["internal", "node-key", "node-b", "--config-file", controller]) == 0
    assert capsys.readouterr().out.strip() == printed
    key = auth.parse_node_key(printed)
    assert key == auth.NodeKey(auth.node_key(CLOUD, "node-b", 1), 1)
    with pytest.raises(InternalError) as unpulled:  # accepted; node-b's agent is at gen 0
        hello(conf, auth.Signer(key.key, "node-b", 1), b.endpoint())
    assert unpulled.value.status == 502


def test_the_command_refuses_an_unknown_host_and_a_bad_name(cloud, db, capsys) -> None:
    conf, clock, cache, agent, controller = cloud
    for action in ("rotate", "revoke"):
        assert cli.main(["node-key", action, "ghost", "--config-file", controller]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert (f"acceld node-key {action}: No host ghost is known: no agent has registered "
                "for it" in captured.err)
        assert cli.main(["node-key", action, "bad/name", "--config-file", controller]) == 2
        assert "not a host name: 'bad/name'" in capsys.readouterr().err
    with db.read() as conn:
        assert node_keys.read_all(conn) == {}


def test_a_retired_host_keeps_its_revocation(cloud, db, capsys) -> None:
    """The row outlives the agent's: a revoked host that is deleted stays revoked, and
    the command still knows it."""
    conf, clock, cache, agent, controller = cloud
    a = agent("node-a")
    _wait(lambda: "node-a" in endpoints(db))
    a.stop()
    assert cli.main(["node-key", "revoke", "node-a", "--config-file", controller]) == 0
    with db.write() as conn:
        conn.execute(agents.delete())
    assert cli.main(["node-key", "rotate", "node-a", "--config-file", controller]) == 0
    assert cli.main(["node-key", "rotate", "node-a", "--config-file", controller]) == 0
    capsys.readouterr()
    with db.read() as conn:
        assert node_keys.read(conn, "node-a") == auth.KeyState(2, False)
