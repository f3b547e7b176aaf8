"""Forcing one interleaving of two transactions: run the second in a thread, then wait until
it has committed or the database makes it wait for the first.

A test pauses transaction A at an exact point (a hook), starts B on another
connection with :class:`Background`, and calls :meth:`Background.finished_or_blocked`.
That returns ``"finished"`` once B is done, or ``"blocked"`` as soon as the
database holds B back: on SQLite, B asked for the write lock that A's ``BEGIN
IMMEDIATE`` holds; on PostgreSQL and MariaDB, the server lists B's session as
waiting for a row lock. The test then lets A go on, and asserts what the
database decided. Nothing sleeps and hopes: each wait ends on an observed state.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator

from sqlalchemy import Connection, text

from acceld.db.engine import Database

DEADLINE = 30.0

_LOCK_WAITS = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                  "AND wait_event_type = 'Lock'",
    "mysql": "SELECT count(*) FROM information_schema.innodb_trx t "
             "JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id "
             "WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE()",
}


_SESSIONS = {
    "postgresql": "SELECT pid, state, wait_event_type, wait_event, query FROM pg_stat_activity "
                  "WHERE datname = current_database()",
    "mysql": "SELECT p.id, p.state, t.trx_state, p.info FROM information_schema.processlist p "
             "LEFT JOIN information_schema.innodb_trx t ON p.id = t.trx_mysql_thread_id "
             "WHERE p.db = DATABASE()",
}


def sessions(db: Database) -> list[tuple]:
    """What the server says each session of this database is doing (for failure messages)."""
    if db.is_sqlite:
        return []
    with db.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(_SESSIONS[db.backend]))]


def lock_waits(db: Database) -> int:
    """Sessions of this database waiting for a lock now (server backends)."""
    with db.engine.connect() as conn:
        return int(conn.execute(text(_LOCK_WAITS[db.backend])).scalar_one())


class Background:
    """``fn()`` in a thread of its own (so on its own pooled connection)."""

    def __init__(self, db: Database, fn: Callable[[], Any], name: str = "background") -> None:
        self.db = db
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.wants_write_lock = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        if db.is_sqlite:
            self._patched_over = db.__dict__.get("write")  # another Background's, if any
            self._real_write = db.write
            db.write = self._write  # type: ignore[method-assign]
        self._thread.start()

    @contextlib.contextmanager
    def _write(self) -> Iterator[Connection]:
        """The database's write(), noting when this thread asks for the write lock."""
        if threading.current_thread() is self._thread:
            self.wants_write_lock.set()
        with self._real_write() as conn:
            yield conn

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised by join()
            self.error = exc
        finally:
            self.done.set()

    def _blocked(self) -> bool:
        if self.db.is_sqlite:
            # The caller holds SQLite's only write lock: asking for it is waiting for it.
            return self.wants_write_lock.is_set()
        return lock_waits(self.db) > 0

    def finished_or_blocked(self) -> str:
        """``"finished"`` or ``"blocked"``, whichever is observed first."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            if self.done.is_set():
                return "finished"
            if self._blocked():
                return "blocked"
            # MariaDB refreshes its INNODB_TRX view only when it was not read for 0.1 s.
            self.done.wait(0.2 if self.db.backend == "mysql" else 0.01)
        raise AssertionError(f"{self._thread.name} neither finished nor waited for a lock "
                             f"within {DEADLINE} s; sessions: {sessions(self.db)}")

    def join(self) -> Any:
        """Wait for the end; the function's result, or its exception raised here."""
        if not self.done.wait(DEADLINE):
            raise AssertionError(f"{self._thread.name} did not finish within {DEADLINE} s")
        if self.db.is_sqlite:
            if self._patched_over is None:
                del self.db.write  # the class's method again
            else:
                self.db.write = self._patched_over  # type: ignore[method-assign]
        if self.error is not None:
            raise self.error
        return self.result


class Gate:
    """Pause one thread at a hook: ``reached`` once it got there, it goes on after
    ``opened`` is set (each wait bounded by DEADLINE)."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.opened = threading.Event()

    def pause(self) -> None:
        self.reached.set()
        assert self.opened.wait(DEADLINE), "the paused side was never let go"

    def wait_reached(self) -> None:
        assert self.reached.wait(DEADLINE), "the paused side never reached its hook"

    def open(self) -> None:
        self.opened.set()
