"""Schema migrations: ``acceld db upgrade`` and the all-in-one's start-up both call upgrade().

Each migration says its phase (``phase = 'expand'`` or ``'contract'`` in its module):
expand migrations only add, so the previous release keeps running on their schema;
contract migrations drop or change what it uses, and run once every service is upgraded
(``acceld db upgrade --expand`` / ``--contract``; docs/upgrades.md). The phases applied are
recorded in ``schema_migrations``, which is how a service of the previous release, without
the newer migrations' files, tells an expanded schema from a contracted one
(:func:`check_current`).

alembic (~10 MB of modules) is imported by the functions that use it, not by this module:
the API's processes import the exceptions below and never migrate (its master checks the
schema in a child process, acceld.services.schema_gate)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy import Connection

from acceld.db import cyborg_revisions
from acceld.db.engine import Database

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

MIGRATIONS_DIR = os.path.join(os.path.dirname(__file__), "migrations")


def alembic_config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS_DIR)
    return cfg


def head_revision() -> str:
    head = scripts().get_current_head()
    assert head is not None
    return head


def current_revision(db: Database) -> str | None:
    with db.engine.connect() as conn:
        return _revision(conn)


def _revision(conn: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


EXPAND, CONTRACT = "expand", "contract"


@dataclass(frozen=True)
class Migration:
    revision: str
    phase: str  # EXPAND or CONTRACT


def scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def _phase(script: object) -> str:
    phase = getattr(getattr(script, "module", None), "phase", None)
    if phase not in (EXPAND, CONTRACT):
        raise RuntimeError(f"Migration {getattr(script, 'revision', script)} says neither "
                           "phase = 'expand' nor phase = 'contract'")
    return phase


def migrations() -> list[Migration]:
    """This release's migrations, oldest first."""
    found = [Migration(s.revision, _phase(s)) for s in scripts().walk_revisions()]
    return found[::-1]


class UnknownRevision(RuntimeError):
    """The database is at a revision this release's migrations do not contain."""

    def __str__(self) -> str:
        return (f"The database schema is at revision {self.args[0]}, which this release "
                "does not have: a newer release upgraded it (`acceld db version` says "
                "whether it only expanded the schema); run that release's `acceld db "
                "upgrade`.")


def pending(db: Database) -> list[Migration]:
    """The migrations an upgrade to head would apply, oldest first (UnknownRevision when
    the database's revision is not one of this release's)."""
    current = current_revision(db)
    known = migrations()
    if current is None:
        return known
    revisions = [m.revision for m in known]
    if current not in revisions:
        raise UnknownRevision(current)
    return known[revisions.index(current) + 1:]


@dataclass(frozen=True)
class ExpandPlan:
    apply: list[Migration]  # the expand migrations before the first pending contract
    blocked: list[Migration]  # expand migrations behind that contract
    contract: Migration | None  # the first pending contract migration


def expand_plan(todo: list[Migration]) -> ExpandPlan:
    """What ``--expand`` applies of ``todo``: every migration up to the first contract."""
    for index, migration in enumerate(todo):
        if migration.phase == CONTRACT:
            return ExpandPlan(todo[:index], [m for m in todo[index:] if m.phase == EXPAND],
                              migration)
    return ExpandPlan(todo, [], None)


class ContractPending(RuntimeError):
    """``--expand`` stopped at a contract migration with expand migrations behind it."""


def upgrade(db: Database, revision: str = "head", phase: str | None = None
            ) -> list[Migration]:
    """Apply migrations and return those applied, oldest first. ``phase`` None: up to
    ``revision`` (both phases). EXPAND: up to the first pending contract migration
    (ContractPending after applying those when expand migrations remain behind it: an
    earlier upgrade's contract was not run). CONTRACT: everything left, to head (run it
    once every service runs this release)."""
    _refuse_upstream(current_revision(db))  # before its revision is judged unknown
    if phase is None:
        todo = pending(db) if revision == "head" else []
        _upgrade(db, revision)
        return todo
    todo = pending(db)
    if phase == CONTRACT:
        _upgrade(db, "head")
        return todo
    if phase != EXPAND:
        raise ValueError(f"phase {phase!r}")
    plan = expand_plan(todo)
    if plan.apply:
        _upgrade(db, plan.apply[-1].revision)
    if plan.blocked:
        assert plan.contract is not None
        raise ContractPending(
            f"Stopped before contract migration {plan.contract.revision} "
            f"({len(plan.apply)} expand migration(s) applied): expand migration(s) "
            f"{', '.join(m.revision for m in plan.blocked)} come after it. Run `acceld db "
            "upgrade --contract` once every service runs the release that brought "
            f"{plan.contract.revision}, then `acceld db upgrade --expand` again.")
    return plan.apply


