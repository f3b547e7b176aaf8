"""Bind jobs: the durable half of an asynchronous bind.

The API inserts a job in the same transaction that moves its ARQ to
BindStarted. A conductor claims a batch of jobs by writing a lease (a token
unique to that claim, and an expiry); a conductor killed mid-batch leaves
leases that expire, and any conductor then claims those jobs again. A job has
two phases: ``pending`` (the bind itself) and ``notify`` (the bind resolved and
committed, the Nova event still to send). The job row is deleted once Nova has
been told (or there is no Nova to tell).
"""

from __future__ import annotations

import datetime as dt
from typing import Iterable, Sequence

from sqlalchemy import Connection, Row, delete, exists, insert, or_, select, update

from acceld.db.engine import Database
from acceld.db.models import bind_jobs as jobs
from acceld.db.models import utcnow

PENDING = "pending"
NOTIFY = "notify"


def create(conn: Connection, arq_rows: Iterable[tuple[int, str | None]]) -> None:
    """One pending job per ``(arq_id, instance_uuid)``, replacing any earlier job of the ARQ."""
    rows = list(arq_rows)
    if not rows:
        return
    conn.execute(delete(jobs).where(jobs.c.arq_id.in_([r[0] for r in rows])))
    now = utcnow()
    conn.execute(insert(jobs), [{"arq_id": arq_id, "instance_uuid": instance, "phase": PENDING,
                                 "lease_owner": None, "lease_expires_at": None, "attempts": 0,
                                 "created_at": now, "updated_at": None}
                                for arq_id, instance in rows])


def _claimable(now: dt.datetime):  # type: ignore[no-untyped-def]
    return or_(jobs.c.lease_expires_at.is_(None), jobs.c.lease_expires_at < now)


def claim(db: Database, phase: str, token: str, limit: int, lease_seconds: float) -> list[Row]:
    """Lease up to ``limit`` claimable jobs of ``phase`` to ``token``; return them.

    Portable: pick candidates, then one compare-and-set UPDATE that only takes rows still
    claimable; the rows carrying ``token`` afterwards are this claim's.
    """
    now = utcnow()
    with db.write() as conn:
        candidates = list(conn.execute(select(jobs.c.id).where(
            jobs.c.phase == phase, _claimable(now)).order_by(jobs.c.id).limit(limit)).scalars())
        if not candidates:
            return []
        conn.execute(update(jobs).where(jobs.c.id.in_(candidates), jobs.c.phase == phase,
                                        _claimable(now)).values(
            lease_owner=token, lease_expires_at=now + dt.timedelta(seconds=lease_seconds),
            attempts=jobs.c.attempts + 1, updated_at=now))
        return list(conn.execute(select(jobs).where(
            jobs.c.id.in_(candidates), jobs.c.lease_owner == token).order_by(jobs.c.id)).all())


def renew(db: Database, tokens: Sequence[str], lease_seconds: float) -> int:
    """Extend the leases of every job still held by one of ``tokens`` (claims in progress).

    A claim's work can outlast its lease (a batch of binds done one after another, a
    program that takes minutes); without renewal another worker re-claims jobs still
    being worked on. A conductor that dies stops renewing, so its jobs are due again
    ``lease_seconds`` later. Returns how many leases were extended.
    """
    if not tokens:
        return 0
    now = utcnow()
    with db.write() as conn:
        return conn.execute(update(jobs).where(jobs.c.lease_owner.in_(list(tokens))).values(
            lease_expires_at=now + dt.timedelta(seconds=lease_seconds))).rowcount


def lock_owned(conn: Connection, job_id: int, token: str) -> bool:
    """Inside a bind transaction: True while ``token`` still holds pending job ``job_id``
    (not expired and re-claimed elsewhere, not replaced or dropped by an unbind or delete)."""
    return conn.execute(update(jobs).where(
        jobs.c.id == job_id, jobs.c.lease_owner == token, jobs.c.phase == PENDING).values(
        phase=NOTIFY, updated_at=utcnow())).rowcount == 1


def finish(db: Database, job_ids: Sequence[int], token: str) -> int:
    """Drop jobs whose Nova event went out (or needs no sending), if still ours."""
    if not job_ids:
        return 0
    with db.write() as conn:
        return conn.execute(delete(jobs).where(jobs.c.id.in_(list(job_ids)),
                                               jobs.c.lease_owner == token)).rowcount


def retry_later(db: Database, job_ids: Sequence[int], token: str, delay: float) -> None:
    """Give the lease up so that a later scan (any conductor) tries again after ``delay``."""
    if not job_ids:
        return
    with db.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id.in_(list(job_ids)),
                                        jobs.c.lease_owner == token).values(
            lease_owner=None, lease_expires_at=utcnow() + dt.timedelta(seconds=delay),
            updated_at=utcnow()))


def any_due(db: Database) -> bool:
    """One cheap query for the periodic scan: is any job claimable now?"""
    with db.read() as conn:
        return bool(conn.execute(select(exists().where(_claimable(utcnow())))).scalar())
