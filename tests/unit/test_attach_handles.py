"""Attach handles with a host step (MDEV): prepared on bind, released after unbind/delete.

The fake driver simulates mdev handles (``attach_type = MDEV``) and records
each prepare and release. The agent's attach routes run on a loopback internal
server; the API, the bind worker and the release worker run in process on the
``db`` fixture (SQLite, PostgreSQL, MariaDB).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pytest
from falcon import testing
from sqlalchemy import insert, select, update

from acceld.agent.attach import AttachFailed, AttachSteps
from acceld.api.app import build_app
from acceld.conductor.binding.worker import BindWorker
from acceld.conductor.binding.handle_release import ReleaseWorker
from acceld.db import handle_releases, inventory
from acceld.db.models import agents, attach_handles, bind_jobs, utcnow
from acceld.db.models import handle_releases as releases_table
from acceld.drivers.base import AttachHandle, needs_attach_step
from acceld.drivers.fake import FakeDriver
from acceld.internal.auth import agent_destination
from acceld.internal.server import InternalServer, build_app as internal_app
from tests.conftest import make_conf
from tests.helpers import ADMIN, SERVICE
from tests.support.told import agent_told

SECRET = b"test-secret-for-attach-handles-0123456789"
HOST = "node-a"
ARQ_URL = "/accelerator/v2/accelerator_requests"
RP = str(uuid.uuid3(uuid.NAMESPACE_DNS, f"{HOST}_FakeDevice"))
V24 = {**SERVICE, "OpenStack-API-Version": "accelerator 2.4"}


class Node:
    """One fake node: driver, agent attach routes on loopback, inventory, API client."""

    def __init__(self, tmp_path, db, attach_type: str = "MDEV", handles: int = 2,
                 told: bool = True) -> None:
        self.spec = tmp_path / "spec.json"
        self.write_spec(attach_type=attach_type, handles=handles)
        self.conf = make_conf(str(tmp_path), fake_driver__spec_file=str(self.spec))
        self.conf.set_override("shared_secret", SECRET.decode(), group="internal")
        self.db = db
        self.fake = FakeDriver(self.conf, HOST)
        self.agent: InternalServer | None = None
        with db.write() as conn:
            inventory.reconcile_node(conn, HOST, self.fake.discover())
            if told:  # no agent server unless a test starts one (told=False: fencing tests)
                agent_told(conn)
            conn.execute(insert(agents).values(hostname=HOST, endpoint="127.0.0.1:9",
                                               state="up", heartbeat_interval=10))
        self.client = testing.TestClient(build_app(self.conf, db))
        name = f"dp-{uuid.uuid4().hex[:8]}"
        assert self.client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
            {"name": name, "groups": [{"resources:FPGA": "1"}]}]).status_code == 201
        self.profile = name

    def write_spec(self, attach_type: str = "MDEV", handles: int = 2,
                   fail: list[str] | None = None) -> None:
        self.spec.write_text(json.dumps([{"type": "FPGA", "attach_type": attach_type,
                                          "attach_handles": handles,
                                          "fail_attach": fail or []}]))

    def start_agent(self) -> None:
        steps = AttachSteps({"fake": self.fake}.get, HOST)
        self.agent = InternalServer(internal_app(SECRET, 60, steps.routes(),
                                                 destination=agent_destination(HOST)),
                                    "127.0.0.1", 0).start()
        with self.db.write() as conn:
            conn.execute(update(agents).where(agents.c.hostname == HOST).values(
                endpoint=self.agent.url[len("http://"):]))

    def stop_agent(self) -> None:
        if self.agent is not None:
            self.agent.stop()
            self.agent = None

    def start_bind(self) -> str:
        """Create an ARQ and ask for its bind (202); no worker runs yet."""
        [arq] = self.client.simulate_post(ARQ_URL, json={"device_profile_name": self.profile},
                                          headers=SERVICE).json["arqs"]
        ops = [{"op": "add", "path": "/hostname", "value": HOST},
               {"op": "add", "path": "/device_rp_uuid", "value": RP},
               {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())}]
        assert self.client.simulate_patch(ARQ_URL, json={arq["uuid"]: ops},
                                          headers=SERVICE).status_code == 202
        return arq["uuid"]

    def bind(self, worker: BindWorker | None = None) -> str:
        arq_uuid = self.start_bind()
        worker = worker or BindWorker(self.conf, self.db)
        while worker.run_once():
            pass
        return arq_uuid

    def arq(self, arq_uuid: str) -> dict:
        return self.client.simulate_get(f"{ARQ_URL}/{arq_uuid}", headers=V24).json

    def unbind(self, arq_uuid: str) -> None:
        ops = [{"op": "remove", "path": "/hostname"}, {"op": "remove", "path": "/device_rp_uuid"},
               {"op": "remove", "path": "/instance_uuid"}]
        assert self.client.simulate_patch(ARQ_URL, json={arq_uuid: ops},
                                          headers=SERVICE).status_code == 202

    def in_use(self) -> list[str]:
        with self.db.read() as conn:
            return list(conn.execute(select(attach_handles.c.attach_info).where(
                attach_handles.c.in_use.is_(True)).order_by(attach_handles.c.id)).scalars())

    def queue(self) -> list:
        with self.db.read() as conn:
            return list(handle_releases.pending(conn))

    def prepared(self) -> set[str]:
        return set(self.fake.attach_state().get("prepared", {}))

    def release_all(self) -> int:
        return ReleaseWorker(self.conf, self.db).run_once()

    def make_due(self) -> None:
        with self.db.write() as conn:
            conn.execute(update(releases_table).values(lease_expires_at=None))


@pytest.fixture
def node(tmp_path, db):
    built = Node(tmp_path, db)
    built.start_agent()
    yield built
    built.stop_agent()


def after_bind_timeout(node: Node) -> BindWorker:
    """A bind worker whose clock is past every job's ``[conductor] bind_timeout``."""
    late = utcnow() + dt.timedelta(seconds=node.conf.conductor.bind_timeout + 1)
    return BindWorker(node.conf, node.db, clock=lambda: late)


