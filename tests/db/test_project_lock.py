"""acceld.db.project_lock: one writer per key at a time, other keys free, and MariaDB's
session lock never outlives the transaction (commit, rollback, a failed release)."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from acceld.db import project_lock
from acceld.db.engine import Database
from tests.support.databases import private_database


def _is_free(db, key: str) -> bool:  # type: ignore[no-untyped-def]
    with db.engine.connect() as conn:
        if db.backend == "mysql":
            return conn.execute(text("SELECT IS_FREE_LOCK(:n)"),
                                {"n": project_lock.lock_name(
                                    key, db.engine.url.database)}).scalar() == 1
        # pg_locks shows every database's locks: count only this one's.
        return conn.execute(text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND "
            "database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )).scalar() == 0


def _server_only(db) -> None:  # type: ignore[no-untyped-def]
    if db.is_sqlite:
        pytest.skip("SQLite: every write transaction holds the one database write lock")


def test_the_lock_lasts_exactly_the_transaction(db):
    _server_only(db)
    with project_lock.write(db, "p1"):
        assert not _is_free(db, "p1")
    assert _is_free(db, "p1")
    with pytest.raises(RuntimeError), project_lock.write(db, "p1"):
        raise RuntimeError("rolled back")
    assert _is_free(db, "p1")


def test_another_key_is_not_held_up(db):
    _server_only(db)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with project_lock.write(db, "p1"):
            holding.set()
            release.wait(timeout=30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(timeout=30)
        with project_lock.write(db, "p2", wait_seconds=1) as conn:  # at once, not after p1
            assert conn.execute(text("SELECT 1")).scalar() == 1
        if db.backend == "mysql":
            with pytest.raises(project_lock.LockTimeout):
                with project_lock.write(db, "p1", wait_seconds=1):
                    pass
    finally:
        release.set()
        holder.join(timeout=30)


def test_a_failed_release_discards_the_connection(db, monkeypatch):
    if db.backend != "mysql":
        pytest.skip("only MariaDB's lock belongs to the session")
    real_execute = type(db.engine.connect()).execute
    ids = []

    def execute(conn, statement, *args, **kwargs):  # type: ignore[no-untyped-def]
        if "RELEASE_LOCK" in str(statement):
            raise __import__("sqlalchemy").exc.OperationalError("release", {}, Exception("gone"))
        if "GET_LOCK" in str(statement):
            ids.append(conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar())
        return real_execute(conn, statement, *args, **kwargs)

    monkeypatch.setattr(type(db.engine.connect()), "execute", execute)
    with project_lock.write(db, "p1"):
        pass
    monkeypatch.undo()
    # The session that held the lock was closed, so the lock is free again: the server
    # ends the session when it reads the client's disconnect, which can take a moment.
    deadline = time.monotonic() + 10
    while not _is_free(db, "p1") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _is_free(db, "p1")
    with db.engine.connect() as conn:
        alive = conn.execute(text("SELECT count(*) FROM information_schema.processlist "
                                  "WHERE id = :i"), {"i": ids[0]}).scalar()
    assert alive == 0


def test_another_database_on_the_server_is_not_held_up(db, tmp_path):
    """MariaDB's lock names are server-wide: the same project in another acceld database
    (another cloud, a staging copy, a parallel test run) must not wait for this one."""
    _server_only(db)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with project_lock.write(db, "p1"):
            holding.set()
            release.wait(timeout=30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(timeout=30)
        with private_database(db.backend, tmp_path) as url:
            other = Database(url)
            try:
                with project_lock.write(other, "p1", wait_seconds=1) as conn:
                    assert conn.execute(text("SELECT 1")).scalar() == 1
            finally:
                other.dispose()
    finally:
        release.set()
        holder.join(timeout=30)
