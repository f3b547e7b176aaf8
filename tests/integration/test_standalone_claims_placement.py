"""Standalone claims (API 2.8) against a real Placement (openstack-placement 16.0.0): acceld
writes the allocation under the claim's consumer, binds, and on release removes it, through
a queued write that survives a conductor dying in the middle; a write that read before a
release is refused or undone (a hook between its reads and its request), the audit finds
what no mark told of (a release through the previous release's API, a writer dead after a
write Placement could not refuse), and a claim takes only a consumer that is its project's
or nobody's (Placement's and Nova's view).

The conductor's own sync writes the providers (as in a deployment); each test names its own
compute nodes and gives its resource class and trait a per-test suffix, so the shared
Placement's other providers never answer.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

import pytest
from falcon import testing
from sqlalchemy import select, update

from acceld.api.app import build_app
from acceld.conductor.placement import claim_allocations
from acceld.conductor.binding.worker import BindWorker
from acceld.conductor.placement.claim_allocations import ClaimAllocationWorker
from acceld.conductor.placement.sync import PlacementSync
from acceld.db.engine import Database
from acceld.db.models import claim_consumers
from acceld.db.placement_flags import provider_uuid
from tests.helpers import ADMIN, fault, member, version
from tests.support import inventory
from tests.support.binds import run_binds
from tests.support.placement import PlacementServer

pytestmark = pytest.mark.integration

ARQS = "/accelerator/v2/accelerator_requests"
V28 = {**member("project-c"), **version("2.8")}


@pytest.fixture
def api(pconf, db) -> testing.TestClient:
    return testing.TestClient(build_app(pconf, db))


def fleet(placement: PlacementServer, pconf, db: Database, tag: str, hosts: int = 2,
          handles: int = 1) -> tuple[list[str], list[str], str]:
    """``hosts`` compute nodes, one accelerator each, synced; (hosts, provider uuids, rc)."""
    rc, trait = f"CUSTOM_CLAIM_{tag}", f"CUSTOM_CT_{tag}"
    names, rps = [f"cl-{tag.lower()}-{n}" for n in range(hosts)], []
    for host in names:
        placement.create_compute_node(host)
        name = f"{host}_fpga"
        with db.write() as conn:
            dev = inventory.add_device(conn, hostname=host)
            dep = inventory.add_deployable(conn, dev["id"], name=name,
                                           num_accelerators=handles,
                                           rp_uuid=provider_uuid(name),
                                           attrs={"rc": rc, "trait0": trait})
            inventory.add_attach_handles(conn, dep["id"], handles)
        rps.append(dep["rp_uuid"])
    result = PlacementSync(pconf, db).sync_once()
    assert not result.failed and not result.waiting_hosts, result
    return names, rps, rc


def profile(api: testing.TestClient, rc: str, tag: str, amount: int = 1) -> None:
    result = api.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
        {"name": "dp", "groups": [{f"resources:{rc}": str(amount),
                                   f"trait:CUSTOM_CT_{tag}": "required"}]}])
    assert result.status_code == 201, result.text


def claim(api: testing.TestClient, **body: Any):  # type: ignore[no-untyped-def]
    return api.simulate_post(ARQS, json={"device_profile_name": "dp", **body}, headers=V28)


def allocations(placement: PlacementServer, consumer: str) -> dict[str, dict[str, int]]:
    body = placement.get(f"/allocations/{consumer}").json()
    return {rp: a["resources"] for rp, a in body["allocations"].items()}


def show(api: testing.TestClient, arq: str) -> dict:
    return api.simulate_get(f"{ARQS}/{arq}", headers=V28).json


def test_claim_allocates_binds_and_release_removes(placement, pconf, db, api, tag):
    hosts, rps, rc = fleet(placement, pconf, db, tag)
    profile(api, rc, tag)
    result = claim(api, claim={"hostname": hosts[1]})
    assert result.status_code == 201, result.text
    [arq] = result.json["arqs"]
    assert (arq["hostname"], arq["device_rp_uuid"]) == (hosts[1], rps[1])
    assert run_binds(pconf, db).sent == []  # no Nova event
    bound = show(api, arq["uuid"])
    assert bound["state"] == "Bound" and bound["attach_handle_info"]
    assert allocations(placement, arq["consumer_uuid"]) == {rps[1]: {rc: 1}}
    consumer = placement.get(f"/allocations/{arq['consumer_uuid']}").json()
    assert (consumer["project_id"], consumer["user_id"]) == ("project-c", "user-project-c")
    assert consumer["consumer_type"] == claim_allocations.CONSUMER_TYPE

    assert api.simulate_delete(f"{ARQS}/{arq['uuid']}",
                               headers=member("project-c")).status_code == 204
    assert ClaimAllocationWorker(pconf, db).run_once() == 1
    assert allocations(placement, arq["consumer_uuid"]) == {}
    with db.read() as conn:
        assert conn.execute(select(claim_consumers)).first() is None


def test_placement_picks_the_host_and_one_consumer_holds_a_workload(placement, pconf, db,
                                                                    api, tag):
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=2, handles=2)
    profile(api, rc, tag, amount=2)
    # Placement has the first host's provider full: only the second is a candidate.
    other = str(uuidlib.uuid4())
    resp = placement.put(f"/allocations/{other}", {
        "allocations": {rps[0]: {"resources": {rc: 1}}}, "project_id": "p", "user_id": "u",
        "consumer_generation": None, "consumer_type": "INSTANCE"})
    assert resp.status_code == 204, resp.text
    workload = str(uuidlib.uuid4())
    result = claim(api, claim={}, consumer_uuid=workload)
    assert result.status_code == 201, result.text
    arqs = result.json["arqs"]
    assert {(a["hostname"], a["device_rp_uuid"], a["consumer_uuid"]) for a in arqs} == {
        (hosts[1], rps[1], workload)}
    run_binds(pconf, db)
    assert [show(api, a["uuid"])["state"] for a in arqs] == ["Bound", "Bound"]
    assert allocations(placement, workload) == {rps[1]: {rc: 2}}
    # One ARQ of the workload released: its part of the allocation goes, the other's stays.
    assert api.simulate_delete(f"{ARQS}/{arqs[0]['uuid']}",
                               headers=member("project-c")).status_code == 204
    ClaimAllocationWorker(pconf, db).run_once()
    assert allocations(placement, workload) == {rps[1]: {rc: 1}}
    # No candidate left anywhere (Placement's view): 409 naming why (to who may explain),
    # nothing created.
    result = api.simulate_post(ARQS, json={"device_profile_name": "dp", "claim": {}},
                               headers={**ADMIN, **version("2.8")})
    assert result.status_code == 409, result.text
    assert "Placement offers no candidate" in fault(result)
    result = claim(api, claim={})
    assert result.status_code == 409 and "Placement" not in fault(result)


def test_placement_refusing_the_allocation_fails_the_bind(placement, pconf, db, api, tag):
    """Placement filled between the claim and its bind (Nova scheduled onto it): the bind's
    allocation is refused, the claim ends BindFailed saying so, no handle taken."""
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=1)
    profile(api, rc, tag)
    [arq] = claim(api, claim={"hostname": hosts[0]}).json["arqs"]
    instance = str(uuidlib.uuid4())
    assert placement.put(f"/allocations/{instance}", {
        "allocations": {rps[0]: {"resources": {rc: 1}}}, "project_id": "p", "user_id": "u",
        "consumer_generation": None, "consumer_type": "INSTANCE"}).status_code == 204
    run_binds(pconf, db)
    failed = api.simulate_get(f"{ARQS}/{arq['uuid']}", headers={**ADMIN, **version("2.8")}).json
    assert failed["state"] == "BindFailed"
    # Its owner reads that it failed; the reason names hardware, for administrators.
    assert show(api, arq["uuid"])["state"] == "BindFailed"
    assert failed["bind_failure_reason"].startswith(
        f"Placement refused the allocation of consumer {arq['consumer_uuid']}")
    assert allocations(placement, arq["consumer_uuid"]) == {}
    assert allocations(placement, instance) == {rps[0]: {rc: 1}}  # Nova's left alone


def test_release_survives_a_conductor_dying_mid_write(placement, pconf, db, api, tag,
                                                      monkeypatch):
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=1)
    profile(api, rc, tag)
    [arq] = claim(api, claim={"hostname": hosts[0]}).json["arqs"]
    run_binds(pconf, db)
    consumer = arq["consumer_uuid"]
    assert allocations(placement, consumer) == {rps[0]: {rc: 1}}
    assert api.simulate_delete(f"{ARQS}/{arq['uuid']}",
                               headers=member("project-c")).status_code == 204

    class Died(BaseException):
        pass

    def die(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise Died  # the process is gone after claiming the row, before writing Placement

    with monkeypatch.context() as patched:
        patched.setattr(claim_allocations, "write", die)
        with pytest.raises(Died):
            ClaimAllocationWorker(pconf, db).run_once()
    assert allocations(placement, consumer) == {rps[0]: {rc: 1}}  # still there
    # Its lease holds the row for now; once it lapses, another conductor takes it up.
    assert ClaimAllocationWorker(pconf, db).run_once() == 0
    with db.write() as conn:
        conn.execute(update(claim_consumers).values(lease_expires_at=None))
    assert ClaimAllocationWorker(pconf, db).run_once() == 1
    assert allocations(placement, consumer) == {}


def test_a_bind_dying_after_its_allocation_is_taken_up_once(placement, pconf, db, api, tag,
                                                           monkeypatch):
    """The conductor dies between writing the claim's allocation and its bind transaction:
    the job's lease lapses, the next try writes the same allocation again (not twice) and
    binds."""
    from acceld.conductor.binding import target as bind_target
    from acceld.db.models import bind_jobs
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=1, handles=2)
    profile(api, rc, tag)
    [arq] = claim(api, claim={"hostname": hosts[0]}).json["arqs"]

    class Died(BaseException):
        pass

    def die(conn, target):  # type: ignore[no-untyped-def]
        raise Died

    with monkeypatch.context() as patched:
        patched.setattr(bind_target, "check_and_take", die)
        with pytest.raises(Died):
            BindWorker(pconf, db).run_once()
    assert allocations(placement, arq["consumer_uuid"]) == {rps[0]: {rc: 1}}
    assert show(api, arq["uuid"])["state"] == "BindStarted"
    with db.write() as conn:
        conn.execute(update(bind_jobs).values(lease_expires_at=None))  # the lease lapsed
    run_binds(pconf, db)
    assert show(api, arq["uuid"])["state"] == "Bound"
    assert allocations(placement, arq["consumer_uuid"]) == {rps[0]: {rc: 1}}


# -- a stale allocation write is refused or undone (issue 37, item 5) ----------------------

def _hook_first_bind_send(monkeypatch, hook) -> list[tuple]:  # type: ignore[no-untyped-def]
    """Run ``hook`` once, inside the first PUT /allocations of the test, after the writer
    read Placement's consumer and the database and before the request leaves; every PUT's
    (consumer, allocations, generation) is recorded."""
    from acceld.clients import placement as pl
    real = pl.PlacementClient.put_allocations
    sent: list[tuple] = []

    def put(self, consumer_uuid, allocations, project_id, user_id, generation,  # type: ignore[no-untyped-def]
            consumer_type):
        if not sent:
            sent.append(("hooked", consumer_uuid, allocations, generation))
            hook()
        else:
            sent.append((consumer_uuid, allocations, generation))
        return real(self, consumer_uuid, allocations, project_id, user_id, generation,
                    consumer_type)

    monkeypatch.setattr(pl.PlacementClient, "put_allocations", put)
    return sent


def test_a_bind_write_that_read_before_a_release_does_not_leak(placement, pconf, db, api,
                                                              tag, monkeypatch):
    """The bind's writer read Placement (no consumer yet) and the database (the ARQ
    BindStarted); the ARQ is deleted and the drain runs (Placement already matches: nothing
    to write); only then does the bind's write leave. The allocation must not outlive the
    claim."""
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=1)
    profile(api, rc, tag)
    [arq] = claim(api, claim={"hostname": hosts[0]}).json["arqs"]
    consumer = arq["consumer_uuid"]

    def release_and_drain() -> None:
        assert api.simulate_delete(f"{ARQS}/{arq['uuid']}",
                                   headers=member("project-c")).status_code == 204
        ClaimAllocationWorker(pconf, db).run_once()

    sent = _hook_first_bind_send(monkeypatch, release_and_drain)
    BindWorker(pconf, db).run_once()
    assert sent and sent[0][:4] == ("hooked", consumer, {rps[0]: {rc: 1}}, None)
    assert allocations(placement, consumer) == {}
    assert placement.get(f"/resource_providers/{rps[0]}/usages").json()["usages"][rc] == 0


def test_a_stale_write_of_a_shared_consumer_is_refused(placement, pconf, db, api, tag,
                                                      monkeypatch):
    """One ARQ of a workload Bound (1 unit in Placement), a second binding: its writer read
    generation G and wants 2 units; the second ARQ is released and drained (Placement holds
    1 unit, as the database says) before the write leaves with G. Placement must refuse it:
    1 unit, not 2, for 1 Bound ARQ."""
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=1, handles=2)
    profile(api, rc, tag)
    workload = str(uuidlib.uuid4())
    [first] = claim(api, claim={"hostname": hosts[0]}, consumer_uuid=workload).json["arqs"]
    run_binds(pconf, db)
    assert show(api, first["uuid"])["state"] == "Bound"
    assert allocations(placement, workload) == {rps[0]: {rc: 1}}
    [second] = claim(api, claim={"hostname": hosts[0]}, consumer_uuid=workload).json["arqs"]

    def release_and_drain() -> None:
        assert api.simulate_delete(f"{ARQS}/{second['uuid']}",
                                   headers=member("project-c")).status_code == 204
        ClaimAllocationWorker(pconf, db).run_once()

    sent = _hook_first_bind_send(monkeypatch, release_and_drain)
    BindWorker(pconf, db).run_once()
    assert sent[0][:3] == ("hooked", workload, {rps[0]: {rc: 2}})
    assert allocations(placement, workload) == {rps[0]: {rc: 1}}
    assert show(api, first["uuid"])["state"] == "Bound"


def test_a_drain_that_finds_placement_right_still_moves_the_generation(placement, pconf, db,
                                                                       api, tag):
    """The fence itself: a due consumer whose allocation already matches is written again,
    so a writer holding the generation read before is refused (negative: an undue
    consumer is not written at all)."""
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=1)
    profile(api, rc, tag)
    [arq] = claim(api, claim={"hostname": hosts[0]}).json["arqs"]
    run_binds(pconf, db)
    consumer = arq["consumer_uuid"]
    before = placement.get(f"/allocations/{consumer}").json()["consumer_generation"]
    assert ClaimAllocationWorker(pconf, db).run_once() == 0  # nothing due: nothing written
    assert placement.get(f"/allocations/{consumer}").json()["consumer_generation"] == before
    with db.write() as conn:
        conn.execute(update(claim_consumers).values(due=True))
    assert ClaimAllocationWorker(pconf, db).run_once() == 1
    after = placement.get(f"/allocations/{consumer}").json()
    assert after["consumer_generation"] == before + 1
    assert {rp: a["resources"] for rp, a in after["allocations"].items()} == {rps[0]: {rc: 1}}


# -- a release through an API replica of the previous release (issue 37, item 11) ----------

def _release_as_previous_release(api, monkeypatch, arq_uuid: str) -> None:  # type: ignore[no-untyped-def]
    """DELETE the ARQ as an API replica of the previous release (f96c44c, before claims)
    does: its ``delete_locked`` is this release's without the ``mark_due`` of the consumer
    (the only difference in what it writes), so the consumer's row is left as it was."""
    from acceld.db import accelerator_requests as arq_db
    with monkeypatch.context() as patched:
        patched.setattr(arq_db.claims, "mark_due", lambda conn, consumers: 0)
        assert api.simulate_delete(f"{ARQS}/{arq_uuid}",
                                   headers=member("project-c")).status_code == 204


