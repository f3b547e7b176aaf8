"""Writes the database rolled back to break a deadlock (PostgreSQL 40P01, MariaDB 1213) or a
Galera write conflict (1213, "WSREP detected deadlock/conflict") are run again.

The deadlock is real and forced: two transactions each lock one lease row, meet at a
barrier, then each asks for the other's row. Without the retry one of them fails; with it
both finish. The API answers such a failure 503 with Retry-After, not a 500.
"""

from __future__ import annotations

import logging
import threading
import uuid
import time
from typing import Any, Callable

import psycopg.errors
import pymysql.err
import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from acceld.db import device_profiles, retry
from acceld.db.models import leases
from acceld.db.retry import is_deadlock, retry_on_deadlock
from tests.helpers import ADMIN

GALERA = ("WSREP detected deadlock/conflict and aborted the transaction. Try restarting the "
          "transaction")


def wrapped(orig: Exception) -> OperationalError:
    return OperationalError("UPDATE leases SET owner=%s", {}, orig)


def test_deadlocks_and_galera_conflicts_are_told_from_other_errors():
    assert is_deadlock(wrapped(pymysql.err.OperationalError(1213, GALERA)))
    assert is_deadlock(wrapped(pymysql.err.OperationalError(1213, "Deadlock found")))
    assert is_deadlock(wrapped(psycopg.errors.DeadlockDetected("deadlock detected")))
    assert is_deadlock(wrapped(psycopg.errors.SerializationFailure("could not serialize")))
    assert not is_deadlock(wrapped(pymysql.err.OperationalError(2003, "Can't connect")))
    assert not is_deadlock(IntegrityError("INSERT", {}, pymysql.err.IntegrityError(
        1062, "Duplicate entry")))
    assert not is_deadlock(ValueError("1213"))


