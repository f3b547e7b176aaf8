"""The tenant wall around standalone claims (API 2.8), attacked from outside through the real
components: a real Keystone 30 (two projects; member, reader and admin tokens), a real
Placement, and `acceld api` as a process validating tokens with that Keystone, on SQLite,
PostgreSQL and MariaDB (issue 37 items 3 and 4).

Project A (``demo``) holds a Bound claim under a consumer of its own on a host whose only
accelerator that takes. A member of project B (``demo2``) then tries to learn anything of
it (ARQ, consumer and project uuids, host and device names, Placement providers) through
its show, release, list, marker and explain answers and through the 409s of its own claims,
to take A's consumer or A's Nova instance's for its own claims, and to keep A from claiming
under its consumer again; a reader of A tries every write. Each refusal is compared with the
answer for a uuid or host nobody has, word for word (the uuid or host replaced).
"""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import Any, Iterator

import pytest
import requests
from sqlalchemy import func, select

from acceld.db.engine import Database
from acceld.db.models import accelerator_requests, claim_consumers
from tests.integration.test_standalone_claims_placement import allocations, fleet
from tests.support import keystone
from tests.support.binds import run_binds
from tests.support.placement import PlacementServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ARQS = "/v2/accelerator_requests"
A, B, A_READER, ADMIN = "demo-member", "demo2-member", "demo-reader", "demo-admin"


class Api:
    """Calls to the `acceld api` process with a persona's Keystone token."""

    def __init__(self, ks: keystone.Keystone, base: str) -> None:
        self.ks, self.base = ks, base

    def __call__(self, method: str, path: str, user: str, version: str = "2.8",
                 **kwargs: Any) -> requests.Response:
        headers = {"X-Auth-Token": self.ks.token(user),
                   "OpenStack-API-Version": f"accelerator {version}"}
        return requests.request(method, f"{self.base}/accelerator{path}", headers=headers,
                                timeout=30, **kwargs)

    def claim(self, user: str, **body: Any) -> requests.Response:
        return self("POST", ARQS, user, json={"device_profile_name": "dp", **body})


def words(resp: requests.Response) -> str:
    """The faultstring of an upstream-shaped error body."""
    return json.loads(resp.json()["error_message"])["faultstring"]


@pytest.fixture
def wall(ks, placement: PlacementServer, pconf, db: Database, tag: str,
         tmp_path) -> Iterator[dict]:
    """Two hosts with two accelerators each, synced to Placement, a profile for one,
    `acceld api` on ``db``, and A's workload: two claims Bound on the first host (full)
    under A's consumer, its allocation written in Placement."""
    hosts, rps, rc = fleet(placement, pconf, db, tag, hosts=2, handles=2)
    (tmp_path / "api").mkdir()
    with keystone.acceld_api(ks, tmp_path / "api", placement.config_lines(),
                             database=db) as proc:
        api = Api(ks, proc["base"])
        made = api("POST", "/v2/device_profiles", ADMIN, json=[
            {"name": "dp", "groups": [{f"resources:{rc}": "1",
                                       f"trait:CUSTOM_CT_{tag}": "required"}]}])
        assert made.status_code == 201, made.text
        consumer = str(uuidlib.uuid4())
        arqs = []
        for _ in range(2):
            taken = api.claim(A, claim={"hostname": hosts[0]}, consumer_uuid=consumer)
            assert taken.status_code == 201, taken.text
            arqs += taken.json()["arqs"]
        run_binds(pconf, db)
        shown = [api("GET", f"{ARQS}/{a['uuid']}", A).json() for a in arqs]
        assert [a["state"] for a in shown] == ["Bound", "Bound"], shown
        assert allocations(placement, consumer) == {rps[0]: {rc: 2}}
        yield {"api": api, "arq": shown[0], "arqs": shown, "consumer": consumer,
               "hosts": hosts, "rps": rps, "rc": rc, "project_a": ks.project_id("demo"),
               "pconf": pconf}