def mdev_uuid(info_text: str) -> str:
    return json.loads(info_text)["uuid"]


def test_the_rule_names_mdev_and_vfio_vgpu_handles_only():
    assert needs_attach_step("MDEV", {"uuid": "x"})
    assert needs_attach_step("PCI", {"domain": "0000", "vgpu_type": "NVIDIA A10-4Q"})
    assert not needs_attach_step("PCI", {"domain": "0000", "bus": "5e"})
    assert not needs_attach_step("TEST_PCI", {"domain": "0000", "bus": "0c"})


def test_bind_prepares_unbind_releases_through_the_queue(node):
    arq_uuid = node.bind()
    arq = node.arq(arq_uuid)
    assert arq["state"] == "Bound", arq.get("bind_failure_reason")
    assert arq["attach_handle_type"] == "MDEV"
    [held] = node.in_use()
    assert node.prepared() == {mdev_uuid(held)}
    node.unbind(arq_uuid)
    assert node.arq(arq_uuid)["state"] == "Unbound"
    # Not reusable until the host removed the mdev.
    assert node.in_use() == [held]
    [queued] = node.queue()
    assert (queued.hostname, queued.driver_name, queued.attempts) == (HOST, "fake", 0)
    assert node.release_all() == 1
    assert node.in_use() == [] and node.queue() == [] and node.prepared() == set()
    assert node.fake.attach_state()["log"] == [["prepare", mdev_uuid(held)],
                                               ["release", mdev_uuid(held)]]


def test_delete_releases_through_the_queue(node):
    arq_uuid = node.bind()
    assert node.arq(arq_uuid)["state"] == "Bound"
    assert node.client.simulate_delete(f"{ARQ_URL}?arqs={arq_uuid}",
                                       headers=SERVICE).status_code == 204
    assert len(node.in_use()) == 1 and len(node.queue()) == 1
    assert node.release_all() == 1
    assert node.in_use() == [] and node.queue() == [] and node.prepared() == set()


