"""`acceld-status upgrade check` names Bound ARQs that lost their attach handle and devices
that lost their control paths (issue 24): the damage migration 0005 did on SQLite, made
here as its rebuild did it (the device rows deleted with foreign keys on, their copies
inserted again), on every backend; and the repair docs/arqs.md gives."""

from __future__ import annotations

import datetime as dt

from oslo_upgradecheck.upgradecheck import Code
from sqlalchemy import delete, insert, select, text, update

from acceld.cmd.arqs_check import SHOWN, check_arqs, describe
from acceld.db import inventory
from acceld.db.models import (accelerator_requests, agents, attach_handles, controlpath_ids,
                              deployables, device_profiles, devices)
from acceld.drivers.fake import FakeDriver
from tests.conftest import make_conf
from tests.support.told import agent_told

T0 = dt.datetime(2026, 12, 1, 9, 0, 0)


def _conf(tmp_path, db):  # type: ignore[no-untyped-def]
    conf = make_conf(str(tmp_path))
    conf.set_override("connection", db.url.render_as_string(hide_password=False),
                      group="database")
    return conf


def _arq(id_: int, state: str, handle: int | None, dep: int | None,
         host: str | None) -> dict:
    return dict(id=id_, uuid=f"arq-{id_}", state=state, device_profile_id=1,
                device_profile_group_id=0, project_id="p1", hostname=host,
                device_rp_uuid=f"rp-{dep}" if host else None,
                instance_uuid=f"inst-{id_}" if host else None, attach_handle_id=handle,
                deployable_id=dep, created_at=T0)


def _fill(db) -> None:  # type: ignore[no-untyped-def]
    """Two hosts, a device each; two Bound ARQs holding handles, one bind pending, one
    ARQ not bound."""
    with db.write() as conn:
        conn.execute(insert(device_profiles), [dict(
            id=1, uuid="dp-1", name="gpu", profile_json="{}", created_at=T0)])
        conn.execute(insert(devices), [dict(
            id=n, uuid=f"dev-{n}", type="GPU", vendor="10de", model="A100",
            hostname=f"node{n}", status="enabled", acc_status="ready", vanished=False,
            created_at=T0) for n in (1, 2)])
        conn.execute(insert(controlpath_ids), [dict(
            id=n, uuid=f"cp-{n}", device_id=n, cpid_type="PCI", cpid_info='{"bus": "af"}',
            created_at=T0) for n in (1, 2)])
        conn.execute(insert(deployables), [dict(
            id=n, uuid=f"dep-{n}", name=f"node{n}_gpu0", num_accelerators=1, device_id=n,
            rp_uuid=f"rp-{n}", created_at=T0) for n in (1, 2)])
        conn.execute(insert(attach_handles), [dict(
            id=n, uuid=f"ah-{n}", deployable_id=n, attach_type="PCI",
            attach_info='{"bus": "af"}', in_use=True, created_at=T0) for n in (1, 2)])
        conn.execute(insert(accelerator_requests), [
            _arq(1, "Bound", 1, 1, "node1"), _arq(2, "Bound", 2, 2, "node2"),
            _arq(3, "BindStarted", None, None, "node2"), _arq(4, "Initial", None, None, None)])


def _rebuild_devices_with_foreign_keys_on(db, *where) -> None:  # type: ignore[no-untyped-def]
    """What 0005's batch rebuild did: copy the rows, DROP TABLE (an implicit DELETE that
    cascades), the copies back under the old name."""
    with db.write() as conn:
        copies = [dict(r) for r in conn.execute(select(devices).where(*where)).mappings()]
        conn.execute(delete(devices).where(*where))
        conn.execute(insert(devices), copies)


SOUND = ("Every Bound accelerator request holds its attach handle and every device its "
         "control path.")


def test_a_sound_database_passes(db, tmp_path) -> None:
    _fill(db)
    result = check_arqs(_conf(tmp_path, db))
    assert (result.code, result.details) == (Code.SUCCESS, SOUND)


def test_bound_arqs_that_lost_their_handles_fail_by_name(db, tmp_path) -> None:
    _fill(db)
    _rebuild_devices_with_foreign_keys_on(db, devices.c.id == 1)
    result = check_arqs(_conf(tmp_path, db))
    assert result.code == Code.FAILURE
    assert result.details.startswith(
        "1 Bound accelerator request(s) of 1 instance(s) do not hold their device in "
        "acceld's records: ARQ arq-1 (instance inst-1, host node1, provider rp-1): "
        "no attach handle. ")
    assert "arq-2" not in result.details and "arq-3" not in result.details
    assert '"Bound ARQs without an attach handle"' in result.details
    assert ("1 device(s) on 1 host(s) (node1) have lost their control paths, deployables "
            "and attach handles: dev-1 (node1); binds to them fail") in result.details
    assert "dev-2" not in result.details


