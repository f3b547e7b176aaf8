"""Write transactions that run one at a time per key (a project), on every backend.

A limit check counts a project's rows and then inserts: two creates for one project
running side by side would both count the same usage and both insert. Holding a lock
named after the project from before the count until after the commit makes the pair
atomic for writers that use this module, without a table of lock rows:

* SQLite: every write transaction already holds the database's write lock
  (``BEGIN IMMEDIATE``, acceld.db.engine), so nothing is added.
* PostgreSQL: ``pg_advisory_xact_lock`` on a 64-bit hash of the key, released by the
  commit or rollback. The count must be a later statement than the lock: at READ
  COMMITTED each statement reads the rows committed when it starts.
* MariaDB/MySQL: ``GET_LOCK`` belongs to the session, not the transaction, so it is taken
  before the transaction begins and released after it has ended; if the release fails,
  the connection is discarded (closing the session frees the lock). Its names are
  server-wide, so the name includes the database's: two acceld databases on one server
  (two clouds, or a staging copy) never wait for each other.

Two keys with the same hash only wait for each other; they are never counted together.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from typing import Iterator

from sqlalchemy import Connection, text
from sqlalchemy.exc import SQLAlchemyError

from acceld.db.engine import Database

LOG = logging.getLogger(__name__)
_NAMESPACE = b"acceld.project_lock:"


class LockTimeout(Exception):
    """Another writer held the key for longer than the wait allowed."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(_NAMESPACE + key.encode("utf-8")).digest()


def advisory_key(key: str) -> int:
    """PostgreSQL's advisory lock id for ``key`` (a signed 64-bit integer)."""
    return int.from_bytes(_digest(key)[:8], "big", signed=True)


def lock_name(key: str, database: str) -> str:
    """MariaDB's lock name for ``key`` in ``database`` (at most 64 characters)."""
    return "acceld:" + _digest(f"{database}/{key}").hex()[:48]


@contextlib.contextmanager
def write(db: Database, key: str, *, wait_seconds: int = 30) -> Iterator[Connection]:
    """``db.write()``, holding the lock on ``key`` for the whole transaction.

    ``wait_seconds`` bounds the wait on MariaDB (GET_LOCK needs one; LockTimeout after
    it); PostgreSQL waits as for a row lock."""
    if db.backend == "mysql":
        with _mysql_write(db, key, wait_seconds) as conn:
            yield conn
        return
    with db.write() as conn:
        if db.backend == "postgresql":
            # Waits as a row lock does: the holder's transaction is short.
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": advisory_key(key)})
        yield conn


@contextlib.contextmanager
def _mysql_write(db: Database, key: str, wait_seconds: int) -> Iterator[Connection]:
    name = lock_name(key, db.engine.url.database or "")
    with db.connect() as conn:
        got = conn.execute(text("SELECT GET_LOCK(:n, :t)"),
                           {"n": name, "t": wait_seconds}).scalar()
        conn.commit()  # end the implicit transaction the SELECT began
        if got != 1:
            raise LockTimeout(key)
        try:
            with conn.begin():
                yield conn
        finally:
            try:
                conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": name})
                conn.commit()
            except SQLAlchemyError:
                LOG.warning("Could not release lock %s; discarding the connection", name,
                            exc_info=True)
                conn.invalidate()
