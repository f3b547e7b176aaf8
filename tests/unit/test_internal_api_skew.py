"""A conductor and an agent of this release serve agents and driver processes of the
previous one (internal API 1.0, docs/upgrades.md): the hellos and reports acceld sent at
1.0 (recorded from commit f96c44c by tests/fixtures/internal_api_1.0/record.py) are
taken and answered exactly in 1.0's format; hellos of this release negotiate the
version; a hello refused by a server of the previous release goes again without the
version field."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import falcon
import pytest
from sqlalchemy import func, select

from acceld.agent.hardware import HelloLoop
from acceld.agent.service import Agent
from acceld.clients.internal import InternalClient, InternalError
from acceld.conductor.fleet import agents as conductor_agents
from acceld.conductor.fleet.agents import AgentsComponent
from acceld.conductor.service import Conductor
from acceld.db.models import devices
from acceld.internal import auth, versions
from acceld.internal.server import respond, serve
from acceld.jsonschemas import strict_validator
from acceld.runtime.secrets import ensure_secret_file, internal_secret
from tests.conftest import make_conf

RECORDED = Path(__file__).parents[1] / "fixtures" / "internal_api_1.0"


def recorded(name: str) -> Any:
    return json.loads((RECORDED / name).read_text())


@pytest.fixture
def cloud(tmp_path, sqlite_db):  # type: ignore[no-untyped-def]
    ensure_secret_file(str(tmp_path))
    conf = make_conf(str(tmp_path), conductor__port=0, agent__port=0,
                     agent__heartbeat_interval=3600, conductor__agent_check_interval=3600,
                     conductor__heartbeat_flush_interval=3600)
    conf.set_override("connection", str(sqlite_db.url), group="database")
    conductor = Conductor(conf, sqlite_db, [AgentsComponent(conf, sqlite_db)])
    conductor.start()
    conf.set_override("url", [conductor.server.url], group="conductor")
    servers: list = []
    yield conf, sqlite_db, conductor, servers
    for server in servers:
        server.stop()
    conductor.stop()


def node_client(conf, url: str, destination: str = auth.CONDUCTOR) -> InternalClient:
    return InternalClient(url, auth.Signer(auth.node_key(internal_secret(conf), "node1"),
                                           "node1"), destination=destination)


def old_agent(conf, servers: list) -> str:
    """An agent of 1.0 as the conductor meets it: its recorded GET /hardware answer, at
    the agent's address, signed with node1's key; returns its endpoint."""
    keys = Agent(conf, "node1", drivers=[]).keys
    hardware = recorded("agent_hardware.json")

    def on_hardware(req: falcon.Request, resp: falcon.Response) -> None:
        respond(resp, hardware)

    server = serve(conf, keys, {"/hardware": {"GET": on_hardware}}, "127.0.0.1", 0,
                   destination=auth.agent_destination("node1"))
    servers.append(server)
    return f"127.0.0.1:{server.port}"


def test_the_conductor_takes_a_1_0_hello_and_answers_in_1_0(cloud) -> None:
    conf, db, conductor, servers = cloud
    hello = {**recorded("agent_hello.json"), "endpoint": old_agent(conf, servers)}
    node = node_client(conf, conductor.server.url)
    assert node.call("POST", "/hello", hello) == recorded("conductor_hello_answer.json")
    assert node.call("POST", "/hello", hello) == recorded(
        "conductor_hello_answer_unchanged.json")
    with db.read() as conn:  # the 1.0 report was applied
        assert conn.execute(select(func.count()).select_from(devices)).scalar_one() == 1


@pytest.mark.parametrize("offered, agreed", [("1.1", "1.1"), ("1.0", "1.0"),
                                             ("1.9", "1.1")])
def test_the_conductor_negotiates_the_version(cloud, offered: str, agreed: str) -> None:
    conf, db, conductor, servers = cloud
    hello = {**recorded("agent_hello.json"), "endpoint": old_agent(conf, servers),
             "api_version": offered}
    answer = node_client(conf, conductor.server.url).call("POST", "/hello", hello)
    assert answer == {**recorded("conductor_hello_answer.json"), "api_version": agreed}


@pytest.mark.parametrize("offered", ["2.0", "0.9", "1", "1.1.0"])
def test_a_version_not_served_is_400_and_records_nothing(cloud, offered: str) -> None:
    conf, db, conductor, servers = cloud
    hello = {**recorded("agent_hello.json"), "endpoint": old_agent(conf, servers),
             "api_version": offered}
    with pytest.raises(InternalError) as refused:
        node_client(conf, conductor.server.url).call("POST", "/hello", hello)
    assert refused.value.status == 400
    assert "api_version" in refused.value.message or "serves 1.0 to 1.1" in \
        refused.value.message
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(devices)).scalar_one() == 0


def test_an_agent_takes_a_1_0_driver_hello_and_answers_in_1_0(cloud) -> None:
    conf, db, conductor, servers = cloud
    agent = Agent(conf, "node1", drivers=[])
    agent.server = serve(conf, agent.keys, agent.routes(), "127.0.0.1", 0,
                         destination=auth.agent_destination("node1"))
    servers.append(agent.server)
    hardware = recorded("agent_hardware.json")  # one fake device, as the driver reports

    def on_hardware(req: falcon.Request, resp: falcon.Response) -> None:
        respond(resp, hardware)

    driver = serve(conf, agent.keys, {"/hardware": {"GET": on_hardware}}, "127.0.0.1", 0,
                   destination=lambda port: auth.driver_destination(f"127.0.0.1:{port}"))
    servers.append(driver)
    hello = {**recorded("driver_hello.json"), "endpoint": f"127.0.0.1:{driver.port}"}
    to_agent = node_client(conf, agent.server.url, auth.agent_destination("node1"))
    assert to_agent.call("POST", "/hello", hello) == recorded(
        "agent_driver_hello_answer.json")
    assert agent.hardware()[1] == hardware["digest"]
    assert to_agent.call("POST", "/hello", {**hello, "api_version": "1.1"}) == {
        **recorded("agent_driver_hello_answer.json"), "api_version": "1.1"}


def _schema_of_1_0() -> dict:
    """The conductor's hello schema as 1.0 had it: no version field."""
    schema = copy.deepcopy(conductor_agents.HELLO_SCHEMA.schema)
    del schema["properties"]["api_version"]
    return schema


