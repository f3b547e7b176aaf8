"""/v2/devices: list, filters, show, status at 2.3, enable and disable in both forms."""

import json
import tracemalloc
import uuid

import orjson
import pytest
from falcon import testing
from sqlalchemy import insert, select, update

from acceld.db.models import devices, placement_sync, utcnow
from tests.conftest import count_queries
from tests.helpers import ADMIN, fault, member, version
from tests.support import inventory

URL = "/accelerator/v2/devices"
MANAGER = {"X-User-Id": "mgr", "X-Project-Id": "project-m", "X-Roles": "manager,member,reader"}
FIELDS_2_0 = {"uuid", "type", "vendor", "model", "std_board_info", "vendor_board_info",
              "hostname", "links", "created_at", "updated_at"}


def add(db, **kwargs):
    with db.write() as conn:
        return inventory.add_device(conn, **kwargs)


def stored(db, device_uuid):
    with db.read() as conn:
        return conn.execute(select(devices).where(devices.c.uuid == device_uuid)).one()


def status_patch(value, reason=None):
    op = {"path": "/status", "op": "replace", "value": value}
    if reason is not None:
        op["reason"] = reason
    return [op]


def test_list_shape_at_2_0(client, db):
    dev = add(db, hostname="node1", std_board_info={"device_id": "0xabcd", "class": "Fake"})
    result = client.simulate_get(URL, headers=ADMIN)
    assert result.status_code == 200
    [body] = result.json["devices"]
    assert set(body) == FIELDS_2_0
    assert list(body)[:7] == ["uuid", "type", "vendor", "model", "std_board_info",
                              "vendor_board_info", "hostname"]
    assert body["uuid"] == dev["uuid"]
    assert body["type"] == "FPGA" and body["vendor"] == "0x8086"
    # Board info stays a JSON string on the wire, as upstream sends it.
    assert json.loads(body["std_board_info"]) == {"device_id": "0xabcd", "class": "Fake"}
    assert body["links"] == [{"href": f"http://falconframework.org/accelerator/v2/devices/"
                                      f"{dev['uuid']}", "rel": "self"}]
    assert body["created_at"].endswith("+00:00") and body["updated_at"] is None
    assert "id" not in body


@pytest.mark.parametrize("v, shown", [("2.2", False), ("2.3", True), ("2.4", True)])
def test_status_shown_from_2_3(client, db, v, shown):
    dev = add(db, status="maintaining")
    listed = client.simulate_get(URL, headers={**ADMIN, **version(v)}).json["devices"][0]
    one = client.simulate_get(f"{URL}/{dev['uuid']}", headers={**ADMIN, **version(v)}).json
    for body in (listed, one):
        assert ("status" in body) is shown
        if shown:
            assert body["status"] == "maintaining"


@pytest.mark.parametrize("v, shown", [("2.3", False), ("2.4", True)])
def test_reason_and_hardware_state_shown_from_2_4(client, db, v, shown):
    dev = add(db, status="maintaining", status_reason="fan replacement",
              acc_status="reboot_required")
    listed = client.simulate_get(URL, headers={**ADMIN, **version(v)}).json["devices"][0]
    one = client.simulate_get(f"{URL}/{dev['uuid']}", headers={**ADMIN, **version(v)}).json
    for body in (listed, one):
        assert ("status_reason" in body) is shown
        assert ("acc_status" in body) is shown
        if shown:
            assert body["status_reason"] == "fan replacement"
            assert body["acc_status"] == "reboot_required"


def test_filters(client, db):
    add(db, hostname="a", type="FPGA", vendor="0x8086")
    add(db, hostname="a", type="GPU", vendor="0x10de")
    add(db, hostname="b", type="GPU", vendor="0x10de")

    def hosts(query):
        result = client.simulate_get(URL, query_string=query, headers=ADMIN)
        assert result.status_code == 200
        return sorted((d["hostname"], d["type"]) for d in result.json["devices"])

    assert hosts("type=GPU") == [("a", "GPU"), ("b", "GPU")]
    assert hosts("vendor=0x8086") == [("a", "FPGA")]
    assert hosts("hostname=a&type=GPU") == [("a", "GPU")]
    assert hosts("hostname=nowhere") == []


