"""Write transactions that run one at a time per key (a project), on every backend.

A limit check counts a project's rows and then inserts: two creates for one project
running side by side would both count the same usage and both insert. The first
statement of such a transaction writes the project's row in ``project_locks`` (an
upsert: inserted on first use, its counter raised after), and the count comes after it:

* SQLite: the write transaction already holds the database's write lock
  (``BEGIN IMMEDIATE``, acceld.db.engine); the row is written all the same.
* PostgreSQL and a single MariaDB server: the row lock makes a second writer wait until
  the first commits or rolls back; at READ COMMITTED (acceld.db.engine sets it on
  MariaDB) its count, a later statement, then reads the first writer's rows.
* MariaDB Galera with writers on several nodes: a row lock is local to its node, but
  both transactions write the same row, so certification lets the first to commit win
  and rolls the other back with error 1213 (the same as a deadlock); the caller runs
  its whole transaction again (acceld.db.retry) and counts afresh. ``GET_LOCK``, used
  here before, is not replicated by Galera and let two nodes pass on one count.

Nothing else reads the row: it exists to be written. The caller must not run a side
effect before the commit: a transaction rolled back at commit is run again from its start.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from sqlalchemy import Connection
from sqlalchemy.dialects import mysql, postgresql, sqlite

from acceld.db.engine import Database
from acceld.db.models import project_locks

_INSERTS = {"mysql": mysql.insert, "postgresql": postgresql.insert, "sqlite": sqlite.insert}


def take(conn: Connection, key: str) -> None:
    """Write ``key``'s lock row in ``conn``'s transaction (first statement of it)."""
    stmt = _INSERTS[conn.dialect.name](project_locks).values(project_id=key, writes=1)
    if conn.dialect.name == "mysql":
        stmt = stmt.on_duplicate_key_update(writes=stmt.inserted.writes + project_locks.c.writes)
    else:
        stmt = stmt.on_conflict_do_update(
            index_elements=[project_locks.c.project_id],
            set_={"writes": project_locks.c.writes + 1})
    conn.execute(stmt)


@contextlib.contextmanager
def write(db: Database, key: str) -> Iterator[Connection]:
    """``db.write()``, holding ``key``'s lock row from its first statement to its end."""
    with db.write() as conn:
        take(conn, key)
        yield conn
