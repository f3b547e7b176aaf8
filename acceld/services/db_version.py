"""`acceld db version`: the database's schema revision against this code's, for an
operator (or a script) deciding whether `acceld db upgrade` is due."""

from __future__ import annotations

import argparse
import sys

from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError

from acceld.db import migrate
from acceld.db.engine import Database

# Exit statuses (2 is argparse's and a one-line error's: no driver, no database).
AT_HEAD, UPGRADE_NEEDED, UNKNOWN_REVISION = 0, 3, 4
NO_DATABASE = 2


def report(db: Database) -> tuple[str, int]:
    """The lines to print and the exit status: at head, behind (with the revisions an
    upgrade would apply, oldest first) or at a revision this code does not know (a newer
    release's database, or not acceld's)."""
    current, head = migrate.current_revision(db), migrate.head_revision()
    lines = [f"current: {current or '(none: empty database)'}", f"head:    {head}"]
    if current == head:
        return "\n".join(lines + ["the schema is up to date"]) + "\n", AT_HEAD
    scripts = ScriptDirectory.from_config(migrate.alembic_config())
    try:
        pending = [rev.revision for rev in scripts.iterate_revisions(head, current)]
    except RevisionError:
        lines.append(f"revision {current} is not one of this release's migrations: the "
                     "database was upgraded by a newer acceld (run that release), or it is "
                     "not acceld's database")
        return "\n".join(lines) + "\n", UNKNOWN_REVISION
    pending.reverse()
    lines.append(f"upgrade needed: run `acceld db upgrade` ({len(pending)} migration(s): "
                 f"{', '.join(pending)})")
    return "\n".join(lines) + "\n", UPGRADE_NEEDED


def cmd_db_version(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import DBAPIError

    from acceld.cli import _load
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
