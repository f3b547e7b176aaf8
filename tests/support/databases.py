"""A private, migrated database per test, on SQLite, PostgreSQL or MariaDB.

Concurrency and crash tests hammer a database and count what is in it, so they
must not share the suite's ``acceld_dev`` database with other tests running at
the same time. On a server backend this creates ``acceld_t_<random>`` next to
the configured test database and drops it afterwards.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from acceld.db import migrate
from acceld.db.engine import Database
from tests.conftest import SERVER_BACKENDS, server_url


@contextlib.contextmanager
def private_database(backend: str, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """Yield the URL of an empty, migrated database of its own."""
    if backend == "sqlite":
        url = f"sqlite:///{os.path.join(str(tmp_path), 'private.sqlite')}"
        _migrate(url)
        yield url
        return
    base = server_url(backend)
    if base is None:
        pytest.skip(f"{backend}: set {SERVER_BACKENDS[backend]} to run on it")
    name = f"acceld_t_{uuid.uuid4().hex[:12]}"
    server = make_url(base)
    admin = create_engine(server.set(database="postgres" if backend == "postgresql" else ""),
                          isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    url = server.set(database=name).render_as_string(hide_password=False)
    try:
        _migrate(url)
        yield url
    finally:
        with admin.connect() as conn:
            if backend == "postgresql":
                conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            else:
                conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()


def _migrate(url: str) -> None:
    db = Database(url)
    migrate.upgrade(db)
    db.dispose()
