"""An mdev bound under the earlier MDEV attach_info shape stays one handle after the upgrade.

Before the nvidia_gpu rewrite an MDEV handle's attach_info named its parent as ``parent`` and
the handle row had a random uuid; now it carries upstream Cyborg's keys (``domain``, ``bus``,
``device``, ``function``, ``asked_type``, ``vgpu_mark``) plus ``uuid``, and the row's uuid is
the mdev's. The first discovery after the upgrade reports the bound mdev in the new shape: the
reconcile must see the same mdev (same uuid, same parent) in the in-use row, never add a
second, free row for it (a second bind would hand the same vGPU out again, and the orphan
check would queue the release of the mdev a VM is using).

The whole path is real: the conductor's ``apply_report``, the API, the bind worker, the
node's attach routes (loopback) running the nvidia_gpu driver on a sysfs tree, the release
worker; on SQLite, PostgreSQL and MariaDB (``db`` fixture).
"""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import Any

import pytest
from falcon import testing
from sqlalchemy import insert, select, update

from acceld.agent.attach import AttachSteps
from acceld.api.app import build_app
from acceld.conductor.binding import target as bind_target
from acceld.conductor.binding.handle_release import ReleaseWorker
from acceld.placement_model import desired_providers
from acceld.conductor.reconcile import apply_report
from acceld.db import handle_releases
from acceld.db.models import accelerator_requests, agents, attach_handles
from acceld.drivers.base import HardwareRecord
from acceld.internal.auth import agent_destination
from acceld.internal.server import InternalServer, build_app as internal_app
from acceld.metrics.inventory import _handles as handle_counts
from tests.helpers import ADMIN, SERVICE
from tests.support.binds import bind_through_api, reconcile_with_a_bind_after_its_read
from tests.support.interleave import Background
from tests.support.sysfs_fixtures import SysfsTree
from tests.unit.test_driver_nvidia_gpu import driver

SECRET = b"test-secret-for-mdev-upgrade-0123456789ab"
HOST = "node1"  # tests.unit.test_driver_nvidia_gpu.driver's hostname
T4 = "0000:06:00.0"
TYPE = "nvidia-223"
DEPLOYABLE = f"{HOST}_{T4}_{TYPE}"
RP = str(uuidlib.uuid3(uuidlib.NAMESPACE_DNS, DEPLOYABLE))
ARQS = "/accelerator/v2/accelerator_requests"
V24 = {**SERVICE, "OpenStack-API-Version": "accelerator 2.4"}
NEW_KEYS = {"domain", "bus", "device", "function", "asked_type", "vgpu_mark", "uuid"}


def earlier_shape(info: dict[str, str]) -> dict[str, str]:
    """An MDEV attach_info as the driver wrote it before upstream's keys."""
    return {"parent": f"{info['domain']}:{info['bus']}:{info['device']}.{info['function']}",
            "asked_type": info["asked_type"], "vgpu_mark": info["vgpu_mark"],
            "uuid": info["uuid"]}


def report(records: list[HardwareRecord], old: bool = False) -> dict:
    hardware = [r.to_dict() for r in records]
    if old:
        for record in hardware:
            for dep in record["deployables"]:
                for handle in dep["attach_handles"]:
                    if handle["attach_type"] == "MDEV":
                        handle["attach_info"] = earlier_shape(handle["attach_info"])
    return {"hardware": hardware}


