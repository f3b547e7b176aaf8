"""Schema migrations: ``acceld db upgrade`` and the all-in-one's start-up both call upgrade()."""

from __future__ import annotations

import os

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

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
    """Bring the schema to ``revision``; a no-op when it is already there."""
    if revision == "head" and current_revision(db) == head_revision():
        return
    cfg = alembic_config()
    with db.write() if db.is_sqlite else db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


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
