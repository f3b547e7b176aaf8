"""The Placement drift audit against a real Placement (openstack-placement 16.0.0).

After a sync, each test changes Placement behind acceld's back with plain REST
calls (an operator with the ``openstack resource provider`` CLI, a restored
backup), runs the audit once, directly, and checks that Placement equals the
database again. The shared session Placement is used where a test only touches
its own compute node; tests that wipe or restore Placement's database, or stop
it, get a Placement of their own.
"""

from __future__ import annotations

import logging
import shutil
import uuid as uuidlib
from pathlib import Path
from typing import Any, Iterator

import pytest
from sqlalchemy import delete, update

from acceld.clients import placement as pl
from acceld.conductor.placement.sync import HELD, PlacementSync
from acceld.db.engine import Database
from acceld.db.models import attributes, devices
from acceld.db.placement_flags import mark_dirty
from tests.conftest import make_conf
from tests.integration.test_placement_sync import add_accelerator, allocate, sync_rows
from tests.support.placement import PlacementServer, assert_placement_matches_db

pytestmark = pytest.mark.integration


@pytest.fixture
def host() -> str:
    return f"au-{uuidlib.uuid4().hex[:10]}"


def conf_for(tmp_path: Path, server: PlacementServer):  # type: ignore[no-untyped-def]
    conf = make_conf(str(tmp_path))
    server.configure(conf)
    return conf


@pytest.fixture
def pconf(tmp_path, placement: PlacementServer):  # type: ignore[no-untyped-def]
    return conf_for(tmp_path, placement)


@pytest.fixture
def own_placement(tmp_path) -> Iterator[PlacementServer]:
    """A Placement of this test's own: it will be stopped, wiped or restored."""
    server = PlacementServer(tmp_path / "own-placement").start()
    yield server
    server.stop()


class RequestLog:
    """Every request acceld's client sends, as (method, path)."""

    def __init__(self, client: pl.PlacementClient) -> None:
        self.calls: list[tuple[str, str]] = []
        real = client.adapter.request

        def counting(path: str, method: str, **kwargs: Any) -> Any:
            self.calls.append((method, path))
            return real(path, method, **kwargs)

        client.adapter.request = counting

    def writes(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] != "GET"]

    def clear(self) -> None:
        self.calls.clear()


def matches(placement: PlacementServer, db: Database, host: str) -> None:
    assert_placement_matches_db(placement, db, host)


def two_devices(db: Database, host: str, tag: str) -> tuple[dict[str, Any], dict[str, Any]]:
    fpga = add_accelerator(db, host, "0000:5e:00.0", traits=(f"CUSTOM_AU_{tag}",), num=2)
    gpu = add_accelerator(db, host, "0000:af:00.0", rc="PGPU", type="GPU")
    return fpga, gpu


def generation(placement: PlacementServer, rp: str) -> int:
    return placement.get(f"/resource_providers/{rp}").json()["generation"]


# -- failed before: drift stayed forever, across restarts ------------------------------------

def test_conductor_start_repairs_drift_that_the_full_pass_never_saw(placement, pconf, db, host,
                                                                   tag, caplog):
    placement.create_compute_node(host)
    fpga, gpu = two_devices(db, host, tag)
    PlacementSync(pconf, db).sync_once()

    # By hand, behind acceld's back: one provider deleted, another's inventory edited.
    assert placement.delete(f"/resource_providers/{gpu['rp']}").status_code == 204
    resp = placement.put(f"/resource_providers/{fpga['rp']}/inventories", {
        "resource_provider_generation": generation(placement, fpga["rp"]),
        "inventories": {"FPGA": {"total": 7, "max_unit": 7, "reserved": 0}}})
    assert resp.status_code == 200, resp.text
    # The database's own record says all is written: the digest-only full pass sees nothing.
    assert PlacementSync(pconf, db).sync_once(full=True).written == []

    restarted = PlacementSync(pconf, db)  # a conductor (re)start
    with caplog.at_level(logging.INFO, logger="acceld.conductor"):
        restarted.run()
    matches(placement, db, host)
    line = [r.getMessage() for r in caplog.records if host in r.getMessage()
            and "drift" in r.getMessage()]
    assert len(line) == 1, caplog.text  # one line for the host, naming what drifted
    assert gpu["rp"] in line[0] and "missing" in line[0]
    assert fpga["rp"] in line[0] and "inventory" in line[0]