def test_prepare_failure_fails_the_bind_and_frees_the_handle(node):
    node.write_spec(fail=["prepare"])
    arq = node.arq(node.bind())
    assert arq["state"] == "BindFailed"
    assert "preparing attach handle" in arq["bind_failure_reason"]
    assert "simulated failure to prepare" in arq["bind_failure_reason"]
    assert arq["attach_handle_uuid"] is None
    assert node.in_use() == [] and node.queue() == [] and node.prepared() == set()
    node.write_spec()
    assert node.arq(node.bind())["state"] == "Bound"  # the handle was given back


def test_release_is_retried_while_the_agent_is_unreachable(node):
    node.write_spec(handles=1)
    with node.db.write() as conn:  # the node now has one handle
        inventory.reconcile_node(conn, HOST, node.fake.discover())
    arq_uuid = node.bind()
    assert node.arq(arq_uuid)["state"] == "Bound"
    node.stop_agent()
    node.unbind(arq_uuid)
    assert node.release_all() == 1
    [row] = node.queue()
    assert row.attempts == 1 and "could not be reached" in row.last_error
    assert row.lease_owner is None and row.lease_expires_at is not None  # backed off
    assert node.release_all() == 0  # not due yet
    assert len(node.in_use()) == 1
    # The only handle is still held: a new bind cannot take it.
    node.start_agent()
    failed = node.arq(node.bind())
    assert failed["state"] == "BindFailed" and "no free attach handle" in \
        failed["bind_failure_reason"]
    with node.db.write() as conn:
        conn.execute(update(agents).values(state="down"))
    node.make_due()
    assert node.release_all() == 1
    [row] = node.queue()
    assert row.attempts == 2 and "down" in row.last_error
    with node.db.write() as conn:
        conn.execute(update(agents).values(state="up"))
    node.make_due()
    assert node.release_all() == 1
    assert node.queue() == [] and node.in_use() == [] and node.prepared() == set()


def test_release_failure_by_the_driver_keeps_the_handle(node):
    arq_uuid = node.bind()
    node.write_spec(fail=["release"])
    node.unbind(arq_uuid)
    node.release_all()
    [row] = node.queue()
    assert "simulated failure to release" in row.last_error
    assert len(node.in_use()) == 1 and len(node.prepared()) == 1
    node.write_spec()
    node.make_due()
    node.release_all()
    assert node.queue() == [] and node.in_use() == [] and node.prepared() == set()


def test_crash_between_taking_and_preparing_reuses_the_held_handle(node):
    worker = BindWorker(node.conf, node.db)
    worker._finish_prepared = lambda *args: False  # the conductor dies after the first commit
    arq_uuid = node.bind(worker)
    assert node.arq(arq_uuid)["state"] == "BindStarted"
    [held] = node.in_use()
    assert node.prepared() == set()
    with node.db.write() as conn:  # its lease expires
        conn.execute(update(bind_jobs).values(lease_expires_at=None, lease_owner=None))
    while BindWorker(node.conf, node.db).run_once():
        pass
    arq = node.arq(arq_uuid)
    assert arq["state"] == "Bound"
    assert node.in_use() == [held] and node.prepared() == {mdev_uuid(held)}


def test_unbind_while_preparing_queues_the_release(node):
    worker = BindWorker(node.conf, node.db)
    worker._finish_prepared = lambda *args: False
    arq_uuid = node.bind(worker)
    assert len(node.in_use()) == 1
    node.unbind(arq_uuid)
    assert node.arq(arq_uuid)["state"] == "Unbound"
    assert len(node.queue()) == 1
    assert BindWorker(node.conf, node.db).run_once() == 0  # the job went with the unbind
    node.release_all()
    assert node.in_use() == [] and node.queue() == []


