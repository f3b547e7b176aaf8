"""Reconciliation and an operator's disable racing a bind, each forced at the exact point, on
SQLite, PostgreSQL and MariaDB (issue 11, items 2 and 3).

Guarantees under test:

* a reconcile never removes a handle in use: a device that vanished while a bind took one of
  its handles is kept (``maintaining``, with a reason) until the handle is released, then
  removed; whatever the order of the reconcile's read, the bind and the reconcile's writes;
* once a disable has committed, no bind goes ``Bound`` on that device afterwards: a bind that
  checked the device before the disable ends ``BindFailed`` saying it was disabled, and Nova
  is told ``failed``.

On SQLite every write transaction holds the database's only write lock from its ``BEGIN
IMMEDIATE``, so the second transaction waits for the first: the tests check that it did and
that the outcome matches that order. On PostgreSQL and MariaDB the forced order really happens
(the tests check that too) and the code must decide correctly.
"""

from __future__ import annotations

import uuid as uuidlib

import pytest
from falcon import testing
from sqlalchemy import select
from sqlalchemy import update as sa_update

from acceld.api.app import build_app
from acceld.conductor.binding import target as bind_target
from acceld.conductor.binding.worker import BindWorker
from acceld.conductor.reconcile import apply_report
from acceld.db import inventory
from acceld.db.models import agents, attach_handles, devices
from acceld.drivers.fake import FakeDriver
from tests.conftest import make_conf
from tests.helpers import ADMIN, SERVICE, version
from tests.support.interleave import Background
from tests.support.nova import RecordingNova
from tests.support.told import agent_told

HOST = "node-1"
RP = str(uuidlib.uuid3(uuidlib.NAMESPACE_DNS, f"{HOST}_FakeDevice"))
ARQS = "/accelerator/v2/accelerator_requests"
VANISHED = {"hardware": [], "digest": "nothing-left"}


@pytest.fixture
def nova():
    server = RecordingNova().start()
    yield server
    server.stop()


class Rig:
    """One node with one fake FPGA (two handles), the API, a bind worker, a recording Nova."""

    def __init__(self, db, tmp_path, nova: RecordingNova) -> None:
        self.db = db
        self.nova = nova
        self.conf = make_conf(str(tmp_path), nova__auth_type="none",
                              nova__endpoint_override=nova.url, nova__connect_retries=0,
                              nova__status_code_retries=0,
                              fake_driver__attach_handles=2)
        self.client = testing.TestClient(build_app(self.conf, db))
        with db.write() as conn:
            inventory.reconcile_node(conn, HOST, FakeDriver(self.conf, HOST).discover())
            agent_told(conn)  # no agent server: PCI binds in one transaction
        assert self.client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
            {"name": "dp", "groups": [{"resources:FPGA": "1"}]}]).status_code == 201

    def start_bind(self) -> str:
        """An ARQ in BindStarted with its job pending; its uuid."""
        [arq] = self.client.simulate_post(ARQS, json={"device_profile_name": "dp"},
                                          headers=ADMIN).json["arqs"]
        ops = [{"op": "add", "path": "/hostname", "value": HOST},
               {"op": "add", "path": "/device_rp_uuid", "value": RP},
               {"op": "add", "path": "/instance_uuid", "value": str(uuidlib.uuid4())}]
        assert self.client.simulate_patch(ARQS, json={arq["uuid"]: ops},
                                          headers=SERVICE).status_code == 202
        return arq["uuid"]

    def run_binds(self) -> int:
        worker = BindWorker(self.conf, self.db)
        done = 0
        while count := worker.run_once():
            done += count
        return done

    def arq(self, uuid: str) -> dict:
        return self.client.simulate_get(f"{ARQS}/{uuid}", headers={**ADMIN, **version("2.4")}
                                        ).json

    def unbind(self, uuid: str) -> None:
        assert self.client.simulate_patch(ARQS, json={uuid: [
            {"op": "remove", "path": "/hostname"}, {"op": "remove", "path": "/device_rp_uuid"},
            {"op": "remove", "path": "/instance_uuid"}]}, headers=SERVICE).status_code == 202

    def device(self):  # type: ignore[no-untyped-def]
        with self.db.read() as conn:
            return conn.execute(select(devices)).first()

    def handles_in_use(self) -> int:
        with self.db.read() as conn:
            return len(conn.execute(select(attach_handles.c.id).where(
                attach_handles.c.in_use.is_(True))).all())

    def disable(self) -> None:
        device = self.device()
        assert self.client.simulate_post(f"/accelerator/v2/devices/{device.uuid}/disable",
                                         headers=ADMIN).status_code == 200

    def nova_heard(self, uuid: str) -> list[str]:
        return [e["status"] for e in self.nova.events() if e["tag"] == uuid]


