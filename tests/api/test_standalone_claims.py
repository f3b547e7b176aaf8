"""Standalone claims (API 2.8) in-process, on SQLite, PostgreSQL and MariaDB: an ARQ created
with "claim" is bound by the conductor's bind worker without Nova, its attach_handle_info is
the workload's, and deleting it releases the handle; every refusal has its status (400 bad
body or host, 403 policy, 406 below 2.8, 409 no capacity) and changes nothing.

Placement is not configured here (tests/integration/test_standalone_claims_placement.py
claims against the real one).
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select, update

from acceld.db import claims as claims_db
from acceld.db.models import (accelerator_requests, attach_handles, bind_jobs, claim_consumers,
                              device_events, devices)
from tests.helpers import ADMIN, SERVICE, fault, member, version
from tests.support import inventory
from tests.support.binds import run_binds

ARQS = "/accelerator/v2/accelerator_requests"
DPS = "/accelerator/v2/device_profiles"
V28 = version("2.8")
PROJECT = "project-a"


@pytest.fixture
def fpga(db):
    return inventory.add_fpga(db, hostname="claim-node", handles=2)


@pytest.fixture
def profile(client):
    assert client.simulate_post(DPS, headers=ADMIN, json=[
        {"name": "fpga1", "groups": [{"resources:FPGA": "1"}]}]).status_code == 201
    return "fpga1"


def claim(client, body_claim=None, headers=None, **more):  # type: ignore[no-untyped-def]
    body = {"device_profile_name": "fpga1",
            "claim": {} if body_claim is None else body_claim, **more}
    return client.simulate_post(ARQS, json=body, headers={**(headers or member(PROJECT)),
                                                         **V28})


def show(client, arq_uuid: str, headers=None):  # type: ignore[no-untyped-def]
    return client.simulate_get(f"{ARQS}/{arq_uuid}", headers={**(headers or member(PROJECT)),
                                                             **V28})


def counts(db) -> dict[str, int]:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return {
            "arqs": conn.scalar(select(func.count()).select_from(accelerator_requests)),
            "jobs": conn.scalar(select(func.count()).select_from(bind_jobs)),
            "consumers": conn.scalar(select(func.count()).select_from(claim_consumers)),
            "in_use": conn.scalar(select(func.count()).select_from(attach_handles).where(
                attach_handles.c.in_use.is_(True))),
        }


def test_claim_on_a_host_binds_without_nova_and_release_frees(client, conf, db, fpga,
                                                                profile):
    result = claim(client, {"hostname": "claim-node"})
    assert result.status_code == 201, result.text
    [arq] = result.json["arqs"]
    assert arq["state"] == "BindStarted"
    assert arq["hostname"] == "claim-node"
    assert arq["device_rp_uuid"] == fpga["deployable"]["rp_uuid"]
    assert arq["instance_uuid"] is None
    assert arq["consumer_uuid"] == arq["uuid"]  # its own consumer by default
    assert arq["project_id"] == PROJECT
    notifier = run_binds(conf, db)
    assert notifier.sent == []  # no Nova event for a standalone claim
    bound = show(client, arq["uuid"]).json
    assert bound["state"] == "Bound"
    handle = next(h for h in fpga["handles"] if h["uuid"] == bound["attach_handle_uuid"])
    assert bound["attach_handle_type"] == handle["attach_type"]
    assert bound["attach_handle_info"] == __import__("json").loads(handle["attach_info"])
    assert counts(db) == {"arqs": 1, "jobs": 0, "consumers": 1, "in_use": 1}
    # Below 2.8 the ARQ is shown as before (no consumer_uuid).
    old = client.simulate_get(f"{ARQS}/{arq['uuid']}", headers=member(PROJECT)).json
    assert "consumer_uuid" not in old and old["state"] == "Bound"

    # Released by its owner (no service token): handle free, consumer due for the conductor.
    assert client.simulate_delete(f"{ARQS}/{arq['uuid']}",
                                  headers=member(PROJECT)).status_code == 204
    assert counts(db) == {"arqs": 0, "jobs": 0, "consumers": 1, "in_use": 0}
    with db.read() as conn:
        assert conn.scalar(select(claim_consumers.c.due)) is True
        kinds = list(conn.execute(select(device_events.c.kind, device_events.c.actor).where(
            device_events.c.device_uuid == fpga["device"]["uuid"]).order_by(
            device_events.c.id)).all())
    assert kinds == [("claimed", "conductor"), ("released", "user-project-a")]
    # The conductor's drain (no Placement here: nothing to write) drops the consumer.
    from acceld.conductor.placement.claim_allocations import ClaimAllocationWorker
    assert ClaimAllocationWorker(conf, db).run_once() == 1
    assert counts(db)["consumers"] == 0


def test_claim_without_a_host_picks_one(client, conf, db, profile):
    inventory.add_fpga(db, hostname="busy-node", handles=1, status="maintaining")
    free = inventory.add_fpga(db, hostname="free-node", handles=1)
    result = claim(client)
    assert result.status_code == 201, result.text
    [arq] = result.json["arqs"]
    assert (arq["hostname"], arq["device_rp_uuid"]) == ("free-node",
                                                        free["deployable"]["rp_uuid"])
    run_binds(conf, db)
    assert show(client, arq["uuid"]).json["state"] == "Bound"


def test_arqs_of_one_workload_share_a_consumer(client, conf, db, fpga):
    assert client.simulate_post(DPS, headers=ADMIN, json=[
        {"name": "fpga1", "groups": [{"resources:FPGA": "2"}]}]).status_code == 201
    consumer = str(uuid.uuid4())
    result = claim(client, {"hostname": "claim-node"}, consumer_uuid=consumer.upper())
    assert result.status_code == 201, result.text
    arqs = result.json["arqs"]
    assert len(arqs) == 2 and {a["consumer_uuid"] for a in arqs} == {consumer}
    run_binds(conf, db)
    shown = [show(client, a["uuid"]).json for a in arqs]
    assert [a["state"] for a in shown] == ["Bound", "Bound"]
    assert len({a["attach_handle_uuid"] for a in shown}) == 2  # no handle shared
    with db.read() as conn:
        assert claims_db.desired(conn, consumer) == {fpga["deployable"]["rp_uuid"]:
                                                     {"FPGA": 2}}
    # Another project may not take that consumer over (capacity is not what stops it).
    inventory.add_fpga(db, hostname="other-node", handles=2)
    other = claim(client, {}, headers=member("project-b"), consumer_uuid=consumer)
    assert other.status_code == 409 and "another project" in fault(other)


def test_no_capacity_is_409_and_creates_nothing(client, conf, db, fpga, profile):
    for _ in range(2):
        assert claim(client, {"hostname": "claim-node"}).status_code == 201
    before = counts(db)
    # Both handles are promised to the binds in progress: none is free for a third.
    # An administrator reads explain's reasons; the member, its own ARQs holding them.
    result = claim(client, {"hostname": "claim-node"}, headers=ADMIN)
    assert result.status_code == 409, result.text
    assert "promised to 2 bind(s) in progress" in fault(result)
    mine = claim(client, {"hostname": "claim-node"})
    assert mine.status_code == 409
    assert "This project's own accelerator requests hold 2 accelerator(s)" in fault(mine)
    run_binds(conf, db)
    result = claim(client, {"hostname": "claim-node"}, headers=ADMIN)
    assert result.status_code == 409
    assert "0 of 2 attach handles free" in fault(result)
    # The holders are named as explain names them: a claim by its consumer.
    held = client.simulate_get(ARQS, headers={**member(PROJECT), **V28}).json["arqs"]
    assert f"ARQ {held[0]['uuid']} (Bound, claimed for consumer {held[0]['uuid']})" in \
        fault(result)
    assert "/explain" in fault(result)
    mine = fault(claim(client, {"hostname": "claim-node"}))
    assert f"ARQ {held[0]['uuid']} (Bound, consumer {held[0]['uuid']}) on host claim-node" \
        in mine
    result = claim(client, {})
    assert result.status_code == 409 and "on any host" in fault(result)
    assert counts(db)["arqs"] == before["arqs"]


@pytest.mark.parametrize("status,reason", [("maintaining", "disabled"),
                                           ("quarantined", "quarantined")])
def test_disabled_or_quarantined_devices_are_not_claimed(client, db, profile, status, reason):
    fpga = inventory.add_fpga(db, hostname="sick-node", handles=1)
    from sqlalchemy import update
    with db.write() as conn:
        values = {"status": "maintaining", "status_reason": "fan swap"} \
            if status == "maintaining" else {"quarantined": True, "health": "critical",
                                            "health_reason": "ECC errors"}
        conn.execute(update(devices).where(devices.c.id == fpga["device"]["id"]).values(
            **values))
    result = claim(client, {"hostname": "sick-node"}, headers=ADMIN)
    assert result.status_code == 409
    assert reason in fault(result)
    # A member is not told why (an operator's words, the device's health).
    result = claim(client, {"hostname": "sick-node"})
    assert result.status_code == 409 and reason not in fault(result)


def test_bad_claim_bodies_are_400(client, db, fpga, profile):
    for body, words in [
            ({"claim": {"hostname": "bad host!"}}, "Invalid claim hostname"),
            ({"claim": {"hostname": ""}}, "claim"),
            ({"claim": {"host": "claim-node"}}, "claim"),
            ({"claim": "claim-node"}, "claim"),
            ({"claim": {}, "consumer_uuid": "not-a-uuid"}, "consumer_uuid"),
            ({"consumer_uuid": str(uuid.uuid4())}, "only with a claim")]:
        result = client.simulate_post(ARQS, json={"device_profile_name": "fpga1", **body},
                                      headers={**member(PROJECT), **V28})
        assert result.status_code == 400, (body, result.text)
        assert words in fault(result), (body, fault(result))
    assert counts(db) == {"arqs": 0, "jobs": 0, "consumers": 0, "in_use": 0}


def test_below_2_8_a_claim_is_406(client, db, fpga, profile):
    for headers in (member(PROJECT), {**member(PROJECT), **version("2.7")}):
        result = client.simulate_post(ARQS, json={"device_profile_name": "fpga1",
                                                  "claim": {}}, headers=headers)
        assert result.status_code == 406, result.text
        assert "2.8" in fault(result)
    assert counts(db)["arqs"] == 0


def test_claim_and_release_rules(client, conf, db, fpga, profile, tmp_path):
    # A service token may create ARQs for Nova, but is no project member: no claim.
    service_only = {"X-User-Id": "nova", "X-Project-Id": "service", "X-Roles": "service"}
    result = claim(client, {}, headers=service_only)
    assert result.status_code == 403 and "acceld:arq:claim" in fault(result)
    assert counts(db)["arqs"] == 0
    # A reader may not claim either (cyborg:arq:create refuses first).
    reader = {"X-User-Id": "r", "X-Project-Id": PROJECT, "X-Roles": "reader"}
    assert claim(client, {}, headers=reader).status_code == 403
    # The release rule of its own: a policy file that takes it away keeps the claim.
    arq = claim(client, {"hostname": "claim-node"}).json["arqs"][0]
    policy = tmp_path / "policy.yaml"
    policy.write_text('"acceld:arq:release": "!"\n')
    from acceld.api.app import build_app
    from falcon import testing
    conf.set_override("policy_file", str(policy), group="oslo_policy")
    strict = testing.TestClient(build_app(conf, db))
    result = strict.simulate_delete(f"{ARQS}/{arq['uuid']}", headers=member(PROJECT))
    assert result.status_code == 403 and "acceld:arq:release" in fault(result)
    assert counts(db)["arqs"] == 1
    # Another project sees nothing to release.
    assert client.simulate_delete(f"{ARQS}/{arq['uuid']}",
                                  headers=member("project-b")).status_code == 404


def test_nova_cannot_bind_or_unbind_a_claim(client, conf, db, fpga, profile):
    arq = claim(client, {"hostname": "claim-node"}).json["arqs"][0]
    run_binds(conf, db)
    for ops in ([{"op": "remove", "path": "/hostname"},
                 {"op": "remove", "path": "/device_rp_uuid"},
                 {"op": "remove", "path": "/instance_uuid"}],
                [{"op": "add", "path": "/hostname", "value": "claim-node"},
                 {"op": "add", "path": "/device_rp_uuid",
                  "value": fpga["deployable"]["rp_uuid"]},
                 {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())}]):
        result = client.simulate_patch(ARQS, json={arq["uuid"]: ops}, headers=SERVICE)
        assert result.status_code == 409 and "standalone claim" in fault(result)
    assert show(client, arq["uuid"]).json["state"] == "Bound"


def test_a_claim_counts_against_the_quota(client, conf, db, fpga, profile):
    conf.set_override("arqs_per_project", 1, group="quota")
    assert claim(client, {"hostname": "claim-node"}).status_code == 201
    result = claim(client, {"hostname": "claim-node"})
    assert result.status_code == 403, result.text
    assert counts(db)["arqs"] == 1


def test_a_consumer_that_is_a_nova_instance_is_refused(client, db, fpga, profile):
    plain = client.simulate_post(ARQS, json={"device_profile_name": "fpga1"},
                                 headers=SERVICE).json["arqs"][0]
    instance = str(uuid.uuid4())
    assert client.simulate_patch(ARQS, headers=SERVICE, json={plain["uuid"]: [
        {"op": "add", "path": "/hostname", "value": "claim-node"},
        {"op": "add", "path": "/device_rp_uuid", "value": fpga["deployable"]["rp_uuid"]},
        {"op": "add", "path": "/instance_uuid", "value": instance}]}).status_code == 202
    result = claim(client, {}, consumer_uuid=instance)
    assert result.status_code == 409 and "Nova instance" in fault(result)


def test_a_forced_host_retire_fails_the_claim_and_frees_its_allocation(client, conf, db,
                                                                       fpga, profile):
    from acceld.db import host_retire
    arq = claim(client, {"hostname": "claim-node"}).json["arqs"][0]
    run_binds(conf, db)
    host_retire.retire(db, "claim-node", force=True)
    assert show(client, arq["uuid"]).json["state"] == "BindFailed"
    with db.read() as conn:
        assert conn.scalar(select(claim_consumers.c.due)) is True
        assert claims_db.desired(conn, arq["consumer_uuid"]) == {}


def test_a_disable_after_the_claim_fails_its_bind(client, conf, db, fpga, profile):
    """The bind checks again what the claim's choice saw: a device disabled in between is
    not bound (BindFailed saying so), and the consumer is due for its allocation."""
    arq = claim(client, {"hostname": "claim-node"}).json["arqs"][0]
    assert client.simulate_post(f"/accelerator/v2/devices/{fpga['device']['uuid']}/disable",
                                headers=ADMIN).status_code == 200
    run_binds(conf, db)
    failed = show(client, arq["uuid"], headers=ADMIN).json
    assert failed["state"] == "BindFailed"
    assert failed["bind_failure_reason"] == (f"device {fpga['device']['uuid']} is disabled "
                                             "(status maintaining)")
    with db.read() as conn:
        assert conn.scalar(select(claim_consumers.c.due)) is True
        assert conn.scalar(select(func.count()).select_from(attach_handles).where(
            attach_handles.c.in_use.is_(True))) == 0


def test_a_host_whose_agent_is_down_is_not_claimed(client, db, fpga, profile):
    from sqlalchemy import insert
    from acceld.db.models import agents, utcnow
    with db.write() as conn:
        conn.execute(insert(agents).values(hostname="claim-node", endpoint="http://x:1",
                                           state="down", heartbeat_interval=10,
                                           last_seen_at=utcnow(), created_at=utcnow()))
    result = claim(client, {"hostname": "claim-node"}, headers=ADMIN)
    assert result.status_code == 409
    assert "the agent of host claim-node is down" in fault(result)
    assert "agent" not in fault(claim(client, {"hostname": "claim-node"}))
    assert counts(db)["arqs"] == 0


class _AwayPlacement:
    """A Placement client whose every call fails as an outage, until ``back``."""

    def __init__(self) -> None:
        self.back = False

    def consumer(self, consumer_uuid: str):  # type: ignore[no-untyped-def]
        from acceld.clients import placement as pl

        if not self.back:
            raise pl.PlacementUnavailable("connection refused")
        return pl.Consumer({}, None, None, None, None)


def test_a_placement_outage_is_logged_once_each_way_by_the_release_drain(
        client, conf, db, fpga, profile, caplog) -> None:
    """Three released claims retried through an outage: one WARNING when it starts, one
    when it ends, none per consumer or try (acceld.outages)."""
    import logging

    from acceld import outages
    from acceld.conductor.placement.claim_allocations import ClaimAllocationWorker

    for n in range(2):  # three claims on the host: three devices
        inventory.add_fpga(db, hostname="claim-node", name=f"More{n}")
    made = []
    for _ in range(3):
        result = claim(client, {"hostname": "claim-node"})
        assert result.status_code == 201, result.text
        made += [a["uuid"] for a in result.json["arqs"]]
    run_binds(conf, db)
    for arq in made:
        assert client.simulate_delete(f"{ARQS}/{arq}", headers=member(PROJECT)).status_code \
            == 204
    placement = _AwayPlacement()
    worker = ClaimAllocationWorker(conf, db, client=placement)  # type: ignore[arg-type]
    assert not outages.process_log().is_down(outages.PLACEMENT)
    with caplog.at_level(logging.WARNING):
        assert worker.run_once() == 3
        with db.write() as conn:  # due again at once: another try through the outage
            conn.execute(claim_consumers.update().values(lease_expires_at=None))
        worker.run_once()
        placement.back = True
        with db.write() as conn:
            conn.execute(claim_consumers.update().values(lease_expires_at=None))
        assert worker.run_once() == 3
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 2, lines
    assert lines[0].startswith("Placement is unavailable: connection refused; claims' "
                               "allocations wait for it"), lines
    assert lines[1].startswith("Placement is available again after "), lines
    assert counts(db)["consumers"] == 0


# -- what a refused claim tells a project member (issue 37, item 3) -----------------------

def _others_and_theirs(client, conf, db, fpga):  # type: ignore[no-untyped-def]
    """A fleet where nothing is free for project-a: claim-node's two handles held by
    project-b's claim and a Nova instance of project-b; sick-node disabled by an operator;
    ecc-node quarantined; down-node's agent down. What project-a may not learn, and
    project-a's own ARQ (Bound, on free-node, which it may)."""
    from sqlalchemy import update
    other = claim(client, {"hostname": "claim-node"}, headers=member("project-b")).json
    [theirs] = other["arqs"]
    plain = client.simulate_post(ARQS, json={"device_profile_name": "fpga1"},
                                 headers=SERVICE).json["arqs"][0]
    instance = str(uuid.uuid4())
    assert client.simulate_patch(ARQS, headers=SERVICE, json={plain["uuid"]: [
        {"op": "add", "path": "/hostname", "value": "claim-node"},
        {"op": "add", "path": "/device_rp_uuid", "value": fpga["deployable"]["rp_uuid"]},
        {"op": "add", "path": "/instance_uuid", "value": instance}]}).status_code == 202
    sick = inventory.add_fpga(db, hostname="sick-node", handles=1)
    ecc = inventory.add_fpga(db, hostname="ecc-node", handles=1)
    mine = inventory.add_fpga(db, hostname="free-node", handles=1)
    with db.write() as conn:
        conn.execute(update(devices).where(devices.c.id == sick["device"]["id"]).values(
            status="maintaining", status_reason="fan swap, ticket OPS-1432"))
        conn.execute(update(devices).where(devices.c.id == ecc["device"]["id"]).values(
            quarantined=True, health="critical", health_reason="uncorrectable ECC errors: 3"))
    [own] = claim(client, {"hostname": "free-node"}).json["arqs"]
    run_binds(conf, db)
    secrets = [theirs["uuid"], theirs["consumer_uuid"], plain["uuid"], instance,
               "project-b", "fan swap", "OPS-1432", "ECC errors", "critical", "sick-node",
               "ecc-node", "quarantin", "disabled", "promised", "attach handles free",
               fpga["device"]["uuid"], fpga["deployable"]["name"], sick["device"]["uuid"],
               ecc["device"]["uuid"], mine["deployable"]["name"]]
    return secrets, own


