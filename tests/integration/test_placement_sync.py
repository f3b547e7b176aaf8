"""The conductor's Placement sync against a real Placement (openstack-placement 16.0.0).

Every test names its own compute node (and so owns its providers) in the
session's shared Placement; resource classes and traits carry a per-test
suffix where a query must not see other tests' providers.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid as uuidlib
from typing import Any

import pytest
from sqlalchemy import delete, insert, select, update

from acceld.clients import placement as pl
from acceld.conductor.placement import checks as placement_checks
from acceld.conductor.binding.target import BindRefused
from acceld.conductor.placement.sync import HELD, PlacementSync
from acceld.db.placement_flags import mark_dirty, provider_uuid
from acceld.db.engine import Database
from acceld.db.models import agents, attributes, deployables, devices, placement_sync, utcnow
from tests.conftest import make_conf
from tests.support import inventory
from tests.support.placement import PlacementServer, assert_placement_matches_db


def assert_matches_db(placement: PlacementServer, db: Database, host: str, conf) -> None:
    assert_placement_matches_db(placement, db, host,
                                conf.conductor.reserve_devices_of_down_agents)

pytestmark = pytest.mark.integration


@pytest.fixture
def host() -> str:
    return f"cn-{uuidlib.uuid4().hex[:10]}"


def add_accelerator(db: Database, host: str, local: str, *, rc: str = "FPGA",
                    traits: tuple[str, ...] = (), num: int = 1, status: str = "enabled",
                    **device: Any) -> dict[str, Any]:
    """A device with one deployable named ``<host>_<local>``, as reconciliation stores it."""
    name = f"{host}_{local}"
    attrs = {"rc": rc, **{f"trait{i}": t for i, t in enumerate(traits)}}
    with db.write() as conn:
        dev = inventory.add_device(conn, hostname=host, status=status, **device)
        dep = inventory.add_deployable(conn, dev["id"], name=name, num_accelerators=num,
                                       rp_uuid=provider_uuid(name), attrs=attrs)
    return {"device": dev, "deployable": dep, "rp": dep["rp_uuid"]}


def sync_rows(db: Database, host: str) -> dict[str, Any]:
    with db.read() as conn:
        return {r.rp_uuid: r for r in conn.execute(
            select(placement_sync).where(placement_sync.c.hostname == host))}


def allocate(placement: PlacementServer, consumer: str, rps: dict[str, dict[str, int]]) -> None:
    resp = placement.put(f"/allocations/{consumer}", {
        "allocations": {rp: {"resources": res} for rp, res in rps.items()},
        "project_id": "p1", "user_id": "u1", "consumer_generation": None,
        "consumer_type": "INSTANCE"})
    assert resp.status_code == 204, resp.text


def candidates(placement: PlacementServer, rc: str, root: str) -> list[dict[str, Any]]:
    resp = placement.get("/allocation_candidates", resources=f"{rc}:1", in_tree=root)
    assert resp.status_code == 200, resp.text
    return resp.json()["allocation_requests"]


def test_providers_classes_traits_and_inventories_appear(placement, pconf, db, host, tag):
    root = placement.create_compute_node(host)
    fpga = add_accelerator(db, host, "0000:5e:00.0", rc="FPGA",
                           traits=(f"CUSTOM_FPGA_{tag}", "CUSTOM_FPGA_INTEL"), num=2)
    qat = add_accelerator(db, host, "0000:3d:00.0", rc=f"CUSTOM_QAT_{tag}", type="QAT")
    sync = PlacementSync(pconf, db)

    result = sync.sync_once()

    assert sorted(result.written) == sorted([fpga["rp"], qat["rp"]])
    assert placement.get(f"/resource_classes/CUSTOM_QAT_{tag}").status_code == 200
    assert placement.get(f"/traits/CUSTOM_FPGA_{tag}").status_code == 204
    provider = placement.get(f"/resource_providers/{fpga['rp']}").json()
    assert provider["name"] == f"{host}_0000:5e:00.0"
    assert provider["parent_provider_uuid"] == root
    inv = placement.get(f"/resource_providers/{fpga['rp']}/inventories").json()["inventories"]
    assert inv["FPGA"]["total"] == inv["FPGA"]["max_unit"] == 2
    assert inv["FPGA"]["reserved"] == 0
    traits = placement.get(f"/resource_providers/{qat['rp']}/traits").json()["traits"]
    assert traits == ["OWNER_CYBORG"]
    assert_matches_db(placement, db, host, pconf)
    rows = sync_rows(db, host)
    assert {rp: (r.dirty, r.generation) for rp, r in rows.items()} == {
        fpga["rp"]: (False, provider["generation"]),
        qat["rp"]: (False, placement.get(f"/resource_providers/{qat['rp']}").json()["generation"])}

    # Nothing changed: nothing written, on a full pass or a dirty-only one.
    assert sync.sync_once().written == []
    assert sync.sync_once(full=False).written == []


def test_changes_follow_the_hardware(placement, pconf, db, host, tag):
    placement.create_compute_node(host)
    acc = add_accelerator(db, host, "0000:5e:00.0", traits=(f"CUSTOM_A_{tag}",), num=1)
    sync = PlacementSync(pconf, db)
    sync.sync_once()

    with db.write() as conn:
        conn.execute(update(attributes).where(
            attributes.c.deployable_id == acc["deployable"]["id"],
            attributes.c.key == "trait0").values(value=f"CUSTOM_B_{tag}"))
        conn.execute(update(attributes).where(
            attributes.c.deployable_id == acc["deployable"]["id"],
            attributes.c.key == "rc").values(value=f"CUSTOM_RC_{tag}"))
        conn.execute(update(deployables).where(
            deployables.c.id == acc["deployable"]["id"]).values(num_accelerators=4))
    # Unflagged: a dirty-only pass does not look; the full pass notices the new digest.
    assert sync.sync_once(full=False).written == []
    assert sync.sync_once(full=True).written == [acc["rp"]]
    assert_matches_db(placement, db, host, pconf)
    traits = placement.get(f"/resource_providers/{acc['rp']}/traits").json()["traits"]
    assert sorted(traits) == sorted(["OWNER_CYBORG", f"CUSTOM_B_{tag}"])

    # Flagged: the dirty-only pass writes it.
    with db.write() as conn:
        conn.execute(update(deployables).where(
            deployables.c.id == acc["deployable"]["id"]).values(num_accelerators=3))
        mark_dirty(conn, hostname=host)
    assert sync.sync_once(full=False).written == [acc["rp"]]
    assert_matches_db(placement, db, host, pconf)


def test_new_deployable_flagged_by_host_is_written_by_dirty_pass(placement, pconf, sqlite_db,
                                                                 host):
    placement.create_compute_node(host)
    sync = PlacementSync(pconf, sqlite_db)
    acc = add_accelerator(sqlite_db, host, "0000:5e:00.0")
    with sqlite_db.write() as conn:
        mark_dirty(conn, hostname=host)
    assert sync.sync_once(full=False).written == [acc["rp"]]
    assert_matches_db(placement, sqlite_db, host, pconf)


def test_refused_provider_is_logged_and_retried_by_the_full_pass(placement, pconf, sqlite_db,
                                                                 host, caplog):
    db = sqlite_db
    placement.create_compute_node(host)
    bad = add_accelerator(db, host, "0000:5e:00.0", traits=("HW_NO_SUCH_STANDARD_TRAIT",))
    good = add_accelerator(db, host, "0000:5f:00.0")
    sync = PlacementSync(pconf, db)

    with caplog.at_level(logging.ERROR, logger="acceld.conductor.placement.sync"):
        result = sync.sync_once()
    assert result.failed == [bad["rp"]] and result.written == [good["rp"]]
    assert "HW_NO_SUCH_STANDARD_TRAIT" in caplog.text
    assert sync_rows(db, host)[bad["rp"]].digest is None
    assert sync.sync_once(full=False).failed == []  # not hammered by the fast pass

    with db.write() as conn:
        conn.execute(update(attributes).where(
            attributes.c.deployable_id == bad["deployable"]["id"],
            attributes.c.key == "trait0").values(value="CUSTOM_FIXED"))
    assert sync.sync_once(full=True).written == [bad["rp"]]
    assert_matches_db(placement, db, host, pconf)


def test_removed_deployable_removes_its_provider(placement, pconf, db, host):
    placement.create_compute_node(host)
    keep = add_accelerator(db, host, "0000:5e:00.0")
    gone = add_accelerator(db, host, "0000:5f:00.0")
    sync = PlacementSync(pconf, db)
    sync.sync_once()

    with db.write() as conn:
        conn.execute(delete(devices).where(devices.c.id == gone["device"]["id"]))
        mark_dirty(conn, hostname=host)
    result = sync.sync_once(full=False)

    assert result.deleted == [gone["rp"]]
    assert placement.get(f"/resource_providers/{gone['rp']}").status_code == 404
    assert set(sync_rows(db, host)) == {keep["rp"]}
    assert_matches_db(placement, db, host, pconf)


def test_refused_removal_stays_flagged_and_other_hosts_go_on(placement, pconf, sqlite_db, host,
                                                            monkeypatch):
    db = sqlite_db
    other = f"{host}-other"
    placement.create_compute_node(host)
    placement.create_compute_node(other)
    gone = add_accelerator(db, host, "0000:5e:00.0")
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    with db.write() as conn:
        conn.execute(delete(devices).where(devices.c.id == gone["device"]["id"]))
        mark_dirty(conn, hostname=host)
    later = add_accelerator(db, other, "0000:5e:00.0")
    with db.write() as conn:
        mark_dirty(conn, hostname=other)
    refusal = pl.PlacementError("Placement DELETE: 400 refused", 400, None)

    def refuse(rp_uuid):
        raise refusal

    monkeypatch.setattr(sync.client, "delete_provider", refuse)
    result = sync.sync_once(full=False)

    assert result.failed == [gone["rp"]]
    assert sync_rows(db, host)[gone["rp"]].dirty  # not lost: flagged for the next pass
    assert placement.get(f"/resource_providers/{later['rp']}").status_code == 200
    monkeypatch.undo()
    assert sync.sync_once(full=False).deleted == [gone["rp"]]
    assert placement.get(f"/resource_providers/{gone['rp']}").status_code == 404


def test_removed_but_allocated_provider_is_held_then_deleted(placement, pconf, sqlite_db, host,
                                                             caplog):
    db = sqlite_db
    root = placement.create_compute_node(host)
    acc = add_accelerator(db, host, "0000:5e:00.0", num=2)
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    vm = str(uuidlib.uuid4())
    allocate(placement, vm, {root: {"VCPU": 1}, acc["rp"]: {"FPGA": 1}})

    with db.write() as conn:
        conn.execute(delete(devices).where(devices.c.id == acc["device"]["id"]))
    with caplog.at_level(logging.WARNING, logger="acceld.conductor.placement.sync"):
        result = sync.sync_once()

    assert result.held == [acc["rp"]] and result.deleted == []
    assert vm in caplog.text and acc["rp"] in caplog.text
    inv = placement.get(f"/resource_providers/{acc['rp']}/inventories").json()["inventories"]
    assert inv["FPGA"]["reserved"] == inv["FPGA"]["total"] == 2  # no new claims on it
    assert sync_rows(db, host)[acc["rp"]].digest == HELD
    assert sync.sync_once().held == [acc["rp"]]  # still held, still there

    assert placement.delete(f"/allocations/{vm}").status_code == 204
    assert sync.sync_once().deleted == [acc["rp"]]
    assert placement.get(f"/resource_providers/{acc['rp']}").status_code == 404
    assert sync_rows(db, host) == {}


@pytest.mark.parametrize("change", [{"status": "maintaining"}, {"acc_status": "setup_required"},
                                    {"vanished": True}])
def test_unavailable_device_is_fully_reserved_and_not_a_candidate(placement, pconf, sqlite_db,
                                                                  host, tag, change):
    db = sqlite_db
    root = placement.create_compute_node(host)
    rc = f"CUSTOM_ACC_{tag}"
    acc = add_accelerator(db, host, "0000:5e:00.0", rc=rc, num=2)
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    assert len(candidates(placement, rc, root)) == 1

    with db.write() as conn:
        conn.execute(update(devices).where(devices.c.id == acc["device"]["id"]).values(**change))
        mark_dirty(conn, device_uuid=acc["device"]["uuid"])
    assert sync.sync_once(full=False).written == [acc["rp"]]
    inv = placement.get(f"/resource_providers/{acc['rp']}/inventories").json()["inventories"]
    assert inv[rc]["reserved"] == inv[rc]["total"] == 2
    assert candidates(placement, rc, root) == []

    restore = {"status": "enabled", "acc_status": "ready", "vanished": False}
    with db.write() as conn:
        conn.execute(update(devices).where(devices.c.id == acc["device"]["id"]).values(**restore))
        mark_dirty(conn, device_uuid=acc["device"]["uuid"])
    assert sync.sync_once(full=False).written == [acc["rp"]]
    inv = placement.get(f"/resource_providers/{acc['rp']}/inventories").json()["inventories"]
    assert inv[rc]["reserved"] == 0
    assert len(candidates(placement, rc, root)) == 1


@pytest.mark.parametrize("reserve", [True, False])
def test_agent_down_reserves_its_devices_when_configured(placement, pconf, sqlite_db, host,
                                                         reserve):
    db = sqlite_db
    pconf.set_override("reserve_devices_of_down_agents", reserve, group="conductor")
    placement.create_compute_node(host)
    acc = add_accelerator(db, host, "0000:5e:00.0", num=3)
    with db.write() as conn:
        conn.execute(insert(agents).values(hostname=host, endpoint="127.0.0.1:1", state="up",
                                           created_at=utcnow(), last_seen_at=utcnow()))
    sync = PlacementSync(pconf, db)
    sync.sync_once()

    def reserved() -> int:
        inv = placement.get(f"/resource_providers/{acc['rp']}/inventories").json()
        return inv["inventories"]["FPGA"]["reserved"]

    assert reserved() == 0
    # The liveness sweep need not flag the host: a dirty-only pass notices the new state.
    for state, expected in (("down", 3 if reserve else 0), ("up", 0)):
        with db.write() as conn:
            conn.execute(update(agents).where(agents.c.hostname == host).values(state=state))
        written = sync.sync_once(full=False).written
        assert reserved() == expected, state
        assert written == ([acc["rp"]] if reserve else [])


def test_generation_conflict_is_reread_and_retried(placement, pconf, sqlite_db, host, tag):
    db = sqlite_db
    placement.create_compute_node(host)
    acc = add_accelerator(db, host, "0000:5e:00.0", num=1)
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    stored = sync_rows(db, host)[acc["rp"]].generation

    # Someone else (an operator, another service) changes the provider behind our back.
    assert placement.put(f"/traits/CUSTOM_OTHER_{tag}", {}).status_code in (201, 204)
    resp = placement.put(f"/resource_providers/{acc['rp']}/traits", {
        "resource_provider_generation": stored, "traits": [f"CUSTOM_OTHER_{tag}"]})
    assert resp.status_code == 200
    with db.write() as conn:
        conn.execute(update(deployables).where(
            deployables.c.id == acc["deployable"]["id"]).values(num_accelerators=2))
        mark_dirty(conn, device_uuid=acc["device"]["uuid"])

    result = sync.sync_once(full=False)

    assert result.written == [acc["rp"]] and result.failed == []
    # Our traits back, new inventory, and the other's trait kept (docs/placement.md).
    assert_placement_matches_db(placement, db, host, pconf.conductor.reserve_devices_of_down_agents,
                                kept={acc["rp"]: {"traits": {f"CUSTOM_OTHER_{tag}"}}})
    now = placement.get(f"/resource_providers/{acc['rp']}").json()["generation"]
    assert sync_rows(db, host)[acc["rp"]].generation == now > stored + 1


def test_client_gives_up_after_repeated_conflicts(placement, pconf, host):
    client = pl.from_conf(pconf)
    root = placement.create_compute_node(host)
    rp = client.ensure_provider(str(uuidlib.uuid4()), f"{host}_x", root)
    calls = []
    real = client.get_provider

    def meddle(uuid: str):  # every re-read is followed by a change from someone else
        found = real(uuid)
        calls.append(found.generation)
        placement.put(f"/resource_providers/{uuid}/traits", {
            "resource_provider_generation": found.generation,
            "traits": ["HW_CPU_X86_AVX"] if len(calls) % 2 else []})
        return found

    client.get_provider = meddle  # type: ignore[method-assign]
    with pytest.raises(pl.GenerationConflict):
        client.set_traits(rp.uuid, ["CUSTOM_Z"], None)
    assert len(calls) == pl.CONFLICT_RETRIES


def test_missing_compute_node_waits_and_others_go_on(placement, pconf, sqlite_db, host, caplog):
    db = sqlite_db
    other = f"{host}-b"
    placement.create_compute_node(other)
    waiting = add_accelerator(db, host, "0000:5e:00.0")
    fine = add_accelerator(db, other, "0000:5e:00.0")
    sync = PlacementSync(pconf, db)

    with caplog.at_level(logging.WARNING, logger="acceld.conductor.placement.sync"):
        result = sync.sync_once()
    assert result.written == [fine["rp"]]
    assert result.waiting_hosts == [host]
    assert f"Compute-node provider '{host}' not found in Placement" in caplog.text
    assert sync_rows(db, host)[waiting["rp"]].dirty is True
    assert placement.get(f"/resource_providers/{waiting['rp']}").status_code == 404

    # Within the backoff the host is not asked about again.
    assert sync.sync_once(full=False).waiting_hosts == [host]

    placement.create_compute_node(host)  # nova-compute started on that host
    sync._hosts_waiting[host].next_at = 0  # the backoff delay has passed
    assert sync.sync_once(full=False).written == [waiting["rp"]]
    assert_matches_db(placement, db, host, pconf)
    assert sync_rows(db, host)[waiting["rp"]].dirty is False


def test_placement_killed_while_syncing_then_back_ends_matching(placement, pconf, sqlite_db,
                                                                host):
    db = sqlite_db
    placement.create_compute_node(host)
    accs = [add_accelerator(db, host, f"0000:{n:02x}:00.0", num=n + 1) for n in range(6)]
    sync = PlacementSync(pconf, db)
    calls = 0
    real = sync.client._request

    def crash_mid_way(*args, **kwargs):  # Placement dies in the middle of the pass
        nonlocal calls
        calls += 1
        if calls == 8:
            placement.stop(kill=True)
        return real(*args, **kwargs)

    sync.client._request = crash_mid_way  # type: ignore[method-assign]
    try:
        assert sync.run() is None  # paused, with backoff
        assert sync._backoff.delay > 0
        assert sync.run() is None  # within the backoff: not even tried
        rows = sync_rows(db, host)
        unfinished = [a["rp"] for a in accs if a["rp"] not in rows or rows[a["rp"]].dirty]
        assert unfinished, "the crash should have left work to do"
        # The hardware keeps changing while Placement is away.
        with db.write() as conn:
            conn.execute(update(deployables).where(
                deployables.c.id == accs[0]["deployable"]["id"]).values(num_accelerators=9))
            mark_dirty(conn, hostname=host)
    finally:
        placement.start()
    sync._backoff.next_at = 0
    assert sync.run() is not None
    assert sync._backoff.delay == 0
    assert_matches_db(placement, db, host, pconf)
    assert not any(r.dirty for r in sync_rows(db, host).values())


def test_slow_placement_times_out_and_is_retried(placement, pconf, sqlite_db, host):
    db = sqlite_db
    placement.create_compute_node(host)
    acc = add_accelerator(db, host, "0000:5e:00.0")
    pconf.set_override("timeout", 1, group="placement")
    sync = PlacementSync(pconf, db)
    os.killpg(placement.proc.pid, signal.SIGSTOP)  # it accepts connections, answers nothing
    try:
        started = time.monotonic()
        assert sync.run() is None
        assert time.monotonic() - started < 5
        assert sync._backoff.delay > 0
    finally:
        os.killpg(placement.proc.pid, signal.SIGCONT)
    sync._backoff.next_at = 0
    assert sync.run().written == [acc["rp"]]
    assert_matches_db(placement, db, host, pconf)


def test_without_placement_configured_the_component_does_nothing(tmp_path, sqlite_db, caplog):
    conf = make_conf(str(tmp_path))
    sync = PlacementSync(conf, sqlite_db)
    with caplog.at_level(logging.INFO, logger="acceld.conductor.placement.sync"):
        sync.start()
    assert sync.client is None
    assert sync.periodic_tasks() == []
    assert sync.run() is None
    assert "Placement is not configured" in caplog.text


def test_component_is_registered_with_the_conductor(pconf, sqlite_db):
    from acceld.conductor import service

    conductor = service.build(pconf, sqlite_db)
    syncs = [c for c in conductor.components if isinstance(c, PlacementSync)]
    assert len(syncs) == 1
    assert [t.name for t in syncs[0].periodic_tasks()] == ["placement-sync"]
    # Not one conductor for the cloud: each runs it for the hosts the ring gives it.
    assert not syncs[0].periodic_tasks()[0].exclusive
    assert hasattr(syncs[0], "use_ownership")


# -- bind checks --------------------------------------------------------------------------------

def test_bind_checks_against_placement(placement, pconf, sqlite_db, host):
    db = sqlite_db
    root = placement.create_compute_node(host)
    other = f"{host}-b"
    placement.create_compute_node(other)
    acc = add_accelerator(db, host, "0000:5e:00.0")
    elsewhere = add_accelerator(db, other, "0000:5e:00.0")
    PlacementSync(pconf, db).sync_once()
    client = pl.from_conf(pconf)
    vm = str(uuidlib.uuid4())

    with pytest.raises(BindRefused, match="not a resource provider in Placement"):
        placement_checks.check_bind(client, pconf, host, str(uuidlib.uuid4()), vm)
    with pytest.raises(BindRefused, match=f"not a provider of host {host}"):
        placement_checks.check_bind(client, pconf, host, elsewhere["rp"], vm)
    with pytest.raises(BindRefused, match="has no compute-node resource provider"):
        placement_checks.check_bind(client, pconf, f"{host}-none", acc["rp"], vm)
    with pytest.raises(BindRefused, match="no Placement allocation"):
        placement_checks.check_bind(client, pconf, host, acc["rp"], vm)

    allocate(placement, vm, {root: {"VCPU": 1}, acc["rp"]: {"FPGA": 1}})
    placement_checks.check_bind(client, pconf, host, acc["rp"], vm)  # passes

    pconf.set_override("check_allocations", False, group="placement")
    placement_checks.check_bind(client, pconf, host, acc["rp"], str(uuidlib.uuid4()))
    placement_checks.check_bind(None, pconf, "any", "any", "any")  # not configured: no check
    assert placement.delete(f"/allocations/{vm}").status_code == 204


def test_bind_check_lets_unavailability_through(pconf):
    pconf.set_override("endpoint", "http://127.0.0.1:1", group="placement")
    pconf.set_override("timeout", 2, group="placement")
    with pytest.raises(pl.PlacementUnavailable):
        placement_checks.check_bind(pl.from_conf(pconf), pconf, "h", str(uuidlib.uuid4()),
                                    str(uuidlib.uuid4()))
