"""The Nova notifier against a recording endpoint, and the notify phase of bind jobs."""

from __future__ import annotations

import logging
import socket
import uuid

import pytest
from falcon import testing
from sqlalchemy import func, select, update

from acceld import outages, request_ids
from acceld.api.app import build_app
from acceld.clients import nova
from acceld.conductor.binding.worker import BindWorker
from acceld.db.models import bind_jobs
from tests.conftest import make_conf
from tests.helpers import ADMIN, SERVICE
from tests.support import inventory
from tests.support.nova import RecordingNova

ARQS = "/accelerator/v2/accelerator_requests"


@pytest.fixture
def recorder():
    server = RecordingNova().start()
    yield server
    server.stop()


def nova_conf(tmp_path, url: str, **extra):
    options = {"nova__retry_initial_delay": 0.01, "nova__connect_retries": 2,
               "nova__connect_retry_delay": 0.01, "nova__status_code_retries": 2,
               "nova__status_code_retry_delay": 0.01, **extra}
    return make_conf(str(tmp_path), nova__auth_type="none", nova__endpoint_override=url,
                     **options)


def events(n: int = 2) -> list[nova.Event]:
    return [nova.Event(str(uuid.uuid4()), str(uuid.uuid4()), "completed") for _ in range(n)]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_posts_one_event_per_arq_at_2_82(tmp_path, recorder):
    sent = events(2)
    outcome = nova.NovaNotifier(nova_conf(tmp_path, recorder.url)).send(sent)
    assert outcome == {e.arq_uuid: nova.DELIVERED for e in sent}
    (request,) = recorder.requests
    assert request.path == "/os-server-external-events"
    assert request.headers["OpenStack-API-Version"] == "compute 2.82"
    assert request.headers["X-OpenStack-Nova-API-Version"] == "2.82"
    assert request.body == {"events": [
        {"name": "accelerator-request-bound", "server_uuid": e.server_uuid, "tag": e.arq_uuid,
         "status": "completed"} for e in sent]}


def test_retries_are_keystoneauths(tmp_path, recorder):
    """[nova] status_code_retries: a 503 and a 502 are retried by keystoneauth, one send."""
    recorder.answer(503)
    recorder.answer(502)
    sent = events(1)
    notifier = nova.NovaNotifier(nova_conf(tmp_path, recorder.url))
    assert notifier.send(sent) == {sent[0].arq_uuid: nova.DELIVERED}
    assert len(recorder.requests) == 3


def test_no_retry_loop_of_acceld_on_top(tmp_path, recorder):
    """With keystoneauth's retries off, one POST per send: acceld adds none of its own."""
    for _ in range(3):
        recorder.answer(503)
    sent = events(1)
    conf = nova_conf(tmp_path, recorder.url, nova__status_code_retries=0)
    assert nova.NovaNotifier(conf).send(sent) == {sent[0].arq_uuid: nova.RETRY}
    assert len(recorder.requests) == 1


def test_connection_errors_are_retried_then_left_for_later(tmp_path, recorder, caplog):
    """Unreachable through every retry: RETRY for the job, and the outage logged once when
    it starts (not per attempt or per batch) and once when Nova is back."""
    outages.forget_process_log()
    conf = nova_conf(tmp_path, f"http://127.0.0.1:{closed_port()}")
    notifier = nova.NovaNotifier(conf)
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            sent = events(1)
            assert notifier.send(sent) == {sent[0].arq_uuid: nova.RETRY}
        conf.set_override("endpoint_override", recorder.url, group="nova")
        sent = events(1)
        assert nova.NovaNotifier(conf).send(sent) == {sent[0].arq_uuid: nova.DELIVERED}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("Nova is unavailable: ConnectFailure")
    assert warnings[1].startswith("Nova is available again")
    assert "left for later" in caplog.text
    outages.forget_process_log()


def test_events_carry_the_global_request_id(tmp_path, recorder):
    """keystoneauth sends the request's global id: Nova's log lines name it too."""
    global_id = request_ids.new()
    with request_ids.bound(global_id):
        nova.NovaNotifier(nova_conf(tmp_path, recorder.url)).send(events(1))
    nova.NovaNotifier(nova_conf(tmp_path, recorder.url)).send(events(1))  # no request
    first, second = ({k.lower(): v for k, v in r.headers.items()} for r in recorder.requests)
    assert first["x-openstack-request-id"] == global_id
    assert "x-openstack-request-id" not in second