def test_a_refused_claim_tells_a_member_only_what_is_theirs(client, conf, db, fpga, profile):
    secrets, own = _others_and_theirs(client, conf, db, fpga)
    for where in ({}, {"hostname": "claim-node"}, {"hostname": "sick-node"},
                  {"hostname": "ecc-node"}, {"hostname": "free-node"}):
        result = claim(client, where)
        assert result.status_code == 409, (where, result.text)
        text = fault(result)
        leaked = [s for s in secrets if s.lower() in text.lower()
                  and s != where.get("hostname")]  # the host it named is echoed
        assert not leaked, (where, leaked, text)
        assert "fpga1" in text and "/explain" in text
    # Its own ARQ holding the profile's kind of accelerator is named, where it is.
    anywhere = fault(claim(client, {}))
    assert f"ARQ {own['uuid']} (Bound, consumer {own['consumer_uuid']}) on host free-node" \
        in anywhere
    assert own["uuid"] not in fault(claim(client, {"hostname": "claim-node"}))
    # An administrator (who may explain) reads every reason, as explain gives them.
    for host, words in (("sick-node", "fan swap, ticket OPS-1432"),
                        ("ecc-node", "uncorrectable ECC errors: 3"), ("claim-node", secrets[0])):
        full = fault(claim(client, {"hostname": host}, headers=ADMIN))
        assert words in full, (words, full)


