"""Device health on the conductor (issue 13), on SQLite, PostgreSQL and MariaDB: an unhealthy
report quarantines the device (no bind, Placement reserved, one WARNING, events), recovery
waits for consecutive healthy discoveries, flapping does not return it, the operator's
enable/disable and health never undo each other, and races with binds and an operator's
return are decided under the device row's lock (forced interleavings).
"""

from __future__ import annotations

import json
import logging

import pytest
from sqlalchemy import select, update

from falcon import testing

from acceld.agent.hardware import digest
from acceld.api.app import build_app
from acceld import quarantine
from acceld.conductor.binding import target as bind_target
from acceld.conductor.health import device_event_purge
from acceld.conductor.fleet.agents import AgentsComponent
from acceld.placement_model import desired_providers
from acceld.conductor.reconcile import apply_report
from acceld.db import agents as agents_db
from acceld.db import device_events
from acceld.db.clock import db_now
from acceld.db.models import device_events as events_table
from acceld.drivers.fake import FakeDriver
from tests.db.test_inventory_races import HOST, RP, Rig
from tests.conftest import make_conf
from tests.helpers import ADMIN
from tests.support.interleave import Background
from tests.support.nova import RecordingNova
from tests.support.told import agent_told

FAULT = {"state": "unhealthy", "reason": "XID 79: GPU has fallen off the bus"}
GOOD = {"state": "healthy"}


@pytest.fixture(scope="module")
def nova():
    """One recording Nova for the module: tests read only their own ARQs' events."""
    server = RecordingNova().start()
    yield server
    server.stop()


class HealthRig(Rig):
    """The races' rig, its fake device's health written into a spec file."""

    def __init__(self, db, tmp_path, nova) -> None:  # type: ignore[no-untyped-def]
        self.db = db
        self.nova = nova
        self.spec = tmp_path / "spec.json"
        self.write_health(None)
        self.conf = make_conf(str(tmp_path), nova__auth_type="none",
                              nova__endpoint_override=nova.url,
                              fake_driver__spec_file=str(self.spec),
                              conductor__health_recovery_reports=3)
        self.client = testing.TestClient(build_app(self.conf, db))
        self.report(None)
        assert self.client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
            {"name": "dp", "groups": [{"resources:FPGA": "1"}]}]).status_code == 201
        with db.write() as conn:
            agents_db.record_heartbeat(conn, HOST, "127.0.0.1:1", 10, discovery=0)

    def write_health(self, value: dict | None) -> None:
        entry: dict = {"type": "FPGA", "attach_handles": 2}
        if value is not None:
            entry["health"] = value
        self.spec.write_text(json.dumps([entry]))

    @property
    def policy(self) -> quarantine.HealthPolicy:
        return quarantine.HealthPolicy.from_conf(self.conf)

    def report(self, value: dict | None, counted: bool = True):  # type: ignore[no-untyped-def]
        """The node reports its device with this health (a pull and reconcile)."""
        self.write_health(value)
        records = [r.to_dict() for r in FakeDriver(self.conf, HOST).discover()]
        outcome = apply_report(self.db, HOST, {"hardware": records, "digest": digest(records)},
                               self.policy, counted)
        with self.db.write() as conn:
            agent_told(conn)  # no agent server: PCI binds in one transaction
        return outcome

    def events(self) -> list[tuple[str, str | None]]:
        with self.db.read() as conn:
            return [(e.kind, e.actor) for e in reversed(device_events.newest_first(
                conn, self.device().uuid, 100))]

    def reserved(self) -> int:
        with self.db.read() as conn:
            return desired_providers(conn, [HOST], True)[RP].reserved

    def bind_refusal(self) -> str | None:
        uuid = self.start_bind()
        self.run_binds()
        arq = self.arq(uuid)
        return arq["bind_failure_reason"] if arq["state"] == "BindFailed" else None


@pytest.fixture
def rig(db, tmp_path, nova) -> HealthRig:
    return HealthRig(db, tmp_path, nova)


