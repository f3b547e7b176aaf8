"""The conductors' replay cache of internal credentials, in the database.

Only for credentials made for the conductors' shared name (``conductor``): a
client's first call to a URL, and URLs behind a load balancer. Those made for one
conductor process's own name are remembered in that process's memory alone
(acceld.internal.auth.Verifier's ``own_destination``): no other process accepts them.

Every conductor sharing a database refuses a nonce any of them accepted, and a
restarted conductor refuses what it accepted before: a credential is accepted once
cloud-wide. A nonce is kept until its credential has expired for every conductor
(its stamp plus ``credential_ttl``, plus one more ttl for skewed clocks, judged by
the database's clock) and then pruned: one indexed DELETE per ttl per conductor.

A nonce already seen by this process is refused from memory without a round
trip. The others are written by group commit: a call whose nonce is new waits
until a transaction holding it has committed (so the guarantee is unchanged: no
call is accepted before its nonce is durably taken, and a nonce another
conductor took first is refused), but the calls that arrive while one such
transaction runs share the next one: under load, one transaction carries many
nonces instead of one each. The batch is one INSERT that skips nonces already
present and returns those it wrote (``ON CONFLICT DO NOTHING`` / ``INSERT
IGNORE`` with ``RETURNING``), so a replay or a race between conductors refuses
exactly the nonces taken elsewhere; on PostgreSQL it runs in autocommit, one
round trip. This was the single biggest cost of an agent's heartbeat (~1 ms of
conductor CPU per call on PostgreSQL as a transaction of its own, with a pool
ping, BEGIN, INSERT and COMMIT).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time

from sqlalchemy import delete
from sqlalchemy.exc import SQLAlchemyError

from acceld.db.clock import db_now
from acceld.db.engine import Database
from acceld.db.models import internal_nonces
from acceld.internal.auth import MemoryReplay, ReplayUnavailable

LOG = logging.getLogger(__name__)


class _InsertNew:
    """INSERT rows of nonces, skipping those already present, RETURNING the ones written.

    The SQL text is built once per dialect and batch size and run with
    ``exec_driver_sql``: SQLAlchemy does not cache a multi-row VALUES statement, and
    compiling it was ~0.6 ms a call, more than the database's work."""

    def __init__(self) -> None:
        self._sql: dict[tuple[str, int], str] = {}
        self._convert: dict[str, object] = {}

    def __call__(self, conn, claims: list["_Claim"]) -> set[str]:  # type: ignore[no-untyped-def]
        dialect = conn.dialect
        key = (dialect.name, len(claims))
        sql = self._sql.get(key) or self._build(dialect, len(claims))
        if dialect.name not in self._convert:
            self._convert[dialect.name] = internal_nonces.c.expires_at.type.dialect_impl(
                dialect).bind_processor(dialect)
        convert = self._convert[dialect.name]
        params: list[object] = []
        for claim in claims:
            params += (claim.nonce, convert(claim.expires) if convert else claim.expires)
        return {row[0] for row in conn.exec_driver_sql(sql, tuple(params)).fetchall()}

    def _build(self, dialect, count: int) -> str:  # type: ignore[no-untyped-def]
        mark = "?" if dialect.paramstyle == "qmark" else "%s"
        values = ", ".join([f"({mark}, {mark})"] * count)
        table = internal_nonces.name
        if dialect.name in ("postgresql", "sqlite"):
            sql = (f"INSERT INTO {table} (nonce, expires_at) VALUES {values} "
                   "ON CONFLICT DO NOTHING RETURNING nonce")
        else:  # MariaDB 10.5+: INSERT IGNORE ... RETURNING
            sql = f"INSERT IGNORE INTO {table} (nonce, expires_at) VALUES {values} RETURNING nonce"
        self._sql[(dialect.name, count)] = sql
        return sql


_insert_new = _InsertNew()


