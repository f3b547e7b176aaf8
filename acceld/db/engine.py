"""Engines and transactions that behave the same on SQLite, PostgreSQL and MariaDB.

SQLite is shared by several processes in the all-in-one (API workers and the
conductor), so it runs in WAL mode with a busy timeout, and write transactions
take the write lock up front (``BEGIN IMMEDIATE``): a read-then-write never
fails half way with "database is locked" when binds race.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from typing import Iterator

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from acceld.db import lock_wait, outage
from acceld.serving import serving_slot

_WRITE = "acceld_write"


class Database:
    """One engine per process, and the two kinds of transaction acceld uses."""

    def __init__(self, url: str, *, sqlite_busy_timeout_ms: int = 30000,
                 sqlite_cache_kib: int | None = None,
                 pool_size: int = 5, max_overflow: int = 10, echo: bool = False,
                 lock_timeout: float = 0.0) -> None:
        self.url = make_url(url)
        self.is_sqlite = self.url.get_backend_name() == "sqlite"
        if self.is_sqlite:
            self._ensure_sqlite_dir()
            self.engine = _create_engine(self.url, echo=echo, poolclass=NullPool
                                         if self._sqlite_memory() else None)
            _setup_sqlite(self.engine, sqlite_busy_timeout_ms, sqlite_cache_kib)
        else:
            kwargs = {"pool_size": pool_size, "max_overflow": max_overflow,
                      "pool_recycle": 3600, "connect_args": lock_wait.connect_args(
                          self.url.get_backend_name(), lock_timeout)}
            if self.url.get_backend_name() == "mysql":
                # Each statement sees the latest committed rows, as on PostgreSQL.
                kwargs["isolation_level"] = "READ COMMITTED"
                self.url = self.url.update_query_dict({"charset": "utf8mb4"})
            self.engine = _create_engine(self.url, echo=echo, **kwargs)
            _ping_idle_connections(self.engine)
        _statements_may_block(self.engine)
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
        with self.connect() as conn:
            with conn.begin():
                yield conn

    @contextlib.contextmanager
    def write(self, *, foreign_keys: bool = True) -> Iterator[Connection]:
        """A write transaction: committed on success, rolled back on any exception.

        ``foreign_keys=False`` (SQLite; migrations only): the transaction runs with foreign
        key enforcement off, so a table rebuild's DROP TABLE does not cascade into the rows
        that refer to it. SQLite ignores the PRAGMA inside a transaction, so it is set before
        BEGIN and back after the end; a connection it cannot be set back on is discarded."""
        with self.connect() as conn:
            off = not foreign_keys and self.is_sqlite
            if off:
                _sqlite_foreign_keys(conn, False)
            conn.info[_WRITE] = True
            try:
                with conn.begin():
                    yield conn
            finally:
                conn.info.pop(_WRITE, None)
                if off:
                    try:
                        _sqlite_foreign_keys(conn, True)
                    except Exception:
                        conn.invalidate()  # never back in the pool with foreign keys off
                        raise

    def connect(self) -> Connection:
        """A pooled connection, outside any transaction: taking it may wait on the server
        (a new connection), so it runs as a blocking call (acceld.serving.serving_slot)."""
        with serving_slot.blocking():
            return self.engine.connect()

    def dispose(self) -> None:
        self.engine.dispose()


class MissingDatabaseDriver(RuntimeError):
    """The URL's database driver cannot be imported; the message is one line that names
    what to install (every command that opens the database prints it as it is)."""


# The extras that install a driver: the backend and its driver as acceld's URLs name them.
DRIVER_EXTRAS = {("postgresql", "psycopg"): "postgresql", ("mysql", "pymysql"): "mysql"}


def driver_message(url, exc: ImportError) -> str:  # type: ignore[no-untyped-def]
    """What to install (or fix) when ``url``'s driver failed to import with ``exc``."""
    backend, driver = url.get_backend_name(), url.get_driver_name()
    scheme = f"{backend}+{driver}://"
    extra = DRIVER_EXTRAS.get((backend, driver))
    if isinstance(exc, ModuleNotFoundError) and exc.name and "." not in exc.name:
        missing = f"the database driver for {scheme} is not installed (no module {exc.name})"
        if extra:
            return f"{missing}: install it with pip install 'acceld[{extra}]' (in acceld's " \
                   "virtualenv)"
        return (f"{missing}: acceld's extras install postgresql+psycopg:// (pip install "
                "'acceld[postgresql]') and mysql+pymysql:// (pip install 'acceld[mysql]'); "
                "name one of them in [database] connection")
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if driver == "psycopg":
        detail += " (psycopg needs the system's libpq: apt-get install libpq5)"
    return f"the database driver for {scheme} cannot be loaded: {detail}"


def _create_engine(url, **kwargs) -> Engine:  # type: ignore[no-untyped-def]
    """create_engine, which imports the URL's driver: one line naming what to install when
    the driver is not there, rather than an ImportError from inside SQLAlchemy."""
    try:
        return create_engine(url, **kwargs)
    except ImportError as exc:
        raise MissingDatabaseDriver(driver_message(url, exc)) from exc


# A pooled connection idle longer than this is pinged before use (see below).
PING_IDLE_SECONDS = 1.0