@pytest.fixture
def rig(db, tmp_path, nova) -> Rig:
    return Rig(db, tmp_path, nova)


def _assert_held_then_removed(rig: Rig, uuid: str) -> None:
    """The bound ARQ kept its handle; the device is held; after the unbind it goes."""
    arq = rig.arq(uuid)
    assert arq["state"] == "Bound", arq
    assert arq["attach_handle_info"], arq
    assert rig.nova_heard(uuid) == ["completed"]
    device = rig.device()
    assert device is not None
    assert (device.status, device.vanished) == ("maintaining", True)
    assert device.status_reason.startswith(inventory.VANISHED_PREFIX)
    assert rig.handles_in_use() == 1
    rig.unbind(uuid)
    assert apply_report(rig.db, HOST, VANISHED).changes.removed == 1
    assert rig.device() is None


# ------------------------------------------------------------------ item 2: reconcile vs bind

def test_bind_that_commits_after_the_reconcile_read_keeps_its_device(rig, monkeypatch):
    """Reconcile reads the node -> a bind takes a handle and commits -> reconcile applies."""
    uuid = rig.start_bind()
    real_load = inventory.load_node
    seen: dict[str, str] = {}

    def load_then_bind(conn, hostname):  # type: ignore[no-untyped-def]
        node = real_load(conn, hostname)
        if "bind" not in seen:
            seen["bind"] = "started"
            binder = Background(rig.db, rig.run_binds, name="bind")
            seen["bind"] = binder.finished_or_blocked()
            seen["binder"] = binder  # type: ignore[assignment]
        return node

    monkeypatch.setattr(inventory, "load_node", load_then_bind)
    apply_report(rig.db, HOST, VANISHED)
    monkeypatch.setattr(inventory, "load_node", real_load)
    seen["binder"].join()  # type: ignore[attr-defined]
    if rig.db.is_sqlite:
        # The reconcile held the write lock: the bind ran after it and found no device.
        assert seen["bind"] == "blocked"
        arq = rig.arq(uuid)
        assert arq["state"] == "BindFailed"
        assert "not the resource provider of any deployable" in arq["bind_failure_reason"]
        assert rig.nova_heard(uuid) == ["failed"]
        assert rig.device() is None
        return
    assert seen["bind"] == "finished"  # the forced order happened
    _assert_held_then_removed(rig, uuid)


def test_bind_in_flight_while_the_reconcile_runs_keeps_its_device(rig, monkeypatch):
    """A bind took a handle (not committed) -> a reconcile reads and applies -> bind commits."""
    uuid = rig.start_bind()
    real_take = bind_target.take_handle
    seen: dict[str, object] = {}

    def take_then_reconcile(conn, target):  # type: ignore[no-untyped-def]
        real_take(conn, target)
        reconciler = Background(rig.db, lambda: apply_report(rig.db, HOST, VANISHED),
                                name="reconcile")
        seen["reconcile"] = reconciler.finished_or_blocked()
        seen["reconciler"] = reconciler

    monkeypatch.setattr(bind_target, "take_handle", take_then_reconcile)
    rig.run_binds()
    monkeypatch.setattr(bind_target, "take_handle", real_take)
    seen["reconciler"].join()  # type: ignore[attr-defined]
    # The handle the bind holds is locked: the reconcile waits for the bind's commit.
    assert seen["reconcile"] == "blocked"
    _assert_held_then_removed(rig, uuid)