def test_a_release_through_a_previous_release_api_is_found_and_removed(placement, pconf, db,
                                                                      api, tag, monkeypatch):
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=1, handles=3)
    profile(api, rc, tag)
    [alone] = claim(api, claim={"hostname": hosts[0]}).json["arqs"]
    workload = str(uuidlib.uuid4())
    [w1] = claim(api, claim={"hostname": hosts[0]}, consumer_uuid=workload).json["arqs"]
    run_binds(pconf, db)
    [w2] = claim(api, claim={"hostname": hosts[0]}, consumer_uuid=workload).json["arqs"]
    _release_as_previous_release(api, monkeypatch, w2["uuid"])  # never bound
    _release_as_previous_release(api, monkeypatch, alone["uuid"])
    worker = ClaimAllocationWorker(pconf, db)
    assert worker.run_once() == 0  # nothing was marked: the drain alone never hears of it
    assert allocations(placement, alone["consumer_uuid"]) == {rps[0]: {rc: 1}}
    # The conductor's audit compares Placement with the database and marks what differs.
    assert worker.audit() == [alone["consumer_uuid"]]
    worker.run_once()
    assert allocations(placement, alone["consumer_uuid"]) == {}
    assert allocations(placement, workload) == {rps[0]: {rc: 1}}
    with db.read() as conn:
        assert list(conn.execute(select(claim_consumers.c.consumer_uuid)).scalars()) == \
            [workload]
    # Part of a shared consumer released the old way: its share goes, the rest stays.
    [w3] = claim(api, claim={"hostname": hosts[0]}, consumer_uuid=workload).json["arqs"]
    run_binds(pconf, db)
    assert allocations(placement, workload) == {rps[0]: {rc: 2}}
    _release_as_previous_release(api, monkeypatch, w1["uuid"])
    generation = placement.get(f"/allocations/{workload}").json()["consumer_generation"]
    assert worker.audit() == [workload]
    worker.run_once()
    assert allocations(placement, workload) == {rps[0]: {rc: 1}}
    assert show(api, w3["uuid"])["state"] == "Bound"
    # Negative: an audit of consumers Placement agrees with marks and writes nothing.
    after = placement.get(f"/allocations/{workload}").json()["consumer_generation"]
    assert after > generation
    assert worker.audit() == []
    assert worker.run_once() == 0
    assert placement.get(f"/allocations/{workload}").json()["consumer_generation"] == after


