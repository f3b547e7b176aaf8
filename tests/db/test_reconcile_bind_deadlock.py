"""A reconcile removing a vanished device and a bind arriving on that device, in both orders,
forced at the exact point, on SQLite, PostgreSQL and MariaDB (issue 11 item 2, a gap found
while doing item 8).

MariaDB locks index entries, not just rows: a bind's shared lock on the device goes
through the ``uuid`` index (acceld.conductor.binding.target.lock_device), and deleting the
device needs that index entry too. A removal that locked the device only through its
primary key would wait for the bind's ``uuid`` entry while the bind waits for the row: a
deadlock (error 1213), one of the two rolled back with a traceback. The removal locks the
device through its ``uuid`` index first (acceld.db.inventory), as the bind reaches it, so
the second of the two waits and the first decides.

Guarantees under test: whichever locks the device first decides, the other waits; no
deadlock, no traceback, no retried bind; Nova hears exactly one event.
"""

from __future__ import annotations

import logging

import pytest

from acceld.conductor.binding import target as bind_target
from acceld.conductor.reconcile import apply_report
from acceld.db import inventory
from tests.db.test_inventory_races import VANISHED, HOST, Rig, _assert_held_then_removed
from tests.support.interleave import Background
from tests.support.nova import RecordingNova


@pytest.fixture
def nova():
    server = RecordingNova().start()
    yield server
    server.stop()


@pytest.fixture
def rig(db, tmp_path, nova) -> Rig:
    return Rig(db, tmp_path, nova)


def _no_error_logged(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR
           or "1213" in r.getMessage() or "eadlock" in r.getMessage()]
    assert bad == [], [r.getMessage() for r in bad]


def test_bind_arriving_after_the_removal_locked_the_device_fails_cleanly(rig, monkeypatch,
                                                                         caplog):
    """The reconcile locked the vanished device (nothing in use: it will delete it) -> a bind
    reaches the device -> the reconcile deletes it and commits. The bind waited for the
    device, then finds it gone: BindFailed, Nova told ``failed`` once."""
    caplog.set_level(logging.INFO)
    uuid = rig.start_bind()
    real = inventory._in_use_now
    seen: dict[str, object] = {}

    def locked_then_bind(conn, device_id, dep_ids):  # type: ignore[no-untyped-def]
        in_use = real(conn, device_id, dep_ids)
        if "bind" not in seen:
            binder = Background(rig.db, rig.run_binds, name="bind")
            seen["bind"] = binder.finished_or_blocked()
            seen["binder"] = binder
        return in_use

    monkeypatch.setattr(inventory, "_in_use_now", locked_then_bind)
    result = apply_report(rig.db, HOST, VANISHED)
    monkeypatch.setattr(inventory, "_in_use_now", real)
    bound = seen["binder"].join()  # type: ignore[attr-defined]
    assert seen["bind"] == "blocked"  # on the device (SQLite: the write lock)
    assert result.changes.removed == 1
    assert rig.device() is None
    arq = rig.arq(uuid)
    assert arq["state"] == "BindFailed", arq
    reason = arq["bind_failure_reason"]
    assert ("removed from host" in reason or "not the resource provider" in reason), reason
    assert bound == 1  # one try, not a retry after a rolled-back deadlock
    assert rig.nova_heard(uuid) == ["failed"]
    assert rig.handles_in_use() == 0
    _no_error_logged(caplog)


def test_removal_arriving_after_the_bind_locked_the_device_keeps_it(rig, monkeypatch, caplog):
    """A bind locked the device (before taking a handle) -> the reconcile, for which the
    device vanished, reaches it -> the bind takes its handle and commits Bound. The
    reconcile waited, then sees the handle in use and keeps the device."""
    caplog.set_level(logging.INFO)
    uuid = rig.start_bind()
    real = bind_target.lock_deployable
    seen: dict[str, object] = {}

    def device_locked_then_reconcile(conn, deployable_id, name):  # type: ignore[no-untyped-def]
        if "reconcile" not in seen:
            reconciler = Background(rig.db, lambda: apply_report(rig.db, HOST, VANISHED),
                                    name="reconcile")
            seen["reconcile"] = reconciler.finished_or_blocked()
            seen["reconciler"] = reconciler
        return real(conn, deployable_id, name)

    monkeypatch.setattr(bind_target, "lock_deployable", device_locked_then_reconcile)
    assert rig.run_binds() == 1
    monkeypatch.setattr(bind_target, "lock_deployable", real)
    seen["reconciler"].join()  # type: ignore[attr-defined]
    assert seen["reconcile"] == "blocked"
    _no_error_logged(caplog)
    _assert_held_then_removed(rig, uuid)
