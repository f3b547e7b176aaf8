"""Alembic environment: runs migrations on the connection acceld hands it."""

from alembic import context

from acceld.db.models import Base

config = context.config
target_metadata = Base.metadata


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
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
