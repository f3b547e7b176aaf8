"""/v2/deployables: list, filters, show, and the request side of programming.

Programming end to end through a conductor and an agent is in
tests/unit/test_programming.py and tests/integration/test_programming.py;
here: everything the API decides by itself (validation, policy, not found,
no conductor), each of which must leave the record unchanged.
"""

import json
import uuid

import pytest
from sqlalchemy import insert, select, update

from acceld.db.models import attributes, deployables, utcnow
from tests.conftest import count_queries
from tests.helpers import ADMIN, fault, member
from tests.support import inventory

URL = "/accelerator/v2/deployables"
MANAGER = {"X-User-Id": "mgr", "X-Project-Id": "project-m", "X-Roles": "manager,member,reader"}
FIELDS = ["uuid", "parent_id", "root_id", "name", "num_accelerators", "device_id",
          "attributes_list", "rp_uuid", "driver_name", "bitstream_id", "links", "created_at",
          "updated_at"]
IMAGE = "6f5b5b6e-58a1-4a1e-9a2c-0f1d2e3c4b5a"


def program_body(image=IMAGE):
    return [{"path": "/program", "op": "replace", "value": [{"image_uuid": image}]}]


def seed_body(path="/bitstream", image=IMAGE, op="add"):
    return [{"path": path, "op": op, "value": image}]


def stored(db, dep_uuid):
    with db.read() as conn:
        return conn.execute(select(deployables).where(deployables.c.uuid == dep_uuid)).one()


def test_list_shape(client, db):
    fpga = inventory.add_fpga(db, hostname="peer-host", handles=16)
    dep = fpga["deployable"]
    result = client.simulate_get(URL, headers=ADMIN)
    assert result.status_code == 200
    [body] = result.json["deployables"]
    assert list(body) == FIELDS
    assert body["uuid"] == dep["uuid"]
    assert body["name"] == "peer-host_FakeDevice"
    assert body["num_accelerators"] == 16
    assert body["device_id"] == fpga["device"]["id"]
    assert body["parent_id"] is None and body["root_id"] is None
    assert body["driver_name"] == "fake"
    assert body["rp_uuid"] == dep["rp_uuid"]
    assert body["bitstream_id"] is None
    # A JSON string of one-key objects, in the order the attributes were created.
    assert isinstance(body["attributes_list"], str)
    assert json.loads(body["attributes_list"]) == [{"rc": "FPGA"},
                                                    {"trait0": "CUSTOM_FAKE_DEVICE"}]
    base = "http://falconframework.org/accelerator"
    assert body["links"] == [{"href": f"{base}/v2/deployables/{dep['uuid']}", "rel": "self"},
                             {"href": f"{base}/deployables/{dep['uuid']}", "rel": "bookmark"}]
    assert body["created_at"].endswith("+00:00")


def test_deployable_without_attributes(client, db):
    with db.write() as conn:
        dev = inventory.add_device(conn)
        dep = inventory.add_deployable(conn, dev["id"], attrs={})
    body = client.simulate_get(f"{URL}/{dep['uuid']}", headers=ADMIN).json
    assert body["attributes_list"] == "[]"


def test_filters(client, db):
    with db.write() as conn:
        d1 = inventory.add_device(conn)
        d2 = inventory.add_device(conn)
        a = inventory.add_deployable(conn, d1["id"], name="n_a", driver_name="fake")
        b = inventory.add_deployable(conn, d2["id"], name="n_b", driver_name="intel_fpga")

    def names(query):
        result = client.simulate_get(URL, query_string=query, headers=ADMIN)
        assert result.status_code == 200, result.text
        return [d["name"] for d in result.json["deployables"]]

    assert names("") == ["n_a", "n_b"]
    assert names(f"device_id={d2['id']}") == ["n_b"]
    assert names("name=n_a") == ["n_a"]
    assert names("driver_name=intel_fpga") == ["n_b"]
    assert names(f"rp_uuid={a['rp_uuid']}") == ["n_a"]
    assert names("device_id=999999") == []
    # The attributes still belong to the filtered rows only.
    [only] = client.simulate_get(URL, query_string=f"name={b['name']}",
                                 headers=ADMIN).json["deployables"]
    assert json.loads(only["attributes_list"]) == [{"rc": "FPGA"}]


