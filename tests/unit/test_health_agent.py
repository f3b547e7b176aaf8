"""The agent's side of device health, agent and conductor in process over HTTP (SQLite):
a counter that ticks is no change (no pull), a health change is; each hello carries the
discovery count, and a new discovery of unchanged hardware counts one healthy report."""

from __future__ import annotations

import json

from sqlalchemy import select

from acceld.db.models import devices
from acceld.drivers.fake import FakeDriver
from tests.unit.test_agents_inprocess import _wait, as_node, device_count, setup  # noqa: F401


def _spec(path, health) -> None:  # type: ignore[no-untyped-def]
    path.write_text(json.dumps([{"type": "FPGA", "health": health}]))


def _device(db):  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return conn.execute(select(devices)).one()


def test_counters_do_not_pull_health_does_and_discoveries_count(setup, tmp_path):  # noqa: F811
    conf, db, component, agent = setup
    spec = tmp_path / "spec.json"
    _spec(spec, {"state": "unhealthy", "reason": "AER fatal", "counters": {"aer_dev_fatal": 1}})
    conf.set_override("spec_file", str(spec), group="fake_driver")
    conf.set_override("health_recovery_reports", 2, group="conductor")
    component.health_policy = component.health_policy.__class__("auto", 2)
    a = agent([FakeDriver(conf, "node1")])
    _wait(lambda: device_count(db) == 1)
    assert _device(db).quarantined
    conductor = as_node(conf, conf.conductor.url[0])

    _spec(spec, {"state": "unhealthy", "reason": "AER fatal", "counters": {"aer_dev_fatal": 7}})
    assert a.discover() is False  # the counter ticked: the same report
    body = a.hello_body()
    assert body["discovery"] == a.discoveries >= 2
    assert conductor.call("POST", "/hello", body)["pulled"] is False

    _spec(spec, {"state": "healthy"})
    # A change wakes the agent's own hello, which pulls (a hello sent here as well would
    # race it: either may be the one that pulls).
    assert a.discover() is True
    _wait(lambda: _device(db).health == "healthy")
    assert _device(db).health_ok_reports == 1
    again = conductor.call("POST", "/hello", a.hello_body())  # a heartbeat, same discovery
    assert again["pulled"] is False and _device(db).health_ok_reports == 1
    assert a.discover() is False  # a new discovery, nothing changed
    assert conductor.call("POST", "/hello", a.hello_body())["pulled"] is False
    device = _device(db)
    assert (device.quarantined, device.health) == (False, "healthy")


def test_a_hello_with_a_bad_discovery_count_is_400_and_records_nothing(setup):  # noqa: F811
    import pytest

    from acceld.clients.internal import InternalError
    from acceld.db.models import agents

    conf, db, component, agent = setup
    conductor = as_node(conf, conf.conductor.url[0])
    for bad in (-1, "7", 1.5, 2 ** 63):
        with pytest.raises(InternalError) as refused:
            conductor.call("POST", "/hello", {"status": "READY", "endpoint": "127.0.0.1:9",
                                              "discovery": bad})
        assert refused.value.status == 400 and "discovery" in refused.value.message
    with db.read() as conn:
        assert conn.execute(select(agents)).all() == []