# -- whose consumer a claim may use (issue 37, item 4) ------------------------------------

def _instance_allocation(placement: PlacementServer, consumer: str, rp: str, rc: str,
                         project: str) -> None:
    """A Nova instance's allocation (consumer type INSTANCE) of ``project`` on ``rp``."""
    resp = placement.put(f"/allocations/{consumer}", {
        "allocations": {rp: {"resources": {rc: 1}}}, "project_id": project,
        "user_id": f"user-{project}", "consumer_generation": None,
        "consumer_type": "INSTANCE"})
    assert resp.status_code == 204, resp.text


def _counts(db: Database) -> tuple[int, int]:
    from sqlalchemy import func
    from acceld.db.models import accelerator_requests
    with db.read() as conn:
        return (conn.scalar(select(func.count()).select_from(accelerator_requests)),
                conn.scalar(select(func.count()).select_from(claim_consumers)))


def test_a_claim_only_uses_a_consumer_that_is_its_projects_or_nobodys(placement, pconf, db,
                                                                     api, tag):
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=1, handles=3)
    profile(api, rc, tag)
    theirs = str(uuidlib.uuid4())  # another project's instance (Placement knows it)
    _instance_allocation(placement, theirs, rps[0], rc, "project-a")
    mine = str(uuidlib.uuid4())  # this project's own instance: Nova's consumer, not a claim's
    _instance_allocation(placement, mine, rps[0], rc, "project-c")
    claimed = str(uuidlib.uuid4())  # another project's standalone claim
    result = api.simulate_post(ARQS, json={"device_profile_name": "dp", "claim": {},
                                           "consumer_uuid": claimed},
                               headers={**member("project-a"), **version("2.8")})
    assert result.status_code == 201, result.text
    before = _counts(db)
    for consumer in (theirs, mine, claimed):
        result = claim(api, claim={}, consumer_uuid=consumer)
        assert result.status_code == 409, (consumer, result.text)
        assert "project-a" not in fault(result) and "consumer_uuid" in fault(result)
        assert _counts(db) == before
    assert allocations(placement, theirs) == {rps[0]: {rc: 1}}
    # Nobody's: taken, and the project's own claim consumer again.
    fresh = str(uuidlib.uuid4())
    for _ in range(2):
        result = claim(api, claim={}, consumer_uuid=fresh)
        assert result.status_code == 201, result.text