@pytest.mark.parametrize("query", ["status=enabled", "type=GPU&type=FPGA", f"type={'x' * 256}"])
def test_bad_query_is_400(client, db, query):
    add(db)
    result = client.simulate_get(URL, query_string=query, headers=ADMIN)
    assert result.status_code == 400


def test_list_runs_constant_queries(client, db):
    now = utcnow()
    rows = [{"uuid": str(uuid.uuid4()), "type": "GPU", "vendor": "0x10de", "model": "A100",
             "std_board_info": "{}", "vendor_board_info": "{}", "hostname": f"n{i % 10}",
             "status": "enabled", "acc_status": "ready", "vanished": False, "created_at": now}
            for i in range(1000)]
    with db.write() as conn:
        conn.execute(insert(devices), rows)
    with count_queries(db) as statements:
        result = client.simulate_get(URL, headers={**ADMIN, **version("2.3")})
    assert result.status_code == 200
    assert len(result.json["devices"]) == 1000
    assert len(statements) == 1


def test_show(client, db):
    dev = add(db)
    result = client.simulate_get(f"{URL}/{dev['uuid'].upper()}", headers=ADMIN)
    assert result.status_code == 200
    assert result.json["uuid"] == dev["uuid"]
    assert set(result.json) == FIELDS_2_0


@pytest.mark.parametrize("ident", ["3e3aa4ee-50d8-4b85-8116-96ad833503f0", "not-a-uuid"])
def test_show_unknown_is_404(client, db, ident):
    result = client.simulate_get(f"{URL}/{ident}", headers=ADMIN)
    assert result.status_code == 404
    assert ident in fault(result)


def test_read_policy(client, db):
    dev = add(db)
    # A manager of any project may read the inventory (upstream's default); a member may not.
    assert client.simulate_get(URL, headers=MANAGER).status_code == 200
    assert client.simulate_get(f"{URL}/{dev['uuid']}", headers=MANAGER).status_code == 200
    assert client.simulate_get(URL, headers=member("p9")).status_code == 403
    assert client.simulate_get(f"{URL}/{dev['uuid']}", headers=member("p9")).status_code == 403


@pytest.mark.parametrize("action, before, after", [("disable", "enabled", "maintaining"),
                                                   ("enable", "maintaining", "enabled")])
def test_upstream_enable_disable(client, db, action, before, after):
    dev = add(db, status=before)
    result = client.simulate_post(f"{URL}/{dev['uuid']}/{action}", headers=ADMIN)
    assert result.status_code == 200
    assert result.content == b""
    row = stored(db, dev["uuid"])
    assert row.status == after
    assert row.updated_at is not None
    shown = client.simulate_get(f"{URL}/{dev['uuid']}", headers={**ADMIN, **version("2.3")})
    assert shown.json["status"] == after


def test_upstream_enable_disable_are_idempotent(client, db):
    dev = add(db)
    for _ in range(2):
        assert client.simulate_post(f"{URL}/{dev['uuid']}/disable",
                                    headers=ADMIN).status_code == 200
    assert stored(db, dev["uuid"]).status == "maintaining"
    for _ in range(2):
        assert client.simulate_post(f"{URL}/{dev['uuid']}/enable",
                                    headers=ADMIN).status_code == 200
    assert stored(db, dev["uuid"]).status == "enabled"


def test_seed_patch_disable_with_reason_then_enable(client, db):
    dev = add(db)
    result = client.simulate_patch(f"{URL}/{dev['uuid']}", headers=ADMIN,
                                   json=status_patch("disabled", "fan failure"))
    assert result.status_code == 204
    assert result.content == b""
    row = stored(db, dev["uuid"])
    assert (row.status, row.status_reason) == ("maintaining", "fan failure")
    result = client.simulate_patch(f"{URL}/{dev['uuid']}", headers=ADMIN,
                                   json=status_patch("enabled"))
    assert result.status_code == 204
    row = stored(db, dev["uuid"])
    assert (row.status, row.status_reason) == ("enabled", None)


