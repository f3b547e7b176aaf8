"""Device health in the API at microversion 2.6 (issue 13): fields, filters, bound instances,
events (newest first, paginated), an operator's return to service; admin only by policy;
nothing of it below 2.6."""

from __future__ import annotations

import uuid as uuidlib

import pytest
from sqlalchemy import insert, select, update

from acceld.db import device_events
from acceld.db.models import accelerator_requests, device_profiles, devices, placement_sync
from tests.helpers import ADMIN, version
from tests.support import inventory

URL = "/accelerator/v2/devices"
V26 = {**ADMIN, **version("2.6")}
MANAGER = {"X-User-Id": "mgr", "X-Project-Id": "project-m", "X-Roles": "manager,member,reader",
           **version("2.6")}
HEALTH_FIELDS = {"health", "health_reason", "health_since", "quarantined"}


@pytest.fixture
def db(sqlite_db):
    """The wire shapes and checks do not depend on the backend (tests/db/test_device_health.py
    runs the health rules on every one): SQLite only, to keep the suite's time."""
    return sqlite_db


def add(db, **columns):
    with db.write() as conn:
        dev = inventory.add_device(conn)
        if columns:
            conn.execute(update(devices).where(devices.c.uuid == dev["uuid"]).values(**columns))
    return dev


def quarantine(db, dev, health="unhealthy", reason="XID 48: double-bit ECC error"):
    with db.write() as conn:
        conn.execute(update(devices).where(devices.c.uuid == dev["uuid"]).values(
            health=health, health_reason=reason, quarantined=True))


@pytest.mark.parametrize("v", ["2.0", "2.5"])
def test_nothing_changes_below_2_6(client, db, v):
    dev = add(db)
    headers = {**ADMIN, **version(v)}
    one = client.simulate_get(f"{URL}/{dev['uuid']}", headers=headers).json
    assert not HEALTH_FIELDS & set(one) and "bound_arqs" not in one
    assert client.simulate_get(URL, params={"health": "healthy"},
                               headers=headers).status_code == 400
    assert client.simulate_get(f"{URL}/{dev['uuid']}/events",
                               headers=headers).status_code == 404
    patch = [{"path": "/quarantined", "op": "replace", "value": False}]
    assert client.simulate_patch(f"{URL}/{dev['uuid']}", json=patch,
                                 headers=headers).status_code == 400


def test_admin_sees_health_and_filters(client, db):
    good = add(db)
    bad = add(db)
    quarantine(db, bad)
    listed = client.simulate_get(URL, headers=V26).json["devices"]
    assert {d["uuid"]: d["health"] for d in listed} == {good["uuid"]: "unknown",
                                                         bad["uuid"]: "unhealthy"}
    [one] = client.simulate_get(URL, params={"health": "unhealthy"}, headers=V26).json["devices"]
    assert one["uuid"] == bad["uuid"] and one["quarantined"] is True
    assert one["health_reason"] == "XID 48: double-bit ECC error"
    [other] = client.simulate_get(URL, params={"quarantined": "false"},
                                  headers=V26).json["devices"]
    assert other["uuid"] == good["uuid"]


@pytest.mark.parametrize("params", [{"health": "sick"}, {"health": ""},
                                    {"quarantined": "yes"}])
def test_bad_health_filters_are_400(client, db, params):
    add(db)
    result = client.simulate_get(URL, params=params, headers=V26)
    assert result.status_code == 400
    assert list(params)[0] in result.text


def test_non_admin_sees_no_health_and_may_not_filter_or_read_events(client, db):
    dev = add(db)
    one = client.simulate_get(f"{URL}/{dev['uuid']}", headers=MANAGER)
    assert one.status_code == 200 and not HEALTH_FIELDS & set(one.json)
    assert client.simulate_get(URL, params={"health": "unhealthy"},
                               headers=MANAGER).status_code == 403
    assert client.simulate_get(f"{URL}/{dev['uuid']}/events",
                               headers=MANAGER).status_code == 403
    patch = [{"path": "/quarantined", "op": "replace", "value": False}]
    assert client.simulate_patch(f"{URL}/{dev['uuid']}", json=patch,
                                 headers=MANAGER).status_code == 403


def test_show_lists_the_instances_bound_to_the_device(client, db):
    with db.write() as conn:
        dev = inventory.add_device(conn)
        dep = inventory.add_deployable(conn, dev["id"])
        [handle] = inventory.add_attach_handles(conn, dep["id"], 1, in_use=True)
        profile_id = conn.execute(insert(device_profiles).values(
            uuid=str(uuidlib.uuid4()), name="dp", profile_json="[]")).inserted_primary_key[0]
        arq = {"uuid": str(uuidlib.uuid4()), "instance_uuid": str(uuidlib.uuid4())}
        conn.execute(insert(accelerator_requests).values(
            **arq, state="Bound", device_profile_id=profile_id, device_profile_group_id=0,
            hostname="node1", attach_handle_id=handle["id"], deployable_id=dep["id"]))
    body = client.simulate_get(f"{URL}/{dev['uuid']}", headers=V26).json
    assert body["bound_arqs"] == [{"uuid": arq["uuid"], "instance_uuid": arq["instance_uuid"],
                                   "state": "Bound", "deployable_uuid": dep["uuid"]}]