def test_unhealthy_report_quarantines_once_with_warning_events_and_placement(rig, caplog):
    rig.report(GOOD)
    assert rig.reserved() == 0
    with caplog.at_level(logging.WARNING, logger="acceld.quarantine"):
        rig.report(FAULT)
        rig.report(FAULT)  # still unhealthy: nothing new
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    device = rig.device()
    assert len(warnings) == 1
    assert device.uuid in warnings[0] and HOST in warnings[0] and "XID 79" in warnings[0]
    assert (device.health, device.health_reason, device.quarantined) == \
        ("unhealthy", FAULT["reason"], True)
    assert device.health_since is not None and device.quarantined_at is not None
    assert device.status == "enabled"  # the operator's dimension is untouched
    assert rig.reserved() == 2
    assert rig.events() == [("health_changed", "conductor"), ("health_changed", "conductor"),
                            ("quarantined", "conductor")]
    with rig.db.read() as conn:
        rows = conn.execute(select(events_table)).all()
        now = db_now(conn)
    assert {(r.device_uuid, r.hostname) for r in rows} == {(device.uuid, HOST)}
    # Stamped by the database's clock.
    assert all(abs((now - r.created_at).total_seconds()) < 60 for r in rows)
    reason = rig.bind_refusal()
    assert reason and "quarantined" in reason and "unhealthy" in reason and "XID 79" in reason


def test_recovery_counts_consecutive_discoveries_not_heartbeats(rig):
    rig.report(FAULT)
    rig.report(GOOD)  # discovery 1
    rig.report(GOOD, counted=False)  # a pull of the same discovery: no count
    assert (rig.device().health_ok_reports, rig.device().quarantined) == (1, True)
    component = AgentsComponent(rig.conf, rig.db)
    steady = "a" * 64
    with rig.db.write() as conn:
        agents_db.set_digest(conn, HOST, steady)
    component._heartbeat(HOST, "127.0.0.1:1", 10, 7, steady)  # discovery 2, unchanged
    component._heartbeat(HOST, "127.0.0.1:1", 10, 7, steady)  # heartbeat, same discovery
    assert (rig.device().health_ok_reports, rig.device().quarantined) == (2, True)
    assert rig.reserved() == 2
    component._heartbeat(HOST, "127.0.0.1:1", 10, 8, "b" * 64)  # changed: the pull counts
    assert rig.device().health_ok_reports == 2
    with rig.db.write() as conn:
        agents_db.set_digest(conn, HOST, steady)
    component._heartbeat(HOST, "127.0.0.1:1", 10, 9, steady)  # discovery 3
    device = rig.device()
    assert (device.quarantined, device.health_ok_reports, device.health) == \
        (False, 0, "healthy")
    assert rig.reserved() == 0
    assert rig.events()[-1] == ("recovered", "conductor")
    assert rig.bind_refusal() is None


def test_flapping_device_is_not_returned_on_every_good_report(rig):
    for value in (FAULT, GOOD, GOOD, FAULT, GOOD, GOOD,
                  {"state": "degraded", "reason": "link x8 of x16"}, GOOD, GOOD):
        rig.report(value)
        assert rig.device().quarantined, value
    rig.report(GOOD)
    assert not rig.device().quarantined
    kinds = [k for k, _ in rig.events()]
    assert kinds.count("quarantined") == 1 and kinds.count("recovered") == 1


def test_operator_disable_and_health_never_undo_each_other(rig):
    rig.disable()
    rig.report(FAULT)
    for _ in range(3):
        rig.report(GOOD)
    device = rig.device()
    assert (device.quarantined, device.status) == (False, "maintaining")  # still disabled
    assert "disabled" in rig.bind_refusal()
    rig.report(FAULT)
    assert rig.client.simulate_post(f"/accelerator/v2/devices/{device.uuid}/enable",
                                    headers=ADMIN).status_code == 200
    device = rig.device()
    assert (device.quarantined, device.status) == (True, "enabled")  # enable ends no quarantine
    assert "quarantined" in rig.bind_refusal()


