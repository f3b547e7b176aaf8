"""Explain against a real Placement (openstack-placement 16.0.0): Placement's candidates for
each group beside acceld's view, drift both ways, and Placement away.

The conductor's own sync (acceld.conductor.placement.sync) writes the providers, as in a
deployment; each test names its own compute nodes and gives its resource class and
traits a per-test suffix, so the shared Placement's other providers never answer.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

import pytest
from falcon import testing
from sqlalchemy import insert, select, update

from acceld.api.app import build_app
from acceld.conductor.placement.sync import PlacementSync
from acceld.db.engine import Database
from acceld.db.models import (accelerator_requests, agents, attach_handles, device_profiles,
                               devices, utcnow)
from acceld.db.placement_flags import provider_uuid
from tests.conftest import make_conf
from tests.helpers import ADMIN, version
from tests.support import inventory
from tests.support.net import free_port
from tests.support.placement import PlacementServer

pytestmark = pytest.mark.integration

URL = "/accelerator/v2/device_profiles"
V27 = version("2.7")


@pytest.fixture
def api(pconf, db) -> testing.TestClient:
    return testing.TestClient(build_app(pconf, db))


def add_accelerator(db: Database, host: str, rc: str, trait: str,
                    handles: int = 1) -> dict[str, Any]:
    name = f"{host}_fpga"
    with db.write() as conn:
        dev = inventory.add_device(conn, hostname=host)
        dep = inventory.add_deployable(conn, dev["id"], name=name, num_accelerators=handles,
                                       rp_uuid=provider_uuid(name),
                                       attrs={"rc": rc, "trait0": trait})
        found = inventory.add_attach_handles(conn, dep["id"], handles)
    return {"device": dev, "deployable": dep, "rp": dep["rp_uuid"], "handles": found}


def fleet(placement: PlacementServer, pconf, db: Database, tag: str,
          hosts: int = 2) -> tuple[list[str], list[dict[str, Any]], str, str]:
    """``hosts`` compute nodes in Placement, one accelerator each, synced by the conductor."""
    rc, trait = f"CUSTOM_EXPLAIN_{tag}", f"CUSTOM_T_{tag}"
    names = [f"ex-{tag.lower()}-{n}" for n in range(hosts)]
    accs = []
    for host in names:
        placement.create_compute_node(host)
        accs.append(add_accelerator(db, host, rc, trait))
    result = PlacementSync(pconf, db).sync_once()
    assert not result.failed and not result.waiting_hosts, result
    return names, accs, rc, trait


def profile(api: testing.TestClient, rc: str, trait: str, name: str = "dp", **more: str) -> None:
    group = {f"resources:{rc}": "1", f"trait:{trait}": "required", **more}
    result = api.simulate_post(URL, headers=ADMIN, json=[{"name": name, "groups": [group]}])
    assert result.status_code == 201, result.text


def explain(api: testing.TestClient, name: str = "dp", **params: str) -> dict[str, Any]:
    result = api.simulate_get(f"{URL}/{name}/explain", params=params or None,
                              headers={**ADMIN, **V27})
    assert result.status_code == 200, result.text
    return result.json


def provider(body: dict, rp: str) -> dict:
    [found] = [p for p in body["groups"][0]["acceld"]["providers"] if p["rp_uuid"] == rp]
    return found


def test_satisfiable_in_both_views(placement, pconf, db, api, tag):
    hosts, accs, rc, trait = fleet(placement, pconf, db, tag)
    profile(api, rc, trait)
    body = explain(api)
    assert body["verdict"] == f"satisfiable on 2 hosts: {hosts[0]}, {hosts[1]}"
    assert body["placement"] == {"status": "ok", "message": None}
    view = body["groups"][0]["placement"]
    assert view["query"] == f"resources_ACCEL0={rc}:1&required_ACCEL0={trait}"
    assert sorted(c["rp_uuid"] for c in view["candidates"]) == sorted(a["rp"] for a in accs)
    assert all(c["known_to_acceld"] and c["capacity"] == 1 and c["used"] == 0
               for c in view["candidates"])
    assert all(provider(body, a["rp"])["placement"] == "offered" for a in accs)
    # One host: Placement is asked within that host's tree (in_tree), as Nova would.
    one = explain(api, hostname=hosts[1])
    assert one["verdict"] == f"satisfiable on 1 host: {hosts[1]}"
    assert "in_tree_ACCEL0=" in one["groups"][0]["placement"]["query"]
    assert [c["rp_uuid"] for c in one["groups"][0]["placement"]["candidates"]] == [accs[1]["rp"]]


def test_forbidden_trait_and_member_of_reach_placement(placement, pconf, db, api, tag):
    hosts, accs, rc, trait = fleet(placement, pconf, db, tag, hosts=1)
    profile(api, rc, trait, **{"trait:CUSTOM_NEVER_" + tag: "forbidden"})
    # Placement refuses a query naming a trait it does not know, forbidden ones too: Nova's
    # would fail the same way, so the profile cannot be scheduled until the trait exists.
    body = explain(api)
    assert body["groups"][0]["placement"]["status"] == "refused"
    assert body["satisfiable"] is False
    assert [r["code"] for r in provider(body, accs[0]["rp"])["reasons"]] == ["placement_drift"]
    assert placement.put(f"/traits/CUSTOM_NEVER_{tag}", None).status_code == 201
    body = explain(api)
    assert body["satisfiable"] is True, (body["verdict"], body["groups"][0]["placement"])
    assert f"required_ACCEL0={trait},!CUSTOM_NEVER_{tag}" in body["groups"][0]["placement"][
        "query"]
    aggregate = str(uuidlib.uuid4())  # the host is in no aggregate: Placement offers nothing
    body = explain(api, member_of=f"in:{aggregate}")
    assert f"member_of_ACCEL0=in:{aggregate}" in body["groups"][0]["placement"]["query"]
    assert body["groups"][0]["placement"]["candidates"] == []
    reasons = provider(body, accs[0]["rp"])["reasons"]
    assert [r["code"] for r in reasons] == ["placement_drift"]
    assert reasons[0]["message"].startswith("acceld would bind it but Placement offers no "
                                            "candidate on it for this group")


def test_a_trait_placement_has_never_seen(placement, pconf, db, api, tag):
    hosts, accs, rc, trait = fleet(placement, pconf, db, tag, hosts=1)
    profile(api, rc, f"CUSTOM_UNKNOWN_{tag}")
    body = explain(api)
    view = body["groups"][0]["placement"]
    assert view["status"] == "refused" and f"CUSTOM_UNKNOWN_{tag}" in view["message"]
    # Placement's text, cleaned: one line, no blank lines or markup (issue 40).
    assert "\n" not in view["message"] and "  " not in view["message"], view["message"]
    assert "<" not in view["message"]
    assert [r["code"] for r in provider(body, accs[0]["rp"])["reasons"]] == ["trait_missing"]
    assert body["verdict"].startswith("not satisfiable: group 0")


def test_inventory_reserved_in_placement_by_hand(placement, pconf, db, api, tag):
    """An operator reserved the provider in Placement (draining it): that reserved is the
    operator's (docs/placement.md, "Ownership"), not drift; it keeps the provider from
    Placement's candidates, so it is the reason the provider cannot serve."""
    hosts, accs, rc, trait = fleet(placement, pconf, db, tag)
    rp = accs[0]["rp"]
    current = placement.get(f"/resource_providers/{rp}/inventories").json()
    resp = placement.put(f"/resource_providers/{rp}/inventories", {
        "resource_provider_generation": current["resource_provider_generation"],
        "inventories": {rc: {"total": 1, "reserved": 1, "max_unit": 1}}})
    assert resp.status_code == 200, resp.text
    profile(api, rc, trait)
    body = explain(api)
    assert body["verdict"] == f"satisfiable on 1 host: {hosts[1]}"
    entry = provider(body, rp)
    assert entry["placement"] == "not_offered"
    assert entry["reasons"] == [{"code": "operator_reserved", "message": (
        "acceld would bind it but Placement offers no candidate on it for this group: "
        f"Placement holds {rc} total=1 reserved=1, of which 1 reserved by an operator beyond "
        "acceld's 0 (the operator's, kept by acceld's sync)")}]
    host = next(h for h in body["hosts"] if h["hostname"] == hosts[0])
    assert host["satisfiable"] is False and "reserved by an operator" in \
        host["groups"][0]["reasons"][0]
    assert "differs" not in body["verdict"]
    everyone = explain(api, hostname=hosts[0])
    assert everyone["verdict"].endswith("(1 reserved by an operator in Placement)"), \
        everyone["verdict"]


