"""A NIC VF bound before its attach_info gained ``physical_network`` stays one handle.

The nic driver's PCI handles now carry ``physical_network`` (upstream's NIC handles do); before,
their attach_info was the VF's ``domain``/``bus``/``device``/``function`` alone. Matched by
whole attach_info, the first discovery after the upgrade would add a second, free row for a
VF already bound under the earlier info, and a bind could hand that VF out again. A PCI
handle is its PCI function within its deployable (acceld.db.handle_identity): the stored row
takes the reported info in place, keeping its id, uuid, ``in_use`` and ARQ.

The path is real: the conductor's ``apply_report``, the API, the bind worker, the nic driver
on a sysfs tree; on SQLite, PostgreSQL and MariaDB (``db`` fixture).
"""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import Any

import pytest
from falcon import testing
from sqlalchemy import insert, select

from acceld.api.app import build_app
from acceld.placement_model import desired_providers
from acceld.conductor.reconcile import apply_report
from acceld.db.models import accelerator_requests, agents, attach_handles
from acceld.drivers.base import HardwareRecord
from acceld.metrics.inventory import _handles as handle_counts
from tests.helpers import ADMIN, SERVICE
from tests.support.binds import bind_through_api, reconcile_with_a_bind_after_its_read
from tests.support.sysfs_fixtures import SysfsTree
from tests.support.told import agent_told
from tests.unit.test_driver_nic import driver

HOST = "node1"  # tests.unit.test_driver_nic.driver's hostname
PF = "0000:5e:00.0"
VFS = ["0000:5e:02.0", "0000:5e:02.1"]
DEPLOYABLE = f"{HOST}_{PF}"
RP = str(uuidlib.uuid3(uuidlib.NAMESPACE_DNS, DEPLOYABLE))
ARQS = "/accelerator/v2/accelerator_requests"
V24 = {**SERVICE, "OpenStack-API-Version": "accelerator 2.4"}
PCI_KEYS = {"domain", "bus", "device", "function"}


def report(records: list[HardwareRecord], old: bool = False) -> dict:
    """A discovery as the agent sends it (``old``: PCI handles without physical_network)."""
    hardware = [r.to_dict() for r in records]
    if old:
        for record in hardware:
            for dep in record["deployables"]:
                for handle in dep["attach_handles"]:
                    handle["attach_info"].pop("physical_network", None)
    return {"hardware": hardware}


def address(info: dict[str, str]) -> str:
    return f"{info['domain']}:{info['bus']}:{info['device']}.{info['function']}"


class Node:
    """A PF with two VFs mapped to physnet2, the API, a bind worker."""

    def __init__(self, tmp_path, db) -> None:
        self.db = db
        self.tmp_path = tmp_path
        self.tree = SysfsTree(tmp_path / "sys")
        self.tree.add_pci(PF, "0x8086", "0x1572", "0x020000", driver="i40e")
        self.tree.add_netdev(PF, "enp94s0f0")
        self.tree.add_vfs(PF, VFS, "0x154c", driver="iavf", total=64)
        self.driver = driver(tmp_path, self.tree, ["physnet2:enp94s0f0"])
        self.conf = self.driver.conf
        with db.write() as conn:
            conn.execute(insert(agents).values(hostname=HOST, state="up",
                                               endpoint="127.0.0.1:9", heartbeat_interval=10))
        self.client = testing.TestClient(build_app(self.conf, db))
        assert self.client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
            {"name": "vf", "groups": [{"resources:CUSTOM_NIC": "1"}]}]).status_code == 201

    def discover(self, old: bool = False, physnet: str = "physnet2") -> None:
        """The agent's discovery, applied by the conductor (``old``: the earlier info)."""
        if physnet != "physnet2":
            self.driver = driver(self.tmp_path, self.tree, [f"{physnet}:enp94s0f0"])
        outcome = apply_report(self.db, HOST, report(self.driver.discover(), old=old))
        assert not outcome.describe_problems()
        with self.db.write() as conn:
            agent_told(conn)  # no agent server: PCI binds in one transaction

    def bind(self) -> str:
        return bind_through_api(self.client, self.conf, self.db, "vf", HOST, RP)

    def arq(self, uuid: str) -> dict:
        return self.client.simulate_get(f"{ARQS}/{uuid}", headers=V24).json

    def rows(self) -> list:
        with self.db.read() as conn:
            return conn.execute(select(attach_handles).order_by(attach_handles.c.id)).all()

    def rows_of(self, vf: str) -> list:
        return [r for r in self.rows() if address(json.loads(r.attach_info)) == vf]

    def counts(self) -> dict:
        with self.db.read() as conn:
            return {tuple(s.labels.values()): s.value for s in handle_counts(conn).samples}


@pytest.fixture
def node(tmp_path, db):
    return Node(tmp_path, db)


def bound_before_the_upgrade(node: Node) -> tuple[str, Any]:
    """Discovery and a bind as before the upgrade; (ARQ uuid, its handle row)."""
    node.discover(old=True)
    arq_uuid = node.bind()
    arq = node.arq(arq_uuid)
    assert arq["state"] == "Bound", arq.get("bind_failure_reason")
    assert set(arq["attach_handle_info"]) == PCI_KEYS
    [row] = node.rows_of(address(arq["attach_handle_info"]))
    assert row.in_use and node.counts() == {("CUSTOM_NIC", "in_use"): 1,
                                           ("CUSTOM_NIC", "free"): 1}
    return arq_uuid, row


