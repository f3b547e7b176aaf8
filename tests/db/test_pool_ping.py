"""Pooled connections are pinged only after sitting idle (acceld.db.engine): one killed by
the server while idle is replaced before anyone uses it; one killed right after use fails
the next transaction as a disconnect (an outage), and the pool recovers for the one after.
PostgreSQL and MariaDB (SQLite has no server to lose)."""

from __future__ import annotations

from typing import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from acceld.db import engine as engine_mod
from acceld.db.engine import Database


@pytest.fixture
def own(db) -> Iterator[Database]:  # type: ignore[no-untyped-def]
    """A pool of one connection of our own on the test's database (the shared pool must
    not keep a killed connection for the next test)."""
    if db.is_sqlite:
        pytest.skip("SQLite has no server connection to lose")
    mine = Database(db.url.render_as_string(hide_password=False), pool_size=1,
                    max_overflow=0)
    yield mine
    mine.dispose()


def _session_id(db) -> int:  # type: ignore[no-untyped-def]
    query = "SELECT pg_backend_pid()" if db.backend == "postgresql" else "SELECT CONNECTION_ID()"
    with db.read() as conn:
        return int(conn.execute(text(query)).scalar_one())


def _kill(db, session: int) -> None:  # type: ignore[no-untyped-def]
    """End ``session`` from another connection (outside the pool)."""
    raw = db.engine.pool._creator()  # a fresh driver connection, not from the pool
    try:
        cursor = raw.cursor()
        cursor.execute(f"SELECT pg_terminate_backend({session})" if db.backend == "postgresql"
                       else f"KILL {session}")
        raw.commit()
    finally:
        raw.close()


def test_an_idle_connection_killed_by_the_server_is_replaced_unseen(own, monkeypatch):
    db = own
    monkeypatch.setattr(engine_mod, "PING_IDLE_SECONDS", 0.0)  # every checkout counts as idle
    first = _session_id(db)
    _kill(db, first)
    assert _session_id(db) != first  # the ping found it dead; a new one served the read


def test_a_connection_killed_just_after_use_fails_once_then_the_pool_recovers(own, monkeypatch):
    db = own
    monkeypatch.setattr(engine_mod, "PING_IDLE_SECONDS", 3600.0)  # never pinged
    first = _session_id(db)
    _kill(db, first)
    with pytest.raises(DBAPIError) as failed:
        _session_id(db)
    assert failed.value.connection_invalidated or db.outage.is_outage(failed.value)
    assert _session_id(db) != first