class Node:
    """A T4 serving GRID T4-2B through mdevs, its agent's attach routes, the API."""

    def __init__(self, tmp_path, db) -> None:
        self.db = db
        self.tree = SysfsTree(tmp_path / "sys")
        self.tree.add_pci(T4, "0x10de", "0x1eb8", "0x030200", driver="nvidia")
        self.type_dir = self.tree.add_mdev_type(T4, TYPE, "GRID T4-2B", 8)
        self.driver = driver(tmp_path, self.tree, use_nvml=False,
                             enabled_vgpu_types=["GRID T4-2B"])
        self.conf = self.driver.conf
        self.conf.set_override("shared_secret", SECRET.decode(), group="internal")
        steps = AttachSteps({self.driver.name: self.driver}.get, HOST)
        self.agent = InternalServer(internal_app(SECRET, 60, steps.routes(),
                                                 destination=agent_destination(HOST)),
                                    "127.0.0.1", 0).start()
        with db.write() as conn:
            conn.execute(insert(agents).values(hostname=HOST, state="up",
                                               endpoint=self.agent.url[len("http://"):],
                                               heartbeat_interval=10))
        self.client = testing.TestClient(build_app(self.conf, db))
        assert self.client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
            {"name": "vgpu", "groups": [{"resources:VGPU": "1"}]}]).status_code == 201

    def stop(self) -> None:
        self.agent.stop()

    def discover(self, old: bool = False) -> None:
        """The agent's discovery, applied by the conductor (``old``: the earlier shape)."""
        outcome = apply_report(self.db, HOST, report(self.driver.discover(), old=old))
        assert not outcome.describe_problems()

    def bind(self) -> str:
        return bind_through_api(self.client, self.conf, self.db, "vgpu", HOST, RP)

    def arq(self, uuid: str) -> dict:
        return self.client.simulate_get(f"{ARQS}/{uuid}", headers=V24).json

    def kernel_made(self, mdev: str) -> None:
        """What the kernel does on ``create`` (the sysfs tree is files only)."""
        assert (self.type_dir / "create").read_text() == mdev
        self.tree.add_mdev(T4, TYPE, mdev)
        (self.type_dir / "available_instances").write_text("7")

    def rows(self) -> list:
        with self.db.read() as conn:
            return conn.execute(select(attach_handles).order_by(attach_handles.c.id)).all()

    def rows_naming(self, mdev: str) -> list:
        return [r for r in self.rows() if json.loads(r.attach_info)["uuid"] == mdev]


@pytest.fixture
def node(tmp_path, db):
    built = Node(tmp_path, db)
    yield built
    built.stop()


def bound_before_the_upgrade(node: Node) -> tuple[str, str, int]:
    """Discovery and a bind as before the upgrade: earlier attach_info, random row uuids.
    Returns (ARQ uuid, mdev uuid, handle row id)."""
    node.discover(old=True)
    with node.db.write() as conn:  # the inventory then gave every handle a fresh uuid
        for row in node.rows():
            conn.execute(update(attach_handles).where(attach_handles.c.id == row.id)
                         .values(uuid=str(uuidlib.uuid4())))
    arq_uuid = node.bind()
    arq = node.arq(arq_uuid)
    assert arq["state"] == "Bound", arq.get("bind_failure_reason")
    assert set(arq["attach_handle_info"]) == {"parent", "asked_type", "vgpu_mark", "uuid"}
    mdev = arq["attach_handle_info"]["uuid"]
    node.kernel_made(mdev)
    [row] = node.rows_naming(mdev)
    return arq_uuid, mdev, row.id


def test_an_mdev_bound_in_the_earlier_shape_stays_one_handle_in_use(node):
    arq_uuid, mdev, row_id = bound_before_the_upgrade(node)

    node.discover()  # the upgraded agent: upstream's keys

    [row] = node.rows_naming(mdev)
    assert row.id == row_id and row.in_use
    assert set(json.loads(row.attach_info)) == NEW_KEYS  # the row took the reported info
    assert row.uuid == mdev  # and the handle uuid the new contract gives it
    arq = node.arq(arq_uuid)
    assert arq["state"] == "Bound"
    assert arq["attach_handle_uuid"] == mdev
    assert arq["attach_handle_info"]["uuid"] == mdev
    rows = node.rows()
    assert len(rows) == 8 and all(set(json.loads(r.attach_info)) == NEW_KEYS for r in rows)
    assert len({r.uuid for r in rows}) == 8
    with node.db.read() as conn:
        assert conn.execute(select(accelerator_requests.c.attach_handle_id).where(
            accelerator_requests.c.uuid == arq_uuid)).scalar() == row_id
        # Inventory counts: 1 in use, 7 free, as Placement's 8 less the one allocated.
        counts = {tuple(s.labels.values()): s.value for s in handle_counts(conn).samples}
        assert counts == {("VGPU", "in_use"): 1, ("VGPU", "free"): 7}
        provider = desired_providers(conn, [HOST], False)[RP]
        assert (provider.total, provider.reserved) == (8, 0)

    # The agent's report of the mdevs acceld made: the bound one is not an orphan.
    prepared = [(node.driver.name, h.attach_type, h.attach_info)
                for h in node.driver.prepared_attach_handles()]
    assert [info["uuid"] for _, _, info in prepared] == [mdev]
    outcome = handle_releases.queue_orphans(node.db, HOST, prepared)
    assert outcome["queued"] == [] and outcome["in_use"] == [mdev]

    node.discover()  # steady: nothing more changes
    assert [(r.id, r.uuid, r.in_use) for r in node.rows()] == [
        (r.id, r.uuid, r.in_use) for r in rows]