def test_a_claim_refused_for_another_projects_consumer_is_not_retried_and_blocks_nobody(
        placement, pconf, db, api, tag):
    """The consumer was nobody's when claimed, and became another project's instance before
    the bind (Placement knows it now): the bind is refused, and the consumer's row neither
    stays due for ever nor keeps the consumer from anyone once it holds nothing."""
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=1, handles=2)
    profile(api, rc, tag)
    consumer = str(uuidlib.uuid4())
    [arq] = claim(api, claim={"hostname": hosts[0]}, consumer_uuid=consumer).json["arqs"]
    _instance_allocation(placement, consumer, rps[0], rc, "project-a")
    run_binds(pconf, db)
    assert show(api, arq["uuid"])["state"] == "BindFailed"
    worker = ClaimAllocationWorker(pconf, db)
    worker.run_once()
    with db.write() as conn:
        conn.execute(update(claim_consumers).values(lease_expires_at=None))
    assert worker.run_once() == 0  # settled: nothing of acceld's to write
    held = placement.get(f"/allocations/{consumer}").json()
    assert (held["project_id"], held["consumer_type"]) == ("project-a", "INSTANCE")
    assert allocations(placement, consumer) == {rps[0]: {rc: 1}}  # left alone
    # The instance goes; its owner's project may now claim under that uuid, although the
    # failed claim (still there, holding nothing) named it first.
    assert placement.delete(f"/allocations/{consumer}").status_code == 204
    result = api.simulate_post(ARQS, json={"device_profile_name": "dp", "claim": {},
                                           "consumer_uuid": consumer},
                               headers={**member("project-a"), **version("2.8")})
    assert result.status_code == 201, result.text
    run_binds(pconf, db)
    [bound] = result.json["arqs"]
    assert api.simulate_get(f"{ARQS}/{bound['uuid']}", headers={
        **ADMIN, **version("2.8")}).json["state"] == "Bound"
    body = placement.get(f"/allocations/{consumer}").json()
    assert body["project_id"] == "project-a" and body["consumer_type"] == "ACCELD_CLAIM"