def _ping_idle_connections(engine: Engine) -> None:
    """Ping a pooled connection before use only when it sat idle for a while.

    SQLAlchemy's ``pool_pre_ping`` pings on every checkout: a round trip per transaction,
    a third of a short transaction's cost on PostgreSQL (a heartbeat's nonce, a bind's
    claim). A connection returned less than ``PING_IDLE_SECONDS`` ago was just used;
    one idle longer (the database may have restarted meanwhile) is pinged, and a dead
    one is replaced before the caller sees it. A connection that died within the window
    fails its statement as a disconnect, which makes SQLAlchemy drop the whole pool (the
    caller's transaction is an outage, as any other during one)."""

    @event.listens_for(engine, "checkin")
    def _on_checkin(dbapi_conn, record) -> None:  # type: ignore[no-untyped-def]
        record.info["acceld_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn, record, proxy) -> None:  # type: ignore[no-untyped-def]
        since = record.info.get("acceld_idle_since")
        if since is not None and time.monotonic() - since < PING_IDLE_SECONDS:
            return
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute("SELECT 1")
            cursor.fetchall()
            dbapi_conn.rollback()  # end the transaction the driver opened for the ping
        except Exception as exc:  # noqa: BLE001 - any failure: let the pool reconnect
            raise DisconnectionError(f"pooled connection is dead: {exc}") from exc
        finally:
            try:
                cursor.close()
            except Exception:  # noqa: BLE001 - a dead cursor
                pass


def _sqlite_foreign_keys(conn: Connection, on: bool) -> None:
    """Set the connection's foreign key enforcement, outside any transaction (straight to
    the driver: SQLAlchemy would open one first), and raise unless it took effect."""
    raw = conn.connection.dbapi_connection
    raw.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")  # type: ignore[union-attr]
    now = raw.execute("PRAGMA foreign_keys").fetchone()[0]  # type: ignore[union-attr]
    if now != int(on):
        raise RuntimeError(f"SQLite did not turn foreign keys {'on' if on else 'off'} "
                           "(a transaction is open on the connection)")


def _statements_may_block(engine: Engine) -> None:
    """Every statement runs as a :func:`serving_slot.blocking` call (and so does taking a
    connection from the pool, in :meth:`Database.connect`): in an API worker's serving
    slot, one that waits (a lock another transaction holds, a migration's, the server's
    network) loses the slot after ``serving_slot.HAND_OFF_AFTER`` and the worker serves
    others meanwhile; one that returns at once costs two uncontended lock round trips."""
    dialect = engine.dialect

    @event.listens_for(engine, "do_execute")
    def _execute(cursor, statement, parameters, context) -> bool:  # type: ignore[no-untyped-def]
        with serving_slot.blocking():
            dialect.do_execute(cursor, statement, parameters, context)
        return True

    @event.listens_for(engine, "do_execute_no_params")
    def _execute_no_params(cursor, statement, context) -> bool:  # type: ignore[no-untyped-def]
        with serving_slot.blocking():
            dialect.do_execute_no_params(cursor, statement, context)
        return True

    @event.listens_for(engine, "do_executemany")
    def _executemany(cursor, statement, parameters, context) -> bool:  # type: ignore[no-untyped-def]
        with serving_slot.blocking():
            dialect.do_executemany(cursor, statement, parameters, context)
        return True


def _setup_sqlite(engine: Engine, busy_timeout_ms: int, cache_kib: int | None) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite's would be deferred).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        if cache_kib is not None:
            cur.execute(f"PRAGMA cache_size=-{int(cache_kib)}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Straight to the driver: this runs for every transaction, and SQLAlchemy's statement
        # machinery around a fixed BEGIN cost more than the BEGIN itself.
        dbapi_conn = conn.connection.dbapi_connection
        if not conn.info.get(_WRITE):
            dbapi_conn.execute("BEGIN")  # type: ignore[union-attr]
        elif serving_slot.holds_slot():
            _begin_write_stepping_out(dbapi_conn, busy_timeout_ms)
        else:
            dbapi_conn.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]


def _begin_write_stepping_out(dbapi_conn, busy_timeout_ms: int) -> None:  # type: ignore[no-untyped-def]
    """In an API worker's serving slot: take the write lock if it is free; if another
    process holds it (the conductor reconciling, another worker's bind), wait for it
    outside the slot, so that the worker serves reads meanwhile (acceld.serving.serving_slot)."""
    dbapi_conn.execute("PRAGMA busy_timeout=0")
    try:
        dbapi_conn.execute("BEGIN IMMEDIATE")
        return
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc) and "busy" not in str(exc):
            raise
    finally:
        dbapi_conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    with serving_slot.stepped_out():
        dbapi_conn.execute("BEGIN IMMEDIATE")


# SQLite's page cache per pooled connection in the API's processes (SQLite's default is
# 2,000 KiB). Each connection keeps its own for as long as it is pooled: after the bench's
# 10,000-device lists on four threads the API worker held ~8 MB of them. A list of that
# size does not fit in 2 MB either, the small requests' pages fit in 512 KiB, and the
# operating system caches the file for all: in process a 1,000-ARQ list (4.0 ms) and a
# 10,000-device list (29 ms) cost the same CPU with either.
API_SQLITE_CACHE_KIB = 512


def from_config(conf, *,  # type: ignore[no-untyped-def]
                sqlite_cache_kib: int | None = None, lock_timeout: float = 0.0) -> Database:
    """The process's database, from the ``[database]`` options; ``sqlite_cache_kib``
    bounds each SQLite connection's page cache (SQLite's default without it), and
    ``lock_timeout`` each statement's wait for a lock on the server databases
    (acceld.db.lock_wait; 0: the server's own settings)."""
    from acceld.config import database_url

    return Database(database_url(conf), sqlite_busy_timeout_ms=conf.database.sqlite_busy_timeout,
                    sqlite_cache_kib=sqlite_cache_kib,
                    pool_size=conf.database.pool_size, max_overflow=conf.database.max_overflow,
                    echo=conf.database.echo, lock_timeout=lock_timeout)