def test_207_per_event_codes(tmp_path, recorder, caplog):
    sent = events(3)
    recorder.answer(207, {sent[1].arq_uuid: 422, sent[2].arq_uuid: 404})
    with caplog.at_level(logging.WARNING):
        outcome = nova.NovaNotifier(nova_conf(tmp_path, recorder.url)).send(sent)
    assert outcome == {sent[0].arq_uuid: nova.DELIVERED, sent[1].arq_uuid: nova.DROPPED,
                       sent[2].arq_uuid: nova.DROPPED}
    assert len(recorder.requests) == 1  # a 422 is not retried
    assert "not on a host yet" in caplog.text


def test_other_4xx_is_logged_not_retried(tmp_path, recorder, caplog):
    recorder.answer(400)
    sent = events(1)
    with caplog.at_level(logging.ERROR):
        outcome = nova.NovaNotifier(nova_conf(tmp_path, recorder.url)).send(sent)
    assert outcome == {sent[0].arq_uuid: nova.DROPPED}
    assert len(recorder.requests) == 1
    assert "refused" in caplog.text


def test_unconfigured_nova_logs_that_no_event_was_sent(tmp_path, caplog):
    sent = events(1)
    notifier = nova.NovaNotifier(make_conf(str(tmp_path)))
    assert not notifier.configured
    with caplog.at_level(logging.INFO):
        assert notifier.send(sent) == {sent[0].arq_uuid: nova.DELIVERED}
    assert "no accelerator-request-bound event sent" in caplog.text
    assert sent[0].arq_uuid in caplog.text


# ---------------------------------------------------------------------------- with binds

def _bind_two(client, db, instance: str) -> list[str]:
    """Two ARQs bound to a one-handle deployable: one ends Bound, one BindFailed."""
    fpga = inventory.add_fpga(db, hostname="node1", handles=1)
    client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN,
                         json=[{"name": "dp", "groups": [{"resources:FPGA": "2"}]}])
    arqs = client.simulate_post(ARQS, json={"device_profile_name": "dp"}, headers=ADMIN
                                ).json["arqs"]
    ops = [{"op": "add", "path": "/hostname", "value": "node1"},
           {"op": "add", "path": "/device_rp_uuid", "value": fpga["deployable"]["rp_uuid"]},
           {"op": "add", "path": "/instance_uuid", "value": instance}]
    result = client.simulate_patch(ARQS, json={a["uuid"]: ops for a in arqs}, headers=SERVICE)
    assert result.status_code == 202
    return [a["uuid"] for a in arqs]


def _jobs(db) -> int:
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(bind_jobs)).scalar_one()


def test_every_resolved_bind_is_announced(tmp_path, sqlite_db, recorder):
    conf = nova_conf(tmp_path, recorder.url)
    client = testing.TestClient(build_app(conf, sqlite_db))
    instance = str(uuid.uuid4())
    uuids = _bind_two(client, sqlite_db, instance)
    BindWorker(conf, sqlite_db).run_once()
    got = {e["tag"]: e for e in recorder.wait_for_events(2)}
    assert set(got) == set(uuids)
    assert sorted(e["status"] for e in got.values()) == ["completed", "failed"]
    assert {e["server_uuid"] for e in got.values()} == {instance}
    assert _jobs(sqlite_db) == 0


def test_notification_waits_while_nova_is_away(tmp_path, sqlite_db, recorder):
    port = closed_port()
    conf = nova_conf(tmp_path, f"http://127.0.0.1:{port}", nova__connect_retries=0)
    client = testing.TestClient(build_app(conf, sqlite_db))
    uuids = _bind_two(client, sqlite_db, str(uuid.uuid4()))
    BindWorker(conf, sqlite_db).run_once()
    assert recorder.events() == []
    with sqlite_db.read() as conn:  # both resolved, both still to announce, leases given up
        rows = conn.execute(select(bind_jobs.c.phase, bind_jobs.c.lease_owner)).all()
    assert [tuple(r) for r in rows] == [("notify", None), ("notify", None)]
    # Nova is back (same config, now pointing at the recorder); the retry delay has passed.
    with sqlite_db.write() as conn:
        conn.execute(update(bind_jobs).values(lease_expires_at=None))
    conf.set_override("endpoint_override", recorder.url, group="nova")
    BindWorker(conf, sqlite_db).run_once()
    assert {e["tag"] for e in recorder.wait_for_events(2)} == set(uuids)
    assert _jobs(sqlite_db) == 0
