"""/v2/attributes: list with filters, show, create (bare and SDK-wrapped), delete."""

import uuid

import pytest
from sqlalchemy import func, insert, select

from acceld.db.models import attributes, utcnow
from tests.conftest import count_queries
from tests.helpers import ADMIN, fault, member
from tests.support import inventory

URL = "/accelerator/v2/attributes"
MANAGER = {"X-User-Id": "mgr", "X-Project-Id": "project-m", "X-Roles": "manager,member,reader"}
FIELDS = ["uuid", "deployable_id", "key", "value", "created_at", "updated_at", "links"]


def count(db) -> int:
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(attributes)).scalar_one()


@pytest.fixture
def dep(db):
    with db.write() as conn:
        dev = inventory.add_device(conn)
        return inventory.add_deployable(conn, dev["id"], attrs={})


def test_create_bare_body(client, db, dep):
    result = client.simulate_post(URL, headers=ADMIN, json={
        "deployable_id": dep["id"], "key": "trait0", "value": "CUSTOM_X"})
    assert result.status_code == 201
    body = result.json
    assert list(body) == FIELDS
    assert (body["deployable_id"], body["key"], body["value"]) == (dep["id"], "trait0",
                                                                   "CUSTOM_X")
    assert body["links"] == [{"href": f"http://falconframework.org/accelerator/v2/attributes/"
                                      f"{body['uuid']}", "rel": "self"}]
    assert body["updated_at"] is None
    assert "id" not in body
    shown = client.simulate_get(f"{URL}/{body['uuid']}", headers=ADMIN)
    assert shown.status_code == 200 and shown.json == body


def test_create_sdk_wrapped_body_with_uuid(client, db, dep):
    given = str(uuid.uuid4())
    result = client.simulate_post(URL, headers=ADMIN, json={"attribute": {
        "deployable_id": dep["id"], "key": "rc", "value": "FPGA", "uuid": given}})
    assert result.status_code == 201
    assert result.json["uuid"] == given


def test_attribute_shows_in_deployable(client, db, dep):
    client.simulate_post(URL, headers=ADMIN, json={"deployable_id": dep["id"], "key": "rc",
                                                   "value": "FPGA"})
    shown = client.simulate_get(f"/accelerator/v2/deployables/{dep['uuid']}", headers=ADMIN)
    assert shown.json["attributes_list"] == '[{"rc": "FPGA"}]'


def test_duplicate_key_is_409(client, db, dep):
    body = {"deployable_id": dep["id"], "key": "rc", "value": "FPGA"}
    assert client.simulate_post(URL, headers=ADMIN, json=body).status_code == 201
    result = client.simulate_post(URL, headers=ADMIN, json={**body, "value": "PGPU"})
    assert result.status_code == 409
    assert "'rc'" in fault(result)
    assert count(db) == 1


def test_duplicate_uuid_is_409(client, db, dep):
    given = str(uuid.uuid4())
    body = {"deployable_id": dep["id"], "key": "a", "value": "1", "uuid": given}
    assert client.simulate_post(URL, headers=ADMIN, json=body).status_code == 201
    result = client.simulate_post(URL, headers=ADMIN, json={**body, "key": "b"})
    assert result.status_code == 409
    assert given in fault(result)
    assert count(db) == 1


def test_unknown_deployable_is_400(client, db, dep):
    result = client.simulate_post(URL, headers=ADMIN, json={
        "deployable_id": dep["id"] + 1000, "key": "rc", "value": "FPGA"})
    assert result.status_code == 400
    assert str(dep["id"] + 1000) in fault(result)
    assert count(db) == 0