# -- what drifts, and its repair ---------------------------------------------------------------

def test_deleted_child_provider_is_recreated(placement, pconf, db, host, tag):
    root = placement.create_compute_node(host)
    fpga, gpu = two_devices(db, host, tag)
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    assert placement.delete(f"/resource_providers/{fpga['rp']}").status_code == 204

    result = sync.audit([host])

    assert result.audited == [host]
    assert list(result.repaired) == [host]
    assert any(fpga["rp"] in d and "missing" in d for d in result.repaired[host])
    matches(placement, db, host)
    provider = placement.get(f"/resource_providers/{fpga['rp']}").json()
    assert provider["parent_provider_uuid"] == root
    assert sync_rows(db, host)[fpga["rp"]].generation == provider["generation"]
    assert sync.audit([host]).repaired == {}  # repaired means repaired


def test_edited_inventory_total_and_class_are_restored_and_reserved_is_the_operators(
        placement, pconf, db, host, tag):
    placement.create_compute_node(host)
    fpga, gpu = two_devices(db, host, tag)
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    resp = placement.put(f"/resource_providers/{fpga['rp']}/inventories", {
        "resource_provider_generation": generation(placement, fpga["rp"]),
        "inventories": {"FPGA": {"total": 9, "max_unit": 9, "reserved": 9},
                        "VCPU": {"total": 4}}})
    assert resp.status_code == 200, resp.text
    resp = placement.put(f"/resource_providers/{gpu['rp']}/inventories", {
        "resource_provider_generation": generation(placement, gpu["rp"]),
        "inventories": {"PGPU": {"total": 3, "max_unit": 3, "reserved": 0}}})
    assert resp.status_code == 200, resp.text

    result = sync.audit([host])

    drift = " ".join(result.repaired[host])
    assert fpga["rp"] in drift and gpu["rp"] in drift and "inventory" in drift
    # total and the extra class are acceld's to put back; the reserved is the operator's
    # (docs/placement.md, "Ownership"), kept up to the total.
    assert "VCPU" in drift and "want FPGA total=2 reserved=2" in drift
    matches_kept = {fpga["rp"]: {"reserved": 9}}
    assert_placement_matches_db(placement, db, host, kept=matches_kept)


def test_traits_removed_by_hand_are_repaired_and_added_ones_kept(placement, pconf, db, host,
                                                                 tag):
    placement.create_compute_node(host)
    fpga, gpu = two_devices(db, host, tag)
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    assert placement.put(f"/traits/CUSTOM_HAND_{tag}", {}).status_code in (201, 204)
    # The FPGA loses its custom trait and gains a foreign one; the GPU loses OWNER_CYBORG.
    for rp, traits in ((fpga["rp"], ["OWNER_CYBORG", f"CUSTOM_HAND_{tag}"]), (gpu["rp"], [])):
        resp = placement.put(f"/resource_providers/{rp}/traits", {
            "resource_provider_generation": generation(placement, rp), "traits": traits})
        assert resp.status_code == 200, resp.text

    result = sync.audit([host])

    drift = " ".join(result.repaired[host])
    assert "traits" in drift and fpga["rp"] in drift and gpu["rp"] in drift
    assert f"CUSTOM_AU_{tag}" in drift
    assert f"CUSTOM_HAND_{tag}" not in drift  # the operator's: kept (docs/placement.md)
    assert_placement_matches_db(placement, db, host,
                                kept={fpga["rp"]: {"traits": {f"CUSTOM_HAND_{tag}"}}})


