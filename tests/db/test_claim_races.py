"""A standalone claim (API 2.8) and a Nova bind racing for a device's last attach handle: exactly
one wins, the other ends BindFailed saying why, on SQLite, PostgreSQL and MariaDB.

Forced at the exact point: the first side's bind transaction stops right after it took the
handle (before its commit); the second side's bind then runs on its own connection and is
observed waiting for the first (the handle's row lock on PostgreSQL and MariaDB, the write
lock on SQLite); the first is let go, and the database's decision is checked: one Bound ARQ
on the handle, the other BindFailed with "no free attach handle", the handle in use once,
Nova told of its own outcome only, and a losing claim's consumer marked for its allocation
to be written again.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from falcon import testing
from sqlalchemy import func, select

from acceld.api.app import build_app
from acceld.conductor.binding import target as bind_target
from acceld.conductor.binding.worker import BindWorker
from acceld.db import bind_jobs
from acceld.db.models import accelerator_requests, attach_handles, claim_consumers
from tests.helpers import ADMIN, SERVICE, member, version
from tests.support import inventory
from tests.support.binds import RecordingNotifier
from tests.support.interleave import DEADLINE, Background, Gate

ARQS = "/accelerator/v2/accelerator_requests"
HOST = "race-node"
TOKEN = "claim-race"


def pause_after_taking_a_handle(monkeypatch, thread_name: str) -> Gate:  # type: ignore[no-untyped-def]
    gate, original = Gate(), bind_target.take_handle

    def take_then_pause(conn, target):  # type: ignore[no-untyped-def]
        original(conn, target)
        if threading.current_thread().name == thread_name:
            gate.pause()

    monkeypatch.setattr(bind_target, "take_handle", take_then_pause)
    return gate


def set_up(conf, db):  # type: ignore[no-untyped-def]
    """The last handle asked for twice: a claim (created first, while it was free) and a
    Nova bind of an instance (Nova asks acceld nothing before it binds)."""
    fpga = inventory.add_fpga(db, hostname=HOST, handles=1)
    client = testing.TestClient(build_app(conf, db))
    assert client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
        {"name": "one", "groups": [{"resources:FPGA": "1"}]}]).status_code == 201
    claimed = client.simulate_post(ARQS, json={"device_profile_name": "one",
                                               "claim": {"hostname": HOST}},
                                   headers={**member(), **version("2.8")})
    assert claimed.status_code == 201, claimed.text
    [nova] = client.simulate_post(ARQS, json={"device_profile_name": "one"},
                                  headers=SERVICE).json["arqs"]
    instance = str(uuid.uuid4())
    assert client.simulate_patch(ARQS, headers=SERVICE, json={nova["uuid"]: [
        {"op": "add", "path": "/hostname", "value": HOST},
        {"op": "add", "path": "/device_rp_uuid", "value": fpga["deployable"]["rp_uuid"]},
        {"op": "add", "path": "/instance_uuid", "value": instance}]}).status_code == 202
    jobs = []
    while batch := bind_jobs.claim(db, bind_jobs.PENDING, TOKEN, 8, 300):
        jobs += batch
    with db.read() as conn:
        ids = dict(conn.execute(select(accelerator_requests.c.uuid,
                                       accelerator_requests.c.id)).all())
    by_arq = {job.arq_id: job for job in jobs}
    claim_uuid = claimed.json["arqs"][0]["uuid"]
    return {"claim": (claim_uuid, by_arq[ids[claim_uuid]]),
            "nova": (nova["uuid"], by_arq[ids[nova["uuid"]]]), "instance": instance}


def outcome(db, arq_uuid: str):  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return conn.execute(select(accelerator_requests.c.state,
                                   accelerator_requests.c.attach_handle_id,
                                   accelerator_requests.c.bind_failure_reason).where(
            accelerator_requests.c.uuid == arq_uuid)).one()


@pytest.mark.parametrize("first", ["claim", "nova"])
def test_last_handle_claim_against_nova_bind(db, conf, monkeypatch, first):
    sides = set_up(conf, db)
    second = "nova" if first == "claim" else "claim"
    notifier = RecordingNotifier()
    gate = pause_after_taking_a_handle(monkeypatch, "first")
    results: dict[str, object] = {}

    def run(side: str) -> bool:
        worker = BindWorker(conf, db, notifier=notifier)
        uuid_, job = sides[side]
        done = worker._bind(job, TOKEN)
        worker._notify([job.id], TOKEN)
        return done

    thread = threading.Thread(target=lambda: results.update(first=run(first)), name="first",
                              daemon=True)
    thread.start()
    assert gate.reached.wait(DEADLINE), "the first bind never took the handle"
    other = Background(db, lambda: run(second), name="second")
    assert other.finished_or_blocked() == "blocked"  # held back by the first's handle
    gate.opened.set()
    thread.join(DEADLINE)
    assert not thread.is_alive()
    assert other.join() is True and results["first"] is True  # both resolved

    winner, loser = outcome(db, sides[first][0]), outcome(db, sides[second][0])
    assert winner.state == "Bound" and winner.attach_handle_id is not None
    assert loser.state == "BindFailed" and loser.attach_handle_id is None
    assert loser.bind_failure_reason == (f"no free attach handle on deployable {HOST}_FakeDevice: "
                                         "all are in use")
    with db.read() as conn:
        in_use = conn.scalar(select(func.count()).select_from(attach_handles).where(
            attach_handles.c.in_use.is_(True)))
        due = conn.scalar(select(claim_consumers.c.due))
    assert in_use == 1
    # Nova hears of its instance's ARQ only; a losing claim's allocation is written again.
    assert [(s.server_uuid, s.arq_uuid, s.status) for s in notifier.sent] == [
        (sides["instance"], sides["nova"][0], "completed" if first == "nova" else "failed")]
    assert due is (first == "nova")