def test_total_raised_by_hand_on_an_offered_provider_is_a_warning(placement, pconf, db, api,
                                                                  tag):
    """Placement offers the provider with a total raised by hand: drift, but a claim there
    binds at the same moment, so explain says usable and warns (issue 40)."""
    hosts, accs, rc, trait = fleet(placement, pconf, db, tag, hosts=1)
    rp = accs[0]["rp"]
    current = placement.get(f"/resource_providers/{rp}/inventories").json()
    resp = placement.put(f"/resource_providers/{rp}/inventories", {
        "resource_provider_generation": current["resource_provider_generation"],
        "inventories": {rc: {"total": 2, "reserved": 0, "max_unit": 2}}})
    assert resp.status_code == 200, resp.text
    profile(api, rc, trait)
    body = explain(api, hostname=hosts[0])
    assert body["verdict"] == f"satisfiable on 1 host: {hosts[0]}", body["verdict"]
    entry = provider(body, rp)
    assert entry["placement"] == "offered" and entry["usable"] is True
    assert entry["reasons"] == []
    assert entry["warnings"] == [{"code": "placement_drift", "message": (
        f"Placement offers a capacity of 2 {rc}; acceld's is 1")}]
    from acceld.conductor.binding.worker import BindWorker  # noqa: F401 - the real binder
    from tests.support.binds import run_binds
    claimed = api.simulate_post("/accelerator/v2/accelerator_requests", headers={
        **ADMIN, **version("2.8")}, json={"device_profile_name": "dp",
                                          "claim": {"hostname": hosts[0]}})
    assert claimed.status_code == 201, claimed.text
    run_binds(pconf, db)
    [arq] = claimed.json["arqs"]
    shown = api.simulate_get(f"/accelerator/v2/accelerator_requests/{arq['uuid']}",
                             headers={**ADMIN, **version("2.8")}).json
    assert shown["state"] == "Bound", shown