def test_disable_and_enable_flag_the_devices_providers_for_placement(client, db):
    with db.write() as conn:
        dev = inventory.add_device(conn)
        dep = inventory.add_deployable(conn, dev["id"])
        unsynced = inventory.add_deployable(conn, dev["id"])
        other_dev = inventory.add_device(conn)
        other = inventory.add_deployable(conn, other_dev["id"])
        for rp in (dep["rp_uuid"], other["rp_uuid"]):
            conn.execute(insert(placement_sync).values(rp_uuid=rp, hostname="node1",
                                                       digest="d", dirty=False))

    def dirty():
        with db.read() as conn:
            return dict(conn.execute(select(placement_sync.c.rp_uuid,
                                            placement_sync.c.dirty)).all())

    assert client.simulate_post(f"{URL}/{dev['uuid']}/disable", headers=ADMIN).status_code == 200
    assert dirty() == {dep["rp_uuid"]: True, unsynced["rp_uuid"]: True, other["rp_uuid"]: False}
    with db.write() as conn:
        conn.execute(update(placement_sync).values(dirty=False))
    # Nothing changes, nothing is flagged.
    assert client.simulate_post(f"{URL}/{dev['uuid']}/disable", headers=ADMIN).status_code == 200
    assert not any(dirty().values())
    assert client.simulate_patch(f"{URL}/{dev['uuid']}", headers=ADMIN,
                                 json=status_patch("enabled")).status_code == 204
    assert dirty() == {dep["rp_uuid"]: True, unsynced["rp_uuid"]: True, other["rp_uuid"]: False}


@pytest.mark.parametrize("body", [
    [],
    {"path": "/status", "op": "replace", "value": "disabled"},
    status_patch("maintaining"),
    status_patch("enabled") + status_patch("disabled"),
    [{"path": "/hostname", "op": "replace", "value": "x"}],
    [{"path": "/status", "op": "add", "value": "disabled"}],
    [{"path": "/status", "op": "replace"}],
    [{"path": "/status", "op": "replace", "value": "disabled", "extra": 1}],
    [{"path": "/status", "op": "replace", "value": "disabled", "reason": 5}],
    [{"path": "/status", "op": "replace", "value": "disabled", "reason": "r" * 256}],
])
def test_seed_patch_rejects_bad_input(client, db, body):
    dev = add(db)
    result = client.simulate_patch(f"{URL}/{dev['uuid']}", headers=ADMIN, json=body)
    assert result.status_code == 400
    row = stored(db, dev["uuid"])
    assert (row.status, row.status_reason, row.updated_at) == ("enabled", None, None)


def test_seed_patch_malformed_json(client, db):
    dev = add(db)
    result = client.simulate_patch(f"{URL}/{dev['uuid']}", headers={
        **ADMIN, "Content-Type": "application/json"}, body=b"[{")
    assert result.status_code == 400
    assert stored(db, dev["uuid"]).status == "enabled"


@pytest.mark.parametrize("headers, status", [(member("p9"), 403), (ADMIN, 400)])
def test_seed_patch_authorizes_before_reading_the_body(client, db, headers, status):
    dev = add(db)
    result = client.simulate_patch(f"{URL}/{dev['uuid']}", headers={
        **headers, "Content-Type": "application/json"}, body=b"[{")
    assert result.status_code == status, result.text
    result = client.simulate_patch(f"{URL}/{dev['uuid']}", headers=headers,
                                   json=status_patch("maintaining"))
    assert result.status_code == status, result.text
    assert stored(db, dev["uuid"]).status == "enabled"