def test_renamed_and_reparented_providers_are_put_back(placement, pconf, db, host, tag):
    placement.create_compute_node(host)
    other_root = placement.create_compute_node(f"{host}-x")
    fpga, gpu = two_devices(db, host, tag)
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    resp = placement.put(f"/resource_providers/{fpga['rp']}", {
        "name": f"renamed-{host}", "parent_provider_uuid": placement.get(
            f"/resource_providers/{fpga['rp']}").json()["parent_provider_uuid"]})
    assert resp.status_code == 200, resp.text
    resp = placement.put(f"/resource_providers/{gpu['rp']}", {
        "name": f"{host}_0000:af:00.0", "parent_provider_uuid": other_root})
    assert resp.status_code == 200, resp.text

    # The tree the GPU was moved into is audited first: it is not that host's to delete.
    result = sync.audit([f"{host}-x", host])

    assert list(result.repaired) == [host]
    drift = " ".join(result.repaired[host])
    assert "name" in drift and "parent" in drift
    matches(placement, db, host)


def test_whole_host_tree_deleted_waits_for_nova_then_is_rebuilt(placement, pconf, db, host, tag,
                                                                caplog):
    root = placement.create_compute_node(host)
    fpga, gpu = two_devices(db, host, tag)
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    for rp in (fpga["rp"], gpu["rp"], root):
        assert placement.delete(f"/resource_providers/{rp}").status_code == 204

    with caplog.at_level(logging.WARNING, logger="acceld.conductor"):
        result = sync.audit([host])
        assert result.waiting_hosts == [host]
        assert all(r.dirty for r in sync_rows(db, host).values())
        # The flagged providers wait for the compute node, with one warning, like a new host.
        assert sync.sync_once(full=False).waiting_hosts == [host]
    assert f"Compute-node provider '{host}' not found" in caplog.text
    assert not [r for r in caplog.records if r.exc_info]

    placement.create_compute_node(host)  # nova-compute's next periodic update
    sync._hosts_waiting[host].next_at = 0
    assert sorted(sync.sync_once(full=False).written) == sorted([fpga["rp"], gpu["rp"]])
    matches(placement, db, host)
    assert sync.audit([host]).repaired == {}


def test_orphan_provider_of_ours_is_deleted_and_others_children_are_left(placement, pconf,
                                                                          sqlite_db, host, tag):
    db = sqlite_db
    root = placement.create_compute_node(host)
    fpga = add_accelerator(db, host, "0000:5e:00.0")
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    # Ours by its trait but unknown to the database (a backup's leftover); Nova's own child.
    orphan = str(uuidlib.uuid4())
    resp = placement.post("/resource_providers", {"uuid": orphan, "name": f"{host}_0000:01:00.0",
                                                  "parent_provider_uuid": root})
    assert resp.status_code == 200, resp.text
    assert placement.put(f"/resource_providers/{orphan}/traits", {
        "resource_provider_generation": resp.json()["generation"],
        "traits": ["OWNER_CYBORG"]}).status_code == 200
    novas = placement.post("/resource_providers", {"name": f"{host}_pci_0000_02_00_0",
                                                   "parent_provider_uuid": root}).json()["uuid"]

    result = sync.audit([host])

    assert any(orphan in d for d in result.repaired[host])
    assert placement.get(f"/resource_providers/{orphan}").status_code == 404
    assert placement.get(f"/resource_providers/{novas}").status_code == 200
    assert placement.get(f"/resource_providers/{fpga['rp']}").status_code == 200
    assert placement.delete(f"/resource_providers/{novas}").status_code == 204
    matches(placement, db, host)


def test_held_provider_edited_by_hand_is_reserved_again(placement, pconf, sqlite_db, host):
    db = sqlite_db
    root = placement.create_compute_node(host)
    acc = add_accelerator(db, host, "0000:5e:00.0", num=2)
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    vm = str(uuidlib.uuid4())
    allocate(placement, vm, {root: {"VCPU": 1}, acc["rp"]: {"FPGA": 1}})
    with db.write() as conn:
        conn.execute(delete(devices).where(devices.c.id == acc["device"]["id"]))
    assert sync.sync_once().held == [acc["rp"]]
    resp = placement.put(f"/resource_providers/{acc['rp']}/inventories", {
        "resource_provider_generation": generation(placement, acc["rp"]),
        "inventories": {"FPGA": {"total": 2, "max_unit": 2, "reserved": 0}}})
    assert resp.status_code == 200, resp.text

    result = sync.audit([host])

    assert any(acc["rp"] in d and "reserved" in d for d in result.repaired[host])
    inv = placement.get(f"/resource_providers/{acc['rp']}/inventories").json()["inventories"]
    assert inv["FPGA"]["reserved"] == inv["FPGA"]["total"] == 2
    assert sync_rows(db, host)[acc["rp"]].digest == HELD
    assert placement.delete(f"/allocations/{vm}").status_code == 204
    assert sync.audit([host]).repaired[host]  # free now: the audit deletes it
    assert placement.get(f"/resource_providers/{acc['rp']}").status_code == 404
    assert sync_rows(db, host) == {}


