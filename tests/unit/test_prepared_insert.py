"""acceld.db.prepared: the same rows, errors and visible statements as ``conn.execute``."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from acceld.db.models import device_profiles
from acceld.db.prepared import PreparedInsert
from tests.conftest import count_queries

KEYS = ("uuid", "name", "description", "profile_json", "created_at", "updated_at")


def _values(name: str, stamp: dt.datetime) -> dict:
    return {"uuid": str(uuid.uuid4()), "name": name, "description": None,
            "profile_json": '[{"resources:FPGA": "1"}]', "created_at": stamp,
            "updated_at": stamp.replace(microsecond=0)}


@pytest.mark.parametrize("micro", [0, 123456])
def test_stores_exactly_what_execute_stores(db, micro):
    stamp = dt.datetime(2026, 1, 2, 3, 4, 5, micro)
    prepared = PreparedInsert(device_profiles, KEYS)
    with db.write() as conn:
        prepared.execute(conn, _values("via-prepared", stamp))
        conn.execute(insert(device_profiles), _values("via-execute", stamp))
    with db.read() as conn:
        # The driver's own values, so that a difference in stored text shows on SQLite too.
        raw = {r[0]: r[1:] for r in conn.exec_driver_sql(
            "SELECT name, description, profile_json, created_at, updated_at "
            "FROM device_profiles").fetchall()}
        rows = {r.name: r for r in conn.execute(select(device_profiles)).all()}
    assert raw["via-prepared"] == raw["via-execute"]
    assert rows["via-prepared"].created_at == stamp
    assert rows["via-prepared"].updated_at == stamp.replace(microsecond=0)


def test_duplicate_raises_sqlalchemy_integrity_error_and_rolls_back(db):
    prepared = PreparedInsert(device_profiles, KEYS)
    now = dt.datetime(2026, 1, 1)
    with db.write() as conn:
        prepared.execute(conn, _values("dup", now))
    with pytest.raises(IntegrityError):
        with db.write() as conn:
            prepared.execute(conn, _values("other", now))
            prepared.execute(conn, _values("dup", now))
    with db.read() as conn:
        names = [r.name for r in conn.execute(select(device_profiles.c.name)).all()]
    assert names == ["dup"]


def test_statement_is_visible_to_cursor_events(db):
    prepared = PreparedInsert(device_profiles, KEYS)
    with count_queries(db) as statements:
        with db.write() as conn:
            prepared.execute(conn, _values("seen", dt.datetime(2026, 1, 1)))
    assert len(statements) == 1
    assert statements[0].upper().startswith("INSERT INTO DEVICE_PROFILES")


def test_missing_value_is_refused_before_any_statement(db):
    prepared = PreparedInsert(device_profiles, KEYS)
    values = _values("partial", dt.datetime(2026, 1, 1))
    del values["description"]
    with count_queries(db) as statements:
        with pytest.raises(KeyError):
            with db.write() as conn:
                prepared.execute(conn, values)
    assert statements == []
