"""GET /v2/device_profiles/{ident}/explain (2.7, admin): every status code and every reason
acceld itself can give, each made to happen in the database, on every backend.

Placement is not configured here (acceld's view alone); the Placement side (candidates,
drift, Placement unreachable) is tests/integration/test_explain_placement.py.
"""

from __future__ import annotations

import datetime as dt
import uuid as uuidlib

import pytest
from sqlalchemy import insert, select, update

from acceld.db.models import (accelerator_requests, agents, attach_handles, attributes,
                              deployables, device_profiles, devices, handle_releases, utcnow)
from tests.conftest import count_queries
from tests.helpers import ADMIN, fault, member, version
from tests.support import inventory

URL = "/accelerator/v2/device_profiles"
V27 = version("2.7")


def make_profile(client, name="dp", group=None) -> dict:  # type: ignore[no-untyped-def]
    group = group or {"resources:FPGA": "1", "trait:CUSTOM_FAKE_DEVICE": "required"}
    result = client.simulate_post(URL, headers=ADMIN, json=[{"name": name, "groups": [group]}])
    assert result.status_code == 201, result.text
    return result.json


def explain(client, ident="dp", **params):  # type: ignore[no-untyped-def]
    return client.simulate_get(f"{URL}/{ident}/explain", params=params or None,
                               headers={**ADMIN, **V27})


def provider(body: dict, hostname: str, group: int = 0) -> dict:
    [found] = [p for p in body["groups"][group]["acceld"]["providers"]
               if p["hostname"] == hostname]
    return found


def codes(body: dict, hostname: str) -> list[str]:
    return [r["code"] for r in provider(body, hostname)["reasons"]]


def messages(body: dict, hostname: str) -> str:
    return " | ".join(r["message"] for r in provider(body, hostname)["reasons"])


# ---------------------------------------------------------------- status codes


def test_satisfiable_profile_names_its_hosts(client, db):
    make_profile(client)
    for host in ("node-a", "node-b", "node-c"):
        inventory.add_fpga(db, hostname=host)
    result = explain(client)
    assert result.status_code == 200, result.text
    body = result.json
    assert body["verdict"] == "satisfiable on 3 hosts: node-a, node-b, node-c"
    assert body["satisfiable"] is True
    assert body["placement"]["status"] == "not_configured"
    assert [h["hostname"] for h in body["hosts"] if h["satisfiable"]] == ["node-a", "node-b",
                                                                          "node-c"]
    group = body["groups"][0]
    assert group["resources"] == {"FPGA": 1}
    assert group["required_traits"] == ["CUSTOM_FAKE_DEVICE"]
    assert all(p["usable"] and p["reasons"] == [] for p in group["acceld"]["providers"])


def test_by_uuid_and_by_hostname(client, db):
    uuid = make_profile(client)["uuid"]
    inventory.add_fpga(db, hostname="node-a")
    inventory.add_fpga(db, hostname="node-b")
    result = explain(client, uuid, hostname="node-b")
    assert result.status_code == 200
    assert result.json["verdict"] == "satisfiable on 1 host: node-b"
    assert [p["hostname"] for p in result.json["groups"][0]["acceld"]["providers"]] == ["node-b"]
    unknown = explain(client, uuid, hostname="node-z").json
    assert unknown["satisfiable"] is False
    assert unknown["verdict"] == "not satisfiable: acceld knows no accelerator on host node-z"


@pytest.mark.parametrize("params, words", [
    ({"hostname": "bad host"}, "Invalid hostname"),
    ({"hostname": ""}, "Invalid hostname"),
    ({"hostname": "x" * 256}, "Invalid hostname"),
    ({"hostname": "-leading-dash"}, "Invalid hostname"),
    ({"member_of": "not-a-uuid"}, "Invalid member_of"),
    ({"project_id": ""}, "Invalid project_id"),
    ({"project_id": "p" * 256}, "Invalid project_id"),
    ({"colour": "red"}, "Unknown query parameter"),
])
def test_bad_parameters_are_400(client, db, params, words):
    make_profile(client)
    result = explain(client, **params)
    assert result.status_code == 400, result.text
    assert words in fault(result)


def test_non_admin_is_403(client, db):
    make_profile(client)
    result = client.simulate_get(f"{URL}/dp/explain", headers={**member(), **V27})
    assert result.status_code == 403
    assert "acceld:device_profile:explain" in fault(result)


def test_unknown_profile_is_404(client, db):
    for ident in ("no-such-profile", str(uuidlib.uuid4())):
        result = explain(client, ident)
        assert result.status_code == 404 and ident in fault(result)


def test_older_microversion_is_406(client, db):
    make_profile(client)
    for headers in (ADMIN, {**ADMIN, **version("2.6")}):
        result = client.simulate_get(f"{URL}/dp/explain", headers=headers)
        assert result.status_code == 406
        assert "2.7" in fault(result)