def test_the_audit_runs_on_one_conductor_every_audit_interval(pconf, db):
    from acceld.conductor.placement.claim_allocations import ClaimAllocationComponent
    pconf.set_override("audit_interval", 123.0, group="placement")
    tasks = {t.name: t for t in ClaimAllocationComponent(pconf, db).periodic_tasks()}
    audit = tasks["claim-allocation-audit"]
    assert (audit.interval, audit.exclusive) == (123.0, True)
    assert not tasks["claim-allocations"].exclusive  # every conductor drains


def test_a_stale_create_whose_writer_dies_is_found_by_the_audit(placement, pconf, db, api,
                                                                tag, monkeypatch):
    """The one write Placement cannot refuse (it creates a consumer Placement no longer has)
    lands after the release's drain, and its conductor dies before reading back: no row
    remembers the consumer. The audit finds the allocation on acceld's provider, a standalone
    claim's that the database does not want, and the drain removes it; another consumer
    on that provider (a Nova instance's) is left alone."""
    from acceld.clients import placement as pl
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=1, handles=2)
    profile(api, rc, tag)
    instance = str(uuidlib.uuid4())
    _instance_allocation(placement, instance, rps[0], rc, "project-a")
    [arq] = claim(api, claim={"hostname": hosts[0]}).json["arqs"]
    consumer = arq["consumer_uuid"]
    real = pl.PlacementClient.put_allocations

    class Died(BaseException):
        pass

    def put_then_die(self, consumer_uuid, allocations, *args):  # type: ignore[no-untyped-def]
        assert api.simulate_delete(f"{ARQS}/{arq['uuid']}",
                                   headers=member("project-c")).status_code == 204
        with monkeypatch.context() as inner:
            inner.setattr(pl.PlacementClient, "put_allocations", real)
            ClaimAllocationWorker(pconf, db).run_once()
        real(self, consumer_uuid, allocations, *args)
        raise Died  # sent, and gone before reading back

    with monkeypatch.context() as patched:
        patched.setattr(pl.PlacementClient, "put_allocations", put_then_die)
        with pytest.raises(Died):
            BindWorker(pconf, db).run_once()
    assert allocations(placement, consumer) == {rps[0]: {rc: 1}}  # the stray
    with db.read() as conn:
        assert conn.execute(select(claim_consumers)).first() is None
    worker = ClaimAllocationWorker(pconf, db)
    assert worker.audit() == [consumer]
    worker.run_once()
    assert allocations(placement, consumer) == {}
    assert allocations(placement, instance) == {rps[0]: {rc: 1}}
    with db.read() as conn:
        assert conn.execute(select(claim_consumers)).first() is None
    assert worker.audit() == []  # negative: nothing left to find


