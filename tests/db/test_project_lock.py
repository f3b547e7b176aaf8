"""acceld.db.project_lock: one writer per key at a time, other keys and other databases
free, and the lock (a row written first in the transaction) lasts exactly the transaction."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Connection, func, select, text
from sqlalchemy.exc import OperationalError

from acceld.db import project_lock
from acceld.db.engine import Database
from acceld.db.models import project_locks
from tests.support.databases import private_database


def _server_only(db) -> None:  # type: ignore[no-untyped-def]
    if db.is_sqlite:
        pytest.skip("SQLite: every write transaction holds the one database write lock")


def _impatient(conn: Connection) -> None:
    """Make ``conn`` give up a row lock wait after about a second (an error, not a wait)."""
    if conn.dialect.name == "mysql":
        conn.execute(text("SET SESSION innodb_lock_wait_timeout = 1"))
    else:
        conn.execute(text("SET LOCAL lock_timeout = '1s'"))


def _try_lock(db, key: str) -> bool:  # type: ignore[no-untyped-def]
    """Whether ``key``'s lock could be taken now (within a second); the pooled connection
    gets MariaDB's session wait back afterwards."""
    with db.engine.connect() as conn:
        try:
            with conn.begin():
                _impatient(conn)
                project_lock.take(conn, key)
            return True
        except OperationalError:
            return False
        finally:
            if conn.dialect.name == "mysql":
                conn.execute(text("SET SESSION innodb_lock_wait_timeout = DEFAULT"))
                conn.commit()


def _held_in_background(db, key: str):  # type: ignore[no-untyped-def]
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with project_lock.write(db, key):
            holding.set()
            release.wait(timeout=30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(timeout=30)
    return holder, release


def test_the_lock_lasts_exactly_the_transaction(db):
    _server_only(db)
    holder, release = _held_in_background(db, "p1")
    try:
        assert not _try_lock(db, "p1")
    finally:
        release.set()
        holder.join(timeout=30)
    assert _try_lock(db, "p1")
    with pytest.raises(RuntimeError), project_lock.write(db, "p1"):
        raise RuntimeError("rolled back")
    assert _try_lock(db, "p1")


def test_another_key_is_not_held_up(db):
    _server_only(db)
    holder, release = _held_in_background(db, "p1")
    try:
        assert _try_lock(db, "p2")  # at once, not after p1
    finally:
        release.set()
        holder.join(timeout=30)


def test_one_row_per_key_counting_its_writes(db):
    for _ in range(3):
        with project_lock.write(db, "p1"):
            pass
    with project_lock.write(db, "p2"):
        pass
    with db.read() as conn:
        rows = dict(conn.execute(select(project_locks.c.project_id, project_locks.c.writes)).all())
        assert conn.execute(select(func.count()).select_from(project_locks)).scalar() == 2
    assert rows == {"p1": 3, "p2": 1}


def test_another_database_on_the_server_is_not_held_up(db, tmp_path):
    """The same project in another acceld database (another cloud, a staging copy, a
    parallel test run) must not wait for this one."""
    _server_only(db)
    holder, release = _held_in_background(db, "p1")
    try:
        with private_database(db.backend, tmp_path) as url:
            other = Database(url)
            try:
                assert _try_lock(other, "p1")
            finally:
                other.dispose()
    finally:
        release.set()
        holder.join(timeout=30)
