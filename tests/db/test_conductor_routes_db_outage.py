"""The conductor's internal routes during a database outage answer 503 with ``Retry-After``
and log the outage once, never a 500 with a traceback per request (issue 11 item 4).

Forced at the two points where the database is met: the shared nonce table (the replay
check every call makes first) and the route's own work (an agent's hello), the outage
starting right after the replay check passed. The database refuses connections at the
engine level (tests.support.db_outage). Every backend.
"""

from __future__ import annotations

import logging

import orjson
from falcon import testing

from acceld.conductor.fleet.agents import AgentsComponent
from acceld.db import nonces
from acceld.internal import auth
from acceld.internal.server import build_app
from tests.conftest import make_conf
from tests.support.db_outage import outage

SECRET = b"conductor-outage-test-secret-0123456789"
HOST = "outage-host"


def _client(db, tmp_path, replay):  # type: ignore[no-untyped-def]
    conf = make_conf(str(tmp_path))
    agents = AgentsComponent(conf, db)
    app = build_app(SECRET, 60, agents.routes(), destination=auth.CONDUCTOR, replay=replay,
                    outage=db.outage)
    return testing.TestClient(app)


def _hello(client):  # type: ignore[no-untyped-def]
    body = orjson.dumps({"status": "READY", "endpoint": "127.0.0.1:6668",
                         "hardware_digest": None})
    headers = auth.headers(auth.node_key(SECRET, HOST), "POST", "/hello", body, node=HOST,
                           destination=auth.CONDUCTOR)
    return client.simulate_post("/hello", body=body,
                                headers={**headers, "Content-Type": "application/json"})


def _outage_lines(caplog) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_calls_during_an_outage_are_503_and_logged_once(db, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    client = _client(db, tmp_path, nonces.DatabaseReplay(db, 60))
    with outage(db) as down:
        down.start()
        answers = [_hello(client) for _ in range(3)]
    assert [a.status_code for a in answers] == [503] * 3, [a.text for a in answers]
    assert {a.headers.get("Retry-After") for a in answers} == {"5"}
    lines = _outage_lines(caplog)
    assert len(lines) == 1 and lines[0].startswith("The database is unavailable"), lines
    assert [r for r in caplog.records if r.exc_info] == []


def test_outage_starting_inside_a_route_is_503_not_500(db, tmp_path, caplog):
    """The replay check passed; the database goes away before the hello writes."""
    caplog.set_level(logging.INFO)
    real = nonces.DatabaseReplay(db, 60)

    with outage(db) as down:
        class GoesAway:
            def first_use(self, nonce: str, issued: int, now: float) -> bool:
                accepted = real.first_use(nonce, issued, now)
                down.start()
                return accepted

        client = _client(db, tmp_path, GoesAway())
        answer = _hello(client)
        down.stop()
    assert answer.status_code == 503, answer.text
    assert answer.headers.get("Retry-After") == "5"
    assert [r for r in caplog.records if r.exc_info] == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    lines = _outage_lines(caplog)
    assert len(lines) == 1 and lines[0].startswith("The database is unavailable"), lines


def test_lease_renewals_during_an_outage_log_it_once(db, tmp_path, monkeypatch, caplog):
    """An exclusive task runs while the database goes away: its lease renewer's failed
    renewals are the outage (one WARNING, no traceback per tick), and it renews again once
    the database is back."""
    from acceld.conductor import service
    from acceld.db import leases

    caplog.set_level(logging.INFO)
    monkeypatch.setattr(service, "LEASE_MIN_SECONDS", 0.3)  # a renewal every 0.1 s
    conductor = service.Conductor(make_conf(str(tmp_path)), db, [])
    renewed_after: list[bool] = []
    real_acquire = leases.acquire

    with outage(db) as down:
        def run() -> None:
            down.start()
            assert wait_for(lambda: down.refused >= 3), down.refused  # three ticks failed
            down.stop()
            calls = acquired.count
            assert wait_for(lambda: acquired.count > calls)  # a renewal after it is back
            renewed_after.append(True)

        class Counting:
            count = 0

        acquired = Counting()

        def counting_acquire(*args, **kwargs):  # type: ignore[no-untyped-def]
            held = real_acquire(*args, **kwargs)
            acquired.count += 1
            return held

        monkeypatch.setattr(leases, "acquire", counting_acquire)
        conductor._run_exclusive(service.PeriodicTask("outage-task", 0.1, run, exclusive=True))
    assert renewed_after == [True]
    assert [r for r in caplog.records if r.exc_info] == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([w for w in warnings if w.startswith("The database is unavailable")]) == 1, \
        warnings
    assert not [w for w in warnings if w.startswith(("Could not renew", "Lease "))], warnings


def wait_for(condition, timeout: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    """Poll ``condition`` until true (each poll observes the state it waits for)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False