def test_with_placement_a_member_cannot_tell_an_unknown_host_from_a_full_one(placement,
                                                                           pconf, db, api,
                                                                           tag):
    """Placement configured (its candidates judged, the host's tree asked): a host whose only
    accelerator another project's claim holds and a host nobody knows read the same."""
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=1)
    profile(api, rc, tag)
    taken = api.simulate_post(ARQS, json={"device_profile_name": "dp",
                                          "claim": {"hostname": hosts[0]}},
                              headers={**member("project-a"), **version("2.8")})
    assert taken.status_code == 201, taken.text
    run_binds(pconf, db)
    answers = []
    for host in (hosts[0], f"cl-{tag.lower()}-unknown"):
        result = claim(api, claim={"hostname": host})
        assert result.status_code == 409, result.text
        answers.append(fault(result).replace(host, "HOST"))
    assert answers[0] == answers[1]
    assert taken.json["arqs"][0]["uuid"] not in answers[0]


def test_a_claim_under_a_nova_instance_placement_does_not_know_is_refused(placement, pconf,
                                                                        db, api, tag):
    """A shelved and offloaded instance holds nothing in Placement and has no ARQ: only Nova
    knows it (GET /servers?all_tenants=1&uuid=..., any project). A claim under its uuid is
    refused, with the message every consumer that is not the caller's gets; a uuid Nova
    does not know is taken; Nova unreachable is a 503 that creates nothing."""
    from acceld.api.app import build_app
    from tests.support.nova import RecordingNova
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=1, handles=3)
    profile(api, rc, tag)
    nova = RecordingNova().start()
    try:
        pconf.set_override("auth_type", "none", group="nova")
        pconf.set_override("endpoint_override", nova.url, group="nova")
        pconf.set_override("connect_retries", 0, group="nova")
        with_nova = testing.TestClient(build_app(pconf, db))
        shelved = str(uuidlib.uuid4())
        nova.servers.add(shelved)
        before = _counts(db)
        result = claim(with_nova, claim={}, consumer_uuid=shelved)
        assert result.status_code == 409, result.text
        assert "not this project's to claim under" in fault(result)
        assert _counts(db) == before and allocations(placement, shelved) == {}
        assert [r.path for r in nova.requests] == [f"/servers?all_tenants=1&uuid={shelved}"]
        free = str(uuidlib.uuid4())
        result = claim(with_nova, claim={}, consumer_uuid=free)
        assert result.status_code == 201, result.text
        # Without a consumer_uuid the ARQ is its own (new) consumer: Nova is not asked.
        assert claim(with_nova, claim={}).status_code == 201
        assert len(nova.requests) == 2
    finally:
        nova.stop()
    before = _counts(db)
    result = claim(with_nova, claim={}, consumer_uuid=str(uuidlib.uuid4()))
    assert result.status_code == 503 and "Nova could not be asked" in fault(result), \
        result.text
    assert _counts(db) == before