@pytest.mark.parametrize("query", ["device_id=abc", "rp_uuid=nope", "uuid=x", "name=a&name=b",
                                   # Past the 32-bit id column, and NUL: both were 500s on
                                   # PostgreSQL.
                                   "device_id=9999999999", "name=%00", "driver_name=a%00"])
def test_bad_query_is_400(client, db, query):
    assert client.simulate_get(URL, query_string=query, headers=ADMIN).status_code == 400


def test_list_runs_constant_queries(client, db):
    now = utcnow()
    with db.write() as conn:
        dev = inventory.add_device(conn)
        conn.execute(insert(deployables), [
            {"uuid": str(uuid.uuid4()), "name": f"node1_{i}", "num_accelerators": 1,
             "device_id": dev["id"], "driver_name": "fake", "rp_uuid": str(uuid.uuid4()),
             "created_at": now} for i in range(1000)])
        ids = conn.execute(select(deployables.c.id)).scalars().all()
        conn.execute(insert(attributes), [
            {"uuid": str(uuid.uuid4()), "deployable_id": i, "key": key, "value": "v",
             "created_at": now} for i in ids for key in ("rc", "trait0")])
    with count_queries(db) as statements:
        result = client.simulate_get(URL, headers=ADMIN)
    assert result.status_code == 200
    assert len(result.json["deployables"]) == 1000
    assert all(json.loads(d["attributes_list"]) == [{"rc": "v"}, {"trait0": "v"}]
               for d in result.json["deployables"])
    assert len(statements) == 2


def test_show(client, db):
    dep = inventory.add_fpga(db)["deployable"]
    result = client.simulate_get(f"{URL}/{dep['uuid']}", headers=ADMIN)
    assert result.status_code == 200
    assert list(result.json) == FIELDS
    assert result.json["uuid"] == dep["uuid"]


def test_program_fields_show_from_2_5(client, db):
    """The last API program's status and reason, as stored; absent below 2.5."""
    dep = inventory.add_fpga(db)["deployable"]
    with db.write() as conn:
        conn.execute(update(deployables).where(deployables.c.uuid == dep["uuid"]).values(
            program_status="FAILED", program_reason="400: no such image"))
    for version, extra in (("2.4", []), ("2.5", ["program_status", "program_reason"])):
        headers = {**ADMIN, "OpenStack-API-Version": f"accelerator {version}"}
        shown = client.simulate_get(f"{URL}/{dep['uuid']}", headers=headers)
        [listed] = client.simulate_get(URL, headers=headers).json["deployables"]
        for body in (shown.json, listed):
            assert list(body) == FIELDS + extra, version
    assert (listed["program_status"], listed["program_reason"]) == ("FAILED",
                                                                    "400: no such image")


def test_program_fields_of_a_never_programmed_deployable_are_null(client, db):
    dep = inventory.add_fpga(db)["deployable"]
    body = client.simulate_get(f"{URL}/{dep['uuid']}", headers={
        **ADMIN, "OpenStack-API-Version": "accelerator 2.5"}).json
    assert body["program_status"] is None and body["program_reason"] is None


@pytest.mark.parametrize("ident", ["3533b44e-28b9-42c3-a62e-59e92c2b638d", "nope"])
def test_show_unknown_is_404(client, db, ident):
    result = client.simulate_get(f"{URL}/{ident}", headers=ADMIN)
    assert result.status_code == 404
    assert ident in fault(result)


def test_read_policy(client, db):
    dep = inventory.add_fpga(db)["deployable"]
    assert client.simulate_get(URL, headers=MANAGER).status_code == 200
    assert client.simulate_get(f"{URL}/{dep['uuid']}", headers=MANAGER).status_code == 200
    assert client.simulate_get(URL, headers=member("p9")).status_code == 403
    assert client.simulate_get(f"{URL}/{dep['uuid']}", headers=member("p9")).status_code == 403


def _all_program_requests(dep_uuid, body=None, seed=None):
    yield f"{URL}/{dep_uuid}/program", body if body is not None else program_body()
    yield f"{URL}/{dep_uuid}/program/{dep_uuid}", body if body is not None else program_body()
    yield f"{URL}/{dep_uuid}", seed if seed is not None else seed_body()