def test_a_member_cannot_tell_an_unknown_host_from_a_busy_one(client, conf, db, fpga,
                                                             profile):
    _others_and_theirs(client, conf, db, fpga)
    before = counts(db)
    answers = {}
    for host in ("claim-node", "sick-node", "nowhere", "no-such-host-7"):
        result = claim(client, {"hostname": host})
        assert result.status_code == 409, (host, result.text)
        answers[host] = fault(result).replace(host, "HOST")
    assert len(set(answers.values())) == 1, answers
    assert counts(db) == before
    # An administrator still gets the 400 that says the host is unknown.
    result = claim(client, {"hostname": "nowhere"}, headers=ADMIN)
    assert result.status_code == 400 and "Host nowhere has no accelerator" in fault(result)


def test_a_refused_claim_names_the_profiles_kind_first(client, db, profile):
    """The administrator's 409 names the reasons of providers of the profile's kind before
    the others (issue 40): here the FPGA's setup_required, not three GPUs that come first
    by name."""
    with db.write() as conn:
        for n in range(3):
            dev = inventory.add_device(conn, hostname=f"aa-gpu-{n}", type="GPU")
            dep = inventory.add_deployable(conn, dev["id"], name=f"aa-gpu-{n}_gpu",
                                           attrs={"rc": "PGPU"})
            inventory.add_attach_handles(conn, dep["id"], 1)
    fpga = inventory.add_fpga(db, hostname="zz-node")
    with db.write() as conn:
        conn.execute(update(devices).where(devices.c.id == fpga["device"]["id"]).values(
            acc_status="setup_required", status_reason="IOMMU is off: intel_iommu=on"))
    before = counts(db)
    result = claim(client, {}, headers=ADMIN)
    assert result.status_code == 409, result.text
    text = fault(result)
    assert "zz-node_FakeDevice on zz-node: device " in text
    assert "is setup_required: IOMMU is off: intel_iommu=on" in text
    assert "aa-gpu" not in text  # another kind: counted, not listed
    assert "3 provider(s) of another kind" in text
    assert counts(db) == before


