"""/v2/hosts (2.4, admin only): agents, their state and last contact."""

import datetime as dt

from sqlalchemy import insert

from acceld.db import inventory as inventory_db
from acceld.db.models import agents, utcnow
from acceld.drivers.fake import FakeDriver
from tests.conftest import count_queries
from tests.helpers import ADMIN, fault, member, version

URL = "/accelerator/v2/hosts"
V24 = version("2.4")


def add_agent(db, hostname, state="up", seconds_ago=1.0, interval=10):
    seen = utcnow() - dt.timedelta(seconds=seconds_ago)
    with db.write() as conn:
        conn.execute(insert(agents).values(hostname=hostname, endpoint=f"{hostname}:6668",
                                           state=state, heartbeat_interval=interval,
                                           last_seen_at=seen))
    return seen


def test_list_shows_state_and_last_contact(client, db, conf):
    seen = add_agent(db, "node-b", state="down", seconds_ago=120)
    add_agent(db, "node-a")
    with db.write() as conn:
        inventory_db.reconcile_node(conn, "node-a", FakeDriver(conf, "node-a").discover())
    result = client.simulate_get(URL, headers={**ADMIN, **V24})
    assert result.status_code == 200
    hosts = result.json["hosts"]
    assert [h["hostname"] for h in hosts] == ["node-a", "node-b"]
    assert [h["state"] for h in hosts] == ["up", "down"]
    assert [h["devices"] for h in hosts] == [1, 0]
    assert hosts[1]["last_seen_at"] == seen.isoformat() + "+00:00"
    assert hosts[1]["endpoint"] == "node-b:6668" and hosts[1]["heartbeat_interval"] == 10
    assert hosts[1]["links"][0]["href"].endswith("/accelerator/v2/hosts/node-b")


def test_filter_by_state(client, db):
    add_agent(db, "node-a")
    add_agent(db, "node-b", state="down")
    result = client.simulate_get(URL, params={"state": "down"}, headers={**ADMIN, **V24})
    assert [h["hostname"] for h in result.json["hosts"]] == ["node-b"]
    result = client.simulate_get(URL, params={"state": "sideways"}, headers={**ADMIN, **V24})
    assert result.status_code == 400 and "sideways" in fault(result)
    result = client.simulate_get(URL, params={"colour": "red"}, headers={**ADMIN, **V24})
    assert result.status_code == 400


def test_list_costs_constant_queries(client, db):
    for n in range(12):
        add_agent(db, f"node-{n:02d}")
    with count_queries(db) as statements:
        result = client.simulate_get(URL, headers={**ADMIN, **V24})
    assert len(result.json["hosts"]) == 12
    assert len(statements) == 2, statements


def test_show_one(client, db):
    add_agent(db, "node-a")
    result = client.simulate_get(f"{URL}/node-a", headers={**ADMIN, **V24})
    assert result.status_code == 200
    assert result.json["hostname"] == "node-a" and result.json["state"] == "up"
    result = client.simulate_get(f"{URL}/nowhere", headers={**ADMIN, **V24})
    assert result.status_code == 404 and "nowhere" in fault(result)


def test_absent_below_2_4(client, db):
    add_agent(db, "node-a")
    for path in (URL, f"{URL}/node-a"):
        for headers in (ADMIN, {**ADMIN, **version("2.3")}):
            assert client.simulate_get(path, headers=headers).status_code == 404


def test_admin_only(client, db):
    add_agent(db, "node-a")
    for path in (URL, f"{URL}/node-a"):
        result = client.simulate_get(path, headers={**member(), **V24})
        assert result.status_code == 403


def test_nul_in_the_hostname_is_400(client, db):
    """PostgreSQL refuses NUL in text: refused before the query (was a 500)."""
    result = client.simulate_get(f"{URL}/node%00", headers={**ADMIN, **version("2.4")})
    assert result.status_code == 400


def test_device_counts_live_in_the_agents_data_module(db):
    """The handler keeps no SQL of its own: the counts come from acceld.db.agents."""
    import inspect

    from acceld.api.handlers import hosts
    from acceld.db import agents as agents_db
    from tests.support.inventory import add_device

    assert "sqlalchemy" not in inspect.getsource(hosts)
    with db.write() as conn:
        for hostname in ("node-a", "node-a", "node-b"):
            add_device(conn, hostname=hostname)
    with db.read() as conn:
        assert agents_db.device_counts(conn) == {"node-a": 2, "node-b": 1}
        assert agents_db.device_counts(conn, "node-b") == {"node-b": 1}
        assert agents_db.device_counts(conn, "node-c") == {}
