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


# ---------------------------------------------------------------- DELETE (2.5): retiring a host

import uuid as uuidlib  # noqa: E402

import pytest  # noqa: E402
from sqlalchemy import select, update  # noqa: E402

from acceld.db import agents as agents_db  # noqa: E402
from acceld.db import host_retire  # noqa: E402
from acceld.db.models import handle_releases, placement_sync  # noqa: E402
from tests.support.nova import RecordingNova  # noqa: E402
from tests.support.retire import HostRig, V25, rp_of  # noqa: E402


@pytest.fixture
def nova():
    server = RecordingNova().start()
    yield server
    server.stop()


def _queue_release(db, host: str) -> None:
    """A handle of the host waiting for its host step to be undone (the agent never will)."""
    from acceld.db.models import attach_handles, deployables, devices

    with db.write() as conn:
        handle = conn.execute(select(attach_handles.c.id).join(
            deployables, deployables.c.id == attach_handles.c.deployable_id).join(
            devices, devices.c.id == deployables.c.device_id).where(
            devices.c.hostname == host)).scalars().first()
        conn.execute(update(attach_handles).where(attach_handles.c.id == handle).values(
            in_use=True))
        conn.execute(handle_releases.insert().values(
            attach_handle_id=handle, hostname=host, driver_name="fake", attempts=3,
            last_error="agent unreachable", created_at=utcnow()))


def test_delete_retires_a_down_host(db, tmp_path):
    rig = HostRig(db, tmp_path)
    rig.add_host("node-2", "down")  # another host, untouched
    _queue_release(db, rig.host)
    with db.write() as conn:  # its provider was written to Placement
        conn.execute(update(placement_sync).values(digest="written", dirty=False))
    before = rig.counts()
    assert before["devices"] == 1 and before["handles"] == 2 and before["releases"] == 1

    result = rig.delete()

    assert result.status_code == 204, result.text
    assert rig.counts() == {"agent": 0, "devices": 0, "deployables": 0, "handles": 0,
                            "releases": 0, "providers": 1, "flagged": 1}
    assert rig.counts("node-2")["devices"] == 1
    assert rig.client.simulate_get(f"{URL}/{rig.host}", headers={**ADMIN, **V24}
                                   ).status_code == 404
    devices = rig.client.simulate_get("/accelerator/v2/devices", headers=ADMIN).json["devices"]
    assert [d["hostname"] for d in devices] == ["node-2"]
    # Again while its provider waits for the conductor: flagged again, nothing else.
    assert rig.delete().status_code == 204
    with db.write() as conn:  # the conductor's sync removed the provider
        conn.execute(placement_sync.delete().where(placement_sync.c.hostname == rig.host))
    result = rig.delete()
    assert result.status_code == 404 and rig.host in fault(result)


def test_delete_flags_providers_never_written(db, tmp_path):
    """A provider the sync has not written yet still gets a row: the sync removes it if it
    was created meanwhile."""
    rig = HostRig(db, tmp_path)
    assert rig.counts()["providers"] == 1  # reconciliation flagged the new deployable
    with db.write() as conn:
        conn.execute(placement_sync.delete())
    assert rig.delete().status_code == 204
    with db.read() as conn:
        rows = conn.execute(select(placement_sync)).all()
    assert [(r.rp_uuid, r.hostname, r.dirty) for r in rows] == [(rp_of(rig.host), rig.host, True)]


def test_delete_refused_while_the_agent_is_up(db, tmp_path):
    rig = HostRig(db, tmp_path, agent_state="up")
    result = rig.delete()
    assert result.status_code == 409
    assert f"The agent of host {rig.host} is up" in fault(result)
    assert rig.counts()["devices"] == 1 and rig.counts()["agent"] == 1
    assert rig.delete(force=False).status_code == 409
    assert rig.delete(force=True).status_code == 204
    assert rig.counts()["agent"] == 0


def test_delete_refused_while_arqs_are_bound_there_naming_them(db, tmp_path):
    rig = HostRig(db, tmp_path, agent_state="up")
    bound, vm1 = rig.bind()
    binding, vm2 = rig.start_bind()  # BindStarted: its job is pending
    rig.set_agent("down")
    before = rig.counts()

    result = rig.delete()

    assert result.status_code == 409
    message = fault(result)
    for uuid in (bound, vm1, binding, vm2):
        assert uuid in message
    assert "force" in message
    assert rig.counts() == before
    assert rig.arq(bound)["state"] == "Bound" and rig.arq(binding)["state"] == "BindStarted"


