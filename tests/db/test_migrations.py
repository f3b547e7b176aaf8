"""Migrations build exactly the schema the models describe, on every backend."""

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from acceld.db import migrate
from acceld.db.engine import Database
from acceld.db.models import Base


def test_upgrade_from_empty_matches_models(db):
    # The fixture's schema came from `migrate.upgrade` on an empty database.
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []
    assert migrate.current_revision(db) == migrate.head_revision()


def test_upgrade_is_idempotent(db):
    tables = set(inspect(db.engine).get_table_names())
    migrate.upgrade(db)
    migrate.upgrade(db)
    assert set(inspect(db.engine).get_table_names()) == tables
    assert migrate.current_revision(db) == migrate.head_revision()


def test_sqlite_from_nothing(tmp_path):
    db = Database(f"sqlite:///{tmp_path}/sub/dir/new.sqlite")
    assert migrate.current_revision(db) is None
    migrate.upgrade(db)
    assert migrate.current_revision(db) == migrate.head_revision()
    assert {t.name for t in Base.metadata.sorted_tables} <= set(inspect(db.engine).get_table_names())


def test_sqlite_runs_in_wal_mode(tmp_path):
    db = Database(f"sqlite:///{tmp_path}/wal.sqlite")
    with db.read() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