@pytest.mark.parametrize("how", ["post", "patch"])
def test_unknown_device_is_404(client, db, how):
    missing = str(uuid.uuid4())
    if how == "post":
        result = client.simulate_post(f"{URL}/{missing}/disable", headers=ADMIN)
    else:
        result = client.simulate_patch(f"{URL}/{missing}", headers=ADMIN,
                                       json=status_patch("disabled"))
    assert result.status_code == 404
    assert missing in fault(result)


@pytest.mark.parametrize("headers", [MANAGER, member("p9")])
def test_enable_disable_need_admin(client, db, headers):
    dev = add(db)
    assert client.simulate_post(f"{URL}/{dev['uuid']}/disable",
                                headers=headers).status_code == 403
    assert client.simulate_patch(f"{URL}/{dev['uuid']}", headers=headers,
                                 json=status_patch("disabled")).status_code == 403
    assert stored(db, dev["uuid"]).status == "enabled"


def test_wrong_methods(client, db):
    dev = add(db)
    assert client.simulate_get(f"{URL}/{dev['uuid']}/disable", headers=ADMIN).status_code == 405
    assert client.simulate_delete(f"{URL}/{dev['uuid']}", headers=ADMIN).status_code == 405
    assert client.simulate_post(URL, headers=ADMIN, json={}).status_code == 405


def test_served_at_root_too(client, db):
    add(db)
    assert len(client.simulate_get("/v2/devices", headers=ADMIN).json["devices"]) == 1


# ---------------------------------------------------------------- disabled devices and binding

ARQ_URL = "/accelerator/v2/accelerator_requests"
NOVA = {**member("project-a"), "X-Service-Roles": "service"}


def _bound_state_after_bind(client, conf, db, fpga, instance=None):
    """Create an ARQ for the fake FPGA, bind it to the deployable, run the bind worker."""
    from acceld.conductor.binding.worker import BindWorker

    [arq] = client.simulate_post(ARQ_URL, json={"device_profile_name": "dp-fpga"},
                                 headers=NOVA).json["arqs"]
    ops = [{"op": "add", "path": "/hostname", "value": "node1"},
           {"op": "add", "path": "/device_rp_uuid", "value": fpga["deployable"]["rp_uuid"]},
           {"op": "add", "path": "/instance_uuid", "value": instance or str(uuid.uuid4())}]
    assert client.simulate_patch(ARQ_URL, json={arq["uuid"]: ops},
                                 headers=NOVA).status_code == 202
    worker = BindWorker(conf, db)
    while worker.run_once():
        pass
    return client.simulate_get(f"{ARQ_URL}/{arq['uuid']}", headers={
        **ADMIN, **version("2.4")}).json


@pytest.mark.parametrize("form", ["post", "patch"])
def test_disabled_device_is_never_bound_and_bound_arqs_stay(client, conf, db, form):
    fpga = inventory.add_fpga(db, hostname="node1", handles=2)
    assert client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
        {"name": "dp-fpga", "groups": [{"resources:FPGA": "1"}]}]).status_code == 201
    first = _bound_state_after_bind(client, conf, db, fpga)
    assert first["state"] == "Bound"

    dev_uuid = fpga["device"]["uuid"]
    if form == "post":
        result = client.simulate_post(f"{URL}/{dev_uuid}/disable", headers=ADMIN)
    else:
        result = client.simulate_patch(f"{URL}/{dev_uuid}", headers=ADMIN,
                                       json=status_patch("disabled", "maintenance"))
    assert result.status_code in (200, 204)

    refused = _bound_state_after_bind(client, conf, db, fpga)
    assert refused["state"] == "BindFailed"
    assert "disabled" in refused["bind_failure_reason"]
    # The ARQ bound before the disable keeps its device.
    kept = client.simulate_get(f"{ARQ_URL}/{first['uuid']}", headers=NOVA).json
    assert kept["state"] == "Bound" and kept["attach_handle_info"] == first["attach_handle_info"]

    if form == "post":
        client.simulate_post(f"{URL}/{dev_uuid}/enable", headers=ADMIN)
    else:
        client.simulate_patch(f"{URL}/{dev_uuid}", headers=ADMIN, json=status_patch("enabled"))
    assert _bound_state_after_bind(client, conf, db, fpga)["state"] == "Bound"