def test_manual_recovery_waits_for_the_operator(rig):
    rig.conf.set_override("health_recovery", "manual", group="conductor")
    rig.report(FAULT)
    with rig.db.write() as conn, pytest.raises(quarantine.StillUnhealthy):
        quarantine.release_by_operator(conn, rig.device().id, "ops", None)
    for _ in range(5):
        rig.report(GOOD)
    device = rig.device()
    assert (device.quarantined, device.health_ok_reports) == (True, 3)
    with rig.db.write() as conn:
        quarantine.release_by_operator(conn, device.id, "ops-user", "replaced the riser")
    assert not rig.device().quarantined
    assert rig.events()[-1] == ("recovered", "ops-user")
    with rig.db.write() as conn, pytest.raises(quarantine.NotQuarantined):
        quarantine.release_by_operator(conn, device.id, "ops", None)
    assert rig.reserved() == 0


def test_counter_changes_alone_write_nothing(sqlite_db, tmp_path, nova):
    rig = HealthRig(sqlite_db, tmp_path, nova)
    rig.report({"state": "healthy", "counters": {"aer_dev_correctable": 1}})
    before = rig.device()
    outcome = rig.report({"state": "healthy", "counters": {"aer_dev_correctable": 9}})
    assert outcome.changes.writes == 0
    assert rig.device().updated_at == before.updated_at
    assert len(rig.events()) == 1


def test_purge_removes_only_events_older_than_the_retention(rig, monkeypatch):
    rig.report(FAULT)
    rig.report(GOOD)
    with rig.db.write() as conn:
        conn.execute(update(events_table).where(events_table.c.kind == "health_changed")
                     .values(created_at=rig.device().created_at.replace(year=2000)))
    rig.conf.set_override("device_event_retention", 3600, group="conductor")
    monkeypatch.setattr(device_event_purge, "BATCH", 1)  # two batches, then an empty one
    assert device_event_purge.DeviceEventPurge(rig.conf, rig.db).purge() == 2
    assert [k for k, _ in rig.events()] == ["quarantined"]


# ----------------------------------------------------------------------- forced interleavings

def test_bind_holding_the_device_commits_first_and_stays_bound(rig, monkeypatch):
    """A bind took a handle under the device's shared lock -> an unhealthy report -> the
    bind commits: the report waited (server backends: for the row lock), the ARQ is Bound
    and stays so, the device is quarantined after."""
    uuid = rig.start_bind()
    real_take = bind_target.take_handle
    seen: dict[str, object] = {}

    def take_then_report(conn, target):  # type: ignore[no-untyped-def]
        real_take(conn, target)
        reporter = Background(rig.db, lambda: rig.report(FAULT), name="report")
        seen["report"] = reporter.finished_or_blocked()
        seen["reporter"] = reporter

    monkeypatch.setattr(bind_target, "take_handle", take_then_report)
    rig.run_binds()
    monkeypatch.setattr(bind_target, "take_handle", real_take)
    seen["reporter"].join()  # type: ignore[attr-defined]
    assert seen["report"] == "blocked"
    assert rig.arq(uuid)["state"] == "Bound"
    assert rig.device().quarantined
    assert rig.handles_in_use() == 1
    assert "quarantined" in rig.bind_refusal()


def test_quarantine_committed_after_the_bind_checked_the_device_fails_the_bind(
        rig, monkeypatch):
    """The bind read the device usable -> the report quarantines it and commits -> the bind
    locks the device: refused, naming its health."""
    uuid = rig.start_bind()
    real_check = bind_target.check_device_usable
    seen: dict[str, object] = {}

    def check_then_report(conn, target):  # type: ignore[no-untyped-def]
        real_check(conn, target)
        if "report" not in seen:
            reporter = Background(rig.db, lambda: rig.report(FAULT), name="report")
            seen["report"] = reporter.finished_or_blocked()
            seen["reporter"] = reporter

    checks = list(bind_target.CHECKS)
    checks[checks.index(real_check)] = check_then_report
    monkeypatch.setattr(bind_target, "CHECKS", checks)
    rig.run_binds()
    seen["reporter"].join()  # type: ignore[attr-defined]
    arq = rig.arq(uuid)
    if rig.db.is_sqlite:
        # The bind held SQLite's write lock: the report ran after it.
        assert seen["report"] == "blocked"
        assert arq["state"] == "Bound"
        return
    assert seen["report"] == "finished"  # the forced order happened
    assert arq["state"] == "BindFailed"
    assert "quarantined" in arq["bind_failure_reason"]
    assert "XID 79" in arq["bind_failure_reason"]
    assert rig.handles_in_use() == 0