# ---------------------------------------------------------------- reasons, each made to happen


def test_missing_trait_and_resource_class(client, db):
    make_profile(client, group={"resources:FPGA": "1", "trait:CUSTOM_GZIP": "required",
                                "trait:CUSTOM_FAKE_DEVICE": "forbidden"})
    inventory.add_fpga(db, hostname="node-a")
    with db.write() as conn:
        dev = inventory.add_device(conn, hostname="node-b", type="GPU")
        inventory.add_deployable(conn, dev["id"], name="node-b_gpu", attrs={"rc": "PGPU"})
    body = explain(client).json
    assert codes(body, "node-a") == ["trait_missing", "trait_forbidden"]
    assert "lacks trait CUSTOM_GZIP" in messages(body, "node-a")
    assert "has trait CUSTOM_FAKE_DEVICE, which the group forbids" in messages(body, "node-a")
    assert codes(body, "node-b")[0] == "resource_class"
    assert "offers PGPU; the group asks for FPGA" in messages(body, "node-b")
    assert body["verdict"].startswith("not satisfiable: group 0 (FPGA:1, requires CUSTOM_GZIP, "
                                      "forbids CUSTOM_FAKE_DEVICE): no provider is of that kind")
    assert ("(2 known: 2 missing trait CUSTOM_GZIP, 1 forbidden trait CUSTOM_FAKE_DEVICE, "
            "1 offering PGPU)") in body["verdict"]


def test_no_free_handle_names_the_arqs_holding_them(client, db):
    profile = make_profile(client)
    fpga = inventory.add_fpga(db, hostname="node-a", handles=2)
    instance = str(uuidlib.uuid4())
    arq = str(uuidlib.uuid4())
    with db.write() as conn:
        profile_id = conn.scalar(select(device_profiles.c.id).where(
            device_profiles.c.uuid == profile["uuid"]))
        first, second = (h["id"] for h in fpga["handles"])
        conn.execute(update(attach_handles).values(in_use=True))
        conn.execute(insert(accelerator_requests).values(
            uuid=arq, state="Bound", device_profile_id=profile_id, device_profile_group_id=0,
            project_id="p", hostname="node-a", instance_uuid=instance,
            attach_handle_id=first, created_at=utcnow()))
        conn.execute(insert(handle_releases).values(
            attach_handle_id=second, hostname="node-a", created_at=utcnow()))
    body = explain(client).json
    assert codes(body, "node-a") == ["no_free_handle"]
    text = messages(body, "node-a")
    assert f"0 of 2 attach handles free, the group needs 1: held by ARQ {arq} (Bound, " \
           f"instance {instance})" in text
    assert "released, its host step still queued" in text
    assert body["verdict"] == ("not satisfiable: group 0 (FPGA:1, requires CUSTOM_FAKE_DEVICE):"
                               " 1 matching provider, none usable (1 no free handle)")


def test_handles_promised_to_binds_in_flight_are_not_free(client, db):
    """Explain counts handles as a claim does (issue 40): a BindStarted ARQ that has not
    taken its handle yet has one promised, so it is not free for another."""
    profile = make_profile(client)
    fpga = inventory.add_fpga(db, hostname="node-a", handles=2)
    inventory.add_fpga(db, hostname="node-b", handles=1)
    with db.write() as conn:
        profile_id = conn.scalar(select(device_profiles.c.id).where(
            device_profiles.c.uuid == profile["uuid"]))
        for _ in range(2):
            conn.execute(insert(accelerator_requests).values(
                uuid=str(uuidlib.uuid4()), state="BindStarted", device_profile_id=profile_id,
                device_profile_group_id=0, project_id="p", hostname="node-a",
                device_rp_uuid=fpga["deployable"]["rp_uuid"],
                instance_uuid=str(uuidlib.uuid4()), created_at=utcnow()))
    body = explain(client).json
    assert codes(body, "node-a") == ["no_free_handle"]
    assert "0 of 2 attach handles free, the group needs 1: 2 promised to 2 bind(s) in " \
           "progress" in messages(body, "node-a")
    assert provider(body, "node-a")["handles"] == {"total": 2, "free": 0, "promised": 2}
    assert provider(body, "node-b")["handles"] == {"total": 1, "free": 1, "promised": 0}
    assert body["verdict"] == "satisfiable on 1 host: node-b"
    # The claim judges alike: node-a is refused, for the same reason.
    claim = client.simulate_post("/accelerator/v2/accelerator_requests", headers={
        **ADMIN, **version("2.8")}, json={"device_profile_name": "dp",
                                          "claim": {"hostname": "node-a"}})
    assert claim.status_code == 409, claim.text
    assert "2 promised to 2 bind(s) in progress" in fault(claim)


