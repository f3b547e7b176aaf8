"""wire.timestamp gives one string for a datetime and for SQLite's text of it."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from acceld.api.wire import timestamp


@given(st.datetimes(min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(2200, 1, 1)))
def test_sqlite_text_and_datetime_agree(value: dt.datetime) -> None:
    # How SQLAlchemy stores a DateTime in SQLite (always six fraction digits).
    text = value.strftime("%Y-%m-%d %H:%M:%S.%f")
    assert timestamp(text) == timestamp(value) == value.isoformat() + "+00:00"


def test_text_without_fraction_and_none() -> None:
    assert timestamp("2026-01-02 03:04:05") == "2026-01-02T03:04:05+00:00"
    assert timestamp(None) is None
