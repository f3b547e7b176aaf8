"""Exclusive leases are judged by the database's clock, never by a conductor's own.

Each conductor's time source (``acceld.db.models.utcnow``, what acceld stamps rows
with) is skewed by an hour either way: a conductor whose clock runs ahead must not
take a lease another holds, one whose clock runs behind must not write a lease that
is already over for everyone else, and one whose clock runs ahead must not hold a
lease longer than it asked for. Runs on every backend.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest
from sqlalchemy import select

from acceld.db import clock, leases
from acceld.db import models
from acceld.db.models import utcnow

HOUR = dt.timedelta(hours=1)


def skew(monkeypatch, offset: dt.timedelta) -> None:
    """This process's clock now runs ``offset`` off (what a skewed conductor sees)."""
    monkeypatch.setattr(models, "utcnow", lambda: utcnow() + offset)
    monkeypatch.setattr(leases, "utcnow", lambda: utcnow() + offset, raising=False)


def test_the_database_clock_is_read_as_naive_utc(db):
    with db.read() as conn:
        now = clock.db_now(conn)
    assert now.tzinfo is None
    assert abs((now - utcnow()).total_seconds()) < 5


def test_a_conductor_ahead_does_not_steal_a_live_lease(db, monkeypatch):
    assert leases.acquire(db, "sync", "c1", 60)
    skew(monkeypatch, HOUR)
    assert not leases.acquire(db, "sync", "c2", 60)


def test_a_conductor_behind_writes_no_lease_that_is_already_over(db, monkeypatch):
    skew(monkeypatch, -HOUR)
    assert leases.acquire(db, "sync", "c1", 60)
    monkeypatch.undo()
    assert not leases.acquire(db, "sync", "c2", 60)


def test_a_lease_taken_by_a_conductor_ahead_lapses_when_it_should(db, monkeypatch):
    skew(monkeypatch, HOUR)
    assert leases.acquire(db, "sync", "c1", 0.5)
    monkeypatch.undo()
    assert not leases.acquire(db, "sync", "c2", 60)  # still live
    with db.read() as conn:
        expires = conn.execute(select(models.leases.c.expires_at)).scalar_one()
        left = (expires - clock.db_now(conn)).total_seconds()
    assert left <= 0.5
    time.sleep(max(0.0, left) + 0.1)  # past the lease by the database's own clock
    assert leases.acquire(db, "sync", "c2", 60)


@pytest.mark.parametrize("offset", [HOUR, -HOUR])
def test_the_holder_renews_and_releases_whatever_its_clock(db, monkeypatch, offset):
    skew(monkeypatch, offset)
    assert leases.acquire(db, "sync", "c1", 60)
    assert leases.acquire(db, "sync", "c1", 60)  # renewal
    assert leases.release(db, "sync", "c1")
    assert leases.acquire(db, "sync", "c2", 60)