def test_an_operators_reserved_and_traits_are_not_drift(placement, pconf, db, api, tag):
    """Ownership: an operator's reserved on a provider acceld offers two of, and a trait of
    the operator's, are kept by the sync and are neither drift nor warnings."""
    host = f"ex-{tag.lower()}-own"
    rc, trait = f"CUSTOM_EXPLAIN_{tag}", f"CUSTOM_T_{tag}"
    placement.create_compute_node(host)
    acc = add_accelerator(db, host, rc, trait, handles=2)
    assert not PlacementSync(pconf, db).sync_once().failed
    rp = acc["rp"]
    current = placement.get(f"/resource_providers/{rp}/inventories").json()
    assert placement.put(f"/resource_providers/{rp}/inventories", {
        "resource_provider_generation": current["resource_provider_generation"],
        "inventories": {rc: {"total": 2, "reserved": 1, "max_unit": 2}}}).status_code == 200
    assert placement.put(f"/traits/CUSTOM_OPERATOR_{tag}", None).status_code in (201, 204)
    traits = placement.get(f"/resource_providers/{rp}/traits").json()
    assert placement.put(f"/resource_providers/{rp}/traits", {
        "resource_provider_generation": traits["resource_provider_generation"],
        "traits": traits["traits"] + [f"CUSTOM_OPERATOR_{tag}"]}).status_code == 200
    profile(api, rc, trait)
    # Before acceld's audit has seen them (read back, judged by the sync's rule) and after.
    for audited in (False, True):
        if audited:
            assert PlacementSync(pconf, db).audit([host]).repaired == {}
        entry = provider(explain(api, hostname=host), rp)
        assert entry["placement"] == "offered"
        assert (entry["usable"], entry["reasons"], entry["warnings"]) == (True, [], []), \
            (audited, entry)
    # The operator's reserved raised to all of it: Placement no longer offers the
    # provider, and explain says whose reservation keeps it.
    current = placement.get(f"/resource_providers/{rp}/inventories").json()
    assert placement.put(f"/resource_providers/{rp}/inventories", {
        "resource_provider_generation": current["resource_provider_generation"],
        "inventories": {rc: {"total": 2, "reserved": 2, "max_unit": 2}}}).status_code == 200
    entry = provider(explain(api, hostname=host), rp)
    assert [r["code"] for r in entry["reasons"]] == ["operator_reserved"], entry