def test_device_removed_after_the_audit_read_the_database_is_removed_next_pass(placement, pconf,
                                                                              db, host, tag):
    placement.create_compute_node(host)
    fpga, gpu = two_devices(db, host, tag)
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    assert placement.delete(f"/resource_providers/{gpu['rp']}").status_code == 204
    real = sync.client.find_provider_by_name

    def reconcile_meanwhile(name: str) -> pl.Provider | None:
        # After the audit read the database, before it writes: the GPU leaves the host.
        with db.write() as conn:
            conn.execute(delete(devices).where(devices.c.id == gpu["device"]["id"]))
            mark_dirty(conn, hostname=host)
        sync.client.find_provider_by_name = real  # type: ignore[method-assign]
        return real(name)

    sync.client.find_provider_by_name = reconcile_meanwhile  # type: ignore[method-assign]
    assert any(gpu["rp"] in d for d in sync.audit([host]).repaired[host])  # stale repair

    assert sync_rows(db, host)[gpu["rp"]].dirty  # the audit's record keeps the new flag
    assert sync.sync_once(full=False).deleted == [gpu["rp"]]
    matches(placement, db, host)
    assert sync.audit([host]).repaired == {}


# -- restores and wipes (a Placement of the test's own) ------------------------------------------

def test_placement_restored_from_backup_is_repaired(own_placement, tmp_path, sqlite_db, host,
                                                    tag):
    db = sqlite_db
    conf = conf_for(tmp_path, own_placement)
    own_placement.create_compute_node(host)
    keep, gpu = two_devices(db, host, tag)
    gone = add_accelerator(db, host, "0000:3d:00.0", rc="CUSTOM_QAT", type="QAT")
    sync = PlacementSync(conf, db)
    sync.sync_once()
    backup = tmp_path / "placement-backup.sqlite"
    shutil.copy(own_placement.workdir / "placement.sqlite", backup)

    # Life goes on: a device leaves, one arrives, one is disabled, one changes traits.
    with db.write() as conn:
        conn.execute(delete(devices).where(devices.c.id == gone["device"]["id"]))
        conn.execute(update(devices).where(devices.c.id == gpu["device"]["id"])
                     .values(status="maintaining"))
        conn.execute(update(attributes).where(
            attributes.c.deployable_id == keep["deployable"]["id"],
            attributes.c.key == "trait0").values(value=f"CUSTOM_NEW_{tag}"))
        mark_dirty(conn, hostname=host)
    new = add_accelerator(db, host, "0000:86:00.0", num=4)
    with db.write() as conn:
        mark_dirty(conn, hostname=host)
    sync.sync_once(full=False)
    matches(own_placement, db, host)

    own_placement.stop()  # the operator restores last night's backup
    shutil.copy(backup, own_placement.workdir / "placement.sqlite")
    own_placement.start()
    assert own_placement.get(f"/resource_providers/{gone['rp']}").status_code == 200
    assert own_placement.get(f"/resource_providers/{new['rp']}").status_code == 404

    result = sync.audit([host])

    drift = " ".join(result.repaired[host])
    for acc in (keep, gpu, gone, new):
        assert acc["rp"] in drift
    matches(own_placement, db, host)
    assert own_placement.get(f"/resource_providers/{gone['rp']}").status_code == 404