def test_forced_delete_fails_the_arqs_there_and_nova_hears_the_pending_one(db, tmp_path, nova,
                                                                           caplog):
    rig = HostRig(db, tmp_path, nova=nova, agent_state="up")
    bound, vm1 = rig.bind()
    binding, vm2 = rig.start_bind()
    rig.set_agent("down")

    with caplog.at_level("WARNING", logger="acceld.db.host_retire"):
        assert rig.delete(force=True).status_code == 204
    assert f"Host {rig.host} retired: agent record removed, 1 device(s)" in caplog.text
    assert f"ARQ {bound} of instance {vm1} is BindFailed" in caplog.text

    for uuid, vm in ((bound, vm1), (binding, vm2)):
        arq = rig.arq(uuid)
        assert arq["state"] == "BindFailed", arq
        assert arq["bind_failure_reason"] == host_retire.reason(rig.host)
        assert arq["instance_uuid"] == vm and arq["hostname"] == rig.host
        assert not arq["attach_handle_info"] and arq["attach_handle_uuid"] is None
    assert rig.jobs(binding) == ["notify"] and rig.jobs(bound) == []
    assert rig.counts()["devices"] == 0
    rig.run_binds()
    # The instance waiting for its bind hears it failed; the running one heard 'completed'
    # when it was bound and nothing more (Nova has no event for a device lost).
    assert rig.nova_heard(binding) == ["failed"]
    assert rig.nova_heard(bound) == ["completed"]
    # Nova's clean-up (evacuate or delete of the instance) deletes them by instance.
    for vm in (vm1, vm2):
        result = rig.client.simulate_delete("/accelerator/v2/accelerator_requests",
                                            query_string=f"instance={vm}",
                                            headers={**ADMIN, "X-Service-Roles": "service"})
        assert result.status_code == 204
    assert rig.client.simulate_get("/accelerator/v2/accelerator_requests",
                                   headers=ADMIN).json["arqs"] == []


def test_forced_delete_leaves_arqs_of_other_hosts_alone(db, tmp_path):
    rig = HostRig(db, tmp_path, agent_state="up")
    rig.add_host("node-2", "up")
    other, _ = rig.bind(host="node-2")
    mine, _ = rig.bind()
    assert rig.delete(force=True).status_code == 204
    assert rig.arq(mine)["state"] == "BindFailed"
    arq = rig.arq(other)
    assert arq["state"] == "Bound" and arq["attach_handle_info"]
    assert rig.counts("node-2")["handles"] == 2


def test_agent_coming_back_after_a_delete_registers_anew(db, tmp_path):
    rig = HostRig(db, tmp_path)
    assert rig.delete().status_code == 204
    with db.write() as conn:
        beat = agents_db.record_heartbeat(conn, rig.host, f"{rig.host}:6668", 10)
    assert beat.new and beat.stored_digest is None  # so the conductor pulls its hardware
    with db.write() as conn:
        inventory_db.reconcile_node(conn, rig.host, FakeDriver(rig.conf, rig.host).discover())
    assert rig.counts()["devices"] == 1


def test_delete_unknown_host_is_404(client, db):
    result = client.simulate_delete(f"{URL}/nowhere", headers={**ADMIN, **V25})
    assert result.status_code == 404 and "nowhere" in fault(result)


def test_delete_only_from_2_5(client, db):
    add_agent(db, "node-a", state="down")
    for headers in (ADMIN, {**ADMIN, **version("2.3")}):
        assert client.simulate_delete(f"{URL}/node-a", headers=headers).status_code == 404
    result = client.simulate_delete(f"{URL}/node-a", headers={**ADMIN, **V24})
    assert result.status_code == 405 and result.headers["Allow"] == "GET"
    assert "DELETE" in fault(result)
    assert client.simulate_get(f"{URL}/node-a", headers={**ADMIN, **V24}).status_code == 200
    assert client.simulate_delete(f"{URL}/node-a", headers={**ADMIN, **V25}).status_code == 204


@pytest.mark.parametrize("query", ["force=yes", "force=", "force=1", "force=true&force=true",
                                   "colour=red", "force=tr%0Aue"])
def test_delete_bad_query_is_400_and_changes_nothing(client, db, query):
    add_agent(db, "node-a", state="up")
    result = client.simulate_delete(f"{URL}/node-a", query_string=query,
                                    headers={**ADMIN, **V25})
    assert result.status_code == 400, result.text
    assert client.simulate_get(f"{URL}/node-a", headers={**ADMIN, **V24}).status_code == 200


def test_delete_is_admin_only(client, db):
    add_agent(db, "node-a", state="down")
    result = client.simulate_delete(f"{URL}/node-a", headers={**member(), **V25})
    assert result.status_code == 403
    assert fault(result) == "Policy doesn't allow acceld:host:delete to be performed."
    assert client.simulate_get(f"{URL}/node-a", headers={**ADMIN, **V24}).status_code == 200


def test_delete_force_is_case_insensitive(client, db):
    add_agent(db, "node-a", state="up")
    result = client.simulate_delete(f"{URL}/node-a", query_string="force=True",
                                    headers={**ADMIN, **V25})
    assert result.status_code == 204


def test_bind_after_a_delete_fails_with_a_true_reason(db, tmp_path, nova):
    """A bind Nova asks for on a retired host: BindFailed naming the unknown provider."""
    rig = HostRig(db, tmp_path, nova=nova, agent_state="up")
    assert rig.delete(force=True).status_code == 204
    arq, _ = rig.start_bind()
    rig.run_binds()
    result = rig.arq(arq)
    assert result["state"] == "BindFailed"
    assert "not the resource provider of any deployable" in result["bind_failure_reason"]
    assert rig.nova_heard(arq) == ["failed"]
    assert str(uuidlib.UUID(arq)) == arq