def test_unreachable_agent_on_bind_retries_then_fails_and_queues_the_release(node):
    node.stop_agent()
    worker = BindWorker(node.conf, node.db)
    arq_uuid = node.bind(worker)
    assert node.arq(arq_uuid)["state"] == "BindStarted"  # retried later, handle held
    assert len(node.in_use()) == 1
    for _ in range(6):  # an outage is waited out: the tries are not counted
        with node.db.write() as conn:
            conn.execute(update(bind_jobs).values(lease_expires_at=None))
        while worker.run_once():
            pass
    assert node.arq(arq_uuid)["state"] == "BindStarted"
    with node.db.write() as conn:
        conn.execute(update(bind_jobs).values(lease_expires_at=None))
    while after_bind_timeout(node).run_once():
        pass
    arq = node.arq(arq_uuid)
    assert arq["state"] == "BindFailed"
    assert "could not be reached" in arq["bind_failure_reason"]
    # Tries after the first held the handle: one of them may have prepared it before the
    # agent went away, so it is released on the host before anyone else gets it.
    assert len(node.in_use()) == 1 and len(node.queue()) == 1
    node.start_agent()
    assert node.release_all() == 1
    assert node.in_use() == [] and node.queue() == []


def test_pci_handles_cost_no_agent_call(tmp_path, db):
    node = Node(tmp_path, db, attach_type="TEST_PCI")  # no agent server at all
    arq_uuid = node.bind()
    assert node.arq(arq_uuid)["state"] == "Bound"
    node.unbind(arq_uuid)
    assert node.in_use() == [] and node.queue() == []
    assert node.fake.attach_state() == {}


# The agent's routes, without a database.

def _steps(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([{"type": "FPGA", "attach_type": "MDEV", "attach_handles": 1}]))
    fake = FakeDriver(make_conf(str(tmp_path), fake_driver__spec_file=str(spec)), HOST)
    [handle] = fake.discover()[0].deployables[0].attach_handles
    body = {"driver_name": "fake", "deployable_name": "FakeDevice", "attach_type": "MDEV",
            "attach_info": handle.attach_info}
    return AttachSteps({"fake": fake}.get, HOST), fake, spec, body


def test_agent_steps_are_idempotent(tmp_path):
    steps, fake, _, body = _steps(tmp_path)
    uuid_ = body["attach_info"]["uuid"]
    assert steps.run("prepare", body)["attach_info"] == body["attach_info"]
    assert steps.run("prepare", body)["attach_type"] == "MDEV"
    assert set(fake.attach_state()["prepared"]) == {uuid_}
    assert steps.run("release", body) == {"released": True}
    assert steps.run("release", body) == {"released": True}
    assert fake.attach_state()["prepared"] == {}


@pytest.mark.parametrize("change, status, words", [
    ({"driver_name": "nvidia_gpu"}, 503, "not loaded"),
    ({"attach_type": "USB"}, 400, "attach_type must be"),
    ({"attach_info": {}}, 400, "attach_info"),
    ({"attach_info": {"uuid": 5}}, 400, "attach_info"),
    ({"deployable_name": ""}, 400, "deployable_name"),
    ({"extra": 1}, 400, "Unknown keys"),
    ({"attach_info": {"parent": "0000:99:00.0", "uuid": "u"}}, 502, "no simulated device"),
])
def test_agent_steps_refuse_with_the_right_status(tmp_path, change, status, words):
    steps, fake, _, body = _steps(tmp_path)
    with pytest.raises(AttachFailed) as caught:
        steps.run("prepare", {**body, **change})
    assert caught.value.status == status and words in caught.value.message
    assert fake.attach_state() == {}


def test_agent_driver_failure_is_502(tmp_path):
    steps, _, spec, body = _steps(tmp_path)
    spec.write_text(json.dumps([{"type": "FPGA", "attach_type": "MDEV", "attach_handles": 1,
                                 "fail_attach": ["release"]}]))
    with pytest.raises(AttachFailed) as caught:
        steps.run("release", body)
    assert caught.value.status == 502 and "simulated failure to release" in caught.value.message


def test_pci_handle_needs_nothing_from_the_fake_driver(tmp_path):
    _, fake, _, _ = _steps(tmp_path)
    handle = AttachHandle("TEST_PCI", {"domain": "0000", "bus": "0c", "device": "0",
                                       "function": "0"})
    assert fake.prepare_attach_handle(handle) is handle
    assert fake.attach_state() == {}