def test_the_adopted_handle_is_released_and_reused(node):
    arq_uuid, mdev, row_id = bound_before_the_upgrade(node)
    node.discover()
    assert node.client.simulate_delete(f"{ARQS}?arqs={arq_uuid}",
                                       headers=SERVICE).status_code == 204
    assert ReleaseWorker(node.conf, node.db).run_once() == 1
    assert (node.tree.device_dir(T4) / mdev / "remove").read_text() == "1"
    [row] = node.rows_naming(mdev)
    assert row.id == row_id and not row.in_use


def test_a_split_left_by_an_earlier_reconcile_is_mended(node):
    """A database already reconciled by the code that split them (a free new-shape row
    beside the in-use old one): the free duplicate goes, the in-use row takes its info."""
    arq_uuid, mdev, row_id = bound_before_the_upgrade(node)
    [old] = node.rows_naming(mdev)
    new_info = {**{k: v for k, v in json.loads(old.attach_info).items() if k != "parent"},
                "domain": "0000", "bus": "06", "device": "00", "function": "0"}
    with node.db.write() as conn:
        conn.execute(insert(attach_handles).values(
            uuid=mdev, deployable_id=old.deployable_id, attach_type="MDEV",
            attach_info=json.dumps(new_info, sort_keys=True), in_use=False))
    node.discover()
    [row] = node.rows_naming(mdev)
    assert (row.id, row.uuid, row.in_use) == (row_id, mdev, True)
    assert node.arq(arq_uuid)["attach_handle_uuid"] == mdev
    assert sum(not r.in_use for r in node.rows()) == 7


def upgraded_report(node: Node) -> dict:
    return report(node.driver.discover())


def before_the_upgrade_unbound(node: Node) -> None:
    """Discovery as before the upgrade (earlier attach_info, random row uuids); no bind."""
    node.discover(old=True)
    with node.db.write() as conn:
        for row in node.rows():
            conn.execute(update(attach_handles).where(attach_handles.c.id == row.id)
                         .values(uuid=str(uuidlib.uuid4())))


def assert_one_row_per_mdev(node: Node, arq_uuid: str) -> None:
    arq = node.arq(arq_uuid)
    assert arq["state"] == "Bound", arq.get("bind_failure_reason")
    rows = node.rows()
    mdevs = [json.loads(r.attach_info)["uuid"] for r in rows]
    assert len(rows) == 8 and len(set(mdevs)) == 8
    assert all(set(json.loads(r.attach_info)) == NEW_KEYS for r in rows)
    [held] = [r for r in rows if r.in_use]
    assert arq["attach_handle_uuid"] == held.uuid == json.loads(held.attach_info)["uuid"]


def test_a_bind_that_commits_after_the_upgrade_reconcile_read(node, monkeypatch):
    """Reconcile reads the node (all handles free, earlier shape) -> a bind takes one and
    commits -> the reconcile applies the upgraded report: the row taken is updated in use,
    not left beside a new free row for the same mdev."""
    before_the_upgrade_unbound(node)
    arq_uuid = reconcile_with_a_bind_after_its_read(node.db, HOST, upgraded_report(node),
                                                    node.bind, monkeypatch)
    assert_one_row_per_mdev(node, arq_uuid)


def test_a_bind_in_flight_while_the_upgrade_reconcile_runs(node, monkeypatch):
    """A bind took a free earlier-shape handle (not committed) -> the upgraded report is
    applied -> the bind commits: the reconcile waits for it, then updates the row in use."""
    before_the_upgrade_unbound(node)
    upgraded = upgraded_report(node)
    real_take = bind_target.take_handle
    seen: dict[str, Any] = {}

    def take_then_reconcile(conn, target):  # type: ignore[no-untyped-def]
        real_take(conn, target)
        if "reconciler" not in seen:
            seen["reconciler"] = Background(node.db, lambda: apply_report(
                node.db, HOST, upgraded), name="reconcile")
            seen["reconcile"] = seen["reconciler"].finished_or_blocked()

    monkeypatch.setattr(bind_target, "take_handle", take_then_reconcile)
    arq_uuid = node.bind()
    monkeypatch.setattr(bind_target, "take_handle", real_take)
    seen["reconciler"].join()
    assert seen["reconcile"] == "blocked"
    assert_one_row_per_mdev(node, arq_uuid)
