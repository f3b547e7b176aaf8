"""The API's DEBUG line per database call (acceld.db.call_log): its time, the statement's
first words on one line, never its parameters; nothing while DEBUG is off."""

from __future__ import annotations

import logging

from sqlalchemy import text

from acceld.db import call_log
from acceld.db.engine import Database

SECRET_VALUE = "tenant-value-9f3a"


def _calls(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "acceld.db.calls"]


def test_each_call_is_one_line_with_its_time(tmp_path, caplog):
    db = Database(f"sqlite:///{tmp_path}/calls.sqlite")
    call_log.install(db.engine)
    long_select = "SELECT\n  " + ",\n  ".join(f":v AS column_{n}" for n in range(40))
    with caplog.at_level(logging.DEBUG, logger="acceld.db.calls"):
        with db.read() as conn:
            conn.execute(text("SELECT 1")).all()
            conn.execute(text(long_select), {"v": SECRET_VALUE}).all()
    db.dispose()
    first, second = _calls(caplog)[-2:]
    assert first.startswith("database call took ") and first.endswith(" ms: SELECT 1")
    assert "\n" not in second and second.endswith("...")
    assert len(second.split(": ", 1)[1]) == call_log.MAX_STATEMENT + 3
    assert SECRET_VALUE not in "".join(_calls(caplog))


def test_nothing_while_debug_is_off(tmp_path, caplog):
    db = Database(f"sqlite:///{tmp_path}/calls.sqlite")
    call_log.install(db.engine)
    with caplog.at_level(logging.INFO, logger="acceld.db.calls"):
        with db.read() as conn:
            conn.execute(text("SELECT 1")).all()
    db.dispose()
    assert _calls(caplog) == []
