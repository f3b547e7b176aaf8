"""`acceld db version`: the current and head revisions, whether an upgrade is needed, and
the exit status a script reads (0 up to date, 3 upgrade needed, 4 unknown revision)."""

from __future__ import annotations

import os
import subprocess
import sys

from sqlalchemy import text

from acceld.cmd import db as db_version
from acceld.db import migrate
from acceld.db.engine import Database


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "acceld.cmd.main", *args], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ))


def test_at_head_on_every_backend(db):
    """The ``db`` fixture's database is at head on SQLite, PostgreSQL and MariaDB."""
    out, status = db_version.report(db)
    head = migrate.head_revision()
    assert (out, status) == (f"current: {head}\nhead:    {head}\nthe schema is up to date\n",
                             db_version.AT_HEAD)


def test_the_command_before_between_and_after_upgrades(tmp_path):
    state = str(tmp_path)
    head = migrate.head_revision()
    empty = run_cli("db", "version", "--state-path", state)
    assert empty.returncode == 3, empty.stderr
    lines = empty.stdout.splitlines()
    assert lines[:2] == ["current: (none: empty database)", f"head:    {head}"]
    assert lines[2].startswith("upgrade needed: run `acceld db upgrade` (")
    assert lines[2].endswith(f", {head})") and "0001, 0002_internal_nonces" in lines[2]

    db = Database(f"sqlite:///{tmp_path / 'acceld.sqlite'}")
    migrate.upgrade(db, "0009_conductor_heard_through")
    behind = run_cli("db", "version", "--state-path", state)
    assert behind.returncode == 3
    pending = [rev.revision for rev in reversed(list(
        migrate.scripts().iterate_revisions(head, "0009_conductor_heard_through")))]
    assert behind.stdout.splitlines() == [
        "current: 0009_conductor_heard_through", f"head:    {head}",
        f"upgrade needed: run `acceld db upgrade` ({len(pending)} migration(s): "
        f"{', '.join(pending)})",
        f"expand:   {', '.join(pending)} (`acceld db upgrade --expand`: safe while the "
        "previous release runs)",
        "contract: none (`acceld db upgrade --contract`: once every service runs this "
        "release)"]
    assert pending[0] == "0010_fencing_tokens" and pending[-1] == head

    assert run_cli("db", "upgrade", "--state-path", state).returncode == 0
    current = run_cli("db", "version", "--state-path", state)
    assert current.returncode == 0
    assert current.stdout == f"current: {head}\nhead:    {head}\nthe schema is up to date\n"

    with db.write() as conn:  # as a newer release would leave it
        conn.execute(text("UPDATE alembic_version SET version_num = '0999_newer'"))
    newer = run_cli("db", "version", "--state-path", state)
    assert newer.returncode == 4
    assert newer.stdout.splitlines()[2].startswith(
        "revision 0999_newer is not one of this release's migrations: the database was "
        "upgraded by a newer acceld")
    db.dispose()


def test_an_unreachable_database_is_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "acceld.cmd.main", "db", "version"], capture_output=True, text=True,
        timeout=60, env={**os.environ,
                         "OS_DATABASE__CONNECTION": "postgresql+psycopg://a@127.0.0.1:1/a"})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("acceld db version: cannot reach the database: ")
    assert len(done.stderr.strip().splitlines()) == 1
