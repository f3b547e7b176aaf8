"""``acceld api``'s master checks the schema in a forked child (schema_gate.
check_schema_in_child): alembic stays out of the master, so out of every worker it forks,
and the check's outcome is the parent's as if it had run there."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy import text

from acceld.db import migrate
from acceld.db.engine import Database
from acceld.services.schema_gate import check_schema_in_child
from tests.conftest import make_conf
from tests.support.net import free_port

PARENT = """
import sys
from acceld.db import migrate
from acceld.db.engine import Database
from acceld.services.schema_gate import check_schema_in_child
from tests.conftest import make_conf

conf = make_conf(sys.argv[1])
before = "alembic" in sys.modules
check_schema_in_child(conf)
print(before, "alembic" in sys.modules, "mako" in sys.modules)
"""


def test_the_parent_never_imports_alembic(tmp_path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'acceld.sqlite'}")
    migrate.upgrade(db)
    db.dispose()
    done = subprocess.run([sys.executable, "-c", PARENT, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "False"]


def test_a_schema_behind_is_refused_in_the_parent(tmp_path) -> None:
    Database(f"sqlite:///{tmp_path / 'acceld.sqlite'}").dispose()  # empty: no migration
    with pytest.raises(migrate.SchemaNotCurrent, match="run `acceld db upgrade`") as raised:
        check_schema_in_child(make_conf(str(tmp_path)))
    assert any("In the schema check's process" in note for note in raised.value.__notes__)


def test_an_unknown_revision_is_refused_and_an_unreachable_database_only_warned(
        tmp_path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'acceld.sqlite'}")
    migrate.upgrade(db)
    with db.write() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0999_newer'"))
    db.dispose()
    with pytest.raises(migrate.SchemaNotCurrent, match="0999_newer"):
        check_schema_in_child(make_conf(str(tmp_path)))
    nobody = free_port()  # a PostgreSQL that is not there: connection refused
    conf = make_conf(str(tmp_path), database__connection=(
        f"postgresql+psycopg://postgres@127.0.0.1:{nobody}/acceld?connect_timeout=5"))
    check_schema_in_child(conf)  # warned (in the child's log); the API answers 503 meanwhile