def _vanish(kind: str, records: list) -> list:
    """The node's report with one deployable, or its last handle, gone."""
    if kind == "deployable":
        records[0].deployables = []
    else:
        records[0].deployables[0].attach_handles = records[0].deployables[0].attach_handles[:1]
    return records


@pytest.mark.parametrize("kind", ["deployable", "handle"])
def test_bind_that_commits_after_the_reconcile_read_keeps_its_deployable_or_handle(
        rig, monkeypatch, kind):
    """As above for a deployable, or a handle, that the node stops reporting while its device
    stays: the bind takes a handle that disappears (for a handle: the first one is taken
    already, so the bind gets the last, the one the node no longer reports)."""
    first = None
    if kind == "handle":
        first = rig.start_bind()
        rig.run_binds()
        assert rig.arq(first)["state"] == "Bound"
    held = 1 if first else 0
    uuid = rig.start_bind()
    records = _vanish(kind, FakeDriver(rig.conf, HOST).discover())
    real_load = inventory.load_node
    seen: dict[str, object] = {}

    def load_then_bind(conn, hostname):  # type: ignore[no-untyped-def]
        node = real_load(conn, hostname)
        if "bind" not in seen:
            binder = Background(rig.db, rig.run_binds, name="bind")
            seen["bind"] = binder.finished_or_blocked()
            seen["binder"] = binder
        return node

    monkeypatch.setattr(inventory, "load_node", load_then_bind)
    with rig.db.write() as conn:
        inventory.reconcile_node(conn, HOST, records)
    monkeypatch.setattr(inventory, "load_node", real_load)
    seen["binder"].join()  # type: ignore[attr-defined]
    arq = rig.arq(uuid)
    if rig.db.is_sqlite:
        assert seen["bind"] == "blocked"
        assert arq["state"] == "BindFailed"
        assert rig.nova_heard(uuid) == ["failed"]
        assert rig.handles_in_use() == held
        return
    assert seen["bind"] == "finished"
    assert arq["state"] == "Bound" and arq["attach_handle_info"], arq
    assert rig.nova_heard(uuid) == ["completed"]
    assert rig.handles_in_use() == held + 1
    # Released: the next reconcile removes what the node no longer reports.
    for bound in (uuid, first) if first else (uuid,):
        rig.unbind(bound)
    with rig.db.write() as conn:
        assert inventory.reconcile_node(conn, HOST, records).removed >= 1
    with rig.db.read() as conn:
        left = len(conn.execute(select(attach_handles.c.id)).all())
    assert left == (0 if kind == "deployable" else 1)


# ------------------------------------------------------------------ item 3: disable vs bind

def test_disable_committed_after_the_bind_checked_the_device_fails_the_bind(rig, monkeypatch):
    """The bind checked the device is enabled -> a disable commits -> the bind takes a handle."""
    uuid = rig.start_bind()
    seen: dict[str, object] = {}

    def disable_now(conn, target):  # type: ignore[no-untyped-def]
        if "disable" not in seen:
            disabler = Background(rig.db, rig.disable, name="disable")
            seen["disable"] = disabler.finished_or_blocked()
            seen["disabler"] = disabler

    checks = list(bind_target.CHECKS)
    checks.insert(checks.index(bind_target.check_device_usable) + 1, disable_now)
    monkeypatch.setattr(bind_target, "CHECKS", checks)
    rig.run_binds()
    seen["disabler"].join()  # type: ignore[attr-defined]
    assert rig.device().status == "maintaining"
    arq = rig.arq(uuid)
    if rig.db.is_sqlite:
        # The bind held the write lock: the disable waited for it and came second, so the
        # bind was entitled to succeed; the next one is refused.
        assert seen["disable"] == "blocked"
        assert arq["state"] == "Bound"
        assert rig.nova_heard(uuid) == ["completed"]
        later = rig.start_bind()
        rig.run_binds()
        uuid, arq = later, rig.arq(later)
    else:
        assert seen["disable"] == "finished"  # the forced order happened
    assert arq["state"] == "BindFailed", arq
    assert "disabled" in arq["bind_failure_reason"]
    assert rig.nova_heard(uuid) == ["failed"]
    assert rig.handles_in_use() == (1 if rig.db.is_sqlite else 0)