def _upgrade(db: Database, revision: str = "head") -> None:
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
    from alembic import command

    cfg = alembic_config()
    with db.write(foreign_keys=False) if db.is_sqlite else db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        if db.is_sqlite:
            check_foreign_keys(conn)


class UpstreamCyborgDatabase(RuntimeError):
    """The database is upstream Cyborg's (its alembic revision): acceld never migrates it."""


def _refuse_upstream(current: str | None) -> None:
    if current in cyborg_revisions.SUPPORTED or current in cyborg_revisions.OLDER:
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


def recorded(conn: Connection) -> dict[str, str] | None:
    """``schema_migrations``: revision -> phase, or None before migration 0013."""
    if not sa.inspect(conn).has_table("schema_migrations"):
        return None
    table = sa.table("schema_migrations", sa.column("revision"), sa.column("phase"))
    return {row.revision: row.phase for row in conn.execute(sa.select(table))}


def newer_migrations(db: Database) -> tuple[str | None, list[Migration] | None]:
    """The database's revision and, when it is not one of this release's, the migrations
    applied to it that this release does not have (as recorded, with their phases), or
    None when that cannot be told: no record, or the record does not hold this release's
    head or the current revision (not a later state of this release's schema)."""
    with db.engine.connect() as conn:
        current = _revision(conn)
        known = {m.revision for m in migrations()}
        if current is None or current in known:
            return current, []
        done = recorded(conn)
    if done is None or current not in done or head_revision() not in done:
        return current, None
    return current, [Migration(rev, phase) for rev, phase in sorted(done.items())
                     if rev not in known]


def check_current(db: Database) -> list[Migration]:
    """Return [] at head or behind it only by contract migrations (expanded: the code of
    this release reads both schemas), or the newer release's migrations when the schema is
    ahead of this code only by expand migrations (the rolling-upgrade window: this
    release's services run on it; callers log it). Raise :class:`SchemaNotCurrent` otherwise: a
    schema behind this code (it would misread it), one a newer release contracted (it
    dropped or changed what this code uses), or a revision this code cannot place."""
    current, head = current_revision(db), head_revision()
    if current == head:
        return []
    where = f"The database schema is at revision {current or '(none: empty database)'}"
    current, newer = newer_migrations(db)
    if newer == []:
        todo = pending(db)
        if todo and all(m.phase == CONTRACT for m in todo):
            return []  # expanded: this release's code reads it (acceld db version says so)
        raise SchemaNotCurrent(f"{where}, not {head}: run `acceld db upgrade`"
                               f"{' --expand' if any(m.phase == CONTRACT for m in todo) else ''}.")
    if newer is None:
        raise SchemaNotCurrent(
            f"{where}, not {head}, and not one of this release's migrations; nothing "
            "records it as a newer release's expand migration. Run the release that "
            "upgraded the database, or check that it is acceld's.")
    contracted = [m.revision for m in newer if m.phase != EXPAND]
    if contracted:
        raise SchemaNotCurrent(
            f"{where}, ahead of this release ({head}), and contracted by a newer release "
            f"(contract migration(s) {', '.join(contracted)}): this release cannot run "
            "on it. Upgrade this service to the release that upgraded the database.")
    return newer


def ahead_warning(newer: list[Migration]) -> str:
    """The line a service logs when it starts on a schema a newer release expanded."""
    return (f"The database schema is ahead of this release ({head_revision()}) by "
            f"{len(newer)} expand migration(s) of a newer release "
            f"({', '.join(m.revision for m in newer)}): running on it during a rolling "
            "upgrade (docs/upgrades.md). Upgrade this service before the contract step.")
