"""Alembic environment: runs migrations on the connection acceld hands it."""

import datetime as dt
from typing import Any

import sqlalchemy as sa
from alembic import context

from acceld.db.models import Base

config = context.config
target_metadata = Base.metadata


def record_phase(ctx: Any, step: Any, heads: Any, run_args: Any) -> None:
    """Write each applied migration and its phase to ``schema_migrations`` (from 0013,
    which creates it and writes the earlier ones), in the migration's transaction; a
    downgrade deletes the row. A service of an older release reads these rows."""
    conn = ctx.connection
    if not sa.inspect(conn).has_table("schema_migrations"):
        return
    table = sa.table("schema_migrations", sa.column("revision"), sa.column("phase"),
                     sa.column("applied_at"))
    if step.is_upgrade:
        revision = step.up_revision_id
        phase = getattr(step.up_revision.module, "phase", None)
        if phase not in ("expand", "contract"):
            raise RuntimeError(f"Migration {revision} says neither phase = 'expand' nor "
                               "phase = 'contract'")
        conn.execute(table.delete().where(table.c.revision == revision))
        conn.execute(table.insert().values(
            revision=revision, phase=phase,
            applied_at=dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)))
    else:
        conn.execute(table.delete().where(table.c.revision == step.up_revision_id))


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        raise RuntimeError("acceld runs migrations through acceld.db.migrate, with a connection")
    if connection.dialect.name == "sqlite" and connection.exec_driver_sql(
            "PRAGMA foreign_keys").scalar():
        # A batch rebuild's DROP TABLE would cascade through every row referring to the
        # table (migration 0005 did): acceld.db.migrate.upgrade turns them off first.
        raise RuntimeError("SQLite migrations must run with foreign keys off "
                           "(acceld.db.migrate.upgrade does so)")
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite",
                      on_version_apply=record_phase)
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
