"""Schema migrations: ``acceld db upgrade`` and the all-in-one's start-up both call upgrade()."""

from __future__ import annotations

import os

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

from acceld.db.engine import Database

MIGRATIONS_DIR = os.path.join(os.path.dirname(__file__), "migrations")


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS_DIR)
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(db: Database) -> str | None:
    with db.engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(db: Database, revision: str = "head") -> None:
    """Bring the schema to ``revision``; a no-op when it is already there.

    All steps run in one transaction. On SQLite it runs with foreign keys off: alembic's
    batch mode rebuilds a table (copy, DROP TABLE, rename), and with them on the DROP
    cascades (``ON DELETE CASCADE``/``SET NULL``) through every row that refers to the
    table; PostgreSQL and MariaDB alter in place. Before the commit every foreign key is
    checked (:func:`check_foreign_keys`): a violation rolls the whole upgrade back."""
    current = current_revision(db)
    if revision == "head" and current == head_revision():
        return
    _refuse_upstream(current)
    cfg = alembic_config()
    with db.write(foreign_keys=False) if db.is_sqlite else db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        if db.is_sqlite:
            check_foreign_keys(conn)


class UpstreamCyborgDatabase(RuntimeError):
    """The database is upstream Cyborg's (its alembic revision): acceld never migrates it."""


def _refuse_upstream(current: str | None) -> None:
    from acceld.db import cyborg_import

    if current in cyborg_import.SUPPORTED or current in cyborg_import.OLDER:
        raise UpstreamCyborgDatabase(
            f"this is upstream Cyborg's database (schema revision {current}), not acceld's: "
            "acceld keeps its own; point [database] connection at a new, empty database and "
            "carry this one over with `acceld db import-cyborg --from <this URL>`")


class ForeignKeyViolation(RuntimeError):
    """The upgrade left rows whose foreign key points at no row: it was rolled back."""


def check_foreign_keys(conn: Connection) -> None:
    """Raise :class:`ForeignKeyViolation` if any row's foreign key points at no row
    (SQLite's ``PRAGMA foreign_key_check``, which also works with enforcement off)."""
    rows = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
    if not rows:
        return
    by_table: dict[tuple[str, str], int] = {}
    for table, _rowid, parent, _fkid in rows:
        by_table[(table, parent)] = by_table.get((table, parent), 0) + 1
    found = ", ".join(f"{table}: {count} row(s) referring to missing {parent} rows"
                      for (table, parent), count in sorted(by_table.items()))
    raise ForeignKeyViolation(
        f"The schema upgrade was rolled back (nothing changed): afterwards {found}. "
        "Either the database had such rows before (`PRAGMA foreign_key_check` on a copy "
        "lists them) or a migration broke them; report it with that list.")


class SchemaNotCurrent(RuntimeError):
    """The database is not at this code's schema: services refuse to start on it."""


def check_current(db: Database) -> None:
    """Raise :class:`SchemaNotCurrent` naming both revisions unless the schema is at head
    (the API and the conductor refuse an old schema, which they would misread)."""
    current, head = current_revision(db), head_revision()
    if current != head:
        raise SchemaNotCurrent(
            f"The database schema is at revision {current or '(none: empty database)'}, "
            f"not {head}: run `acceld db upgrade`.")