def test_a_bound_arq_whose_handle_is_free_fails(db, tmp_path) -> None:
    _fill(db)
    with db.write() as conn:
        conn.execute(update(attach_handles).where(attach_handles.c.id == 2)
                     .values(in_use=False))
    result = check_arqs(_conf(tmp_path, db))
    assert result.code == Code.FAILURE
    assert ("ARQ arq-2 (instance inst-2, host node2, provider rp-2): its attach handle is "
            "marked free") in result.details
    assert "arq-1" not in result.details


def test_a_long_list_is_cut_and_counted() -> None:
    rows = [(f"arq-{n}", f"inst-{n % 3}", "node1", "rp-1", "no attach handle")
            for n in range(SHOWN + 5)]
    text = describe(rows)
    assert text.startswith(f"{SHOWN + 5} Bound accelerator request(s) of 3 instance(s)")
    assert f"arq-{SHOWN - 1} " in text and f"arq-{SHOWN} " not in text
    assert "; and 5 more." in text


def test_an_empty_database_has_nothing_to_check(tmp_path) -> None:
    from acceld.db.engine import Database

    db = Database(f"sqlite:///{tmp_path}/empty.sqlite")
    result = check_arqs(_conf(tmp_path, db))
    assert result.code == Code.SUCCESS
    assert result.details == "No schema yet: no accelerator request to check."


def test_the_documented_repair_brings_the_inventory_and_the_binding_back(db, tmp_path) -> None:
    # docs/arqs.md, step by step: a bind done by the worker; the damage; the check names
    # it; delete the hollow devices and clear the host's digest; the next report adds the
    # hardware again under its own uuid and provider, its handle free; unbind and bind the
    # ARQ again with the values the check printed: it holds the handle again, and the
    # check passes.
    from falcon import testing

    from acceld.api.app import build_app
    from acceld.conductor.binding.worker import BindWorker
    from tests.helpers import SERVICE
    from tests.support.binds import ARQS, arq_state, request_binds

    conf = make_conf(str(tmp_path))
    conf.set_override("devices", ["FPGA"], group="fake_driver")
    conf.set_override("attach_handles", 1, group="fake_driver")
    records = FakeDriver(conf, "node1").discover()
    with db.write() as conn:
        conn.execute(insert(agents).values(hostname="node1", endpoint="10.0.0.21:6668",
                                           state="up", hardware_digest="d" * 64,
                                           heartbeat_interval=10, last_seen_at=T0,
                                           created_at=T0))
        inventory.reconcile_node(conn, "node1", records)
        agent_told(conn)  # no agent server: PCI binds in one transaction
        dev = conn.execute(select(devices)).one()
        dep = conn.execute(select(deployables)).one()
    worker = BindWorker(conf, db)
    worker.placement.client = None  # no Placement here
    [(instance, [arq])] = request_binds(conf, db, [("node1", dep.rp_uuid)])
    worker.run_once()
    assert arq_state(db, arq)[0] == "Bound"
    _rebuild_devices_with_foreign_keys_on(db)
    result = check_arqs(_conf(tmp_path, db))
    assert result.code == Code.FAILURE
    assert f"ARQ {arq} (instance {instance}, host node1, provider {dep.rp_uuid})" in \
        result.details
    with db.write() as conn:  # the statements docs/arqs.md gives
        conn.execute(text("DELETE FROM devices WHERE id NOT IN "
                          "(SELECT device_id FROM controlpath_ids)"))
        conn.execute(text("UPDATE agents SET hardware_digest = NULL "
                          "WHERE hostname IN ('node1', 'node2')"))
        assert conn.execute(select(agents.c.hardware_digest)).scalar() is None
        inventory.reconcile_node(conn, "node1", records)  # the pull at a next hello
        agent_told(conn)
        again = conn.execute(select(devices)).one()
        assert (again.uuid, conn.execute(select(deployables.c.rp_uuid)).scalar()) == (
            dev.uuid, dep.rp_uuid)
        assert conn.execute(select(controlpath_ids.c.device_id)).scalar() == again.id
        handle = conn.execute(select(attach_handles)).one()
        assert not handle.in_use
    assert "device(s)" not in check_arqs(_conf(tmp_path, db)).details
    api = testing.TestClient(build_app(conf, db))
    paths = ("/hostname", "/device_rp_uuid", "/instance_uuid")
    assert api.simulate_patch(ARQS, headers=SERVICE, json={arq: [
        {"op": "remove", "path": p} for p in paths]}).status_code == 202
    assert arq_state(db, arq)[0] == "Unbound"
    assert api.simulate_patch(ARQS, headers=SERVICE, json={arq: [
        {"op": "add", "path": p, "value": v}
        for p, v in zip(paths, ("node1", dep.rp_uuid, instance))]}).status_code == 202
    worker.run_once()
    assert arq_state(db, arq)[0] == "Bound"
    with db.read() as conn:
        assert conn.execute(select(accelerator_requests.c.attach_handle_id)).scalar() == \
            handle.id
        assert conn.execute(select(attach_handles.c.in_use)).scalar()
    assert check_arqs(_conf(tmp_path, db)).code == Code.SUCCESS
