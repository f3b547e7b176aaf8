"""Shared fixtures: configuration, a database on every backend, the in-process API.

Tests that take the ``db`` fixture run once per backend: SQLite always, and
PostgreSQL and MariaDB when ACCELD_TEST_POSTGRES_URL / ACCELD_TEST_MYSQL_URL
are set (skipped with the reason otherwise). `.ci/run` sets both. Those variables
name a server: the suite works only in databases it creates there itself
(``tests.support.databases``) and drops them at the end of the session.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
from typing import Iterator

import pytest
from falcon import testing
from oslo_config import cfg
from sqlalchemy import delete, event

from acceld import config
from acceld.db import migrate
from acceld.db.engine import Database
from acceld.db.models import Base
from tests.support.databases import (SERVER_BACKENDS, create_server_database,
                                     drop_server_database, is_own_database, server_url)

BACKENDS = ["sqlite", *SERVER_BACKENDS]


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("template") / "acceld.sqlite")
    db = Database(f"sqlite:///{path}")
    migrate.upgrade(db)
    db.dispose()
    return path


_server_dbs: dict[str, tuple[Database, str]] = {}


def server_database(backend: str) -> Database:
    """One migrated database per server backend per test session, created by the suite."""
    if backend not in _server_dbs:
        url = create_server_database(backend)
        _server_dbs[backend] = (Database(url), url)
    return _server_dbs[backend][0]


def pytest_sessionfinish(session, exitstatus) -> None:  # type: ignore[no-untyped-def]
    """Drop the session's server databases (only ever ones the suite created)."""
    for backend, (db, url) in list(_server_dbs.items()):
        db.dispose()
        drop_server_database(backend, url)
        del _server_dbs[backend]


def clear_tables(db: Database) -> None:
    """Empty every table of a database the suite created; refuses any other."""
    if not is_own_database(db.url):
        raise RuntimeError(f"refusing to clear {db.url!r}: the test suite did not create it")
    with db.engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            if table.name != "schema_migrations":  # the schema's record, as alembic_version
                conn.execute(delete(table))


@pytest.fixture(autouse=True)
def _restore_root_logging() -> Iterator[None]:
    """A test that sets logging up as a service does (acceld.logs.setup, cli.main) gives
    the run's logging back as it found it: a handler it added, on a stream its capture
    fixture closes, would otherwise get every later test's records in this process
    ('--- Logging error ---' on stderr, with the record's text)."""
    root = logging.getLogger()
    handlers, level, hook = root.handlers[:], root.level, sys.excepthook
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)
    sys.excepthook = hook


@pytest.fixture(autouse=True)
def _fresh_outage_log() -> Iterator[None]:
    """Each test starts with no remote-service outage in progress (acceld.outages)."""
    from acceld.outages import forget_process_log

    forget_process_log()
    yield
    forget_process_log()


@pytest.fixture(params=BACKENDS)
def db(request, tmp_path, sqlite_template) -> Iterator[Database]:
    """A migrated, empty database on each backend."""
    backend = request.param
    if backend == "sqlite":
        path = str(tmp_path / "acceld.sqlite")
        shutil.copy(sqlite_template, path)
        database = Database(f"sqlite:///{path}")
        yield database
        database.dispose()
        return
    database = server_database(backend)
    clear_tables(database)
    yield database
    clear_tables(database)


@pytest.fixture
def sqlite_db(tmp_path, sqlite_template) -> Iterator[Database]:
    """SQLite only: for tests about the API surface rather than the database."""
    path = str(tmp_path / "acceld.sqlite")
    shutil.copy(sqlite_template, path)
    database = Database(f"sqlite:///{path}")
    yield database
    database.dispose()


def make_conf(state_path: str, **overrides) -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    config.load(conf=conf)
    conf.set_override("state_path", state_path)
    for key, value in overrides.items():
        group, _, name = key.rpartition("__")
        conf.set_override(name, value, group=group or None)
    return conf


@pytest.fixture
def conf(tmp_path) -> cfg.ConfigOpts:
    return make_conf(str(tmp_path))


@pytest.fixture
def app(conf, db):
    from acceld.api.app import build_app

    return build_app(conf, db)


@pytest.fixture
def client(app) -> testing.TestClient:
    return testing.TestClient(app)


@contextlib.contextmanager
def count_queries(db: Database) -> Iterator[list[str]]:
    """Collect the SQL statements run on ``db`` inside the block."""
    statements: list[str] = []

    def _record(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        if not statement.lstrip().upper().startswith(("BEGIN", "PRAGMA")):
            statements.append(statement)

    event.listen(db.engine, "before_cursor_execute", _record)
    try:
        yield statements
    finally:
        event.remove(db.engine, "before_cursor_execute", _record)


def pytest_report_header(config) -> list[str]:  # type: ignore[no-untyped-def]
    lines = []
    for backend, var in SERVER_BACKENDS.items():
        state = "on" if server_url(backend) else f"SKIPPED (set {var} to run on it)"
        lines.append(f"acceld database backend {backend}: {state}")
    return lines


@pytest.fixture(scope="session")
def galera_cluster():  # type: ignore[no-untyped-def]
    """A three-node MariaDB Galera cluster with HAProxy in front (tests.support.galera),
    one per test process (each xdist worker starts its own), started on first use and
    stopped by PID at the end of the session; skips with the reason where it cannot run."""
    from tests.support import galera

    reason = galera.unavailable()
    if reason:
        pytest.skip(f"no Galera cluster: {reason}")
    with galera.running_cluster() as cluster:
        yield cluster
