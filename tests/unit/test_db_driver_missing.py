"""A database driver that is not installed (the acceld[postgresql] / acceld[mysql] extra
left out): one line naming the extra to install, in every command that opens the database,
rather than a ModuleNotFoundError traceback. The import is made to fail (None in
sys.modules), nothing is uninstalled."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from acceld.db.engine import Database, MissingDatabaseDriver
from tests.support.net import free_port

URLS = {"psycopg": ("postgresql+psycopg://acceld@127.0.0.1:1/acceld", "postgresql"),
        "pymysql": ("mysql+pymysql://acceld@127.0.0.1:1/acceld", "mysql")}


@pytest.mark.parametrize("module", sorted(URLS))
def test_engine_names_the_extra(monkeypatch, module):
    url, extra = URLS[module]
    monkeypatch.setitem(sys.modules, module, None)  # `import psycopg` fails as if absent
    with pytest.raises(MissingDatabaseDriver) as raised:
        Database(url)
    assert str(raised.value) == (
        f"the database driver for {url.split('://')[0]}:// is not installed (no module "
        f"{module}): install it with pip install 'acceld[{extra}]' (in acceld's virtualenv)")


def test_a_driver_no_extra_installs_names_the_ones_that_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    with pytest.raises(MissingDatabaseDriver) as raised:
        Database("postgresql+psycopg2://acceld@127.0.0.1:1/acceld")
    assert "(no module psycopg2)" in str(raised.value)
    assert "postgresql+psycopg:// (pip install 'acceld[postgresql]')" in str(raised.value)


def test_psycopg_without_libpq_says_so(monkeypatch):
    """psycopg installed but the system's libpq missing: psycopg's own ImportError, with
    the package that provides libpq."""
    import sqlalchemy.dialects.postgresql.psycopg as dialect

    def no_libpq(cls):  # type: ignore[no-untyped-def]
        raise ImportError("no pq wrapper available.\nAttempts made: ...")

    monkeypatch.setattr(dialect.PGDialect_psycopg, "import_dbapi", classmethod(no_libpq))
    with pytest.raises(MissingDatabaseDriver) as raised:
        Database(URLS["psycopg"][0])
    assert str(raised.value) == (
        "the database driver for postgresql+psycopg:// cannot be loaded: no pq wrapper "
        "available. (psycopg needs the system's libpq: apt-get install libpq5)")


def _commands(tmp_path) -> list[list[str]]:
    base = free_port()  # the all-in-one checks its ports before it opens the database
    while any(not _free(base + n) for n in (1, 2)):
        base = free_port()
    state = ["--state-path", str(tmp_path)]
    return [["db", "upgrade", *state], ["db", "version", *state], ["status", *state],
            ["host", "delete", "cn-1", *state], ["api", "--port", str(free_port()), *state],
            ["conductor", "--port", str(free_port()), *state],
            ["all", "--port", str(base), *state]]


def _free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.mark.parametrize("module", sorted(URLS))
def test_every_command_that_opens_the_database_says_it_in_one_line(tmp_path, module):
    url, extra = URLS[module]
    # The real command line, in a process whose import of the driver fails.
    program = (f"import sys; sys.modules[{module!r}] = None; from acceld.cmd.main import main; "
               "sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "OS_DATABASE__CONNECTION": url,
           "OS_INTERNAL__SHARED_SECRET": "0" * 64}
    for args in _commands(tmp_path):
        done = subprocess.run([sys.executable, "-c", program, *args], capture_output=True,
                              text=True, timeout=60, env=env)
        assert done.returncode == 2, (args, done.stderr)
        lines = [line for line in done.stderr.splitlines() if "WARNING" not in line]
        assert len(lines) == 1, (args, done.stderr)
        assert lines[0].startswith(f"acceld {args[0]}: the database driver for "), lines[0]
        assert f"pip install 'acceld[{extra}]'" in lines[0]
        assert "Traceback" not in done.stderr
