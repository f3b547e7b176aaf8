"""While the database cannot be reached the API answers 503 with Retry-After, logged once.

Before: every request during an outage was a 500 with a traceback in the log.
The outage is forced at the engine level (new connections refused with the
driver's own error, idle ones dropped) on SQLite, PostgreSQL and MariaDB; and
with a URL whose port has nothing listening, on the server drivers.
"""

from __future__ import annotations

import logging

import pytest
from falcon import testing

from acceld.api.app import build_app
from acceld.db.engine import Database
from tests.helpers import ADMIN, fault
from tests.support.db_outage import outage
from tests.support.net import free_port

LIST = "/accelerator/v2/accelerator_requests"


def _outage_records(caplog) -> list[logging.LogRecord]:  # type: ignore[no-untyped-def]
    return [r for r in caplog.records if "The database is" in r.getMessage()]


def test_unreachable_database_is_503_with_retry_after_logged_once(conf, db, caplog):
    client = testing.TestClient(build_app(conf, db))
    assert client.simulate_get(LIST, headers=ADMIN).status_code == 200
    caplog.set_level(logging.INFO)
    with outage(db) as down:
        down.start()
        for _ in range(3):
            result = client.simulate_get(LIST, headers=ADMIN)
            assert result.status_code == 503
            assert int(result.headers["Retry-After"]) > 0
            assert "database" in fault(result).lower()
        created = client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN,
                                       json=[{"name": "x", "groups": [{"resources:FPGA": "1"}]}])
        assert created.status_code == 503
        assert down.refused >= 4
        down.stop()
        assert client.simulate_get(LIST, headers=ADMIN).status_code == 200
    records = _outage_records(caplog)
    assert [(r.levelname, "again" in r.getMessage()) for r in records] == [
        ("WARNING", False), ("WARNING", True)], [r.getMessage() for r in records]
    assert [r for r in caplog.records if r.exc_info] == []  # no traceback at all
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("url", [
    "postgresql+psycopg://postgres@127.0.0.1:{port}/acceld",
    "mysql+pymysql://root@127.0.0.1:{port}/acceld",
])
def test_nothing_listening_is_503(conf, caplog, url):
    db = Database(url.format(port=free_port()))
    try:
        client = testing.TestClient(build_app(conf, db))
        for _ in range(2):
            result = client.simulate_get(LIST, headers=ADMIN)
            assert result.status_code == 503
            assert result.headers["Retry-After"]
    finally:
        db.dispose()
    assert len([r for r in _outage_records(caplog) if r.levelname == "WARNING"]) == 1
    assert [r for r in caplog.records if r.exc_info] == []


def test_other_database_errors_stay_500_with_their_traceback(conf, sqlite_db, caplog):
    from sqlalchemy import text

    with sqlite_db.write() as conn:
        conn.execute(text("DROP TABLE bind_jobs"))
        conn.execute(text("DROP TABLE accelerator_requests"))
    client = testing.TestClient(build_app(conf, sqlite_db))
    assert client.simulate_get(LIST, headers=ADMIN).status_code == 500
    assert [r for r in caplog.records if r.exc_info]  # a bug: logged with its traceback


def test_sqlite_locked_past_its_busy_timeout_is_503(conf, tmp_path, sqlite_template, caplog):
    """Another process holds SQLite's write lock for longer than the busy timeout: the
    write is refused with 503 (try again), not a 500 with a traceback."""
    import shutil
    import sqlite3

    path = str(tmp_path / "locked.sqlite")
    shutil.copy(sqlite_template, path)
    db = Database(f"sqlite:///{path}", sqlite_busy_timeout_ms=50)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        client = testing.TestClient(build_app(conf, db))
        holder.execute("BEGIN IMMEDIATE")
        result = client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
            {"name": "locked", "groups": [{"resources:FPGA": "1"}]}])
        assert result.status_code == 503
        assert result.headers["Retry-After"]
        holder.execute("ROLLBACK")
        assert client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
            {"name": "locked", "groups": [{"resources:FPGA": "1"}]}]).status_code == 201
    finally:
        holder.close()
        db.dispose()
    assert [r for r in caplog.records if r.exc_info] == []
