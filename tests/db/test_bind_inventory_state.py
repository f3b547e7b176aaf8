"""Binds refuse what reconciliation marks unusable: a down agent, hardware not ready, a
device that vanished while in use. The inventory comes from the fake driver, reconciled."""

from __future__ import annotations

import json
import uuid as uuidlib

import pytest
from sqlalchemy import insert, update

from acceld.conductor.binding.target import AgentDown, BindRefused, BindTarget, check_and_take
from acceld.db import inventory
from acceld.db.models import agents, attach_handles, utcnow
from acceld.drivers.fake import FakeDriver
from tests.conftest import make_conf

HOST = "node-1"
RP = str(uuidlib.uuid3(uuidlib.NAMESPACE_DNS, f"{HOST}_FakeDevice"))


@pytest.fixture
def conf(tmp_path):
    return make_conf(str(tmp_path))


def reconcile(db, conf) -> None:
    with db.write() as conn:
        inventory.reconcile_node(conn, HOST, FakeDriver(conf, HOST).discover())


def bind(db) -> BindTarget:
    target = BindTarget(arq_uuid=str(uuidlib.uuid4()), hostname=HOST, device_rp_uuid=RP,
                        instance_uuid=str(uuidlib.uuid4()), group={"resources:FPGA": "1"})
    with db.write() as conn:
        return check_and_take(conn, target)


def set_agent(db, state: str) -> None:
    with db.write() as conn:
        updated = conn.execute(update(agents).where(agents.c.hostname == HOST)
                               .values(state=state)).rowcount
        if not updated:
            conn.execute(insert(agents).values(hostname=HOST, endpoint="127.0.0.1:1",
                                               state=state, heartbeat_interval=1,
                                               last_seen_at=utcnow()))


def test_no_bind_while_the_agent_is_down(db, conf):
    """The check raises AgentDown, an outage the bind waits out (tests/db/
    test_bind_agent_down.py), and takes no handle."""
    reconcile(db, conf)
    set_agent(db, "down")
    with pytest.raises(AgentDown, match="agent of host node-1 is down"):
        bind(db)
    set_agent(db, "up")
    assert bind(db).handle is not None


def test_hardware_not_ready_is_not_bound_until_ready(db, conf, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([{"type": "FPGA", "acc_status": "setup_required"}]))
    conf.set_override("spec_file", str(spec), group="fake_driver")
    reconcile(db, conf)
    with pytest.raises(BindRefused, match="not ready"):
        bind(db)
    spec.write_text(json.dumps([{"type": "FPGA"}]))
    reconcile(db, conf)
    assert bind(db).handle is not None


def test_vanished_device_is_not_bound(db, conf):
    reconcile(db, conf)
    bind(db)  # one handle in use
    with db.write() as conn:
        inventory.reconcile_node(conn, HOST, [])
    with pytest.raises(BindRefused):
        bind(db)
    with db.write() as conn:
        conn.execute(update(attach_handles).values(in_use=False))
        inventory.reconcile_node(conn, HOST, [])
    with pytest.raises(BindRefused, match="not the resource provider"):
        bind(db)
