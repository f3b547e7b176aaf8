"""The suite never destroys data it did not create (issue 11, item 11).

``ACCELD_TEST_POSTGRES_URL`` / ``ACCELD_TEST_MYSQL_URL`` may name a database that holds
someone's data; the suite must work beside it, never in it.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from acceld.db.engine import Database
from tests.conftest import clear_tables, server_database
from tests.support.databases import SERVER_BACKENDS, drop_server_database, server_url


@pytest.fixture(params=list(SERVER_BACKENDS))
def foreign_database(request):  # type: ignore[no-untyped-def]
    """A database the suite did not make (as an operator's would be), with a row in it."""
    backend = request.param
    base = server_url(backend)
    if base is None:
        pytest.skip(f"{backend}: set {SERVER_BACKENDS[backend]} to run on it")
    name = f"keep_{uuid.uuid4().hex[:10]}"
    server = make_url(base)
    admin = create_engine(server.set(database="postgres" if backend == "postgresql" else ""),
                          isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    url = server.set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE devices (id INTEGER PRIMARY KEY)"))
        conn.execute(text("INSERT INTO devices (id) VALUES (42)"))
    try:
        yield backend, url, engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()


def _rows(engine) -> list:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT id FROM devices")))


def test_the_suite_refuses_to_clear_or_drop_a_database_it_did_not_create(
        foreign_database) -> None:
    backend, url, engine = foreign_database
    db = Database(url)
    try:
        with pytest.raises(RuntimeError, match="did not create"):
            clear_tables(db)
        with pytest.raises(RuntimeError, match="did not create"):
            drop_server_database(backend, url)
    finally:
        db.dispose()
    assert _rows(engine) == [(42,)]


@pytest.mark.parametrize("backend", list(SERVER_BACKENDS))
def test_the_session_database_is_the_suites_own(backend) -> None:
    if server_url(backend) is None:
        pytest.skip(f"{backend}: set {SERVER_BACKENDS[backend]} to run on it")
    named = make_url(server_url(backend)).database
    own = server_database(backend).url.database
    assert own != named and own.startswith("acceld_t_")