@pytest.mark.parametrize("first", ["operator", "report"])
def test_operator_return_and_unhealthy_report_serialise(rig, monkeypatch, first):
    """A quarantined device, healthy again: an operator returns it while a report says it is
    unhealthy. Whoever locks the row first decides; the other sees its result."""
    rig.conf.set_override("health_recovery", "manual", group="conductor")
    rig.report(FAULT)
    rig.report(GOOD)
    device_id = rig.device().id
    real_lock = quarantine.lock_device_row
    seen: dict[str, object] = {}

    def release() -> None:
        with rig.db.write() as conn:
            quarantine.release_by_operator(conn, device_id, "ops", None)

    second = (lambda: rig.report(FAULT)) if first == "operator" else release

    def lock_then_other(conn, dev_id):  # type: ignore[no-untyped-def]
        row = real_lock(conn, dev_id)
        if "other" not in seen:
            seen["other"] = "started"
            other = Background(rig.db, second, name="second")
            seen["other"] = other.finished_or_blocked()
            seen["thread"] = other
        return row

    monkeypatch.setattr(quarantine, "lock_device_row", lock_then_other)
    if first == "operator":
        release()
    else:
        rig.report(FAULT)
    monkeypatch.setattr(quarantine, "lock_device_row", real_lock)
    thread = seen["thread"]
    assert seen["other"] == "blocked"
    if first == "operator":
        thread.join()  # type: ignore[attr-defined]
        kinds = [k for k, _ in rig.events()]
        assert kinds[-3:] == ["recovered", "health_changed", "quarantined"]
    else:
        with pytest.raises(quarantine.StillUnhealthy):
            thread.join()  # type: ignore[attr-defined]
    device = rig.device()
    assert (device.quarantined, device.health) == (True, "unhealthy")



def test_vanish_and_return_are_events(rig):
    """Held while in use (vanished), back when reported again; removed, then back again."""
    uuid = rig.start_bind()
    rig.run_binds()
    assert rig.arq(uuid)["state"] == "Bound"
    device_uuid = rig.device().uuid
    apply_report(rig.db, HOST, {"hardware": [], "digest": "0" * 64})
    rig.report(None)
    rig.unbind(uuid)
    apply_report(rig.db, HOST, {"hardware": [], "digest": "1" * 64})
    assert rig.device() is None
    rig.report(None)
    with rig.db.read() as conn:
        kinds = [e.kind for e in reversed(device_events.newest_first(conn, device_uuid, 100))]
    assert kinds == ["vanished", "reappeared", "vanished", "reappeared"]


def test_disable_racing_a_recovery_stays_disabled(rig, monkeypatch):
    """The third healthy report holds the device row to return it -> an operator disables
    the device meanwhile: the disable waits, then commits; the device is back from
    quarantine and still disabled (health never enables, the disable is not lost)."""
    rig.report(FAULT)
    rig.report(GOOD)
    rig.report(GOOD)
    real_lock = quarantine.lock_device_row
    seen: dict[str, object] = {}

    def lock_then_disable(conn, dev_id):  # type: ignore[no-untyped-def]
        row = real_lock(conn, dev_id)
        if "disable" not in seen:
            disabler = Background(rig.db, rig.disable, name="disable")
            seen["disable"] = disabler.finished_or_blocked()
            seen["thread"] = disabler
        return row

    monkeypatch.setattr(quarantine, "lock_device_row", lock_then_disable)
    rig.report(GOOD)
    monkeypatch.setattr(quarantine, "lock_device_row", real_lock)
    seen["thread"].join()  # type: ignore[attr-defined]
    assert seen["disable"] == "blocked"
    device = rig.device()
    assert (device.quarantined, device.status) == (False, "maintaining")
    assert [k for k, _ in rig.events()][-2:] == ["recovered", "disabled"]
    assert "disabled" in rig.bind_refusal()
