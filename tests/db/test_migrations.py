"""Migrations build exactly the schema the models describe, on every backend."""

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import event, inspect

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


def _raw_connections(db: Database) -> list:
    """The driver connections the engine's transactions run on, as they begin."""
    seen: list = []
    event.listen(db.engine, "begin",
                 lambda conn: seen.append(conn.connection.dbapi_connection))
    return seen


def test_sqlite_upgrade_runs_without_foreign_keys_and_turns_them_back_on(tmp_path):
    # The upgrade's own connection: off during the migrations (so a batch rebuild's DROP
    # TABLE cascades nowhere), on again before it returns to the pool.
    db = Database(f"sqlite:///{tmp_path}/fk.sqlite")
    seen = _raw_connections(db)
    during: list[int] = []
    event.listen(db.engine, "before_cursor_execute",
                 lambda conn, cur, stmt, *a: during.append(
                     conn.connection.dbapi_connection.execute(
                         "PRAGMA foreign_keys").fetchone()[0])
                 if stmt.lstrip().startswith("CREATE TABLE") else None)
    migrate.upgrade(db)
    assert during and set(during) == {0}
    assert seen and all(raw.execute("PRAGMA foreign_keys").fetchone()[0] == 1
                        for raw in seen)


def test_sqlite_upgrade_refuses_foreign_key_violations(tmp_path):
    db = Database(f"sqlite:///{tmp_path}/orphan.sqlite")
    migrate.upgrade(db, "0001")
    with db.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        raw.execute("PRAGMA foreign_keys=OFF")
        raw.execute("INSERT INTO controlpath_ids (id, uuid, device_id, cpid_type, cpid_info, "
                    "created_at) VALUES (1, 'c1', 42, 'PCI', '{}', '2026-12-01 00:00:00')")
        raw.execute("PRAGMA foreign_keys=ON")
    seen = _raw_connections(db)
    with pytest.raises(migrate.ForeignKeyViolation,
                       match="rolled back .*controlpath_ids: 1 row.*missing devices rows"):
        migrate.upgrade(db)
    assert migrate.current_revision(db) == "0001"  # nothing of the upgrade stayed
    assert "device_events" not in inspect(db.engine).get_table_names()
    assert all(raw.execute("PRAGMA foreign_keys").fetchone()[0] == 1 for raw in seen)


def test_sqlite_migrations_refuse_foreign_keys_on(tmp_path):
    # A caller that runs alembic past acceld.db.migrate.upgrade, with foreign keys on.
    from alembic import command

    db = Database(f"sqlite:///{tmp_path}/on.sqlite")
    cfg = migrate.alembic_config()
    with pytest.raises(RuntimeError, match="must run with foreign keys off"):
        with db.write() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    assert migrate.current_revision(db) is None