def test_nova_credentials_that_cannot_see_every_project_refuse_the_claim(placement, pconf,
                                                                          db, api, tag):
    """acceld's [nova] user with the service role alone (docs/nova.md: what the events need
    in current Nova) is not an administrator to Nova: a show of another project's server is
    a 404 to it (Nova filters by the caller's project), the same as for a uuid Nova does not
    know. Such an answer must not let a claim take another project's shelved instance's
    uuid: the claim is refused (503, saying why), creates nothing and writes nothing."""
    from acceld.api.app import build_app
    from tests.support.nova import RecordingNova
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=1, handles=2)
    profile(api, rc, tag)
    nova = RecordingNova().start()
    nova.admin = False
    try:
        pconf.set_override("auth_type", "none", group="nova")
        pconf.set_override("endpoint_override", nova.url, group="nova")
        pconf.set_override("connect_retries", 0, group="nova")
        with_nova = testing.TestClient(build_app(pconf, db))
        shelved = str(uuidlib.uuid4())  # another project's instance, shelved and offloaded
        nova.servers.add(shelved)
        before = _counts(db)
        result = claim(with_nova, claim={}, consumer_uuid=shelved)
        assert result.status_code == 503, result.text
        assert "every project's servers" in fault(result), result.text
        assert _counts(db) == before and allocations(placement, shelved) == {}
        # With an administrator's credentials the same uuid is the usual 409, and a free
        # one is taken.
        nova.admin = True
        result = claim(with_nova, claim={}, consumer_uuid=shelved)
        assert result.status_code == 409 and "not this project's" in fault(result), result.text
        assert claim(with_nova, claim={}, consumer_uuid=str(uuidlib.uuid4())).status_code == 201
        # Credentials that may list every project's servers but not filter them by uuid:
        # Nova answers a page of every server, which says nothing of the uuid asked.
        nova.all_filters = False
        before = _counts(db)
        result = claim(with_nova, claim={}, consumer_uuid=str(uuidlib.uuid4()))
        assert result.status_code == 503 and "allow_all_filters" in fault(result), result.text
        assert _counts(db) == before
    finally:
        nova.stop()


