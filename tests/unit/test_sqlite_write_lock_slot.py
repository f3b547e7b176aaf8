"""acceld.db.engine on SQLite: a write transaction begun in an API worker's serving slot
takes a free write lock at once, and waits for one another process holds outside the
slot, so that the worker serves reads meanwhile (acceld.serving.serving_slot)."""

from __future__ import annotations

import sqlite3
import threading

from sqlalchemy import text

from acceld.db.engine import Database
from acceld.serving import serving_slot


def _db(tmp_path) -> Database:
    db = Database(f"sqlite:///{tmp_path / 'acceld.sqlite'}", sqlite_busy_timeout_ms=10000)
    with db.write() as conn:
        conn.execute(text("CREATE TABLE t (n INTEGER)"))
    return db


def test_a_free_write_lock_is_taken_without_leaving_the_slot(tmp_path):
    db = _db(tmp_path)
    slot = serving_slot.Slot()
    with slot.held():
        with db.write() as conn:
            assert serving_slot.holds_slot()
            conn.execute(text("INSERT INTO t VALUES (1)"))
        busy = db.engine.connect().connection.dbapi_connection.execute(
            "PRAGMA busy_timeout").fetchone()[0]
    assert busy == 10000  # the connection's own timeout is put back
    db.dispose()


def test_a_held_write_lock_is_waited_for_outside_the_slot(tmp_path):
    db = _db(tmp_path)
    other = sqlite3.connect(tmp_path / "acceld.sqlite", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's write transaction
    slot = serving_slot.Slot()
    waiting, done = threading.Event(), threading.Event()
    after: list[bool] = []

    def writer() -> None:
        with slot.held():
            waiting.set()
            with db.write() as conn:  # waits for the lock, stepped out
                after.append(serving_slot.holds_slot())
                conn.execute(text("INSERT INTO t VALUES (2)"))
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    assert waiting.wait(5)
    with slot.held():  # another request is served while the writer waits for the lock
        assert not done.is_set()
        with db.read() as conn:
            assert conn.execute(text("SELECT count(*) FROM t")).scalar() == 0
    other.execute("COMMIT")
    thread.join(10)
    assert done.is_set() and after == [True]
    with db.read() as conn:
        assert conn.execute(text("SELECT n FROM t")).scalars().all() == [2]
    other.close()
    db.dispose()
