"""`acceld db`: `upgrade` (the schema, both phases or one), `import-cyborg` (a stopped
upstream Cyborg's database into acceld's), `cyborg-changes` (after an import, the ARQs
acceld holds differently from upstream's database, for the way back) and `version` (the database's schema revision
against this code's, for an operator or a script deciding whether `acceld db upgrade`
is due)."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from acceld import config, logs
from acceld.cmd.common import load
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

    from acceld.db.engine import from_config

    db = from_config(load(args))
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


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from acceld.db.engine import from_config

    conf = load(args)
    logs.setup(conf, "db")
    db = from_config(conf)
    phase = migrate.EXPAND if args.expand else migrate.CONTRACT if args.contract else None
    try:
        applied = migrate.upgrade(db, phase=phase)
    except migrate.ContractPending as exc:
        print(f"acceld db upgrade: {exc}", file=sys.stderr)
        print(f"database at revision {migrate.current_revision(db)}")
        return 3
    except migrate.UnknownRevision as exc:
        print(f"acceld db upgrade: {exc}", file=sys.stderr)
        return 4
    if applied:
        print(f"applied {len(applied)} migration(s): "
              + ", ".join(f"{m.revision} ({m.phase})" for m in applied))
    print(f"database at revision {migrate.current_revision(db)}")
    if phase == migrate.EXPAND:
        left = migrate.pending(db)
        if left:
            print(f"contract migration(s) left: {', '.join(m.revision for m in left)}: run "
                  "`acceld db upgrade --contract` once every service runs this release")
    return 0


def cmd_db_import_cyborg(args: argparse.Namespace) -> int:
    import os

    from sqlalchemy.engine import make_url

    from acceld.db import cyborg_import
    from acceld.db.engine import from_config

    conf = load(args)
    logs.setup(conf, "db")
    url = make_url(config.database_url(conf))
    absent = url.get_backend_name() == "sqlite" and not os.path.exists(url.database or "")
    # A dry run creates nothing, not even the SQLite file's directory.
    db = None if args.dry_run and absent else from_config(conf)
    try:
        lines = cyborg_import.run(args.source, db, dry_run=args.dry_run)
    except cyborg_import.ImportRefused as exc:
        print(f"acceld db import-cyborg: {exc}", file=sys.stderr)
        return 1
    finally:
        if db is not None:
            db.dispose()
    print("\n".join(lines))
    return 0


def cmd_db_cyborg_changes(args: argparse.Namespace) -> int:
    from acceld.db import cyborg_changes, cyborg_import
    from acceld.db.engine import from_config

    conf = load(args)
    logs.setup(conf, "db")
    db = from_config(conf)
    try:
        found = cyborg_changes.changes(args.source, db)
    except cyborg_import.ImportRefused as exc:
        print(f"acceld db cyborg-changes: {exc}", file=sys.stderr)
        return 1
    finally:
        db.dispose()
    print("\n".join(cyborg_changes.report(found)))
    return 0


def register(sub: argparse._SubParsersAction,
             common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("db", help="Database administration.")
    dbsub = p.add_subparsers(dest="db_command", required=True)
    q = dbsub.add_parser("upgrade", help="Migrate the schema to the latest version (idempotent): "
                                         "expand and contract migrations both, or one phase "
                                         "(docs/upgrades.md).")
    common(q)
    phase = q.add_mutually_exclusive_group()
    phase.add_argument("--expand", action="store_true",
                       help="Apply only the expand migrations (they only add; safe while "
                            "services of the previous release run), up to the first contract "
                            "migration.")
    phase.add_argument("--contract", action="store_true",
                       help="Apply every migration left (contract ones drop or change what "
                            "the previous release used): once every service is upgraded.")
    q.set_defaults(func=cmd_db_upgrade)
    q = dbsub.add_parser("import-cyborg", help="Import a stopped upstream Cyborg 17's database "
                                               "into acceld's [database] (empty), keeping every "
                                               "uuid; upstream's is only read.")
    common(q)
    q.add_argument("--from", dest="source", required=True, metavar="URL",
                   help="SQLAlchemy URL of upstream's database (its [database] connection).")
    q.add_argument("--dry-run", action="store_true",
                   help="Print what would be imported and what cannot be carried over; "
                        "change nothing.")
    q.set_defaults(func=cmd_db_import_cyborg)
    q = dbsub.add_parser("cyborg-changes", help="After an import, list by instance the ARQs "
                                                "acceld holds differently from upstream's "
                                                "database (before going back to upstream); "
                                                "upstream's is only read.")
    common(q)
    q.add_argument("--from", dest="source", required=True, metavar="URL",
                   help="SQLAlchemy URL of upstream's database (the one imported).")
    q.set_defaults(func=cmd_db_cyborg_changes)
    q = dbsub.add_parser("version", help="Print the database's schema revision and this "
                                         "release's (head); exit status 0: up to date, 3: "
                                         "`acceld db upgrade` needed, 4: a revision this "
                                         "release does not know (a newer release's), "
                                         "5: expanded, contract migrations left.")
    common(q)
    q.set_defaults(func=cmd_db_version)