def _secrets(wall: dict, db: Database) -> list[str]:
    """What project B must never read: A's ARQ, consumer and project, the host A's claim is
    on (B did not name it), the deployable's name and the providers."""
    from acceld.db.models import deployables
    with db.read() as conn:
        names = list(conn.execute(select(deployables.c.name)).scalars())
    return [*(a["uuid"] for a in wall["arqs"]), wall["consumer"], wall["project_a"], *names, *wall["rps"]]


def _b_rows(db: Database, project_b: str) -> tuple[int, int]:
    with db.read() as conn:
        return (conn.execute(select(func.count()).select_from(accelerator_requests).where(
                    accelerator_requests.c.project_id == project_b)).scalar_one(),
                conn.execute(select(func.count()).select_from(claim_consumers).where(
                    claim_consumers.c.project_id == project_b)).scalar_one())


def test_b_reads_nothing_of_a_claim(wall, db, ks):
    api, arq = wall["api"], wall["arq"]
    free = str(uuidlib.uuid4())
    for method, path in (("GET", f"{ARQS}/{{}}"), ("DELETE", f"{ARQS}/{{}}"),
                         ("DELETE", f"{ARQS}?arqs={{}}")):
        theirs = api(method, path.format(arq["uuid"]), B)
        nobodys = api(method, path.format(free), B)
        assert theirs.status_code == nobodys.status_code == 404, theirs.text
        assert words(theirs).replace(arq["uuid"], "U") == words(nobodys).replace(free, "U")
    # Releasing "by instance" (A's consumer as if it were one) is Nova's, with its token.
    assert api("DELETE", f"{ARQS}?instance={wall['consumer']}", B).status_code == 403
    listed = api("GET", ARQS, B).json()["arqs"]
    assert listed == []
    assert api("GET", f"{ARQS}?instance={wall['consumer']}", B).json()["arqs"] == []
    theirs = api("GET", f"{ARQS}?limit=1&marker={arq['uuid']}", B)
    nobodys = api("GET", f"{ARQS}?limit=1&marker={free}", B)
    assert theirs.status_code == nobodys.status_code == 400
    assert words(theirs).replace(arq["uuid"], "U") == words(nobodys).replace(free, "U")
    assert api("GET", "/v2/device_profiles/dp/explain", B, "2.7").status_code == 403
    for path in ("/v2/devices", "/v2/deployables", "/v2/hosts"):
        assert api("GET", path, B).status_code == 403, path
    # A's claim is as it was.
    assert api("GET", f"{ARQS}/{arq['uuid']}", A).json()["state"] == "Bound"


def test_b_claims_tell_nothing_of_a_and_no_host_can_be_probed(wall, db):
    """A host whose accelerators A holds, one an operator disabled (saying why), and one
    acceld does not know read the same to B, and name nothing of A nor of the operator."""
    api = wall["api"]
    busy, disabled = wall["hosts"]
    unknown = f"nowhere-{uuidlib.uuid4().hex[:8]}"
    secret_text = f"RMA case {uuidlib.uuid4().hex} for tenant demo"
    [device] = [d for d in api("GET", "/v2/devices", ADMIN).json()["devices"]
                if d["hostname"] == disabled]
    made = api("PATCH", f"/v2/devices/{device['uuid']}", ADMIN, json=[
        {"op": "replace", "path": "/status", "value": "disabled", "reason": secret_text}])
    assert made.status_code == 204, made.text
    answers = {}
    for host in (busy, disabled, unknown):
        resp = api.claim(B, claim={"hostname": host})
        assert resp.status_code == 409, resp.text
        answers[host] = words(resp).replace(host, "HOST")
    assert answers[busy] == answers[disabled] == answers[unknown]
    for secret in [*_secrets(wall, db), secret_text, device["uuid"]]:
        assert secret not in answers[busy], secret
    # What B is spared is there to be told: an administrator reads it.
    told = api.claim(ADMIN, claim={"hostname": disabled})
    assert told.status_code == 409 and secret_text in words(told), told.text
    told = api.claim(ADMIN, claim={"hostname": busy})
    assert told.status_code == 409 and wall["arq"]["uuid"] in words(told), told.text
    # Without a host: the same sentence, "on any host".
    anywhere = api.claim(B, claim={})
    assert anywhere.status_code == 409, anywhere.text
    for secret in [*_secrets(wall, db), secret_text, busy, disabled]:
        assert secret not in words(anywhere), secret
    project_b = wall["api"].ks.project_id("demo2")
    assert _b_rows(db, project_b) == (0, 0)


