"""The conductors' replay cache of internal credentials, in the database.

Every conductor sharing a database refuses a nonce any of them accepted, and a
restarted conductor refuses what it accepted before: a credential is accepted once
cloud-wide. A nonce is kept until its credential has expired for every conductor
(its stamp plus ``credential_ttl``, plus one more ttl for skewed clocks, judged by
the database's clock) and then pruned: one indexed DELETE per ttl per conductor.

The cost is one INSERT (a write transaction) per authenticated call to a
conductor, chiefly every agent's heartbeat; a nonce already seen by this process
is refused from memory without a round trip.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time

from sqlalchemy import delete, insert
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from acceld.db.clock import db_now
from acceld.db.engine import Database
from acceld.db.models import internal_nonces
from acceld.internal.auth import MemoryReplay, ReplayUnavailable

LOG = logging.getLogger(__name__)


class DatabaseReplay:
    """A :class:`acceld.internal.auth.ReplayGuard` shared through ``internal_nonces``."""

    def __init__(self, db: Database, ttl: int) -> None:
        self.db = db
        self.ttl = ttl
        self._local = MemoryReplay(ttl)
        self._next_prune = 0.0
        self._pruning = threading.Lock()

    def first_use(self, nonce: str, issued: int, now: float) -> bool:
        if not self._local.first_use(nonce, issued, now):
            return False
        expires = dt.datetime.fromtimestamp(issued + self.ttl, dt.timezone.utc).replace(
            tzinfo=None)
        try:
            with self.db.write() as conn:
                conn.execute(insert(internal_nonces).values(nonce=nonce, expires_at=expires))
        except IntegrityError:
            return False  # another conductor (or this one before a restart) accepted it
        except SQLAlchemyError as exc:
            # The cause tells the server whether it is an outage (logged once, 503).
            raise ReplayUnavailable(f"the database is unavailable: {exc.__class__.__name__}") \
                from exc
        self._prune()
        return True

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