def test_events_newest_first_paginated(client, db):
    dev = add(db)
    with db.write() as conn:
        made = [device_events.record(conn, dev["uuid"], "node1", device_events.HEALTH_CHANGED,
                                     f"change {n}") for n in range(5)]
    first = client.simulate_get(f"{URL}/{dev['uuid']}/events", params={"limit": "2"},
                                headers=V26)
    assert first.status_code == 200
    assert [e["uuid"] for e in first.json["events"]] == made[::-1][:2]
    assert first.json["events"][0]["detail"] == "change 4"
    assert first.json["events"][0]["created_at"].endswith("+00:00")
    href = first.json["events_links"][0]["href"]
    assert f"devices/{dev['uuid']}/events?limit=2&marker={made[3]}" in href
    rest = client.simulate_get(f"{URL}/{dev['uuid']}/events",
                               params={"limit": "10", "marker": made[3]}, headers=V26).json
    assert [e["uuid"] for e in rest["events"]] == made[::-1][2:]
    assert "events_links" not in rest


@pytest.mark.parametrize("params, status", [({"marker": "9c4f1f63-0a61-4f0e-8a57-3b1f0d2f7c11"}, 400),
                                            ({"marker": "nope"}, 400), ({"limit": "0"}, 400),
                                            ({"sort": "asc"}, 400)])
def test_bad_event_queries(client, db, params, status):
    dev = add(db)
    assert client.simulate_get(f"{URL}/{dev['uuid']}/events", params=params,
                               headers=V26).status_code == status


def test_events_of_an_unknown_device_are_404(client, db):
    assert client.simulate_get(f"{URL}/{uuidlib.uuid4()}/events",
                               headers=V26).status_code == 404
    assert client.simulate_get(f"{URL}/not-a-uuid/events", headers=V26).status_code == 404


def test_enable_and_disable_are_events_with_user_and_reason(client, db):
    dev = add(db)
    patch = [{"path": "/status", "op": "replace", "value": "disabled", "reason": "fan swap"}]
    assert client.simulate_patch(f"{URL}/{dev['uuid']}", json=patch,
                                 headers=V26).status_code == 204
    assert client.simulate_post(f"{URL}/{dev['uuid']}/enable", headers=ADMIN).status_code == 200
    assert client.simulate_post(f"{URL}/{dev['uuid']}/enable", headers=ADMIN).status_code == 200
    events = client.simulate_get(f"{URL}/{dev['uuid']}/events", headers=V26).json["events"]
    assert [(e["kind"], e["actor"]) for e in events] == [
        ("enabled", ADMIN["X-User-Id"]), ("disabled", ADMIN["X-User-Id"])]
    assert "fan swap" in events[1]["detail"]


def test_operator_returns_a_quarantined_device(client, db):
    dev = add(db)
    quarantine(db, dev, health="healthy", reason=None)
    patch = [{"path": "/quarantined", "op": "replace", "value": False, "reason": "checked"}]
    result = client.simulate_patch(f"{URL}/{dev['uuid']}", json=patch, headers=V26)
    assert result.status_code == 204
    assert client.simulate_get(f"{URL}/{dev['uuid']}", headers=V26).json["quarantined"] is False
    [event] = client.simulate_get(f"{URL}/{dev['uuid']}/events", headers=V26).json["events"]
    assert (event["kind"], event["actor"]) == ("recovered", ADMIN["X-User-Id"])
    assert "checked" in event["detail"]
    with db.read() as conn:
        assert conn.execute(select(placement_sync)).all() is not None
    again = client.simulate_patch(f"{URL}/{dev['uuid']}", json=patch, headers=V26)
    assert again.status_code == 409 and "not quarantined" in again.text


def test_return_refused_while_unhealthy_and_bad_patches(client, db):
    dev = add(db)
    quarantine(db, dev)
    patch = [{"path": "/quarantined", "op": "replace", "value": False}]
    result = client.simulate_patch(f"{URL}/{dev['uuid']}", json=patch, headers=V26)
    assert result.status_code == 409 and "double-bit ECC" in result.text
    for bad in ([{"path": "/quarantined", "op": "replace", "value": True}],
                [{"path": "/quarantined", "op": "replace", "value": "false"}],
                [{"path": "/health", "op": "replace", "value": "healthy"}]):
        assert client.simulate_patch(f"{URL}/{dev['uuid']}", json=bad,
                                     headers=V26).status_code == 400
    assert client.simulate_patch(f"{URL}/{uuidlib.uuid4()}", json=patch,
                                 headers=V26).status_code == 404
    with db.read() as conn:
        assert conn.execute(select(devices.c.quarantined)).scalar() is True