class _Claim:
    """One call's nonce in a group commit, and what became of it."""

    __slots__ = ("nonce", "expires", "accepted", "error")

    def __init__(self, nonce: str, expires: dt.datetime) -> None:
        self.nonce = nonce
        self.expires = expires
        self.accepted: bool | None = None
        self.error: SQLAlchemyError | None = None

    @property
    def done(self) -> bool:
        return self.accepted is not None or self.error is not None


class DatabaseReplay:
    """A :class:`acceld.internal.auth.ReplayGuard` shared through ``internal_nonces``."""

    def __init__(self, db: Database, ttl: int) -> None:
        self.db = db
        self.ttl = ttl
        self._local = MemoryReplay(ttl)
        self._next_prune = 0.0
        self._pruning = threading.Lock()
        self._batch: list[_Claim] = []
        self._committing = False  # a thread is writing a batch; others queue for the next
        self._cond = threading.Condition()
        self.transactions = 0  # batches written (for the bench and tests)
        # PostgreSQL: the batch's single statement runs in autocommit (psycopg would
        # otherwise spend a round trip each on BEGIN and COMMIT). Elsewhere a transaction:
        # pymysql's autocommit switch costs round trips of its own; SQLite is local.
        self._autocommit = (db.engine.execution_options(isolation_level="AUTOCOMMIT")
                            if db.backend == "postgresql" else None)

    def first_use(self, nonce: str, issued: int, now: float) -> bool:
        if not self._local.first_use(nonce, issued, now):
            return False
        claim = _Claim(nonce, dt.datetime.fromtimestamp(issued + self.ttl, dt.timezone.utc)
                       .replace(tzinfo=None))
        with self._cond:
            self._batch.append(claim)
            while not claim.done:
                if self._committing:  # ours goes in the next batch, or is in this one
                    self._cond.wait()
                    continue
                batch, self._batch = self._batch, []
                self._committing = True
                self._cond.release()
                try:
                    self._commit(batch)
                finally:
                    self._cond.acquire()
                    self._committing = False
                    self._cond.notify_all()
        if claim.error is not None:
            # The cause tells the server whether it is an outage (logged once, 503).
            raise ReplayUnavailable(
                f"the database is unavailable: {claim.error.__class__.__name__}") \
                from claim.error
        self._prune()
        return bool(claim.accepted)

    def _commit(self, batch: list[_Claim]) -> None:
        """Write ``batch`` in one statement that skips nonces already taken and returns the
        ones it wrote: those calls are accepted, the others refused. Every claim ends
        accepted, refused or with the database's error."""
        self.transactions += 1
        try:
            if self._autocommit is not None:
                # One round trip: the INSERT commits by itself (no BEGIN, no COMMIT).
                with self._autocommit.connect() as conn:
                    taken = _insert_new(conn, batch)
            else:
                with self.db.write() as conn:
                    taken = _insert_new(conn, batch)
        except SQLAlchemyError as exc:
            for claim in batch:
                claim.error = exc
            return
        except BaseException as exc:  # noqa: BLE001 - never leave a waiting call hanging
            for claim in batch:
                claim.error = SQLAlchemyError(f"nonce batch failed: {exc!r}")
            raise
        for claim in batch:
            claim.accepted = claim.nonce in taken

    def _prune(self) -> None:
        """Delete nonces no conductor can accept any more; at most once per ttl here."""
        if time.monotonic() < self._next_prune or not self._pruning.acquire(blocking=False):
            return
        try:
            self._next_prune = time.monotonic() + self.ttl
            with self.db.write() as conn:
                horizon = db_now(conn) - dt.timedelta(seconds=self.ttl)
                conn.execute(delete(internal_nonces).where(
                    internal_nonces.c.expires_at < horizon))
        except SQLAlchemyError as exc:  # retried at the next prune
            LOG.warning("Could not prune used internal nonces: %s", exc.__class__.__name__)
        finally:
            self._pruning.release()