def test_b_takes_neither_a_consumer_nor_a_nova_instance(wall, db, placement):
    api, consumer = wall["api"], wall["consumer"]
    project_b = api.ks.project_id("demo2")
    # A Nova instance of project A: its allocation is on its compute node (not acceld's).
    node = placement.get("/resource_providers", name=wall["hosts"][0]).json()[
        "resource_providers"][0]["uuid"]
    instance = str(uuidlib.uuid4())
    put = placement.put(f"/allocations/{instance}", {
        "allocations": {node: {"resources": {"VCPU": 1}}}, "project_id": wall["project_a"],
        "user_id": "u", "consumer_generation": None, "consumer_type": "INSTANCE"})
    assert put.status_code == 204, put.text
    refused = {}
    for taken in (consumer, instance):
        resp = api.claim(B, claim={"hostname": wall["hosts"][1]}, consumer_uuid=taken)
        assert resp.status_code == 409, resp.text
        refused[taken] = words(resp).replace(taken, "U")
    assert refused[consumer] == refused[instance]
    for secret in _secrets(wall, db):
        assert secret not in refused[consumer], secret
    assert _b_rows(db, project_b) == (0, 0)
    assert allocations(placement, consumer) == {wall["rps"][0]: {wall["rc"]: 2}}
    assert allocations(placement, instance) == {node: {"VCPU": 1}}
    # A is not kept from its own consumer: a second claim of A's workload under it.
    again = api.claim(A, claim={"hostname": wall["hosts"][1]}, consumer_uuid=consumer)
    assert again.status_code == 201, again.text
    run_binds(wall["pconf"], db)
    assert allocations(placement, consumer) == {wall["rps"][0]: {wall["rc"]: 2},
                                                wall["rps"][1]: {wall["rc"]: 1}}
    held = placement.get(f"/allocations/{consumer}").json()
    assert held["project_id"] == wall["project_a"]
    # A free uuid is B's to take (the wall is not a refusal of every consumer).
    mine = api.claim(B, claim={"hostname": wall["hosts"][1]},
                     consumer_uuid=str(uuidlib.uuid4()))
    assert mine.status_code == 201, mine.text


def test_a_reader_writes_nothing(wall, db):
    api, arq = wall["api"], wall["arq"]
    before = _b_rows(db, wall["project_a"])
    assert api.claim(A_READER, claim={}).status_code == 403
    assert api.claim(A_READER, claim={}, consumer_uuid=wall["consumer"]).status_code == 403
    assert api("POST", ARQS, A_READER, json={"device_profile_name": "dp"}).status_code == 403
    assert api("DELETE", f"{ARQS}/{arq['uuid']}", A_READER).status_code == 403
    assert api("DELETE", f"{ARQS}?arqs={arq['uuid']}", A_READER).status_code == 403
    assert api("PATCH", f"{ARQS}/{arq['uuid']}", A_READER,
               json={arq["uuid"]: [{"op": "remove", "path": "/hostname"}]}).status_code == 403
    assert _b_rows(db, wall["project_a"]) == before
    assert api("GET", f"{ARQS}/{arq['uuid']}", A_READER).json()["state"] == "Bound"