def test_disabled_with_the_operators_reason(client, db):
    make_profile(client)
    fpga = inventory.add_fpga(db, hostname="node-a")
    result = client.simulate_patch(
        f"/accelerator/v2/devices/{fpga['device']['uuid']}", headers=ADMIN,
        json=[{"op": "replace", "path": "/status", "value": "disabled", "reason": "fan swap"}])
    assert result.status_code == 204, result.text
    body = explain(client).json
    assert codes(body, "node-a") == ["disabled"]
    assert "disabled by an operator: fan swap" in messages(body, "node-a")
    assert body["hosts"][0]["groups"][0]["reasons"] == [
        f"node-a_FakeDevice: device {fpga['device']['uuid']} is disabled by an operator: "
        "fan swap"]


def test_quarantined_with_the_health_reason(client, db):
    make_profile(client)
    inventory.add_fpga(db, hostname="node-a")
    since = dt.datetime(2026, 12, 1, 10, 0, 0)
    with db.write() as conn:
        conn.execute(update(devices).values(quarantined=True, quarantined_at=since,
                                            health="unhealthy", health_reason="ECC errors"))
    body = explain(client).json
    assert codes(body, "node-a") == ["quarantined"]
    assert ("quarantined since 2026-12-01T10:00:00Z for its health (health unhealthy: ECC "
            "errors)") in messages(body, "node-a")


def test_agent_down_since_when(client, db):
    make_profile(client)
    inventory.add_fpga(db, hostname="node-a")
    inventory.add_fpga(db, hostname="node-b")
    seen = dt.datetime(2026, 12, 4, 9, 30, 0)
    with db.write() as conn:
        conn.execute(insert(agents).values(hostname="node-a", endpoint="node-a:6668",
                                           state="down", last_seen_at=seen))
        conn.execute(insert(agents).values(hostname="node-b", endpoint="node-b:6668",
                                           state="up", last_seen_at=utcnow()))
    body = explain(client).json
    assert codes(body, "node-a") == ["agent_down"]
    assert "the agent of host node-a is down, last heard from 2026-12-04T09:30:00Z" in \
        messages(body, "node-a")
    assert codes(body, "node-b") == []
    assert body["verdict"] == "satisfiable on 1 host: node-b"


@pytest.mark.parametrize("acc_status", ["setup_required", "reboot_required"])
def test_not_ready_with_the_drivers_reason(client, db, acc_status):
    make_profile(client)
    inventory.add_fpga(db, hostname="node-a")
    with db.write() as conn:
        conn.execute(update(devices).values(acc_status=acc_status,
                                            status_reason="IOMMU group shared with 0000:5e:00.1"))
    body = explain(client).json
    assert codes(body, "node-a") == ["not_ready"]
    assert f"is {acc_status}: IOMMU group shared with 0000:5e:00.1" in messages(body, "node-a")
    assert f"(1 {acc_status})" in body["verdict"]


def test_programming_in_progress(client, db):
    make_profile(client)
    inventory.add_fpga(db, hostname="node-a")
    inventory.add_fpga(db, hostname="node-b")
    until = utcnow() + dt.timedelta(minutes=5)
    with db.write() as conn:
        conn.execute(update(deployables).where(deployables.c.name == "node-a_FakeDevice")
                     .values(programming_owner="conductor-1", programming_until=until))
        # A mark whose time ran out (its conductor died) no longer counts, as for binds.
        conn.execute(update(deployables).where(deployables.c.name == "node-b_FakeDevice")
                     .values(programming_owner="conductor-2",
                             programming_until=utcnow() - dt.timedelta(minutes=5)))
    body = explain(client).json
    assert codes(body, "node-a") == ["programming"]
    assert "deployable node-a_FakeDevice is being programmed (conductor-1, until" in \
        messages(body, "node-a")
    assert codes(body, "node-b") == []


def test_too_few_accelerators_on_one_provider(client, db):
    make_profile(client, group={"resources:FPGA": "2"})
    inventory.add_fpga(db, hostname="node-a")  # one accelerator, one handle
    inventory.add_fpga(db, hostname="node-b", handles=2)
    body = explain(client).json
    assert codes(body, "node-a") == ["capacity"]
    assert "has 1 FPGA; the group asks for 2 from one provider" in messages(body, "node-a")
    assert codes(body, "node-b") == []
    with db.write() as conn:  # one of node-b's two handles taken: two are needed
        conn.execute(update(attach_handles).where(attach_handles.c.id == select(
            attach_handles.c.id).join(deployables).where(
            deployables.c.name == "node-b_FakeDevice").limit(1).scalar_subquery())
            .values(in_use=True))
    body = explain(client).json
    assert codes(body, "node-b") == ["no_free_handle"]
    assert "1 of 2 attach handles free, the group needs 2" in messages(body, "node-b")