def test_an_audit_that_meets_a_placement_outage_stops_without_touching_the_outage_record(
        placement, pconf, db, api, tag):
    """The audit is one more caller of Placement: a pass failing as Placement comes back
    must not log a new outage after the binds and the sync logged its end."""
    from acceld import outages
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=1)
    profile(api, rc, tag)
    claim(api, claim={"hostname": hosts[0]})
    run_binds(pconf, db)
    worker = ClaimAllocationWorker(pconf, db)
    placement.stop()
    try:
        assert worker.audit() == []
    finally:
        placement.start()
    assert not outages.process_log().is_down(outages.PLACEMENT)


def test_a_refused_claim_reads_placements_text_on_one_line(placement, pconf, db, api, tag):
    """A profile naming a trait Placement does not know: Placement refuses the candidates
    query, and the administrator's 409 quotes its text cleaned (one line, no blank lines),
    before anything is created (issue 40)."""
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=1)
    result = api.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
        {"name": "dp", "groups": [{f"resources:{rc}": "1",
                                   f"trait:CUSTOM_CT_{tag}": "required",
                                   f"trait:CUSTOM_NEVER_{tag}": "forbidden"}]}])
    assert result.status_code == 201
    refused = api.simulate_post(ARQS, json={"device_profile_name": "dp",
                                            "claim": {"hostname": hosts[0]}},
                                headers={**ADMIN, **version("2.8")})
    assert refused.status_code == 409, refused.text
    text = fault(refused)
    assert f"CUSTOM_NEVER_{tag}" in text
    assert "\n" not in text and "  " not in text and "<" not in text, text
