"""Databases the suite creates for itself, on SQLite, PostgreSQL or MariaDB.

``ACCELD_TEST_POSTGRES_URL`` / ``ACCELD_TEST_MYSQL_URL`` name a server (and a database
to connect through); the suite never drops, truncates or deletes anything in that
database. Every database it writes to is one it created, named ``acceld_t_<random>``,
and it drops only those: pointing the variables at a database with data in it leaves
that data alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from typing import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from acceld.db import migrate
from acceld.db.engine import Database

SERVER_BACKENDS = {
    "postgresql": "ACCELD_TEST_POSTGRES_URL",
    "mysql": "ACCELD_TEST_MYSQL_URL",
}
# The only names this module creates, and so the only ones it will drop.
_OWN_NAME = re.compile(r"acceld_t_[0-9a-f]{12}\Z")


def server_url(backend: str) -> str | None:
    return os.environ.get(SERVER_BACKENDS[backend]) or None


def _admin_engine(backend: str):  # type: ignore[no-untyped-def]
    server = make_url(server_url(backend))
    return create_engine(server.set(database="postgres" if backend == "postgresql" else ""),
                         isolation_level="AUTOCOMMIT")


def create_server_database(backend: str, *, migrated: bool = True) -> str:
    """Create an empty database of the suite's own, migrated to head unless ``migrated``
    is False (an upgrade test starts from nothing); returns its URL."""
    base = server_url(backend)
    if base is None:
        pytest.skip(f"{backend}: set {SERVER_BACKENDS[backend]} to run on it")
    name = f"acceld_t_{uuid.uuid4().hex[:12]}"
    admin = _admin_engine(backend)
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
    finally:
        admin.dispose()
    url = make_url(base).set(database=name).render_as_string(hide_password=False)
    if migrated:
        _migrate(url)
    return url


def drop_server_database(backend: str, url: str) -> None:
    """Drop a database :func:`create_server_database` made; refuses any other name."""
    name = make_url(url).database or ""
    if not _OWN_NAME.match(name):
        raise RuntimeError(f"refusing to drop {name!r}: the test suite did not create it")
    admin = _admin_engine(backend)
    try:
        with admin.connect() as conn:
            force = " WITH (FORCE)" if backend == "postgresql" else ""
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}{force}"))
    finally:
        admin.dispose()


def is_own_database(url: str) -> bool:
    """Whether ``url`` names a database this module created (SQLite files are per test)."""
    parsed = make_url(url)
    return parsed.get_backend_name() == "sqlite" or bool(
        _OWN_NAME.match(parsed.database or ""))


@contextlib.contextmanager
def private_database(backend: str, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """Yield the URL of an empty, migrated database of its own, dropped afterwards."""
    if backend == "sqlite":
        url = f"sqlite:///{os.path.join(str(tmp_path), 'private.sqlite')}"
        _migrate(url)
        yield url
        return
    url = create_server_database(backend)
    try:
        yield url
    finally:
        drop_server_database(backend, url)


def _migrate(url: str) -> None:
    db = Database(url)
    migrate.upgrade(db)
    db.dispose()