def test_disabled_device_not_yet_synced(placement, pconf, db, api, tag):
    """acceld's own records show Placement behind: the disable is not written yet, so
    Placement still offers a device acceld refuses."""
    hosts, accs, rc, trait = fleet(placement, pconf, db, tag, hosts=1)
    result = api.simulate_post(f"/accelerator/v2/devices/{accs[0]['device']['uuid']}/disable",
                               headers=ADMIN)
    assert result.status_code == 200
    profile(api, rc, trait)
    body = explain(api)
    entry = provider(body, accs[0]["rp"])
    assert entry["placement"] == "offered"
    assert [r["code"] for r in entry["reasons"]] == ["disabled"]
    assert entry["warnings"][0]["message"] == (
        f"Placement offers a capacity of 1 {rc}; acceld's is 0 (the conductor's sync has not "
        "written acceld's change yet)")
    PlacementSync(pconf, db).sync_once()
    entry = provider(explain(api), accs[0]["rp"])
    assert entry["placement"] == "not_offered"
    assert [r["code"] for r in entry["reasons"]] == ["disabled"]


def test_handles_exhausted_in_both_views(placement, pconf, db, api, tag):
    hosts, accs, rc, trait = fleet(placement, pconf, db, tag, hosts=1)
    profile(api, rc, trait)
    instance, arq = str(uuidlib.uuid4()), str(uuidlib.uuid4())
    resp = placement.put(f"/allocations/{instance}", {
        "allocations": {accs[0]["rp"]: {"resources": {rc: 1}}}, "project_id": "p1",
        "user_id": "u1", "consumer_generation": None, "consumer_type": "INSTANCE"})
    assert resp.status_code == 204, resp.text
    with db.write() as conn:
        profile_id = conn.scalar(select(device_profiles.c.id))
        conn.execute(update(attach_handles).values(in_use=True))
        conn.execute(insert(accelerator_requests).values(
            uuid=arq, state="Bound", device_profile_id=profile_id, device_profile_group_id=0,
            project_id="p1", hostname=hosts[0], instance_uuid=instance,
            attach_handle_id=accs[0]["handles"][0]["id"], created_at=utcnow()))
    body = explain(api)
    entry = provider(body, accs[0]["rp"])
    assert entry["placement"] == "not_offered"
    assert [r["code"] for r in entry["reasons"]] == ["no_free_handle"]
    assert f"ARQ {arq} (Bound, instance {instance})" in entry["reasons"][0]["message"]
    assert body["groups"][0]["placement"]["candidates"] == []


def test_placement_unreachable_is_said_not_failed(placement, pconf, tmp_path, db, tag):
    hosts, accs, rc, trait = fleet(placement, pconf, db, tag, hosts=1)
    conf = make_conf(str(tmp_path / "away"))
    placement.configure(conf)
    conf.set_override("endpoint", f"http://127.0.0.1:{free_port()}", group="placement")
    api = testing.TestClient(build_app(conf, db))
    profile(api, rc, trait)
    body = explain(api)
    assert body["placement"]["status"] == "unavailable"
    assert body["placement"]["message"].startswith("Placement unreachable")
    assert body["groups"][0]["placement"]["candidates"] == []
    assert provider(body, accs[0]["rp"])["placement"] == "unknown"
    assert body["verdict"] == (f"satisfiable on 1 host: {hosts[0]} (Placement unreachable: "
                               "acceld's view alone)")


def test_provider_deleted_from_placement_by_hand(placement, pconf, db, api, tag):
    hosts, accs, rc, trait = fleet(placement, pconf, db, tag, hosts=1)
    assert placement.delete(f"/resource_providers/{accs[0]['rp']}").status_code == 204
    profile(api, rc, trait)
    entry = provider(explain(api), accs[0]["rp"])
    assert entry["reasons"] == [{"code": "placement_drift", "message": (
        "acceld would bind it but Placement offers no candidate on it for this group: "
        "Placement has no such provider")}]


