"""Engines and transactions that behave the same on SQLite, PostgreSQL and MariaDB.

SQLite is shared by several processes in the all-in-one (API workers and the
conductor), so it runs in WAL mode with a busy timeout, and write transactions
take the write lock up front (``BEGIN IMMEDIATE``): a read-then-write never
fails half way with "database is locked" when binds race.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from acceld.db import outage

_WRITE = "acceld_write"


class Database:
    """One engine per process, and the two kinds of transaction acceld uses."""

    def __init__(self, url: str, *, sqlite_busy_timeout_ms: int = 30000,
                 pool_size: int = 5, max_overflow: int = 10, echo: bool = False) -> None:
        self.url = make_url(url)
        self.is_sqlite = self.url.get_backend_name() == "sqlite"
        if self.is_sqlite:
            self._ensure_sqlite_dir()
            self.engine = create_engine(self.url, echo=echo, poolclass=NullPool
                                        if self._sqlite_memory() else None)
            _setup_sqlite(self.engine, sqlite_busy_timeout_ms)
        else:
            kwargs = {"pool_pre_ping": True, "pool_size": pool_size,
                      "max_overflow": max_overflow, "pool_recycle": 3600}
            if self.url.get_backend_name() == "mysql":
                # Each statement sees the latest committed rows, as on PostgreSQL.
                kwargs["isolation_level"] = "READ COMMITTED"
                self.url = self.url.update_query_dict({"charset": "utf8mb4"})
            self.engine = create_engine(self.url, echo=echo, **kwargs)
        # Unreachable-database errors are outages (503, logged once), not bugs.
        self.outage = outage.watch(self.engine)

    @property
    def backend(self) -> str:
        return self.url.get_backend_name()

    def _sqlite_memory(self) -> bool:
        return self.url.database in (None, "", ":memory:")

    def _ensure_sqlite_dir(self) -> None:
        if not self._sqlite_memory():
            directory = os.path.dirname(os.path.abspath(self.url.database))
            os.makedirs(directory, mode=0o700, exist_ok=True)  # the state path: private

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only unit of work (one consistent snapshot)."""
        with self.engine.connect() as conn:
            with conn.begin():
                yield conn

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction: committed on success, rolled back on any exception."""
        with self.engine.connect() as conn:
            conn.info[_WRITE] = True
            try:
                with conn.begin():
                    yield conn
            finally:
                conn.info.pop(_WRITE, None)

    def dispose(self) -> None:
        self.engine.dispose()


def _setup_sqlite(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite's would be deferred).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Straight to the driver: this runs for every transaction, and SQLAlchemy's statement
        # machinery around a fixed BEGIN cost more than the BEGIN itself.
        conn.connection.dbapi_connection.execute(  # type: ignore[union-attr]
            "BEGIN IMMEDIATE" if conn.info.get(_WRITE) else "BEGIN")


def from_config(conf) -> Database:  # type: ignore[no-untyped-def]
    """The process's database, from the ``[database]`` options."""
    from acceld.config import database_url

    return Database(database_url(conf), sqlite_busy_timeout_ms=conf.database.sqlite_busy_timeout,
                    pool_size=conf.database.pool_size, max_overflow=conf.database.max_overflow,
                    echo=conf.database.echo)