@pytest.mark.parametrize("headers", [MANAGER, member("p9")])
def test_program_needs_admin(client, db, headers):
    dep = inventory.add_fpga(db)["deployable"]
    for url, body in _all_program_requests(dep["uuid"]):
        result = client.simulate_patch(url, headers=headers, json=body)
        assert result.status_code == 403, url
    assert stored(db, dep["uuid"]).bitstream_id is None


@pytest.mark.parametrize("body", [
    [],
    {"path": "/program", "op": "replace", "value": [{"image_uuid": IMAGE}]},
    [{"path": "/program", "op": "replace", "value": [{"image_uuid": "not-a-uuid"}]}],
    [{"path": "/program", "op": "replace", "value": [{"image_uuid": IMAGE, "x": 1}]}],
    [{"path": "/program", "op": "replace", "value": []}],
    [{"path": "/program", "op": "replace", "value": [{"image_uuid": IMAGE}] * 2}],
    [{"path": "/program", "op": "remove", "value": [{"image_uuid": IMAGE}]}],
    [{"path": "/bitstream", "op": "replace", "value": [{"image_uuid": IMAGE}]}],
    [{"path": "/program", "op": "replace", "value": IMAGE}],
    program_body() * 2,
])
def test_upstream_program_rejects_bad_input(client, db, body):
    dep = inventory.add_fpga(db)["deployable"]
    result = client.simulate_patch(f"{URL}/{dep['uuid']}/program", headers=ADMIN, json=body)
    assert result.status_code == 400
    assert stored(db, dep["uuid"]).bitstream_id is None


@pytest.mark.parametrize("body", [
    [],
    seed_body("/program"),
    seed_body("/bitstream", "not-a-uuid"),
    seed_body("/bitstream", op="remove"),
    seed_body("/firmware", op="test"),
    [{"path": "/bitstream", "op": "add"}],
    [{"path": "/bitstream", "op": "add", "value": IMAGE, "reason": "x"}],
    seed_body() + seed_body("/firmware"),
    seed_body("/name", "x"),
])
def test_seed_patch_rejects_bad_input(client, db, body):
    dep = inventory.add_fpga(db)["deployable"]
    result = client.simulate_patch(f"{URL}/{dep['uuid']}", headers=ADMIN, json=body)
    assert result.status_code == 400
    assert stored(db, dep["uuid"]).bitstream_id is None


def test_doubled_path_must_name_the_same_deployable(client, db):
    dep = inventory.add_fpga(db)["deployable"]
    other = str(uuid.uuid4())
    result = client.simulate_patch(f"{URL}/{dep['uuid']}/program/{other}", headers=ADMIN,
                                   json=program_body())
    assert result.status_code == 400
    assert other in fault(result)


def test_program_unknown_deployable_is_404(client, db):
    missing = str(uuid.uuid4())
    for url, body in _all_program_requests(missing):
        result = client.simulate_patch(url, headers=ADMIN, json=body)
        assert result.status_code == 404, url
        assert missing in fault(result)


def test_program_without_a_conductor_is_503(client, db):
    """The in-process app has no conductor client: a clear 503, nothing changed."""
    dep = inventory.add_fpga(db)["deployable"]
    for url, body in _all_program_requests(dep["uuid"]):
        result = client.simulate_patch(url, headers=ADMIN, json=body)
        assert result.status_code == 503, url
        assert "conductor" in fault(result)
    assert stored(db, dep["uuid"]).bitstream_id is None


def test_served_at_root_too(client, db):
    inventory.add_fpga(db)
    assert len(client.simulate_get("/v2/deployables", headers=ADMIN).json["deployables"]) == 1


def test_wrong_methods(client, db):
    dep = inventory.add_fpga(db)["deployable"]
    assert client.simulate_post(URL, headers=ADMIN, json={}).status_code == 405
    assert client.simulate_delete(f"{URL}/{dep['uuid']}", headers=ADMIN).status_code == 405
    assert client.simulate_post(f"{URL}/{dep['uuid']}/program", headers=ADMIN,
                                json=program_body()).status_code == 405
    assert stored(db, dep["uuid"]).bitstream_id is None
