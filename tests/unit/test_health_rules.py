"""The health rules on their own (acceld.quarantine.next_state) and the agent's digest,
which a health counter must not change (issue 13)."""

from __future__ import annotations

import pytest

from acceld.agent.hardware import digest
from acceld.quarantine import DeviceHealth, HealthPolicy, next_state
from acceld.drivers.health import Health

AUTO3 = HealthPolicy("auto", 3)
BAD = Health("unhealthy", "ECC double-bit errors")


def run(states: list[str], policy: HealthPolicy = AUTO3) -> list[bool]:
    """Feed reports (each a new discovery); the quarantine flag after each."""
    current = DeviceHealth()
    out = []
    for state in states:
        current = next_state(current, BAD if state == "unhealthy" else Health(state), True,
                             policy).after
        out.append(current.quarantined)
    return out


def test_unhealthy_quarantines_and_three_healthy_in_a_row_return():
    assert run(["healthy", "unhealthy", "healthy", "healthy", "healthy"]) == \
        [False, True, True, True, False]


@pytest.mark.parametrize("interrupt", ["unhealthy", "degraded", "unknown"])
def test_any_report_that_is_not_healthy_restarts_the_count(interrupt):
    assert run(["unhealthy", "healthy", "healthy", interrupt, "healthy", "healthy",
                "healthy"]) == [True, True, True, True, True, True, False]


def test_degraded_and_unknown_never_quarantine():
    assert run(["degraded", "unknown", "degraded"]) == [False, False, False]


def test_a_repeated_report_of_one_discovery_does_not_count():
    current = next_state(DeviceHealth(), BAD, True, AUTO3).after
    for _ in range(5):
        current = next_state(current, Health("healthy"), False, AUTO3).after
    assert current.quarantined and current.ok_reports == 0


def test_manual_recovery_never_returns_on_its_own_and_caps_the_count():
    policy = HealthPolicy("manual", 2)
    current = next_state(DeviceHealth(), BAD, True, policy).after
    flags = []
    for _ in range(4):
        change = next_state(current, Health("healthy"), True, policy)
        current = change.after
        flags.append(change.awaiting_operator)
    assert current.quarantined and current.ok_reports == 2
    assert flags == [False, True, False, False]  # said once, when the count is reached


def test_events_of_a_quarantine_and_a_recovery():
    policy = HealthPolicy("auto", 1)
    first = next_state(DeviceHealth("healthy"), BAD, True, policy)
    assert [k for k, _ in first.events] == ["health_changed", "quarantined"]
    assert "ECC double-bit errors" in first.events[1][1]
    back = next_state(first.after, Health("healthy"), True, policy)
    assert [k for k, _ in back.events] == ["health_changed", "recovered"]


def _record(state: str, reason: str | None, counters: dict) -> dict:
    return {"uuid": "u", "health": {"state": state, "reason": reason, "counters": counters}}


def test_digest_ignores_counters_but_not_state_or_reason():
    base = digest([_record("healthy", None, {"aer_dev_correctable": 1})])
    assert digest([_record("healthy", None, {"aer_dev_correctable": 500})]) == base
    assert digest([_record("degraded", None, {"aer_dev_correctable": 1})]) != base
    assert digest([_record("healthy", "x", {"aer_dev_correctable": 1})]) != base
    assert digest([{"uuid": "u"}]) != base


def test_acceld_status_lists_unhealthy_and_quarantined_devices_per_host(
        sqlite_db, tmp_path, monkeypatch, capsys):
    import argparse

    from sqlalchemy import update

    from acceld.cmd import node as node_cli
    from acceld.db import engine
    from acceld.db.models import devices
    from tests.conftest import make_conf
    from tests.support import inventory

    with sqlite_db.write() as conn:
        sick = inventory.add_device(conn, hostname="node-a")
        back = inventory.add_device(conn, hostname="node-b")
        inventory.add_device(conn, hostname="node-a")  # healthy enough: not listed
        conn.execute(update(devices).where(devices.c.uuid == sick["uuid"]).values(
            health="unhealthy", health_reason="XID 79: fell off the bus", quarantined=True))
        conn.execute(update(devices).where(devices.c.uuid == back["uuid"]).values(
            health="healthy", quarantined=True))
    monkeypatch.setattr(node_cli, "_load", lambda args: make_conf(str(tmp_path)))
    monkeypatch.setattr(engine, "from_config", lambda conf: sqlite_db)
    monkeypatch.setattr(sqlite_db, "dispose", lambda: None)
    assert node_cli.cmd_status(argparse.Namespace()) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("node-")]
    assert [(r[0], r[1], r[3], r[4]) for r in rows] == [
        ("node-a", sick["uuid"], "unhealthy", "yes"), ("node-b", back["uuid"], "healthy", "yes")]
    assert "XID 79: fell off the bus" in out


def test_fake_driver_reports_the_health_written_in_its_spec_file(tmp_path):
    import json

    from acceld.drivers.base import DriverError
    from acceld.drivers.fake import FakeDriver
    from acceld.drivers.record_schema import check_node
    from tests.conftest import make_conf

    spec = tmp_path / "spec.json"
    conf = make_conf(str(tmp_path), fake_driver__spec_file=str(spec))
    driver = FakeDriver(conf, "host1")
    spec.write_text(json.dumps([{"type": "GPU"}, {"type": "FPGA", "health": {
        "state": "unhealthy", "reason": "injected", "counters": {"aer_dev_fatal": 2}}}]))
    plain, faulty = driver.discover()
    assert plain.health is None  # says nothing: unknown
    assert faulty.health == {"state": "unhealthy", "reason": "injected",
                             "counters": {"aer_dev_fatal": 2}}
    assert check_node([r.to_dict() for r in (plain, faulty)]).problems == []
    for bad in ({"state": "sick"}, {"reason": "no state"}, {"state": "healthy", "extra": 1},
                {"state": "healthy", "counters": {"x": -1}}):
        spec.write_text(json.dumps([{"type": "FPGA", "health": bad}]))
        with pytest.raises(DriverError, match="health"):
            driver.discover()
