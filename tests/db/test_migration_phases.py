"""Expand and contract (docs/upgrades.md): every migration says its phase, the applied
phases are recorded in the database, ``--expand`` stops before a contract migration,
``--contract`` applies the rest, and a service of this release runs on a schema a later
release only expanded but not on one it contracted. The later release is this one's
migrations plus a few written by tests.support.releases, on SQLite, PostgreSQL and
MariaDB."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterator

import pytest
from sqlalchemy import inspect, select, text

from acceld.cmd import db as db_version
from acceld.db import migrate
from acceld.db.engine import Database
from acceld.db.models import schema_migrations
from tests.conftest import BACKENDS
from tests.support.databases import create_server_database, drop_server_database
from tests.support.releases import (CONTRACT_DROP, EXPAND_INDEX, EXPAND_WIDGETS,
                                    later_release, write_release)


@pytest.fixture(params=BACKENDS)
def empty_db(request, tmp_path) -> Iterator[Database]:  # type: ignore[no-untyped-def]
    """An empty database of its own on each backend."""
    if request.param == "sqlite":
        db = Database(f"sqlite:///{tmp_path / 'phases.sqlite'}")
        yield db
        db.dispose()
        return
    url = create_server_database(request.param, migrated=False)
    db = Database(url)
    try:
        yield db
    finally:
        db.dispose()
        drop_server_database(request.param, url)


def _recorded(db: Database) -> dict[str, str]:
    with db.read() as conn:
        return {r.revision: r.phase for r in conn.execute(select(schema_migrations))}


def test_every_migration_of_this_release_is_an_expand() -> None:
    # Nothing so far has dropped or changed what an earlier release uses.
    found = migrate.migrations()
    assert found[0].revision == "0001" and found[-1].revision == migrate.head_revision()
    assert {m.phase for m in found} == {migrate.EXPAND}


def test_the_phases_applied_are_recorded(empty_db: Database) -> None:
    migrate.upgrade(empty_db, "0011_node_key_generations")
    assert "schema_migrations" not in inspect(empty_db.engine).get_table_names()
    assert [m.revision for m in migrate.upgrade(empty_db)] == [
        m.revision for m in migrate.migrations()][11:]
    assert _recorded(empty_db) == {m.revision: m.phase for m in migrate.migrations()}


def test_expand_then_contract(empty_db: Database, tmp_path) -> None:
    migrate.upgrade(empty_db)  # this release, then a later one's expand and contract
    with later_release(write_release(tmp_path, [EXPAND_WIDGETS, CONTRACT_DROP])):
        text_, status = db_version.report(empty_db)
        assert status == db_version.UPGRADE_NEEDED
        assert "expand:   9001_expand (" in text_ and "contract: 9002_contract (" in text_
        applied = migrate.upgrade(empty_db, phase=migrate.EXPAND)
        assert applied == [migrate.Migration("9001_expand", migrate.EXPAND)]
        assert migrate.current_revision(empty_db) == "9001_expand"
        columns = {c["name"] for c in inspect(empty_db.engine).get_columns("agents")}
        assert "widget_note" in columns
        assert migrate.upgrade(empty_db, phase=migrate.EXPAND) == []  # nothing more to expand
        text_, status = db_version.report(empty_db)
        assert status == db_version.EXPANDED
        assert text_.splitlines()[2] == (
            "expanded: contract migration(s) left: 9002_contract: run `acceld db upgrade "
            "--contract` once every service runs this release")
        assert migrate.upgrade(empty_db, phase=migrate.CONTRACT) == [
            migrate.Migration("9002_contract", migrate.CONTRACT)]
        assert migrate.current_revision(empty_db) == "9002_contract"
        columns = {c["name"] for c in inspect(empty_db.engine).get_columns("agents")}
        assert "widget_note" not in columns
        assert _recorded(empty_db)["9002_contract"] == migrate.CONTRACT
        assert db_version.report(empty_db)[1] == db_version.AT_HEAD


def test_expand_stops_at_an_earlier_contract_left_undone(sqlite_db: Database,
                                                         tmp_path) -> None:
    with later_release(write_release(tmp_path, [EXPAND_WIDGETS, CONTRACT_DROP,
                                                EXPAND_INDEX])):
        with pytest.raises(migrate.ContractPending,
                           match=r"before contract migration 9002_contract \(1 expand "
                                 r"migration\(s\) applied\): expand migration\(s\) "
                                 r"9003_expand come after it"):
            migrate.upgrade(sqlite_db, phase=migrate.EXPAND)
        assert migrate.current_revision(sqlite_db) == "9001_expand"
        migrate.upgrade(sqlite_db)  # both phases: everything
        assert migrate.current_revision(sqlite_db) == "9003_expand"


def test_this_release_runs_on_a_schema_a_later_one_expanded(empty_db: Database,
                                                            tmp_path) -> None:
    migrate.upgrade(empty_db)
    with later_release(write_release(tmp_path, [EXPAND_WIDGETS, CONTRACT_DROP])):
        migrate.upgrade(empty_db, phase=migrate.EXPAND)
    # This release's code again: the schema is ahead of it by an expand migration.
    newer = migrate.check_current(empty_db)
    assert newer == [migrate.Migration("9001_expand", migrate.EXPAND)]
    assert "ahead of this release" in migrate.ahead_warning(newer)
    text_, status = db_version.report(empty_db)
    assert status == db_version.UNKNOWN_REVISION
    assert "only expanded the schema (9001_expand)" in text_
    with later_release(write_release(tmp_path / "b", [EXPAND_WIDGETS, CONTRACT_DROP])):
        migrate.upgrade(empty_db, phase=migrate.CONTRACT)
    with pytest.raises(migrate.SchemaNotCurrent,
                       match=r"contracted by a newer release \(contract migration\(s\) "
                             r"9002_contract\): this release cannot run on it"):
        migrate.check_current(empty_db)
    assert "which contracted the schema (9002_contract)" in db_version.report(empty_db)[0]


def test_a_revision_nothing_records_is_refused(sqlite_db: Database) -> None:
    with sqlite_db.write() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0999_newer'"))
    with pytest.raises(migrate.SchemaNotCurrent, match="nothing records it"):
        migrate.check_current(sqlite_db)


def test_a_schema_behind_is_refused(sqlite_db: Database, tmp_path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'old.sqlite'}")
    migrate.upgrade(db, "0009_conductor_heard_through")
    with pytest.raises(migrate.SchemaNotCurrent, match="run `acceld db upgrade`"):
        migrate.check_current(db)
    db.dispose()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "acceld.cmd.main", *args], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ))


def test_the_upgrade_command_by_phase(tmp_path) -> None:
    state = str(tmp_path)
    db = Database(f"sqlite:///{tmp_path / 'acceld.sqlite'}")
    migrate.upgrade(db, "0010_fencing_tokens")
    done = _cli("db", "upgrade", "--expand", "--state-path", state)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "applied 6 migration(s): 0011_node_key_generations (expand), "
        "0012_standalone_claims (expand), 0013_schema_migrations (expand), "
        "0014_placement_ownership (expand), 0015_project_locks (expand), "
        "0016_deployable_fence_told (expand)",
        f"database at revision {migrate.head_revision()}"]
    again = _cli("db", "upgrade", "--contract", "--state-path", state)
    assert again.returncode == 0 and again.stdout.splitlines() == [
        f"database at revision {migrate.head_revision()}"]
    both = _cli("db", "upgrade", "--expand", "--contract", "--state-path", state)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    db.dispose()


def test_the_services_start_on_an_expanded_schema_and_not_on_a_contracted_one(
        tmp_path, caplog) -> None:
    # This release's API gate and conductor as the previous release of a later one.
    import logging

    from acceld.conductor import service
    from acceld.services.schema_gate import check_schema
    from tests.conftest import make_conf

    db = Database(f"sqlite:///{tmp_path / 'acceld.sqlite'}")
    conf = make_conf(str(tmp_path))
    later = write_release(tmp_path, [EXPAND_WIDGETS, CONTRACT_DROP])
    with later_release(later):
        migrate.upgrade(db, phase=migrate.EXPAND)
    with caplog.at_level(logging.WARNING):
        check_schema(conf)  # the API starts, saying why
    assert any("ahead of this release" in r.getMessage() and "9001_expand" in r.getMessage()
               for r in caplog.records)
    with later_release(later):
        migrate.upgrade(db, phase=migrate.CONTRACT)
    with pytest.raises(migrate.SchemaNotCurrent, match="contracted by a newer release"):
        check_schema(conf)
    with pytest.raises(SystemExit, match="acceld conductor: .*contracted by a newer release"):
        service.run(conf)
    db.dispose()


def test_upgrading_a_newer_release_s_database_is_one_line(tmp_path) -> None:
    state = str(tmp_path)
    db = Database(f"sqlite:///{tmp_path / 'acceld.sqlite'}")
    migrate.upgrade(db)
    with db.write() as conn:  # as a newer release would leave it
        conn.execute(text("UPDATE alembic_version SET version_num = '0999_newer'"))
    for args in ([], ["--expand"], ["--contract"]):
        done = _cli("db", "upgrade", *args, "--state-path", state)
        assert done.returncode == 4, done.stderr
        assert done.stderr.strip().splitlines() == [
            "acceld db upgrade: The database schema is at revision 0999_newer, which this "
            "release does not have: a newer release upgraded it (`acceld db version` says "
            "whether it only expanded the schema); run that release's `acceld db upgrade`."]
    db.dispose()
