"""Retiring a host against a real Placement (openstack-placement 16.0.0): the providers go
with the conductor's next sync pass, also when Placement was away during the delete, and
a provider an instance still has allocations on is held fully reserved until it is free.

Each test names its own compute node, so it owns its providers in the shared Placement.
"""

from __future__ import annotations

import uuid as uuidlib

import pytest
from sqlalchemy import select, update

from acceld.conductor.placement.sync import HELD, PlacementSync
from acceld.db import host_retire
from acceld.db.models import agents, placement_sync
from tests.support.placement import PlacementServer
from tests.support.retire import HostRig, rp_of

pytestmark = pytest.mark.integration


@pytest.fixture
def host() -> str:
    return f"cn-{uuidlib.uuid4().hex[:10]}"


def _rig(db, tmp_path, placement: PlacementServer, host: str, agent_state: str = "down"
         ) -> tuple[HostRig, PlacementSync, str]:
    """The host in Placement (Nova's compute node) and in acceld, its provider written."""
    root = placement.create_compute_node(host)
    rig = HostRig(db, tmp_path, host=host, agent_state=agent_state)
    placement.configure(rig.conf)
    sync = PlacementSync(rig.conf, db)
    assert sync.sync_once().written == [rp_of(host)]
    provider = placement.get(f"/resource_providers/{rp_of(host)}").json()
    assert provider["parent_provider_uuid"] == root
    return rig, sync, root


def _owned(placement: PlacementServer, root: str) -> list[str]:
    """acceld's providers in the compute node's tree, as Placement lists them."""
    resp = placement.get("/resource_providers", in_tree=root, required="OWNER_CYBORG")
    assert resp.status_code == 200, resp.text
    return [p["uuid"] for p in resp.json()["resource_providers"]]


def _rows(db) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return [(r.rp_uuid, r.digest) for r in conn.execute(select(placement_sync))]


def test_retired_host_loses_its_providers_at_the_next_pass(placement, db, tmp_path, host):
    rig, sync, root = _rig(db, tmp_path, placement, host)
    assert _owned(placement, root) == [rp_of(host)]

    host_retire.retire(db, host)
    result = sync.sync_once(full=False)  # the flagged pass: no full comparison needed

    assert result.deleted == [rp_of(host)]
    assert placement.get(f"/resource_providers/{rp_of(host)}").status_code == 404
    assert _owned(placement, root) == []
    assert placement.get(f"/resource_providers/{root}").status_code == 200  # Nova's stays
    assert _rows(db) == []
    with pytest.raises(host_retire.HostNotFound):  # nothing of it is left
        host_retire.retire(db, host)
    assert sync.sync_once().deleted == []


def test_placement_away_during_the_delete_then_back(placement, sqlite_db, tmp_path, host):
    """The delete never calls Placement: it commits while Placement is down, and the
    conductor removes the provider once Placement answers again."""
    db = sqlite_db
    rig, sync, root = _rig(db, tmp_path, placement, host)
    placement.stop(kill=True)
    try:
        retired = host_retire.retire(db, host)
        assert retired.devices == 1 and retired.providers == 1
        assert rig.counts()["devices"] == 0 and rig.counts()["agent"] == 0
        assert sync.run() is None  # paused: Placement unreachable, retried with backoff
        assert sync._backoff.delay > 0
        assert [rp for rp, _ in _rows(db)] == [rp_of(host)]  # still to do
    finally:
        placement.start()
    assert placement.get(f"/resource_providers/{rp_of(host)}").status_code == 200
    sync._backoff.next_at = 0  # the backoff delay has passed
    result = sync.run()
    assert result is not None and result.deleted == [rp_of(host)]
    assert _owned(placement, root) == [] and _rows(db) == []


def test_forced_retire_holds_an_allocated_provider_until_it_is_free(placement, sqlite_db,
                                                                    tmp_path, host):
    """An instance bound there keeps its allocation (Nova removes it when the instance is
    deleted or evacuated): the provider is held with reserved = total, then deleted."""
    db = sqlite_db
    rig, sync, root = _rig(db, tmp_path, placement, host, agent_state="up")
    vm = str(uuidlib.uuid4())
    resp = placement.put(f"/allocations/{vm}", {
        "allocations": {root: {"resources": {"VCPU": 1}},
                        rp_of(host): {"resources": {"FPGA": 1}}},
        "project_id": "p1", "user_id": "u1", "consumer_generation": None,
        "consumer_type": "INSTANCE"})
    assert resp.status_code == 204, resp.text
    arq, _ = rig.bind(instance=vm)  # the bind checks that allocation

    with pytest.raises(host_retire.HostInUse):
        host_retire.retire(db, host)
    host_retire.retire(db, host, force=True)
    assert rig.arq(arq)["state"] == "BindFailed"
    result = sync.sync_once(full=False)

    assert result.held == [rp_of(host)] and result.deleted == []
    inv = placement.get(f"/resource_providers/{rp_of(host)}/inventories").json()["inventories"]
    assert inv["FPGA"]["reserved"] == inv["FPGA"]["total"]  # nobody new lands on it
    assert _rows(db) == [(rp_of(host), HELD)]
    assert placement.delete(f"/allocations/{vm}").status_code == 204  # instance deleted
    assert sync.sync_once().deleted == [rp_of(host)]
    assert _owned(placement, root) == [] and _rows(db) == []


def test_agent_back_after_a_retire_gets_its_providers_again(placement, sqlite_db, tmp_path,
                                                            host):
    """A retired host whose agent does come back is a new host: its report recreates the
    inventory and the sync recreates the provider under the same compute node."""
    db = sqlite_db
    rig, sync, root = _rig(db, tmp_path, placement, host)
    host_retire.retire(db, host)
    sync.sync_once(full=False)
    assert _owned(placement, root) == []
    rig.add_host(host, "up")
    with db.read() as conn:
        assert conn.execute(select(agents.c.state).where(agents.c.hostname == host)
                            ).scalar_one() == "up"
    with db.write() as conn:  # what reconciliation's flags do on a real report
        conn.execute(update(placement_sync).values(dirty=True))
    assert sync.sync_once(full=False).written == [rp_of(host)]
    assert _owned(placement, root) == [rp_of(host)]
