"""Bind jobs: the durable half of an asynchronous bind.

The API inserts a job in the same transaction that moves its ARQ to
BindStarted. A conductor claims the due jobs of one instance by writing a
lease (a token unique to that claim, and an expiry): instances are worked on
concurrently, and one instance's events never wait for another's binds. On
PostgreSQL and MariaDB the claim's reads lock with ``FOR UPDATE SKIP LOCKED``,
so concurrent claims take different rows without waiting for each other
(SQLite has one writer: claims are serialised). A conductor killed mid-claim leaves
leases that expire, and any conductor then claims those jobs again. Lease expiry
and the job's creation time are the database's clock (acceld.db.clock.sql_now, in
the statement that writes or compares them): a conductor or API host whose own
clock is off neither takes a live claim, nor keeps one too long, nor moves the
bind deadline. A job has
two phases: ``pending`` (the bind itself) and ``notify`` (the bind resolved and
committed, the Nova event still to send). The job row is deleted once Nova has
been told (or there is no Nova to tell).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable, Sequence

from sqlalchemy import (Connection, Row, Select, Update, bindparam, case, delete, exists, func,
                        insert, or_, select, update)

from acceld.db.clock import sql_now
from acceld.db.engine import Database
from acceld.db.retry import retry_on_deadlock
from acceld.db.models import accelerator_requests as arqs
from acceld.db.models import bind_jobs as jobs
from acceld.db.models import device_profiles
from acceld.db.models import utcnow

PENDING = "pending"
NOTIFY = "notify"


def create(conn: Connection, arq_rows: Iterable[tuple[int, str | None]],
           global_request_id: str | None = None) -> None:
    """One pending job per ``(arq_id, instance_uuid)``, replacing any earlier job of the ARQ;
    ``global_request_id``: the request that started the binds (for the conductor's log)."""
    rows = list(arq_rows)
    if not rows:
        return
    conn.execute(DELETE_OF_ARQS, {"arq_ids": [r[0] for r in rows]})
    conn.execute(_insert_stamped(conn.dialect.name), [
        {"arq_id": arq_id, "instance_uuid": instance, "phase": PENDING, "lease_owner": None,
         "lease_expires_at": None, "attempts": 0, "updated_at": None,
         "global_request_id": global_request_id}
        for arq_id, instance in rows])


# Every bind, unbind and delete of ARQs runs it (with ``arq_ids``): built once.
DELETE_OF_ARQS = delete(jobs).where(jobs.c.arq_id.in_(bindparam("arq_ids", expanding=True)))


@functools.lru_cache(maxsize=4)
def _insert_stamped(dialect: str):  # type: ignore[no-untyped-def]
    """The jobs' INSERT, built once per dialect: created_at starts the bind deadline, by the
    database's clock, not the API host's."""
    return insert(jobs).values(created_at=sql_now(dialect))


def _claimable(now):  # type: ignore[no-untyped-def]
    """Unclaimed, or the claim is over by ``now`` (the database's clock, as SQL)."""
    return or_(jobs.c.lease_expires_at.is_(None), jobs.c.lease_expires_at < now)


def claim(db: Database, phase: str, token: str, limit: int, lease_seconds: float) -> list[Row]:
    """Lease the claimable jobs of ``phase`` of one instance (the one whose job is oldest;
    at most ``limit``) to ``token``; return them (see :func:`claim_and_peek`)."""
    return claim_and_peek(db, phase, token, limit, lease_seconds)[0]


@retry_on_deadlock  # a claim on another Galera node took the same rows first
def claim_and_peek(db: Database, phase: str, token: str, limit: int,
                   lease_seconds: float) -> tuple[list[Row], bool]:
    """Lease the claimable jobs of ``phase`` of one instance (the one whose job is oldest;
    at most ``limit``) to ``token``; return them, and whether another instance's jobs
    were due too (the caller wakes another worker only then: a worker woken for nothing
    spent two write transactions, which on SQLite queue behind the bind being done).

    Portable: pick candidates (locked and skipping rows another claim locked, where the
    database can), then one compare-and-set UPDATE that only takes rows still claimable;
    the rows carrying ``token`` afterwards are this claim's.
    """
    sql = _claim_statements(db.backend, phase, limit, lease_seconds)
    # Notify jobs: a read first. Most passes find none (notifications are sent right after
    # their binds), and on SQLite an empty write transaction still waited for, and held,
    # the database's only write lock. Pending jobs: no read. A pass follows a wake, one
    # worker per wake, and a wake follows jobs made due (a PATCH's, the scan's, a claim
    # that saw more): the read found them, and only delayed each bind.
    if phase != PENDING:
        with db.read() as conn:
            if conn.execute(sql.any_due).scalar() is not True:
                return [], False
    with db.write() as conn:
        first = conn.execute(sql.first_lead).first()
        if first is None:
            return [], False
        # Not locking (a second locked lead would be skipped by a concurrent claim).
        more = conn.execute(sql.another_lead, {"first_id": first.id}).first() is not None
        if first.instance_uuid is None:
            candidates = list(conn.execute(sql.same_job, {"first_id": first.id}).scalars())
        else:
            candidates = list(conn.execute(sql.same_instance,
                                           {"instance": first.instance_uuid}).scalars())
        if not candidates:
            return [], more
        conn.execute(sql.take, {"ids": candidates, "token": token})
        return list(conn.execute(sql.taken, {"ids": candidates, "token": token}).all()), \
            more or len(candidates) == limit


@dataclass(frozen=True)
class _ClaimStatements:
    any_due: Select
    first_lead: Select
    another_lead: Select
    same_job: Select
    same_instance: Select
    take: Update
    taken: Select


@functools.lru_cache(maxsize=32)
def _claim_statements(backend: str, phase: str, limit: int,
                      lease_seconds: float) -> _ClaimStatements:
    """A claim's statements, built once per (backend, phase, batch, lease): building them
    per claim (an alias, its column copies, the cache keys) cost more than running them."""
    now = sql_now(backend)
    due = (jobs.c.phase == phase, _claimable(now))
    # Only an instance's first due job can start a claim: two concurrent claims then lock
    # the leads of two instances, never two jobs of one instance (each would take part
    # of it, and two workers would wait on one slow instance).
    # One uncorrelated GROUP BY over the due jobs (a correlated subquery per row cost a
    # second per claim with 2000 jobs pending).
    peer = jobs.alias("peer")
    leads = select(func.min(peer.c.id)).where(
        peer.c.phase == phase, peer.c.instance_uuid.is_not(None),
        or_(peer.c.lease_expires_at.is_(None), peer.c.lease_expires_at < now)
    ).group_by(peer.c.instance_uuid)
    lead = or_(jobs.c.instance_uuid.is_(None), jobs.c.id.in_(leads))
    ids = bindparam("ids", expanding=True)
    return _ClaimStatements(
        any_due=select(exists().where(*due)),
        first_lead=_skip_locked(backend, select(jobs.c.id, jobs.c.instance_uuid).where(
            *due, lead).order_by(jobs.c.id).limit(1)),
        another_lead=select(jobs.c.id).where(*due, lead, jobs.c.id != bindparam("first_id"))
        .limit(1),
        same_job=_skip_locked(backend, select(jobs.c.id).where(
            *due, jobs.c.id == bindparam("first_id")).order_by(jobs.c.id).limit(limit)),
        same_instance=_skip_locked(backend, select(jobs.c.id).where(
            *due, jobs.c.instance_uuid == bindparam("instance")).order_by(jobs.c.id)
            .limit(limit)),
        take=update(jobs).where(jobs.c.id.in_(ids), jobs.c.phase == phase,
                                _claimable(now)).values(
            lease_owner=bindparam("token"), lease_expires_at=sql_now(backend, lease_seconds),
            attempts=jobs.c.attempts + 1, updated_at=now),
        # claimed_at: the database's clock at the claim, against which the worker holds the
        # bind's calls to what is left of [conductor] bind_timeout (no query of its own).
        # The ARQ's profile group (profile_json, device_profile_group_id; None once the ARQ
        # is gone): the worker learns from it, without a read of its own, whether the bind
        # programs (most do not; acceld.conductor.binding.programming).
        taken=select(jobs, now.label("claimed_at"), arqs.c.device_profile_group_id,
                     device_profiles.c.profile_json).select_from(
            jobs.outerjoin(arqs, arqs.c.id == jobs.c.arq_id).outerjoin(
                device_profiles, device_profiles.c.id == arqs.c.device_profile_id)).where(
            jobs.c.id.in_(ids), jobs.c.lease_owner == bindparam("token")).order_by(jobs.c.id),
    )


def _skip_locked(backend: str, query):  # type: ignore[no-untyped-def]
    """``FOR UPDATE SKIP LOCKED`` on PostgreSQL and MariaDB; SQLite's BEGIN IMMEDIATE
    already made this transaction the only writer."""
    return query if backend == "sqlite" else query.with_for_update(skip_locked=True)


@retry_on_deadlock
def renew(db: Database, tokens: Sequence[str], lease_seconds: float) -> int:
    """Extend the leases of every job still held by one of ``tokens`` (claims in progress).

    A claim's work can outlast its lease (a batch of binds done one after another, a
    program that takes minutes); without renewal another worker re-claims jobs still
    being worked on. A conductor that dies stops renewing, so its jobs are due again
    ``lease_seconds`` later. Returns how many leases were extended.
    """
    if not tokens:
        return 0
    with db.write() as conn:
        return conn.execute(update(jobs).where(jobs.c.lease_owner.in_(list(tokens))).values(
            lease_expires_at=sql_now(db.backend, lease_seconds))).rowcount


def held(db: Database, job_ids: Sequence[int], token: str) -> dict[int, float]:
    """The jobs of ``job_ids`` that ``token`` still holds, with the seconds their lease has
    left, by the database's clock: a lease that ran out is no longer held, even before
    another claim takes the job (anyone may)."""
    if not job_ids:
        return {}
    with db.read() as conn:
        rows = conn.execute(_held_query(db.backend),
                            {"job_ids": list(job_ids), "token": token}).all()
    return {row.id: (row.lease_expires_at - row.now).total_seconds() for row in rows}


@functools.lru_cache(maxsize=4)
def _held_query(backend: str) -> Select:
    """:func:`held`'s read, built once per backend (it runs before every Nova event)."""
    now = sql_now(backend)
    return select(jobs.c.id, jobs.c.lease_expires_at, now.label("now")).where(
        jobs.c.id.in_(bindparam("job_ids", expanding=True)),
        jobs.c.lease_owner == bindparam("token"), jobs.c.lease_expires_at > now)


def lock_owned(conn: Connection, job_id: int, token: str) -> bool:
    """Inside a bind transaction: True while ``token`` still holds pending job ``job_id``
    (not expired and re-claimed elsewhere, not replaced or dropped by an unbind or delete)."""
    return conn.execute(_TO_NOTIFY, {"job_id": job_id, "token": token,
                                     "at": utcnow()}).rowcount == 1


# Built once: every bind runs it.
_TO_NOTIFY = update(jobs).where(
    jobs.c.id == bindparam("job_id"), jobs.c.lease_owner == bindparam("token"),
    jobs.c.phase == PENDING).values(
    phase=NOTIFY, updated_at=bindparam("at", type_=jobs.c.updated_at.type))


@retry_on_deadlock
def finish(db: Database, job_ids: Sequence[int], token: str) -> int:
    """Drop jobs whose Nova event went out (or needs no sending), if still ours."""
    if not job_ids:
        return 0
    with db.write() as conn:
        return conn.execute(_FINISH, {"job_ids": list(job_ids), "token": token}).rowcount


# Built once: every bind's notification runs it.
_FINISH = delete(jobs).where(jobs.c.id.in_(bindparam("job_ids", expanding=True)),
                             jobs.c.lease_owner == bindparam("token"))


@retry_on_deadlock
def retry_later(db: Database, job_ids: Sequence[int], token: str, delay: float,
                refund: bool = False) -> None:
    """Give the lease up so that a later scan (any conductor) tries again after ``delay``
    (0: due now).

    ``refund``: the claim was not a try (an outage was waited out, the database went
    away, the conductor is stopping), so it does not count against the attempt limit.
    """
    if not job_ids:
        return
    values = {"lease_owner": None,
              "lease_expires_at": sql_now(db.backend, delay) if delay > 0 else None,
              "updated_at": sql_now(db.backend)}
    if refund:
        values["attempts"] = case((jobs.c.attempts > 0, jobs.c.attempts - 1), else_=0)
    with db.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id.in_(list(job_ids)),
                                        jobs.c.lease_owner == token).values(values))


def any_due(db: Database) -> bool:
    """One cheap query for the periodic scan: is any job claimable now?"""
    with db.read() as conn:
        return bool(conn.execute(select(exists().where(_claimable(sql_now(db.backend))))).scalar())