def crossing(db, fn_for: Callable[[Callable[..., Any]], Callable[..., Any]]
             ) -> tuple[list[Any], list[BaseException], list[int]]:
    """Two transactions locking lease rows a and b in opposite orders, meeting in between
    on their first attempt; ``fn_for`` wraps each (or not). Results, errors, attempts."""
    with db.write() as conn:
        conn.execute(insert(leases), [
            {"name": name, "owner": "nobody", "expires_at": "2030-01-01 00:00:00"}
            for name in ("a", "b")])
    barrier = threading.Barrier(2, timeout=20)
    attempts = [0, 0]
    results: list[Any] = []
    errors: list[BaseException] = []

    def transaction(index: int, first: str, second: str) -> str:
        attempts[index] += 1
        with db.write() as conn:
            conn.execute(update(leases).where(leases.c.name == first).values(owner=first))
            if attempts[index] == 1:
                barrier.wait()
            conn.execute(update(leases).where(leases.c.name == second).values(owner=second))
        return f"{first}{second}"

    def run(index: int, first: str, second: str) -> None:
        try:
            results.append(fn_for(transaction)(index, first, second))
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=args)
               for args in ((0, "a", "b"), (1, "b", "a"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results, errors, attempts


def test_the_forced_interleaving_deadlocks_a_plain_write(db):
    if db.is_sqlite:
        pytest.skip("SQLite takes its write lock at BEGIN: no deadlock")
    results, errors, _ = crossing(db, lambda fn: fn)
    assert len(results) == 1 and len(errors) == 1, (results, errors)
    assert is_deadlock(errors[0]), errors[0]


def test_a_deadlock_victim_is_run_again_and_both_writes_land(db):
    if db.is_sqlite:
        pytest.skip("SQLite takes its write lock at BEGIN: no deadlock")
    results, errors, attempts = crossing(db, retry_on_deadlock)
    assert errors == [] and sorted(results) == ["ab", "ba"]
    assert sorted(attempts) == [1, 2]  # the victim ran twice, the other once
    with db.read() as conn:
        owners = dict(conn.execute(select(leases.c.name, leases.c.owner)).all())
    assert set(owners.values()) <= {"a", "b"}


def test_retries_are_bounded(caplog, monkeypatch):
    calls = []

    @retry_on_deadlock
    def always() -> None:
        calls.append(1)
        raise wrapped(pymysql.err.OperationalError(1213, GALERA))

    monkeypatch.setattr(retry, "_MAX_DELAY", 0.02)  # the bound, not the wait, is tested
    with caplog.at_level(logging.INFO, logger="acceld.db.retry"), \
            pytest.raises(OperationalError):
        always()
    assert len(calls) == retry.ATTEMPTS == 8
    # One line per retry (INFO), one WARNING when they run out; never a traceback or ERROR.
    levels = [r.levelname for r in caplog.records if r.name == "acceld.db.retry"]
    assert levels == ["INFO"] * 7 + ["WARNING"]
    assert any("after 8 attempts" in r.getMessage() for r in caplog.records)
    assert not any(r.exc_info for r in caplog.records)


def test_the_api_answers_a_deadlock_503_with_retry_after(client, monkeypatch, caplog):
    def conflict(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise wrapped(pymysql.err.OperationalError(1213, GALERA))

    monkeypatch.setattr(device_profiles, "list_profiles", conflict)
    resp = client.simulate_get("/accelerator/v2/device_profiles", headers=ADMIN)
    assert resp.status_code == 503, resp.text
    assert resp.headers["Retry-After"] == "1"
    assert "Traceback" not in caplog.text
    assert "rolled the request's transaction back" in caplog.text


def test_a_bind_rolled_back_by_a_conflict_is_run_again_and_answers_202(tmp_path, sqlite_db,
                                                                      monkeypatch):
    from acceld.db import accelerator_requests as arqs_db
    from acceld.db.models import bind_jobs
    from tests.unit.test_attach_handles import Node

    node = Node(tmp_path, sqlite_db)
    real = arqs_db.start_binds
    calls = []

    def conflict_once(conn, binds):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:  # as Galera reports a certification failure
            raise wrapped(pymysql.err.OperationalError(1213, GALERA))
        return real(conn, binds)

    monkeypatch.setattr(arqs_db, "start_binds", conflict_once)
    arq = node.start_bind()  # asserts the PATCH answered 202
    assert len(calls) == 2
    assert node.arq(arq)["state"] == "BindStarted"
    with sqlite_db.read() as conn:
        assert len(conn.execute(select(bind_jobs.c.id)).all()) == 1  # one job, not two


def test_a_bind_that_loses_a_write_conflict_is_retried_whole_without_an_error(
        conf, db, caplog, monkeypatch):
    """The claim of bind jobs and a bind's own transaction each lose one certification
    (error 1213, as on Galera with a second writer): the claim runs again, the bind's
    transaction is rolled back whole and the job tried again; one WARNING/INFO line each,
    no ERROR, no traceback; the ARQ ends Bound."""
    from falcon import testing

    from acceld.api.app import build_app
    from acceld.conductor.binding import target as bind_target
    from acceld.conductor.binding.worker import BindWorker
    from acceld.db import bind_jobs
    from tests.helpers import SERVICE
    from tests.support import inventory

    fpga = inventory.add_fpga(db, hostname="h1", handles=1)
    client = testing.TestClient(build_app(conf, db))
    assert client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
        {"name": "one", "groups": [{"resources:FPGA": "1"}]}]).status_code == 201
    [arq] = client.simulate_post("/accelerator/v2/accelerator_requests", headers=SERVICE,
                                 json={"device_profile_name": "one"}).json["arqs"]
    assert client.simulate_patch("/accelerator/v2/accelerator_requests", headers=SERVICE,
                                 json={arq["uuid"]: [
        {"op": "add", "path": "/hostname", "value": "h1"},
        {"op": "add", "path": "/device_rp_uuid", "value": fpga["deployable"]["rp_uuid"]},
        {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())}]}).status_code == 202
    lost = {"claim": 1, "take": 1}

    def losing(name: str, real):  # type: ignore[no-untyped-def]
        def run(*args, **kwargs):  # type: ignore[no-untyped-def]
            result = real(*args, **kwargs)  # the writes are made, then the commit fails
            if lost[name]:
                lost[name] -= 1
                raise wrapped(pymysql.err.OperationalError(1213, GALERA))
            return result
        return run

    monkeypatch.setattr(bind_target, "take_handle", losing("take", bind_target.take_handle))
    monkeypatch.setattr(bind_jobs, "_claim_statements",
                        losing("claim", bind_jobs._claim_statements))
    monkeypatch.setattr(retry, "_FIRST_DELAY", 0.001)
    worker = BindWorker(conf, db, batch=1)
    with caplog.at_level(logging.INFO):
        for _ in range(20):
            worker.run_once()
            state = client.simulate_get(f"/accelerator/v2/accelerator_requests/{arq['uuid']}",
                                        headers=SERVICE).json["state"]
            if state == "Bound":
                break
            time.sleep(0.1)  # the job's short retry delay
    assert state == "Bound"
    assert lost == {"claim": 0, "take": 0}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not any(r.exc_info for r in caplog.records)
    assert any("write conflict" in r.getMessage() and r.levelno in (logging.INFO,
               logging.WARNING) for r in caplog.records)


def test_a_reconcile_that_loses_a_write_conflict_is_run_again_whole(db, monkeypatch, caplog):
    """A node's report whose transaction loses a certification (1213) is applied again
    from its start (the diff read afresh), not raised to the agent's hello."""
    from acceld.conductor import reconcile
    from acceld.db import inventory

    real, calls = inventory.reconcile_node, []

    def losing_once(*args, **kwargs):  # type: ignore[no-untyped-def]
        changes = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            raise wrapped(pymysql.err.OperationalError(1213, GALERA))
        return changes

    monkeypatch.setattr(inventory, "reconcile_node", losing_once)
    with caplog.at_level(logging.INFO):
        outcome = reconcile.apply_report(db, "node-1", {"hardware": [], "digest": "0" * 64})
    assert calls == [1, 1]
    assert outcome.problems == []
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