def test_host_without_a_compute_node_in_placement(placement, pconf, db, api, tag):
    """Nova never registered the host: the sync cannot write it, and Placement has no tree
    to look in."""
    host = f"ex-{tag.lower()}-nocn"
    acc = add_accelerator(db, host, f"CUSTOM_EXPLAIN_{tag}", f"CUSTOM_T_{tag}")
    result = PlacementSync(pconf, db).sync_once()
    assert host in result.waiting_hosts
    profile(api, f"CUSTOM_EXPLAIN_{tag}", f"CUSTOM_T_{tag}")
    body = explain(api, hostname=host)
    assert body["placement"]["status"] == "no_compute_node"
    assert f"host {host} has no compute-node resource provider in Placement" in \
        body["placement"]["message"]
    entry = provider(body, acc["rp"])
    assert [r["code"] for r in entry["reasons"]] == ["placement_drift"]
    assert entry["reasons"][0]["message"] == (
        "acceld would bind it but Placement offers no candidate on it for this group: "
        f"host {host} has no compute-node resource provider in Placement (Nova creates it "
        "when nova-compute starts)")
    assert [w["code"] for w in entry["warnings"]] == ["placement_drift"]
    assert entry["warnings"][0]["message"].startswith(
        "acceld has not written this provider to Placement yet")


def _synced_reason(placement, pconf, db, api, tag, change, code: str) -> dict:
    """A two-host fleet, a ``change`` to the first host's rows, the sync run: acceld names
    ``code`` for that host's provider and Placement, which the sync reserved, offers only
    the other host."""
    hosts, accs, rc, trait = fleet(placement, pconf, db, tag)
    with db.write() as conn:
        change(conn, hosts[0], accs[0])
    result = PlacementSync(pconf, db).sync_once()
    assert not result.failed, result
    profile(api, rc, trait)
    body = explain(api)
    entry = provider(body, accs[0]["rp"])
    assert [r["code"] for r in entry["reasons"]] == [code], entry
    assert entry["placement"] == "not_offered"
    assert [c["rp_uuid"] for c in body["groups"][0]["placement"]["candidates"]] == [
        accs[1]["rp"]]
    assert body["verdict"] == f"satisfiable on 1 host: {hosts[1]}"
    inv = placement.get(f"/resource_providers/{accs[0]['rp']}/inventories").json()
    assert inv["inventories"][rc]["reserved"] == 1  # the sync withdrew it from Placement
    return entry


def test_quarantined_device_reserved_in_placement(placement, pconf, db, api, tag):
    def quarantine(conn, host, acc) -> None:  # type: ignore[no-untyped-def]
        conn.execute(update(devices).where(devices.c.id == acc["device"]["id"]).values(
            quarantined=True, quarantined_at=utcnow(), health="unhealthy",
            health_reason="XID 79: fallen off the bus"))

    entry = _synced_reason(placement, pconf, db, api, tag, quarantine, "quarantined")
    assert "XID 79: fallen off the bus" in entry["reasons"][0]["message"]


def test_agent_down_reserved_in_placement(placement, pconf, db, api, tag):
    def down(conn, host, acc) -> None:  # type: ignore[no-untyped-def]
        conn.execute(insert(agents).values(hostname=host, endpoint="127.0.0.1:1",
                                           state="down", last_seen_at=utcnow()))

    assert pconf.conductor.reserve_devices_of_down_agents  # the default
    entry = _synced_reason(placement, pconf, db, api, tag, down, "agent_down")
    assert "is down, last heard from" in entry["reasons"][0]["message"]


def test_setup_required_reserved_in_placement(placement, pconf, db, api, tag):
    def not_ready(conn, host, acc) -> None:  # type: ignore[no-untyped-def]
        conn.execute(update(devices).where(devices.c.id == acc["device"]["id"]).values(
            acc_status="setup_required", status_reason="vfio-pci not bound"))

    entry = _synced_reason(placement, pconf, db, api, tag, not_ready, "not_ready")
    assert "setup_required: vfio-pci not bound" in entry["reasons"][0]["message"]


def test_a_project_over_its_quota_with_placement_offering(placement, pconf, db, api, tag):
    """Placement offers every provider; the project's ARQ limit alone refuses."""
    hosts, accs, rc, trait = fleet(placement, pconf, db, tag, hosts=1)
    pconf.set_override("arqs_per_project", 1, group="quota")
    profile(api, rc, trait)
    created = api.simulate_post("/accelerator/v2/accelerator_requests",
                                headers={**ADMIN, "X-Project-Id": "quota-p"},
                                json={"device_profile_name": "dp"})
    assert created.status_code == 201, created.text
    body = explain(api, project_id="quota-p")
    assert body["satisfiable"] is False
    assert body["verdict"].startswith("not satisfiable for project quota-p: Quota exceeded")
    assert [c["rp_uuid"] for c in body["groups"][0]["placement"]["candidates"]] == [
        accs[0]["rp"]]
