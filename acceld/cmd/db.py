"""`acceld db version`: the database's schema revision against this code's, for an
operator (or a script) deciding whether `acceld db upgrade` is due."""

from __future__ import annotations

import argparse
import sys

from acceld.db import migrate
from acceld.db.engine import Database

# Exit statuses (2 is argparse's and a one-line error's: no driver, no database).
AT_HEAD, UPGRADE_NEEDED, UNKNOWN_REVISION, EXPANDED = 0, 3, 4, 5
NO_DATABASE = 2


def _names(migrations: list[migrate.Migration]) -> str:
    return ", ".join(m.revision for m in migrations) or "none"


def report(db: Database) -> tuple[str, int]:
    """The lines to print and the exit status: at head; behind, with what each phase
    would apply, oldest first (UPGRADE_NEEDED while an expand migration is pending,
    EXPANDED once only contract migrations are); or at a revision this release does not
    have (a newer release's: whether it only expanded, which this release runs on)."""
    current, head = migrate.current_revision(db), migrate.head_revision()
    lines = [f"current: {current or '(none: empty database)'}", f"head:    {head}"]
    if current == head:
        return "\n".join(lines + ["the schema is up to date"]) + "\n", AT_HEAD
    try:
        todo = migrate.pending(db)
    except migrate.UnknownRevision:
        return "\n".join(lines + [_ahead(db, current)]) + "\n", UNKNOWN_REVISION
    plan = migrate.expand_plan(todo)
    contracts = [m for m in todo if m.phase == migrate.CONTRACT]
    if not plan.apply:
        lines.append(f"expanded: contract migration(s) left: {_names(contracts)}: run "
                     "`acceld db upgrade --contract` once every service runs this release")
        status = EXPANDED
    else:
        lines.append(f"upgrade needed: run `acceld db upgrade` ({len(todo)} migration(s): "
                     f"{_names(todo)})")
        status = UPGRADE_NEEDED
    lines.append(f"expand:   {_names([m for m in todo if m.phase == migrate.EXPAND])} "
                 "(`acceld db upgrade --expand`: safe while the previous release runs)")
    lines.append(f"contract: {_names(contracts)} (`acceld db upgrade --contract`: once "
                 "every service runs this release)")
    return "\n".join(lines) + "\n", status


def _ahead(db: Database, current: str | None) -> str:
    _, newer = migrate.newer_migrations(db)
    if not newer:
        return (f"revision {current} is not one of this release's migrations: the "
                "database was upgraded by a newer acceld (run that release), or it is "
                "not acceld's database")
    contracted = [m for m in newer if m.phase != migrate.EXPAND]
    if contracted:
        return (f"revision {current} is a newer release's, which contracted the schema "
                f"({_names(contracted)}): this release's services do not run on it")
    return (f"revision {current} is a newer release's, which only expanded the schema "
            f"({_names(newer)}): this release's services run on it during the upgrade; "
            "upgrade them, then run that release's `acceld db upgrade --contract`")


def cmd_db_version(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import DBAPIError

    from acceld.cmd.main import _load
    from acceld.db.engine import from_config

    db = from_config(_load(args))
    try:
        text, status = report(db)
    except DBAPIError as exc:  # one line, as `acceld status`
        first = (str(exc.orig or exc).strip().splitlines() or ["unreachable"])[0]
        print(f"acceld db version: cannot reach the database: {first}", file=sys.stderr)
        return NO_DATABASE
    finally:
        db.dispose()
    sys.stdout.write(text)
    return status
