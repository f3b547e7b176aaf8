"""A conductor's periodic tasks log a database outage once, not a traceback per pass.

Before: every pass of every periodic task logged "Periodic task ... failed" with
a traceback for as long as the database was away (several a second with the
bind scan at its 1 s default). The outage is forced at the engine level
(tests.support.db_outage) on SQLite, PostgreSQL and MariaDB.
"""

from __future__ import annotations

import logging
import threading

from acceld.conductor.service import Conductor, PeriodicTask
from acceld.db import bind_jobs
from tests.conftest import make_conf
from tests.support.db_outage import outage


def test_periodic_task_logs_the_database_outage_once(db, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    conductor = Conductor(make_conf(str(tmp_path)), db, instance_id="c-outage")
    passes = {"failed": 0, "ok": 0}
    progress = threading.Condition()

    def scan() -> None:  # a periodic task that reads the database, as bind-scan does
        try:
            bind_jobs.any_due(db)
        except Exception:
            with progress:
                passes["failed"] += 1
                progress.notify_all()
            raise
        with progress:
            passes["ok"] += 1
            progress.notify_all()

    def wait_until(predicate) -> None:  # type: ignore[no-untyped-def]
        with progress:
            assert progress.wait_for(predicate, 20)

    task = PeriodicTask("outage-scan", 0.01, scan)
    thread = threading.Thread(target=conductor._loop, args=(task,), daemon=True)
    with outage(db) as down:
        thread.start()
        try:
            wait_until(lambda: passes["ok"] >= 1)
            down.start()
            wait_until(lambda: passes["failed"] >= 5)
            down.stop()
            seen = passes["ok"]
            wait_until(lambda: passes["ok"] >= seen + 2)
        finally:
            conductor._stop.set()
            thread.join(10)
    records = [r for r in caplog.records if "The database is" in r.getMessage()]
    assert [(r.levelname, "again" in r.getMessage()) for r in records] == [
        ("WARNING", False), ("WARNING", True)], [r.getMessage() for r in records]
    assert [r for r in caplog.records if r.exc_info] == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