def test_a_hello_refused_by_a_1_0_conductor_goes_again_without_the_field(
        cloud, monkeypatch, caplog) -> None:
    conf, db, conductor, servers = cloud
    monkeypatch.setattr(conductor_agents, "HELLO_SCHEMA", strict_validator(_schema_of_1_0()))
    hello = {**recorded("agent_hello.json"), "endpoint": old_agent(conf, servers)}
    loop = HelloLoop(node_client(conf, conductor.server.url), 3600, lambda: dict(hello),
                     "conductor test")
    with caplog.at_level(logging.INFO, logger="acceld.internal.versions"):
        assert loop.once()
        assert loop.once()
    assert loop.speaker.agreed == versions.UNVERSIONED
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "does not negotiate the internal API version" in m]) == 1
    # Against this release's conductor the field goes and the answer agrees on 1.1.
    monkeypatch.undo()
    fresh = HelloLoop(node_client(conf, conductor.server.url), 3600, lambda: dict(hello),
                      "conductor test")
    assert fresh.once() and fresh.speaker.agreed == versions.CURRENT


def test_a_hello_of_this_release_ends_the_conductors_token_less_spell(cloud) -> None:
    """Issue 37 item 10: the conductor called node1 token-less (its agent had refused the
    fencing fields); the upgraded agent's next hello, speaking 1.1, makes the next call to
    node1 carry its tokens again, not 600 s later."""
    from acceld.conductor import fencing

    conf, db, conductor, servers = cloud
    hello = {**recorded("agent_hello.json"), "endpoint": old_agent(conf, servers)}
    node = node_client(conf, conductor.server.url)
    node.call("POST", "/hello", hello)  # the agent of the previous release
    fencing.SKEW.remember("node1")
    try:
        node.call("POST", "/hello", hello)  # its heartbeat: still the old agent
        assert fencing.SKEW.old("node1")
        node.call("POST", "/hello", {**hello, "api_version": "1.1"})  # upgraded
        assert not fencing.SKEW.old("node1")
    finally:
        fencing.SKEW.forget("node1")