def test_placement_database_wiped_is_rebuilt(own_placement, tmp_path, db, host, tag):
    conf = conf_for(tmp_path, own_placement)
    own_placement.create_compute_node(host)
    two_devices(db, host, tag)
    sync = PlacementSync(conf, db)
    sync.sync_once()

    own_placement.stop()
    (own_placement.workdir / "placement.sqlite").unlink()
    own_placement._synced = False  # placement-manage db sync again: an empty Placement
    own_placement.start()
    own_placement.create_compute_node(host)  # nova-compute registers again

    result = sync.audit([host])

    assert len(result.repaired[host]) >= 2
    matches(own_placement, db, host)


# -- cost -----------------------------------------------------------------------------------------

def test_audit_of_an_unchanged_cloud_writes_nothing_and_reads_per_tree(placement, pconf,
                                                                       sqlite_db, host, tag):
    db = sqlite_db
    hosts = [f"{host}-{n}" for n in range(3)]
    per_host = 4
    for name in hosts:
        placement.create_compute_node(name)
        for n in range(per_host):
            add_accelerator(db, name, f"0000:{n + 16:02x}:00.0", traits=(f"CUSTOM_AU_{tag}",))
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    log = RequestLog(sync.client)
    db_writes = []
    real_write = db.write

    def counting_write():  # type: ignore[no-untyped-def]
        db_writes.append(1)
        return real_write()

    db.write = counting_write  # type: ignore[method-assign]

    result = sync.audit(hosts)

    assert result.repaired == {} and result.audited == hosts
    assert log.writes() == []
    assert db_writes == []
    # Per host: the compute node by name, our providers of its tree in one call, then each
    # provider's inventories and traits; never one GET per provider where a tree call does.
    assert len(log.calls) == len(hosts) * (2 + 2 * per_host), log.calls
    tree_calls = [p for _, p in log.calls if "in_tree=" in p]
    assert len(tree_calls) == len(hosts)
    single = [p for _, p in log.calls if p.count("/") == 2 and "?" not in p]
    assert single == []  # no GET /resource_providers/{uuid} per provider


# -- scheduling: chunks, budget, interval --------------------------------------------------------

def test_audit_walks_all_hosts_in_chunks_then_waits_for_the_interval(placement, pconf, sqlite_db,
                                                                     host, tag):
    db = sqlite_db
    hosts = [f"{host}-{n}" for n in range(5)]
    accs = {}
    for name in hosts:
        placement.create_compute_node(name)
        accs[name] = add_accelerator(db, name, "0000:5e:00.0")
    pconf.set_override("audit_hosts_per_pass", 2, group="placement")
    pconf.set_override("audit_interval", 3600, group="placement")
    pconf.set_override("sync_interval", 60, group="placement")  # no time limit here
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    assert placement.delete(f"/resource_providers/{accs[hosts[4]]['rp']}").status_code == 204

    passes = [sync.run() for _ in range(4)]

    assert [p.audit.audited if p.audit else [] for p in passes] == [
        hosts[0:2], hosts[2:4], hosts[4:5], []]
    assert list(passes[2].audit.repaired) == [hosts[4]]
    for name in hosts:
        matches(placement, db, name)
    sync._audit_walk.next_at = 0  # the interval has passed: a new walk starts from the first host
    assert sync.run().audit.audited == hosts[0:2]


def test_a_slow_placement_spreads_the_walk_over_more_passes(placement, pconf, sqlite_db, host):
    db = sqlite_db
    hosts = [f"{host}-{n}" for n in range(3)]
    for name in hosts:
        placement.create_compute_node(name)
        add_accelerator(db, name, "0000:5e:00.0")
    pconf.set_override("sync_interval", 2.0, group="placement")
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    now = [0.0]
    sync._clock = lambda: now[0]  # type: ignore[method-assign]
    real = sync.client.find_provider_by_name

    def slow(name: str) -> pl.Provider | None:  # each host takes Placement 1.5 s
        now[0] += 1.5
        return real(name)

    sync.client.find_provider_by_name = slow  # type: ignore[method-assign]
    assert [sync.run().audit.audited for _ in range(2)] == [hosts[0:2], hosts[2:3]]