def assert_bound_row_updated(node: Node, arq_uuid: str, before: Any, physnet: str) -> None:
    """One row per VF; the bound one is the row it was (id, uuid, in use, the ARQ's) with the
    reported info, which the API shows; counts as before."""
    rows = node.rows()
    assert sorted(address(json.loads(r.attach_info)) for r in rows) == VFS
    assert all(json.loads(r.attach_info)["physical_network"] == physnet for r in rows)
    [row] = node.rows_of(address(json.loads(before.attach_info)))
    assert (row.id, row.uuid, row.in_use) == (before.id, before.uuid, True)
    arq = node.arq(arq_uuid)
    assert arq["state"] == "Bound"
    assert arq["attach_handle_uuid"] == before.uuid
    assert arq["attach_handle_info"] == {**json.loads(before.attach_info),
                                         "physical_network": physnet}
    with node.db.read() as conn:
        assert conn.execute(select(accelerator_requests.c.attach_handle_id).where(
            accelerator_requests.c.uuid == arq_uuid)).scalar() == before.id
        provider = desired_providers(conn, [HOST], False)[RP]
        assert (provider.total, provider.reserved) == (2, 0)
    assert node.counts() == {("CUSTOM_NIC", "in_use"): 1, ("CUSTOM_NIC", "free"): 1}


def test_a_vf_bound_before_physical_network_stays_one_handle_in_use(node):
    arq_uuid, before = bound_before_the_upgrade(node)

    node.discover()  # the upgraded agent: handles carry physical_network
    assert_bound_row_updated(node, arq_uuid, before, "physnet2")
    steady = [(r.id, r.uuid, r.in_use, r.attach_info) for r in node.rows()]
    node.discover()  # nothing more changes
    assert [(r.id, r.uuid, r.in_use, r.attach_info) for r in node.rows()] == steady

    node.discover(physnet="physnet3")  # a value changes: the same rows take it
    assert_bound_row_updated(node, arq_uuid, before, "physnet3")
    assert [(r.id, r.uuid, r.in_use) for r in node.rows()] == [s[:3] for s in steady]

    # The free VF goes to the next bind, never the bound one again.
    second = node.arq(node.bind())
    assert second["state"] == "Bound" and second["attach_handle_uuid"] != before.uuid
    assert len(node.rows()) == 2


def test_a_split_left_by_an_earlier_reconcile_is_mended(node):
    """A database reconciled by the code that split them (a free row with the new info
    beside the in-use one): the free duplicate goes, the in-use row takes its info."""
    arq_uuid, before = bound_before_the_upgrade(node)
    info = {**json.loads(before.attach_info), "physical_network": "physnet2"}
    with node.db.write() as conn:
        conn.execute(insert(attach_handles).values(
            uuid=str(uuidlib.uuid4()), deployable_id=before.deployable_id, attach_type="PCI",
            attach_info=json.dumps(info, sort_keys=True), in_use=False))
    assert node.counts() == {("CUSTOM_NIC", "in_use"): 1, ("CUSTOM_NIC", "free"): 2}
    node.discover()
    assert_bound_row_updated(node, arq_uuid, before, "physnet2")


def bind_after_the_read(node: Node, upgraded: dict, monkeypatch) -> str:
    """Apply ``upgraded`` with a bind forced between the reconcile's read and its writes;
    the ARQ's uuid."""
    return reconcile_with_a_bind_after_its_read(node.db, HOST, upgraded, node.bind, monkeypatch)


def assert_one_row_per_vf_one_bound(node: Node, arq_uuid: str) -> None:
    arq = node.arq(arq_uuid)
    assert arq["state"] == "Bound", arq.get("bind_failure_reason")
    rows = node.rows()
    assert sorted(address(json.loads(r.attach_info)) for r in rows) == VFS
    assert all(json.loads(r.attach_info)["physical_network"] == "physnet2" for r in rows)
    [held] = [r for r in rows if r.in_use]
    assert arq["attach_handle_uuid"] == held.uuid
    assert arq["attach_handle_info"] == json.loads(held.attach_info)
    assert node.counts() == {("CUSTOM_NIC", "in_use"): 1, ("CUSTOM_NIC", "free"): 1}


def test_a_bind_that_commits_after_the_upgrade_reconcile_read(node, monkeypatch):
    """Reconcile reads the node (both VFs free, earlier info) -> a bind takes one and
    commits -> the reconcile applies the upgraded report: the row taken is updated in use,
    not left beside a new, free row for the same VF."""
    node.discover(old=True)
    arq_uuid = bind_after_the_read(node, report(node.driver.discover()), monkeypatch)
    assert_one_row_per_vf_one_bound(node, arq_uuid)


def test_a_split_mended_though_a_bind_took_the_old_row_after_the_read(node, monkeypatch):
    """A split left before (both rows of a VF free: the earlier info, the new) -> reconcile
    reads -> a bind takes the earlier-info row (the lowest id) and commits -> the reconcile
    sees it in use once it holds the device (not as its read had it): the free duplicate
    goes and the bound row takes the info."""
    node.discover(old=True)
    [first] = node.rows_of(VFS[0])
    info = {**json.loads(first.attach_info), "physical_network": "physnet2"}
    with node.db.write() as conn:
        conn.execute(insert(attach_handles).values(
            uuid=str(uuidlib.uuid4()), deployable_id=first.deployable_id, attach_type="PCI",
            attach_info=json.dumps(info, sort_keys=True), in_use=False))
    arq_uuid = bind_after_the_read(node, report(node.driver.discover()), monkeypatch)
    if not node.db.is_sqlite:  # there the bind ran after the reconcile: any free row
        assert node.arq(arq_uuid)["attach_handle_uuid"] == first.uuid
    assert_one_row_per_vf_one_bound(node, arq_uuid)
