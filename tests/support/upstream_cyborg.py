"""Upstream Cyborg 17's own database, made by its own tools, for the import tests.

Upstream lives in ``.upstream/venv`` (the bench's virtualenv: ``make upstream`` or ``make
test`` builds it, about 30 s and 220 MB once). Its schema is made the way an operator's was:
``cyborg-dbsync upgrade`` on MariaDB, ``create_schema`` on SQLite (upgrade fails there on
an ALTER COLUMN). Upstream 17 cannot make its schema on PostgreSQL at all: its ARQ ``state``
ENUM has no name, and both commands stop with "PostgreSQL ENUM type requires a name".
Rows are written by upstream's database API (tests/support/upstream_fill.py).
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.databases import create_server_database, drop_server_database

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".upstream" / "venv"
PYTHON = VENV / "bin" / "python"
DBSYNC = VENV / "bin" / "cyborg-dbsync"
FILL = Path(__file__).with_name("upstream_fill.py")


def require(backend: str = "sqlite") -> None:
    """Skip, saying why, when upstream Cyborg cannot make a database on ``backend`` here."""
    if not DBSYNC.exists():
        pytest.skip("upstream Cyborg 17 is not installed in .upstream/venv: `make upstream` "
                    "installs it (about 30 s and 220 MB, once)")
    if backend == "postgresql":
        pytest.skip("upstream Cyborg 17 cannot create its schema on PostgreSQL (its ARQ state "
                    "ENUM has no name); its databases are MariaDB/MySQL or SQLite")
    if backend == "mysql":
        probe = subprocess.run([str(PYTHON), "-c", "import pymysql"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip("pymysql is not installed in .upstream/venv: `make upstream` adds it")


def _dbsync(url: str, command: str, workdir: Path) -> None:
    conf = workdir / "cyborg-dbsync.conf"
    conf.write_text(f"[database]\nconnection = {url}\n")
    done = subprocess.run([str(DBSYNC), "--config-file", str(conf), command],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]


@contextlib.contextmanager
def database(backend: str, workdir: Path) -> Iterator[str]:
    """An upstream Cyborg 17 database (schema only) on ``backend``; its URL."""
    require(backend)
    if backend == "sqlite":
        url = f"sqlite:///{workdir / 'cyborg.sqlite'}"
        _dbsync(url, "create_schema", workdir)
        yield url
        return
    url = create_server_database(backend, migrated=False)
    try:
        _dbsync(url, "upgrade", workdir)
        yield url
    finally:
        drop_server_database(backend, url)


def fill(url: str) -> None:
    """The rows of a running cloud (tests/support/upstream_fill.py), by upstream's code."""
    done = subprocess.run([str(PYTHON), str(FILL), url], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