@pytest.mark.parametrize("body", [
    [],
    {},
    {"attribute": {}},
    {"key": "rc", "value": "FPGA"},
    {"deployable_id": "x1", "key": "rc", "value": "FPGA"},  # digits as a string: the CLI's
    {"deployable_id": "01", "key": "rc", "value": "FPGA"},
    {"deployable_id": 0, "key": "rc", "value": "FPGA"},
    {"deployable_id": 1, "key": "", "value": "FPGA"},
    {"deployable_id": 1, "key": " rc", "value": "FPGA"},
    {"deployable_id": 1, "key": "k" * 256, "value": "FPGA"},
    {"deployable_id": 1, "key": "rc", "value": "v" * 256},
    {"deployable_id": 1, "key": "rc", "value": 5},
    {"deployable_id": 1, "key": "rc", "value": "FPGA", "uuid": "nope"},
    {"deployable_id": 1, "key": "rc", "value": "FPGA", "extra": True},
    {"attribute": {"deployable_id": 1, "key": "rc", "value": "FPGA"}, "x": 1},
])
def test_create_rejects_bad_input(client, db, dep, body):
    body = _with_real_id(body, dep["id"])
    result = client.simulate_post(URL, headers=ADMIN, json=body)
    assert result.status_code == 400, result.text
    assert count(db) == 0


def _with_real_id(body, real_id):
    if isinstance(body, dict) and body.get("deployable_id") == 1:
        return {**body, "deployable_id": real_id}
    return body


@pytest.mark.parametrize("headers", [MANAGER, member("p9")])
def test_create_and_delete_need_admin(client, db, dep, headers):
    body = {"deployable_id": dep["id"], "key": "rc", "value": "FPGA"}
    assert client.simulate_post(URL, headers=headers, json=body).status_code == 403
    assert count(db) == 0
    made = client.simulate_post(URL, headers=ADMIN, json=body).json
    assert client.simulate_delete(f"{URL}/{made['uuid']}", headers=headers).status_code == 403
    assert count(db) == 1


def test_read_policy(client, db, dep):
    made = client.simulate_post(URL, headers=ADMIN, json={
        "deployable_id": dep["id"], "key": "rc", "value": "FPGA"}).json
    assert client.simulate_get(URL, headers=MANAGER).status_code == 200
    assert client.simulate_get(f"{URL}/{made['uuid']}", headers=MANAGER).status_code == 200
    assert client.simulate_get(URL, headers=member("p9")).status_code == 403
    assert client.simulate_get(f"{URL}/{made['uuid']}", headers=member("p9")).status_code == 403


def test_list_filters(client, db):
    with db.write() as conn:
        dev = inventory.add_device(conn)
        a = inventory.add_deployable(conn, dev["id"], attrs={"rc": "FPGA", "trait0": "T_A"})
        b = inventory.add_deployable(conn, dev["id"], attrs={"rc": "PGPU"})

    def pairs(query):
        result = client.simulate_get(URL, query_string=query, headers=ADMIN)
        assert result.status_code == 200, result.text
        return [(x["deployable_id"], x["key"], x["value"]) for x in result.json["attributes"]]

    assert pairs("") == [(a["id"], "rc", "FPGA"), (a["id"], "trait0", "T_A"),
                         (b["id"], "rc", "PGPU")]
    assert pairs(f"deployable_id={b['id']}") == [(b["id"], "rc", "PGPU")]
    assert pairs("key=rc") == [(a["id"], "rc", "FPGA"), (b["id"], "rc", "PGPU")]
    assert pairs(f"deployable_id={a['id']}&key=trait0") == [(a["id"], "trait0", "T_A")]
    assert pairs("key=nothing") == []


@pytest.mark.parametrize("query", ["deployable_id=x", "value=FPGA", "key=a&key=b",
                                   # Past the 32-bit id column, and NUL: both were 500s on
                                   # PostgreSQL.
                                   "deployable_id=9999999999", "key=%00"])
def test_list_bad_query_is_400(client, db, query):
    assert client.simulate_get(URL, query_string=query, headers=ADMIN).status_code == 400


def test_list_runs_constant_queries(client, db, dep):
    now = utcnow()
    with db.write() as conn:
        conn.execute(insert(attributes), [
            {"uuid": str(uuid.uuid4()), "deployable_id": dep["id"], "key": f"k{i}",
             "value": "v", "created_at": now} for i in range(1000)])
    with count_queries(db) as statements:
        result = client.simulate_get(URL, headers=ADMIN)
    assert result.status_code == 200
    assert len(result.json["attributes"]) == 1000
    assert len(statements) == 1