def test_vanished_device_held_while_in_use(client, db):
    make_profile(client)
    fpga = inventory.add_fpga(db, hostname="node-a")
    with db.write() as conn:
        conn.execute(update(devices).values(vanished=True, status="maintaining",
                                            status_reason="gone while in use"))
    body = explain(client).json
    assert codes(body, "node-a") == ["vanished"]
    assert f"device {fpga['device']['uuid']} is no longer reported by host node-a" in \
        messages(body, "node-a")


def test_every_reason_that_holds_is_given(client, db):
    """Not the first only: an operator fixing one should see the next at once."""
    make_profile(client)
    fpga = inventory.add_fpga(db, hostname="node-a")
    with db.write() as conn:
        conn.execute(update(devices).values(status="maintaining", status_reason="rma",
                                            quarantined=True, health="unhealthy",
                                            acc_status="reboot_required"))
        conn.execute(update(attach_handles).values(in_use=True))
        conn.execute(insert(agents).values(hostname="node-a", endpoint="e", state="down",
                                           last_seen_at=utcnow()))
    body = explain(client).json
    assert codes(body, "node-a") == ["disabled", "quarantined", "agent_down", "not_ready",
                                     "no_free_handle"]
    assert fpga["device"]["uuid"] in messages(body, "node-a")


def test_project_over_its_arq_limit(client, db, conf):
    conf.set_override("arqs_per_project", 1, group="quota")
    make_profile(client)
    inventory.add_fpga(db, hostname="node-a")
    assert explain(client, project_id="project-a").json["quota"] == {
        "project_id": "project-a", "arqs": 1, "refusal": None}
    created = client.simulate_post("/accelerator/v2/accelerator_requests", headers=member(),
                                   json={"device_profile_name": "dp"})
    assert created.status_code == 201
    body = explain(client, project_id="project-a").json
    assert body["satisfiable"] is False
    assert body["verdict"] == (
        "not satisfiable for project project-a: Quota exceeded for accelerator_requests: "
        "project project-a may hold 1 ([quota] arqs_per_project), holds 1 and asked for 1 "
        "more.")
    assert body["quota"]["refusal"].startswith("Quota exceeded")
    # Without a project, the devices alone decide.
    assert explain(client).json["verdict"] == "satisfiable on 1 host: node-a"


def test_no_host_serves_every_group(client, db):
    make_profile(client, group={"resources:FPGA": "1"})
    client.simulate_delete(f"{URL}/dp", headers=ADMIN)
    result = client.simulate_post(URL, headers=ADMIN, json=[{"name": "dp", "groups": [
        {"resources:FPGA": "1"}, {"resources:PGPU": "1"}]}])
    assert result.status_code == 201
    inventory.add_fpga(db, hostname="node-a")
    with db.write() as conn:
        dev = inventory.add_device(conn, hostname="node-b", type="GPU")
        dep = inventory.add_deployable(conn, dev["id"], name="node-b_gpu", attrs={"rc": "PGPU"})
        inventory.add_attach_handles(conn, dep["id"], 1)
    body = explain(client).json
    assert body["verdict"] == ("not satisfiable: no host serves every group (group 0 only on "
                               "node-a; group 1 only on node-b)")


# ---------------------------------------------------------------- cost


def _fleet(db, hosts: int) -> None:
    with db.write() as conn:
        for n in range(hosts):
            host = f"host-{n:03d}"
            dev = inventory.add_device(conn, hostname=host)
            dep = inventory.add_deployable(conn, dev["id"], name=f"{host}_fpga",
                                           attrs={"rc": "FPGA", "trait0": "CUSTOM_FAKE_DEVICE"})
            inventory.add_attach_handles(conn, dep["id"], 2)
            conn.execute(insert(agents).values(hostname=host, endpoint=f"{host}:6668",
                                               state="up" if n % 3 else "down",
                                               last_seen_at=utcnow()))


def test_constant_number_of_queries_whatever_the_fleet(client, db):
    make_profile(client)
    counts = []
    for hosts in (2, 50):
        with db.write() as conn:
            conn.execute(attributes.delete())
            conn.execute(attach_handles.delete())
            conn.execute(deployables.delete())
            conn.execute(devices.delete())
            conn.execute(agents.delete())
        _fleet(db, hosts)
        with count_queries(db) as statements:
            result = explain(client)
        assert result.status_code == 200
        assert len(result.json["hosts"]) == hosts
        counts.append(len(statements))
    assert counts[0] == counts[1], counts
    assert counts[0] == 5, counts  # docs/explain.md, "Cost"
