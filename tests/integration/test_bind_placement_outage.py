"""A real Placement stopped during binds and started again: the binds wait and end Bound.

Before: ~15 s of Placement outage (5 tries, 1+2+3+4+5 s apart) failed a bind that would
have succeeded, with "the conductor died or failed each time" and a traceback per try.
Here Placement (openstack-placement under gunicorn, tests.support.placement) is stopped
by PID while two instances' binds are pending, the worker tries more often than the old
attempt limit (the retry delays are skipped by making the jobs due), Placement is
started again on the same port and database, and both binds end Bound with one Nova
event each, one WARNING when the outage started and one when it ended, no traceback.
"""

from __future__ import annotations

import logging
import uuid

import pytest

from acceld.conductor.binding.worker import MAX_BIND_ATTEMPTS, BindWorker
from acceld.db.models import utcnow
from tests.conftest import make_conf
from tests.support import inventory
from tests.support.binds import RecordingNotifier, arq_state, make_jobs_due, request_binds
from tests.support.placement import PlacementServer, ensure_venv

HOST = "outage-compute"


@pytest.fixture
def placement(tmp_path):
    ensure_venv()
    server = PlacementServer(tmp_path / "placement").start()
    yield server
    server.stop()


def _provider_with_allocations(placement: PlacementServer, compute: str, rp: str,
                               instances: list[str]) -> None:
    """What acceld's sync and Nova's scheduler leave in Placement before a bind."""
    resp = placement.post("/resource_providers", {
        "uuid": rp, "name": f"{HOST}_FakeDevice", "parent_provider_uuid": compute})
    assert resp.status_code == 200, resp.text
    resp = placement.put(f"/resource_providers/{rp}/inventories", {
        "resource_provider_generation": resp.json()["generation"],
        "inventories": {"FPGA": {"total": len(instances)}}})
    assert resp.status_code == 200, resp.text
    for instance in instances:
        resp = placement.put(f"/allocations/{instance}", {
            "allocations": {rp: {"resources": {"FPGA": 1}}},
            "project_id": str(uuid.uuid4()), "user_id": str(uuid.uuid4()),
            "consumer_generation": None, "consumer_type": "INSTANCE"})
        assert resp.status_code == 204, resp.text


def test_binds_wait_for_placement_to_come_back(placement, db, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    conf = make_conf(str(tmp_path))
    placement.configure(conf)
    compute = placement.create_compute_node(HOST)
    fpga = inventory.add_fpga(db, hostname=HOST, handles=2)
    rp = fpga["deployable"]["rp_uuid"]
    made = request_binds(conf, db, [(HOST, rp), (HOST, rp)])
    _provider_with_allocations(placement, compute, rp, [instance for instance, _ in made])
    notifier = RecordingNotifier()
    worker = BindWorker(conf, db, notifier=notifier)

    placement.stop()
    stopped_at = utcnow()
    for _ in range(3 * MAX_BIND_ATTEMPTS):
        while worker.run_once():
            pass
        make_jobs_due(db)
    assert {arq_state(db, arq)[0] for _, arqs in made for arq in arqs} == {"BindStarted"}
    assert notifier.sent == []
    placement.start()
    while worker.run_once():
        pass
    outage = (utcnow() - stopped_at).total_seconds()

    assert {arq_state(db, arq) for _, arqs in made for arq in arqs} == {("Bound", None)}
    assert sorted((s.server_uuid, s.arq_uuid, s.status) for s in notifier.sent) == sorted(
        (instance, arq, "completed") for instance, arqs in made for arq in arqs)
    logs = [r for r in caplog.records if "Placement is " in r.getMessage()]
    assert [(r.levelname, "again" in r.getMessage()) for r in logs] == [
        ("WARNING", False), ("WARNING", True)], [r.getMessage() for r in logs]
    assert [r for r in caplog.records if r.exc_info] == []
    assert outage < conf.conductor.bind_timeout