def test_delete(client, db, dep):
    made = client.simulate_post(URL, headers=ADMIN, json={
        "deployable_id": dep["id"], "key": "rc", "value": "FPGA"}).json
    result = client.simulate_delete(f"{URL}/{made['uuid']}", headers=ADMIN)
    assert result.status_code == 204 and result.content == b""
    assert count(db) == 0
    again = client.simulate_delete(f"{URL}/{made['uuid']}", headers=ADMIN)
    assert again.status_code == 404


@pytest.mark.parametrize("ident", ["6b0067fd-8489-4809-bee3-ddaab85bf420", "nope"])
def test_unknown_is_404(client, db, dep, ident):
    assert client.simulate_get(f"{URL}/{ident}", headers=ADMIN).status_code == 404
    result = client.simulate_delete(f"{URL}/{ident}", headers=ADMIN)
    assert result.status_code == 404
    assert ident in fault(result)


def test_wrong_methods(client, db, dep):
    made = client.simulate_post(URL, headers=ADMIN, json={
        "deployable_id": dep["id"], "key": "rc", "value": "FPGA"}).json
    assert client.simulate_patch(f"{URL}/{made['uuid']}", headers=ADMIN,
                                 json=[]).status_code == 405
    assert client.simulate_delete(URL, headers=ADMIN).status_code == 405
    assert count(db) == 1


def test_created_attribute_survives_reconcile_and_flags_placement(client, db, conf):
    from acceld.db import inventory as inv
    from acceld.db.models import placement_sync
    from acceld.drivers.fake import FakeDriver

    with db.write() as conn:
        inv.reconcile_node(conn, "node-r", FakeDriver(conf, "node-r").discover())
        conn.execute(placement_sync.update().values(dirty=False))
        dep_id = conn.execute(select(attributes.c.deployable_id)).scalars().first()
    made = client.simulate_post(URL, headers=ADMIN, json={
        "deployable_id": dep_id, "key": "trait5", "value": "CUSTOM_OPERATOR"})
    assert made.status_code == 201
    with db.read() as conn:
        assert conn.execute(select(placement_sync.c.dirty)).scalar() is True
    conf.set_override("attach_handles", 4, group="fake_driver")  # the hardware changed
    with db.write() as conn:
        changes = inv.reconcile_node(conn, "node-r", FakeDriver(conf, "node-r").discover())
    assert changes.removed == 12
    shown = client.simulate_get(f"{URL}/{made.json['uuid']}", headers=ADMIN)
    assert shown.status_code == 200 and shown.json["value"] == "CUSTOM_OPERATOR"
    keys = {a["key"] for a in client.simulate_get(
        f"{URL}?deployable_id={dep_id}", headers=ADMIN).json["attributes"]}
    assert keys == {"rc", "trait0", "trait5"}
    with db.write() as conn:
        conn.execute(placement_sync.update().values(dirty=False))
    assert client.simulate_delete(f"{URL}/{made.json['uuid']}",
                                  headers=ADMIN).status_code == 204
    with db.read() as conn:
        assert conn.execute(select(placement_sync.c.dirty)).scalar() is True


def test_non_placement_attribute_flags_nothing(client, db, dep):
    from acceld.db.models import placement_sync

    assert client.simulate_post(URL, headers=ADMIN, json={
        "deployable_id": dep["id"], "key": "owner", "value": "team-a"}).status_code == 201
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(placement_sync)).scalar() == 0


def test_nul_in_a_value_or_the_path_is_400(client, db, dep):
    """PostgreSQL refuses NUL in text: it must be a 400 on every backend, not a 500 on one."""
    result = client.simulate_post(URL, json={"deployable_id": dep["id"], "key": "k",
                                             "value": "a\u0000b"}, headers=ADMIN)
    assert result.status_code == 400
    assert "NUL" in fault(result)
    assert count(db) == 0
    for method in ("GET", "DELETE"):
        assert client.simulate_request(method, f"{URL}/a%00b",
                                       headers=ADMIN).status_code == 400
