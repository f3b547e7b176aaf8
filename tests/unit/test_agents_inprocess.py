"""Agent and conductor in one process (real internal servers on loopback, SQLite).

Covers what the multi-process integration test does not look at closely: the
hello answers (400 for refused records, with the rest applied; 502 when the
agent cannot be reached), the cost of an unchanged heartbeat, and the liveness
sweep's WARNING and recovery.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

import pytest
from sqlalchemy import func, select, update

from acceld.agent.service import Agent
from acceld.clients.internal import InternalClient, InternalError
from acceld.conductor.fleet.agents import AgentsComponent, host_is_up
from acceld.conductor.service import Conductor
from acceld.db.models import agents, devices
from acceld.drivers.base import Driver, HardwareRecord
from acceld.drivers.fake import FakeDriver
from acceld.internal import auth
from acceld.runtime.secrets import ensure_secret_file, internal_secret
from tests.conftest import count_queries, make_conf


class Scripted(Driver):
    """A driver whose records the test sets."""

    name = "scripted"
    hardware_type = "GPU"
    records: list[HardwareRecord] = []

    def discover(self) -> list[HardwareRecord]:
        return list(self.records)


class BrokenRecords(FakeDriver):
    """Reports the fake device with a bad field: the schema refuses it."""

    name = "broken"

    def discover(self) -> list[HardwareRecord]:
        records = super().discover()
        for record in records:
            record.driver_name = "broken"
            record.vendor = ""  # minLength 1
        return records


@pytest.fixture
def setup(tmp_path, sqlite_db):
    ensure_secret_file(str(tmp_path))
    conf = make_conf(str(tmp_path), conductor__port=0, agent__port=0,
                     agent__heartbeat_interval=3600, conductor__agent_check_interval=3600,
                     # liveness is flushed by the tests that need it, never behind their back
                     # (a background flush stamping a host after a test backdated it)
                     conductor__heartbeat_flush_interval=3600)
    conf.set_override("connection", str(sqlite_db.url), group="database")
    component = AgentsComponent(conf, sqlite_db)
    conductor = Conductor(conf, sqlite_db, [component])
    conductor.start()
    conf.set_override("url", conductor.server.url, group="conductor")
    started: list[Agent] = []

    def agent(drivers, host="node1") -> Agent:
        a = Agent(conf, host, drivers=drivers)
        started.append(a)
        return a.start()

    yield conf, sqlite_db, component, agent
    for a in started:
        a.stop()
    conductor.stop()


def as_node(conf, url: str, host: str = "node1",
            destination: str = auth.CONDUCTOR) -> InternalClient:
    """A client signing as node ``host``, with the key the conductor derives for it, for
    ``destination`` (the conductor unless said otherwise)."""
    return InternalClient(url, auth.Signer(auth.node_key(internal_secret(conf), host), host),
                          destination=destination)


def _wait(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    raise AssertionError("timed out")


def device_count(db, host="node1") -> int:
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(devices).where(
            devices.c.hostname == host)).scalar_one()


def test_first_hello_pulls_and_an_unchanged_one_writes_only_its_nonce(setup):
    conf, db, component, agent = setup
    a = agent([FakeDriver(conf, "node1")])
    _wait(lambda: device_count(db) == 1)
    conductor = as_node(conf, conf.conductor.url[0])
    with db.write() as conn:
        conn.execute(update(agents).values(last_seen_at=dt.datetime(2020, 1, 1)))
    with count_queries(db) as statements:
        answer = conductor.call("POST", "/hello", a.hello_body())
    assert answer["pulled"] is False
    writes = [s for s in statements if s.split()[0].upper() in ("INSERT", "UPDATE", "DELETE")]
    # The credential's nonce, shared with every conductor (acceld.db.nonces); the agent's
    # row is read (the host was not in memory yet) and stamped by the next flush.
    assert len(writes) == 1, writes
    assert writes[0].upper().startswith("INSERT INTO INTERNAL_NONCES"), writes
    assert component.liveness.flush() == 1
    with db.read() as conn:
        assert conn.execute(select(agents.c.last_seen_at)).scalar_one() > dt.datetime(2020, 1, 1)


def test_refused_record_gets_400_and_the_rest_is_applied(setup, caplog):
    conf, db, component, agent = setup
    good = FakeDriver(conf, "node1")
    conf.set_override("devices", ["GPU"], group="fake_driver")
    a = agent([good, BrokenRecords(conf, "node1")])
    _wait(lambda: device_count(db) == 1)  # the good FPGA... and the GPU is refused
    with db.read() as conn:
        assert [r.type for r in conn.execute(select(devices.c.type))] == ["GPU"]
    conductor = as_node(conf, conf.conductor.url[0])
    with db.write() as conn:  # forget the digest: the next hello pulls again
        conn.execute(update(agents).values(hardware_digest=None))
    with caplog.at_level(logging.WARNING):
        with pytest.raises(InternalError) as refused:
            conductor.call("POST", "/hello", a.hello_body())
    assert refused.value.status == 400
    assert "driver broken" in refused.value.message and "vendor" in refused.value.message
    assert any("Refused a hardware record from node1" in r.getMessage() for r in caplog.records)
    assert device_count(db) == 1


def test_unreachable_agent_gets_502(setup):
    conf, db, component, agent = setup
    conductor = as_node(conf, conf.conductor.url[0], "ghost")
    with pytest.raises(InternalError) as failed:
        conductor.call("POST", "/hello", {"status": "READY", "endpoint": "127.0.0.1:9",
                                          "hostname": "ghost", "hardware_digest": "x"})
    assert failed.value.status == 502
    with db.read() as conn:
        assert conn.execute(select(agents.c.hardware_digest).where(
            agents.c.hostname == "ghost")).scalar() is None


@pytest.mark.parametrize("body", [
    None, [], {"status": "READY"}, {"status": "GONE", "endpoint": "h:1"},
    {"status": "READY", "endpoint": "no-port"},
    {"status": "READY", "endpoint": "h:1", "heartbeat_interval": 0},
    {"status": "READY", "endpoint": "h:1", "colour": "red"},
])
def test_malformed_hello_is_400_and_records_nothing(setup, body):
    conf, db, component, agent = setup
    conductor = as_node(conf, conf.conductor.url[0])
    with pytest.raises(InternalError) as refused:
        conductor.call("POST", "/hello", body)
    assert refused.value.status == 400
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(agents)).scalar_one() == 0


def test_agent_routes(setup):
    conf, db, component, agent = setup
    Scripted.records = FakeDriver(conf, "node1").discover()
    a = agent([Scripted(conf, "node1")])
    client = as_node(conf, a.server.url, destination=auth.agent_destination("node1"))
    report = client.call("GET", "/hardware")
    assert len(report["hardware"]) == 1 and len(report["digest"]) == 64
    Scripted.records = []
    assert client.call("POST", "/discovery", {}) == {"status": "IN-PROGRESS"}
    _wait(lambda: client.call("GET", "/hardware")["hardware"] == [])
    # The changed digest reached the conductor at once, not after the (hour-long) interval.
    _wait(lambda: device_count(db) == 0)
    with pytest.raises(InternalError) as refused:
        client.call("POST", "/hello", {"status": "READY", "endpoint": "x"})
    assert refused.value.status == 400


def test_sweep_marks_silent_agents_down_and_hello_brings_them_back(setup, caplog):
    conf, db, component, agent = setup
    a = agent([FakeDriver(conf, "node1")])
    _wait(lambda: device_count(db) == 1)
    component.sweep()
    with db.read() as conn:
        assert host_is_up(conn, "node1")
    long_ago = dt.datetime(2020, 1, 1)
    with db.write() as conn:
        conn.execute(update(agents).values(last_seen_at=long_ago))
    with caplog.at_level(logging.WARNING):
        component.sweep()
    with db.read() as conn:
        assert not host_is_up(conn, "node1")
        assert host_is_up(conn, "never-heard-of")
    (warning,) = [r for r in caplog.records if "is down" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert "node1" in warning.getMessage() and "2020-01-01T00:00:00" in warning.getMessage()
    a.hello.once()
    # An unchanged hello may be answered from the conductor's memory of the row (it was
    # read by a flush after the registration); the flush stamps the host up again.
    component.liveness.flush()
    with db.read() as conn:
        assert host_is_up(conn, "node1")