def test_disable_committed_while_the_host_step_runs_fails_the_bind(db, tmp_path, nova,
                                                                 monkeypatch):
    """A handle with a host step (an mdev) is prepared between the bind's two transactions:
    a disable that commits meanwhile fails the bind, and the prepared mdev is released."""
    from acceld.agent.attach import AttachSteps
    from acceld.conductor.binding import attach as bind_attach
    from acceld.internal.auth import agent_destination
    from acceld.internal.server import InternalServer, build_app as internal_app
    from tests.unit.test_attach_handles import HOST as NODE_HOST, SECRET, Node

    node = Node(tmp_path, db)
    node.conf.set_override("auth_type", "none", group="nova")
    node.conf.set_override("endpoint_override", nova.url, group="nova")
    steps = AttachSteps({"fake": node.fake}.get, NODE_HOST)
    node.agent = InternalServer(internal_app(
        SECRET, 60, steps.routes(), destination=agent_destination(NODE_HOST)), "127.0.0.1",
        0).start()
    with db.write() as conn:
        conn.execute(sa_update(agents).where(agents.c.hostname == NODE_HOST).values(
            endpoint=node.agent.url[len("http://"):]))
    try:
        real_prepare = bind_attach.prepare

        def prepare_then_disable(attach, ticket):  # type: ignore[no-untyped-def]
            prepared = real_prepare(attach, ticket)
            with db.read() as conn:
                device = conn.execute(select(devices.c.uuid)).scalar_one()
            assert node.client.simulate_post(f"/accelerator/v2/devices/{device}/disable",
                                             headers=ADMIN).status_code == 200
            return prepared

        monkeypatch.setattr(bind_attach, "prepare", prepare_then_disable)
        uuid = node.bind()
        arq = node.arq(uuid)
        assert arq["state"] == "BindFailed", arq
        assert "disabled" in arq["bind_failure_reason"]
        assert [e["status"] for e in nova.events() if e["tag"] == uuid] == ["failed"]
        # The mdev made for it is undone through the release queue, then the handle is free.
        assert len(node.queue()) == 1 and node.prepared()
        assert node.release_all() == 1
        assert node.in_use() == [] and node.prepared() == set()
    finally:
        node.stop_agent()


def test_bind_reaching_a_device_whose_disable_is_not_committed_waits_and_fails(rig,
                                                                             monkeypatch):
    """A disable has written the status (not committed) -> a bind runs -> the disable
    commits. The bind waits for the device row, then sees the disable and refuses."""
    from acceld.db import devices as devices_db

    uuid = rig.start_bind()
    real_set = devices_db.set_status
    seen: dict[str, object] = {}

    def set_then_bind(conn, device_id, status, reason):  # type: ignore[no-untyped-def]
        changed = real_set(conn, device_id, status, reason)
        binder = Background(rig.db, rig.run_binds, name="bind")
        seen["bind"] = binder.finished_or_blocked()
        seen["binder"] = binder
        return changed

    monkeypatch.setattr(devices_db, "set_status", set_then_bind)
    rig.disable()
    monkeypatch.setattr(devices_db, "set_status", real_set)
    seen["binder"].join()  # type: ignore[attr-defined]
    assert seen["bind"] == "blocked"
    arq = rig.arq(uuid)
    assert arq["state"] == "BindFailed", arq
    assert "disabled" in arq["bind_failure_reason"]
    assert rig.nova_heard(uuid) == ["failed"]
    assert rig.handles_in_use() == 0