@pytest.mark.parametrize("where", [{"hostname": "claim-node"}, {}])
def test_a_claim_that_loses_the_race_is_409_before_it_is_created(client, conf, db, fpga,
                                                                monkeypatch, where):
    """Two claims choose the last free handles at once: the one whose transaction comes
    second re-judges its choice under the deployable's lock and answers 409, instead of
    201 and BindFailed (issue 40). The interleaving is forced at the exact point: another
    project's claim is created between this one's choice and its transaction. The loser,
    a member, reads the member's answer (no host it did not name)."""
    from acceld.api import claim_targets
    assert client.simulate_post(DPS, headers=ADMIN, json=[
        {"name": "fpga1", "groups": [{"resources:FPGA": "2"}]}]).status_code == 201
    real = claim_targets.choose
    seen: list[int] = []

    def choose_then_lose(*args, **kwargs):  # type: ignore[no-untyped-def]
        targets = real(*args, **kwargs)
        if not seen:
            seen.append(1)
            other = claim(client, {"hostname": "claim-node"}, headers=member("project-b"))
            assert other.status_code == 201, other.text  # takes both handles first
        return targets

    monkeypatch.setattr(claim_targets, "choose", choose_then_lose)
    before = counts(db)
    result = claim(client, where)
    assert result.status_code == 409, result.text
    text = fault(result)
    place = "on host claim-node" if where else "on any host"
    assert f"No accelerator can be claimed for device profile fpga1 {place} now." in text
    if not where:
        assert "claim-node" not in text
    assert "project-b" not in text and "promised" not in text
    after = counts(db)
    assert after["arqs"] == before["arqs"] + 2  # the winner's two, none of the loser's
    admin = claim(client, {"hostname": "claim-node"}, headers=ADMIN)
    assert admin.status_code == 409 and "promised to 2 bind(s) in progress" in fault(admin)
    run_binds(conf, db)
    with db.read() as conn:
        states = sorted(conn.scalars(select(accelerator_requests.c.state)))
    assert states == ["Bound", "Bound"]