@pytest.mark.parametrize("method,suffix", [("GET", ""), ("POST", "/disable"),
                                           ("POST", "/enable")])
def test_nul_in_the_path_is_400(client, db, method, suffix):
    """PostgreSQL refuses NUL in text: the path is refused before any query (was a 500)."""
    result = client.simulate_request(method, f"{URL}/a%00b{suffix}", headers=ADMIN)
    assert result.status_code == 400
    assert "NUL" in fault(result)


def test_nul_in_a_filter_is_400(client, db):
    result = client.simulate_get(URL, query_string="hostname=node%00", headers=ADMIN)
    assert result.status_code == 400
    assert "hostname" in fault(result)


def _many_devices(db, count):
    """``count`` devices with every optional field varied (status reasons, health, a
    quarantine, updated and whole-second timestamps) and board info holding non-ASCII text."""
    now = utcnow()
    rows = [{"uuid": str(uuid.uuid4()), "type": "GPU", "vendor": "0x10de", "model": "A100",
             "std_board_info": json.dumps({"product_id": "1db4", "slot": i}),
             "vendor_board_info": json.dumps({"label": "carte ü"}) if i % 7 == 0 else "{}",
             "hostname": f"n{i % 10}", "status": "maintaining" if i % 5 == 0 else "enabled",
             "status_reason": "fan" if i % 5 == 0 else None, "acc_status": "ready",
             "vanished": False, "created_at": now.replace(microsecond=0) if i % 3 else now,
             "updated_at": now if i % 4 == 0 else None,
             "health": "unhealthy" if i % 11 == 0 else "healthy",
             "health_reason": "ECC" if i % 11 == 0 else None,
             "health_since": now if i % 11 == 0 else None, "quarantined": i % 13 == 0}
            for i in range(count)]
    with db.write() as conn:
        conn.execute(insert(devices), rows)
    return [r["uuid"] for r in rows]


@pytest.mark.parametrize("v", ["2.0", "2.6"])
def test_long_list_is_one_document_of_what_show_gives(client, db, v):
    # More rows than a batch (acceld.db.rows.BATCH) and not a multiple of it: the pieces
    # joined are one compact JSON document, each device as GET /devices/{uuid} shows it.
    uuids = _many_devices(db, 1234)
    result = client.simulate_get(URL, headers={**ADMIN, **version(v)})
    assert result.status_code == 200
    assert result.headers["content-type"] == "application/json"
    assert int(result.headers["content-length"]) == len(result.content)
    listed = result.json["devices"]
    assert result.content == orjson.dumps({"devices": listed})
    assert [d["uuid"] for d in listed] == uuids
    for index in (0, 1, 3, 4, 7, 11, 13, 499, 500, 1233):
        one = client.simulate_get(f"{URL}/{uuids[index]}", headers={**ADMIN, **version(v)}).json
        one.pop("bound_arqs", None)
        assert listed[index] == one
    if v == "2.6":
        assert listed[13]["quarantined"] is True and listed[1]["quarantined"] is False
        assert listed[11]["health_since"].endswith("+00:00")


def test_long_list_peak_memory_stays_near_the_document(conf, sqlite_db):
    # The list is encoded one batch of rows at a time: at its peak the process holds the
    # encoded pieces (and here the test client's copy of them joined), not every row, dict
    # and document at once. Before, a 5,000-device list peaked at 5.6 times its size.
    from acceld.api.app import build_app

    _many_devices(sqlite_db, 5000)
    client = testing.TestClient(build_app(conf, sqlite_db))
    client.simulate_get(URL, headers=ADMIN)  # first-use caches (statements, policy)
    tracemalloc.start()
    try:
        result = client.simulate_get(URL, headers={**ADMIN, **version("2.6")})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(result.json["devices"]) == 5000
    assert peak < 3 * len(result.content)