def test_audit_scope_is_every_known_host_and_can_be_narrowed(placement, pconf, sqlite_db, host):
    db = sqlite_db
    placement.create_compute_node(host)
    add_accelerator(db, host, "0000:5e:00.0")
    other = add_accelerator(db, f"{host}-b", "0000:5e:00.0")
    sync = PlacementSync(pconf, db)
    assert {host, f"{host}-b"} <= set(sync.audit_scope())
    # A later conductor-sharing scheme hands each conductor its hosts: the audit takes a list.
    sync.audit_scope = lambda: [host]  # type: ignore[method-assign]
    sync.sync_once()
    assert sync.run().audit.audited == [host]
    assert sync.audit([f"{host}-b"]).waiting_hosts == [f"{host}-b"]  # no compute node there
    assert placement.get(f"/resource_providers/{other['rp']}").status_code == 404


# -- outages -----------------------------------------------------------------------------------

def test_placement_outage_during_audit_is_logged_once_each_way(own_placement, tmp_path,
                                                               sqlite_db, host, caplog):
    db = sqlite_db
    conf = conf_for(tmp_path, own_placement)
    hosts = [f"{host}-{n}" for n in range(3)]
    for name in hosts:
        own_placement.create_compute_node(name)
        add_accelerator(db, name, "0000:5e:00.0")
    conf.set_override("timeout", 2, group="placement")
    sync = PlacementSync(conf, db)
    sync.sync_once()
    sync._next_full = float("inf")  # only the audit runs in the passes below
    gone = add_accelerator(db, hosts[0], "0000:5f:00.0")  # unflagged: the audit finds it

    own_placement.stop()
    with caplog.at_level(logging.DEBUG, logger="acceld.conductor"):
        for _ in range(4):
            assert sync.run() is None
            sync._backoff.next_at = 0  # the backoff delay has passed
        own_placement.start()
        result = sync.run()
    assert result.audit.audited == hosts  # the walk resumed from where it stopped
    assert gone["rp"] in " ".join(result.audit.repaired[hosts[0]])
    records = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert not [r for r in caplog.records if r.exc_info], "no traceback"
    # One WARNING each way (the process's outage log, acceld.outages); retries: debug.
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert [w.startswith("Placement is unavailable:") for w in warnings] == [True, False]
    assert warnings[1].startswith("Placement is available again"), warnings
    assert len([r for r in records if "paused" in r.getMessage()]) == 0
    assert len([r for r in caplog.records if "paused" in r.getMessage()]) == 4
    for name in hosts:
        matches(own_placement, db, name)


def test_a_host_placement_refuses_does_not_stop_the_others(placement, pconf, sqlite_db, host,
                                                           caplog):
    db = sqlite_db
    hosts = [f"{host}-{n}" for n in range(2)]
    accs = {}
    for name in hosts:
        placement.create_compute_node(name)
        accs[name] = add_accelerator(db, name, "0000:5e:00.0")
    sync = PlacementSync(pconf, db)
    sync.sync_once()
    for acc in accs.values():
        assert placement.delete(f"/resource_providers/{acc['rp']}").status_code == 204
    real = sync.client.ensure_provider

    def refuse_first(uuid: str, name: str, parent: str) -> pl.Provider:
        if name.startswith(hosts[0]):
            raise pl.PlacementError("Placement POST: 400 refused", 400)
        return real(uuid, name, parent)

    sync.client.ensure_provider = refuse_first  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="acceld.conductor"):
        result = sync.audit(hosts)
    assert result.failed == [accs[hosts[0]]["rp"]]
    assert list(result.repaired) == [hosts[1]]
    assert not [r for r in caplog.records if r.exc_info]
    matches(placement, db, hosts[1])
    row = sync_rows(db, hosts[0])[accs[hosts[0]]["rp"]]
    assert row.digest is None  # the next full pass writes it again
    sync.client.ensure_provider = real  # type: ignore[method-assign]
    assert sync.sync_once(full=True).written == [accs[hosts[0]]["rp"]]
    matches(placement, db, hosts[0])


def test_audit_options_exist_with_defaults(pconf):
    assert pconf.placement.audit_interval == 600.0
    assert pconf.placement.audit_hosts_per_pass == 20
    assert PlacementSync(pconf, None)._audit_walk.per_pass == 20  # type: ignore[arg-type]
